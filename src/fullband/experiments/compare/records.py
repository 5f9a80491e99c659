"""The typed results.json of ``fullband compare`` (see :mod:`fullband.experiments.core.records` for why TypedDicts)."""

from typing import Any

from fullband.experiments.core.lm.records import RunRecord
from fullband.experiments.core.records import NotRequired, TypedDict


class CompareResults(TypedDict):
    """results.json of ``fullband compare``."""

    config: dict[str, Any]  # the resolved CompareConfig
    machine: dict[str, Any]
    commands: dict[str, Any]
    runs: list[RunRecord]
    stability: list[dict[str, Any]]  # the feedback models' stability curves
    multipliers: NotRequired[dict[str, Any]]  # added by the analysis
    gap_trend: NotRequired[dict[str, Any]]
    seconds: NotRequired[float]
    finished: NotRequired[str]
