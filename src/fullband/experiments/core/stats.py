"""Intervals and seed summaries for accuracies (torch-free)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

Z95 = 1.959963984540054  # the two-sided 95% normal quantile


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``correct / n`` (95% by default); (0, 1) when n is 0.

    Why Wilson: it stays inside [0, 1] and keeps its coverage at 0 or n correct, where the normal interval
    collapses to a point; at 200 problems and accuracy 0.5 it is ±0.07."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def correct_count(accuracy: float, n: int) -> int:
    """The number of right answers behind an accuracy over n problems."""
    return round(accuracy * n)


def pooled_wilson(accuracies: Sequence[float], ns: Sequence[int]) -> tuple[float, float]:
    """Wilson interval of the answers of several seeds pooled (every seed's answer to a problem one trial).

    It covers the sampling of the test problems only; seed-to-seed variation is what the sd and the worst seed
    show."""
    correct = sum(correct_count(a, n) for a, n in zip(accuracies, ns, strict=True))
    return wilson(correct, sum(ns))


def format_interval(interval: tuple[float, float], fmt: str = ".2f") -> str:
    return f"[{format(interval[0], fmt)}, {format(interval[1], fmt)}]"


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample sd of the values that are not None ((None, None) for none; sd None for one value)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)
