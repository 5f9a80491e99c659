"""Where the data layer caches things (its files are written atomically by :mod:`fullband.files`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

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
