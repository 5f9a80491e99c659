"""Setup pieces of a training step that need no Trainer: whether to compile, the autocast dtype, and how the
metrics of a step's micro-batches add up."""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from fullband.config import ConfigError
from fullband.training.config import COMPILE_MIN_CPU_STEPS


def should_compile(setting: str, device: torch.device, total_steps: int) -> bool:
    """Whether the trainer compiles the blocks (``train.compile``): 'auto' = on CUDA, and on a CPU for runs of at
    least COMPILE_MIN_CPU_STEPS steps when a C++ compiler is there.

    Blocks, not the whole model (as torchtitan does): the forward around them is Python control flow over
    passes, prefixes and caches that would break a whole-model graph many times; the blocks are where the FLOPs
    are, and they see one shape per run whatever the pass count. On 2 CPU cores the compile took ~18 s cold (2-3 s
    from inductor's disk cache, which later runs on the machine hit) and made a step 1.04-1.28x faster at nanoGPT's
    CPU config and 1.14-1.24x at compare's (``fullband bench``); compare's default study (125-375-step runs) took
    220-228 s compiled, cold cache included, against 251 s eager (docs/LOG.md, 2026-12-05): runs shorter than
    COMPILE_MIN_CPU_STEPS stay eager.
    """
    if setting != "auto":
        return setting == "true"
    if device.type == "cuda":
        return True
    return device.type == "cpu" and total_steps >= COMPILE_MIN_CPU_STEPS and _cxx_compiler() is not None


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
