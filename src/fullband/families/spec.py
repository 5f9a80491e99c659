"""What a model family is: a :class:`FamilySpec` names its FeedbackLM subclass and knows how to build one, load one
(to decode, to serve, to train on), load its tokenizer and save it; commands ask the spec and never name a family.

As torchtitan's ``TrainSpec`` names a model's class, its tokenizer and its parallelisation, a spec here names the
class by ``"module:Class"`` (imported on first use, so this module needs neither torch nor transformers and the
command line checks its options before importing either) and the few facts that tell its models apart: a marker
file only its checkpoints hold, a source prefix it builds from (``hf:PATH``), its options section, its pip extra and
the module that registers its transformers Auto classes. The network side of a family (its files, cache type,
parameter roles) is :mod:`fullband.model.family`'s interface on the class itself.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullband import rundir
from fullband.config import install_hint

if TYPE_CHECKING:
    import torch

    from fullband.data import Tokenizer
    from fullband.model import FeedbackLM


@dataclass(frozen=True)
class FamilySpec:
    name: str  # the model_type its checkpoints' config.json records (the class's ``family``)
    model: str  # "module:Class" of its FeedbackLM subclass, imported on first use
    description: str  # how messages name it
    marker: str | None = None  # a file only its checkpoints hold; None = the default family (any other directory)
    source_prefix: str | None = None  # a model argument it builds from ("hf:PATH"), with its options section
    options: str | None = None  # the name of that section in FamilyOptions
    source_help: str = ""  # what ``init_from=<source_prefix>...`` means (fullband train --help)
    extra: str | None = None  # the pip extra its module needs
    auto_classes: str | None = None  # module that registers its transformers Auto classes when imported
    source_vocab_fix: str = ""  # what to do when a source's vocabulary is smaller than its own tokenizer's

    # ------------------------------------------------------------------ which arguments are its

    def builds_from(self, argument: str | Path | None) -> bool:
        """Whether ``argument`` names a source this family builds from (``PREFIX:PATH``)."""
        return bool(self.source_prefix) and str(argument or "").startswith(self.source_prefix or "")

    def source_path(self, argument: str | Path) -> Path:
        """PATH of ``PREFIX:PATH`` (``argument`` itself when it is not one of this family's sources)."""
        text = str(argument)
        return Path(text[len(self.source_prefix or ""):] if self.builds_from(text) else text).expanduser()

    # ------------------------------------------------------------------ the class

    def model_class(self, what: str = "") -> type[FeedbackLM]:
        """Its FeedbackLM subclass; a missing optional dependency raises CheckpointError naming ``what``."""
        from fullband.model.serialization import CheckpointError

        module, _, name = self.model.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError as err:
            extra = f" ({install_hint(self.extra)})" if self.extra else ""
            raise CheckpointError(f"{what or 'the model'} holds {self.description}; loading it needs more "
                                  f"packages{extra}: {err}") from None

    def register_auto_classes(self) -> None:
        """Register its transformers Auto classes (AutoConfig / AutoModelForCausalLM), so transformers reads its
        checkpoints locally; needs transformers."""
        if self.auto_classes:
            importlib.import_module(self.auto_classes)

    # ------------------------------------------------------------------ build, load, save

    def build(self, config: Any) -> FeedbackLM:
        """A new model with fresh weights from the family's config (``fullband train``'s [model], resolved)."""
        return self.model_class().from_config(config)

    def load(self, directory: str | Path, device: torch.device | str | None = None,
             dtype: torch.dtype | None = None, *, feedback: bool | None = None) -> FeedbackLM:
        """The model saved in ``directory``, in eval mode (problems: CheckpointError)."""
        return self.model_class(repr(str(directory))).load(directory, device=device, dtype=dtype, feedback=feedback)

    def from_source(self, argument: str, options: Any = None, dtype: torch.dtype | None = None,
                    name: str = "") -> FeedbackLM:
        """A new model built from ``PREFIX:PATH`` with the family's ``options`` (fusion weights from torch's global
        RNG); see the class's ``from_source`` for what it raises."""
        from fullband.model.serialization import CheckpointError

        path = self.source_path(argument)
        if not path.is_dir():
            raise CheckpointError(f"{argument!r}: {str(path)!r} is not a directory; {self.source_prefix}PATH names "
                                  "the local directory a transformers causal LM was saved to (save_pretrained)")
        return self.model_class(repr(argument)).from_source(path, options, dtype, name or repr(argument))

    def load_for_training(self, argument: str, options: Any, feedback: bool | None) -> FeedbackLM:
        """The model a training run starts from (``init_from``), in training mode: built from a source in float32
        with the family's ``options``, or a saved model in the dtype the family trains in (``feedback`` adds or
        drops the fusion where the family can)."""
        import torch

        if self.builds_from(argument):
            return self.from_source(argument, options, torch.float32, f"init_from={argument!r}").train()
        dtype = self.model_class(repr(argument)).train_dtype
        return self.load(argument, dtype=dtype, feedback=feedback).train()

    def save(self, model: FeedbackLM, directory: str | Path, **decoding: Any) -> None:
        """Write ``model`` to ``directory`` in this family's files (``decoding`` overrides its decoding defaults)."""
        model.save_pretrained(directory, **decoding)

    # ------------------------------------------------------------------ its tokenizer

    def load_tokenizer(self, argument: str | Path, *, required: bool = False) -> Tokenizer | None:
        """The tokenizer saved with a model argument's model (None without one): in its directory, or for a source
        ``PREFIX:PATH`` in PATH. ``required``: a source's own transformers tokenizer, DataError when PATH has none
        (a model built from a source trains with its own tokenizer)."""
        from fullband.data import TransformersTokenizer, load_tokenizer

        if self.builds_from(argument):
            path = self.source_path(argument)
            return TransformersTokenizer.from_pretrained(path) if required else load_tokenizer(path)
        directory = Path(argument).expanduser()
        if _transformers_tokenizer_beside_remote_code(directory):
            # A fullband checkpoint's config.json names remote code (auto_map): with this family's model type
            # registered, AutoTokenizer reads that config locally and never asks whether to run remote code.
            with contextlib.suppress(ImportError):  # no transformers: loading the tokenizer says what to install
                self.register_auto_classes()
        return load_tokenizer(directory)


def _transformers_tokenizer_beside_remote_code(directory: Path) -> bool:
    """Whether ``directory`` holds a transformers tokenizer (saved there by ``save_pretrained``, not fullband's own
    byte or BPE files) beside a config.json that names remote code. fullband marks a transformers tokenizer it saves
    ``"type": "hf"`` in tokenizer_config.json; one saved by transformers alone has no ``type``."""
    try:
        config = json.loads((directory / rundir.MODEL_CONFIG).read_text())
        tokenizer = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and "auto_map" in config and isinstance(tokenizer, dict)
            and tokenizer.get("type", "hf") == "hf")
