"""Next-token choice from logits: greedy, temperature, top-k, top-p (nucleus).

Greedy or sampled is decided here and nowhere else (:func:`is_greedy`), for every caller: generate and stream,
speculative and looped decoding, and the server's engine. A temperature counts as greedy when it is 0 or below
float32's smallest normal number (:data:`GREEDY_BELOW`, about 1.2e-38): sampling divides the logits by it in float32,
where such a temperature is a subnormal or 0 (a division by 0, a NaN distribution), and the limit of sampling as the
temperature goes to 0 is the argmax. Every larger temperature samples: the logits are shifted so their largest is 0
before the division, so the scaled logits are at most 0 and never overflow (at a temperature near the threshold the
distribution is the argmax's, ties shared).
"""

from __future__ import annotations

import torch

GREEDY_BELOW = torch.finfo(torch.float32).tiny  # 2**-126: a smaller temperature is greedy


def is_greedy(temperature: float) -> bool:
    """Whether ``temperature`` picks the argmax rather than sampling (see the module docstring)."""
    return temperature < GREEDY_BELOW


def sample_next(
    logits: torch.Tensor,  # (B, V)
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token ids (B,): the argmax when :func:`is_greedy` (``temperature``), else a draw from the filtered softmax."""
    if is_greedy(temperature):
        return logits.argmax(dim=-1)
    probs = token_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def token_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution (B, V) :func:`sample_next` draws from at a temperature that is not greedy (speculative
    decoding's rejection rule compares the target's and the drafter's)."""
    logits = logits.float()
    # Largest logit 0 first: (l - max) / T <= 0 never overflows, however small T is (softmax shifts the same way).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
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
