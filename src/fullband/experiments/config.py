"""The configs and presets of the studies (``fullband compare``, ``recipe``, ``eval-reasoning``, ``eval-state``).

Torch-free, so the command line checks them (and answers ``--help``) before importing torch. Presets are data:
:func:`fullband.config.apply_preset` applies them in each config's ``__post_init__``, so ``CompareConfig(
preset="smoke")`` in Python, a config file and the command line all mean the same.

One module per study: :mod:`.compare_config`, :mod:`.recipe_config`, :mod:`.synthetic_config` (eval-reasoning and
eval-state); this module gathers them, so ``from fullband.experiments.config import ReasoningConfig`` keeps working.
"""

from fullband.config import EXACT_METHODS
from fullband.experiments.compare_config import COMPARE_PRESETS, CompareConfig, validate_compare_config
from fullband.experiments.recipe_config import RECIPE_PRESETS, RECIPE_VARIANTS, RecipeConfig
from fullband.experiments.synthetic_config import (
    CONTROLS,
    REASONING_FAMILIES,
    REASONING_PRESETS,
    STATE_PREFILLS,
    STATE_PRESETS,
    STATE_TASKS,
    ReasoningConfig,
    StateTrackingConfig,
    SyntheticStudyConfig,
)

__all__ = [
    "COMPARE_PRESETS", "CONTROLS", "EXACT_METHODS", "REASONING_FAMILIES", "REASONING_PRESETS", "RECIPE_PRESETS",
    "RECIPE_VARIANTS", "STATE_PREFILLS", "STATE_PRESETS", "STATE_TASKS", "CompareConfig", "ReasoningConfig",
    "RecipeConfig", "StateTrackingConfig", "SyntheticStudyConfig", "validate_compare_config",
]
