"""The typed records of language-model runs in results.json (``fullband compare``'s, each ``fullband recipe`` run's;
see :mod:`fullband.experiments.core.records` for why TypedDicts)."""

from typing import Any

from fullband.experiments.core.records import NotRequired, TypedDict


class ModeScore(TypedDict):
    """One model scored on the test split in one decoding mode (``perplexity.ModeResult`` as a dict)."""

    loss: float  # mean nats per predicted token
    bits_per_byte: float
    passes: float  # stack evaluations per window
    predicted_tokens: int


class RunRecord(TypedDict):
    """One trained and evaluated run of ``fullband compare`` (``results["runs"][i]``).

    ``runs.train_and_evaluate`` writes the training part; ``runs.evaluate_run`` adds the test scores
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
