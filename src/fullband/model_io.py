"""Load any model fullband can run: every command and study loads through :func:`load_any`.

The model families (``fullband.integrations.families``) decide what a model argument holds:

    a directory    the family whose marker file it holds (a native ``model.safetensors`` + ``config.json``
                   otherwise), loaded by that family's ``load``
    PREFIX:PATH    a family built from a source (``hf:PATH``: a transformers causal LM saved in PATH, given latent
                   feedback with fusion weights initialised with seed 0, so standard mode = the pretrained model)

Anything else (a missing path, a file, a directory with no model, a transformers model without ``hf:``) raises a
:class:`CheckpointError` whose one-line message says what to give instead.

Every family is a FeedbackLM (one multi-pass forward, forward_exact, generate/stream in every mode,
save_pretrained), so commands that only decode or score load any of them here. A family's optional dependency
(transformers, the ``hf`` extra) is imported only when one of its models is seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fullband.integrations import families
from fullband.integrations.families import Family
from fullband.model import FeedbackLM
from fullband.model.serialization import CheckpointError

AnyLM = FeedbackLM  # a model of any family


def checkpoint_dir(spec: str | Path) -> Path:
    """The directory a model argument names: ``PREFIX:PATH`` -> PATH, anything else itself (for its tokenizer)."""
    text = str(spec)
    family = families.source_family(text)
    return Path(text[len(family.source_prefix):] if family else text).expanduser()


def model_class(family: Family, what: str) -> type[FeedbackLM]:
    """``family``'s FeedbackLM subclass; a missing optional dependency raises CheckpointError naming ``what``."""
    try:
        return family.model_class()
    except ImportError as err:
        extra = f" (pip install 'fullband[{family.extra}]')" if family.extra else ""
        raise CheckpointError(f"{what} holds {family.description}; loading it needs more packages{extra}: "
                              f"{err}") from None


def load_any(
    directory: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
    feedback: bool | None = None,
) -> AnyLM:
    """The model ``directory`` names (a model directory of any family, or ``PREFIX:PATH``), in eval mode on
    ``device``.

    ``dtype=None`` keeps the saved dtype. ``feedback`` adds or drops the fusion weights where the family can (a
    native model, as :meth:`FullBandwidthLM.from_pretrained`). Problems (missing or corrupt files, an optional
    dependency not installed) raise :class:`CheckpointError`.
    """
    if (family := families.source_family(directory)) is not None:
        return _from_source(family, str(directory), device, dtype)
    path = Path(directory).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(directory)!r} does not exist: give a model directory (fullband "
                              "train's out_dir/model, a save_pretrained directory) or hf:PATH")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(directory)!r} is a file: give the directory that holds the model's "
                              "config.json and weights")
    cls = model_class(families.family_of(path), str(directory))
    return cls.load(directory, device=device, dtype=dtype, feedback=feedback)


def build_from_source(spec: str, options: Any = None, dtype: torch.dtype | None = None, name: str = "") -> AnyLM:
    """A new model of the family whose prefix ``spec`` starts with, built from its path with the family's
    ``options`` (fusion weights from torch's global RNG); see the family's ``from_source`` for what it raises."""
    family = families.source_family(spec)
    if family is None:
        raise CheckpointError(f"{spec!r} names no source a model family builds from")
    path = checkpoint_dir(spec)
    if not path.is_dir():
        raise CheckpointError(f"{spec!r}: {str(path)!r} is not a directory; {family.source_prefix}PATH names the "
                              "local directory a transformers causal LM was saved to (save_pretrained)")
    return model_class(family, repr(spec)).from_source(path, options, dtype, name or repr(spec))


def _from_source(family: Family, spec: str, device: torch.device | str | None, dtype: torch.dtype | None) -> AnyLM:
    with torch.random.fork_rng(devices=[]):  # the same fusion weights every time, the caller's RNG untouched
        torch.manual_seed(0)
        try:
            model = build_from_source(spec, dtype=dtype)
        except (ValueError, NotImplementedError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{spec!r} cannot be loaded as {family.description}: {_first_line(err)}") from None
    return model.to(device=device).eval()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
