"""The typed records of ``eval-reasoning``'s cells (and its controls' report over families) in results.json (see
:mod:`fullband.experiments.core.records` for why TypedDicts)."""

from typing import Any

from fullband.experiments.core.records import NotRequired, TypedDict


class DecodedCell(TypedDict):
    """Greedy solutions of the test problems of one length, at one stride, by one model in one mode."""

    n: int  # problems
    accuracy: float
    exact_trace: float  # share of completions equal to the reference trace
    mean_len: float  # generated tokens
    median_len: float
    ms_per_problem: float


class Cell(TypedDict):
    """A cell of ``fullband eval-reasoning`` (``results["cells"]``, ``results["seed_cells"]``): a
    :class:`DecodedCell` with what it is of.

    model, mode and median_len: absent from a cell pooled over lengths (length "all"); seed: in ``seed_cells``
    only; ``<metric>_sd`` and seeds: in ``cells``, the means over the seeds; inference_flops: see below.
    """

    variant: str  # "baseline", "fullband fused(2)", ... (reasoning.evaluation.variant_name)
    stride: int  # s = every s-th intermediate value, 0 = answer only
    length: int | str  # problem length, or "all" when pooled
    n: int
    accuracy: float
    exact_trace: float
    mean_len: float
    ms_per_problem: float
    model: NotRequired[str]  # baseline, fullband or a control's kind
    mode: NotRequired[str]
    median_len: NotRequired[float]
    seed: NotRequired[int]
    seeds: NotRequired[int]
    accuracy_sd: NotRequired[float]
    exact_trace_sd: NotRequired[float]
    mean_len_sd: NotRequired[float]
    median_len_sd: NotRequired[float]
    ms_per_problem_sd: NotRequired[float]
    inference_flops: NotRequired[float]  # with controls, answer-only cells: FLOPs per problem (controls.py)


class ReasoningResults(TypedDict):
    """results.json of ``fullband eval-reasoning`` (one family)."""

    study: str
    config: dict[str, Any]  # flat_view of the ReasoningConfig
    training: dict[str, dict[str, Any]]  # per model (and seed): its training summary
    variants: list[str]
    cells: list[Cell]  # means over the seeds
    seed_cells: list[Cell]  # every seed's own
    equal_accuracy: list[dict[str, Any]]  # per length: target_accuracy and each variant's shortest mean trace
    seconds: NotRequired[float]
    finished: NotRequired[str]
    command: NotRequired[str]  # the rerun command the report's header names (results before it had none)


class ControlsResults(TypedDict):
    """results.json of ``fullband eval-reasoning`` with families: each family's own results, and the verdict."""

    study: str
    config: dict[str, Any]
    families: dict[str, ReasoningResults]
    resumed: NotRequired[bool]  # --resume true: ``seconds`` is the last invocation's time only
    verdict: NotRequired[list[str]]  # added by the analysis
    seconds: NotRequired[float]
    finished: NotRequired[str]
    command: NotRequired[str]  # the rerun command the report's header names (results before it had none)
