"""AdamW with decoupled weight decay on weight matrices, and the learning-rate schedules.

Weight decay follows nanoGPT: every parameter with >= 2 dimensions decays (attention/MLP matrices, the
fusion's W_U/W_G, and the token embedding, which is also the output head when tied); 1-D parameters
(RMSNorm gains, biases) do not, since shrinking a gain towards 0 changes the function rather than
regularising it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fullband.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``decay`` (>= 2-D weights) and ``no_decay`` (1-D); tied weights appear once."""
    decay, no_decay = [], []
    for _, param in model.named_parameters():  # named_parameters() yields a shared (tied) tensor once
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`; the fused kernel when every parameter is on CUDA, else foreach."""
    groups = param_groups(model, cfg.weight_decay)
    on_cuda = all(p.is_cuda for g in groups for p in g["params"])
    kernel = {"fused": True} if on_cuda else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kernel)


def decay_start(cfg: OptimConfig, total_steps: int) -> int:
    """First step of the cool-down: the last ``decay_fraction`` of the run (never inside warmup)."""
    return max(cfg.warmup_steps, total_steps - round(cfg.decay_fraction * total_steps))


def in_cooldown(step: int, cfg: OptimConfig, total_steps: int) -> bool:
    return step >= decay_start(cfg, total_steps)


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate of 0-based ``step``: linear warmup, then cosine / WSD / constant to the last step."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps  # step 0 gets a small non-zero lr, not 0 (a wasted step)
    last = total_steps - 1
    if cfg.schedule == "constant":
        return peak
    if cfg.schedule == "cosine":
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, last - cfg.warmup_steps))
        return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)
    # wsd: stable at peak, then linear to floor, reaching it exactly at the last step.
    start = decay_start(cfg, total_steps)
    if step < start:
        return peak
    progress = min(1.0, (step - start + 1) / max(1, last - start + 1))
    return peak + progress * (floor - peak)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
