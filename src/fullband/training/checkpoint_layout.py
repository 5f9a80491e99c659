"""The layout of a training checkpoint: its directory and file names, which files a complete one has, its manifest.

Layout of ``<out_dir>/checkpoints/step-0000400/`` (the state after 400 optimizer steps):

    model.safetensors, config.json   the model: its family's own ``save_pretrained`` files (a native model's
                                     here; ``fullband.families.load_any`` loads any family's)
    optimizer.pt                     AdamW state_dict
    distributed/                     instead of optimizer.pt in an FSDP run: model and AdamW state as
                                     ``torch.distributed.checkpoint`` shards (each process writes its own)
    rng.pt                           each process's Python/NumPy/torch/CUDA RNG states; the prefix generator
    trainer_state.json               step, lr, loss, tokens, token-equivalent compute, schedule, metrics offset
    run_config.json                  the resolved configs of the run
    manifest.json                    written last: size and sha256 of every other file (the completion marker)

A ``step-*`` directory whose manifest is missing or does not match its files (copied half-way, truncated,
edited) is incomplete: :func:`verify_checkpoint` says why, and it is never loaded. Which family a checkpoint
holds, and which files its model needs, the family says (``fullband.families``, the model-family
interface); this module owns the rest of the layout, and the writing (``checkpoint.py``) and reading code call it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fullband import families, rundir
from fullband.training.errors import CheckpointWarning

MANIFEST = "manifest.json"
OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
STATE = "trainer_state.json"
RUN_CONFIG = "run_config.json"
SHARDED = "distributed"  # the torch.distributed.checkpoint directory of an FSDP run
SHARDED_METADATA = f"{SHARDED}/.metadata"  # written last by torch.distributed.checkpoint's FileSystemWriter
_PREFIX = "step-"
TMP_PREFIX = ".tmp-"  # a checkpoint being written; never read
TRASH_PREFIX = ".trash-"  # a checkpoint being replaced; never read
SET_ASIDE_SUFFIX = ".corrupt"  # an incomplete checkpoint moved aside by a resume that starts again; never read


@dataclass
class TrainingState:
    """Counters of a run; ``step`` = optimizer steps completed = the 0-based index of the next step."""

    step: int = 0
    tokens: int = 0  # input tokens consumed (all processes)
    token_equiv_compute: int = 0  # sum over steps of tokens x passes
    loss: float | None = None  # loss of the last step
    lr: float = 0.0  # learning rate of the last step
    metrics_bytes: int = 0  # size of metrics.jsonl when saved: a resumed run truncates it back to this
    train_seconds: float = 0.0  # time in training steps and validation, summed over every invocation so far
    schedule: dict[str, Any] = field(default_factory=dict)


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / rundir.CHECKPOINTS_DIR


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoint_root(out_dir) / f"{_PREFIX}{step:07d}"


def tmp_path(out_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is renamed to :func:`checkpoint_path`."""
    return checkpoint_root(out_dir) / f"{TMP_PREFIX}{checkpoint_path(out_dir, step).name}"


def trash_path(final: Path) -> Path:
    """Where a complete checkpoint goes while a new one of the same step replaces it."""
    return final.parent / f"{TRASH_PREFIX}{final.name}"


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


def manifest_of(directory: Path, step: int) -> dict[str, Any]:
    """The manifest of the files now in ``directory``: the size and sha256 of each."""
    # Relative paths, so the shards under distributed/ are covered too (a flat checkpoint lists plain names).
    files = {p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
             for p in sorted(directory.rglob("*")) if p.is_file()}
    return rundir.stamped({"step": step, "files": files})


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checkpoint(path: str | Path, hashes: bool = True) -> str | None:
    """None if ``path`` is a complete checkpoint, else what is wrong with it.

    ``hashes=False`` checks only the manifest and the file sizes (cheap, used when pruning).
    """
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        rundir.check_format(manifest, path / MANIFEST, legacy_key="format")  # a newer fullband's: say so, not "corrupt"
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
        if hashes and sha256_of(file) != sha256:
            return f"{name} does not match its sha256 in {MANIFEST}"
    return None


def newest_complete_checkpoint(out_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint under ``out_dir`` (None when there is none) and the newer incomplete ones it
    skipped, each with what is wrong with it (newest first)."""
    skipped = []
    for _, path in reversed(list_checkpoints(out_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def warn_skipped(skipped: list[tuple[Path, str]], stacklevel: int = 3) -> None:
    """One CheckpointWarning per incomplete checkpoint passed over for an older complete one."""
    for path, problem in skipped:
        warnings.warn(f"skipping partial or corrupt checkpoint {path}: {problem}; it will not be loaded, trying an "
                      "older one", CheckpointWarning, stacklevel=stacklevel)


def latest_good_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir``; partial/corrupt ones are skipped with a warning."""
    path, skipped = newest_complete_checkpoint(out_dir)
    warn_skipped(skipped)
    return path


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether the checkpoint at ``path`` was written by an FSDP run (``distributed/`` instead of optimizer.pt)."""
    return (path / SHARDED_METADATA).is_file()


def load_training_state(path: str | Path) -> TrainingState:
    """The counters stored with a checkpoint."""
    data = json.loads((Path(path) / STATE).read_text())
    rundir.check_format(data, Path(path) / STATE, legacy_key="format")
    for key in ("format", rundir.FORMAT_KEY):  # the version, not a counter
        data.pop(key, None)
    return TrainingState(**data)


def load_run_config(path: str | Path) -> dict[str, Any]:
    """The resolved configs stored with a checkpoint."""
    return json.loads((Path(path) / RUN_CONFIG).read_text())
