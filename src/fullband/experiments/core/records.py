"""The typed records of the studies' results.json: what the code that builds a study's results writes and what its
report reads (``fullband compare``'s runs, ``eval-reasoning``'s cells, ``eval-state``'s probe cells).

TypedDicts rather than dataclasses: results.json is these dicts as written (key order included), so committed
results load back as they are and a re-rendered report stays byte for byte the same; the types name every key the
report reads, and a type checker sees a misspelt one. ``NotRequired`` keys are added later or only sometimes (the
docstring of each says when).
"""

import sys
from typing import Any

# Evaluated annotations (no ``from __future__ import annotations``): TypedDict reads NotRequired off them.
if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # typing_extensions (which torch depends on) has both for Python 3.10
    from typing_extensions import NotRequired, TypedDict


class ModeScore(TypedDict):
    """One model scored on the test split in one decoding mode (``perplexity.ModeResult`` as a dict)."""

    loss: float  # mean nats per predicted token
    bits_per_byte: float
    passes: float  # stack evaluations per window
    predicted_tokens: int


class RunRecord(TypedDict):
    """One trained and evaluated run of ``fullband compare`` (``results["runs"][i]``).

    ``compare.train_and_evaluate`` writes the training part; ``compare.evaluate_run`` adds the test scores
    (exact_method .. eval_seconds, stability_seconds). resumed_from_step: only for a run continued from a checkpoint;
    validation_history: only with train.eval_every; exact_check: only for a feedback model checked against the
    sequential exact forward.
    """

    name: str  # "baseline", "baseline x2", "fullband", ... (RunSpec.name)
    kind: str
    budget: float  # token budget multiplier of a baseline (1.0 for the others)
    seed: int
    out_dir: str
    steps: int
    tokens: int
    token_equiv_compute: int
    train_seconds: float  # time in training steps and validation, summed over every invocation (a resumed run too)
    final_train_loss: float | None
    validation: dict[str, float]  # val_loss_<k>pass, val_bpb_<k>pass at the end of training
    resumed_from_step: NotRequired[int]
    validation_history: NotRequired[list[dict[str, Any]]]  # the eval records of metrics.jsonl
    exact_method: NotRequired[str]
    parameters: NotRequired[int]
    test: NotRequired[dict[str, ModeScore]]  # by results key: standard, fused2, exact, ...
    test_windows: NotRequired[int]
    scored_split: NotRequired[str]  # "test", or "validation" for prepared shards (they have no test split)
    exact_check: NotRequired[dict[str, Any]]
    eval_seconds: NotRequired[float]
    stability_seconds: NotRequired[float]  # a feedback model's: the time its stability curve took


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

    variant: str  # "baseline", "fullband fused(2)", ... (reasoning_eval.variant_name)
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


class ControlsResults(TypedDict):
    """results.json of ``fullband eval-reasoning`` with families: each family's own results, and the verdict."""

    study: str
    config: dict[str, Any]
    families: dict[str, ReasoningResults]
    resumed: NotRequired[bool]  # --resume true: ``seconds`` is the last invocation's time only
    verdict: NotRequired[list[str]]  # added by the analysis
    seconds: NotRequired[float]
    finished: NotRequired[str]


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


def key_problems(record: dict[str, Any], record_type: type) -> list[str]:
    """Why ``record`` is not a ``record_type`` by its keys: the required keys it lacks and the keys the type does not
    name (empty when none; the tests check what the studies write against these types)."""
    keys = set(record)
    required, optional = record_type.__required_keys__, record_type.__optional_keys__
    return ([f"{record_type.__name__} lacks {k!r}" for k in sorted(required - keys)]
            + [f"{record_type.__name__} does not name {k!r}" for k in sorted(keys - required - optional)])
