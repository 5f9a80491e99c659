"""Training: the scheduled multi-pass objective, LR/feedback schedules, checkpoints and the Trainer loop."""

from fullband.training.checkpoint import (
    TrainingState,
    latest_good_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from fullband.training.errors import CheckpointError, CheckpointWarning, NonFiniteLossError, TrainingError
from fullband.training.objective import multipass_loss, sample_plain_prefix
from fullband.training.optim import build_optimizer, lr_at
from fullband.training.schedule import FeedbackSchedule
from fullband.training.trainer import Trainer
from fullband.training.validation import loss_eval

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "FeedbackSchedule",
    "NonFiniteLossError",
    "Trainer",
    "TrainingError",
    "TrainingState",
    "build_optimizer",
    "latest_good_checkpoint",
    "load_checkpoint",
    "loss_eval",
    "lr_at",
    "multipass_loss",
    "sample_plain_prefix",
    "save_checkpoint",
    "verify_checkpoint",
]
