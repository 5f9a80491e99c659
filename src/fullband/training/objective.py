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
so a multi-pass batch runs at most that many.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fullband.model import IGNORE_INDEX, LMOutput, exact_pass_count
from fullband.model.recurrence import ntp_loss
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
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Loss to backpropagate and its metrics (detached tensors and ints; no host sync here).

    ``model`` may be wrapped (DDP): only its forward is called. z-loss uses the last pass's
    logits, the only ones the forward returns (the model computes each pass's NTP loss internally).
    """
    B, T = inputs.shape
    if plain_prefix is None:
        plain_prefix = sample_plain_prefix(B, T, generator) if cfg.prefix_mixin else torch.ones(B, dtype=torch.long)
    if cfg.grad_passes > 0 and passes > 1:
        out = truncated_passes(model, inputs, labels, passes, plain_prefix.to(inputs.device), cfg)
    else:
        out = model(
            inputs,
            passes=passes,
            plain_prefix=plain_prefix.to(inputs.device),
            labels=labels,
            jitter=cfg.jitter,
            detach_passes=cfg.detach_passes,
            feedback_weight=cfg.feedback_weight,
        )
    loss = out.loss
    metrics: dict[str, Any] = {
        "ntp_loss": out.loss.detach(),
        "pass_losses": [p.detach() for p in out.pass_losses],
        "passes": out.passes,  # the baseline runs 1 whatever was asked
        "tokens": inputs.numel(),
        "token_equiv_compute": inputs.numel() * out.passes,
    }
    if z_loss_weight > 0:
        z = z_loss(out.logits, labels)
        loss = loss + z_loss_weight * z
        metrics["z_loss"] = z.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


def truncated_passes(
    model: nn.Module,
    inputs: torch.Tensor,  # (B, T)
    labels: torch.Tensor,  # (B, T)
    passes: int,
    plain_prefix: torch.Tensor,  # (B,) or (passes, B)
    cfg: TrainConfig,
) -> LMOutput:
    """The multi-pass loss with gradients through pass 1 and the last ``cfg.grad_passes`` passes only.

    L = NTP(pass 1) + λ · mean over the last m passes of NTP(pass k); the passes between run under no_grad, so
    the last m passes start from the previous pass's states as constants. When the passes without gradients
    reach the exact count, their states are the recurrence's fixed point, which the model's sequential
    ``forward_exact`` computes several times faster on a CPU than whole-sequence passes (one position at a time
    through the KV cache; the same states, as the recurrence tests show); then the last m passes start from
    exactly what exact mode runs. No jitter here: the pass loop is driven pass by pass (``iterate_passes``),
    which takes none. One process only: driving the loop bypasses a DDP/FSDP wrapper's forward, and with it the
    gradient synchronisation.
    """
    if hasattr(model, "module") or (torch.distributed.is_available() and torch.distributed.is_initialized()
                                    and torch.distributed.get_world_size() > 1):
        raise ValueError("train.grad_passes > 0 runs in one process only (it drives the model's pass loop itself)")
    B, T = inputs.shape
    exact = exact_pass_count(plain_prefix, T, 0, False)
    passes = min(passes, exact)
    first_grad = max(2, passes - cfg.grad_passes + 1)  # passes first_grad..passes run with gradients
    prefixes = plain_prefix.unique() if plain_prefix.dim() == 1 else plain_prefix
    recurrent = getattr(model, "feedback_shift", 1) == 1  # a looped model has no sequential fixed point
    if model.fuse is not None and recurrent and passes == exact and first_grad > 2 and prefixes.numel() == 1:
        # Pass 1 with gradients, the fixed point without (sequentially), then the last m passes from it.
        first = model.iterate_passes(inputs, 1, plain_prefix)
        step = next(first)
        pass_losses = [ntp_loss(model.lm_head(step.head_input), labels)]
        prefix = int(prefixes.item())
        with torch.no_grad():
            previous = model.forward_exact(inputs, plain_prefix=prefix, method="sequential").hidden  # (B, T, D)
        positions = torch.arange(T, device=inputs.device).expand(B, T)
        for _ in range(first_grad, passes + 1):
            previous, head_input = model.run_stack(model.stack_inputs(inputs, previous, prefix), positions)
            logits = model.lm_head(head_input)  # (B, T, V)
            pass_losses.append(ntp_loss(logits, labels))
        loss = pass_losses[0] + cfg.feedback_weight * torch.stack(pass_losses[1:]).mean()
        return LMOutput(logits=logits, hidden=previous, loss=loss, pass_losses=pass_losses, passes=passes)
    pass_losses: list[torch.Tensor] = []
    steps = model.iterate_passes(inputs, passes, plain_prefix)
    for k in range(1, passes + 1):
        grad = k == 1 or k >= first_grad
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            step = next(steps, None)
            if step is None:  # a model without feedback runs one pass
                break
            last = step
            if grad:
                logits = model.lm_head(step.head_input)  # (B, T, V)
                pass_losses.append(ntp_loss(logits, labels))
    loss = pass_losses[0]
    if len(pass_losses) > 1:
        loss = loss + cfg.feedback_weight * torch.stack(pass_losses[1:]).mean()
    return LMOutput(logits=logits, hidden=last.hidden, loss=loss, pass_losses=pass_losses, passes=last.k)
