"""The [train], [optim] and [schedule] sections of a run and their checks (torch-free): what every study and
``fullband train`` embeds. ``fullband.training.config`` re-exports them with the run's other sections."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fullband.config import BOOL_WORDS, doc, is_int, is_number, require

LR_SCHEDULES = ("cosine", "wsd", "constant")
Z_LOSS_WHEN = ("always", "cooldown", "off")
AUTOCAST = ("auto", "bf16", "off")
COMPILE = ("auto", "true", "false")
# compile="auto" on a CPU (step_setup.should_compile): a study's runs, which share one compile cache, compile when its
# shortest run has this many steps; a single run when its work (step_setup.compile_work) reaches COMPILE_MIN_CPU_WORK.
COMPILE_MIN_CPU_STEPS = 100
COMPILE_MIN_CPU_WORK = 6e8
PARALLEL = ("ddp", "fsdp")


@dataclass
class ScheduleConfig:
    """Feedback schedule: how many passes each training batch runs (DESIGN.md §3)."""

    feedback_start: float = doc(
        0.0,
        "Fraction of all training steps after which multi-pass batches start; before it every batch is "
        "single-pass. 0 = feedback from the first step (the recipe: docs/results/recipe), 0.75 = the paper's late "
        "start (fullband train --preset paper), 1 = never.",
    )
    feedback_end: float = doc(
        1.0,
        "Fraction of all training steps at which multi-pass batches stop (1 = at the end of the run): a value "
        "below 1 places the feedback phase before a single-pass finish, independently of the LR cool-down.",
    )
    pass_mix: tuple[float, ...] = doc(
        (0.88, 0.12),
        "Probabilities of 2, 3, ... passes per batch after feedback_start (must sum to 1). 0.88,0.12 with "
        "feedback_start=0.75 is the paper's overall 75%/22%/3% single/two/three-pass split; 0,1 with "
        "feedback_start=0 always runs 3 passes.",
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


OPTIMIZERS = ("adamw", "muon", "normuon")
NS_DTYPES = ("auto", "float32", "bfloat16")


@dataclass
class OptimConfig:
    """The optimiser (AdamW, or Muon / NorMuon + AdamW) and the learning-rate schedule. The defaults (with
    ScheduleConfig's and ModelConfig's) are the recipe: see fullband.training.recipes."""

    optimizer: str = doc(
        "normuon",
        "adamw = AdamW on every parameter; muon = Muon (torch.optim.Muon's update) on the 2-D weights of "
        "muon_params and AdamW at lr on the rest (embedding/head, norms); normuon = the same split with NorMuon "
        "(arXiv 2510.05491: Muon's update normalised per output neuron), the paper's optimiser (section 4).",
    )
    lr: float = doc(1e-3, "Peak learning rate of AdamW (reached at the end of warmup; with muon/normuon: of the "
                    "embedding/head and the gains).")
    muon_lr: float = doc(0.02, "optimizer=muon/normuon: peak learning rate of (Nor)Muon (follows the same schedule).")
    muon_weight_decay: float = doc(0.01, "optimizer=muon/normuon: decoupled weight decay (scaled by its LR).")
    muon_momentum: float = doc(0.95, "optimizer=muon/normuon: (Nesterov) momentum, in [0, 1).")
    muon_params: tuple[str, ...] = doc(
        ("blocks", "fusion"),
        "optimizer=muon/normuon: modules whose 2-D weights (Nor)Muon updates (names as in the model's state dict); "
        "their 1-D gains stay with AdamW.",
    )
    normuon_beta2: float = doc(
        0.95, "optimizer=normuon: decay of each output neuron's second moment (EMA of its mean squared "
        "orthogonalised update), in [0, 1).",
    )
    ns_dtype: str = doc(
        "auto",
        "optimizer=muon/normuon: dtype of the Newton-Schulz orthogonalisation: 'auto' = bfloat16 on CUDA and on "
        "CPUs with bf16 instructions (avx512_bf16/amx_bf16), float32 on other CPUs, where bf16 is emulated and "
        "several times slower; 'float32'; 'bfloat16' (torch.optim.Muon's). The run config records what auto chose.",
    )
    ns_compile: bool = doc(False, "optimizer=muon/normuon: run the Newton-Schulz iteration through torch.compile "
                           "(fewer kernel launches on a GPU, where small matrices' iterations are launch-bound); "
                           "the same arithmetic to rounding.")
    ns_steps: int = doc(5, "optimizer=muon/normuon: quintic Newton-Schulz iterations per orthogonalisation "
                        "(torch.optim.Muon's 5), >= 1: each costs three matmuls per matrix.")
    fusion_lr_mult: float = doc(3.0, "Learning-rate multiplier of the fusion's parameters (W_U, W_G, its norms), > 0.")
    min_lr_ratio: float = doc(0.1, "Final learning rate as a fraction of lr, in [0, 1].")
    betas: tuple[float, float] = doc((0.9, 0.95), "AdamW beta1,beta2, each in [0, 1).")
    eps: float = doc(1e-8, "AdamW epsilon, > 0.")
    weight_decay: float = doc(
        0.1, "Decoupled AdamW weight decay on weight matrices (>= 2-D, embeddings included); norms get none."
    )
    warmup_steps: int = doc(25, "Linear warmup steps from ~0 to lr.")
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
    compile: str = doc(
        "auto",
        "torch.compile each transformer block for the training forward (the Python loop over passes, evaluation and "
        "decoding stay eager): 'auto' = on CUDA, and on a CPU where it pays for the run's length: when max_steps x "
        "batch_size x seq_len x grad_accum x d_model x n_layers (x 2 with feedback) reaches 6e8, about where the "
        "time compiled blocks save covers a 15-18 s compile (fullband compare and recipe decide once per study: "
        "runs of 100+ steps, which share the compile cache); 'true'; 'false'. If compiling fails, or the first "
        "compiled step's loss is not finite, the run trains eagerly and says so.",
    )
    activation_checkpointing: bool = doc(
        False,
        "Recompute each transformer block's activations in the backward pass instead of keeping them "
        "(torch.utils.checkpoint, non-reentrant): trades one more forward of the blocks per step (about a third "
        "more compute) for activation memory, since only each block's input is kept; for a longer seq_len, larger "
        "batch or more passes on one GPU. Same losses and gradients; a no-op in evaluation and decoding.",
    )
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
    jitter: float = doc(0.02, "σ of the Uniform(-σ, σ) noise on carried states before fusing; >= 0. Applies with "
                              "grad_passes too (fullband eval-reasoning sets 0 there unless given).")
    detach_passes: bool = doc(
        False, "Stop gradients between passes (saves memory; the paper backpropagates through all passes)."
    )
    grad_passes: int = doc(
        0,
        "Truncated gradient (ours): in a multi-pass batch only pass 1 and the last grad_passes passes run with "
        "gradients and are scored, the passes between without (about 3x cheaper each), and the batch runs at most "
        "the passes that make every position exact (reaching them with one plain prefix, the last passes start "
        "from the fixed point, computed sequentially); decided on each step's global batch, so DDP and "
        "FSDP train as one process; 0 = every pass with gradients (the paper).",
    )
    prefix_mixin: bool = doc(
        True,
        "Give each row a random plain prefix p ~ Uniform{1..seq_len-1} (prompt-then-generate, DESIGN.md §3); "
        "false = p = 1 (every position after the first fused).",
    )
    restart_at_documents: bool = doc(
        False,
        "Packed data: restart the recurrence at each document, so one document's state is never fused into the next "
        "(a document's first token, the one after the tokenizer's end-of-text, stays plain in every pass; attention "
        "still reads across). Off by default until a study says otherwise; needs a tokenizer with an end-of-text "
        "id. Validation then restarts at documents too.",
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


def validate_schedule_config(c: ScheduleConfig) -> None:
    require(is_number(c.feedback_start) and 0 <= c.feedback_start <= 1, "feedback_start", c.feedback_start,
            "must be a fraction of the run in [0, 1]")
    require(is_number(c.feedback_end) and 0 <= c.feedback_end <= 1, "feedback_end", c.feedback_end,
            "must be a fraction of the run in [0, 1]: the feedback phase cannot outlast the run")
    require(c.feedback_start == 1 or c.feedback_end > c.feedback_start, "feedback_end", c.feedback_end,
            f"must be after feedback_start={c.feedback_start}: the feedback phase needs at least one step")
    mix = c.pass_mix
    require(isinstance(mix, (list, tuple)) and len(mix) >= 1 and all(is_number(x) and 0 <= x <= 1 for x in mix),
            "pass_mix", mix, "must be a non-empty list of probabilities in [0, 1] for 2, 3, ... passes")
    require(abs(sum(mix) - 1) <= 1e-6, "pass_mix", mix, f"must sum to 1 (sums to {sum(mix):.6g})")
    require(is_int(c.ramp_steps) and c.ramp_steps >= 0, "ramp_steps", c.ramp_steps, "must be an integer >= 0")
    require(is_number(c.two_pass_until) and 0 <= c.two_pass_until <= 1, "two_pass_until", c.two_pass_until,
            "must be a fraction of the run in [0, 1]")
    require(c.two_pass_until == 0 or c.two_pass_until >= c.feedback_start, "two_pass_until", c.two_pass_until,
            f"must be 0 or at least feedback_start={c.feedback_start}: 2-pass batches come first, after it")


def validate_optim_config(c: OptimConfig) -> None:
    require(c.optimizer in OPTIMIZERS, "optimizer", c.optimizer, f"must be one of {OPTIMIZERS}")
    require(is_number(c.lr) and c.lr > 0, "lr", c.lr, "must be > 0")
    require(is_number(c.muon_lr) and c.muon_lr > 0, "muon_lr", c.muon_lr, "must be > 0")
    require(is_number(c.muon_weight_decay) and c.muon_weight_decay >= 0, "muon_weight_decay", c.muon_weight_decay,
            "must be >= 0")
    require(is_number(c.muon_momentum) and 0 <= c.muon_momentum < 1, "muon_momentum", c.muon_momentum,
            "must be in [0, 1)")
    require(len(c.muon_params) > 0 and all(isinstance(x, str) and x for x in c.muon_params), "muon_params",
            c.muon_params, "must be a non-empty list of module names, e.g. blocks,fusion")
    require(is_number(c.normuon_beta2) and 0 <= c.normuon_beta2 < 1, "normuon_beta2", c.normuon_beta2,
            "must be in [0, 1)")
    require(c.ns_dtype in NS_DTYPES, "ns_dtype", c.ns_dtype, f"must be one of {NS_DTYPES}")
    require(is_int(c.ns_steps) and c.ns_steps >= 1, "ns_steps", c.ns_steps, "must be an integer >= 1")
    require(is_number(c.fusion_lr_mult) and c.fusion_lr_mult > 0, "fusion_lr_mult", c.fusion_lr_mult, "must be > 0")
    require(is_number(c.min_lr_ratio) and 0 <= c.min_lr_ratio <= 1, "min_lr_ratio", c.min_lr_ratio,
            "must be in [0, 1]")
    betas = c.betas
    require(isinstance(betas, (list, tuple)) and len(betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in betas),
            "betas", betas, "must be two values in [0, 1)")
    require(is_number(c.eps) and c.eps > 0, "eps", c.eps, "must be > 0")
    require(is_number(c.weight_decay) and c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0")
    require(is_int(c.warmup_steps) and c.warmup_steps >= 0, "warmup_steps", c.warmup_steps,
            "must be an integer >= 0")
    require(c.schedule in LR_SCHEDULES, "schedule", c.schedule, f"must be one of {LR_SCHEDULES}")
    require(is_number(c.decay_fraction) and 0 < c.decay_fraction <= 1, "decay_fraction", c.decay_fraction,
            "must be in (0, 1]")
    require(is_number(c.grad_clip) and c.grad_clip >= 0, "grad_clip", c.grad_clip, "must be >= 0 (0 = off)")
    require(is_number(c.z_loss) and c.z_loss >= 0, "z_loss", c.z_loss, "must be >= 0")
    require(c.z_loss_when in Z_LOSS_WHEN, "z_loss_when", c.z_loss_when, f"must be one of {Z_LOSS_WHEN}")


def validate_train_config(c: TrainConfig) -> None:
    for name, low in (("max_steps", 1), ("batch_size", 1), ("seq_len", 2), ("grad_accum", 1), ("seed", 0),
                      ("eval_every", 0), ("eval_batches", 1), ("checkpoint_every", 0), ("keep_last", 1),
                      ("log_every", 1), ("grad_passes", 0)):
        value = getattr(c, name)
        require(is_int(value) and value >= low, name, value, f"must be an integer >= {low}")
    if c.token_budget is not None:
        require(is_int(c.token_budget) and c.token_budget >= 1, "token_budget", c.token_budget,
                "must be an integer >= 1 (or None)")
    if isinstance(c.compile, bool):  # true/false from a TOML/JSON file or a Python caller
        c.compile = "true" if c.compile else "false"
    elif isinstance(c.compile, str):  # yes/on/1 and no/off/0 as the boolean options take them
        word = c.compile.lower()
        c.compile = str(BOOL_WORDS[word]).lower() if word in BOOL_WORDS else word
    require(c.compile in COMPILE, "compile", c.compile, f"must be one of {COMPILE}")
    for name in ("detach_passes", "prefix_mixin", "prefix_per_pass", "activation_checkpointing",
                 "restart_at_documents"):
        require(isinstance(getattr(c, name), bool), name, getattr(c, name), "must be true or false")
    require(c.autocast in AUTOCAST, "autocast", c.autocast, f"must be one of {AUTOCAST}")
    require(c.parallel in PARALLEL, "parallel", c.parallel, f"must be one of {PARALLEL}")
    require(is_number(c.feedback_weight) and c.feedback_weight >= 0, "feedback_weight", c.feedback_weight,
            "must be >= 0")
    require(is_number(c.jitter) and c.jitter >= 0, "jitter", c.jitter, "must be >= 0")
    if c.wandb_project is not None:
        ok = isinstance(c.wandb_project, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", c.wandb_project)
        require(bool(ok), "wandb_project", c.wandb_project,
                "must be a W&B project name: letters, digits, '_', '-', '.' (at most 128), or none")
