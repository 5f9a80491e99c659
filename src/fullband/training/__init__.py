"""Training: the scheduled multi-pass objective, LR/feedback schedules, checkpoints and the Trainer loop.

The names below load on first use, so ``fullband.training.config`` (torch-free: the command line checks its options
before importing torch) can be imported without the trainer.
"""

from typing import Any

_EXPORTS = {
    "CheckpointError": "errors", "CheckpointWarning": "errors", "NonFiniteLossError": "errors",
    "TrainingError": "errors", "TrainingState": "checkpoint_layout", "latest_good_checkpoint": "checkpoint_layout",
    "load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint", "verify_checkpoint": "checkpoint_layout",
    "MultiPassObjective": "objective", "sample_plain_prefix": "objective", "build_optimizer": "optim",
    "lr_at": "optim", "FeedbackSchedule": "schedule", "Trainer": "trainer", "loss_eval": "validation",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fullband.training' has no attribute {name!r}")
    from fullband.training import checkpoint, checkpoint_layout, errors, objective, optim, schedule, trainer, validation

    modules = {"checkpoint": checkpoint, "checkpoint_layout": checkpoint_layout, "errors": errors,
               "objective": objective, "optim": optim, "schedule": schedule, "trainer": trainer,
               "validation": validation}
    return getattr(modules[_EXPORTS[name]], name)
