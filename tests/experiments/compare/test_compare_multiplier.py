"""The baseline fit behind the effective token multiplier: interpolation in log tokens, flagged extrapolation;
the verdict drawn from it."""

import math

import pytest

from fullband.experiments.compare.report import verdict
from fullband.experiments.core.lm.multiplier import (
    BETTER_THAN_LARGEST,
    INTERPOLATED,
    NO_FIT,
    NON_MONOTONE,
    NOT_FINITE,
    WORSE_THAN_SMALLEST,
    baseline_loss_at,
    tokens_to_match,
)

TOKENS = [1000.0, 1500.0, 2000.0]


def loss(tokens: float) -> float:
    return 5.0 - 0.5 * math.log(tokens)  # exactly linear in log tokens, so every segment lies on it


LOSSES = [loss(t) for t in TOKENS]


@pytest.mark.parametrize("needed", [1000.0, 1200.0, 1500.0, 1800.0, 2000.0])
def test_interpolation_inverts_a_known_curve(needed):
    match = tokens_to_match(TOKENS, LOSSES, loss(needed), model_tokens=1000.0)
    assert match.flag == INTERPOLATED and not match.extrapolated
    assert match.tokens == pytest.approx(needed, rel=1e-12)
    assert match.multiplier == pytest.approx(needed / 1000.0, rel=1e-12)


@pytest.mark.parametrize(("needed", "flag"), [(3000.0, BETTER_THAN_LARGEST), (700.0, WORSE_THAN_SMALLEST)])
def test_extrapolation_is_flagged_and_follows_the_end_segment(needed, flag):
    match = tokens_to_match(TOKENS, LOSSES, loss(needed), model_tokens=1000.0)
    assert match.flag == flag and match.extrapolated
    assert match.multiplier == pytest.approx(needed / 1000.0, rel=1e-12)


def test_piecewise_segments_use_their_own_slope():
    # Steeper between 1000 and 2000 tokens than between 2000 and 4000: 2.0 -> 1.6 -> 1.5.
    tokens, losses = [1000.0, 2000.0, 4000.0], [2.0, 1.6, 1.5]
    match = tokens_to_match(tokens, losses, 1.8, model_tokens=1000.0)
    assert match.tokens == pytest.approx(1000.0 * math.sqrt(2))  # halfway in log tokens
    assert tokens_to_match(tokens, losses, 1.55, 1000.0).tokens == pytest.approx(2000.0 * math.sqrt(2))
    assert baseline_loss_at(tokens, losses, 1000.0 * math.sqrt(2)) == pytest.approx(1.8)
    # Beyond the largest budget the flatter last segment is extended: 1.4 is one more doubling, 8000 tokens.
    far = tokens_to_match(tokens, losses, 1.4, 1000.0)
    assert far.flag == BETTER_THAN_LARGEST and far.tokens == pytest.approx(8000.0)


def test_points_need_not_be_sorted():
    match = tokens_to_match(TOKENS[::-1], LOSSES[::-1], loss(1700.0), model_tokens=850.0)
    assert match.multiplier == pytest.approx(2.0)


def test_no_number_when_the_end_segment_does_not_decrease():
    match = tokens_to_match([1000.0, 2000.0], [2.0, 2.1], 1.9, model_tokens=1000.0)
    assert match.tokens is None and match.multiplier is None and match.flag.startswith(NO_FIT)


def test_non_monotone_curve_takes_the_smallest_token_count_and_says_so():
    match = tokens_to_match([1000.0, 2000.0, 4000.0], [2.0, 1.5, 1.7], 1.6, model_tokens=1000.0)
    assert match.flag == INTERPOLATED + NON_MONOTONE
    assert match.tokens < 2000.0


def test_a_diverged_loss_has_no_match():
    match = tokens_to_match(TOKENS, LOSSES, math.nan, model_tokens=1000.0)
    assert match.multiplier is None and match.flag == NOT_FINITE


def test_bad_curves_are_rejected():
    with pytest.raises(ValueError, match="at least 2"):
        tokens_to_match([1000.0], [2.0], 2.0, 1000.0)
    with pytest.raises(ValueError, match="distinct"):
        tokens_to_match([1000.0, 1000.0], [2.0, 1.9], 2.0, 1000.0)


@pytest.mark.parametrize(("multipliers", "expected"), [
    ((1.10, 1.12), "feedback buys training tokens"),
    ((0.99, 1.01), "neither buys nor costs"),  # 1.00x ± 0.014: a tie
    ((0.90, 0.92), "does not buy training tokens"),
    ((1.01,), "feedback buys training tokens"),  # one seed: no spread to hide behind
])
def test_verdict_calls_a_multiplier_within_the_seed_spread_a_tie(multipliers, expected):
    per_seed = [{"token_multiplier": m, "compute_multiplier": m / 2, "fit": INTERPOLATED} for m in multipliers]
    lines = verdict({"multipliers": {"feedback": {"standard": per_seed}}, "stability": []})
    assert len(lines) == 1 and expected in lines[0]
