"""Loss and bits per byte of a model on fixed windows of a split, in every inference mode (DESIGN.md §4).

Each window of ``T`` tokens is scored as a whole prompt: its first token is context only, the other ``T-1``
are predicted from the logits of the mode's final pass. With ``plain_prefix = 1`` (only position 1 plain):

- ``standard``: one plain pass, the model as an ordinary transformer.
- ``fused(k)``: ``model(x, passes=k+1, plain_prefix=1)``, i.e. the plain pass plus ``k`` extra fused
  (Jacobi) passes; position ``t`` is scored with the state its predecessor had after ``k`` passes.
- ``exact``: the fully recurrent states from ``model.forward_exact(x, plain_prefix=1, method=...)``:
  ``sequential`` (one position at a time through the KV cache, the definition), ``jacobi`` (whole-window
  passes until ``max|Δh| < tol``) or ``chunked`` (Jacobi per chunk to ``tol``).

standard and fused(k) come from one loop of ``1 + max(k)`` passes (:mod:`fullband.experiments.core.lm.passes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from fullband.config import EXACT_METHODS
from fullband.data import TokenSplit
from fullband.experiments.core.lm.passes import iterate_passes, token_nll_sum
from fullband.model import FullBandwidthLM, LMOutput
from fullband.modes import STANDARD, fused


@dataclass
class ExactSpec:
    method: str = "sequential"
    tol: float | None = None  # jacobi/chunked: stop once max|h^(k) - h^(k-1)| < tol (None = run until exact)
    chunk_size: int = 64  # chunked only


@dataclass
class ModeResult:
    loss: float  # mean nats per predicted token
    bits_per_byte: float
    passes: float  # stack evaluations per window: 1, k+1, or (exact) as forward_exact counts them
    predicted_tokens: int


def mode_name(extra_passes: int) -> str:
    """The results key: ``standard`` (one plain pass, what fused(0) scores too) or ``fusedK``."""
    return (STANDARD if extra_passes == 0 else fused(extra_passes)).result_key


@torch.no_grad()
def evaluate_modes(
    model: FullBandwidthLM,
    batches: Sequence[torch.Tensor],  # each (B, T) token ids, on the model's device
    split: TokenSplit,
    fused_passes: Sequence[int] = (1, 2, 4),
    exact: ExactSpec | None = None,
    *,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, ModeResult]:
    """``{"standard": ..., "fused1": ..., "exact": ...}``; a model without feedback gets ``standard`` only."""
    model.eval()
    wanted = {0} | ({int(k) for k in fused_passes} if model.fusion is not None else set())
    sums = dict.fromkeys(sorted(wanted), 0.0)
    exact_sum, exact_passes, count, n_windows = 0.0, 0, 0, 0
    do_exact = exact is not None and model.fusion is not None
    for tokens in tqdm(batches, desc=desc, disable=not progress, leave=False, unit="batch"):
        count += tokens.shape[0] * (tokens.shape[1] - 1)
        n_windows += tokens.shape[0]
        for step in iterate_passes(model, tokens, 1 + max(wanted)):
            if step.passes - 1 in sums:
                sums[step.passes - 1] += token_nll_sum(step.logits, tokens)
        if do_exact:
            out = exact_forward(model, tokens, exact)
            exact_sum += token_nll_sum(out.logits, tokens)
            exact_passes += out.passes * tokens.shape[0]
    if count == 0:
        raise ValueError("no evaluation windows")
    results = {mode_name(k): _result(total / count, split, k + 1, count) for k, total in sums.items()}
    if do_exact:
        results["exact"] = _result(exact_sum / count, split, exact_passes / n_windows, count)
    return results


def exact_forward(model: FullBandwidthLM, tokens: torch.Tensor, exact: ExactSpec) -> LMOutput:
    """The fully recurrent logits of ``tokens`` (plain_prefix = 1) by ``exact.method``."""
    if exact.method not in EXACT_METHODS:
        raise ValueError(f"exact method must be one of {EXACT_METHODS}, got {exact.method!r}")
    return model.forward_exact(tokens, plain_prefix=1, method=exact.method, tol=exact.tol,
                               chunk_size=exact.chunk_size)


@torch.no_grad()
def exact_agreement(model: FullBandwidthLM, tokens: torch.Tensor, exact: ExactSpec) -> dict[str, float]:
    """How far ``exact`` (e.g. Jacobi stopped at a tolerance) is from the sequential definition on ``tokens``:
    the largest per-window difference of mean loss (nats) and the largest logit difference."""
    approx = exact_forward(model, tokens, exact)
    reference = model.forward_exact(tokens, plain_prefix=1, method="sequential")
    per_window = []
    for out in (approx, reference):
        nll = [token_nll_sum(out.logits[i : i + 1], tokens[i : i + 1]) for i in range(tokens.shape[0])]
        per_window.append(torch.tensor(nll) / (tokens.shape[1] - 1))
    return {"windows": int(tokens.shape[0]),
            "max_loss_diff": float((per_window[0] - per_window[1]).abs().max()),
            "max_logit_diff": float((approx.logits - reference.logits).abs().max())}


def _result(nats: float, split: TokenSplit, passes: float, count: int) -> ModeResult:
    return ModeResult(loss=nats, bits_per_byte=split.bits_per_byte(nats), passes=float(passes),
                      predicted_tokens=count)
