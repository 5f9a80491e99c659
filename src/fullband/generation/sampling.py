"""Next-token choice from logits: greedy, temperature, top-k, top-p (nucleus)."""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor,  # (B, V)
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token ids (B,): argmax when ``temperature == 0``, else a draw from the filtered softmax."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = token_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def token_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution (B, V) :func:`sample_next` draws from at ``temperature > 0`` (speculative decoding's
    rejection rule compares the target's and the drafter's)."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p (the top token always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        # Said outright: a top_p below float32's range (1e-93) compares as 0 >= 0, which would drop every token.
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)
