"""Typed configuration dataclasses, validated in one place.

Every field carries a ``help`` string in its metadata; the CLI builds its ``--help`` from it. Bad values
raise :class:`ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


def doc(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with a default and a help text (shown by ``fullband <cmd> --help``)."""
    return field(default=default, metadata={"help": help}, **kwargs)


FEEDBACK_SOURCES = ("residual", "normed")
FUSIONS = ("glu_cross",)
GATE_NORMS = ("own", "shared")


@dataclass
class ModelConfig:
    """Architecture of a full-bandwidth transformer (``feedback=False`` gives the plain baseline)."""

    vocab_size: int = doc(256, "Number of token ids.")
    d_model: int = doc(256, "Width D of the residual stream.")
    n_layers: int = doc(4, "Number of transformer blocks L.")
    n_heads: int = doc(4, "Attention heads (query).")
    n_kv_heads: int | None = doc(None, "Key/value heads for grouped-query attention; None = n_heads.")
    d_ff: int | None = doc(None, "Hidden width of the SwiGLU MLP; None = 8/3 * d_model rounded up to 64.")
    max_seq_len: int = doc(1024, "Longest sequence (prompt + generated) the model accepts.")
    rope_theta: float = doc(10000.0, "RoPE base frequency.")
    norm_eps: float = doc(1e-5, "RMSNorm epsilon.")
    tie_embeddings: bool = doc(True, "Share the input embedding with the output head.")
    init_std: float = doc(0.02, "Std of the normal init; residual output projections get init_std/sqrt(2L).")
    feedback: bool = doc(True, "Latent feedback on; False builds the plain baseline with no fusion weights.")
    fusion: str = doc(
        "glu_cross", "Fusion of carried state and token: glu_cross = RMSNorm((W_U h) * sigmoid(W_G RMSNorm(e)))."
    )
    input_norm: bool = doc(
        True,
        "Run every input of the stack, plain embedding or fused state, through one input RMSNorm (the paper's "
        "App. C; DESIGN.md section 1). False = plain positions take the raw embedding and only fused inputs are "
        "normalised (checkpoints from before this option load with False).",
    )
    input_norm_init: float = doc(
        0.02,
        "Initial gain of the input RMSNorm (input_norm=true). 0.02 starts plain and fused inputs at the scale of "
        "the embeddings' init (init_std); 1 starts them at unit RMS.",
    )
    gate_norm: str = doc(
        "own",
        "Norm of the token embedding the fusion's gate reads: 'own' = its own RMSNorm (gain init 1), 'shared' = the "
        "input RMSNorm (the paper's `glu_cross(h, input_rmsnorm(e))`; needs input_norm=true).",
    )
    feedback_source: str = doc(
        "residual",
        "Carried state: 'residual' = top block output before the final norm, 'normed' = after it, "
        "'layer:N' = output of block N (1..n_layers).",
    )

    def __post_init__(self) -> None:
        validate_model_config(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return 64 * math.ceil(8 * self.d_model / 3 / 64)

    @property
    def feedback_layer(self) -> int:
        """1-based index of the block whose output is carried (n_layers for residual/normed)."""
        if self.feedback_source.startswith("layer:"):
            return int(self.feedback_source.split(":", 1)[1])
        return self.n_layers

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return from_dict(cls, data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"no model config at {path}") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from None
        if isinstance(data, dict):
            # Checkpoints saved before the input norm existed were trained without it: decode them as trained.
            data.setdefault("input_norm", False)
        return cls.from_dict(data)


DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
_DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def validate_device_name(name: Any, field: str = "device") -> None:
    """The spelling of a device; whether this machine has it is :func:`fullband.devices.resolve_device`'s check."""
    _require(isinstance(name, str) and bool(_DEVICE_NAME.fullmatch(name)), field, name, f"use {DEVICE_CHOICES}")


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is invalid: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_model_config(c: ModelConfig) -> None:
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
        value = getattr(c, name)
        _require(_is_int(value) and value >= 1, name, value, "must be an integer >= 1")
    _require(c.d_model % c.n_heads == 0, "n_heads", c.n_heads, f"must divide d_model={c.d_model}")
    _require((c.d_model // c.n_heads) % 2 == 0, "n_heads", c.n_heads,
             f"d_model/n_heads must be even for RoPE (got {c.d_model}/{c.n_heads})")
    if c.n_kv_heads is not None:
        _require(_is_int(c.n_kv_heads) and c.n_kv_heads >= 1 and c.n_heads % c.n_kv_heads == 0,
                 "n_kv_heads", c.n_kv_heads, f"must be a positive divisor of n_heads={c.n_heads} (or None)")
    if c.d_ff is not None:
        _require(_is_int(c.d_ff) and c.d_ff >= 1, "d_ff", c.d_ff, "must be an integer >= 1 (or None)")
    _require(isinstance(c.rope_theta, (int, float)) and c.rope_theta > 0, "rope_theta", c.rope_theta, "must be > 0")
    _require(isinstance(c.norm_eps, (int, float)) and 0 < c.norm_eps < 1, "norm_eps", c.norm_eps, "must be in (0, 1)")
    _require(isinstance(c.init_std, (int, float)) and c.init_std > 0, "init_std", c.init_std, "must be > 0")
    _require(_is_number(c.input_norm_init) and c.input_norm_init > 0, "input_norm_init", c.input_norm_init,
             "must be > 0")
    for name in ("tie_embeddings", "feedback", "input_norm"):
        _require(isinstance(getattr(c, name), bool), name, getattr(c, name), "must be true or false")
    _require(c.fusion in FUSIONS, "fusion", c.fusion, f"must be one of {FUSIONS}")
    _require(c.gate_norm in GATE_NORMS, "gate_norm", c.gate_norm, f"must be one of {GATE_NORMS}")
    _require(c.gate_norm == "own" or c.input_norm, "gate_norm", c.gate_norm,
             "'shared' reads the input RMSNorm, so it needs input_norm=true")
    source = c.feedback_source
    if isinstance(source, str) and source.startswith("layer:"):
        n = source.split(":", 1)[1]
        _require(n.isdigit() and 1 <= int(n) <= c.n_layers, "feedback_source", source,
                 f"layer index must be in 1..n_layers={c.n_layers}")
    else:
        _require(source in FEEDBACK_SOURCES, "feedback_source", source,
                 f"must be one of {FEEDBACK_SOURCES} or 'layer:N'")


# The inference modes of DESIGN.md §4, and the defaults of every entry point, defined here only.
DECODING_MODES = ("standard", "soft", "fused", "exact")
# Decoding (generate / stream, `fullband generate`, transformers' generate()): soft, the mode DESIGN.md §5 shows and
# the cheapest one that uses the feedback (plain prompt, fused generated tokens).
DEFAULT_MODE = "soft"
# Scoring a given text (`fullband eval`, the lm-eval model, a transformers forward without a decoding state):
# standard, one plain pass, the number every other tool gives for the same network.
DEFAULT_SCORE_MODE = "standard"


def validate_decoding_options(
    mode: str, prefill_passes: int, temperature: float, top_k: int, top_p: float, max_new_tokens: int,
    exact_chunk_size: int,
) -> None:
    """Checks shared by ``generate()`` and ``fullband generate``."""
    _require(mode in DECODING_MODES, "mode", mode, f"must be one of {DECODING_MODES}")
    _require(_is_int(prefill_passes) and prefill_passes >= 0, "prefill_passes", prefill_passes,
             "must be an integer >= 0 (extra fused prompt passes in fused mode)")
    _require(isinstance(temperature, (int, float)) and temperature >= 0, "temperature", temperature,
             "must be >= 0 (0 = greedy)")
    _require(_is_int(top_k) and top_k >= 0, "top_k", top_k, "must be an integer >= 0 (0 = off)")
    _require(isinstance(top_p, (int, float)) and 0 < top_p <= 1, "top_p", top_p, "must be in (0, 1]")
    _require(_is_int(max_new_tokens) and max_new_tokens >= 0, "max_new_tokens", max_new_tokens,
             "must be an integer >= 0")
    _require(_is_int(exact_chunk_size) and exact_chunk_size >= 1, "exact_chunk_size", exact_chunk_size,
             "must be an integer >= 1 (1 = sequential)")


@dataclass
class GenerateConfig:
    """Options of ``fullband generate``."""

    checkpoint: str = doc("", "Model directory written by save_pretrained / fullband train (required).")
    prompt: str = doc("", "Prompt text (or space/comma-separated token ids when no tokenizer is saved).")
    mode: str = doc(DEFAULT_MODE, "Decoding mode: standard | soft | fused | exact (DESIGN.md section 4).")
    max_new_tokens: int = doc(64, "Tokens to generate.")
    prefill_passes: int = doc(1, "fused mode: extra fused (Jacobi) passes over the prompt.")
    exact_chunk_size: int = doc(1, "exact mode: prompt chunk per exact Jacobi solve (1 = sequential).")
    temperature: float = doc(0.0, "Sampling temperature; 0 = greedy.")
    top_k: int = doc(0, "Keep the k most likely tokens (0 = off).")
    top_p: float = doc(1.0, "Nucleus sampling mass (1 = off).")
    seed: int | None = doc(None, "Sampling seed for reproducible draws.")
    stop_at_eos: bool = doc(True, "Stop at the tokenizer's end-of-sequence token.")
    device: str = doc("cpu", "Torch device: auto, cpu, cuda, cuda:N or mps.")

    def __post_init__(self) -> None:
        _require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        validate_device_name(self.device)
        validate_decoding_options(self.mode, self.prefill_passes, self.temperature, self.top_k, self.top_p,
                                  self.max_new_tokens, self.exact_chunk_size)


@dataclass
class CheckConfig:
    """Options of ``fullband check``."""

    seq_len: int = doc(48, "Tokens in the test sequence.")
    plain_prefix: int = doc(8, "Plain positions before the fused ones.")
    seed: int = doc(0, "Seed of the random model and tokens.")

    def __post_init__(self) -> None:
        _require(_is_int(self.seq_len) and 2 <= self.seq_len <= 512, "seq_len", self.seq_len, "must be in 2..512")
        _require(_is_int(self.plain_prefix) and 1 <= self.plain_prefix < self.seq_len, "plain_prefix",
                 self.plain_prefix, f"must be in 1..seq_len-1={self.seq_len - 1}")


T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build a config dataclass from a mapping, rejecting unknown keys by name."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__} expects a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key(s) {unknown}; known keys: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as err:
        raise ConfigError(f"bad {cls.__name__}: {err}") from None


# ---------------------------------------------------------------------------------------------- training

LR_SCHEDULES = ("cosine", "wsd", "constant")
Z_LOSS_WHEN = ("always", "cooldown", "off")
AUTOCAST = ("auto", "bf16", "off")
PARALLEL = ("ddp", "fsdp")


@dataclass
class ScheduleConfig:
    """Feedback schedule: how many passes each training batch runs (DESIGN.md §3)."""

    feedback_start: float = doc(
        0.75,
        "Fraction of all training steps after which multi-pass batches start; before it every batch is "
        "single-pass. 0 = feedback from the first step (fine-tuning), 1 = never.",
    )
    feedback_end: float = doc(
        1.0,
        "Fraction of all training steps at which multi-pass batches stop (1 = at the end of the run): a value "
        "below 1 places the feedback phase before a single-pass finish, independently of the LR cool-down.",
    )
    pass_mix: tuple[float, ...] = doc(
        (0.88, 0.12),
        "Probabilities of 2, 3, ... passes per batch after feedback_start (must sum to 1). The default "
        "0.88,0.12 with feedback_start=0.75 is the paper's overall 75%/22%/3% single/two/three-pass split; "
        "0,1 with feedback_start=0 always runs 3 passes.",
    )
    ramp_steps: int = doc(
        0,
        "Steps over which the multi-pass share ramps linearly from 0 to 1 after feedback_start (the rest of "
        "the batches stay single-pass during the ramp); 0 = switch at once.",
    )
    two_pass_until: float = doc(
        0.0,
        "Progressive introduction (paper section 3.3): until this fraction of the run every multi-pass batch runs "
        "2 passes; deeper passes from pass_mix start here. 0 = pass_mix from feedback_start on.",
    )

    def __post_init__(self) -> None:
        validate_schedule_config(self)
        self.pass_mix = tuple(float(x) for x in self.pass_mix)  # a list from a file or caller -> hashable tuple


OPTIMIZERS = ("adamw", "muon")


@dataclass
class OptimConfig:
    """The optimiser (AdamW, or Muon + AdamW) and the learning-rate schedule."""

    optimizer: str = doc(
        "adamw",
        "adamw = AdamW on every parameter; muon = torch.optim.Muon on the 2-D weights of muon_params (the paper's "
        "NorMuon split, section 4) and AdamW at lr on the rest (embedding/head, norms).",
    )
    lr: float = doc(3e-4, "Peak learning rate of AdamW (reached at the end of warmup).")
    muon_lr: float = doc(0.02, "optimizer=muon: peak learning rate of Muon (follows the same schedule).")
    muon_weight_decay: float = doc(0.01, "optimizer=muon: Muon's decoupled weight decay (scaled by its LR).")
    muon_momentum: float = doc(0.95, "optimizer=muon: Muon's (Nesterov) momentum, in [0, 1).")
    muon_params: tuple[str, ...] = doc(
        ("blocks", "fusion"),
        "optimizer=muon: modules whose 2-D weights Muon updates (names as in the model's state dict); their "
        "1-D gains stay with AdamW.",
    )
    fusion_lr_mult: float = doc(1.0, "Learning-rate multiplier of the fusion's parameters (W_U, W_G, its norms), > 0.")
    min_lr_ratio: float = doc(0.1, "Final learning rate as a fraction of lr, in [0, 1].")
    betas: tuple[float, float] = doc((0.9, 0.95), "AdamW beta1,beta2, each in [0, 1).")
    eps: float = doc(1e-8, "AdamW epsilon, > 0.")
    weight_decay: float = doc(
        0.1, "Decoupled AdamW weight decay on weight matrices (>= 2-D, embeddings included); norms get none."
    )
    warmup_steps: int = doc(100, "Linear warmup steps from ~0 to lr.")
    schedule: str = doc(
        "wsd",
        "Learning rate after warmup: 'wsd' = constant then linear decay to min_lr over the last decay_fraction "
        "of steps (the paper's warmup-stable-decay), 'cosine' = cosine to min_lr at the last step, "
        "'constant' = lr throughout.",
    )
    decay_fraction: float = doc(
        0.2, "Fraction of all steps in the final cool-down: the WSD decay phase and the z-loss window, in (0, 1]."
    )
    grad_clip: float = doc(1.0, "Clip the global gradient norm to this value; 0 = no clipping.")
    z_loss: float = doc(1e-5, "Weight of the z-loss mean(logsumexp(logits)^2) on the last pass's logits, >= 0.")
    z_loss_when: str = doc(
        "cooldown",
        "When the z-loss applies: 'always', 'cooldown' (only in the last decay_fraction of steps, as in the "
        "paper) or 'off'.",
    )

    def __post_init__(self) -> None:
        if isinstance(self.muon_params, str):
            self.muon_params = (self.muon_params,)
        self.muon_params = tuple(self.muon_params)
        validate_optim_config(self)
        self.betas = (float(self.betas[0]), float(self.betas[1]))


@dataclass
class TrainConfig:
    """The training loop: length, batch, logging, checkpoints and the multi-pass objective's knobs."""

    max_steps: int = doc(1000, "Optimizer steps to train for (ignored when token_budget is set).")
    token_budget: int | None = doc(
        None,
        "Train for this many input tokens instead of max_steps: steps = ceil(budget / (batch_size * seq_len "
        "* grad_accum * world_size)). Counts tokens, not token-equivalent compute.",
    )
    batch_size: int = doc(8, "Rows per micro-batch on each process.")
    seq_len: int = doc(256, "Tokens per row, >= 2 (at most the model's max_seq_len).")
    grad_accum: int = doc(1, "Micro-batches accumulated per optimizer step.")
    seed: int = doc(0, "Seed of everything random in training: schedule, prefix lengths, jitter; >= 0.")
    eval_every: int = doc(0, "Run validation every N steps (and at the end); 0 = never.")
    eval_batches: int = doc(8, "Batches per validation run.")
    checkpoint_every: int = doc(500, "Write a checkpoint every N steps; 0 = only at the end.")
    keep_last: int = doc(3, "Complete checkpoints to keep; older ones are deleted.")
    log_every: int = doc(10, "Write a metrics.jsonl record (and TensorBoard scalars) every N steps.")
    wandb_project: str | None = doc(
        None, "Also log every metrics record to this Weights & Biases project (pip install 'fullband[wandb]'); "
        "none = off. WANDB_MODE=offline keeps the run on disk (out_dir/wandb) for a later `wandb sync`.",
    )
    compile: bool = doc(False, "torch.compile each transformer block (the Python loop over passes stays eager).")
    autocast: str = doc(
        "auto", "Mixed precision: 'auto' = bf16 autocast on CUDA, none elsewhere; 'bf16' = require it; 'off'."
    )
    parallel: str = doc(
        "ddp",
        "How torchrun's processes share the model: 'ddp' = a full replica (weights, gradients, AdamW state) on "
        "each process, fastest while it fits in memory; 'fsdp' = FSDP2, each process holds 1/world_size of them "
        "and gathers a block's weights when it runs it, for models too large to replicate (checkpoints then hold "
        "sharded torch.distributed.checkpoint files plus a full model.safetensors). One process: no effect.",
    )
    feedback_weight: float = doc(1.0, "λ in L = NTP(pass 1) + λ * mean_{k>=2} NTP(pass k); >= 0 (the paper uses 1).")
    jitter: float = doc(0.02, "σ of the Uniform(-σ, σ) noise on carried states before fusing; >= 0.")
    detach_passes: bool = doc(
        False, "Stop gradients between passes (saves memory; the paper backpropagates through all passes)."
    )
    prefix_mixin: bool = doc(
        True,
        "Give each row a random plain prefix p ~ Uniform{1..seq_len-1} (prompt-then-generate, DESIGN.md §3); "
        "false = p = 1 (every position after the first fused).",
    )
    prefix_per_pass: bool = doc(
        False,
        "With prefix_mixin: draw a new plain prefix for every pass after the first (as the paper's training code "
        "applies the mixin inside its pass loop); false = one prefix per row for all its passes.",
    )

    def __post_init__(self) -> None:
        validate_train_config(self)

    def tokens_per_step(self, world_size: int = 1) -> int:
        """Input tokens consumed by one optimizer step over all processes."""
        return self.batch_size * self.seq_len * self.grad_accum * world_size

    def total_steps(self, world_size: int = 1) -> int:
        """Steps of the whole run: max_steps, or enough steps to consume token_budget."""
        if self.token_budget is None:
            return self.max_steps
        return max(1, math.ceil(self.token_budget / self.tokens_per_step(world_size)))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_schedule_config(c: ScheduleConfig) -> None:
    _require(_is_number(c.feedback_start) and 0 <= c.feedback_start <= 1, "feedback_start", c.feedback_start,
             "must be a fraction of the run in [0, 1]")
    _require(_is_number(c.feedback_end) and 0 <= c.feedback_end <= 1, "feedback_end", c.feedback_end,
             "must be a fraction of the run in [0, 1]: the feedback phase cannot outlast the run")
    _require(c.feedback_start == 1 or c.feedback_end > c.feedback_start, "feedback_end", c.feedback_end,
             f"must be after feedback_start={c.feedback_start}: the feedback phase needs at least one step")
    mix = c.pass_mix
    _require(isinstance(mix, (list, tuple)) and len(mix) >= 1 and all(_is_number(x) and 0 <= x <= 1 for x in mix),
             "pass_mix", mix, "must be a non-empty list of probabilities in [0, 1] for 2, 3, ... passes")
    _require(abs(sum(mix) - 1) <= 1e-6, "pass_mix", mix, f"must sum to 1 (sums to {sum(mix):.6g})")
    _require(_is_int(c.ramp_steps) and c.ramp_steps >= 0, "ramp_steps", c.ramp_steps, "must be an integer >= 0")
    _require(_is_number(c.two_pass_until) and 0 <= c.two_pass_until <= 1, "two_pass_until", c.two_pass_until,
             "must be a fraction of the run in [0, 1]")
    _require(c.two_pass_until == 0 or c.two_pass_until >= c.feedback_start, "two_pass_until", c.two_pass_until,
             f"must be 0 or at least feedback_start={c.feedback_start}: 2-pass batches come first, after it")


def validate_optim_config(c: OptimConfig) -> None:
    _require(c.optimizer in OPTIMIZERS, "optimizer", c.optimizer, f"must be one of {OPTIMIZERS}")
    _require(_is_number(c.lr) and c.lr > 0, "lr", c.lr, "must be > 0")
    _require(_is_number(c.muon_lr) and c.muon_lr > 0, "muon_lr", c.muon_lr, "must be > 0")
    _require(_is_number(c.muon_weight_decay) and c.muon_weight_decay >= 0, "muon_weight_decay", c.muon_weight_decay,
             "must be >= 0")
    _require(_is_number(c.muon_momentum) and 0 <= c.muon_momentum < 1, "muon_momentum", c.muon_momentum,
             "must be in [0, 1)")
    _require(len(c.muon_params) > 0 and all(isinstance(x, str) and x for x in c.muon_params), "muon_params",
             c.muon_params, "must be a non-empty list of module names, e.g. blocks,fusion")
    _require(_is_number(c.fusion_lr_mult) and c.fusion_lr_mult > 0, "fusion_lr_mult", c.fusion_lr_mult, "must be > 0")
    _require(_is_number(c.min_lr_ratio) and 0 <= c.min_lr_ratio <= 1, "min_lr_ratio", c.min_lr_ratio,
             "must be in [0, 1]")
    betas = c.betas
    _require(isinstance(betas, (list, tuple)) and len(betas) == 2 and all(_is_number(b) and 0 <= b < 1 for b in betas),
             "betas", betas, "must be two values in [0, 1)")
    _require(_is_number(c.eps) and c.eps > 0, "eps", c.eps, "must be > 0")
    _require(_is_number(c.weight_decay) and c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0")
    _require(_is_int(c.warmup_steps) and c.warmup_steps >= 0, "warmup_steps", c.warmup_steps,
             "must be an integer >= 0")
    _require(c.schedule in LR_SCHEDULES, "schedule", c.schedule, f"must be one of {LR_SCHEDULES}")
    _require(_is_number(c.decay_fraction) and 0 < c.decay_fraction <= 1, "decay_fraction", c.decay_fraction,
             "must be in (0, 1]")
    _require(_is_number(c.grad_clip) and c.grad_clip >= 0, "grad_clip", c.grad_clip, "must be >= 0 (0 = off)")
    _require(_is_number(c.z_loss) and c.z_loss >= 0, "z_loss", c.z_loss, "must be >= 0")
    _require(c.z_loss_when in Z_LOSS_WHEN, "z_loss_when", c.z_loss_when, f"must be one of {Z_LOSS_WHEN}")


def validate_train_config(c: TrainConfig) -> None:
    for name, low in (("max_steps", 1), ("batch_size", 1), ("seq_len", 2), ("grad_accum", 1), ("seed", 0),
                      ("eval_every", 0), ("eval_batches", 1), ("checkpoint_every", 0), ("keep_last", 1),
                      ("log_every", 1)):
        value = getattr(c, name)
        _require(_is_int(value) and value >= low, name, value, f"must be an integer >= {low}")
    if c.token_budget is not None:
        _require(_is_int(c.token_budget) and c.token_budget >= 1, "token_budget", c.token_budget,
                 "must be an integer >= 1 (or None)")
    for name in ("compile", "detach_passes", "prefix_mixin", "prefix_per_pass"):
        _require(isinstance(getattr(c, name), bool), name, getattr(c, name), "must be true or false")
    _require(c.autocast in AUTOCAST, "autocast", c.autocast, f"must be one of {AUTOCAST}")
    _require(c.parallel in PARALLEL, "parallel", c.parallel, f"must be one of {PARALLEL}")
    _require(_is_number(c.feedback_weight) and c.feedback_weight >= 0, "feedback_weight", c.feedback_weight,
             "must be >= 0")
    _require(_is_number(c.jitter) and c.jitter >= 0, "jitter", c.jitter, "must be >= 0")
    if c.wandb_project is not None:
        ok = isinstance(c.wandb_project, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", c.wandb_project)
        _require(bool(ok), "wandb_project", c.wandb_project,
                 "must be a W&B project name: letters, digits, '_', '-', '.' (at most 128), or none")


# ---------------------------------------------------------------------------------------------- fullband train

TOKENIZERS = ("byte", "bpe")
DATA_FORMATS = ("text", "sft")


@dataclass
class TrainModelConfig(ModelConfig):
    """Architecture ([model]); vocab_size 0 takes the tokenizer's vocabulary."""

    vocab_size: int = doc(0, "Number of token ids; 0 = the tokenizer's vocabulary rounded up to a multiple of 64.")

    def __post_init__(self) -> None:
        _require(_is_int(self.vocab_size) and self.vocab_size >= 0, "vocab_size", self.vocab_size,
                 "must be an integer >= 0 (0 = from the tokenizer)")
        self.resolve(max(self.vocab_size, 1))  # validates every other field

    def resolve(self, tokenizer_vocab: int) -> ModelConfig:
        """The ModelConfig to build, with vocab_size filled in (and checked) against the tokenizer."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        if self.vocab_size == 0:
            fields["vocab_size"] = 64 * math.ceil(tokenizer_vocab / 64)
        elif self.vocab_size < tokenizer_vocab:
            raise ConfigError(f"model.vocab_size={self.vocab_size} is invalid: the tokenizer has {tokenizer_vocab} "
                              "tokens; set model.vocab_size >= that, or 0 to take it from the tokenizer")
        return ModelConfig(**fields)


@dataclass
class DataConfig:
    """Training data ([data])."""

    source: str = doc("shakespeare", "Corpus: 'shakespeare' (embedded default), a text file or directory, "
                      "'hf:NAME[:field]' (Hugging Face datasets), or with format=sft a JSONL file.")
    format: str = doc("text", "text = language modelling on the corpus; sft = prompt/completion or chat JSONL "
                      "with the prompt masked out of the loss.")
    validation_source: str | None = doc(None, "sft: JSONL for validation (text sources bring their own split).")
    tokenizer: str = doc("byte", "byte (UTF-8 bytes, no training) or bpe (trained on the train split).")
    bpe_vocab_size: int = doc(2048, "Vocabulary size of a trained BPE tokenizer.")

    def __post_init__(self) -> None:
        _require(isinstance(self.source, str) and bool(self.source), "data.source", self.source,
                 "give a corpus name, a path or hf:NAME")
        _require(self.format in DATA_FORMATS, "data.format", self.format, f"must be one of {DATA_FORMATS}")
        _require(self.tokenizer in TOKENIZERS, "data.tokenizer", self.tokenizer, f"must be one of {TOKENIZERS}")
        _require(_is_int(self.bpe_vocab_size) and 260 <= self.bpe_vocab_size <= 1_000_000, "data.bpe_vocab_size",
                 self.bpe_vocab_size, "must be an integer in 260..1000000")


HF_PREFIX = "hf:"  # init_from="hf:PATH": retrofit the transformers causal LM saved in PATH
RETROFIT_LAST_HIDDEN = "last_hidden"


@dataclass
class RetrofitTrainConfig:
    """Retrofitting a transformers causal LM ([retrofit]; read only with init_from='hf:PATH')."""

    feedback_source: str = doc(
        RETROFIT_LAST_HIDDEN,
        "Hidden state of the pretrained model that feeds back: 'last_hidden' = its last hidden state (after the "
        "final norm for Llama, Qwen2, GPT-2), or N = the residual stream after block N, 1..n_layers-1 (quoted in a "
        'config file: feedback_source = "2").',
    )

    def __post_init__(self) -> None:
        source = self.feedback_source
        ok = isinstance(source, str) and (source == RETROFIT_LAST_HIDDEN or (source.isdigit() and int(source) >= 1))
        _require(ok, "feedback_source", source, "must be 'last_hidden' or a block index N >= 1 (at most the "
                 "pretrained model's n_layers - 1)")
        if source != RETROFIT_LAST_HIDDEN:
            self.feedback_source = str(int(source))

    def resolve(self) -> str | int:
        """The ``feedback_source`` argument of :func:`fullband.retrofit`: 'last_hidden' or an int."""
        return RETROFIT_LAST_HIDDEN if self.feedback_source == RETROFIT_LAST_HIDDEN else int(self.feedback_source)


@dataclass
class TrainRunConfig:
    """``fullband train``: all sections of one run."""

    model: TrainModelConfig = field(default_factory=TrainModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(eval_every=250))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig())
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig())
    retrofit: RetrofitTrainConfig = field(default_factory=RetrofitTrainConfig)
    out_dir: str = doc("runs/train", "Run directory: checkpoints/, metrics.jsonl, config.toml, model/ at the end.")
    resume: bool = doc(False, "Continue from the latest complete checkpoint in out_dir.")
    init_from: str | None = doc(
        None, "Start from this model directory (its architecture replaces [model]; model.feedback decides whether "
        "fusion weights are added; a retrofitted model's directory continues it), or from 'hf:PATH': the "
        "transformers causal LM (Llama, Qwen2, GPT-2, ...) saved with save_pretrained, with its tokenizer, in the "
        "local directory PATH, retrofitted with latent feedback ([retrofit]) and tokenized with its own tokenizer.",
    )
    device: str = doc("auto", "auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps.")
    eval_passes: tuple[int, ...] = doc(
        (1, 2, 3), "Pass counts validated: 1 = standard, k = fused prefill with k-1 extra passes.",
    )

    def __post_init__(self) -> None:
        validate_device_name(self.device)
        _require(bool(self.eval_passes) and all(_is_int(k) and k >= 1 for k in self.eval_passes), "eval_passes",
                 self.eval_passes, "must be a non-empty list of integers >= 1")
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")
        hf = isinstance(self.init_from, str) and self.init_from.startswith(HF_PREFIX)
        if hf:
            _require(bool(self.init_from[len(HF_PREFIX):].strip()), "init_from", self.init_from,
                     "give the directory after hf: (init_from='hf:PATH')")
            _require(self.model.feedback, "model.feedback", self.model.feedback,
                     "a retrofitted model always has the fusion; use schedule.feedback_start=1 to train it single-pass")
        _require(hf or self.retrofit.feedback_source == RETROFIT_LAST_HIDDEN, "retrofit.feedback_source",
                 self.retrofit.feedback_source, "applies only to init_from='hf:PATH' (a retrofitted model's "
                 "directory keeps the source it was built with)")


# ---------------------------------------------------------------------------------------------- fullband eval

EVAL_DTYPES = ("float32", "float64", "bfloat16")


@dataclass
class LmEvalConfig:
    """``fullband eval``: lm-evaluation-harness tasks on a checkpoint, through the ``fullband`` lm-eval model."""

    checkpoint: str = doc("", "Model directory with its tokenizer (fullband train's out_dir/model); required.")
    tasks: tuple[str, ...] = doc((), "Comma-separated lm-eval task (or group) names; required.")
    num_fewshot: int | None = doc(None, "Few-shot examples per prompt; none = each task's default.")
    include_path: str | None = doc(
        None, "Directory of extra task YAML files (e.g. local tasks with dataset_path: json)."
    )
    include_defaults: bool = doc(
        True, "Also index lm-eval's built-in tasks; false = only include_path (much faster to start)."
    )
    mode: str = doc(DEFAULT_SCORE_MODE, "Decoding mode: standard | soft | fused | exact (which positions are fused: "
                    "see fullband.integrations.lm_eval.adapter).")
    prefill_passes: int = doc(1, "fused mode: extra fused (Jacobi) passes over the context.")
    exact_chunk_size: int = doc(1, "Exact parts (continuations; exact-mode contexts): chunk per exact Jacobi solve "
                                "(1 = sequential).")
    batch_size: int = doc(16, "Requests per model batch.")
    limit: int | None = doc(None, "Evaluate only the first N documents of each task (none = all).")
    max_gen_toks: int = doc(256, "Default cap on generated tokens for generate_until tasks.")
    device: str = doc("cpu", "Torch device: auto, cpu, cuda, cuda:N or mps.")
    dtype: str = doc("float32", f"Model dtype: one of {EVAL_DTYPES}.")
    seed: int = doc(0, "Seed of the few-shot sampling and of every other random choice of lm-eval.")
    log_samples: bool = doc(False, "Also save every request and response (samples.json).")
    out_dir: str = doc("runs/eval", "Run directory: results.json (and samples.json).")

    def __post_init__(self) -> None:
        _require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        validate_device_name(self.device)
        self.tasks = tuple(self.tasks)
        _require(len(self.tasks) > 0 and all(isinstance(t, str) and t for t in self.tasks), "tasks", self.tasks,
                 "give one or more task names (--tasks a,b)")
        if self.num_fewshot is not None:
            _require(_is_int(self.num_fewshot) and self.num_fewshot >= 0, "num_fewshot", self.num_fewshot,
                     "must be an integer >= 0 (or none)")
        if self.limit is not None:
            _require(_is_int(self.limit) and self.limit >= 1, "limit", self.limit, "must be an integer >= 1 (or none)")
        _require(self.mode in DECODING_MODES, "mode", self.mode, f"must be one of {DECODING_MODES}")
        for name, low in (("prefill_passes", 0), ("exact_chunk_size", 1), ("batch_size", 1), ("max_gen_toks", 1),
                          ("seed", 0)):
            value = getattr(self, name)
            _require(_is_int(value) and value >= low, name, value, f"must be an integer >= {low}")
        _require(self.dtype in EVAL_DTYPES, "dtype", self.dtype, f"must be one of {EVAL_DTYPES}")
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")


# ---------------------------------------------------------------------------------------------- presets

# Keys (dotted, "train.seq_len") a config file or the command line set: configio builds a config inside
# explicit_keys(...), so that its __post_init__ keeps them over the preset's values.
_EXPLICIT: ContextVar[frozenset[str]] = ContextVar("fullband_explicit_keys", default=frozenset())


@contextmanager
def explicit_keys(keys: Iterable[str]) -> Iterator[None]:
    """Within this block, configs being built treat ``keys`` as given (configio: the file's and the command line's)."""
    token = _EXPLICIT.set(frozenset(keys))
    try:
        yield
    finally:
        _EXPLICIT.reset(token)


def apply_preset(config: Any, presets: dict[str, dict[str, Any]]) -> None:
    """Give ``config`` the values of its preset (``config.preset``), the one preset mechanism of every study.

    Precedence: defaults < preset < what the caller gave. A field takes the preset's value when it is None by
    default and still None ("none = the preset's"), or when it still has its default and no config file or command
    line set it; from Python, a field given its default value counts as left at the default. A preset entry that
    is a mapping sets keys of that section (``{"model": {"d_model": 32}}``).
    """
    _require(config.preset in presets, "preset", config.preset, f"must be one of {tuple(presets)}")
    explicit = _EXPLICIT.get()
    for name, value in presets[config.preset].items():
        f = {f.name: f for f in dataclasses.fields(config)}[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        current = getattr(config, name)
        if isinstance(value, dict):  # a section: replace() runs its own checks again
            changes = {key: v for key, v in value.items()
                       if _takes_preset(getattr(current, key), getattr(default, key), f"{name}.{key}", explicit)}
            setattr(config, name, dataclasses.replace(current, **changes) if changes else current)
        elif _takes_preset(current, default, name, explicit):
            setattr(config, name, value)


def _takes_preset(current: Any, default: Any, key: str, explicit: frozenset[str]) -> bool:
    if current is None and default is None:
        return True
    return key not in explicit and current == default


# ---------------------------------------------------------------------------------------------- fullband compare

EXACT_METHODS = ("sequential", "jacobi", "chunked")

# Presets of ``fullband compare``: what each changes relative to CompareConfig's defaults, which *are* the
# "default" preset (so ``--help`` shows them). Precedence: defaults < preset < config file < command line
# (or < the arguments given in Python): see apply_preset.
COMPARE_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # 2 CPU cores, <= ~10 minutes including evaluation
    "smoke": {  # tests and CI: seconds
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        "train": {"token_budget": 1280, "batch_size": 4, "seq_len": 32, "eval_batches": 1},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "budgets": [1.0, 1.5, 2.0], "seeds": 1, "workers": 1, "stability_ablation": True,
        "eval_windows": 8, "eval_batch_size": 8, "stability_windows": 4, "stability_passes": 20,
    },
    "gpu": {  # one GPU, minutes; about one epoch of the Shakespeare train split at the largest budget
        "model": {"d_model": 384, "n_layers": 6, "n_heads": 6},
        "train": {"token_budget": 2_000_000, "batch_size": 16, "seq_len": 512},
        "optim": {"lr": 1e-3, "warmup_steps": 50},
        "eval_windows": 512, "eval_batch_size": 64, "stability_windows": 32, "exact_method": "jacobi",
    },
}


@dataclass
class CompareConfig:
    """``fullband compare``: does latent feedback buy training tokens? Baselines at several token budgets and
    full-bandwidth models at 1x, evaluated on the test split in every mode, plus the stability diagnostic.

    ``CompareConfig(preset="smoke")``, a config file and the command line apply a preset the same way
    (:func:`apply_preset`); the sections' defaults below are the "default" preset.
    """

    preset: str = doc("default", f"Settings to start from: one of {tuple(COMPARE_PRESETS)}. default = 2 CPU cores in "
                      "<= ~10 min; smoke = seconds (tests/CI); gpu = larger model and budget. Values from a config "
                      "file or the command line override the preset's.")
    model: TrainModelConfig = field(default_factory=lambda: TrainModelConfig(d_model=128, n_layers=4, n_heads=4))
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        token_budget=512_000, batch_size=16, seq_len=128, eval_batches=4, checkpoint_every=0))  # 250 steps at 1x
    # The best recipe found by `fullband recipe` (docs/results/recipe): Muon on the hidden matrices with a 3x
    # learning rate on the fusion, the input norm (ModelConfig's default), feedback from the first step.
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(
        optimizer="muon", lr=1e-3, muon_lr=0.02, muon_weight_decay=0.01, fusion_lr_mult=3.0, warmup_steps=25))
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(feedback_start=0.0))
    budgets: tuple[float, ...] = doc(
        (0.5, 1.0, 1.5), "Baseline token budgets as multiples of train.token_budget (the unit, 1x); the "
        "full-bandwidth models train to 1x. At least two, so the baseline's loss-vs-tokens curve can be fitted. "
        "(Each run sets model.feedback and its own budget itself; train.max_steps and train.eval_every are unused.)")
    seeds: int = doc(2, "Repeat every run with seeds train.seed, train.seed+1, ...; >1 reports mean ± sd.")
    fused_passes: tuple[int, ...] = doc(
        (1, 2, 4), "Fused prefill modes to evaluate: k extra fused passes over each window (standard = 0).")
    exact_method: str = doc(
        "sequential", f"Exact mode: one of {EXACT_METHODS}: sequential (one position at a time with the KV cache, "
        "the definition), jacobi (whole-window passes until max|Δh| < exact_tol) or chunked (Jacobi per chunk).")
    exact_tol: float = doc(1e-4, "jacobi/chunked: stop once max|h^(k) - h^(k-1)| < exact_tol; 0 = run until exact.")
    exact_chunk_size: int = doc(64, "chunked: positions per chunk.")
    exact_check_windows: int = doc(
        4, "jacobi/chunked: windows on which exact mode is checked against the sequential definition; 0 = skip.")
    eval_windows: int = doc(256, "Test-split windows (train.seq_len tokens each, spread evenly over the split).")
    eval_batch_size: int = doc(32, "Windows per evaluation batch.")
    stability_passes: int = doc(100, "Stability diagnostic: fused prefill passes 1..N (the paper's Figure 3 uses "
                                "1000; then raise stability_seq_len, see there).")
    stability_windows: int = doc(16, "Stability diagnostic: validation-split windows.")
    stability_seq_len: int | None = doc(
        None, "Stability diagnostic window length; none = train.seq_len. A window of T tokens is exact after T "
        "passes, so passes beyond T show nothing new; at most model.max_seq_len.")
    stability_ablation: bool = doc(
        False, "Also train the 1-/2-pass-only model (schedule.pass_mix = 1.0) for the stability diagnostic.")
    train_eval_points: int = doc(
        0, "Validate the feedback runs this many times during training (1, 2 and 3 passes), for the gap between "
        "fused and plain passes against training steps; 0 = only at the end.")
    workers: int = doc(
        2, "Training runs at a time, each in its own process with the torch threads shared out (2 on 2 cores: "
        "small models use one core poorly). The numbers do not depend on it.")
    out_dir: str = doc("runs/compare", "Run directory: one sub-directory per training run, report.md, "
                       "results.json and the plots.")
    device: str = doc("auto", "auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps.")

    def __post_init__(self) -> None:
        apply_preset(self, COMPARE_PRESETS)
        self.budgets = tuple(sorted(float(b) for b in self.budgets))
        self.fused_passes = tuple(self.fused_passes)
        validate_device_name(self.device)
        validate_compare_config(self)


def validate_compare_config(c: CompareConfig) -> None:
    _require(c.preset in COMPARE_PRESETS, "preset", c.preset, f"must be one of {tuple(COMPARE_PRESETS)}")
    _require(len(c.budgets) >= 2 and len(set(c.budgets)) == len(c.budgets) and all(
        _is_number(b) and b > 0 for b in c.budgets), "budgets", c.budgets,
        "must be at least two distinct multiples > 0 of train.token_budget")
    _require(c.train.token_budget is not None, "train.token_budget", c.train.token_budget,
             "must be set: it is the 1x budget every run is measured in")
    _require(c.train.seq_len <= c.model.max_seq_len, "train.seq_len", c.train.seq_len,
             f"must be at most model.max_seq_len={c.model.max_seq_len}")
    _require(c.data.format == "text", "data.format", c.data.format, "must be 'text' (language modelling)")
    _require(len(c.fused_passes) >= 1 and all(_is_int(k) and k >= 1 for k in c.fused_passes), "fused_passes",
             c.fused_passes, "must be a non-empty list of integers >= 1")
    _require(c.exact_method in EXACT_METHODS, "exact_method", c.exact_method, f"must be one of {EXACT_METHODS}")
    _require(_is_number(c.exact_tol) and c.exact_tol >= 0, "exact_tol", c.exact_tol, "must be >= 0 (0 = until exact)")
    for name, low in (("seeds", 1), ("exact_chunk_size", 1), ("exact_check_windows", 0), ("eval_windows", 1),
                      ("eval_batch_size", 1), ("stability_passes", 1), ("stability_windows", 1),
                      ("train_eval_points", 0), ("workers", 1)):
        value = getattr(c, name)
        _require(_is_int(value) and value >= low, name, value, f"must be an integer >= {low}")
    if c.stability_seq_len is not None:
        _require(_is_int(c.stability_seq_len) and 2 <= c.stability_seq_len <= c.model.max_seq_len,
                 "stability_seq_len", c.stability_seq_len, f"must be in 2..model.max_seq_len={c.model.max_seq_len}")
    _require(isinstance(c.stability_ablation, bool), "stability_ablation", c.stability_ablation,
             "must be true or false")
    _require(isinstance(c.out_dir, str) and bool(c.out_dir), "out_dir", c.out_dir, "give a directory")


# ---------------------------------------------------------------------------------------------- fullband recipe

# Each ingredient of the recipe, toggled away from the compare default (the best recipe found) one at a time:
# name -> (overrides of the compare config, whether the baseline changes too, what it tests).
RECIPE_VARIANTS: dict[str, tuple[dict[str, Any], bool, str]] = {
    "best": ({}, False, "the compare default: the best recipe found"),
    "no-input-norm": ({"model.input_norm": False}, True,
                      "plain positions take raw embeddings, only fused inputs are normalised (the old model)"),
    "input-gain-1": ({"model.input_norm_init": 1.0}, True, "the input norm's gain starts at 1 instead of 0.02"),
    "shared-gate-norm": ({"model.gate_norm": "shared"}, False, "the gate reads the input norm (the paper's "
                         "glu_cross(h, input_rmsnorm(e))) instead of its own RMSNorm"),
    "adamw": ({"optim.optimizer": "adamw"}, True, "AdamW (wd 0.1) on the hidden matrices too, instead of Muon"),
    "fusion-lr-x1": ({"optim.fusion_lr_mult": 1.0}, False, "the fusion at the learning rate of the rest"),
    "late-feedback": ({"schedule.feedback_start": 0.75}, False,
                      "feedback only in the last quarter (the paper's 75% single-pass start)"),
    "progressive": ({"schedule.two_pass_until": 0.5}, False, "only 2-pass batches in the first half"),
    "prefix-per-pass": ({"train.prefix_per_pass": True}, False, "a new plain prefix for every pass"),
    "single-pass-finish": ({"schedule.feedback_end": 0.8}, False, "the last 20% of the steps single-pass"),
    "2-pass-only": ({"schedule.pass_mix": (1.0,)}, False,
                    "only 1- and 2-pass batches (the paper's divergent schedule)"),
}
RECIPE_PRESETS: dict[str, dict[str, Any]] = {
    "default": dict(compare_preset="default", widths=(64, 256), eval_windows=128),
    "smoke": dict(compare_preset="smoke", widths=(16,)),
}


@dataclass
class RecipeConfig:
    """``fullband recipe``: which ingredient of the recipe moves the fused-vs-plain gap, by how much, and how the
    gap moves with width and with feedback steps. Every run is a ``fullband compare`` run of the preset."""

    preset: str = doc("default", f"One of {tuple(RECIPE_PRESETS)}: default = the compare default preset and widths "
                      "64,256 (about an hour on 2 CPU cores); smoke = seconds (tests).")
    compare_preset: str | None = doc(None, "The fullband compare preset every run starts from (none = the preset's).")
    variants: tuple[str, ...] = doc(tuple(RECIPE_VARIANTS), f"Rows of the ablation, from {tuple(RECIPE_VARIANTS)}.")
    widths: tuple[int, ...] | None = doc(
        None, "d_model of the extra best-recipe runs (baseline and feedback at 1x) next to the preset's own width.")
    seeds: int = doc(2, "Seeds per run: every number is a mean over them.")
    eval_windows: int | None = doc(None, "Test windows per model (none = the compare preset's).")
    train_eval_points: int = doc(8, "Validations during each feedback run (the gap against feedback steps).")
    workers: int = doc(2, "Training runs at a time (see fullband compare --workers).")
    out_dir: str = doc("runs/recipe", "Run directory: runs, report.md, results.json, plots.")
    device: str = doc("auto", "auto (cuda when available, else cpu), cpu, cuda or cuda:N.")

    def __post_init__(self) -> None:
        apply_preset(self, RECIPE_PRESETS)
        self.variants, self.widths = tuple(self.variants), tuple(self.widths)
        _require(self.compare_preset in COMPARE_PRESETS, "compare_preset", self.compare_preset,
                 f"must be one of {tuple(COMPARE_PRESETS)}")
        _require(len(self.variants) > 0 and all(v in RECIPE_VARIANTS for v in self.variants), "variants",
                 self.variants, f"must be a non-empty list from {tuple(RECIPE_VARIANTS)}")
        _require(all(_is_int(w) and w >= 8 and w % 8 == 0 for w in self.widths), "widths", self.widths,
                 "must be integers >= 8 and divisible by 8 (4 heads of an even size)")
        _require_ints(self, {"seeds": 1, "train_eval_points": 0, "workers": 1})
        if self.eval_windows is not None:
            _require_ints(self, {"eval_windows": 1})
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")


# ---------------------------------------------------------------------------------------------- fullband eval-reasoning

# Each preset fills the fields left at None. smoke: the tests (seconds); default: the committed report (minutes on
# 2 CPU cores); long: more steps and problems, for a GPU or a patient CPU.
REASONING_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(min_length=2, max_length=4, strides=(1, 0), train_examples=500, test_per_length=4, d_model=32,
                  n_layers=1, n_heads=2, steps=8, batch_size=8, lr=3e-3),
    "default": dict(min_length=2, max_length=6, strides=(1, 2, 4, 0), train_examples=100_000, test_per_length=60,
                    d_model=64, n_layers=2, n_heads=4, steps=4000, batch_size=64, lr=5e-4),
    "long": dict(min_length=2, max_length=12, strides=(1, 2, 3, 4, 0), train_examples=200_000, test_per_length=200,
                 d_model=128, n_layers=4, n_heads=4, steps=10_000, batch_size=64, lr=2e-3),
}
REASONING_FAMILIES = ("swaps", "sum")


def _require_ints(config: Any, limits: dict[str, int]) -> None:
    for name, low in limits.items():
        value = getattr(config, name)
        _require(_is_int(value) and value >= low, name, value, f"must be an integer >= {low}")


@dataclass
class ReasoningConfig:
    """``fullband eval-reasoning``: shorter traces at equal accuracy? (fullband.experiments.reasoning)."""

    preset: str = doc("default", f"Sizes of everything left at none: one of {tuple(REASONING_PRESETS)}.")
    out_dir: str = doc("runs/reasoning", "Run directory: data/, baseline/, fullband/, results.json, report.md, PNGs.")
    family: str = doc("swaps", f"Problem family: one of {REASONING_FAMILIES} (fullband.tasks.reasoning).")
    modulus: int = doc(5, "sum family: values are running sums modulo this (2..10).")
    min_length: int | None = doc(None, "Shortest problem (number of variables = difficulty level).")
    max_length: int | None = doc(None, "Longest problem (at most 26).")
    strides: tuple[int, ...] | None = doc(
        None, "Trace granularities trained on and evaluated: s = every s-th intermediate value, 0 = answer only."
    )
    train_examples: int | None = doc(None, "Training examples (random length and stride; test problems excluded).")
    test_per_length: int | None = doc(None, "Test problems per length, each solved at every stride.")
    d_model: int | None = doc(None, "Model width (both models).")
    n_layers: int | None = doc(None, "Transformer blocks (both models).")
    n_heads: int | None = doc(None, "Attention heads (both models).")
    steps: int | None = doc(None, "Training steps (both models, the same batches).")
    batch_size: int | None = doc(None, "Training batch size.")
    lr: float | None = doc(None, "Peak learning rate.")
    feedback_start: float = doc(
        0.75, "fullband model: fraction of the steps trained single-pass before multi-pass (the paper's 75%)."
    )
    pass_mix: tuple[float, ...] = doc((0.88, 0.12), "fullband model: probabilities of 2, 3, ... passes afterwards.")
    modes: tuple[str, ...] = doc(("standard", "soft", "fused"), "Decoding modes of the fullband model (greedy).")
    fused_passes: int = doc(2, "fused mode: extra fused passes over the prompt.")
    seed: int = doc(0, "Seed of the problems, the initial weights and the batches.")
    threads: int = doc(1, "torch CPU threads (1 is fastest for tiny models on a shared CPU).")
    device: str = doc("cpu", "Torch device for training and decoding: auto, cpu, cuda, cuda:N or mps.")
    progress: bool = doc(True, "Progress bars.")
    reuse_models: bool = doc(False, "Evaluate the models an earlier run left in out_dir instead of training.")

    def __post_init__(self) -> None:
        validate_device_name(self.device)
        apply_preset(self, REASONING_PRESETS)
        self.strides = tuple(self.strides)
        self.modes = tuple(self.modes)
        self.pass_mix = tuple(float(x) for x in self.pass_mix)
        _require_ints(self, {"min_length": 1, "train_examples": 1, "test_per_length": 1, "d_model": 2, "n_layers": 1,
                             "n_heads": 1, "steps": 1, "batch_size": 1, "fused_passes": 0, "seed": 0, "threads": 1})
        _require(self.family in REASONING_FAMILIES, "family", self.family, f"must be one of {REASONING_FAMILIES}")
        _require(_is_int(self.modulus) and 2 <= self.modulus <= 10, "modulus", self.modulus, "must be in 2..10")
        _require(_is_int(self.max_length) and self.min_length <= self.max_length <= 26, "max_length",
                 self.max_length, f"must be in min_length={self.min_length}..26")
        _require(len(self.strides) > 0 and all(_is_int(s) and s >= 0 for s in self.strides), "strides",
                 self.strides, "must be a non-empty list of integers >= 0 (0 = answer only)")
        _require(len(self.modes) > 0 and all(m in DECODING_MODES for m in self.modes), "modes", self.modes,
                 f"must be a non-empty list from {DECODING_MODES}")
        _require(_is_number(self.lr) and self.lr > 0, "lr", self.lr, "must be > 0")
        _require(_is_number(self.feedback_start) and 0 <= self.feedback_start < 1, "feedback_start",
                 self.feedback_start, "must be in [0, 1): the fullband model needs some multi-pass steps")
        ScheduleConfig(feedback_start=self.feedback_start, pass_mix=self.pass_mix)  # validates pass_mix
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")


# ---------------------------------------------------------------------------------------------- fullband eval-state

STATE_TASKS = ("completion", "memory", "registers")
STATE_PREFILLS = ("standard", "one-step", "exact")
STATE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(seq_len=12, train_per_task=200, probe_train=32, probe_test=32, d_model=32, n_layers=2, n_heads=2,
                  steps=8, batch_size=8, lr=3e-3),
    "default": dict(seq_len=24, train_per_task=10_000, probe_train=600, probe_test=400, d_model=64, n_layers=3,
                    n_heads=4, steps=2000, batch_size=64, lr=1e-3),
    "long": dict(seq_len=32, train_per_task=40_000, probe_train=2000, probe_test=1000, d_model=128, n_layers=4,
                 n_heads=4, steps=6000, batch_size=64, lr=2e-3),
}


@dataclass
class StateTrackingConfig:
    """``fullband eval-state``: linear probes of the final token's residual stream at every depth (paper Figure 7)."""

    preset: str = doc("default", f"Sizes of everything left at none: one of {tuple(STATE_PRESETS)}.")
    out_dir: str = doc("runs/state-tracking", "Run directory: data/, baseline/, fullband/, results.json, report.md, "
                       "PNG.")
    tasks: tuple[str, ...] = doc(STATE_TASKS, f"Tasks (trained together, probed separately): from {STATE_TASKS}.")
    seq_len: int | None = doc(None, "Tokens per sequence, task letter and final '?' included (even).")
    train_per_task: int | None = doc(None, "Training sequences per task.")
    probe_train: int | None = doc(None, "Fresh sequences per task to fit each probe on.")
    probe_test: int | None = doc(None, "Fresh sequences per task to measure each probe on.")
    d_model: int | None = doc(None, "Model width (both models).")
    n_layers: int | None = doc(None, "Transformer blocks (both models); depths 0..n_layers are probed.")
    n_heads: int | None = doc(None, "Attention heads (both models).")
    steps: int | None = doc(None, "Training steps (both models, the same batches).")
    batch_size: int | None = doc(None, "Training batch size.")
    lr: float | None = doc(None, "Peak learning rate.")
    feedback_start: float = doc(
        0.75, "fullband model: fraction of the steps trained single-pass before multi-pass (the paper's 75%)."
    )
    pass_mix: tuple[float, ...] = doc((0.88, 0.12), "fullband model: probabilities of 2, 3, ... passes afterwards.")
    prefills: tuple[str, ...] = doc(STATE_PREFILLS, "Prefills probed: standard (1 pass), one-step (2 passes), exact.")
    ridge: float = doc(1e-2, "Ridge penalty of the probes (times the number of examples).")
    seed: int = doc(0, "Seed of the data, the initial weights and the batches.")
    threads: int = doc(1, "torch CPU threads (1 is fastest for tiny models on a shared CPU).")
    device: str = doc("cpu", "Torch device for training and probing: auto, cpu, cuda, cuda:N or mps.")
    progress: bool = doc(True, "Progress bars.")
    reuse_models: bool = doc(False, "Probe the models an earlier run left in out_dir instead of training.")

    def __post_init__(self) -> None:
        validate_device_name(self.device)
        apply_preset(self, STATE_PRESETS)
        self.tasks, self.prefills = tuple(self.tasks), tuple(self.prefills)
        self.pass_mix = tuple(float(x) for x in self.pass_mix)
        _require_ints(self, {"train_per_task": 1, "probe_train": 2, "probe_test": 1, "d_model": 2, "n_layers": 1,
                             "n_heads": 1, "steps": 1, "batch_size": 1, "seed": 0, "threads": 1})
        _require(_is_int(self.seq_len) and self.seq_len >= 6 and self.seq_len % 2 == 0, "seq_len", self.seq_len,
                 "must be an even integer >= 6 (an odd one can never end with every bracket closed)")
        _require(len(self.tasks) > 0 and all(t in STATE_TASKS for t in self.tasks), "tasks", self.tasks,
                 f"must be a non-empty list from {STATE_TASKS}")
        _require(len(self.prefills) > 0 and all(p in STATE_PREFILLS for p in self.prefills), "prefills",
                 self.prefills, f"must be a non-empty list from {STATE_PREFILLS}")
        _require(_is_number(self.lr) and self.lr > 0, "lr", self.lr, "must be > 0")
        _require(_is_number(self.ridge) and self.ridge > 0, "ridge", self.ridge, "must be > 0")
        _require(_is_number(self.feedback_start) and 0 <= self.feedback_start < 1, "feedback_start",
                 self.feedback_start, "must be in [0, 1): the fullband model needs some multi-pass steps")
        ScheduleConfig(feedback_start=self.feedback_start, pass_mix=self.pass_mix)  # validates pass_mix
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")
