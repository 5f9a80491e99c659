"""Effective token multiplier: how many training tokens the baseline would need to reach a given loss.

The baseline's test loss is measured at a few token budgets; between them it is modelled as piecewise linear
in log(tokens) (straight segments on the usual log-x plot), and inverted to give the tokens at which it would
reach a target loss. A target below the lowest measured loss (better than the largest baseline) or above the
highest (worse than the smallest) is extrapolated along the nearest end segment and flagged as such; when that
segment does not slope down, no number is given. If the measured curve is not monotone, the smallest token
count that reaches the target is used (the conservative choice for the feedback model) and it is flagged.

multiplier = tokens the baseline needs / tokens the feedback model was trained on.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

INTERPOLATED = "interpolated"
BETTER_THAN_LARGEST = "extrapolated: better than the largest baseline"
WORSE_THAN_SMALLEST = "extrapolated: worse than the smallest baseline"
NO_FIT = "no fit: the baseline curve does not decrease at that end"
NON_MONOTONE = "; baseline curve not monotone"
NOT_FINITE = "no fit: the loss is not finite"


@dataclass
class TokenMatch:
    tokens: float | None  # baseline tokens that reach the target loss (None when there is no fit)
    multiplier: float | None  # tokens / the feedback model's tokens
    flag: str  # INTERPOLATED, BETTER_THAN_LARGEST, WORSE_THAN_SMALLEST, NO_FIT or NOT_FINITE (+ NON_MONOTONE)

    @property
    def extrapolated(self) -> bool:
        return self.flag.startswith("extrapolated")


def against_one(multiplier: float, spread: float) -> str:
    """Where a token multiplier stands against 1.00x: "above" or "below" it by more than ``spread`` (one seed sd),
    else "tie" (within the seed spread of 1.00x a multiplier is neither a gain nor a loss)."""
    if multiplier - spread > 1:
        return "above"
    return "below" if multiplier + spread < 1 else "tie"


def baseline_loss_at(tokens: Sequence[float], losses: Sequence[float], at: float) -> float:
    """The fitted baseline loss at ``at`` tokens (piecewise linear in log tokens, end segments extended)."""
    xs, ys = _sorted_curve(tokens, losses)
    x = math.log(at)
    i = 0 if x <= xs[0] else len(xs) - 2 if x >= xs[-1] else max(j for j in range(len(xs) - 1) if xs[j] <= x)
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])


def tokens_to_match(tokens: Sequence[float], losses: Sequence[float], target: float,
                    model_tokens: float) -> TokenMatch:
    """Baseline tokens reaching ``target`` loss, and that divided by ``model_tokens`` (see the module doc)."""
    xs, ys = _sorted_curve(tokens, losses)
    if not math.isfinite(target):
        return TokenMatch(None, None, NOT_FINITE)
    monotone = all(b < a for a, b in itertools.pairwise(ys))
    suffix = "" if monotone else NON_MONOTONE
    for i in range(len(xs) - 1):  # first segment (smallest tokens) that reaches the target
        lo, hi = sorted((ys[i], ys[i + 1]))
        if lo <= target <= hi and ys[i] != ys[i + 1]:
            return _match(_invert(xs, ys, i, target), model_tokens, INTERPOLATED + suffix)
    if target < min(ys):
        i, flag = len(xs) - 2, BETTER_THAN_LARGEST
    elif target > max(ys):
        i, flag = 0, WORSE_THAN_SMALLEST
    else:  # a flat segment equal to the target: the smallest token count that has it
        return _match(xs[ys.index(target)], model_tokens, INTERPOLATED + suffix)
    if not ys[i + 1] < ys[i]:
        return TokenMatch(None, None, NO_FIT + suffix)
    return _match(_invert(xs, ys, i, target), model_tokens, flag + suffix)


def _sorted_curve(tokens: Sequence[float], losses: Sequence[float]) -> tuple[list[float], list[float]]:
    if len(tokens) != len(losses) or len(tokens) < 2:
        raise ValueError(f"need at least 2 (tokens, loss) points of equal count, got {len(tokens)} and {len(losses)}")
    if any(t <= 0 for t in tokens) or len(set(tokens)) != len(tokens):
        raise ValueError(f"token counts must be positive and distinct, got {list(tokens)}")
    if not all(math.isfinite(v) for v in losses):
        raise ValueError(f"baseline losses must be finite, got {list(losses)}")
    pairs = sorted(zip(tokens, losses, strict=True))
    return [math.log(t) for t, _ in pairs], [float(v) for _, v in pairs]


def _invert(xs: list[float], ys: list[float], i: int, target: float) -> float:
    """log-tokens where segment i (extended) reaches target."""
    return xs[i] + (target - ys[i]) * (xs[i + 1] - xs[i]) / (ys[i + 1] - ys[i])


def _match(log_tokens: float, model_tokens: float, flag: str) -> TokenMatch:
    needed = math.exp(log_tokens)
    return TokenMatch(needed, needed / model_tokens, flag)
