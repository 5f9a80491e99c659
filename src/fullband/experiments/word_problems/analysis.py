"""What ``fullband eval-controls`` reads off its runs (torch-free, so a report re-renders from results.json alone):
each arm's chosen setting, failed-to-train flags, solved seeds, the longest length kept at >= 0.9, and the paired
per-seed margins of the full-bandwidth model over the best control with t intervals (the seed is the unit)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

MODEL = "fullband"  # the model under test
REFERENCE = "rnn"  # reported apart: the known ceiling, not a control to beat
BASELINE = "baseline"
KEEP = 0.9  # accuracy that counts as solved (and that "longest n" keeps)
FIT_TOLERANCE = 0.02  # a control this far below the baseline at a trained length failed to train there
MARGIN_TARGET = 0.3


def selection_key(candidate: dict[str, Any]) -> tuple[float, float, int]:
    """Order of the tuning grid, best first: mean validation accuracy over the trained lengths (higher), then its
    loss (lower), then fewer steps."""
    return (-candidate["validation_accuracy"], candidate["validation_loss"], candidate["steps"])


def choose(grid: list[dict[str, Any]]) -> dict[str, Any]:
    """The grid point an arm keeps (see :func:`selection_key`)."""
    return min(grid, key=selection_key)


def same_setting(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two grid points (or a point and a choice) are the same knob, learning rate and step count."""
    return all(a[k] == b[k] for k in ("knob", "lr", "steps"))


def extrapolation_key(candidate: dict[str, Any]) -> tuple[float, float, float, int]:
    """Order of the tuning grid for the second selection, best first: mean accuracy on the selection problems of
    the unseen lengths (higher), then :func:`selection_key`."""
    return (-candidate["extrapolation_accuracy"], *selection_key(candidate))


def choose_extrapolating(grid: list[dict[str, Any]]) -> dict[str, Any]:
    """The grid point an arm keeps in the second selection (see :func:`extrapolation_key`)."""
    return min(grid, key=extrapolation_key)


def longest_kept(accuracy: Sequence[float], level: float = KEEP) -> int:
    """The longest n such that every length 1..n is answered with accuracy >= ``level`` (0 if length 1 is not)."""
    for n, value in enumerate(accuracy, start=1):
        if value < level:
            return n - 1
    return len(accuracy)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of the mean of ``values`` (the seeds); a point with one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    from scipy.stats import t  # the studies' extra (fullband[plot]); only the analysis needs it

    half = float(t.ppf(0.5 + confidence / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def controls_of(arms: Sequence[str]) -> list[str]:
    """The arms the model under test must beat: every arm but itself and the reference (ablations are not arms)."""
    return [a for a in arms if a not in (MODEL, REFERENCE)]


def failed_to_train(cells: dict[str, dict[str, Any]], arm: str, train_length: int) -> list[str]:
    """The seeds on which ``arm`` stays more than :data:`FIT_TOLERANCE` below the baseline at a trained length
    (validation accuracy): there it failed to train, and no comparison may call it beaten."""
    failed = []
    for seed, cell in cells[arm].items():
        base = cells[BASELINE][seed]["validation"]
        if any(cell["validation"][n] < base[n] - FIT_TOLERANCE for n in range(train_length)):
            failed.append(seed)
    return failed


def analyse_group(group: dict[str, Any], arms: Sequence[str], test_lengths: Sequence[int],
                  train_length: int) -> dict[str, Any]:
    """Per arm: seeds that solve the trained lengths, failed-to-train seeds, longest n kept per seed; per test
    length: the paired margins of the model over each seed's best control and over the reference; the verdict's
    numbers."""
    cells = group["cells"]
    seeds = list(cells[MODEL])
    out: dict[str, Any] = {"arms": {}, "margins": {}, "reference_margins": {}}
    for arm in cells:
        out["arms"][arm] = {
            "solved": [s for s in cells[arm] if min(cells[arm][s]["validation"]) >= KEEP],
            "failed_to_train": failed_to_train(cells, arm, train_length) if arm != BASELINE else [],
            "longest_kept": {s: longest_kept(cells[arm][s]["test"]) for s in cells[arm]},
        }
    controls = [a for a in controls_of(arms) if a in cells]
    for n in test_lengths:
        best = {s: max(controls, key=lambda a, s=s: cells[a][s]["test"][n - 1]) for s in seeds}
        margins = [cells[MODEL][s]["test"][n - 1] - cells[best[s]][s]["test"][n - 1] for s in seeds]
        mean, low, high = t_interval(margins)
        out["margins"][str(n)] = {"per_seed": dict(zip(seeds, margins, strict=True)), "best_control": best,
                                  "mean": mean, "low": low, "high": high}
        if REFERENCE in cells:
            diff = [cells[MODEL][s]["test"][n - 1] - cells[REFERENCE][s]["test"][n - 1] for s in seeds]
            mean, low, high = t_interval(diff)
            out["reference_margins"][str(n)] = {"per_seed": dict(zip(seeds, diff, strict=True)), "mean": mean,
                                                "low": low, "high": high}
    model_mean = {n: statistics.fmean(cells[MODEL][s]["test"][n - 1] for s in seeds) for n in test_lengths}
    kept = [n for n in test_lengths if model_mean[n] >= KEEP]
    target_n = max(kept) if kept else None
    out["target"] = {"n": target_n, "model_accuracy": model_mean.get(target_n) if target_n else None}
    if target_n is not None:
        margin = out["margins"][str(target_n)]
        out["target"] |= {"margin": margin["mean"], "low": margin["low"], "high": margin["high"],
                          "met": margin["mean"] >= MARGIN_TARGET and margin["low"] > 0}
    else:
        out["target"]["met"] = False
    return out
