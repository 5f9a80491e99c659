"""Decoding a looped model (``feedback_shift=0``, the control of DESIGN.md §7).

A looped model feeds position t its *own* state from the previous pass, so no state moves along the sequence:
there is no recurrence for a KV cache and a carried state to continue. Each generated token therefore reruns the
K-pass forward over the whole sequence (prompt + tokens so far) and reads the last position's logits. That costs
K whole-sequence passes per token, which is fine for the short completions it is used for (answer-only
reasoning: 2-3 tokens).

- ``standard``: one plain pass, the ordinary transformer (the usual cached path, nothing looped about it);
- ``fused:k``: ``1 + k`` passes;
- ``exact``: as many passes as the full-bandwidth model's Jacobi iteration needs for the sequence (T - p + 1), the
  count a looped model trained with ``passes >= T`` ran;
- ``soft`` and speculative decoding need the carried state, so they are refused.

Which modes a looped model takes follows from their prefill (:func:`looped_takes`), not from their names: it runs the
same passes at every position, so a mode whose prompt and generated tokens get the same passes has a looped form
(no state carried: one plain pass; ``k`` passes; exact), and one with a plain prompt but fused generated tokens
(soft) has none.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from fullband.generation.sampling import sample_next
from fullband.model import FeedbackLM, exact_pass_count
from fullband.modes import REGISTRY, DecodeOptions, DecodingMode, prefill_of


def looped_takes(mode: DecodingMode) -> bool:
    """Whether a looped model can decode ``mode``: its prefill runs as many passes over the generated tokens as over
    the prompt (a plain prompt whose state is carried into fused decoding does not)."""
    plan = prefill_of(mode)
    return plan.exact or not plan.carries or plan.passes > 1 or mode.spec.takes_passes


def is_looped(model: FeedbackLM) -> bool:
    """Whether ``model`` feeds states back at the same position (and so cannot decode through the recurrence)."""
    return model.fuse is not None and model.feedback_shift == 0


def check_looped_options(mode: DecodingMode, speculative: object | None) -> None:
    if not looped_takes(mode):
        takes = [s.spelling for s in REGISTRY.values() if looped_takes(DecodingMode(s.name))]
        raise ValueError(f"mode={mode.name!r} is not available for a looped model (feedback_shift=0): it needs the "
                         f"state carried along the sequence, which a looped model does not have; use one of "
                         f"{', '.join(takes)}")
    if speculative is not None:
        raise ValueError("speculative decoding is not available for a looped model (feedback_shift=0): its "
                         "verification needs the recurrence along the sequence")


def looped_passes(mode: DecodingMode, T: int) -> int:
    """Passes each forward of a looped model runs in ``mode`` over a sequence of ``T`` tokens (plain prefix 1): its
    prefill's, and for exact the count the full-bandwidth model's Jacobi iteration needs."""
    plan = prefill_of(mode)
    return exact_pass_count(1, T, 0, False) if plan.exact else plan.passes


@torch.no_grad()
def looped_stream(
    model: FeedbackLM,
    ids: torch.Tensor,  # (B, T) left-padded prompts
    mask: torch.Tensor,  # (B, T)
    max_new_tokens: int,
    options: DecodeOptions,
    generator: torch.Generator | None,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row (B,) at each step, rerunning the looped forward over the whole sequence."""
    if ids.shape[1] + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"prompt ({ids.shape[1]} tokens, padded) + max_new_tokens = {ids.shape[1] + max_new_tokens} "
                         f"exceeds the model context max_seq_len={model.config.max_seq_len}")
    mode = options.decoding_mode
    stops = torch.tensor(options.stop_token_ids, dtype=torch.long, device=ids.device)
    pad = options.pad_token_id if options.pad_token_id is not None else (int(stops[0]) if len(stops) else 0)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    # With left padding, a row's first real token is the one that stays plain (p = 1 in that row).
    first_real = (mask.shape[1] - mask.sum(dim=1)).to(ids.device)
    for _ in range(max_new_tokens):
        # the pass count follows the real tokens of the longest row (the count a sequence of that length needs)
        passes = looped_passes(mode, int(mask.sum(dim=1).max()))
        logits = model(ids, passes=passes, plain_prefix=first_real + 1, attention_mask=mask, logits_to_keep=1).logits
        token = sample_next(logits[:, -1], options.temperature, options.top_k, options.top_p, generator)
        token = torch.where(finished, torch.full_like(token, pad), token)
        yield token
        finished |= torch.isin(token, stops)
        if bool(finished.all()):
            return
        ids = torch.cat((ids, token[:, None]), dim=1)
        mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)
