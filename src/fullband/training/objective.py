"""The scheduled multi-pass objective (DESIGN.md §3): one object, :class:`MultiPassObjective`, that drives the model's
forward one pass at a time. The trainer, the studies and the retrofit's training all use it, so what a step computes
is decided in one place.

    L = NTP(pass 1) + λ · mean_{k=2..K} NTP(pass k)  [+ z_loss · mean(logsumexp(logits)^2)]

The model's forward is the network's (tokens, padding, cache, carried state, the pass plan); everything that makes a
training step is here: the labels, λ (``feedback_weight``), jitter on the carried states before they are fused,
``detach_passes``, the truncated gradient with its sequential fixed point, the passes a step really runs, and the
z-loss. Each pass is one forward that continues the Jacobi iteration from the states the objective hands it
(``carried_state`` (B, T, D): the previous pass's states shifted by one, jittered) and from pass 1's target stream
(the blocks below the feedback target run once per step).

Prefix mixin: each row gets its own plain prefix p ~ Uniform{1, ..., T-1}: positions 1..p keep plain
embeddings in every pass (the prompt of Soft decoding), positions p+1..T are fused. p = T is left out
because a fully plain row makes every later pass repeat pass 1 and so carries no feedback signal; p = 1
(everything after the first token fused, as in Fused/Exact prefill) is one of the T-1 equally likely
values. Drawn from a CPU ``torch.Generator`` so the draw does not depend on the device and can be
checkpointed. A packed row may also restart the recurrence at each document (``fused``: a plan that keeps every
document's first token plain, :func:`document_plan`).

Truncated gradient (``grad_passes`` m > 0, ours): pass 1 and the last m passes run with gradients and are scored,
the passes between run without (a forward without autograd costs about a third of one with its backward), so a
deep iteration that reaches the recurrence's fixed point trains at a fraction of full backpropagation's cost.
Passes past the exact count (the fused positions of the plan, plus one) cannot change any state, so a multi-pass
batch runs at most that many; when it reaches that count with one plan for every row and pass, the last m passes
start from the fixed point, computed sequentially (off for a looped model, which has none). Jitter applies to every
pass after the first (the studies that trained the committed recurrent reports set ``jitter=0``, as those were
trained).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fullband.model import IGNORE_INDEX, FeedbackLM, exact_passes, fused_positions, ntp_loss
from fullband.model.kv_cache import KVCache, PrefixKV
from fullband.model.recurrence import LMOutput, PlainPrefix, shifted_states
from fullband.training.sections import OptimConfig, TrainConfig


def sample_plain_prefix(batch_size: int, seq_len: int, generator: torch.Generator | None) -> torch.Tensor:
    """(batch_size,) int64 plain-prefix lengths, uniform in [1, seq_len - 1] (1 when seq_len < 2)."""
    high = max(2, seq_len)  # randint's upper bound is exclusive
    return torch.randint(1, high, (batch_size,), generator=generator, dtype=torch.long)


def document_plan(tokens: torch.Tensor, separator: int) -> torch.Tensor:
    """(B, T) bool: the plan of packed rows that restarts the recurrence at each document: every position but a
    document's first token (the token after a ``separator``, the tokenizer's end-of-text) may be fused."""
    starts = torch.zeros_like(tokens, dtype=torch.bool)
    starts[:, 1:] = tokens[:, :-1] == separator
    return ~starts


def z_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """mean(logsumexp(logits)^2) over the positions that predict a label (PaLM's z-loss).

    Keeps the softmax normaliser near 1 so bf16 logits do not drift; computed in float32.
    """
    lse = torch.logsumexp(logits[:, :-1].float(), dim=-1)  # (B, T-1), position t predicts label t+1
    valid = labels[:, 1:] != IGNORE_INDEX
    return (lse.square() * valid).sum() / valid.sum().clamp(min=1)


def first_grad_pass(passes: int, grad_passes: int) -> int:
    """The first pass after pass 1 that runs with gradients: ``passes - grad_passes + 1``, or 2 when all do."""
    return max(2, passes - grad_passes + 1) if grad_passes > 0 else 2


@dataclass
class ObjectiveOutput:
    """One batch's objective: the loss to backpropagate and what the trainer logs."""

    loss: torch.Tensor  # 0-d: NTP(pass 1) + λ · mean of the other scored passes' NTP (+ the z-loss term)
    pass_losses: list[torch.Tensor]  # the NTP loss of each scored pass (pass 1 and the passes with gradients)
    logits: torch.Tensor  # (B, T, V) of the last pass
    passes: int  # passes run (the baseline runs 1 whatever was asked)
    tokens: int  # input tokens of the batch
    z_loss: torch.Tensor | None = None  # the z-loss (unweighted) when it applied

    def metrics(self) -> dict[str, Any]:
        """Detached tensors and ints (no host sync): what a training step logs."""
        metrics: dict[str, Any] = {
            "pass_losses": [p.detach() for p in self.pass_losses],
            "passes": self.passes,
            "tokens": self.tokens,
            "token_equiv_compute": self.tokens * self.passes,
        }
        if self.z_loss is not None:
            metrics["z_loss"] = self.z_loss.detach()
        # What is backpropagated (the multi-pass objective, plus the z-loss term when on): about passes x the next-token
        # loss, so it is logged as "objective", never as a loss; pass_losses holds each pass's next-token loss.
        metrics["objective"] = self.loss.detach()
        return metrics


@dataclass(frozen=True)
class MultiPassObjective:
    """The multi-pass objective of DESIGN.md §3 (see the module docstring); call it on a model and a batch."""

    feedback_weight: float = 1.0  # λ, the weight of the mean of the later passes' losses
    jitter: float = 0.0  # Uniform(-jitter, jitter) noise on the carried states before they are fused
    detach_passes: bool = False  # no gradient through the states carried from one pass to the next
    grad_passes: int = 0  # m > 0: truncated gradients, pass 1 and the last m passes only
    z_loss: float = 0.0  # weight of the z-loss on the last pass's logits
    z_loss_when: str = "always"  # always, cooldown (only when the caller says the run is cooling down), off
    # Passes >= 2 run only the positions after a plain prefix shared by every row, attending to pass 1's keys and
    # values of the prefix (whose states no pass changes): the same objective and gradients to float rounding, the
    # prefix's share of each pass saved. For batches that start with a long plain prefix (the recall study's
    # tables); off by default, so a trained model's numbers do not move.
    reuse_prefix: bool = False

    @classmethod
    def of(cls, train: TrainConfig, optim: OptimConfig | None = None) -> MultiPassObjective:
        """The objective ``fullband train`` runs: [train]'s λ, jitter, detach and truncation, [optim]'s z-loss."""
        z = dict(z_loss=optim.z_loss, z_loss_when=optim.z_loss_when) if optim is not None else {}
        return cls(feedback_weight=train.feedback_weight, jitter=train.jitter, detach_passes=train.detach_passes,
                   grad_passes=train.grad_passes, **z)

    # ------------------------------------------------------------------ what a step runs

    def step_passes(self, passes: int, T: int, plain_prefix: PlainPrefix = 1,
                    fused: torch.Tensor | None = None) -> tuple[int, bool | None]:
        """The passes a batch of length ``T`` with this plan runs when ``passes`` are asked, and whether its gradient
        passes start from the fixed point (None: no truncation, every pass with gradients).

        With truncated gradients a batch runs at most its exact count (later passes cannot change a state), and
        starts the passes with gradients from the recurrence's fixed point when the passes reach that count, some
        run without gradients, and one plan holds for every row and pass (a prefix per row or per pass, (B,) with
        several values or (K, B), or a plan per pass, has no single sequential fixed point). Data-parallel training
        decides this on a step's global batch, so that every process runs what one process would."""
        if self.grad_passes == 0 or passes == 1:
            return passes, None
        rows = plain_prefix.shape[-1] if isinstance(plain_prefix, torch.Tensor) else (
            fused.shape[-2] if fused is not None else 1)
        plan = fused_positions(plain_prefix, rows, T, 0, torch.device("cpu"),
                               fused.cpu() if fused is not None else None)
        passes = min(passes, exact_passes(plan, has_incoming=False))
        one_plan = plan.dim() == 2 and (not isinstance(plain_prefix, torch.Tensor) or (
            plain_prefix.dim() == 1 and plain_prefix.unique().numel() == 1))
        return passes, passes == exact_passes(plan, False) and first_grad_pass(passes, self.grad_passes) > 2 \
            and one_plan

    def z_loss_weight(self, cooldown: bool = False) -> float:
        """The z-loss weight of a step (``cooldown``: whether the learning rate is cooling down)."""
        on = self.z_loss_when == "always" or (self.z_loss_when == "cooldown" and cooldown)
        return self.z_loss if on else 0.0

    # ------------------------------------------------------------------ one batch

    def __call__(
        self,
        model: FeedbackLM,
        tokens: torch.Tensor,  # (B, T) token ids
        labels: torch.Tensor,  # (B, T) aligned with tokens, shifted here; -100 = ignore
        passes: int = 1,
        plain_prefix: PlainPrefix = 1,  # int, (B,) or (passes, B)
        *,
        fused: torch.Tensor | None = None,  # (B, T) or (passes, B, T) bool: which positions may receive feedback
        attention_mask: torch.Tensor | None = None,
        fixed_point: bool | None = None,  # decided for a larger batch (step_passes); None: decided for these rows
        cooldown: bool = False,  # the run's learning rate is cooling down (z_loss_when="cooldown")
    ) -> ObjectiveOutput:
        """The objective of one batch, every pass one forward of ``model`` (which may be wrapped by FSDP: only its
        forward and ``forward_exact`` are called)."""
        if fixed_point is None:
            passes, fixed_point = self.step_passes(passes, tokens.shape[1], plain_prefix, fused)
        first_grad = first_grad_pass(passes, self.grad_passes)
        shift = model.feedback_shift
        # Where the passes reach the exact count, the sequential fixed point stands in for the passes without
        # gradients (a shift-0 model has none; nothing to stand in for when every pass has gradients).
        restart = bool(fixed_point) and shift == 1 and first_grad > 2

        def plan_of(k: int) -> dict[str, Any]:  # the plan of pass k, in the forward's arguments
            prefix = plain_prefix[min(k, len(plain_prefix)) - 1] if _per_pass(plain_prefix) else plain_prefix
            plan = fused[min(k, len(fused)) - 1] if fused is not None and fused.dim() == 3 else fused
            return {"plain_prefix": prefix, "fused": plan, "attention_mask": attention_mask}

        P = plain_prefix if self._reuses_prefix(model, tokens, plain_prefix, fused, attention_mask) else 0
        record = PrefixKV(*tokens.shape, tokens.device) if P else None
        out = model(tokens, cache=record, **plan_of(1))  # pass 1: plain, with gradients
        prefix = record.prefix(P) if record is not None else None  # what every later pass reads
        scored = [out]
        first = out
        stream, hidden = out.target_stream, out.hidden
        k = 2
        if restart and passes > 1 and model.fuse is not None:
            with torch.no_grad():
                hidden = model.forward_exact(tokens, method="sequential", target_stream=stream.detach(),
                                             **plan_of(1)).hidden
            k = first_grad
        while k <= passes and model.fuse is not None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and k >= first_grad):
                # At target 0 the stream is the embedding, a lookup: each pass after the fixed point embeds afresh,
                # as the committed recurrent reports were trained (a shared one would sum the passes' gradients in
                # another order); above it the blocks below the target run once per step.
                again = None if restart and model.feedback_target == 0 else stream
                keep = 0 if k >= first_grad else 1
                if prefix is not None:
                    out = self._after_prefix(model, tokens, prefix, first, hidden, again, keep, shift)
                else:
                    out = model(tokens, carried_state=self._carried(hidden, shift), target_stream=again,
                                logits_to_keep=keep, **plan_of(k))
            if k >= first_grad:
                scored.append(out)
            hidden = out.hidden
            k += 1
        pass_losses = [ntp_loss(o.logits, labels) for o in scored]
        loss = pass_losses[0]
        if len(pass_losses) > 1:
            loss = loss + self.feedback_weight * torch.stack(pass_losses[1:]).mean()
        weight = self.z_loss_weight(cooldown)
        z = z_loss(out.logits, labels) if weight > 0 else None
        if z is not None:
            loss = loss + weight * z
        return ObjectiveOutput(loss, pass_losses, out.logits, k - 1 if model.fuse is not None else 1,
                               tokens.numel(), z)

    def _reuses_prefix(self, model: FeedbackLM, tokens: torch.Tensor, plain_prefix: PlainPrefix,
                       fused: torch.Tensor | None, attention_mask: torch.Tensor | None) -> bool:
        """Whether this batch's passes reuse pass 1's prefix (``reuse_prefix``): one plain prefix P > 1 for every row
        and pass, no padding, the native network's cache, the recurrence along positions, and plain positions fed the
        same in every pass (not the paper's literal input form, which normalises them from pass 2 on)."""
        return (self.reuse_prefix and isinstance(plain_prefix, int) and 1 < plain_prefix < tokens.shape[1]
                and fused is None and attention_mask is None and model.fuse is not None
                and model.feedback_shift == 1 and model.plain_input is None and model.cache_type is KVCache)

    def _after_prefix(self, model: FeedbackLM, tokens: torch.Tensor, prefix: PrefixKV, first: LMOutput,
                      hidden: torch.Tensor, stream: torch.Tensor | None, keep: int, shift: int) -> LMOutput:
        """A pass over positions P.. only, attending to pass 1's keys and values of the plain prefix; its logits and
        states over the whole sequence. The prefix's are pass 1's, which no pass changes: the same values, and in a
        pass with gradients the same gradient paths as the prefix a whole pass would compute again."""
        P = prefix.length
        part = model(tokens[:, P:], plain_prefix=P, cache=prefix,
                     carried_state=self._carried(hidden, shift)[:, P:],
                     target_stream=stream[:, P:] if stream is not None else None, logits_to_keep=keep)
        logits = part.logits if keep else torch.cat((first.logits[:, :P], part.logits), 1)
        return LMOutput(logits=logits, hidden=torch.cat((first.hidden[:, :P], part.hidden), 1), passes=1)

    def _carried(self, states: torch.Tensor, shift: int) -> torch.Tensor:
        """(B, T, D) what the next pass fuses into each position: the states h^(k-1) shifted by one (a position's own
        with ``shift`` 0), detached with ``detach_passes``, jittered."""
        states = states.detach() if self.detach_passes else states
        if shift == 1:
            states = shifted_states(states)
        if self.jitter > 0:  # training-time robustness noise on the states about to be fused
            states = states + torch.empty_like(states).uniform_(-self.jitter, self.jitter)
        return states


def _per_pass(plain_prefix: PlainPrefix) -> bool:
    return isinstance(plain_prefix, torch.Tensor) and plain_prefix.dim() == 2


class BoundObjective(nn.Module):
    """An objective bound to its model as one module: what data-parallel training wraps, so DDP sees one forward per
    micro-batch whatever the passes; returns (loss, metrics). Its parameters are the model's."""

    def __init__(self, model: FeedbackLM, objective: MultiPassObjective) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        out = self.objective(self.model, *args, **kwargs)
        return out.loss, out.metrics()
