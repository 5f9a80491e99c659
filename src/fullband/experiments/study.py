"""What the synthetic studies (reasoning traces, state tracking) share: training the baseline and the
full-bandwidth model on the same data, tables, JSON and figures in a run directory."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fullband.config import (
    ConfigError,
    DataConfig,
    OptimConfig,
    ScheduleConfig,
    TrainConfig,
    TrainModelConfig,
    TrainRunConfig,
)

MODEL_KINDS = ("baseline", "fullband")
SUMMARY_FILE = "study_training.json"
VALIDATION_BATCHES = 4


@dataclasses.dataclass
class StudyModel:
    """Architecture and training budget shared by the two models of a study."""

    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    steps: int
    batch_size: int
    lr: float
    feedback_start: float
    pass_mix: tuple[float, ...]
    seed: int = 0
    device: str = "cpu"


def sft_run_config(spec: StudyModel, data: Path, validation: Path, out_dir: Path, feedback: bool) -> TrainRunConfig:
    """SFT on ``data`` (prompt masked). Both models see the same batches in the same order (same seed); the
    full-bandwidth one runs the multi-pass objective from ``feedback_start`` on (DESIGN.md §3). ``validation``
    gives the held-out loss with 1 pass (standard) and 3 passes (fused prefill, 2 extra passes) at the end."""
    return TrainRunConfig(
        model=TrainModelConfig(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads,
                               max_seq_len=spec.max_seq_len, feedback=feedback),
        data=DataConfig(source=str(data), format="sft", validation_source=str(validation), tokenizer="byte"),
        train=TrainConfig(max_steps=spec.steps, batch_size=spec.batch_size, seq_len=spec.max_seq_len,
                          seed=spec.seed, eval_every=0, eval_batches=VALIDATION_BATCHES, checkpoint_every=0,
                          keep_last=1, log_every=50),
        # A short warmup and no weight decay: tiny models, few steps, synthetic data.
        optim=OptimConfig(lr=spec.lr, warmup_steps=max(1, spec.steps // 20), weight_decay=0.0),
        schedule=ScheduleConfig(feedback_start=spec.feedback_start if feedback else 1.0, pass_mix=spec.pass_mix),
        out_dir=str(out_dir), device=spec.device, eval_passes=(1, 3),
    )


def train_both(
    spec: StudyModel, data: Path, validation: Path, out_dir: Path, progress: bool = True, reuse: bool = False
) -> dict[str, dict[str, Any]]:
    """Train ``baseline`` (feedback=False) and ``fullband`` on the same data -> per-kind summary + model_dir.

    ``reuse`` takes the models an earlier run left in ``out_dir`` (its training summary is read back)."""
    from fullband.training.run import run_train

    summaries = {}
    for kind in MODEL_KINDS:
        if (out_dir / kind).exists():
            if not reuse:
                raise ConfigError(f"out_dir={str(out_dir)!r} already holds a trained {kind}: pick a new --out_dir, "
                                  "or --reuse_models true to evaluate the trained models again")
            summaries[kind] = _read_summary(out_dir / kind)
            continue
        if progress:
            print(f"training {kind} ({spec.steps} steps)", flush=True)
        run_cfg = sft_run_config(spec, data, validation, out_dir / kind, kind == "fullband")
        result = run_train(run_cfg, progress=progress)
        summaries[kind] = {
            "model_dir": str(result.model_dir), "steps": result.steps, "tokens": result.tokens,
            "token_equiv_compute": result.token_equiv_compute, "final_loss": result.final_loss,
            "seconds": round(result.seconds, 1), **result.validation,
        }
        write_json(out_dir / kind / SUMMARY_FILE, summaries[kind])
    return summaries


def _read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / SUMMARY_FILE
    if not path.is_file() or not (run_dir / "model").is_dir():
        raise ConfigError(f"{run_dir} holds no finished training run ({SUMMARY_FILE} and model/); delete it and rerun")
    return json.loads(path.read_text())


def set_threads(threads: int) -> None:
    # On a shared CPU, tiny models run several times faster on one thread than on two (no contention).
    torch.set_num_threads(threads)


def summarize(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "median": math.nan}
    return {"mean": statistics.fmean(values), "median": float(statistics.median(values))}


def training_table(training: dict[str, dict[str, Any]]) -> str:
    """Markdown: tokens, compute and held-out loss (1 pass = standard, 3 passes = fused prefill) of each model."""
    rows = [[kind, t["steps"], t["tokens"], t["token_equiv_compute"], f"{t['val_loss_1pass']:.4f}",
             f"{t['val_loss_3pass']:.4f}", f"{t['seconds']:.0f}"] for kind, t in training.items()]
    return markdown_table(["model", "steps", "tokens", "token-equiv. compute", "held-out loss, 1 pass", "3 passes",
                           "seconds"], rows)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def line_style(variant: str) -> dict[str, Any]:
    # The baseline is drawn wide and pale underneath, so it stays visible where a fullband line covers it.
    return {"linewidth": 5, "alpha": 0.35, "zorder": 1} if variant == "baseline" else {"linewidth": 1.5, "zorder": 2}


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported only when a study draws (it is an optional dependency)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the study plots need matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
