"""The one table of model families, and how a model argument (a directory, or a source such as ``hf:PATH``) finds
its family. Torch-free: the command line reads the families' options sections before importing torch."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fullband.config import HF_PREFIX
from fullband.families.spec import FamilySpec
from fullband.integrations.retrofit.config import RETROFIT_CONFIG, RETROFIT_FAMILY, RetrofitOptions

NATIVE = FamilySpec("fullband", "fullband.model.lm:FullBandwidthLM", "a native fullband model",
                    auto_classes="fullband.integrations.hf")
RETROFIT = FamilySpec(
    RETROFIT_FAMILY, "fullband.integrations.retrofit.lm:RetrofittedLM", "a retrofitted transformers model",
    marker=RETROFIT_CONFIG, source_prefix=HF_PREFIX, options="retrofit", extra="hf",
    auto_classes="fullband.integrations.hf_retrofit",
    source_help=f"'{HF_PREFIX}PATH': the transformers causal LM (Llama, Qwen2, GPT-2, ...) saved with save_pretrained, "
    "with its tokenizer, in the local directory PATH, retrofitted with latent feedback ([retrofit]) and tokenized "
    "with its own tokenizer",
    source_vocab_fix="resize the model's embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer))) "
    "and save it again",
)
FAMILIES: dict[str, FamilySpec] = {family.name: family for family in (NATIVE, RETROFIT)}
DEFAULT = NATIVE  # a fresh model from [model], and any directory no other family's marker claims


def family_of(directory: str | Path) -> FamilySpec:
    """The family whose checkpoint ``directory`` holds, by its marker file (the default family without one)."""
    return next((f for f in FAMILIES.values() if f.marker and (Path(directory) / f.marker).is_file()), DEFAULT)


def family_of_files(names: Collection[str]) -> FamilySpec:
    """:func:`family_of` for a listing of a checkpoint's files (its manifest)."""
    return next((f for f in FAMILIES.values() if f.marker and f.marker in names), DEFAULT)


def source_family(argument: str | Path | None) -> FamilySpec | None:
    """The family a model argument such as ``hf:PATH`` builds from a source, or None."""
    return next((f for f in FAMILIES.values() if f.builds_from(argument)), None)


def family_of_argument(argument: str | Path) -> FamilySpec:
    """The family a model argument names: the one that builds from it, else the one whose checkpoint it holds."""
    return source_family(argument) or family_of(argument)


def checkpoint_dir(argument: str | Path) -> Path:
    """The directory a model argument names: PATH of ``PREFIX:PATH``, anything else itself (for its tokenizer, and
    the served model's name)."""
    family = source_family(argument)
    return family.source_path(argument) if family else Path(str(argument)).expanduser()


def source_help() -> str:
    """What each source prefix builds, for the help of a model argument."""
    return "; or ".join(f.source_help for f in FAMILIES.values() if f.source_prefix) + "."


def family_named(name: str) -> FamilySpec:
    """The family of a model's ``family`` name."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


@dataclass
class FamilyOptions:
    """The options sections of the families built from a source; ``fullband train`` reads them as its own."""

    retrofit: RetrofitOptions = field(default_factory=RetrofitOptions)

    def family_options(self, family: FamilySpec) -> Any:
        return getattr(self, family.options) if family.options else None

    def check_family_options(self, init_from: str | None, feedback: bool) -> None:
        """Each section checks itself against the run's ``init_from`` and ``model.feedback`` (ConfigError)."""
        for section in fields(FamilyOptions):
            getattr(self, section.name).check(init_from, feedback)
