"""Exceptions and warnings of the training loop."""

from __future__ import annotations

from fullband.model.serialization import CheckpointError

__all__ = ["CheckpointError", "CheckpointWarning", "NonFiniteLossError", "TrainingError"]


class TrainingError(RuntimeError):
    """Training cannot go on (the message says why and what to change)."""


class NonFiniteLossError(TrainingError):
    """The loss or gradient norm became NaN/inf; no checkpoint is written from such a state."""

    def __init__(self, what: str, value: float, step: int) -> None:
        super().__init__(
            f"{what} is {value} at step {step}: training diverged, so no checkpoint is written. "
            "Lower the learning rate (--optim.lr), enable or tighten gradient clipping (--optim.grad_clip), "
            "or lengthen warmup (--optim.warmup_steps), then resume from the last good checkpoint."
        )
        self.step = step
        self.value = value


class CheckpointWarning(UserWarning):
    """A checkpoint directory is partial or corrupt and was skipped."""
