"""Durable file writes: each file fsynced as it is written, directories fsynced after renames."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_file(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` with ``write(f)`` and fsync it before returning."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (NaN refused), fsynced."""
    write_file(path, lambda f: f.write((json.dumps(data, indent=2, allow_nan=False) + "\n").encode()))


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
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
