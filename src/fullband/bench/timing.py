"""Interleaved timing, ratios over rounds, the machine's limits and how busy it was."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from fullband.devices import CPU_FEATURES, cpu_flags, cpu_name, usable_cores


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a timer measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(cases: dict[str, Callable[[], Any]], rounds: int, device: torch.device, reps: int = 1,
                warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each case, one entry per round; the cases alternate within a round, and every other
    round runs them in reverse order, so slow drift and other load fall on all of them alike."""
    for fn in cases.values():  # allocator, kernels, optimizer state, lazy inits
        for _ in range(warmup):
            fn()
    names = list(cases)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            synchronize(device)
            start = time.perf_counter()
            for _ in range(reps):
                cases[name]()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / reps)
    return times


def ratio(times: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of time[numerator] / time[denominator] within each round."""
    return statistics.median(a / b for a, b in zip(times[numerator], times[denominator], strict=True))


def copy_case(mib: int, device: torch.device) -> tuple[Callable[[], Any], int]:
    """A copy of a ``mib`` MiB float32 tensor, and the bytes it moves: read + written, the usual convention for
    memory bandwidth (bytes / seconds of one call = the bandwidth)."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * src.nbytes


def matmul_case(device: torch.device) -> tuple[Callable[[], Any], float, int]:
    """A float32 square matmul big enough to run at the machine's peak (1024 on a CPU, 2048 on CUDA), its FLOPs,
    and its size."""
    size = 2048 if device.type == "cuda" else 1024
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    return (lambda: a @ b), 2.0 * size**3, size


def machine_limits(device: torch.device, rounds: int, copy_mib: int) -> dict[str, float]:
    """Memory bandwidth (GB/s, see :func:`copy_case`) and matmul GFLOP/s (float32 square matmul), medians over
    rounds."""
    copy, moved = copy_case(copy_mib, device)
    matmul, flops, size = matmul_case(device)
    times = interleaved({"copy": copy, "matmul": matmul}, rounds, device, reps=3)
    return {"memory_gb_s": moved / statistics.median(times["copy"]) / 1e9,
            "matmul_gflop_s": flops / statistics.median(times["matmul"]) / 1e9,
            "copy_mib": copy_mib, "matmul_size": size}


def machine_state() -> dict[str, Any]:
    """What the machine is and how busy it is now: other load slows every case, so a report states it."""
    flags = cpu_flags()
    info: dict[str, Any] = {"cpu": cpu_name(), "usable_cores": usable_cores(),
                            "cpu_features": [f for f in CPU_FEATURES if f in flags],  # bf16 native or emulated
                            "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info
