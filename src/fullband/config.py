"""Typed configuration dataclasses of the model, decoding and training, and what every config shares: validation
helpers, the mode names and defaults, the preset mechanism. The studies' configs live in fullband.experiments.config,
those of ``fullband eval`` in fullband.integrations.lm_eval.config.

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


def validate_speculative_options(drafter: Any, gamma: int, max_gamma: int = 16) -> None:
    """Checks shared by ``generate(..., speculative=...)`` and ``fullband generate --drafter``."""
    _require(_is_int(gamma) and gamma >= 1, "gamma", gamma, "must be an integer >= 1 (tokens drafted per "
             "verification)")
    _require(_is_int(max_gamma) and max_gamma >= gamma, "max_gamma", max_gamma, f"must be an integer >= gamma={gamma}")
    _require(not isinstance(drafter, str) or bool(drafter), "drafter", drafter,
             "name one: standard, early_exit, early_exit:N, a model (or on the command line a checkpoint directory)")


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
    drafter: str = doc(
        "", "Speculative decoding (same output, see DESIGN.md section 4): '' = off; standard = the model itself "
        "without feedback; early_exit[:N] = its first N blocks; or a checkpoint directory of a model with the "
        "same tokenizer.",
    )
    gamma: int = doc(4, "Speculative decoding: tokens drafted per verification (the start value with adaptive_gamma).")
    adaptive_gamma: bool = doc(False, "Speculative decoding: +1 draft token after a fully accepted block, -1 after a "
                               "rejection.")

    def __post_init__(self) -> None:
        _require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        validate_device_name(self.device)
        validate_decoding_options(self.mode, self.prefill_passes, self.temperature, self.top_k, self.top_p,
                                  self.max_new_tokens, self.exact_chunk_size)
        validate_speculative_options(self.drafter or "standard", self.gamma, max(16, self.gamma))


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
