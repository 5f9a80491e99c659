"""Training checkpoints: written atomically, verified before loading, pruned to the last N.

The layout (directory and file names, which files a complete checkpoint has, the manifest) is
:mod:`fullband.training.checkpoint_layout`'s; this module writes and loads checkpoints in it.

Everything is written into ``checkpoints/.tmp-step-0000400``, each file and the directory fsynced, then
renamed into place, so a crash leaves either a complete checkpoint or a ``.tmp-`` directory that is never
read. A ``step-*`` directory whose manifest is missing or does not match its files (copied half-way,
truncated, edited) is skipped with a :class:`CheckpointWarning` and never loaded.

An FSDP run (:func:`save_sharded_checkpoint`, called by every process) keeps that contract: rank 0 makes the
temporary directory, every process writes its shards into it, rank 0 adds the gathered full model (so
``from_pretrained`` and ``fullband generate`` read any checkpoint alike), the rest and the manifest, which
then covers the shards too. A sharded checkpoint loads at any world size, or into one plain process.
(Only a family that says it is ``shardable`` is sharded: ``fullband train`` refuses FSDP for the others.)
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fullband import families, rundir
from fullband.files import fsync_dir, fsync_file, write_file, write_json
from fullband.model import FeedbackLM
from fullband.training.checkpoint_layout import (
    MANIFEST,
    OPTIMIZER,
    RNG,
    RUN_CONFIG,
    SET_ASIDE_SUFFIX,
    SHARDED,
    STATE,
    TMP_PREFIX,
    TRASH_PREFIX,
    TrainingState,
    checkpoint_path,
    checkpoint_root,
    is_sharded_checkpoint,
    list_checkpoints,
    load_training_state,
    manifest_of,
    tmp_path,
    trash_path,
    verify_checkpoint,
)
from fullband.training.errors import CheckpointError, CheckpointWarning, NonFiniteLossError
from fullband.training.rng_state import capture_process_rng, restore_process_rng
from fullband.training.sharded import gather_full_state_dict, is_sharded, load_sharded, unsharded

# ---------------------------------------------------------------------------------------------- saving


def save_checkpoint(
    out_dir: str | Path,
    model: FeedbackLM,  # the unwrapped model, of any family
    optimizer: torch.optim.Optimizer,
    state: TrainingState,
    **extras: Any,
) -> Path:
    """Write ``checkpoints/step-{state.step}`` atomically, then delete all but the last ``keep_last``.

    ``extras``: the fields of :class:`CheckpointExtras` (generator, process_rng, run_config, keep_last,
    write_extra).
    """
    _check_finite(state)
    tmp = _fresh_tmp_dir(out_dir, state.step)
    model.save_pretrained(tmp)
    for path in tmp.rglob("*"):  # a family's save may not fsync its files (transformers' does not)
        if path.is_file():
            fsync_file(path)
    write_file(tmp / OPTIMIZER, lambda f: torch.save(optimizer.state_dict(), f))
    return _complete(out_dir, tmp, state, CheckpointExtras(**extras))


def save_sharded_checkpoint(
    out_dir: str | Path,
    model: FeedbackLM,  # a shardable model after fully_shard
    optimizer: torch.optim.Optimizer,  # over its DTensor parameters
    state: TrainingState,
    *,
    rank: int,
    **extras: Any,
) -> Path | None:
    """:func:`save_checkpoint` for an FSDP model: collective (every process calls it); rank 0 returns the path.

    Model and optimizer state go through ``torch.distributed.checkpoint`` into ``distributed/`` (each process
    writes its own shards, nothing is gathered); the full model is gathered to rank 0's CPU once more for
    ``model.safetensors``. Needs a file system every process sees, as the DDP checkpoints do.
    """
    # torch.distributed.checkpoint is imported where used: it adds ~0.7 s to every import of the Trainer.
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _check_finite(state)  # the loss is the mean over ranks, so every process raises alike
    tmp = tmp_path(out_dir, state.step)
    if rank == 0:
        _fresh_tmp_dir(out_dir, state.step)
    dist.barrier()  # the directory exists, with nothing stale in it, before anyone writes into it
    model_state, optimizer_state = get_state_dict(model, optimizer)  # DTensor shards keyed by parameter name
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp / SHARDED)
    # dcp.save returns after rank 0 wrote the metadata, which it does once every process reported its files
    # written, so rank 0 may hash and rename them.
    full = gather_full_state_dict(model)
    if rank != 0:
        return None
    unsharded(model, full).save_pretrained(tmp)
    return _complete(out_dir, tmp, state, CheckpointExtras(**extras))


def _check_finite(state: TrainingState) -> None:
    if state.loss is not None and not math.isfinite(state.loss):
        raise NonFiniteLossError("the loss", state.loss, state.step)


def _fresh_tmp_dir(out_dir: str | Path, step: int) -> Path:
    checkpoint_root(out_dir).mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(out_dir, step)
    if tmp.exists():  # left by a crash while writing this same step
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


@dataclass
class CheckpointExtras:
    """What a checkpoint holds besides the model and the optimizer, and how many to keep."""

    generator: torch.Generator | None = None  # the prefix-length generator, shared by all processes
    process_rng: list[dict[str, Any]] | None = None  # every process's capture_process_rng (index = rank); None = ours
    run_config: dict[str, Any] | None = None
    keep_last: int = 3  # complete checkpoints kept; older ones are deleted
    write_extra: Callable[[Path], None] | None = None  # adds the caller's files (the tokenizer) before the manifest


def _complete(out_dir: str | Path, tmp: Path, state: TrainingState, extras: CheckpointExtras) -> Path:
    """Add RNG, counters, run config and extras to ``tmp``, then the manifest; rename it into place; prune."""
    root = checkpoint_root(out_dir)
    final = checkpoint_path(out_dir, state.step)
    process_rng = extras.process_rng
    rng = {"processes": process_rng if process_rng is not None else [capture_process_rng()]}
    if extras.generator is not None:
        rng["generator"] = extras.generator.get_state()
    write_file(tmp / RNG, lambda f: torch.save(rng, f))
    write_json(tmp / STATE, rundir.stamped(asdict(state)))
    write_json(tmp / RUN_CONFIG, extras.run_config or {})
    if extras.write_extra is not None:
        extras.write_extra(tmp)
    write_json(tmp / MANIFEST, manifest_of(tmp, state.step))
    for directory in [*(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
        fsync_dir(directory)

    if final.exists():  # re-reaching a step after resuming from an older checkpoint: replace it
        trash = trash_path(final)
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
    os.rename(tmp, final)
    fsync_dir(root)
    prune_checkpoints(out_dir, extras.keep_last)
    return final


def prune_checkpoints(out_dir: str | Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; delete older ones and leftover temp dirs."""
    root = checkpoint_root(out_dir)
    for leftover in root.iterdir():  # .tmp-* from a crash, .trash-* from a replacement
        if leftover.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            shutil.rmtree(leftover, ignore_errors=True)
    checkpoints = list_checkpoints(out_dir)
    complete = [(step, path) for step, path in checkpoints if verify_checkpoint(path, hashes=False) is None]
    if len(complete) <= keep_last:
        return
    oldest_kept = complete[-keep_last][0]
    for step, path in checkpoints:
        if step < oldest_kept:  # incomplete ones older than what we keep are of no use either
            shutil.rmtree(path, ignore_errors=True)


def set_aside(path: Path) -> Path:
    """Rename the incomplete checkpoint ``path`` to ``step-N.corrupt`` (``.corrupt-2``, ... when taken), a name that
    is never read or pruned, so a run can start again in its directory without deleting anything; returns it."""
    target = path.with_name(path.name + SET_ASIDE_SUFFIX)
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}{SET_ASIDE_SUFFIX}-{number}")
    os.rename(path, target)
    fsync_dir(path.parent)
    return target


# ---------------------------------------------------------------------------------------------- loading


def _differences(saved: Any, built: Any, most: int = 3) -> str:
    """``field=saved there, built here`` for the first fields two model configs differ in."""
    if not (dataclasses.is_dataclass(saved) and dataclasses.is_dataclass(built)):
        return f"{saved} there, {built} here"
    names = [f.name for f in dataclasses.fields(saved)]
    differ = [n for n in names if getattr(saved, n, None) != getattr(built, n, None)]
    return "; ".join(f"{n}={getattr(saved, n, None)} there, {getattr(built, n, None)} here" for n in differ[:most])


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    generator: torch.Generator | None = None,
    restore_rng: bool = True,
    rank: int = 0,
) -> TrainingState:
    """Restore model weights, optimizer state and RNG states (this ``rank``'s) from a verified checkpoint.

    A checkpoint of an FSDP run (``distributed/``) loads into the sharded model at any world size, or into a
    plain model; under FSDP this is collective (every process calls it with the same ``path``). ``optimizer``
    must be freshly built: its state is replaced by the checkpoint's.

    Returns the run's counters. A rank the checkpoint has no RNG state for (more processes than when it was
    saved) keeps its current RNG, with a warning: the run goes on, but not bit for bit as before.
    """
    path = Path(path)
    problem = verify_checkpoint(path)
    if problem is not None:
        raise CheckpointError(f"refusing to load {path}: {problem}")
    family = families.family_of(path)
    if family.name != model.family:
        raise CheckpointError(f"{path} holds {family.description}; it cannot be loaded into a {type(model).__name__}")
    if (saved_config := family.model_class().saved_config(path)) != model.config:
        differences = _differences(saved_config, model.config)
        raise CheckpointError(f"{path} holds another model than this run builds ({differences}): resume with the "
                              "run's own settings (fullband train --out_dir DIR --resume true)")
    if is_sharded_checkpoint(path):
        load_sharded(path / SHARDED, model, optimizer)
    elif is_sharded(model):
        raise CheckpointError(f"{path} was written by a run without FSDP ({OPTIMIZER}); FSDP cannot load it: "
                              "resume with train.parallel='ddp' or with one process")
    else:
        model.load_weights(path)  # in place: the optimizer holds these tensors
        if optimizer is not None:
            optimizer.load_state_dict(torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True))
    if restore_rng:
        rng = torch.load(path / RNG, weights_only=True)
        if rank < len(rng["processes"]):
            restore_process_rng(rng["processes"][rank])
        else:
            warnings.warn(f"{path} was saved by {len(rng['processes'])} process(es); rank {rank} keeps its own RNG "
                          "state, so this resumed run will not repeat the original bit for bit", CheckpointWarning,
                          stacklevel=2)
        if generator is not None:
            if "generator" not in rng:
                raise CheckpointError(f"{path} has no prefix-generator state to restore")
            generator.set_state(rng["generator"])
    return load_training_state(path)
