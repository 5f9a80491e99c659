"""Optimisers (AdamW, or Muon / NorMuon on hidden matrices with AdamW on the rest) and the learning-rate schedules.

AdamW's weight decay follows nanoGPT: every parameter with >= 2 dimensions decays (attention/MLP matrices, the
fusion's W_U/W_G, and the token embedding, which is also the output head when tied); 1-D parameters (RMSNorm
gains, biases) do not, since shrinking a gain towards 0 changes the function rather than regularising it.

``optimizer="muon"`` is the paper's split (§4): Muon (``torch.optim.Muon``'s orthogonalised momentum, scale-free
updates; :mod:`.muon`) on the hidden matrices ``muon_params`` names, at ``muon_lr`` with ``muon_weight_decay``;
AdamW at ``lr`` on everything else (embedding/head, norms). Its entries ``blocks`` and ``fusion`` (the default)
are parameter roles the model's family reports (``parameter_roles``: the 2-D matrices of its blocks and of its
fusion, whatever their names), so every family trains with Muon as it is; any other entry is a prefix of
parameter names. The fusion's parameters (``fusion_lr_mult``) are the ones the family reports as the fusion's.
``optimizer="normuon"`` puts NorMuon, the paper's optimiser, in Muon's place. Every group carries an ``lr_scale``
(its peak LR over ``lr``, times ``fusion_lr_mult`` for the fusion), so one schedule drives them all. The
orthogonalisation's dtype is resolved once here (:func:`ns_dtype_for`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any

import torch
from torch import nn

from fullband.config import ConfigError
from fullband.devices import cpu_flags
from fullband.model.family import ParamRole
from fullband.training.config import OptimConfig
from fullband.training.muon import Muon, NorMuon, resolve_ns_dtype

# The muon_params entries that name parameter roles rather than name prefixes.
MUON_ROLES = {"blocks": ParamRole.BLOCK_MATRIX, "fusion": ParamRole.FUSION_MATRIX}
FUSION_ROLES = (ParamRole.FUSION_MATRIX, ParamRole.FUSION)


def fusion_names(model: nn.Module) -> set[str]:
    """Names of the parameters the model's family reports as the fusion's."""
    return {name for name, role in model.parameter_roles().items() if role in FUSION_ROLES}


def param_groups(named_params: Iterable[tuple[str, nn.Parameter]], weight_decay: float,
                 fusion_lr_mult: float = 1.0, fusion: Collection[str] = ()) -> list[dict]:
    """AdamW groups: ``decay`` (>= 2-D weights) and ``no_decay`` (1-D), the fusion's (names in ``fusion``, see
    :func:`fusion_names`) apart when its LR differs.

    Pass ``model.named_parameters()``, which yields a shared (tied) tensor once. Empty groups are dropped.
    """
    groups: dict[str, dict[str, Any]] = {}
    in_fusion = set(fusion)
    for name, param in named_params:
        if not param.requires_grad:
            continue
        decays = param.dim() >= 2
        fusion_param = fusion_lr_mult != 1.0 and name in in_fusion
        key = ("decay" if decays else "no_decay") + ("_fusion" if fusion_param else "")
        group = groups.setdefault(key, {"params": [], "weight_decay": weight_decay if decays else 0.0, "name": key,
                                        "lr_scale": fusion_lr_mult if fusion_param else 1.0})
        group["params"].append(param)
    return [groups[k] for k in ("decay", "no_decay", "decay_fusion", "no_decay_fusion") if k in groups]


def muon_split(model: nn.Module, prefixes: tuple[str, ...]) -> tuple[list[tuple[str, nn.Parameter]], set[int]]:
    """The (name, parameter) pairs Muon updates, in ``named_parameters()`` order within each entry: for the
    entries ``blocks`` and ``fusion`` the parameters of that role (:data:`MUON_ROLES`), for any other entry the
    2-D weights under that module prefix.

    A prefix that names a parameter directly must name a 2-D one, and every prefix must match something:
    otherwise a ConfigError says what to change.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    roles = model.parameter_roles()
    chosen: list[tuple[str, nn.Parameter]] = []
    for prefix in prefixes:
        if prefix in MUON_ROLES:  # a role: whatever the family calls these matrices (none: a baseline's fusion)
            chosen += [(n, p) for n, p in named if roles.get(n) == MUON_ROLES[prefix]]
            continue
        matches = [(n, p) for n, p in named if n == prefix or n.startswith(prefix.rstrip(".") + ".")]
        if not matches and hasattr(model, prefix) and getattr(model, prefix) is None:
            continue  # a module this model leaves out (the baseline's fusion)
        if not matches:
            raise ConfigError(f"optim.muon_params entry {prefix!r} matches no parameter; use module names such as "
                              "'blocks' or 'fusion'")
        flat = [n for n, p in matches if p.dim() != 2]
        if len(flat) == len(matches):
            shape = tuple(matches[0][1].shape)
            raise ConfigError(f"optim.muon_params entry {prefix!r} names only {len(flat)} non-matrix tensor(s) "
                              f"({flat[0]}, shape {shape}): Muon updates 2-D matrices only; leave 1-D gains to AdamW")
        chosen += [(n, p) for n, p in matches if p.dim() == 2]
    ids: set[int] = set()
    unique = []
    for n, p in chosen:
        if id(p) not in ids:
            ids.add(id(p))
            unique.append((n, p))
    return unique, ids


class CombinedOptimizer:
    """Several torch optimisers stepped as one: shared ``param_groups`` view, one state dict."""

    def __init__(self, **optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @property
    def state(self) -> dict:
        return {k: v for opt in self.optimizers.values() for k, v in opt.state.items()}

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state holds {sorted(state)}, expected {sorted(self.optimizers)}: the "
                             "checkpoint was written with another optim.optimizer")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def ns_dtype_for(cfg: OptimConfig, device: torch.device) -> str | None:
    """The Newton-Schulz dtype ``cfg`` gives (Nor)Muon on ``device`` (``ns_dtype`` auto resolved from the device's
    capabilities); None for AdamW."""
    if cfg.optimizer == "adamw":
        return None
    return resolve_ns_dtype(cfg.ns_dtype, device.type, cpu_flags() if device.type == "cpu" else ())


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer | CombinedOptimizer:
    """AdamW over :func:`param_groups`, or (Nor)Muon + AdamW (see the module doc).

    AdamW uses the fused kernel when every parameter is on CUDA, else foreach (:func:`adamw_kernel`).
    """
    kernel = adamw_kernel(model.parameters())
    fusion = fusion_names(model)
    if cfg.optimizer == "adamw":
        groups = param_groups(model.named_parameters(), cfg.weight_decay, cfg.fusion_lr_mult, fusion)
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kernel)
    muon_named, muon_ids = muon_split(model, cfg.muon_params)
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in muon_ids]
    adam = torch.optim.AdamW(param_groups(rest, cfg.weight_decay, cfg.fusion_lr_mult, fusion), lr=cfg.lr,
                             betas=cfg.betas, eps=cfg.eps, **kernel)
    scale = cfg.muon_lr / cfg.lr
    muon_groups = []
    for in_fusion in (False, True):
        params = [p for n, p in muon_named if (n in fusion) == in_fusion]
        if params:
            mult = cfg.fusion_lr_mult if in_fusion else 1.0
            name = "muon_fusion" if in_fusion else "muon"
            muon_groups.append({"params": params, "name": name, "lr_scale": scale * mult})
    ns_dtype = ns_dtype_for(cfg, next(model.parameters()).device)
    common = dict(lr=cfg.muon_lr, weight_decay=cfg.muon_weight_decay, momentum=cfg.muon_momentum, ns_dtype=ns_dtype,
                  ns_steps=cfg.ns_steps, ns_compile=cfg.ns_compile)
    if cfg.optimizer == "normuon":
        return CombinedOptimizer(adamw=adam, normuon=NorMuon(muon_groups, beta2=cfg.normuon_beta2, **common))
    return CombinedOptimizer(adamw=adam, muon=Muon(muon_groups, **common))


def optimizer_ns_dtype(optimizer: torch.optim.Optimizer | CombinedOptimizer) -> str | None:
    """The Newton-Schulz dtype the (Nor)Muon inside ``optimizer`` runs with, None if it has none."""
    parts = optimizer.optimizers.values() if isinstance(optimizer, CombinedOptimizer) else [optimizer]
    return next((part.ns_dtype for part in parts if isinstance(part, Muon)), None)


def adamw_kernel(params: Iterable[nn.Parameter]) -> dict[str, bool]:
    """AdamW's fused kernel when every parameter is on CUDA, else the foreach kernels.

    Not fused on a CPU although torch has it there (on 2 cores 2.8x faster than foreach for a 3.8M-parameter
    model, about 3% of a training step at nanoGPT's CPU config): it rounds differently from foreach (2e-7 after 20
    steps), so every committed study would stop reproducing its numbers bit for bit (docs/LOG.md, 2026-12-03)."""
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return {"fused": True} if fused else {"foreach": True}


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


def set_lr(optimizer: torch.optim.Optimizer | CombinedOptimizer, lr: float) -> None:
    """Set every group to ``lr`` times its ``lr_scale`` (Muon's and the fusion's own peaks)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
