"""FSDP (``fully_shard``) state for checkpoints: whether a model is sharded, gathering it, loading shards."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from fullband import families
from fullband.model import FeedbackLM
from fullband.training.errors import CheckpointError


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` (FSDP2) was applied to ``model``, so its parameters are DTensor shards."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gather_full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded CPU state dict of an FSDP model on rank 0 (an empty dict elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload gathers one tensor at a time to rank 0's CPU, so no device ever holds the whole model.
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def unsharded(model: FeedbackLM, state: dict[str, torch.Tensor]) -> FeedbackLM:
    """A plain model of ``model``'s family around gathered tensors, so its own save_pretrained writes the files.

    Built from its config on the meta device (no memory, no init) and given the tensors themselves (assign=True);
    a strict load, so a missing or extra tensor fails here rather than in a later from_pretrained.
    """
    with torch.device("meta"):
        plain = families.family_named(model.family).build(model.config)
    plain.load_state_dict(state, assign=True)
    return plain


def save_model(model: torch.nn.Module, directory: str | Path, rank: int = 0) -> None:
    """``model.save_pretrained(directory)`` on rank 0, gathering the weights first when ``model`` is sharded
    (collective then: every process calls it)."""
    if is_sharded(model):
        full = gather_full_state_dict(model)
        if rank == 0:
            unsharded(model, full).save_pretrained(directory)
    elif rank == 0:
        model.save_pretrained(directory)


def load_sharded(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Fill ``model`` (sharded or plain) and ``optimizer`` from the ``torch.distributed.checkpoint`` shards."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    saved = set(dcp.FileSystemReader(directory).read_metadata().state_dict_metadata)
    # dcp.load fills a template of the right shapes and shardings, which the get_* functions make.
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        optimizer.state.clear()  # so the template below has state for every parameter
        template = get_optimizer_state_dict(model, optimizer)  # (an AdamW step at lr 0 creates that state)
        # AdamW keeps no state for a parameter that never had a gradient (the fusion before feedback starts);
        # such parameters must stay without state, as in the run that saved, for the resume to repeat it.
        with_state = {key.removeprefix("optimizer.state.").rsplit(".", 1)[0]
                      for key in saved if key.startswith("optimizer.state.")}
        template["state"] = {name: s for name, s in template["state"].items() if name in with_state}
        state["optimizer"] = template
    no_dist = not (dist.is_available() and dist.is_initialized())  # one plain process reads every shard
    try:
        with warnings.catch_warnings():  # dcp warns that it assumes one process even when told so
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, checkpoint_id=directory, no_dist=no_dist)
    except (dcp.CheckpointException, RuntimeError) as err:  # names the missing or misshapen tensors
        raise CheckpointError(f"cannot load {directory}: {err}") from None
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        # strict=False: parameters left without state above are not an error.
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(strict=False))
