"""The gaps against training tokens (fullband.experiments.compare.trend): series from the validations, the fitted
crossing of 1.0x and how the verdict words a good fit, a poor one and a run without validations during training."""

import math

import pytest

from fullband.experiments.compare.trend import crossing, fit_line, gap_series, gap_trend, verdict_lines

STEP_TOKENS = 1000


def results(gap_at, seeds=(0, 1), steps=(1, 3, 7, 15), plain_gap=0.02):
    """A compare results dict whose feedback run's 1-pass validation loss sits ``gap_at(tokens, seed)`` above the
    1x baseline's at each validation step (2 passes another ``plain_gap`` above)."""
    def history(gap, seed):
        return [{"kind": "eval", "step": s, "val_loss_1pass": 3.0 - 0.1 * s + gap((s + 1) * STEP_TOKENS, seed),
                 **({"val_loss_2pass": 3.0 - 0.1 * s + gap((s + 1) * STEP_TOKENS, seed) + plain_gap}
                    if gap is not zero else {})} for s in steps]

    runs = []
    last = steps[-1] + 1
    for seed in seeds:
        runs += [{"name": "baseline-1x", "kind": "baseline", "budget": 1.0, "seed": seed, "steps": last,
                  "tokens": last * STEP_TOKENS, "validation_history": history(zero, seed)},
                 {"name": "baseline-2x", "kind": "baseline", "budget": 2.0, "seed": seed, "steps": 2 * last,
                  "tokens": 2 * last * STEP_TOKENS, "validation": {"val_loss_1pass": 1.0}},
                 {"name": "feedback", "kind": "feedback", "budget": 1.0, "seed": seed, "steps": last,
                  "tokens": last * STEP_TOKENS, "parameters": 1000, "validation_history": history(gap_at, seed)}]
    return {"runs": runs, "stability": []}


def zero(tokens, seed):
    return 0.0


def test_the_series_pairs_each_validation_with_the_baseline_at_the_same_step():
    series = gap_series(results(lambda t, s: 0.05 + s))
    assert set(series) == {"feedback"} and set(series["feedback"]) == {0, 1}
    first = series["feedback"][1][0]
    assert first["tokens"] == 2000 and first["vs_baseline"]["standard"] == pytest.approx(1.05)
    assert first["vs_plain"]["fused1"] == pytest.approx(0.02)
    assert first["vs_baseline"]["fused1"] == pytest.approx(1.07)


def test_a_gap_linear_in_log_tokens_crosses_where_the_line_says():
    # gap = 0.01 per halving of the distance to 64k tokens: 0 at 64k, 4x past the last validation (16k).
    def gap(t, seed):
        return 0.01 * math.log2(64_000 / t)

    trend = gap_trend(results(gap))
    assert trend["mode"] == "standard" and trend["last_tokens"] == 16_000
    assert trend["points_per_seed"] == {"0": 3, "1": 3}  # from 25% of the run on: 4k, 8k, 16k
    pooled = trend["fit"]["pooled"]
    assert pooled["crossing_tokens"] == pytest.approx(64_000) and pooled["r2"] == pytest.approx(1.0)
    assert trend["fit"]["bootstrap"]["crossing_tokens"] == pytest.approx([64_000] * 3)
    text = " ".join(verdict_lines(results(gap)))
    assert "reaches 0 (token multiplier 1.0x) at 64k tokens (4x the last validated, 64.0 tokens/parameter" in text
    assert "-0.0100 nats per doubling" in text and "poor" not in text


def test_a_poor_fit_and_a_widening_gap_are_said_plainly():
    def noisy(t, seed):  # no trend in log tokens, zigzag about +0.05
        return 0.05 + (0.04 if (t // STEP_TOKENS) % 2 == 0 else -0.04) * (1 if seed == 0 else -1)

    text = " ".join(verdict_lines(results(noisy)))
    assert "The fit is poor" in text
    widening = " ".join(verdict_lines(results(lambda t, s: 0.01 * math.log(t))))
    assert "does not shrink with tokens: the trend never reaches 1.0x" in widening


def test_a_flat_gap_whose_slope_interval_includes_zero_places_no_crossing():
    def flat(t, seed):  # ahead by 0.01 on average, one seed gaining and one losing ground with tokens
        return -0.01 + (0.004 if seed == 0 else -0.004) * math.log2(t / 1000)

    text = " ".join(verdict_lines(results(flat)))
    assert "interval includes 0" in text and "no crossing of 1.0x can be placed" in text
    assert "crossed 1.0x" not in text and "ahead of the baseline" in text


def test_without_validations_during_training_the_end_point_is_reported_without_a_trend():
    data = results(lambda t, s: 0.03, steps=(15,))
    for run in data["runs"]:  # as a run with train_eval_points 0 records it: the end-of-run validation only
        if "validation_history" in run:
            run["validation"] = run.pop("validation_history")[-1]
    text = " ".join(verdict_lines(data))
    assert "+0.0300, +0.0300 (per seed) at 16k tokens; too few validations for a trend" in text
    assert "the end of training" in text


def test_fit_line_and_crossing_on_exact_points():
    line = fit_line([0.0, 1.0, 2.0], [2.0, 1.0, 0.0])
    assert line == {"intercept": 2.0, "slope": -1.0, "r2": 1.0}
    assert crossing(line) == pytest.approx(math.e ** 2)
    assert fit_line([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]) is None and fit_line([0.0, 1.0], [0.0, 1.0]) is None
