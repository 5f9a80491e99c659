"""A ready-made ``eval_fn``: mean validation NTP loss at given pass counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fullband.model import FeedbackLM, ntp_loss
from fullband.training.objective import document_plan

BatchFn = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]


def loss_eval(
    batch_fn: BatchFn, num_batches: int, passes: Sequence[int] = (1,), *, plain_prefix: int = 1,
    rank: int = 0, world_size: int = 1, separator: int | None = None,
) -> Callable[[FeedbackLM, int], dict[str, float]]:
    """An eval_fn giving ``val_loss_{k}pass`` = mean NTP loss of the last of ``k`` passes over validation batches
    ``batch_fn(0..num_batches-1)`` (the same batches at every evaluation, so values are comparable).

    ``plain_prefix=1`` fuses every position after the first (Fused(k-1) prefill); no jitter. ``separator``: the
    end-of-text id at which each packed document restarts the recurrence (``train.restart_at_documents``).
    """
    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")

    def evaluate(model: FeedbackLM, step: int) -> dict[str, float]:
        device = next(model.parameters()).device
        sums = dict.fromkeys(passes, 0.0)
        for index in range(num_batches):
            inputs, labels = (t.to(device) for t in batch_fn(index, rank, world_size))
            for k in passes:
                fused = document_plan(inputs, separator) if separator is not None else None
                out = model(inputs, passes=k, plain_prefix=plain_prefix, fused=fused)
                sums[k] += float(ntp_loss(out.logits, labels))
        return {f"val_loss_{k}pass": total / num_batches for k, total in sums.items()}

    return evaluate
