"""Muon with a chosen Newton-Schulz dtype (== torch.optim.Muon in bf16), the choice of that dtype from the device's
capabilities, and NorMuon's per-neuron normalisation (arXiv 2510.05491)."""

import copy

import pytest
import torch
from conftest import ADAMW, make_model
from test_trainer import make_trainer

from fullband.devices import cpu_flags, cpu_name, cpu_vendor
from fullband.training import build_optimizer
from fullband.training.checkpoint_layout import list_checkpoints, load_run_config
from fullband.training.config import OptimConfig
from fullband.training.muon import (
    BF16_CPU_NS_DTYPE,
    Muon,
    NorMuon,
    muon_lr_scale,
    newton_schulz,
    orthogonalise_stack,
    resolve_ns_dtype,
    shape_groups,
)
from fullband.training.optim import ns_dtype_for, optimizer_ns_dtype

SHAPES = ((24, 24), (48, 16), (16, 40))  # square, tall (transposed inside), wide


def matrices(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator) / 8) for shape in SHAPES]


def run(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int, seed: int = 1) -> None:
    """``steps`` optimizer steps on random gradients drawn from ``seed`` (the same for every optimizer)."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_in_bfloat16_is_torch_muon_bit_for_bit(nesterov):
    ours, theirs = matrices(), matrices()
    groups = lambda params: [{"params": params[:2], "lr": 0.02}, {"params": params[2:], "lr": 0.05}]  # noqa: E731
    settings = dict(weight_decay=0.01, momentum=0.95, nesterov=nesterov)
    run(Muon(groups(ours), ns_dtype="bfloat16", **settings), ours, steps=4)
    run(torch.optim.Muon(groups(theirs), **settings), theirs, steps=4)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_shaped_matrices_are_orthogonalised_together_as_each_alone(dtype):
    """The optimizer stacks the matrices of one shape (shape_groups) into one batched iteration; each result is that
    matrix's own (bit for bit on the CPUs measured so far; within a rounding step of the dtype anywhere)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(24, 24), (48, 16), (24, 24), (16, 40), (48, 16), (24, 24)]
    grads = [torch.randn(shape, generator=generator) for shape in shapes]
    groups = shape_groups(grads)
    assert groups == [[0, 2, 5], [1, 4], [3]]
    for members in groups:
        together = orthogonalise_stack(torch.stack([grads[i] for i in members]), dtype=dtype)
        for i, update in zip(members, together, strict=True):
            alone = newton_schulz(grads[i], dtype=dtype)
            assert update.shape == grads[i].shape and update.dtype == dtype
            torch.testing.assert_close(update.float(), alone.float(), rtol=0,
                                       atol=1e-5 if dtype == torch.float32 else 8e-3)


def test_muon_with_same_shaped_matrices_is_torch_muon():
    """The batched orthogonalisation keeps torch.optim.Muon's steps (bf16) with several matrices of each shape."""
    ours, theirs = matrices() + matrices(1), matrices() + matrices(1)
    settings = dict(lr=0.02, weight_decay=0.01, momentum=0.95)
    run(Muon(ours, ns_dtype="bfloat16", **settings), ours, steps=4)
    run(torch.optim.Muon(theirs, **settings), theirs, steps=4)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 24, 24), (2, 48, 16), (16, 40)])
def test_newton_schulz_with_a_workspace_gives_the_same_bits_and_reuses_its_buffers(dtype, shape):
    """The same kernels write into kept buffers: the same result, and a second call allocates nothing new (the
    result of the first is overwritten: valid until the next call with that workspace)."""
    generator = torch.Generator().manual_seed(0)
    first, second = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    workspace: dict = {}
    kept = newton_schulz(first, dtype=dtype, workspace=workspace)
    assert torch.equal(kept, newton_schulz(first, dtype=dtype))
    buffers = {key: t.data_ptr() for key, t in workspace.items()}
    assert len(buffers) == 4  # the Gram matrix, the polynomial, two iterates in turn
    assert torch.equal(newton_schulz(second, dtype=dtype, workspace=workspace), newton_schulz(second, dtype=dtype))
    assert {key: t.data_ptr() for key, t in workspace.items()} == buffers


def test_newton_schulz_orthogonalises_in_either_dtype_and_leaves_its_input_alone():
    generator = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        g = torch.randn(shape, generator=generator)
        before = g.clone()
        fp32, bf16 = newton_schulz(g, dtype=torch.float32), newton_schulz(g, dtype=torch.bfloat16)
        assert torch.equal(g, before)  # a float32 input is not divided in place
        assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16 and fp32.shape == shape
        # The quintic iteration drives every singular value into about (0.5, 1.2), not to exactly 1 (Keller Jordan).
        singular = torch.linalg.svdvals(fp32)
        assert singular.min() > 0.5 and singular.max() < 1.25, singular
        assert (fp32 - bf16.float()).abs().max() < 0.05  # the same map, bf16 rounding apart


@pytest.mark.parametrize(("setting", "device", "flags", "expected"), [
    ("auto", "cpu", {"avx2", "avx512f"}, "float32"),  # a Zen 3: bf16 is emulated there
    ("auto", "cpu", {"avx2", "avx512f", "avx512_bf16"}, BF16_CPU_NS_DTYPE),  # Zen 4, Cooper Lake
    ("auto", "cpu", {"avx2", "amx_bf16", "amx_tile"}, BF16_CPU_NS_DTYPE),  # Sapphire Rapids
    ("auto", "cpu", set(), "float32"),  # no /proc/cpuinfo (macOS)
    ("auto", "cuda", set(), "bfloat16"),
    ("auto", "mps", set(), "float32"),
    ("float32", "cuda", set(), "float32"),  # an explicit choice is kept
    ("bfloat16", "cpu", {"avx2"}, "bfloat16"),  # e.g. to measure the emulated path
])
def test_auto_ns_dtype_follows_the_devices_capabilities(setting, device, flags, expected):
    assert resolve_ns_dtype(setting, device, flags) == expected


def test_cpu_flags_name_and_vendor_read_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
                       "flags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert (cpu_name(cpuinfo), cpu_vendor(cpuinfo)) == ("AMD EPYC", "AuthenticAMD")
    assert cpu_flags(tmp_path / "missing") == frozenset() and cpu_vendor(tmp_path / "missing") == ""


@pytest.mark.parametrize("optimizer", ["muon", "normuon"])
def test_build_optimizer_resolves_ns_dtype_once_and_the_run_config_records_it(tmp_path, optimizer):
    model = make_model(dtype=torch.float32)
    auto = build_optimizer(model, OptimConfig(optimizer=optimizer))
    assert optimizer_ns_dtype(auto) == resolve_ns_dtype("auto", "cpu", cpu_flags())
    assert optimizer_ns_dtype(build_optimizer(model, OptimConfig(optimizer=optimizer, ns_dtype="float32"))) == "float32"
    assert optimizer_ns_dtype(build_optimizer(model, OptimConfig(**ADAMW))) is None
    assert ns_dtype_for(OptimConfig(**ADAMW), torch.device("cpu")) is None  # AdamW has none

    trainer = make_trainer(tmp_path, optim=OptimConfig(optimizer=optimizer, ns_dtype="float32"), max_steps=1,
                           grad_accum=1)
    trainer.fit()
    [(_, checkpoint)] = list_checkpoints(tmp_path)
    assert load_run_config(checkpoint)["ns_dtype"] == "float32"


def row_rms(update: torch.Tensor) -> torch.Tensor:
    return update.square().mean(dim=1).sqrt()


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_normuon_normalises_each_output_neuron_and_keeps_muons_step_size(ns_dtype):
    """After the first step every row (output neuron) of the update has the same RMS (its second moment is its own
    mean square, times 1 - beta2), and the update's norm is the orthogonalised update's, times Muon's LR scale."""
    params = matrices()
    start = [p.detach().clone() for p in params]
    lr = 0.02
    optimizer = NorMuon(params, lr=lr, weight_decay=0.0, momentum=0.95, beta2=0.95, ns_dtype=ns_dtype)
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=generator) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    optimizer.step()
    dtype = getattr(torch, ns_dtype)
    for p, p0, g in zip(params, start, grads, strict=True):
        update = (p0 - p.detach()) / (lr * muon_lr_scale(p.shape))
        # Nesterov from a zero buffer: direction = (1 - m) g + m (1 - m) g, a multiple of g: same orthogonalisation.
        orthogonal = newton_schulz(g.lerp(torch.zeros_like(g).lerp(g, 0.05), 0.95), dtype=dtype).float()
        rms = row_rms(update)
        assert torch.allclose(rms, rms.mean().expand_as(rms), rtol=1e-4), rms
        assert update.norm().item() == pytest.approx(orthogonal.norm().item(), rel=1e-4)
        assert not torch.allclose(row_rms(orthogonal), row_rms(orthogonal).mean().expand(len(rms)), rtol=1e-2)


def normuon_one_matrix_at_a_time(params: list[torch.nn.Parameter], steps: int, lr: float, weight_decay: float,
                                 beta2: float, dtype: torch.dtype, momentum: float = 0.95) -> None:
    """NorMuon written out for one matrix at a time, as the paper states it: the reference the batched optimizer
    is held to. Random gradients as :func:`run` draws them."""
    generator = torch.Generator().manual_seed(1)
    buffers = [torch.zeros_like(p) for p in params]
    moments = [torch.zeros(p.shape[0], 1) for p in params]
    for _ in range(steps):
        grads = [torch.randn(p.shape, generator=generator) for p in params]
        with torch.no_grad():
            for p, g, buf, moment in zip(params, grads, buffers, moments, strict=True):
                buf.lerp_(g, 1 - momentum)
                update = newton_schulz(g.lerp(buf, momentum), dtype=dtype).to(p.dtype)
                norm = update.norm()
                moment.lerp_(update.square().mean(dim=1, keepdim=True), 1 - beta2)
                normalised = update / moment.sqrt().add_(1e-10)
                normalised.mul_(norm / normalised.norm().add_(1e-10))
                p.mul_(1 - lr * weight_decay)
                p.add_(normalised, alpha=-lr * muon_lr_scale(p.shape))


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_normuon_on_stacks_of_same_shaped_matrices_is_normuon_one_at_a_time(ns_dtype):
    """The optimizer normalises each shape's stack at once (reductions per matrix and per row): the reference's
    numbers (bit for bit on the CPUs measured, docs/LOG.md; here within what a batched matmul's other rounding of the
    orthogonalisation moves, as in the Muon test above)."""
    ours, reference = matrices() + matrices(1), matrices() + matrices(1)
    run(NorMuon(ours, lr=0.02, weight_decay=0.01, beta2=0.9, ns_dtype=ns_dtype), ours, steps=4)
    normuon_one_matrix_at_a_time(reference, steps=4, lr=0.02, weight_decay=0.01, beta2=0.9,
                                 dtype=getattr(torch, ns_dtype))
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 if ns_dtype == "float32" else 1e-4)


def test_normuon_second_moment_is_an_ema_of_each_rows_mean_square():
    params = matrices()[:1]
    beta2 = 0.9
    optimizer = NorMuon(params, lr=0.01, weight_decay=0.0, momentum=0.0, beta2=beta2, ns_dtype="float32")
    generator = torch.Generator().manual_seed(2)
    expected = torch.zeros(SHAPES[0][0], 1)
    for _ in range(3):
        grad = torch.randn(params[0].shape, generator=generator)
        params[0].grad = grad.clone()
        optimizer.step()  # momentum 0: the update orthogonalises the gradient itself
        expected = beta2 * expected + (1 - beta2) * newton_schulz(grad, dtype=torch.float32).square().mean(1, True)
    assert torch.allclose(optimizer.state[params[0]]["second_moment"], expected, rtol=1e-5)


@pytest.mark.parametrize("cls", [Muon, NorMuon])
def test_state_dict_round_trip_continues_bit_for_bit(cls):
    params, copies = matrices(), matrices()
    optimizer = cls(params, lr=0.02, weight_decay=0.01, ns_dtype="float32")
    run(optimizer, params, steps=3)
    resumed = cls(copies, lr=0.5, weight_decay=0.0, ns_dtype="float32")  # hyperparameters come from the state
    with torch.no_grad():
        for c, p in zip(copies, params, strict=True):
            c.copy_(p)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    run(optimizer, params, steps=2, seed=5)
    run(resumed, copies, steps=2, seed=5)
    for a, b in zip(params, copies, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("optimizer", ["muon", "normuon"])
def test_ns_steps_reaches_the_orthogonalisation(optimizer):
    model = make_model(dtype=torch.float32)
    built = build_optimizer(model, OptimConfig(optimizer=optimizer, ns_steps=3)).optimizers[optimizer]
    assert {group["ns_steps"] for group in built.param_groups} == {3}
    assert {group["ns_steps"] for group in build_optimizer(model, OptimConfig(optimizer=optimizer))
            .optimizers[optimizer].param_groups} == {5}  # torch.optim.Muon's


def test_a_muon_checkpoint_does_not_load_into_normuon():
    model = make_model(dtype=torch.float32)
    muon = build_optimizer(model, OptimConfig(optimizer="muon"))
    with pytest.raises(ValueError, match=r"another optim\.optimizer"):
        build_optimizer(model, OptimConfig(optimizer="normuon")).load_state_dict(muon.state_dict())


def test_bad_constructor_values_are_refused():
    with pytest.raises(ValueError, match="ns_dtype='float16'"):
        Muon(matrices(), ns_dtype="float16")
    with pytest.raises(ValueError, match=r"beta2=1.0: must be in \[0, 1\)"):
        NorMuon(matrices(), beta2=1.0)


def test_the_multi_tensor_directions_of_cuda_are_the_loops_values():
    """On CUDA the Nesterov directions come from one foreach lerp and a stack (two launches, not one per matrix):
    the same values as the loop the CPU runs, bit for bit (here on the CPU, where both run)."""
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(24, 24, generator=generator) for _ in range(5)]
    buffers = [torch.randn(24, 24, generator=generator) for _ in range(5)]
    group = {"nesterov": True, "momentum": 0.95}
    assert torch.equal(Muon._directions(grads, buffers, group, multi_tensor=True),
                       Muon._directions(grads, buffers, group, multi_tensor=False))


def test_a_compiled_newton_schulz_iteration_takes_the_same_steps_to_rounding():
    """optim.ns_compile: the iteration through torch.compile (inductor here, one stack shape) gives eager's
    orthogonalisation to float32 rounding, and a Muon with it the same steps."""
    generator = torch.Generator().manual_seed(0)
    stack = torch.randn(3, 24, 24, generator=generator)
    torch.testing.assert_close(orthogonalise_stack(stack, dtype=torch.float32, compiled=True),
                               orthogonalise_stack(stack, dtype=torch.float32), rtol=0, atol=1e-5)
    ours = [torch.nn.Parameter(p.detach().clone()) for p in stack]
    eager = [torch.nn.Parameter(p.detach().clone()) for p in stack]
    settings = dict(lr=0.02, weight_decay=0.01, momentum=0.95, ns_dtype="float32")
    run(Muon(ours, ns_compile=True, **settings), ours, steps=3)
    run(Muon(eager, **settings), eager, steps=3)
    for a, b in zip(ours, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
