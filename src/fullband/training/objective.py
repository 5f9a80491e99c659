"""The scheduled multi-pass objective (DESIGN.md §3), computed by the model's one forward.

    L = NTP(pass 1) + λ · mean_{k=2..K} NTP(pass k)  [+ z_loss · mean(logsumexp(logits)^2)]

Prefix mixin: each row gets its own plain prefix p ~ Uniform{1, ..., T-1}: positions 1..p keep plain
embeddings in every pass (the prompt of Soft decoding), positions p+1..T are fused. p = T is left out
because a fully plain row makes every later pass repeat pass 1 and so carries no feedback signal; p = 1
(everything after the first token fused, as in Fused/Exact prefill) is one of the T-1 equally likely
values. Drawn from a CPU ``torch.Generator`` so the draw does not depend on the device and can be
checkpointed.

Truncated gradient (``grad_passes`` m > 0, ours): pass 1 and the last m passes run with gradients and are scored,
the passes between run without (a forward without autograd costs about a third of one with its backward), so a
deep iteration that reaches the recurrence's fixed point trains at a fraction of full backpropagation's cost.
Passes past the exact count (the row length less the smallest plain prefix, plus one) cannot change any state,
so a multi-pass batch runs at most that many; when it reaches that count with one plain prefix for every row, the
last m passes start from the fixed point, computed sequentially (off for a looped model, which has none). The
model's pass loop does all of it (:func:`fullband.model.recurrence.pass_loop`), jitter included (the studies that
trained the committed recurrent reports set ``jitter=0``, as those were trained).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fullband.model import IGNORE_INDEX
from fullband.training.config import TrainConfig


def sample_plain_prefix(batch_size: int, seq_len: int, generator: torch.Generator | None) -> torch.Tensor:
    """(batch_size,) int64 plain-prefix lengths, uniform in [1, seq_len - 1] (1 when seq_len < 2)."""
    high = max(2, seq_len)  # randint's upper bound is exclusive
    return torch.randint(1, high, (batch_size,), generator=generator, dtype=torch.long)


def z_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """mean(logsumexp(logits)^2) over the positions that predict a label (PaLM's z-loss).

    Keeps the softmax normaliser near 1 so bf16 logits do not drift; computed in float32.
    """
    lse = torch.logsumexp(logits[:, :-1].float(), dim=-1)  # (B, T-1), position t predicts label t+1
    valid = labels[:, 1:] != IGNORE_INDEX
    return (lse.square() * valid).sum() / valid.sum().clamp(min=1)


def multipass_loss(
    model: nn.Module,
    inputs: torch.Tensor,  # (B, T) token ids
    labels: torch.Tensor,  # (B, T) aligned with inputs, shifted inside the model; -100 = ignore
    passes: int,
    cfg: TrainConfig,
    generator: torch.Generator | None,
    *,
    z_loss_weight: float = 0.0,
    plain_prefix: torch.Tensor | None = None,  # (B,) or (passes, B) to use instead of drawing from ``generator``
    fixed_point: bool | None = None,  # with grad_passes: decided for the global batch (None: for these rows)
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Loss to backpropagate and its metrics (detached tensors and ints; no host sync here).

    ``model`` may be wrapped (DDP, FSDP): only its forward is called. z-loss uses the last pass's
    logits, the only ones the forward returns (the model computes each pass's NTP loss internally).
    """
    B, T = inputs.shape
    if plain_prefix is None:
        plain_prefix = sample_plain_prefix(B, T, generator) if cfg.prefix_mixin else torch.ones(B, dtype=torch.long)
    out = model(
        inputs,
        passes=passes,
        plain_prefix=plain_prefix.to(inputs.device),
        labels=labels,
        jitter=cfg.jitter,
        detach_passes=cfg.detach_passes,
        feedback_weight=cfg.feedback_weight,
        grad_passes=cfg.grad_passes,
        fixed_point=fixed_point,
    )
    loss = out.loss
    metrics: dict[str, Any] = {
        "pass_losses": [p.detach() for p in out.pass_losses],
        "passes": out.passes,  # the baseline runs 1 whatever was asked
        "tokens": inputs.numel(),
        "token_equiv_compute": inputs.numel() * out.passes,
    }
    if z_loss_weight > 0:
        z = z_loss(out.logits, labels)
        loss = loss + z_loss_weight * z
        metrics["z_loss"] = z.detach()
    # What is backpropagated (the multi-pass objective, plus the z-loss term when on): about passes x the next-token
    # loss, so it is logged as "objective", never as a loss; pass_losses holds each pass's next-token loss.
    metrics["objective"] = loss.detach()
    return loss, metrics
