"""The stability diagnostic (the paper's Figure 3): validation loss and state change against the number of
fused prefill passes.

One loop of ``N`` passes runs over fixed windows and records after every pass ``k``: the NTP loss of pass
``k``'s logits (= ``model(x, passes=k, plain_prefix=1)``) and the per-position change of the carried state
``‖h_t^(k) − h_t^(k−1)‖₂`` (max and mean over the fused positions ``t ≥ 2``), next to ``‖h_t^(k)‖₂`` for scale.

A stable (contracting) recurrence keeps the loss flat and the change shrinking as ``k`` grows; a divergent
one, the paper's 1-/2-pass-only model, drifts away once ``k`` passes its training depth. On a window of ``T``
tokens the iteration is exact after ``T`` passes (each pass fixes one more position), so from pass ``T + 1``
on it repeats itself (change exactly 0): use windows longer than ``N`` to see ``N`` passes of real iteration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from fullband.data import TokenSplit
from fullband.experiments.core.lm.passes import iterate_passes, token_nll_sum
from fullband.model import FullBandwidthLM


@dataclass
class StabilityCurve:
    window_len: int
    windows: int
    loss: list[float] = field(default_factory=list)  # index k-1 -> pass k, nats per predicted token
    bits_per_byte: list[float] = field(default_factory=list)
    delta_max: list[float | None] = field(default_factory=list)  # None at pass 1 (no previous pass)
    delta_mean: list[float | None] = field(default_factory=list)
    state_norm: list[float] = field(default_factory=list)  # mean ‖h_t^(k)‖₂ over the fused positions

    @property
    def passes(self) -> list[int]:
        return list(range(1, len(self.loss) + 1))

    @property
    def exact_after(self) -> int:
        """Pass count after which the states are exact (plain_prefix = 1: T - 1 fused positions + 1)."""
        return self.window_len


@torch.no_grad()
def stability_curve(model: FullBandwidthLM, batches: Sequence[torch.Tensor], split: TokenSplit, max_passes: int,
                    *, progress: bool = False, desc: str = "stability") -> StabilityCurve:
    """Record loss and state change after each of passes 1..max_passes over ``batches`` (each (B, T))."""
    if model.fusion is None:
        raise ValueError("the stability diagnostic needs a model with feedback")
    if not batches:
        raise ValueError("no windows for the stability diagnostic")
    model.eval()
    T = batches[0].shape[1]
    nll = [0.0] * max_passes
    d_max = [0.0] * max_passes
    d_sum = [0.0] * max_passes
    h_sum = [0.0] * max_passes
    predicted = positions = 0
    bar = tqdm(total=len(batches) * max_passes, desc=desc, disable=not progress, leave=False, unit="pass")
    for tokens in batches:
        predicted += tokens.shape[0] * (tokens.shape[1] - 1)
        positions += tokens.shape[0] * (tokens.shape[1] - 1)  # fused positions t >= 2
        for step in iterate_passes(model, tokens, max_passes):
            i = step.passes - 1
            hidden = step.hidden[:, 1:].to(torch.promote_types(step.hidden.dtype, torch.float32))  # (B, T-1, D)
            loss_here, norm_here = token_nll_sum(step.logits, tokens), float(hidden.norm(dim=-1).sum())
            nll[i] += loss_here
            h_sum[i] += norm_here
            bar.update(1)
            if step.previous is None:
                continue
            change = (hidden - step.previous[:, 1:].to(hidden.dtype)).norm(dim=-1)  # (B, T-1)
            largest = float(change.max())
            if not largest <= d_max[i]:  # also keeps a NaN (a diverged state), which max() would drop
                d_max[i] = largest
            d_sum[i] += float(change.sum())
            if largest == 0.0:
                # A fixed point, bit for bit: every later pass gets the same inputs and repeats this one, so
                # record it for them without running them (makes --stability_passes 1000 cheap on short windows).
                for j in range(i + 1, max_passes):
                    nll[j] += loss_here
                    h_sum[j] += norm_here
                bar.update(max_passes - 1 - i)
                break
    bar.close()
    curve = StabilityCurve(window_len=T, windows=sum(b.shape[0] for b in batches))
    for i in range(max_passes):
        loss = nll[i] / predicted
        curve.loss.append(loss)
        curve.bits_per_byte.append(split.bits_per_byte(loss) if math.isfinite(loss) else math.nan)
        curve.delta_max.append(d_max[i] if i else None)
        curve.delta_mean.append(d_sum[i] / positions if i else None)
        curve.state_norm.append(h_sum[i] / positions)
    return curve
