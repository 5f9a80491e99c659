"""Every pass's states and logits from one run of the model's pass loop over fixed windows.

:meth:`fullband.model.feedback.FeedbackLM.iterate_passes` is the forward's own loop, yielding after each pass, so a
caller can score pass 1, 2, ..., N from a single N-pass run instead of N separate forwards from scratch (which would
cost N(N+1)/2 passes); pass ``k`` here is bit for bit ``model(tokens, passes=k, plain_prefix=plain_prefix)``
(tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from fullband.model import FeedbackLM


@dataclass
class PassStep:
    passes: int  # k: passes run so far (1 = the plain pass = standard mode; k = fused prefill with k-1 extra)
    hidden: torch.Tensor  # (B, T, D) carried states h^(k)
    previous: torch.Tensor | None  # (B, T, D) h^(k-1); None after pass 1
    head: Callable[[], torch.Tensor]  # () -> pass k's logits (B, T, V)
    _logits: torch.Tensor | None = None

    @property
    def logits(self) -> torch.Tensor:
        """(B, T, V) of pass k, computed when first read: a caller scoring some passes only (fused(1), fused(2),
        fused(4) of a 5-pass loop) skips the head of the others."""
        if self._logits is None:
            self._logits = self.head()
        return self._logits


@torch.no_grad()
def iterate_passes(model: FeedbackLM, tokens: torch.Tensor, max_passes: int,
                   plain_prefix: int = 1) -> Iterator[PassStep]:
    """Yield after each of up to ``max_passes`` passes over ``tokens`` (B, T); positions < plain_prefix stay plain.

    A model without feedback yields pass 1 only: every further pass would repeat it exactly.
    """
    if max_passes < 1:
        raise ValueError(f"max_passes must be >= 1, got {max_passes}")
    T = tokens.shape[1]
    if model.config.max_seq_len < T:
        raise ValueError(f"windows of {T} tokens exceed the model's max_seq_len={model.config.max_seq_len}")
    for step in model.iterate_passes(tokens, max_passes, plain_prefix):
        yield PassStep(step.k, step.hidden, step.previous, lambda step=step: model.lm_head(step.head_input))


def token_nll_sum(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    """Summed next-token cross-entropy (nats) of logits (B, T, V) on tokens (B, T): B*(T-1) predictions."""
    logits = logits[:, :-1].flatten(0, 1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return float(torch.nn.functional.cross_entropy(logits, tokens[:, 1:].flatten(), reduction="sum"))
