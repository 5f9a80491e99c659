"""Training metrics: the JSONL log (TensorBoard too when installed) and the FLOPs/MFU estimate."""

from __future__ import annotations

import json
import math
import secrets
import warnings
from pathlib import Path
from typing import Any

import torch

from fullband.config import ConfigError, install_hint
from fullband.files import dumps, write_text

# Dense bf16 tensor-core peak FLOP/s per GPU, by a fragment of torch.cuda.get_device_name(); the first match
# wins, so more specific names come first. Devices not listed get no MFU rather than a made-up one.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


# Dense float32 peak FLOP/s (CUDA cores; TF32 tensor cores only when torch.backends.cuda.matmul.allow_tf32 is set,
# which fullband leaves off): the peak of a float32 step such as `fullband bench`'s on a GPU.
PEAK_FP32_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 67e12),
    ("H200", 67e12),
    ("H100 PCIe", 51e12),
    ("H100", 67e12),
    ("A100", 19.5e12),
)


def peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Peak FLOP/s of ``device`` for matmuls in ``dtype`` (bf16 or float32) if it is a CUDA GPU in
    :data:`PEAK_BF16_FLOPS` / :data:`PEAK_FP32_FLOPS`, else None (no MFU rather than a made-up one)."""
    if device.type != "cuda":
        return None
    table = {torch.bfloat16: PEAK_BF16_FLOPS, torch.float32: PEAK_FP32_FLOPS}.get(dtype, ())
    name = torch.cuda.get_device_name(device)
    return next((flops for fragment, flops in table if fragment in name), None)


def flops_per_token(num_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token per pass (forward + backward), as in nanoGPT / PaLM appendix B.

    6N for the weight matmuls (the tied output head included) plus 12·L·D·T for attention scores and values.
    """
    return 6.0 * num_params + 12.0 * n_layers * d_model * seq_len


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl``; mirrors numbers to TensorBoard if available, and to
    Weights & Biases when ``wandb_project`` is set."""

    def __init__(self, path: str | Path, *, resume_bytes: int | None = None, tensorboard_dir: str | Path | None = None,
                 start_step: int = 0, wandb_project: str | None = None,
                 wandb_config: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_bytes is None:
            write_text(self.path, "")  # a fresh run starts a fresh log
        else:
            self._truncate(resume_bytes)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._tb = _summary_writer(tensorboard_dir, self.path) if tensorboard_dir is not None else None
        self._wandb = (WandbSink(wandb_project, self.path.parent, wandb_config or {}, start_step)
                       if wandb_project else None)

    def _truncate(self, size: int) -> None:
        # Records written after the checkpoint by the interrupted run would repeat the steps about to rerun.
        have = self.path.stat().st_size if self.path.exists() else 0
        if have < size:
            warnings.warn(f"{self.path} has {have} bytes but the checkpoint recorded {size}; records are missing",
                          stacklevel=3)
            return
        with open(self.path, "r+b") as f:
            f.truncate(size)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(dumps(record, indent=None) + "\n")  # appended: the one file not replaced whole
        self._file.flush()
        if self._tb is not None:
            for tag, item in scalars(record).items():
                self._tb.add_scalar(tag, item, record["step"])
        if self._wandb is not None:
            self._wandb.log(scalars(record), record["step"])

    def tell(self) -> int:
        """Bytes written so far (stored in checkpoints so a resume can drop what came after)."""
        self._file.flush()
        return self.path.stat().st_size

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record as ``kind/name`` (lists: ``kind/name_1``, ...), as dashboards plot them."""
    kind = record.get("kind", "train")
    out = {}
    for key, value in record.items():
        if key in ("step", "kind"):
            continue
        values = enumerate(value, start=1) if isinstance(value, list) else [(None, value)]
        for index, item in values:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item):
                out[f"{kind}/{key}" if index is None else f"{kind}/{key}_{index}"] = item
    return out


WANDB_RUN_ID_FILE = "wandb_run_id"  # in the run directory: a resumed run continues the same W&B run


class WandbSink:
    """One W&B run per training run directory (``out_dir/wandb``); a resume appends to the same run."""

    def __init__(self, project: str, out_dir: Path, config: dict[str, Any], start_step: int) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError(f"train.wandb_project={project!r} needs the wandb package: "
                              f"{install_hint('wandb')} (or leave train.wandb_project unset)") from None
        id_file = out_dir / WANDB_RUN_ID_FILE
        run_id = id_file.read_text().strip() if start_step > 0 and id_file.is_file() else secrets.token_hex(4)
        write_text(id_file, run_id + "\n")
        self.run = wandb.init(project=project, dir=str(out_dir), id=run_id, resume="allow", name=out_dir.name,
                              config=config, settings=wandb.Settings(console="off", silent=True))

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()

def _summary_writer(log_dir: str | Path, metrics_path: Path) -> Any:
    """A TensorBoard writer into ``log_dir`` holding exactly what ``metrics_path`` holds so far, or None without the
    tensorboard package.

    The directory is rebuilt from the log (its old event files removed, the log's records written again) rather than
    appended to: TensorBoard reads a directory's event files in file-name order, and names made within one second
    order by a counter compared as text, so a resumed run's second file could be read before the first. One file
    per directory, rewritten from metrics.jsonl (already cut back to the checkpoint), depends on neither."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the tensorboard package is optional
        return None
    log_dir = Path(log_dir)
    for old in log_dir.glob("events.out.tfevents.*"):
        old.unlink()
    writer = SummaryWriter(str(log_dir))
    with open(metrics_path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            for tag, item in scalars(record).items():
                writer.add_scalar(tag, item, record["step"])
    writer.flush()
    return writer
