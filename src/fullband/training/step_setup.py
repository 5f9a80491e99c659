"""Setup pieces of a training step that need no Trainer: whether to compile, the autocast dtype, the plain prefixes of
a step's rows, and how the metrics of a step's micro-batches add up."""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from fullband.config import ConfigError
from fullband.training.config import COMPILE_MIN_CPU_STEPS, COMPILE_MIN_CPU_WORK, TrainConfig
from fullband.training.objective import sample_plain_prefix


def should_compile(setting: str, device: torch.device, total_steps: int, work: float | None = None) -> bool:
    """Whether the trainer compiles the blocks (``train.compile``). 'auto' = on CUDA; on a CPU with a C++ compiler,
    for one run when its ``work`` (:func:`compile_work`) reaches COMPILE_MIN_CPU_WORK, or, for a study's runs, which
    share one compile cache (``work`` None), when they have at least COMPILE_MIN_CPU_STEPS steps.

    Blocks, not the whole model (as torchtitan does): the forward around them is Python control flow over
    passes, prefixes and caches that would break a whole-model graph many times; the blocks are where the FLOPs
    are, and they see one shape per run whatever the pass count. Compiling fuses the elementwise work between the
    matrix products, so a step saves time in proportion to its activations (tokens x d_model x n_layers x passes):
    on 2 busy AMD EPYC cores, one thread, 0.016 s of a 0.121 s step at d_model 32 (4 layers, 2048 tokens a step)
    and 0.042 s of 0.465 s at compare's d_model 128, about 2-3e-8 s per unit of that work, against a compile of
    15 s there: COMPILE_MIN_CPU_WORK (6e8) units earn it back (docs/LOG.md, 2026-12-06). A study compiles by its
    shortest run's length instead: after its first run the compile comes from inductor's cache, and compare's default
    study (125-375-step runs) took 220-228 s compiled, cold cache included, against 251 s eager (2026-12-05).
    """
    if setting != "auto":
        return setting == "true"
    if device.type == "cuda":
        return True
    if device.type != "cpu" or _cxx_compiler() is None:
        return False
    return total_steps >= COMPILE_MIN_CPU_STEPS if work is None else work >= COMPILE_MIN_CPU_WORK


def compile_work(total_steps: int, tokens_per_step: int, d_model: int, n_layers: int, feedback: bool) -> float:
    """A run's elementwise work between the blocks' matrix products, what compiled blocks save time on: steps x
    tokens per step x d_model x n_layers, x 2 for a feedback model (about two passes a step under the recipe)."""
    return float(total_steps) * tokens_per_step * d_model * n_layers * (2 if feedback else 1)


def _cxx_compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("clang++")


def accumulate(totals: dict[str, Any], metrics: dict[str, Any], grad_accum: int) -> None:
    """Average the micro-batches' losses; sum their token counts."""
    if grad_accum == 1:  # one micro-batch: its metrics as they are (no tensor ops)
        totals.update(metrics)
        return
    for key, value in metrics.items():
        if key in ("tokens", "token_equiv_compute"):
            totals[key] = totals.get(key, 0) + value
        elif key == "passes":
            totals[key] = value
        elif key == "pass_losses":
            previous = totals.get(key) or [0.0] * len(value)
            totals[key] = [a + b / grad_accum for a, b in zip(previous, value, strict=True)]
        else:
            totals[key] = totals.get(key, 0.0) + value / grad_accum


def autocast_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """bf16 on a CUDA device that supports it (for 'auto' and 'bf16'), None (full precision) otherwise."""
    if setting == "off":
        return None
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if setting == "bf16":
        raise ConfigError(f"train.autocast='bf16' is invalid on {device}: bf16 autocast needs a CUDA GPU with bf16 "
                          "support; use 'auto' or 'off'")
    return None


def plain_prefixes(cfg: TrainConfig, generator: torch.Generator, rows: int, seq_len: int, passes: int, rank: int,
                   world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefix lengths of process ``rank``, its slice of one draw for the global batch: (rows,), or with
    ``prefix_per_pass`` (passes, rows), a fresh draw for every pass; and the global draw they come from."""
    if not cfg.prefix_mixin:
        return torch.ones(rows, dtype=torch.long), torch.ones(rows * world_size, dtype=torch.long)
    if cfg.prefix_per_pass:
        everyone = sample_plain_prefix(passes * rows * world_size, seq_len, generator).view(passes, -1)
        return everyone[:, rank * rows : (rank + 1) * rows], everyone
    # Drawn even for single-pass steps, so the prefixes of a step do not depend on the pass schedule.
    everyone = sample_plain_prefix(rows * world_size, seq_len, generator)
    return everyone[rank * rows : (rank + 1) * rows], everyone
