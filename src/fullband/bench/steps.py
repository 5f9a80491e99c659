"""The steps ``fullband bench`` (and benchmarks/) time: one training step of fullband or of a transformers peer,
the Trainer's own step, greedy decoding of each; and the peers built on fullband's weights."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.bench.config import BenchOptimConfig, BenchTrainConfig
from fullband.bench.timing import synchronize
from fullband.model.linear import Linear
from fullband.training.objective import MultiPassObjective

BYTE_VOCAB = 320  # fullband train's byte vocabulary: 257 ids rounded up to a multiple of 64


class SavedTensorBytes:
    """Counts the bytes of distinct storages autograd saves during a forward (activation memory on a CPU, where
    PyTorch keeps no peak-memory counter)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def train_model(cfg: BenchTrainConfig | BenchOptimConfig | None = None,
                device: torch.device | str = "cpu") -> tuple[FullBandwidthLM, torch.Tensor]:
    """(a feedback model in training mode, one batch of random byte ids) at the [train] section's dimensions
    (default: nanoGPT's README CPU config), both drawn from torch's global RNG: the model every training timing of
    ``fullband bench`` and benchmarks/ runs."""
    c = cfg or BenchTrainConfig()
    config = ModelConfig(vocab_size=BYTE_VOCAB, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                         max_seq_len=c.seq_len, feedback=True)
    model = FullBandwidthLM(config).to(device).train()
    return model, torch.randint(0, BYTE_VOCAB, (c.batch_size, c.seq_len), device=device)


def optimizer_step(loss_fn: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer,
                   params: list[torch.nn.Parameter], grad_clip: float = 1.0,
                   saved: SavedTensorBytes | None = None) -> None:
    """One bare training step: forward + loss (``loss_fn``), backward, gradient clipping, optimizer step.

    ``saved`` counts the activation memory autograd keeps for the backward pass (costs time: not while timing).
    """
    if saved is None:
        loss = loss_fn()
    else:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = loss_fn()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed_optimizer_step(loss_fn: Callable[[], torch.Tensor], optimizer: Any, params: list[torch.nn.Parameter],
                         optimizer_seconds: list[float], grad_clip: float = 1.0,
                         optimizer_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                         ) -> None:
    """:func:`optimizer_step`, appending the seconds of ``optimizer.step()`` (run inside ``optimizer_context``) to
    ``optimizer_seconds``: the optimizer's share of the step."""
    loss_fn().backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
    device = params[0].device
    synchronize(device)
    start = time.perf_counter()
    with optimizer_context():
        optimizer.step()
    synchronize(device)
    optimizer_seconds.append(time.perf_counter() - start)
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def without_onednn() -> Iterator[None]:
    """oneDNN off: bf16 matmuls fall back to torch's own gemm, which emulates bf16 in float32 as it does on CPUs
    oneDNN's bf16 kernels skip (without AVX-512: the issue's Zen 3), so that path can be timed on any CPU."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def fullband_loss(model: FullBandwidthLM, tokens: torch.Tensor, passes: int = 1) -> Callable[[], torch.Tensor]:
    """The multi-pass objective's loss of ``tokens`` (plain_prefix 1) on the bare model (no jitter)."""
    objective = MultiPassObjective()
    return lambda: objective(model, tokens, tokens, passes).loss


def transformers_loss(model: torch.nn.Module, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A transformers causal LM's next-token loss of ``tokens`` (it shifts the labels itself)."""
    return lambda: model(input_ids=tokens, labels=tokens).loss


def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """The optimizer every bare step uses: AdamW over all parameters with the kernel the Trainer picks (foreach on a
    CPU, fused on CUDA), for fullband and the peers alike."""
    from fullband.training.optim import adamw_kernel

    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **adamw_kernel(model.parameters()))


def baseline_twin(model: FullBandwidthLM) -> FullBandwidthLM:
    """The ``feedback=False`` model with ``model``'s weights (all but the fusion)."""
    config = ModelConfig(**{**model.config.to_dict(), "feedback": False})
    twin = FullBandwidthLM(config)
    twin.load_state_dict({k: v for k, v in model.state_dict().items() if k in twin.state_dict()}, strict=True)
    p = model.embed.weight
    return twin.to(device=p.device, dtype=p.dtype).train(model.training)


def llama_twin(model: FullBandwidthLM) -> torch.nn.Module:
    """``LlamaForCausalLM`` with ``model``'s weights (the input norm folded into its embedding, see
    :func:`fullband.integrations.llama.to_llama`), attention through the same SDPA kernel."""
    from fullband.integrations.llama import to_llama

    llama = to_llama(baseline_twin(model))
    llama.config._attn_implementation = "sdpa"
    llama.generation_config.pad_token_id = 0  # no special tokens: quiets generate()
    return llama


def gpt2_peer(config: ModelConfig) -> torch.nn.Module:
    """``GPT2LMHeadModel`` of the same width, depth, heads, vocabulary and context, dropout off (its layout differs
    -- LayerNorm, learned positions, GELU MLP of 4x width -- so it gets its own random weights)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2Config(vocab_size=config.vocab_size, n_positions=config.max_seq_len, n_embd=config.d_model,
                      n_layer=config.n_layers, n_head=config.n_heads, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
    return GPT2LMHeadModel(gpt2)


def trainer_and_bare_step(model: FullBandwidthLM, tokens: torch.Tensor,
                          out_dir: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(one ``Trainer.train_step`` of ``model``, the bare step it wraps) on copies of the same weights: AdamW as the
    Trainer builds it, gradient clipping at 1, single-pass steps, the same fixed batch."""
    from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
    from fullband.training.optim import build_optimizer
    from fullband.training.trainer import Trainer

    rows, seq_len = tokens.shape
    train_cfg = TrainConfig(batch_size=rows, seq_len=seq_len, max_steps=10**6, checkpoint_every=0)
    # AdamW pinned (fullband train's default is the recipe's NorMuon): the bare step it is measured against is AdamW's
    optim_cfg = OptimConfig(optimizer="adamw", fusion_lr_mult=1.0, warmup_steps=0)
    schedule = ScheduleConfig(feedback_start=1.0)
    trainer = Trainer(copy.deepcopy(model), train_cfg, optim_cfg, schedule, lambda step, rank, world: (tokens, tokens),
                      out_dir=out_dir, progress=False)
    bare = copy.deepcopy(model)
    if trainer.compiled:  # the bare step runs what the Trainer runs
        bare.compile_blocks()
    optimizer = build_optimizer(bare, optim_cfg)
    params = list(bare.parameters())
    return (lambda: trainer.train_step(0)), (lambda: optimizer_step(fullband_loss(bare, tokens), optimizer, params))


def projection_layers(model: FullBandwidthLM) -> list[Linear]:
    """Every projection and the head, in the order a step runs them; not the fusion's (a single pass and standard
    decoding skip it)."""
    return [m for name, m in model.named_modules() if isinstance(m, Linear) and not name.startswith("fusion.")]


def training_products(model: FullBandwidthLM, rows: int) -> tuple[Callable[[], None], float]:
    """What one single-pass training step of ``rows`` tokens spends in the weights' matrix products alone, and their
    FLOPs: for every projection and the head (not the fusion, which a single pass skips), the forward product and
    backward's two (the input's gradient and the weight's), as autograd runs them for ``F.linear`` on float32
    tensors of the step's shapes. Nothing else of a step (norms, attention, activations, loss, optimizer) runs: the
    ceiling the GEMMs of those shapes allow."""
    layers = projection_layers(model)
    p = model.embed.weight
    shapes = {(m.in_features, m.out_features) for m in layers}
    tensors = {(i, o): (torch.randn(rows, i, device=p.device), torch.randn(rows, o, device=p.device),
                        torch.randn(o, i, device=p.device)) for i, o in shapes}
    flops = sum(3 * 2.0 * rows * m.in_features * m.out_features for m in layers)

    def run() -> None:
        for layer in layers:
            x, grad, weight = tensors[layer.in_features, layer.out_features]
            torch.mm(x, weight.t())  # forward
            torch.mm(grad, weight)  # the input's gradient
            torch.mm(grad.t(), x)  # the weight's gradient

    return run, flops


def weight_products(model: FullBandwidthLM, batch: int, new_tokens: int) -> Callable[[], None]:
    """What ``new_tokens`` decoding steps of ``batch`` rows spend in the weights' matrix products alone: every
    projection and the head (the fusion's aside: standard decoding skips it) applied to one row per sequence,
    through the model's own kernel choice (:func:`fullband.model.linear.linear`), as a step runs them (where fused
    inference is on, :func:`fullband.model.linear.product`: q/k/v and gate/up one product each, packed weights for
    several rows) and in its order. Nothing else of a step (norms, attention, cache, sampling) runs: the ceiling the
    GEMVs allow."""
    from fullband.model.linear import fuses, linear, product, weight_of

    p = model.embed.weight
    x = torch.randn(batch, 1, model.config.d_model, device=p.device, dtype=p.dtype)
    with torch.no_grad():
        fused = fuses(x)
    products: list[tuple[torch.nn.Module, tuple[str, ...], int]] = []  # (owner, its weights' names, input size)
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        if fused:  # as the fused step runs them (fullband.model.linear): q/k/v and gate/up one product each
            products += [(attn, ("q_proj", "k_proj", "v_proj"), attn.q_proj.in_features),
                         (attn, ("o_proj",), attn.o_proj.in_features),
                         (mlp, ("gate_proj", "up_proj"), mlp.gate_proj.in_features),
                         (mlp, ("down_proj",), mlp.down_proj.in_features)]
        else:
            products += [(owner, (name,), owner.get_submodule(name).in_features)
                         for owner, names in ((attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                              (mlp, ("gate_proj", "up_proj", "down_proj"))) for name in names]
    products.append((model, ("lm_head",), model.lm_head.in_features))
    inputs = {size: torch.randn(batch, 1, size, device=p.device, dtype=p.dtype) for _, _, size in products}

    def run() -> None:
        with torch.no_grad():
            for _ in range(new_tokens):
                for owner, names, size in products:
                    if fused:  # the fused step's own products (packed weights for several rows)
                        product(inputs[size], owner, names)
                    else:
                        linear(inputs[size], weight_of(owner, names[0]))

    return run


def greedy_fullband(model: FullBandwidthLM, prompts: torch.Tensor, new_tokens: int, mode: str,
                    step: str = "eager", context: Callable[[], Any] = contextlib.nullcontext) -> torch.Tensor:
    """The ``new_tokens`` greedy tokens fullband decodes after ``prompts`` in ``mode``, (B, new_tokens); ``step``:
    the decode step (DecodeOptions.step: eager, static, compiled); ``context``: entered around the decode (e.g.
    ``lambda: fused_inference(False)``, :func:`fullband.model.linear.fused_inference`)."""
    from fullband.generation.decoding import generate

    with context():
        return generate(model, prompts, max_new_tokens=new_tokens, mode=mode, step=step)[:, prompts.shape[1]:]


def greedy_transformers(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The ``new_tokens`` greedy tokens ``model.generate`` decodes after ``prompts`` (its KV cache), (B, new)."""
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False)
    return out[:, prompts.shape[1]:].cpu()
