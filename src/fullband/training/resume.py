"""The settings ``fullband train`` runs with. ``--resume true|auto`` takes them from the run being resumed (its
``out_dir/config.toml``, saved when it started), not from the command line's defaults, as nanoGPT's
``init_from='resume'`` and torchtitan's checkpoint manager do.

A value given with the resume may change only what can change in the middle of a run: its length, its evaluation,
checkpoint and logging cadence, and how and where it runs (:data:`CHANGEABLE`). Any other value given must equal
the run's; a different one is refused in one line naming the setting and both values. Torch-free until a run
directory is looked at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fullband import rundir
from fullband.config import ConfigError
from fullband.configio import build_config, load_config_file, show_value
from fullband.training.config import TrainRunConfig, validate_resume

# Dotted keys a resumed run takes from the command line: the run's length, the cadence of evaluation, checkpoints
# and logging, how a step is executed (the same numbers) and where; and the resume itself.
CHANGEABLE = frozenset({
    "train.max_steps", "train.token_budget", "train.eval_every", "train.eval_batches", "train.checkpoint_every",
    "train.keep_last", "train.log_every", "train.wandb_project", "train.compile", "train.activation_checkpointing",
    "eval_passes", "device", "threads", "resume", "out_dir",
})


def settings_of(out_dir: str | Path) -> Path | None:
    """``out_dir``'s saved settings when it holds a run to resume (checkpoints and config.toml), else None."""
    from fullband.training.checkpoint_layout import list_checkpoints  # imports torch: only when resuming

    path = Path(out_dir) / rundir.SETTINGS
    return path if list_checkpoints(out_dir) and path.is_file() else None


def train_config(given: dict[str, Any]) -> TrainRunConfig:
    """The run's config from ``given`` ({dotted key: value} that a config file and the command line set): built from
    them, or, when it resumes a run, the run's saved settings with the given values of :data:`CHANGEABLE` keys.

    Raises ConfigError when a resume is given another value of a key that may not change.
    """
    defaults = TrainRunConfig.__dataclass_fields__
    resume = validate_resume(given.get("resume", defaults["resume"].default))
    out_dir = given.get("out_dir", defaults["out_dir"].default)
    path = settings_of(out_dir) if resume != "false" and isinstance(out_dir, str) and out_dir else None
    if path is None:
        return build_config(TrainRunConfig, None, given)
    try:
        saved_tree = load_config_file(path)
        saved = build_config(TrainRunConfig, saved_tree, {})
    except ConfigError as err:
        raise ConfigError(f"{path}, the settings of the run to resume, does not load: {err}") from None
    for key in sorted(set(given) - CHANGEABLE):
        if not _same(saved_tree, saved, key, given[key]):
            raise ConfigError(f"{key}={show_value(given[key])} conflicts with the run's {key}="
                              f"{show_value(_value(saved, key))}: a resumed run keeps its settings; train into a new "
                              "--out_dir to change them")
    changes = {key: value for key, value in given.items() if key in CHANGEABLE}
    return build_config(TrainRunConfig, saved_tree, changes | {"resume": resume, "out_dir": out_dir})


def _same(saved_tree: dict[str, Any], saved: TrainRunConfig, key: str, value: Any) -> bool:
    """Whether ``key=value`` says what the saved settings say (``yes`` is ``true``: compared as the config reads it)."""
    if value == _value(saved, key):
        return True
    try:
        return _value(build_config(TrainRunConfig, saved_tree, {key: value}), key) == _value(saved, key)
    except ConfigError:
        return False


def _value(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
