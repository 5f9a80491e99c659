"""Device names, checked in one place: ``auto | cpu | cuda | cuda:N | mps``.

Configs reject a malformed name when they are built (:func:`fullband.config.validate_device_name`, no torch);
:func:`resolve_device` turns a name into a ``torch.device`` and rejects one this machine cannot use (a CPU-only
torch build, a GPU index past the last GPU, no MPS), each with a one-line :class:`~fullband.config.ConfigError`
that says what to use instead. The command line calls it before loading anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fullband.config import ConfigError, validate_device_name

if TYPE_CHECKING:
    import torch


def resolve_device(name: str, local_rank: int = 0, field: str = "device") -> torch.device:
    """The torch device ``name`` means here; ``auto`` = ``cuda:local_rank`` when CUDA is available, else cpu."""
    import torch

    validate_device_name(name, field)
    if name == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ConfigError(f"{field}={name!r} is invalid: {why}; use --{field} cpu (or auto)")
        count = torch.cuda.device_count()
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        if index >= count:
            raise ConfigError(f"{field}={name!r} is invalid: this machine has {count} CUDA device(s), "
                              f"cuda:0..cuda:{count - 1}")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{field}={name!r} is invalid: MPS (Apple GPU) is not available here; use --{field} cpu")
    return torch.device(name)
