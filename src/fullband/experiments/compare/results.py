"""Reading a compare results dict: its runs by name, its modes, means over seeds, mode labels (for the report and the
plots alike). Studies write their results with :func:`fullband.files.write_json`."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from fullband.experiments.compare.records import CompareResults, RunRecord
from fullband.modes import DecodingMode


def mode_label(mode: str) -> str:
    """A results key (``standard``, ``fused2``, ``exact``) as the report prints it (``fused(2)``)."""
    return DecodingMode.from_result_key(mode).label


def run_names(results: CompareResults) -> list[str]:
    return list(dict.fromkeys(r["name"] for r in results["runs"]))


def runs_named(results: CompareResults, name: str) -> list[RunRecord]:
    return [r for r in results["runs"] if r["name"] == name]


def modes_of(results: CompareResults) -> list[str]:
    return list(dict.fromkeys(m for r in results["runs"] for m in r["test"]))


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)
