"""The model-family interface of :class:`~fullband.model.feedback.FeedbackLM`: what training, checkpointing,
loading and serving ask of a network without naming its family.

A family (the native :class:`~fullband.model.lm.FullBandwidthLM`, a retrofitted transformers network in
``fullband.integrations``) is a FeedbackLM subclass that answers:

- ``family`` (the ``model_type`` its checkpoints record), ``cache_type`` (its decoding cache), ``shardable``
  (whether FSDP2 may shard it) and ``train_dtype`` (the dtype a training run loads it in);
- ``from_config`` (fresh weights) and its files: ``save_pretrained`` / ``load``, ``saved_config`` and
  ``load_weights`` (a training checkpoint's weights, in place) and ``checkpoint_problem`` (which of its files a
  complete checkpoint lists);
- ``from_source`` for a family built from something outside fullband (``hf:PATH``), with its own options;
- ``parameter_roles``: which parameters the optimiser treats as hidden matrices (Muon / NorMuon) and which
  belong to the fusion (its learning-rate multiplier).

Which family a directory or a source holds is decided by ``fullband.families``, the one table of
families; nothing below it names one.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fullband.model.kv_cache import CacheSlots


class ParamRole:
    """A parameter's role for the optimiser (:meth:`FamilyInterface.parameter_roles`)."""

    BLOCK_MATRIX = "block_matrix"  # a 2-D hidden matrix of a block: (Nor)Muon under optim.muon_params' "blocks"
    FUSION_MATRIX = "fusion_matrix"  # a 2-D matrix of the fusion (W_U, W_G): (Nor)Muon under "fusion"
    FUSION = "fusion"  # the fusion's other parameters (its norm gains): AdamW
    OTHER = "other"  # embedding, head, norm gains, biases: AdamW


class FamilyInterface:
    """Mixed into FeedbackLM; a family overrides what it needs (the defaults that raise say what is missing)."""

    family: ClassVar[str] = ""  # the model_type of its checkpoints' config.json; its key among the families
    cache_type: ClassVar[type[CacheSlots]] = CacheSlots  # what new_cache returns
    shardable: ClassVar[bool] = False  # FSDP2 (train.parallel='fsdp') may shard it
    train_dtype: ClassVar[torch.dtype | None] = None  # what init_from loads it in for training (None: as saved)

    # ------------------------------------------------------------------ construction and its files

    @classmethod
    def from_config(cls, config: Any) -> Any:
        """A new model with fresh weights from the family's config (a shardable family must have it: FSDP gathers
        the shards into one built here)."""
        return cls(config)  # type: ignore[call-arg]

    def save_pretrained(self, directory: str | Path, **decoding: Any) -> None:
        """Write the model to ``directory``; ``decoding`` overrides the decoding defaults in its config.json."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to save itself")

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
             *, feedback: bool | None = None) -> Any:
        """The model saved in ``directory``, in eval mode; problems raise ``CheckpointError``. ``feedback``
        (True/False) asks to add or drop the fusion, for families that can."""
        raise NotImplementedError(f"{cls.__name__} does not say how to load itself")

    @classmethod
    def saved_config(cls, directory: str | Path) -> Any:
        """The config the model in ``directory`` was built with (a resumed run compares it with its own)."""
        raise NotImplementedError(f"{cls.__name__} does not say how to read its config")

    def load_weights(self, directory: str | Path) -> None:
        """Load the weights saved in ``directory`` into this model in place (an optimiser holds these tensors)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to load its weights")

    @classmethod
    def checkpoint_problem(cls, files: Collection[str]) -> str | None:
        """What is missing among ``files`` (the paths a checkpoint's manifest lists) for its model files, said of
        the manifest ("does not list config.json"), or None."""
        raise NotImplementedError(f"{cls.__name__} does not list its checkpoint files")

    @classmethod
    def from_source(cls, path: Path, options: Any, dtype: torch.dtype | None = None, name: str = "") -> Any:
        """A new model built from ``path`` outside fullband (``hf:PATH``) with the family's ``options``."""
        raise NotImplementedError(f"{cls.__name__} is not built from a source")

    # ------------------------------------------------------------------ the optimiser

    def parameter_roles(self) -> dict[str, str]:
        """Each trainable parameter's :class:`ParamRole`, by name, in ``named_parameters()`` order (a tied tensor
        once): the 2-D matrices of ``self.blocks`` and of ``self.fusion`` are hidden matrices, the fusion's other
        parameters are the fusion's, everything else (embedding, head, gains, biases) is OTHER."""
        assert isinstance(self, nn.Module)
        in_blocks = {id(p) for p in self.blocks.parameters()}  # type: ignore[attr-defined]
        fusion = getattr(self, "fusion", None)
        in_fusion = {id(p) for p in fusion.parameters()} if fusion is not None else set()
        roles = {}
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            matrix = param.dim() == 2
            if id(param) in in_fusion:
                roles[name] = ParamRole.FUSION_MATRIX if matrix else ParamRole.FUSION
            elif id(param) in in_blocks and matrix:
                roles[name] = ParamRole.BLOCK_MATRIX
            else:
                roles[name] = ParamRole.OTHER
        return roles
