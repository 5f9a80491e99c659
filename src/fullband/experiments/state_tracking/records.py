"""The typed records of ``eval-state``'s probe cells in results.json (see :mod:`fullband.experiments.core.records`
for why TypedDicts)."""

from typing import Any

from fullband.experiments.core.records import NotRequired, TypedDict


class ProbeScore(TypedDict):
    """``fullband eval-state``: linear probes of one model's states on one task, and its answers."""

    probe_accuracy: list[float]  # per depth 0..n_layers of the final token's states
    answer_accuracy: float  # the model's own next-token answer
    chance: float  # a probe on a constant feature: the fit set's majority class on the test set


class ProbeCell(ProbeScore):
    """A cell of ``fullband eval-state`` (``results["cells"]``): a :class:`ProbeScore` with what it is of."""

    task: str
    model: str  # baseline or fullband
    prefill: str
    variant: str


class StateTrackingResults(TypedDict):
    """results.json of ``fullband eval-state``."""

    study: str
    config: dict[str, Any]
    training: dict[str, dict[str, Any]]
    variants: list[str]
    cells: list[ProbeCell]
    seconds: NotRequired[float]
    finished: NotRequired[str]
    command: NotRequired[str]  # the rerun command the report's header names (results before it had none)
