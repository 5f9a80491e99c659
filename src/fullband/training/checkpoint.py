"""Training checkpoints: written atomically, verified before loading, pruned to the last N.

Layout of ``<out_dir>/checkpoints/step-0000400/`` (the state after 400 optimizer steps):

    model.safetensors, config.json   the model: its family's own ``save_pretrained`` files (a native model's
                                     here; ``fullband.model_io.load_any`` loads any family's)
    optimizer.pt                     AdamW state_dict
    distributed/                     instead of optimizer.pt in an FSDP run: model and AdamW state as
                                     ``torch.distributed.checkpoint`` shards (each process writes its own)
    rng.pt                           each process's Python/NumPy/torch/CUDA RNG states; the prefix generator
    trainer_state.json               step, lr, loss, tokens, token-equivalent compute, schedule, metrics offset
    run_config.json                  the resolved configs of the run
    manifest.json                    written last: size and sha256 of every other file (the completion marker)

Everything is written into ``checkpoints/.tmp-step-0000400``, each file and the directory fsynced, then
renamed into place, so a crash leaves either a complete checkpoint or a ``.tmp-`` directory that is never
read. A ``step-*`` directory whose manifest is missing or does not match its files (copied half-way,
truncated, edited) is skipped with a :class:`CheckpointWarning` and never loaded.

An FSDP run (:func:`save_sharded_checkpoint`, called by every process) keeps that contract: rank 0 makes the
temporary directory, every process writes its shards into it, rank 0 adds the gathered full model (so
``from_pretrained`` and ``fullband generate`` read any checkpoint alike), the rest and the manifest, which
then covers the shards too. A sharded checkpoint loads at any world size, or into one plain process.
(Only a family that says it is ``shardable`` is sharded: ``fullband train`` refuses FSDP for the others.)

Which family a checkpoint holds, and which files its model needs, the family says
(``fullband.integrations.families``, the model-family interface); this module owns the rest of the layout.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fullband.integrations import families
from fullband.model import FeedbackLM
from fullband.training.errors import CheckpointError, CheckpointWarning, NonFiniteLossError

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
STATE = "trainer_state.json"
RUN_CONFIG = "run_config.json"
SHARDED = "distributed"  # the torch.distributed.checkpoint directory of an FSDP run
SHARDED_METADATA = f"{SHARDED}/.metadata"  # written last by torch.distributed.checkpoint's FileSystemWriter
FORMAT_VERSION = 1
_PREFIX = "step-"


@dataclass
class TrainingState:
    """Counters of a run; ``step`` = optimizer steps completed = the 0-based index of the next step."""

    step: int = 0
    tokens: int = 0  # input tokens consumed (all processes)
    token_equiv_compute: int = 0  # sum over steps of tokens x passes
    loss: float | None = None  # loss of the last step
    lr: float = 0.0  # learning rate of the last step
    metrics_bytes: int = 0  # size of metrics.jsonl when saved: a resumed run truncates it back to this
    schedule: dict[str, Any] = field(default_factory=dict)


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoint_root(out_dir) / f"{_PREFIX}{step:07d}"


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``step-*`` directory, complete or not, oldest first."""
    root = checkpoint_root(out_dir)
    found = []
    if root.is_dir():
        for path in root.iterdir():
            suffix = path.name[len(_PREFIX):]
            if path.is_dir() and path.name.startswith(_PREFIX) and suffix.isdigit():
                found.append((int(suffix), path))
    return sorted(found)


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
            _fsync_file(path)
    _write(tmp / OPTIMIZER, lambda f: torch.save(optimizer.state_dict(), f))
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
    tmp = _tmp_dir(out_dir, state.step)
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
    _unsharded(model, full).save_pretrained(tmp)
    return _complete(out_dir, tmp, state, CheckpointExtras(**extras))


def save_model(model: torch.nn.Module, directory: str | Path, rank: int = 0) -> None:
    """``model.save_pretrained(directory)`` on rank 0, gathering the weights first when ``model`` is sharded
    (collective then: every process calls it)."""
    if is_sharded(model):
        full = gather_full_state_dict(model)
        if rank == 0:
            _unsharded(model, full).save_pretrained(directory)
    elif rank == 0:
        model.save_pretrained(directory)


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


def _unsharded(model: FeedbackLM, state: dict[str, torch.Tensor]) -> FeedbackLM:
    """A plain model of ``model``'s family around gathered tensors, so its own save_pretrained writes the files.

    Built from its config on the meta device (no memory, no init) and given the tensors themselves (assign=True);
    a strict load, so a missing or extra tensor fails here rather than in a later from_pretrained.
    """
    with torch.device("meta"):
        plain = families.family_named(model.family).model_class().from_config(model.config)
    plain.load_state_dict(state, assign=True)
    return plain


def _check_finite(state: TrainingState) -> None:
    if state.loss is not None and not math.isfinite(state.loss):
        raise NonFiniteLossError("the loss", state.loss, state.step)


def _tmp_dir(out_dir: str | Path, step: int) -> Path:
    return checkpoint_root(out_dir) / f".tmp-{checkpoint_path(out_dir, step).name}"


def _fresh_tmp_dir(out_dir: str | Path, step: int) -> Path:
    checkpoint_root(out_dir).mkdir(parents=True, exist_ok=True)
    tmp = _tmp_dir(out_dir, step)
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
    _write(tmp / RNG, lambda f: torch.save(rng, f))
    _write_json(tmp / STATE, {"format": FORMAT_VERSION, **asdict(state)})
    _write_json(tmp / RUN_CONFIG, extras.run_config or {})
    if extras.write_extra is not None:
        extras.write_extra(tmp)
    # Relative paths, so the shards under distributed/ are covered too (a flat checkpoint lists plain names).
    files = {p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    _write_json(tmp / MANIFEST, {"format": FORMAT_VERSION, "step": state.step, "files": files})
    for directory in [*(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
        _fsync_dir(directory)

    if final.exists():  # re-reaching a step after resuming from an older checkpoint: replace it
        trash = root / f".trash-{final.name}"
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
    os.rename(tmp, final)
    _fsync_dir(root)
    prune_checkpoints(out_dir, extras.keep_last)
    return final


def prune_checkpoints(out_dir: str | Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; delete older ones and leftover temp dirs."""
    root = checkpoint_root(out_dir)
    for leftover in root.iterdir():  # .tmp-* from a crash, .trash-* from a replacement
        if leftover.name.startswith((".tmp-", ".trash-")):
            shutil.rmtree(leftover, ignore_errors=True)
    checkpoints = list_checkpoints(out_dir)
    complete = [(step, path) for step, path in checkpoints if verify_checkpoint(path, hashes=False) is None]
    if len(complete) <= keep_last:
        return
    oldest_kept = complete[-keep_last][0]
    for step, path in checkpoints:
        if step < oldest_kept:  # incomplete ones older than what we keep are of no use either
            shutil.rmtree(path, ignore_errors=True)


def _write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, data: Any) -> None:
    _write(path, lambda f: f.write((json.dumps(data, indent=2, allow_nan=False) + "\n").encode()))


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes the directory entries (new files, a rename) durable; not possible on every platform.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------- checking


def verify_checkpoint(path: str | Path, hashes: bool = True) -> str | None:
    """None if ``path`` is a complete checkpoint, else what is wrong with it.

    ``hashes=False`` checks only the manifest and the file sizes (cheap, used when pruning).
    """
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in manifest["files"].items()}
    except FileNotFoundError:
        return f"no {MANIFEST} (the write did not finish)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"unreadable {MANIFEST}: {type(err).__name__}: {err}"
    if (problem := families.family_of_files(files).model_class().checkpoint_problem(files)) is not None:
        return f"{MANIFEST} {problem}"
    for required in (RNG, STATE):
        if required not in files:
            return f"{MANIFEST} does not list {required}"
    if OPTIMIZER not in files and SHARDED_METADATA not in files:
        return f"{MANIFEST} lists neither {OPTIMIZER} nor {SHARDED_METADATA}"
    for name, (size, sha256) in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {size}"
        if hashes and _sha256(file) != sha256:
            return f"{name} does not match its sha256 in {MANIFEST}"
    return None


def _model_class(path: Path) -> type[FeedbackLM]:
    """The class of the family whose model the checkpoint at ``path`` holds."""
    return families.family_of(path).model_class()


def latest_good_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir``; partial/corrupt ones are skipped with a warning."""
    for _, path in reversed(list_checkpoints(out_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        warnings.warn(
            f"skipping partial or corrupt checkpoint {path}: {problem}; it will not be loaded, trying an older one",
            CheckpointWarning,
            stacklevel=2,
        )
    return None


# ---------------------------------------------------------------------------------------------- loading


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
    if (saved_config := _model_class(path).saved_config(path)) != model.config:
        raise CheckpointError(f"{path} holds a model with config {saved_config}, not {model.config}")
    if (path / SHARDED_METADATA).is_file():
        _load_sharded(path / SHARDED, model, optimizer)
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
    data = json.loads((path / STATE).read_text())
    data.pop("format", None)
    return TrainingState(**data)


def _load_sharded(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
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


def load_run_config(path: str | Path) -> dict[str, Any]:
    """The resolved configs stored with a checkpoint."""
    return json.loads((Path(path) / RUN_CONFIG).read_text())


def capture_process_rng() -> dict[str, Any]:
    """This process's global RNG states, in a form ``torch.load(weights_only=True)`` accepts."""
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def restore_process_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np_state = states["numpy"]
    np.random.set_state((np_state["name"], np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
