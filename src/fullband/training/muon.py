"""Muon and NorMuon with the Newton-Schulz orthogonalisation's dtype chosen for the machine.

``torch.optim.Muon`` casts every update to bfloat16 before its Newton-Schulz iteration. On a CPU without bf16
instructions (no avx512_bf16 / amx_bf16 flag) those matmuls are emulated: on a 2-core Zen 3 they took 74% of a
training step at the compare default (issue 24). :class:`Muon` here is ``torch.optim.Muon`` (Nesterov momentum,
the quintic coefficients, 5 steps, the ``sqrt(max(1, rows/cols))`` LR adjustment, decoupled weight decay) with the
orthogonalisation's dtype a constructor argument; with bfloat16 its steps equal ``torch.optim.Muon``'s bit for bit
(tests/training/test_muon.py). :func:`resolve_ns_dtype` makes the choice from the device's capabilities, once, when
the optimiser is built.

:class:`NorMuon` (arXiv 2510.05491) adds a per-neuron second moment after the orthogonalisation: an EMA (beta2) of
each output row's mean squared update divides that row, and the result is rescaled to the Frobenius norm of the
orthogonalised update, so its size is Muon's and ``muon_lr`` keeps its meaning (the authors' reference code does the
same). NVIDIA's emerging-optimizers has it as ``AdaptiveMuon(moment2_method="normuon")``, without that rescaling;
the few lines are written here instead of adding a dependency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's (Keller Jordan's quintic)
NS_STEPS = 5
NS_EPS = 1e-7  # torch.optim.Muon's floor of the norm the iteration starts by dividing by
NORMUON_EPS = 1e-10  # the NorMuon reference code's floor of a row's RMS and of the update's norm
NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 matmuls on x86
# What ns_dtype='auto' takes on a CPU with bf16 instructions: benchmarks/ns_dtype.py at the compare default's
# matrices on an AMD EPYC with avx512_bf16 timed bfloat16 at 0.79x float32's time on 1 thread, 0.85x on 2
# (docs/LOG.md, issue 24), so such CPUs keep torch.optim.Muon's numbers.
BF16_CPU_NS_DTYPE = "bfloat16"


def newton_schulz(matrix: Tensor, steps: int = NS_STEPS, dtype: torch.dtype = torch.bfloat16,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS, eps: float = NS_EPS,
                  workspace: dict[Any, Tensor] | None = None) -> Tensor:
    """Approximate orthogonalisation U V^T of ``matrix`` = U S V^T (rows x cols) by ``steps`` quintic
    Newton-Schulz iterations in ``dtype``; returns a tensor of that dtype and ``matrix``'s shape. A stack
    (k, rows, cols) orthogonalises each matrix, in batched matmuls.

    ``workspace``: a dict that keeps the iteration's buffers from call to call; the result is then one of them, valid
    until the next call with that dict. The same kernels write into them, so the bits are the same; on a CPU it
    saves the page faults of ~15 fresh blocks per call (issue 24: ~1,000 faults and ~1.6 ms of a step at the compare
    default on a 2-core Xeon, docs/LOG.md).

    The same operations in the same order as ``torch.optim.Muon``'s, so one matrix in bfloat16 gives its bits."""
    a, b, c = coefficients
    x = matrix.to(dtype)
    tall = matrix.size(-2) > matrix.size(-1)
    if tall:  # iterate on the wide orientation: the Gram matrix is the smaller one
        x = x.mT
    stacked = x.ndim == 3
    # spectral norm <= Frobenius norm <= 1; not in place: x may be `matrix`
    norm = x.norm(dim=(-2, -1), keepdim=True) if stacked else x.norm()
    x = x / norm.clamp(min=eps)
    multiply, multiply_add = (torch.bmm, torch.baddbmm) if stacked else (torch.mm, torch.addmm)
    rows, cols = x.shape[-2:]

    def buffer(name: str, shape: tuple[int, ...]) -> Tensor | None:
        if workspace is None:
            return None  # out=None: a new tensor
        shape = (*x.shape[:-2], *shape)
        key = (name, shape, dtype, x.device)
        if key not in workspace:
            workspace[key] = x.new_empty(shape)
        return workspace[key]

    for i in range(steps):
        gram = multiply(x, x.mT, out=buffer("gram", (rows, rows)))
        poly = multiply_add(gram, gram, gram, beta=b, alpha=c, out=buffer("poly", (rows, rows)))  # b A + c A^2
        x = multiply_add(x, poly, x, beta=a, out=buffer(f"x{i % 2}", (rows, cols)))  # a X + (b A + c A^2) X
    return x.mT if tall else x


def shape_groups(matrices: list[Tensor]) -> list[list[int]]:
    """The indices of ``matrices`` grouped by (shape, device), in first-seen order: the matrices one batched
    Newton-Schulz iteration takes together."""
    groups: dict[tuple[torch.Size, torch.device], list[int]] = {}
    for i, m in enumerate(matrices):
        groups.setdefault((m.shape, m.device), []).append(i)
    return list(groups.values())


def orthogonalise_stack(stack: Tensor, steps: int = NS_STEPS, dtype: torch.dtype = torch.bfloat16,
                        coefficients: tuple[float, float, float] = NS_COEFFICIENTS, eps: float = NS_EPS,
                        workspace: dict[Any, Tensor] | None = None, compiled: bool = False) -> Tensor:
    """:func:`newton_schulz` of a stack (k, rows, cols) of matrices: one batched iteration for several (issue 24:
    4-6x faster than one at a time at the compare default on a 2-core CPU, the same bits there, docs/LOG.md),
    torch.optim.Muon's own 2-D calls (its bits) for a lone matrix. ``workspace``: as :func:`newton_schulz`'s.
    ``compiled``: the iteration through torch.compile (:func:`compiled_newton_schulz`; no workspace)."""
    iterate = compiled_newton_schulz() if compiled else newton_schulz
    workspace = None if compiled else workspace
    if len(stack) == 1:
        return iterate(stack[0], steps, dtype, coefficients, eps, workspace).unsqueeze(0)
    return iterate(stack, steps, dtype, coefficients, eps, workspace)


_COMPILED: list[Callable[..., Tensor]] = []


def compiled_newton_schulz() -> Callable[..., Tensor]:
    """:func:`newton_schulz` through torch.compile, built once per process: one graph per stack shape, its scaling,
    casts and polynomial fused around the matmuls, which on a GPU are small enough for launches to dominate."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(newton_schulz, dynamic=False))
    return _COMPILED[0]


def resolve_ns_dtype(setting: str, device_type: str, flags: Iterable[str] = ()) -> str:
    """The orthogonalisation dtype ``setting`` (auto | float32 | bfloat16) means on a ``device_type`` device whose
    CPU has ``flags``: auto = bfloat16 on CUDA (tensor cores), float32 on a CPU without bf16 instructions (emulated
    bf16 matmuls are several times slower), :data:`BF16_CPU_NS_DTYPE` on one with them, float32 elsewhere (MPS)."""
    if setting != "auto":
        return setting
    if device_type == "cuda":
        return "bfloat16"
    if device_type == "cpu" and any(flag in CPU_BF16_FLAGS for flag in flags):
        return BF16_CPU_NS_DTYPE
    return "float32"


def muon_lr_scale(shape: torch.Size) -> float:
    """torch.optim.Muon's default LR adjustment: sqrt(max(1, rows / cols)), so tall matrices' updates are
    not smaller per entry than wide ones'."""
    return math.sqrt(max(1, shape[0] / shape[1]))


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` (default adjust_lr_fn, Nesterov) with the Newton-Schulz iteration in ``ns_dtype``.

    The dtype is not part of the state dict: it is a property of the machine, recorded in the run's config."""

    def __init__(self, params: Iterable[Any], *, ns_dtype: str = "bfloat16", ns_compile: bool = False,
                 **kwargs: Any) -> None:
        if ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype={ns_dtype!r}: must be one of {tuple(NS_DTYPES)}")
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype
        self.ns_compile = ns_compile  # the iteration through torch.compile (optim.ns_compile)
        # The iteration's buffers, kept from step to step on a CPU (newton_schulz); CUDA's caching allocator
        # already reuses its blocks, and there the memory is worth more.
        self._ns_workspace: dict[Any, Tensor] = {}

    @staticmethod
    def _directions(grads: list[Tensor], buffers: list[Tensor], group: dict[str, Any],
                    multi_tensor: bool | None = None) -> Tensor:
        """The stack (k, rows, cols) of same-shaped matrices' update directions: Nesterov's ``grad.lerp(buffer,
        momentum)`` (torch.optim.Muon's) written straight into the stack, or the momentum buffers themselves.
        ``multi_tensor`` (default: on CUDA): one foreach lerp and a stack, two launches instead of one per matrix
        on a GPU (the same elementwise values); on a CPU the loop writes in place, without the extra copy."""
        if not group["nesterov"]:
            return torch.stack(buffers)
        if grads[0].is_cuda if multi_tensor is None else multi_tensor:
            return torch.stack(torch._foreach_lerp(grads, buffers, group["momentum"]))
        stack = grads[0].new_empty((len(grads), *grads[0].shape))
        for grad, buffer, row in zip(grads, buffers, stack, strict=True):
            torch.lerp(grad, buffer, group["momentum"], out=row)
        return stack

    def _normalise(self, params: list[Tensor], updates: Tensor, group: dict[str, Any]) -> Tensor:
        """The orthogonalised updates of same-shaped ``params``, a stack (k, rows, cols), as ``param.add_`` takes
        them (NorMuon normalises them here)."""
        return updates

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        dtype = NS_DTYPES[self.ns_dtype]
        for group in self.param_groups:
            if group["adjust_lr_fn"] not in (None, "original"):
                raise ValueError(f"adjust_lr_fn={group['adjust_lr_fn']!r} is not supported here")
            lr, momentum = float(group["lr"]), group["momentum"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            for param, grad in zip(params, grads, strict=True):
                if "momentum_buffer" not in self.state[param]:
                    self.state[param]["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
            buffers = [self.state[p]["momentum_buffer"] for p in params]
            # torch.optim.Muon's per-tensor ops, for the whole group at once (elementwise: the same bits)
            torch._foreach_lerp_(buffers, grads, 1 - momentum)
            for members in shape_groups(grads):
                same_shape = [params[i] for i in members]
                directions = self._directions([grads[i] for i in members], [buffers[i] for i in members], group)
                workspace = self._ns_workspace if directions.device.type == "cpu" else None
                stack = orthogonalise_stack(directions, group["ns_steps"], dtype, group["ns_coefficients"],
                                            group["eps"], workspace, self.ns_compile)
                updates = self._normalise(same_shape, stack, group).unbind()
                torch._foreach_mul_(same_shape, 1 - lr * group["weight_decay"])  # decoupled decay, before the step
                torch._foreach_add_(same_shape, updates, alpha=-lr * muon_lr_scale(same_shape[0].shape))
        return loss


class NorMuon(Muon):
    """Muon followed by NorMuon's per-neuron normalisation (see the module doc); ``beta2`` is the decay of each
    output row's second moment. State: Muon's momentum buffer and ``second_moment`` (rows, 1) per matrix."""

    def __init__(self, params: Iterable[Any], *, beta2: float = 0.95, **kwargs: Any) -> None:
        if not 0 <= beta2 < 1:
            raise ValueError(f"beta2={beta2}: must be in [0, 1)")
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            group.setdefault("beta2", beta2)

    def _normalise(self, params: list[Tensor], updates: Tensor, group: dict[str, Any]) -> Tensor:
        """Each update's rows divided by their second moment's root, rescaled to that update's norm: the whole stack
        at once (each reduction runs per matrix or per row, so the bits are one at a time's on the CPUs measured)."""
        updates = updates.to(params[0].dtype)  # normalise in the parameters' precision, not bf16's
        for param in params:
            if "second_moment" not in self.state[param]:  # (rows, 1): one per output neuron
                self.state[param]["second_moment"] = param.new_zeros(len(param), 1)
        moments = [self.state[p]["second_moment"] for p in params]
        norms = torch.linalg.vector_norm(updates, dim=(-2, -1))
        torch._foreach_lerp_(moments, updates.square().mean(dim=-1, keepdim=True).unbind(), 1 - group["beta2"])
        normalised = updates / torch.stack(moments).sqrt_().add_(NORMUON_EPS)
        # Back to the orthogonalised update's norm: the rows' relative sizes change, Muon's step size does not.
        scale = norms / torch.linalg.vector_norm(normalised, dim=(-2, -1)).add_(NORMUON_EPS)
        return normalised.mul_(scale.view(-1, 1, 1))
