"""A training step's scalars on their way from the device to the log.

On a CPU every step reads its losses and gradient norm at once (the device is the host). On CUDA the Trainer leaves
them on the device as a :class:`PendingStep` and reads the last one back every ``log_every`` steps (and before it
evaluates or saves), so the host queues the next steps while the GPU runs: nanoGPT's loop reads its loss only when it
prints. Each record then times its window of steps (:class:`StepWindow`): per step, the host time of the window's
steps plus the one wait for the GPU at the read-back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

PENDING = "_pending"  # the key of an unread record's PendingStep


@dataclass
class PendingStep:
    """What a step's record needs, its scalars possibly still on the device."""

    step: int
    names: list[str]  # the names of the first len(names) entries of values (objective, z_loss)
    values: torch.Tensor  # (len(names) + passes,): those losses, then each pass's
    grad_norm: torch.Tensor | float  # 0-d before the read-back
    lr: float
    passes: int
    tokens: int  # the run's totals after this step
    token_equiv_compute: int
    step_tokens: int  # this step's, over every process
    step_compute: int

    def record(self, scalars: dict[str, Any], grad_norm: float, seconds: float, flops_per_token: float,
               peak_flops: float | None) -> dict[str, Any]:
        """The metrics.jsonl record of this step, from its scalars read back (:func:`read_scalars`): ``loss`` is pass
        1's next-token loss (what the progress bar shows and val_loss_1pass measures), ``pass_losses`` every scored
        pass's, ``objective`` what was backpropagated (their weighted sum, plus the z-loss term when on)."""
        losses = {k: scalars[k] for k in self.names}
        record = {"kind": "train", "step": self.step, "loss": scalars["pass_losses"][0], **losses,
                  "pass_losses": scalars["pass_losses"], "lr": self.lr,
                  "passes": self.passes, "tokens": self.tokens, "token_equiv_compute": self.token_equiv_compute,
                  "tokens_per_s": self.step_tokens / seconds, "grad_norm": grad_norm, "step_time_s": seconds}
        if peak_flops is not None:
            record["mfu"] = flops_per_token * self.step_compute / seconds / peak_flops
        return record


def read_scalars(names: list[str], values: torch.Tensor) -> dict[str, Any]:
    """The losses by name and ``pass_losses``, read from the device in one transfer."""
    host = values.tolist()
    return {**dict(zip(names, host[: len(names)], strict=True)), "pass_losses": host[len(names):]}


class StepWindow:
    """The time of the steps since the last read-back: their host time plus the read-back's wait."""

    def __init__(self) -> None:
        self.seconds, self.steps = 0.0, 0
        self._since = time.perf_counter()

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.steps += 1
        self._since = time.perf_counter()

    def per_step(self) -> float:
        """Seconds per step of the window, the wait for the device since the last step included; starts a new one."""
        seconds = (self.seconds + time.perf_counter() - self._since) / max(self.steps, 1)
        self.seconds, self.steps = 0.0, 0
        self._since = time.perf_counter()
        return seconds


def check_token_range(tokens: torch.Tensor, vocab_size: int) -> None:
    """Refuse token ids outside the vocabulary, on the host (the model's own check would sync a CUDA device)."""
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"token id {bad} out of range: the model's vocab_size is {vocab_size} (ids must be in "
                         f"0..{vocab_size - 1})")


def shown(record: dict[str, Any], feedback: bool) -> dict[str, str]:
    """What the progress bar shows of a step: the next-token loss of pass 1 (val_loss_1pass's quantity, on the
    training batch) and, with feedback, of the step's last pass (not the objective, which adds them up); its passes,
    tokens/s and, where the device's peak is known, its MFU."""
    losses = record["pass_losses"]
    line = {"loss": f"{losses[0]:.4f}"}
    if feedback:
        line["last_pass"] = f"{losses[-1]:.4f}"
    line |= {"passes": str(record["passes"]), "tok_s": f"{record['tokens_per_s']:.0f}"}
    return line | ({"mfu": f"{100 * record['mfu']:.1f}%"} if "mfu" in record else {})
