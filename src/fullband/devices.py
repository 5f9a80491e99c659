"""Device names, checked in one place: ``auto | cpu | cuda | cuda:N | mps``.

Configs reject a malformed name when they are built (:func:`fullband.config.validate_device_name`, no torch);
:func:`resolve_device` turns a name into a ``torch.device`` and rejects one this machine cannot use (a CPU-only
torch build, a GPU index past the last GPU, no MPS), each with a one-line :class:`~fullband.config.ConfigError`
that says what to use instead. The command line calls it before loading anything.

:func:`apply_threads` sets torch's CPU thread count from a command's ``threads`` option (``auto`` or a count), so no
command leaves it to chance: torch's own default takes every core of the machine, even those the process may not
use or that OMP_NUM_THREADS reserves for others, and oversubscribed threads on a busy machine cost more than they give.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fullband.config import ConfigError, validate_device_name, validate_threads

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


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def resolve_threads(setting: str | int = "auto", field: str = "threads") -> int:
    """The thread count ``setting`` means here: a count as given; ``auto`` = :func:`usable_cores`, shared among
    torchrun's processes on this machine (LOCAL_WORLD_SIZE), at most OMP_NUM_THREADS when that is a count, less
    the cores other running processes hold at start (:func:`busy_elsewhere`), and at least 1."""
    setting = validate_threads(setting, field)
    if setting != "auto":
        return int(setting)
    local_processes = max(1, _env_count("LOCAL_WORLD_SIZE") or 1)
    threads = usable_cores() // local_processes
    if limit := _env_count("OMP_NUM_THREADS"):
        threads = min(threads, limit)
    # Leave the cores other running processes hold: beside one busy process on 2 cores a 2-thread training run
    # took 3.1x its quiet time and a 1-thread run 1.55x (benchmarks/busy_neighbour.py, docs/LOG.md), since every
    # parallel op waits for its slowest thread.
    threads -= max(0, busy_elsewhere() - (local_processes - 1))
    return max(1, threads)


def busy_elsewhere(samples: int = 5, loadavg: str = "/proc/loadavg") -> int:
    """Runnable tasks on this machine besides this process, the least of a few looks over ~20 ms (Linux's
    /proc/loadavg; 0 where there is none). Counts torchrun's sibling processes too: the caller discounts them."""
    try:
        counts = []
        for i in range(samples):
            with open(loadavg) as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
            if i < samples - 1:
                time.sleep(0.005)
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, min(counts) - 1)  # this process is running while it reads


# Instruction-set features that decide the speed of a CPU's matmuls, as /proc/cpuinfo names them: bf16 matmuls are
# native only with avx512_bf16 or amx_bf16, emulated (several times slower) otherwise.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def _cpuinfo_field(names: tuple[str, ...], cpuinfo: str | Path) -> str | None:
    """The first processor's value of the first of ``names`` in Linux's /proc/cpuinfo (None: no such file/field)."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith(names):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (Linux's /proc/cpuinfo; empty where there is none)."""
    return frozenset((_cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())  # x86 / ARM


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module knows."""
    return _cpuinfo_field(("model name",), cpuinfo) or platform.processor() or platform.machine()


def cpu_vendor(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's vendor as /proc/cpuinfo names it (GenuineIntel, AuthenticAMD, ...); "" where unknown."""
    return _cpuinfo_field(("vendor_id",), cpuinfo) or ""


def apply_threads(setting: str | int = "auto", field: str = "threads") -> int:
    """torch.set_num_threads(:func:`resolve_threads`); returns the count set."""
    import torch

    threads = resolve_threads(setting, field)
    torch.set_num_threads(threads)
    return threads


def _env_count(name: str) -> int | None:
    """A positive integer environment variable, or None when unset or not one (OpenMP ignores such values too)."""
    text = os.environ.get(name, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None
