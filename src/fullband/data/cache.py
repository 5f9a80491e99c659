"""Where the data layer caches things, and how it writes them so a crash never leaves half a file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

CACHE_ENV = "FULLBAND_CACHE_DIR"
OFFLINE_ENV = "FULLBAND_OFFLINE"


def cache_dir() -> Path:
    """The cache root: ``$FULLBAND_CACHE_DIR`` if set, else the platform's user cache dir for fullband."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    try:
        from platformdirs import user_cache_dir
    except ImportError:  # platformdirs is an optional extra; fall back to the XDG default
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fullband"
    return Path(user_cache_dir("fullband"))


def offline() -> bool:
    """True when ``FULLBAND_OFFLINE`` asks the data layer never to touch the network."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(f)`` on a temp file next to ``path``, then rename it into place.

    Readers therefore see either the old file, nothing, or the complete new file; rename within one
    directory is atomic on POSIX and Windows.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; cache files are ordinary readable files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))
