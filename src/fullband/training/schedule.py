"""The feedback schedule: how many passes the batch of each training step runs (DESIGN.md §3).

Single-pass batches until ``feedback_start`` and from ``feedback_end`` on; in between each step draws its pass
count from ``pass_mix`` (2, 3, ... passes), optionally ramping the multi-pass share in linearly, and optionally
introducing the passes progressively: until ``two_pass_until`` every multi-pass batch runs 2 passes. The draw
depends only on ``(seed, step)``, so a resumed run or another process sees the same pass count for a step without any
state to carry.
"""

from __future__ import annotations

import random
from typing import Any

from fullband.training.config import ScheduleConfig


class FeedbackSchedule:
    """Pass count per step; ``feedback=False`` (a baseline model) always gives 1."""

    def __init__(self, cfg: ScheduleConfig, total_steps: int, seed: int, *, feedback: bool = True) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.cfg = cfg
        self.total_steps = total_steps
        self.seed = seed
        self.feedback = feedback
        self.start_step = round(cfg.feedback_start * total_steps)  # first step that may run several passes
        self.end_step = round(cfg.feedback_end * total_steps)  # first single-pass step after the feedback phase
        self.deep_step = round(cfg.two_pass_until * total_steps)  # first step that may run more than 2

    @property
    def max_passes(self) -> int:
        """Largest pass count the schedule can draw."""
        if not self.feedback or self.start_step >= min(self.end_step, self.total_steps):
            return 1
        nonzero = [k for k, prob in enumerate(self.cfg.pass_mix, start=2) if prob > 0]
        return max(nonzero, default=1)

    def multipass_share(self, step: int) -> float:
        """Probability that ``step`` runs more than one pass (0 before the start, ramping to 1)."""
        if not self.feedback or step < self.start_step or step >= self.end_step:
            return 0.0
        if self.cfg.ramp_steps == 0:
            return 1.0
        return min(1.0, (step - self.start_step + 1) / self.cfg.ramp_steps)

    def pass_mix(self, step: int) -> tuple[float, ...]:
        """P(2 passes), P(3 passes), ... of a multi-pass batch at ``step`` (all 2-pass before ``deep_step``)."""
        if step < self.deep_step:
            return (1.0,) + (0.0,) * (len(self.cfg.pass_mix) - 1)
        return self.cfg.pass_mix

    def probabilities(self, step: int) -> list[float]:
        """P(passes = 1), P(passes = 2), ... at ``step``."""
        share = self.multipass_share(step)
        return [1.0 - share] + [share * prob for prob in self.pass_mix(step)]

    def passes_at(self, step: int) -> int:
        """The pass count of ``step``: a draw from :meth:`probabilities` seeded by (seed, step) alone."""
        share = self.multipass_share(step)
        if share == 0.0:
            return 1
        # A string seed goes through SHA-512 in random.seed: stable across processes and Python versions.
        u = random.Random(f"fullband-feedback:{self.seed}:{step}").random()
        if u >= share:
            return 1
        if step < self.deep_step:
            return 2
        u = u / share  # uniform in [0, 1) again, given that this step is multi-pass
        cumulative = 0.0
        for k, prob in enumerate(self.cfg.pass_mix, start=2):
            cumulative += prob
            if u < cumulative:
                return k
        return self.max_passes  # u within rounding of 1 when the mix sums to 1 - 1e-6

    def expected_passes(self, step: int) -> float:
        """Mean pass count at ``step`` under the schedule's probabilities."""
        return sum(k * prob for k, prob in enumerate(self.probabilities(step), start=1))

    def mean_passes(self, start: int = 0, stop: int | None = None) -> float:
        """Expected passes per batch averaged over steps ``[start, stop)`` (default: the whole run).

        Token-equivalent compute of the run = tokens per step x steps x this number.
        """
        stop = self.total_steps if stop is None else stop
        if stop <= start:
            raise ValueError(f"empty step range [{start}, {stop})")
        mix_mean = sum(k * prob for k, prob in enumerate(self.cfg.pass_mix, start=2))
        split = min(max(self.deep_step, start), stop)  # 2-pass batches before it, pass_mix from it on
        extra = (2.0 - 1.0) * self._share_sum(start, split) + (mix_mean - 1.0) * self._share_sum(split, stop)
        return 1.0 + extra / (stop - start)

    def _share_sum(self, start: int, stop: int) -> float:
        """Sum of multipass_share over [start, stop) in closed form (runs may have millions of steps)."""
        if not self.feedback:
            return 0.0
        lo, stop = max(start, self.start_step), min(stop, self.end_step)
        if stop <= lo:
            return 0.0
        ramp = self.cfg.ramp_steps
        if ramp == 0:
            return float(stop - lo)
        # share(s) = j / ramp with j = s - start_step + 1, capped at 1 once j >= ramp.
        j_lo, j_hi = lo - self.start_step + 1, stop - self.start_step  # inclusive
        ramp_hi = min(j_hi, ramp)
        ramp_part = (j_lo + ramp_hi) * (ramp_hi - j_lo + 1) / 2 / ramp if ramp_hi >= j_lo else 0.0
        flat_part = j_hi - max(j_lo, ramp + 1) + 1 if j_hi > ramp else 0
        return ramp_part + flat_part

    def state_dict(self) -> dict[str, Any]:
        """What determines the schedule (it keeps no state between steps); stored in checkpoints."""
        return {"seed": self.seed, "total_steps": self.total_steps, "feedback": self.feedback,
                "feedback_start": self.cfg.feedback_start, "pass_mix": list(self.cfg.pass_mix),
                "ramp_steps": self.cfg.ramp_steps, "two_pass_until": self.cfg.two_pass_until,
                "feedback_end": self.cfg.feedback_end}
