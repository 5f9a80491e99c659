"""The feedback schedule: per-step pass counts deterministic in (seed, step), matching the configured mix."""

from collections import Counter

import pytest

from fullband.training import FeedbackSchedule
from fullband.training.config import TRAIN_PRESETS, ScheduleConfig


def fractions(schedule: FeedbackSchedule) -> dict[int, float]:
    counts = Counter(schedule.passes_at(step) for step in range(schedule.total_steps))
    return {k: n / schedule.total_steps for k, n in sorted(counts.items())}


def paper_schedule() -> ScheduleConfig:
    """The paper's feedback schedule (``fullband train --preset paper``)."""
    return ScheduleConfig(**TRAIN_PRESETS["paper"]["schedule"])


def test_papers_schedule_matches_75_22_3_split():
    schedule = FeedbackSchedule(paper_schedule(), total_steps=20_000, seed=3)
    got = fractions(schedule)
    assert set(got) == {1, 2, 3}
    assert got[1] == pytest.approx(0.75, abs=0.02)
    assert got[2] == pytest.approx(0.22, abs=0.02)
    assert got[3] == pytest.approx(0.03, abs=0.02)
    assert schedule.max_passes == 3
    assert schedule.mean_passes() == pytest.approx(0.75 + 2 * 0.22 + 3 * 0.03)


def test_single_pass_before_start_and_multi_pass_after():
    schedule = FeedbackSchedule(paper_schedule(), total_steps=1000, seed=0)
    assert schedule.start_step == 750
    assert all(schedule.passes_at(s) == 1 for s in range(750))
    assert all(schedule.passes_at(s) in (2, 3) for s in range(750, 1000))


def test_draws_depend_only_on_seed_and_step():
    a = FeedbackSchedule(ScheduleConfig(feedback_start=0.0), total_steps=500, seed=7)
    b = FeedbackSchedule(ScheduleConfig(feedback_start=0.0), total_steps=500, seed=7)
    other = FeedbackSchedule(ScheduleConfig(feedback_start=0.0), total_steps=500, seed=8)
    forward = [a.passes_at(s) for s in range(500)]
    assert [b.passes_at(s) for s in reversed(range(500))] == forward[::-1]  # any query order
    assert [other.passes_at(s) for s in range(500)] != forward


def test_baseline_model_always_gets_one_pass():
    schedule = FeedbackSchedule(ScheduleConfig(feedback_start=0.0, pass_mix=(0.0, 1.0)), 100, seed=0, feedback=False)
    assert {schedule.passes_at(s) for s in range(100)} == {1}
    assert schedule.max_passes == 1 and schedule.mean_passes() == 1.0


def test_fine_tuning_runs_a_fixed_pass_count():
    schedule = FeedbackSchedule(ScheduleConfig(feedback_start=0.0, pass_mix=(0.0, 1.0)), 200, seed=0)
    assert {schedule.passes_at(s) for s in range(200)} == {3}
    assert schedule.mean_passes() == 3.0


def test_ramp_raises_the_multipass_share_linearly():
    schedule = FeedbackSchedule(ScheduleConfig(feedback_start=0.5, pass_mix=(1.0,), ramp_steps=100), 400, seed=1)
    assert schedule.multipass_share(199) == 0.0
    assert schedule.multipass_share(200) == pytest.approx(0.01)
    assert schedule.multipass_share(249) == pytest.approx(0.5)
    assert schedule.multipass_share(299) == 1.0
    assert schedule.probabilities(249) == pytest.approx([0.5, 0.5])
    ramp = [schedule.passes_at(s) for s in range(200, 300)]
    assert 30 < ramp.count(2) < 70  # about half of the ramp's batches are multi-pass
    assert all(schedule.passes_at(s) == 2 for s in range(300, 400))


@pytest.mark.parametrize("ramp_steps", [0, 1, 37, 500])
@pytest.mark.parametrize(("start", "stop"), [(0, None), (0, 123), (260, 320), (390, 400)])
def test_mean_passes_closed_form_matches_the_step_average(ramp_steps, start, stop):
    cfg = ScheduleConfig(feedback_start=0.6, pass_mix=(0.7, 0.2, 0.1), ramp_steps=ramp_steps)
    schedule = FeedbackSchedule(cfg, total_steps=400, seed=0)
    steps = range(start, stop if stop is not None else 400)
    brute = sum(schedule.expected_passes(s) for s in steps) / len(steps)
    assert schedule.mean_passes(start, stop) == pytest.approx(brute, abs=1e-12)


def test_progressive_introduction_runs_two_passes_before_deeper_ones():
    cfg = ScheduleConfig(feedback_start=0.25, pass_mix=(0.5, 0.3, 0.2), two_pass_until=0.5)
    schedule = FeedbackSchedule(cfg, 400, seed=2)
    early, late = [schedule.passes_at(s) for s in range(100, 200)], [schedule.passes_at(s) for s in range(200, 400)]
    assert set(early) == {2} and {3, 4} <= set(late)
    assert schedule.probabilities(150) == [0.0, 1.0, 0.0, 0.0]
    expected = (100 * 1 + 100 * 2 + 200 * (2 * 0.5 + 3 * 0.3 + 4 * 0.2)) / 400
    assert schedule.mean_passes() == pytest.approx(expected)
    assert schedule.mean_passes() == pytest.approx(sum(schedule.expected_passes(s) for s in range(400)) / 400)


def test_feedback_phase_can_end_before_the_run_does():
    cfg = ScheduleConfig(feedback_start=0.25, feedback_end=0.75, pass_mix=(1.0,))
    schedule = FeedbackSchedule(cfg, 400, seed=0)
    passes = [schedule.passes_at(s) for s in range(400)]
    assert set(passes[:100]) == {1} and set(passes[100:300]) == {2} and set(passes[300:]) == {1}
    assert schedule.mean_passes() == pytest.approx(1.5)
    assert schedule.mean_passes(250, 350) == pytest.approx(sum(schedule.expected_passes(s) for s in range(250, 350))
                                                           / 100)
