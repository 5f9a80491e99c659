"""Reading a compare results dict: its runs by name and its modes (for the report and the plots alike). Studies
write their results with :func:`fullband.files.write_json`."""

from __future__ import annotations

from fullband.experiments.compare.records import CompareResults
from fullband.experiments.core.lm.records import RunRecord


def run_names(results: CompareResults) -> list[str]:
    return list(dict.fromkeys(r["name"] for r in results["runs"]))


def runs_named(results: CompareResults, name: str) -> list[RunRecord]:
    return [r for r in results["runs"] if r["name"] == name]


def modes_of(results: CompareResults) -> list[str]:
    return list(dict.fromkeys(m for r in results["runs"] for m in r["test"]))
