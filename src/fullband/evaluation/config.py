"""The options of ``fullband eval`` (torch-free, so the command line checks them before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fullband.config import (
    device_field,
    doc,
    is_int,
    require,
    threads_field,
    validate_device_name,
    validate_threads,
)
from fullband.modes import DEFAULT_SCORE_MODE, DecodeOptions, retired_to_decode

# ---------------------------------------------------------------------------------------------- fullband eval

EVAL_DTYPES = ("float32", "float64", "bfloat16")


@dataclass
class LmEvalConfig:
    """``fullband eval``: lm-evaluation-harness tasks on a checkpoint, through the ``fullband`` lm-eval model."""

    # the flat options that moved into [decode]: refused with a line naming the new flag (configio)
    ALIASES: ClassVar[dict[str, str]] = retired_to_decode("mode", "prefill_passes", "exact_chunk_size")

    checkpoint: str = doc("", "Model directory with its tokenizer (fullband train's out_dir/model); required.")
    tasks: tuple[str, ...] = doc((), "Comma-separated lm-eval task (or group) names; required.")
    num_fewshot: int | None = doc(None, "Few-shot examples per prompt; none = each task's default.")
    include_path: str | None = doc(
        None, "Directory of extra task YAML files (e.g. local tasks with dataset_path: json)."
    )
    include_defaults: bool = doc(
        True, "Also index lm-eval's built-in tasks; false = only include_path (much faster to start)."
    )
    batch_size: int = doc(16, "Requests per model batch.")
    limit: int | None = doc(None, "Evaluate only the first N documents of each task (none = all).")
    max_gen_toks: int = doc(256, "Default cap on generated tokens for generate_until tasks.")
    device: str = device_field()
    threads: str = threads_field()
    dtype: str = doc("float32", f"Model dtype: one of {EVAL_DTYPES}.")
    seed: int = doc(0, "Seed of the few-shot sampling and of every other random choice of lm-eval.")
    log_samples: bool = doc(False, "Also save every request and response (samples.json).")
    out_dir: str = doc("runs/eval", "Run directory: results.json (and samples.json).")
    # The mode scores text and decodes generate_until tasks (which positions are fused: the lm-eval adapter's
    # docstring); exact_chunk_size also computes the exact continuations. A task's own generation settings (do_sample,
    # temperature) win over [decode]'s; its stop ids end a generation besides end-of-text.
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions(mode=DEFAULT_SCORE_MODE))

    def __post_init__(self) -> None:
        require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        validate_device_name(self.device)
        self.threads = validate_threads(self.threads)
        self.tasks = tuple(self.tasks)
        require(len(self.tasks) > 0 and all(isinstance(t, str) and t for t in self.tasks), "tasks", self.tasks,
                "give one or more task names (--tasks a,b)")
        if self.num_fewshot is not None:
            require(is_int(self.num_fewshot) and self.num_fewshot >= 0, "num_fewshot", self.num_fewshot,
                    "must be an integer >= 0 (or none)")
        if self.limit is not None:
            require(is_int(self.limit) and self.limit >= 1, "limit", self.limit, "must be an integer >= 1 (or none)")
        for name, low in (("batch_size", 1), ("max_gen_toks", 1), ("seed", 0)):
            value = getattr(self, name)
            require(is_int(value) and value >= low, name, value, f"must be an integer >= {low}")
        require(self.dtype in EVAL_DTYPES, "dtype", self.dtype, f"must be one of {EVAL_DTYPES}")
        require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")


