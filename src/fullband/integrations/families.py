"""The model families: the one table that names them, and how a directory or a source finds its family.

A family is a :class:`~fullband.model.feedback.FeedbackLM` subclass answering the model-family interface
(:mod:`fullband.model.family`: its files, options, cache type and parameter roles) plus a :class:`Family` entry
here saying how to find it. Training, checkpoints, :mod:`fullband.model_io` and serving look families up here
and call the interface; none of them names one. The classes are imported on first use (by their
``"module:Class"`` name), so this module needs neither torch nor transformers and the command line checks its
options before importing either.

Adding a family touches ``integrations/`` only: write its FeedbackLM subclass (and its options section, if it
is built from a source) in a module here, add its :class:`Family` to :data:`FAMILIES` and its options section
to :class:`FamilyOptions` (that is ``fullband train --<section>.<key>``).
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fullband.config import HF_PREFIX
from fullband.integrations.retrofit.config import RETROFIT_CONFIG, RETROFIT_FAMILY, RetrofitOptions


@dataclass(frozen=True)
class Family:
    name: str  # the model_type its checkpoints' config.json records (the class's ``family``)
    model: str  # "module:Class" of its FeedbackLM subclass, imported on first use
    description: str  # how messages name it
    marker: str | None = None  # a file only its checkpoints hold; None = the default family (any other directory)
    source_prefix: str | None = None  # a model argument it builds from ("hf:PATH"), with its options section
    options: str | None = None  # the name of that section in FamilyOptions
    source_help: str = ""  # what ``init_from=<source_prefix>...`` means (fullband train --help)
    extra: str | None = None  # the pip extra its module needs
    auto_classes: str | None = None  # module that registers its transformers Auto classes when imported

    def model_class(self) -> type:
        """Its FeedbackLM subclass (ImportError when its extra is not installed)."""
        module, _, name = self.model.partition(":")
        return getattr(importlib.import_module(module), name)


NATIVE = Family("fullband", "fullband.model.lm:FullBandwidthLM", "a native fullband model",
                auto_classes="fullband.integrations.hf")
RETROFIT = Family(RETROFIT_FAMILY, "fullband.integrations.retrofit.lm:RetrofittedLM",
                  "a retrofitted transformers model", marker=RETROFIT_CONFIG, source_prefix=HF_PREFIX,
                  options="retrofit", extra="hf", auto_classes="fullband.integrations.hf_retrofit",
                  source_help="'hf:PATH': the transformers causal LM (Llama, Qwen2, GPT-2, ...) saved with "
                  "save_pretrained, with its tokenizer, in the local directory PATH, retrofitted with latent feedback "
                  "([retrofit]) and tokenized with its own tokenizer")
FAMILIES: dict[str, Family] = {family.name: family for family in (NATIVE, RETROFIT)}
DEFAULT = NATIVE  # a fresh model from [model], and any directory no other family's marker claims


def family_of(directory: str | Path) -> Family:
    """The family whose checkpoint ``directory`` holds, by its marker file (the default family without one)."""
    return next((f for f in FAMILIES.values() if f.marker and (Path(directory) / f.marker).is_file()), DEFAULT)


def family_of_files(names: Collection[str]) -> Family:
    """:func:`family_of` for a listing of a checkpoint's files (its manifest)."""
    return next((f for f in FAMILIES.values() if f.marker and f.marker in names), DEFAULT)


def source_family(spec: str | Path | None) -> Family | None:
    """The family a model argument such as ``hf:PATH`` builds from a source, or None."""
    text = str(spec or "")
    return next((f for f in FAMILIES.values() if f.source_prefix and text.startswith(f.source_prefix)), None)


def source_help() -> str:
    """What each source prefix builds, for the help of a model argument."""
    return "; or ".join(f.source_help for f in FAMILIES.values() if f.source_prefix) + "."


def family_named(name: str) -> Family:
    """The family of a model's ``family`` name."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def new_model(config: Any) -> Any:
    """A fresh model of the default family from its config (``fullband train``'s [model], resolved)."""
    return DEFAULT.model_class().from_config(config)


def register_auto_classes() -> None:
    """Register every family's transformers Auto classes (AutoConfig / AutoModelForCausalLM), so transformers
    reads fullband checkpoints locally; needs transformers."""
    for family in FAMILIES.values():
        if family.auto_classes:
            importlib.import_module(family.auto_classes)


@dataclass
class FamilyOptions:
    """The options sections of the families built from a source; ``fullband train`` reads them as its own."""

    retrofit: RetrofitOptions = field(default_factory=RetrofitOptions)

    def family_options(self, family: Family) -> Any:
        return getattr(self, family.options) if family.options else None

    def check_family_options(self, init_from: str | None, feedback: bool) -> None:
        """Each section checks itself against the run's ``init_from`` and ``model.feedback`` (ConfigError)."""
        for section in fields(FamilyOptions):
            getattr(self, section.name).check(init_from, feedback)
