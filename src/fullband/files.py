"""How fullband writes a file: every writer in src/ goes through here (torch-free, standard library only).

**Atomic.** A file is written to a temporary file beside it, flushed and fsynced, then renamed over the target
(``os.replace``, atomic within a directory on POSIX and Windows): a reader sees the old file, no file, or the whole
new one, never a part, whatever the moment the writer is killed. The temporary file is an ordinary one (created
as ``open`` creates files, under the umask) named ``.NAME.XXXXXXXX.tmp``, and is removed when the write fails. The
rename itself is made durable by :func:`fsync_dir` where a caller needs that (a training checkpoint does).

**JSON.** One policy for every JSON file and JSON line fullband writes (:func:`dumps`):

- NaN and +-inf are written as ``null``. JSON (RFC 8259) has no such numbers; Python's default ``NaN`` token is
  refused by strict readers (JavaScript, jq, most other languages). A reader takes ``null`` as "no value" (a
  diverged loss, an undefined ratio). A writer for which a non-finite number is an error checks before writing:
  a training checkpoint refuses a non-finite loss with a ``NonFiniteLossError`` naming the step.
- A value JSON has no type for (a ``Path``, a dtype) is written as its ``str()``, unless the caller passes its own
  ``default`` (lm-eval's results).
- Indented by 2 with a newline at the end (a JSON line: one line, no indent), keys in the order given unless
  ``sort_keys`` (the data layer's caches, whose bytes are compared).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_file(path: str | Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` atomically: ``write(f)`` on a binary file beside it, fsynced, renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_through(path: str | Path, write: Callable[[Path], Any]) -> None:
    """:func:`write_file` for a writer that takes a path rather than a file (safetensors' ``save_file``):
    ``write(temporary_path)``, then fsync and rename; the file gets the mode :func:`write_file` gives, whatever
    the writer created it with."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, "xb"):  # created as open creates files, under the umask: the mode every other file gets
            mode = os.stat(tmp).st_mode & 0o777
        write(tmp)
        os.chmod(tmp, mode)  # the writer may replace the file with its own (safetensors makes it 0600)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | Path, data: bytes) -> None:
    """``data`` into ``path``, atomically."""
    write_file(path, lambda f: f.write(data))


def write_text(path: str | Path, text: str) -> None:
    """``text`` (UTF-8) into ``path``, atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any, *, sort_keys: bool = False,
               default: Callable[[Any], Any] | None = None) -> None:
    """``data`` as a JSON file (the module's policy: NaN/inf as null, indented, a final newline), atomically."""
    write_text(path, dumps(data, sort_keys=sort_keys, default=default) + "\n")


def dumps(data: Any, *, indent: int | None = 2, sort_keys: bool = False,
          default: Callable[[Any], Any] | None = None) -> str:
    """``data`` as JSON text by the module's policy; ``indent=None`` gives one line (a JSONL record)."""
    return json.dumps(finite(data), indent=indent, sort_keys=sort_keys, default=default or str, allow_nan=False)


def finite(value: Any) -> Any:
    """``value`` with every NaN and +-inf float (in dicts, lists and tuples) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def fsync_file(path: str | Path) -> None:
    """Flush a file's bytes to disk (one written by a library that does not: transformers' ``save_pretrained``)."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | Path) -> None:
    """Make a directory's entries (new files, a rename) durable; a no-op where the platform cannot."""
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


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
