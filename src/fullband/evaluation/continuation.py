"""Log-likelihood of a continuation given a context, in each decoding mode (teacher-forced decoding).

A request is a context ``c_1..c_n`` and a continuation ``x_1..x_m`` (token ids, ``n, m >= 1``). The model
reads ``c_1..c_n x_1..x_{m-1}`` and ``x_j`` is scored by the logits of the position just before it. Which
input positions are plain (``u_t = e_t``) and which fused (``u_t = fuse(e_t, h_{t-1})``):

==========  ====================================================  ===========================================
mode        context positions c_1..c_n                            continuation inputs x_1..x_{m-1}
==========  ====================================================  ===========================================
standard    all plain, one pass                                   all plain
soft        all plain, one pass (so their states are exact)       all fused, exact recurrence from h(c_n)
fused(k)    c_1 plain, c_2..c_n fused, ``1 + k`` Jacobi passes     all fused, exact recurrence from that h(c_n)
exact       c_1 plain, c_2..c_n fused, exact (sequential)         all fused, exact recurrence
==========  ====================================================  ===========================================

So ``loglikelihood(context, continuation)`` in mode M is the log-probability that the mode-M decoder of
:mod:`fullband.generation` assigns to the continuation when the continuation is fed to it (teacher forcing)
instead of sampled, and ``is_greedy`` says whether greedy mode-M decoding would produce it. The continuation
is always computed exactly, because decoding computes it one token at a time: its states follow the fully
recurrent definition over the continuation even though its tokens are given. The context is prefilled by the
decoder's own :func:`fullband.generation.decoding.prefill`, so scoring and generation cannot drift apart.

A model without feedback (``feedback=False``) gives the same numbers in every mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fullband.generation.decoding import left_pad, prefill
from fullband.model import FullBandwidthLM
from fullband.modes import DEFAULT_SCORE_MODE, DecodingMode

TokenPair = tuple[Sequence[int], Sequence[int]]  # (context ids, continuation ids)


@torch.no_grad()
def score_continuations(
    model: FullBandwidthLM,
    pairs: Sequence[TokenPair],
    mode: str | DecodingMode = DEFAULT_SCORE_MODE,
    *,
    exact_chunk_size: int = 1,
    exact_tol: float | None = None,
) -> list[tuple[float, bool]]:
    """(sum of log p(continuation | context), greedy?) of every pair, computed as one batch.

    Contexts are left-padded and continuations right-padded, so every row's real tokens sit next to each
    other and its numbers equal those of the row scored alone.
    """
    mode = DecodingMode.parse(mode)  # the prefill below is the decoder's own
    if not pairs:
        return []
    if any(len(context) == 0 or len(continuation) == 0 for context, continuation in pairs):
        raise ValueError("every pair needs at least one context token and one continuation token")
    N, M = max(len(c) for c, _ in pairs), max(len(x) for _, x in pairs)  # padded context / continuation widths
    if model.config.max_seq_len < N + M - 1:
        if len(pairs) == 1:
            raise ValueError(f"context ({N}) + continuation ({M}) - 1 tokens exceed the model context "
                             f"max_seq_len={model.config.max_seq_len}; truncate the context")
        # Padding the longest context and the longest continuation of different rows together can overflow
        # the context although each row fits: score the halves separately.
        half = len(pairs) // 2
        options = dict(exact_chunk_size=exact_chunk_size, exact_tol=exact_tol)
        return (score_continuations(model, pairs[:half], mode, **options)
                + score_continuations(model, pairs[half:], mode, **options))
    device = model.embed.weight.device
    ctx_ids, ctx_mask = left_pad([list(c) for c, _ in pairs])  # (B, N)
    state = prefill(model, ctx_ids.to(device), ctx_mask.to(device), mode, N + M - 1,
                    exact_chunk_size=exact_chunk_size, exact_tol=exact_tol)
    logits = state.next_logits[:, None]  # (B, 1, V): predicts x_1
    if M > 1:
        cont_ids, cont_mask = _right_pad([list(x[:-1]) for _, x in pairs], M - 1)  # (B, M-1)
        cont_ids, cont_mask = cont_ids.to(device), cont_mask.to(device)
        if state.carried is None:  # standard mode, or a model without feedback: one plain pass
            out = model(cont_ids, cache=state.cache, attention_mask=cont_mask)
        else:  # exact recurrence over the continuation, fed from the context's last state
            out = model.prefill(cont_ids, state.cache, N, chunk_size=exact_chunk_size, carried_state=state.carried,
                                tol=exact_tol, attention_mask=cont_mask)
        logits = torch.cat((logits, out.logits), dim=1)  # (B, M, V)
    logprobs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    results = []
    for row, (_, continuation) in enumerate(pairs):
        m = len(continuation)
        target = torch.as_tensor(list(continuation), device=device)
        row_logprobs = logprobs[row, :m]  # (m, V)
        total = row_logprobs.gather(1, target[:, None]).sum().item()
        greedy = bool((row_logprobs.argmax(dim=-1) == target).all())
        results.append((total, greedy))
    return results


def _right_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows -> (ids (B, width), mask (B, width)), padded on the right; rows may be empty."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask
