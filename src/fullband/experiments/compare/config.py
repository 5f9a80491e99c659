"""``fullband compare``'s config: the language-model runs' config and presets (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from fullband.experiments.core.lm.config import LMRunsConfig


@dataclass
class CompareConfig(LMRunsConfig):
    """``fullband compare``: does latent feedback buy training tokens? Baselines at several token budgets and
    full-bandwidth models at 1x, evaluated on the test split in every mode (a prepared shard directory as
    ``data.source``: its validation split), plus the stability diagnostic."""
