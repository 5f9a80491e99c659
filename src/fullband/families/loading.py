"""Load any model fullband can run, by asking its family's spec: every command and study loads through
:func:`load_any`, and ``fullband train`` starts from :func:`init_from`.

A model argument is

    a directory    the family whose marker file it holds (a native ``model.safetensors`` + ``config.json``
                   otherwise), loaded by that family's spec
    PREFIX:PATH    a family built from a source (``hf:PATH``: a transformers causal LM saved in PATH, given latent
                   feedback with fusion weights initialised with seed 0, so standard mode = the pretrained model)

Anything else (a missing path, a file, a directory with no model, a transformers model without its prefix) raises a
:class:`CheckpointError` whose one-line message says what to give instead. Every family is a FeedbackLM (one
multi-pass forward, forward_exact, save_pretrained; decoding is ``fullband.generation``'s), so commands that only
decode or score load any of them here. A family's optional dependency (transformers, the ``hf`` extra) is imported
only when one of its models is seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fullband import rundir
from fullband.config import ConfigError
from fullband.data import DataError, Tokenizer
from fullband.families.spec import FamilySpec
from fullband.families.table import DEFAULT, FAMILIES, family_of, family_of_argument, source_family
from fullband.model import FeedbackLM
from fullband.model.serialization import CheckpointError

AnyLM = FeedbackLM  # a model of any family


def load_any(
    argument: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
    feedback: bool | None = None,
) -> AnyLM:
    """The model ``argument`` names (a model directory of any family, or ``PREFIX:PATH``), in eval mode on
    ``device``.

    ``dtype=None`` keeps the saved dtype. ``feedback`` adds or drops the fusion weights where the family can (a
    native model, as :meth:`FullBandwidthLM.from_pretrained`). Problems (missing or corrupt files, an optional
    dependency not installed) raise :class:`CheckpointError`.
    """
    if (family := source_family(argument)) is not None:
        return _from_source(family, str(argument), device, dtype)
    return family_of(_check_model_dir(argument)).load(argument, device=device, dtype=dtype, feedback=feedback)


def _check_model_dir(argument: str | Path) -> Path:
    """``argument`` as a directory; CheckpointError saying what to give when it is missing or a file."""
    path = Path(argument).expanduser()
    if not path.exists():
        sources = "".join(f" or {f.source_prefix}PATH" for f in FAMILIES.values() if f.source_prefix)
        raise CheckpointError(f"checkpoint {str(argument)!r} does not exist: give a model directory (fullband "
                              f"train's out_dir/model, a save_pretrained directory){sources}")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(argument)!r} is a file: give the directory that holds the model's "
                              "config.json and weights")
    return path


def load_tokenizer_of(argument: str | Path) -> Tokenizer | None:
    """The tokenizer of a model argument, as its family finds it (None when a model directory holds none)."""
    return family_of_argument(argument).load_tokenizer(argument)


def _from_source(family: FamilySpec, argument: str, device: torch.device | str | None,
                 dtype: torch.dtype | None) -> AnyLM:
    with torch.random.fork_rng(devices=[]):  # the same fusion weights every time, the caller's RNG untouched
        torch.manual_seed(0)
        try:
            model = family.from_source(argument, dtype=dtype)
        except (ValueError, NotImplementedError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{argument!r} cannot be loaded as {family.description}: {_first_line(err)}"
                                  ) from None
    return model.to(device=device).eval()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ---------------------------------------------------------------------------------------------- fullband train


@dataclass(frozen=True)
class InitFrom:
    """What a training run starts from (``init_from``), as its family's spec says: the model and its tokenizer,
    their problems as ConfigErrors naming ``init_from``. ``fullband train`` asks this and names no family."""

    argument: str
    family: FamilySpec

    @property
    def built_from_source(self) -> bool:
        return self.family.builds_from(self.argument)

    def tokenizer(self) -> Tokenizer | None:
        """The model's own tokenizer: a source's (ConfigError without one), or the one saved in its directory."""
        try:
            return self.family.load_tokenizer(self.argument, required=self.built_from_source)
        except DataError as err:
            if not self.built_from_source:
                raise
            path = self.family.source_path(self.argument)
            raise ConfigError(f"init_from={self.argument!r}: {err} (save the model's tokenizer into the same "
                              f"directory: tokenizer.save_pretrained({str(path)!r}))") from None

    def model(self, options: Any, feedback: bool | None) -> AnyLM:
        """The model to train (its family's ``options`` section; ``feedback`` adds or drops the fusion where the
        family can), in training mode."""
        if not self.built_from_source:
            self._check_directory()
        try:
            return self.family.load_for_training(self.argument, options, feedback)
        except ConfigError:
            raise
        except CheckpointError as err:
            if not self.built_from_source:
                raise
            raise ConfigError(str(err)) from None
        except (ValueError, NotImplementedError) as err:
            if not self.built_from_source:
                raise
            raise ConfigError(f"init_from={self.argument!r}: {_first_line(err)}") from None

    def vocab_fix(self) -> str:
        """What to do when the model's vocabulary is smaller than its tokenizer's."""
        return self.family.source_vocab_fix if self.built_from_source else "use the checkpoint's own tokenizer"

    def _check_directory(self) -> None:
        """A directory must hold a model; one holding a transformers checkpoint is refused with the argument that
        gives it latent feedback, rather than failing on its config.json."""
        _check_model_dir(self.argument)
        source = next((f for f in FAMILIES.values() if f.source_prefix), None)
        if self.family is not DEFAULT or source is None:
            return
        try:
            saved = json.loads((Path(self.argument) / rundir.MODEL_CONFIG).read_text())
        except (OSError, ValueError):
            return  # not readable here: the family's loader gives its own message
        model_type = saved.get("model_type") if isinstance(saved, dict) else None
        if model_type and model_type not in FAMILIES:
            raise ConfigError(f"init_from={self.argument!r} is a transformers {model_type!r} model, not a fullband "
                              f"one; use init_from='{source.source_prefix}{self.argument}' to give it latent feedback")


def init_from(argument: str) -> InitFrom:
    """The start of a training run from ``argument`` (a model directory of any family, or ``PREFIX:PATH``)."""
    family = family_of_argument(argument)
    if family.builds_from(argument) and not family.source_path(argument).is_dir():
        path = family.source_path(argument)
        raise ConfigError(f"init_from={argument!r} is invalid: {str(path)!r} is not a directory; give the local "
                          "directory a transformers causal LM and its tokenizer were saved to (save_pretrained)")
    return InitFrom(argument, family)
