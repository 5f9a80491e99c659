"""The config base of every study (:class:`StudyConfig`) and of the synthetic-task studies of two models, the
baseline and the full-bandwidth one, of one size trained on the same batches (:class:`SyntheticStudyConfig`).

Torch-free, so the command line checks a config (and answers ``--help``) before importing torch. Presets are data:
:func:`fullband.config.apply_preset` applies them in ``__post_init__``, so ``CompareConfig(preset="smoke")`` in
Python, a config file and the command line all mean the same."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fullband.config import (
    apply_preset,
    current_explicit_keys,
    device_field,
    doc,
    require,
    study_resumes,
    threads_field,
    validate_device_name,
    validate_threads,
)
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig, TrainModelConfig

# The training knobs of the two models live in fullband train's sections ([model], [train], [optim], [schedule]),
# declared once there. The flat names these studies took before (--d_model, --steps, --lr, ...) are refused with a
# hint naming the sectioned flag (configio); results.json still records the values under them (flat_view).
ALIASES = {"d_model": "model.d_model", "n_layers": "model.n_layers", "n_heads": "model.n_heads",
           "steps": "train.max_steps", "batch_size": "train.batch_size", "seed": "train.seed", "lr": "optim.lr",
           "feedback_start": "schedule.feedback_start", "pass_mix": "schedule.pass_mix"}


# Section keys the study decides itself (PairStudy.model_spec, sft_run_config): a value given for one is refused.
SET_BY_STUDY = {"model.vocab_size": "the byte tokenizer's", "model.max_seq_len": "the longest example",
                "model.feedback": "false for the baseline, true for the full-bandwidth model",
                "train.seq_len": "the longest example", "optim.warmup_steps": "5% of train.max_steps",
                "train.checkpoint_every": "a tenth of train.max_steps, so that a killed study resumes"}


def sectioned(preset: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """A preset written with the flat names -> the sections' form :func:`apply_preset` takes."""
    out: dict[str, Any] = {}
    for key, value in preset.items():
        if key in aliases:
            section, name = aliases[key].split(".")
            out.setdefault(section, {})[name] = value
        else:
            out[key] = value
    return out


# What these studies trained with before their sections defaulted to fullband train's recipe: AdamW at one learning
# rate without weight decay, feedback from 75% of the steps. The presets the committed reports were made with keep it.
STUDY_ADAMW = {"optim": {"optimizer": "adamw", "fusion_lr_mult": 1.0, "weight_decay": 0.0},
               "schedule": {"feedback_start": 0.75}}


def pinned(preset: dict[str, Any], recipe: bool) -> dict[str, Any]:
    """``preset`` with STUDY_ADAMW's values where it sets none of its own, unless it trains with the ``recipe``."""
    if recipe:
        return preset
    out = dict(preset)
    for section, values in STUDY_ADAMW.items():
        out[section] = values | out.get(section, {})
    return out


def flat_view(cfg: Any) -> dict[str, Any]:
    """The config as results.json records it: the study's own fields and each alias's value (the report code reads
    these names), then the whole training sections under "training"."""
    from fullband.configio import config_to_dict

    tree = config_to_dict(cfg)
    out = {k: v for k, v in tree.items() if k not in cfg.SECTIONS}
    for alias, dotted in cfg.ALIASES.items():
        section, name = dotted.split(".")
        out[alias] = tree[section][name]
    return out | {"training": {k: tree[k] for k in cfg.SECTIONS}}


@dataclass
class StudyConfig:
    """What every study's config is: a ``preset`` (one of ``PRESETS``, data applied the same way from Python, a
    file and the command line), an ``out_dir``, a ``device`` and ``threads``, and ``resume`` where the study continues
    an interrupted run; the training sections of ``fullband train`` it embeds are named in ``SECTIONS``.

    A study's config subclasses this with its own fields, in the order its ``--help`` and its rerun command show
    them (``preset`` first; declare ``device`` with :func:`fullband.config.device_field` and ``threads`` with
    ``threads_field``), and checks its own values in :meth:`validate`: every value is checked here, once, with a
    message that names the field and what it may be."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    PRESET_ALIASES: ClassVar[dict[str, str]] = {}  # earlier preset names -> today's
    SECTIONS: ClassVar[tuple[str, ...]] = ()  # the training sections the config embeds (fullband.training.config)
    TUPLES: ClassVar[tuple[str, ...]] = ()  # list fields: one value or a list from a file becomes a tuple

    preset: str = doc("default", "Settings to start from: one of the presets.")

    def __post_init__(self) -> None:
        validate_device_name(self.device)
        if hasattr(self, "resume"):  # from here on a bool: whether the study continues the one in out_dir
            self.resume = study_resumes(self.resume, self.out_dir)
        self.preset = self.PRESET_ALIASES.get(self.preset, self.preset)
        apply_preset(self, self.PRESETS)
        self.threads = validate_threads(self.threads)
        for name in self.TUPLES:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, (value,) if isinstance(value, (str, int, float)) else tuple(value))
        require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")
        self.validate()

    def validate(self) -> None:
        """The study's own fields (after the preset is applied)."""


@dataclass
class SyntheticStudyConfig(StudyConfig):
    """What the synthetic-task studies share: two models (baseline and full-bandwidth) of one size trained on the
    same batches of a synthetic task (fullband.experiments.core.pair.PairStudy), with the training
    sections of ``fullband train``. The study fills in what the task decides: model.max_seq_len and train.seq_len
    (the longest example), optim.warmup_steps (5% of train.max_steps), data (the task's files, byte tokenizer); the
    baseline trains with model.feedback=false, fusion LR x1 and no multi-pass batches. Study fields left at none
    come from the preset."""

    ALIASES: ClassVar[dict[str, str]] = ALIASES  # flat option -> section.key (configio reads them)
    SECTIONS: ClassVar[tuple[str, ...]] = ("model", "train", "optim", "schedule")

    preset: str = doc("default", "Sizes of everything left at none: one of the presets (see preset's choices).")
    out_dir: str = doc("runs/study", "Run directory: data/, baseline/, fullband/, results.json, report.md, PNG.")
    # fullband train's recipe (model, optim, schedule), in eager tiny runs that validate only at the end (1 and 3
    # passes, 4 batches) and keep one checkpoint. The presets of the committed reports pin what they trained with.
    model: TrainModelConfig = field(default_factory=TrainModelConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        eval_every=0, eval_batches=4, checkpoint_every=0, keep_last=1, log_every=50, compile="false"))
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    # auto leaves the cores other running processes hold (fullband.devices.resolve_threads), which these tiny models
    # suffer from most; seeds run side by side (workers) share the threads out (fullband.experiments.core.parallel).
    threads: str = threads_field()
    device: str = device_field("for training and evaluation")
    progress: bool = doc(True, "Progress bars.")
    reuse_models: bool = doc(False, "Evaluate the models an earlier run left in out_dir instead of training.")

    def __post_init__(self) -> None:
        super().__post_init__()
        defaults = {f.name: f.default_factory() for f in dataclasses.fields(self) if f.name in self.SECTIONS}
        for dotted, what in SET_BY_STUDY.items():
            section, name = dotted.split(".")
            value = getattr(getattr(self, section), name)
            require(value == getattr(defaults[section], name), dotted, value,
                    f"the study sets it ({what}); leave it out")
        if self.train.grad_passes > 0 and "train.jitter" not in current_explicit_keys():
            # The studies' truncated-gradient runs (the exact-recurrence presets, --grad_passes) trained without
            # jitter when train.jitter did not apply to them; they keep computing that, and their run configs now
            # say so (jitter 0). An explicit --train.jitter applies.
            self.train = dataclasses.replace(self.train, jitter=0.0)
        start = self.schedule.feedback_start
        require(start < 1, "schedule.feedback_start", start,
                "must be in [0, 1): the fullband model needs some multi-pass steps")

    @property
    def seed(self) -> int:
        """The first seed: of the data, the initial weights and the batches (train.seed)."""
        return self.train.seed
