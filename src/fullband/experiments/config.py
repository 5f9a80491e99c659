"""The configs and presets of the studies (``fullband compare``, ``recipe``, ``eval-reasoning``, ``eval-state``).

Torch-free, so the command line checks them (and answers ``--help``) before importing torch. Presets are data:
:func:`fullband.config.apply_preset` applies them in each config's ``__post_init__``, so ``CompareConfig(
preset="smoke")`` in Python, a config file and the command line all mean the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from fullband.config import (
    DECODING_MODES,
    EXACT_METHODS,
    ModelConfig,
    _is_int,
    _is_number,
    _require,
    apply_preset,
    doc,
    threads_field,
    validate_device_name,
    validate_threads,
)
from fullband.training.config import DataConfig, OptimConfig, ScheduleConfig, TrainConfig, TrainModelConfig


def _require_ints(config: Any, limits: dict[str, int]) -> None:
    for name, low in limits.items():
        value = getattr(config, name)
        _require(_is_int(value) and value >= low, name, value, f"must be an integer >= {low}")


# ---------------------------------------------------------------------------------------------- fullband compare


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
    # Issue 29, the token question at a longer horizon: the default's model and recipe trained 7.4x longer, 4.1
    # tokens per parameter at 1x (3,801,088 tokens = 1856 steps; the fusion model has 927,104 parameters). The same
    # d128 model as the default, not a narrower one: cost grows with parameters x tokens, so d64 (242k parameters,
    # 0.97M tokens) would cost ~5% as much, but the recipe study measured the gap moving with width and d64's seed
    # spread 3x d128's, so the run would mix training length with width; d128 changes only the length (and keeps
    # the >= 7x budget the issue asks for). Estimate at the default report's eager 0.48 s/step (baseline) and 0.92
    # (feedback): 2 x (5 x 1856 x 0.48 + 1856 x (0.92 + 0.87)) s / 2 workers = ~2.2 h on 2 cores; ~3.6 h at the
    # rates of a probe under heavier load (docs/LOG.md).
    # Checkpoints every 200 steps, so `--resume true` loses at most 200 steps of a killed run. Eager, as the
    # default: compile="auto" would compile the >= 1000-step runs but not the 928-step 0.5x baseline, mixing
    # numerics in one baseline curve (--train.compile true may save 4-19%, not measured in parallel workers).
    "long": {
        "train": {"token_budget": 3_801_088, "checkpoint_every": 200, "keep_last": 1, "compile": "false"},
        "budgets": [0.5, 1.0, 1.5, 2.0], "stability_ablation": True, "train_eval_points": 16,
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
                      "<= ~10 min; long = the default model at 4.1 tokens/parameter (~2.2 h on 2 cores, resumable); "
                      "smoke = seconds (tests/CI); gpu = larger model and budget. Values from a config file or the "
                      "command line override the preset's.")
    model: TrainModelConfig = field(default_factory=lambda: TrainModelConfig(d_model=128, n_layers=4, n_heads=4))
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        token_budget=512_000, batch_size=16, seq_len=128, eval_batches=4, checkpoint_every=0))  # 250 steps at 1x
    # The recipe: fullband train's defaults (fullband.training.config.TRAIN_PRESETS says what it is and why).
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    budgets: tuple[float, ...] = doc(
        (0.5, 1.0, 1.5), "Baseline token budgets as multiples of train.token_budget (the unit, 1x); the "
        "full-bandwidth models train to 1x. At least two, so the baseline's loss-vs-tokens curve can be fitted. "
        "(Each run sets model.feedback and its own budget itself; train.max_steps and train.eval_every are unused.)")
    seeds: int = doc(2, "Repeat every run with seeds train.seed, train.seed+1, ...; >1 reports mean ± sd.")
    fused_passes: tuple[int, ...] = doc(
        (1, 2, 4), "Fused prefill modes to evaluate: k extra fused passes over each window (standard = 0).")
    exact_method: str = doc(
        "auto", f"Exact mode: one of {EXACT_METHODS}: auto (the fastest for the device: sequential on a CPU; "
        "see fullband.model.recurrence.auto_exact_method), sequential (one position at a time with the KV cache, "
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
        0, "Validate the feedback runs (1, 2 and 3 passes) and the 1x baseline this many times during training, for "
        "the fused-vs-plain and feedback-vs-baseline gaps against training tokens; 0 = only at the end.")
    workers: int = doc(
        2, "Training runs at a time, each in its own process with the torch threads shared out (2 on 2 cores: "
        "small models use one core poorly). The numbers do not depend on it.")
    out_dir: str = doc("runs/compare", "Run directory: one sub-directory per training run, report.md, "
                       "results.json and the plots.")
    resume: bool = doc(
        False, "Continue an interrupted study in out_dir (same settings): runs it finished and evaluated are kept, "
        "and a run it was training continues from its latest checkpoint (train.checkpoint_every), bit for bit.")
    device: str = doc("auto", "auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps.")
    threads: str = threads_field()

    def __post_init__(self) -> None:
        self.threads = validate_threads(self.threads)
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
    for name in ("stability_ablation", "resume"):
        _require(isinstance(getattr(c, name), bool), name, getattr(c, name), "must be true or false")
    _require(isinstance(c.out_dir, str) and bool(c.out_dir), "out_dir", c.out_dir, "give a directory")


# ---------------------------------------------------------------------------------------------- fullband recipe

# Each ingredient of the recipe, toggled away from the compare default (the best recipe found) one at a time:
# name -> (overrides of the compare config, whether the baseline changes too, what it tests).
RECIPE_VARIANTS: dict[str, tuple[dict[str, Any], bool, str]] = {
    "best": ({}, False, "the compare default: raw plain inputs and normalised fused inputs (DESIGN.md section 1), "
             "NorMuon, 3x fusion LR, feedback from the start"),
    "input-norm-paper": ({"model.input_norm": "paper"}, False, "the paper's literal App. C code: the plain prefix "
                         "normalised too in training passes >= 2 (raw in pass 1 and at inference)"),
    "input-norm-all": ({"model.input_norm": "all"}, True,
                       "every input normalised, plain ones too (the default before 2026-12-04)"),
    "input-gain-0.02": ({"model.input_norm_init": 0.02}, False,
                        "the fused inputs' norm starts at gain 0.02 (the embeddings' init scale) instead of 1"),
    "shared-gate-norm": ({"model.gate_norm": "shared"}, False, "the gate reads the input norm (the paper's "
                         "glu_cross(h, input_rmsnorm(e))) instead of its own RMSNorm"),
    "adamw": ({"optim.optimizer": "adamw"}, True, "AdamW (wd 0.1) on the hidden matrices too, instead of NorMuon"),
    "muon": ({"optim.optimizer": "muon"}, True, "Muon instead of NorMuon (no per-neuron normalisation)"),
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
    report_only: bool = doc(False, "Analyse the results.json in out_dir again and rewrite its report (no training).")
    resume: bool = doc(False, "Continue an interrupted study in out_dir: runs it finished and evaluated are kept.")
    device: str = doc("auto", "auto (cuda when available, else cpu), cpu, cuda or cuda:N.")
    threads: str = threads_field()

    def __post_init__(self) -> None:
        self.threads = validate_threads(self.threads)
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


# ---------------------------------------------------------------------------------------------- the synthetic studies

@dataclass
class SyntheticStudyConfig:
    """What ``fullband eval-reasoning`` and ``eval-state`` share: two models (baseline and full-bandwidth) of one
    size trained on the same batches of a synthetic task (fullband.experiments.study.PairStudy). The sizes left
    at none come from the preset."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}

    preset: str = doc("default", "Sizes of everything left at none: one of the presets (see preset's choices).")
    out_dir: str = doc("runs/study", "Run directory: data/, baseline/, fullband/, results.json, report.md, PNG.")
    d_model: int | None = doc(None, "Model width (both models).")
    n_layers: int | None = doc(None, "Transformer blocks (both models; eval-state probes depths 0..n_layers).")
    n_heads: int | None = doc(None, "Attention heads (both models).")
    steps: int | None = doc(None, "Training steps (both models, the same batches).")
    batch_size: int | None = doc(None, "Training batch size.")
    lr: float | None = doc(None, "Peak learning rate.")
    feedback_start: float = doc(
        0.75, "fullband model: fraction of the steps trained single-pass before multi-pass (the paper's 75%)."
    )
    pass_mix: tuple[float, ...] = doc((0.88, 0.12), "fullband model: probabilities of 2, 3, ... passes afterwards.")
    seed: int = doc(0, "Seed of the data, the initial weights and the batches.")
    # auto leaves the cores other running processes hold (fullband.devices.resolve_threads), which these tiny models
    # suffer from most; seeds run side by side (workers) share the threads out (fullband.experiments.parallel).
    threads: str = threads_field()
    device: str = doc("auto", "Torch device for training and evaluation: auto (cuda when available, else cpu), cpu, "
                      "cuda, cuda:N or mps.")
    progress: bool = doc(True, "Progress bars.")
    reuse_models: bool = doc(False, "Evaluate the models an earlier run left in out_dir instead of training.")

    def __post_init__(self) -> None:
        validate_device_name(self.device)
        apply_preset(self, self.PRESETS)
        self.pass_mix = tuple(float(x) for x in self.pass_mix)
        _require_ints(self, {"d_model": 2, "n_layers": 1, "n_heads": 1, "steps": 1, "batch_size": 1, "seed": 0})
        self.threads = validate_threads(self.threads)
        self.validate()
        _require(_is_number(self.lr) and self.lr > 0, "lr", self.lr, "must be > 0")
        _require(_is_number(self.feedback_start) and 0 <= self.feedback_start < 1, "feedback_start",
                 self.feedback_start, "must be in [0, 1): the fullband model needs some multi-pass steps")
        ScheduleConfig(feedback_start=self.feedback_start, pass_mix=self.pass_mix)  # validates pass_mix
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")

    def validate(self) -> None:
        """The study's own fields (after the preset is applied)."""


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
    # Issue 17: train the recurrence exact mode runs. Every batch of the full-bandwidth model runs to its exact
    # count (passes >= its length) with no plain prefix, so its last passes are the fully recurrent states: the
    # fixed point computed without gradients (sequentially), then 4 passes with them (truncated backpropagation,
    # train.grad_passes) next to the plain pass 1. AdamW (Muon fit the training set lower with no held-out gain,
    # docs/LOG.md), fusion LR x3, plain positions unnormalised, mostly answer-only training on n <= 6 with a length
    # curriculum, tested on n = 8, 12, 16 too; fused(k), k = 1..8, shows the iteration short of the fixed point.
    "serial": dict(min_length=2, max_length=6, test_lengths=(8, 12, 16), strides=(1, 0), answer_share=0.75,
                   train_examples=100_000, test_per_length=40, d_model=64, n_layers=2, n_heads=4, steps=1200,
                   batch_size=64, lr=1e-3, optimizer="adamw", fusion_lr_mult=3.0, input_norm="fused",
                   feedback_start=0.0, passes=32, grad_passes=4, prefix_mixin=False, curriculum=0.3,
                   fused_passes=(1, 2, 4, 8)),
}
# Issue 17's positive results (docs/results/reasoning-sum-recurrent, and -swaps-recurrent with --family swaps):
# serial's recipe with the fixed-point passes' loss weighted 0.3, 2.5x the steps and gradients through the last 8
# passes, two seeds side by side (one per core: 23-26 min on 2 quiet cores). With 4 gradient passes and 3600 steps
# sum extrapolates as well but swaps with one seed of two (the -g4 reports).
REASONING_PRESETS["recurrent"] = REASONING_PRESETS["serial"] | dict(family="sum", feedback_weight=0.3, steps=3000,
                                                                    grad_passes=8, seeds=2, workers=2)
# Issue 29: the controls of DESIGN.md section 7 next to the recurrent recipe, on the three families, 3 seeds, 200
# test problems per length (or half of a length's problems where it has fewer), answer-only decoding.
REASONING_PRESETS["controls"] = REASONING_PRESETS["recurrent"] | dict(
    families=("swaps", "swaps5", "sum"), controls=("looped", "equal_flops"), seeds=3, test_per_length=200,
    modes=("standard", "exact"))
REASONING_FAMILIES = ("swaps", "swaps5", "sum")
CONTROLS = ("looped", "equal_flops")


@dataclass
class ReasoningConfig(SyntheticStudyConfig):
    """``fullband eval-reasoning``: shorter traces at equal accuracy? (fullband.experiments.reasoning)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = REASONING_PRESETS

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
    test_lengths: tuple[int, ...] = doc(
        (), "Length generalisation: problem lengths tested (in every mode and stride) but never trained on, "
        "beyond min_length..max_length; empty = only the trained lengths.")
    answer_share: float | None = doc(
        None, "Share of the training examples written answer-only (stride 0, which needs 0 in strides); none = "
        "every stride equally often.")
    modes: tuple[str, ...] = doc(("standard", "soft", "fused", "exact"),
                                 "Decoding modes of the fullband model (greedy); exact = the prompt fully recurrent.")
    fused_passes: tuple[int, ...] = doc(
        (2,), "fused mode: extra fused passes over the prompt; several (e.g. 1,2,4,8) evaluate fused(k) for each, "
        "accuracy against the iteration's depth.")
    seeds: int = doc(1, "Train and evaluate both models with seeds seed, seed+1, ...; >1 reports mean ± sd "
                     "(the test problems stay those of seed).")
    workers: int = doc(1, "Seeds trained and evaluated at a time, each in its own process with the torch threads "
                       "shared out (2 seeds on 2 cores: 2). The numbers do not depend on it.")
    optimizer: str = doc("adamw", "Both models: adamw, muon (Muon on the hidden matrices at muon_lr, AdamW at lr "
                         "on the rest; the Recipe issue's best) or normuon (NorMuon in Muon's place).")
    muon_lr: float = doc(0.02, "optimizer=muon/normuon: (Nor)Muon's peak learning rate.")
    fusion_lr_mult: float = doc(1.0, "fullband model: learning-rate multiplier of the fusion (the recipe uses 3).")
    input_norm: str = doc("fused", "Both models: the input form (model.input_norm, DESIGN.md section 1): fused = raw "
                          "plain inputs, normalised fused inputs; paper; all = plain inputs normalised too.")
    curriculum: float = doc(0.0, "Length curriculum: over the first this fraction of the steps, training draws "
                            "from the shortest problems first, widening linearly to all lengths; 0 = none.")
    passes: int = doc(
        0, "fullband model: every multi-pass batch runs this many passes instead of pass_mix's (at most the "
        "batch's exact count: with passes >= the longest example and prefix_mixin false, the last pass is the "
        "fully recurrent one exact mode runs); 0 = pass_mix.")
    grad_passes: int = doc(
        0, "fullband model: truncated gradient, only pass 1 and the last grad_passes passes of a multi-pass batch "
        "with gradients (train.grad_passes); 0 = all.")
    prefix_mixin: bool = doc(
        True, "fullband model: a random plain prefix per row in training (train.prefix_mixin); false = every "
        "position after the first fused, as in fused and exact prefill.")
    feedback_weight: float = doc(1.0, "fullband model: λ, the weight of the multi-pass passes' loss against pass 1's.")
    controls: tuple[str, ...] = doc(
        (), f"Control models trained on the same batches and decoded answer-only, from {CONTROLS}: looped = the "
        "full-bandwidth model with feedback_shift=0 (pass k fuses h_t, not h_{t-1}); equal_flops = a plain model as "
        "deep as its training FLOPs match the full-bandwidth model's (fullband.experiments.controls).")
    families: tuple[str, ...] = doc(
        (), f"Run the study once per family (from {REASONING_FAMILIES}) into out_dir/<family>/ and write one report "
        "over all of them in out_dir; empty = the one family of --family.")
    resume: bool = doc(
        False, "Continue an interrupted run in out_dir: finished models and evaluated cells are reused, a training "
        "run left unfinished starts again (same numbers as an uninterrupted run).")

    def validate(self) -> None:
        self.strides = tuple(self.strides)
        self.modes = tuple(self.modes)
        self.test_lengths = tuple(self.test_lengths)
        self.fused_passes = (self.fused_passes,) if _is_int(self.fused_passes) else tuple(self.fused_passes)
        _require_ints(self, {"min_length": 1, "train_examples": 1, "test_per_length": 1, "seeds": 1,
                             "workers": 1})
        _require(len(self.fused_passes) > 0 and all(_is_int(k) and k >= 0 for k in self.fused_passes),
                 "fused_passes", self.fused_passes, "must be a non-empty list of integers >= 0")
        _require(all(_is_int(n) and 1 <= n <= 26 for n in self.test_lengths), "test_lengths", self.test_lengths,
                 "must be integers in 1..26 (the trained range is min_length..max_length)")
        _require(self.answer_share is None or (_is_number(self.answer_share) and 0 <= self.answer_share <= 1
                                               and 0 in self.strides and len(set(self.strides)) > 1),
                 "answer_share", self.answer_share, "must be in [0, 1], with 0 and another stride in strides, or none")
        OptimConfig(optimizer=self.optimizer, lr=self.lr, muon_lr=self.muon_lr, fusion_lr_mult=self.fusion_lr_mult)
        self.input_norm = ModelConfig(input_norm=self.input_norm).input_norm  # validated; true/false = all/fused
        DataConfig(curriculum=self.curriculum)  # validates it
        _require(_is_int(self.passes) and (self.passes == 0 or self.passes >= 2), "passes", self.passes,
                 "must be an integer >= 2, or 0 (pass_mix)")
        TrainConfig(grad_passes=self.grad_passes, prefix_mixin=self.prefix_mixin,
                    feedback_weight=self.feedback_weight)  # validates them
        _require(self.family in REASONING_FAMILIES, "family", self.family, f"must be one of {REASONING_FAMILIES}")
        self.controls, self.families = tuple(self.controls), tuple(self.families)
        _require(all(c in CONTROLS for c in self.controls) and len(set(self.controls)) == len(self.controls),
                 "controls", self.controls, f"must be distinct names from {CONTROLS}")
        _require(all(f in REASONING_FAMILIES for f in self.families) and len(set(self.families)) == len(self.families),
                 "families", self.families, f"must be distinct names from {REASONING_FAMILIES}")
        _require(not self.controls or 0 in self.strides, "controls", self.controls,
                 "are decoded answer-only: add 0 to strides")
        _require(isinstance(self.resume, bool), "resume", self.resume, "must be true or false")
        _require(_is_int(self.modulus) and 2 <= self.modulus <= 10, "modulus", self.modulus, "must be in 2..10")
        _require(_is_int(self.max_length) and self.min_length <= self.max_length <= 26, "max_length",
                 self.max_length, f"must be in min_length={self.min_length}..26")
        _require(len(self.strides) > 0 and all(_is_int(s) and s >= 0 for s in self.strides), "strides",
                 self.strides, "must be a non-empty list of integers >= 0 (0 = answer only)")
        _require(len(self.modes) > 0 and all(m in DECODING_MODES for m in self.modes), "modes", self.modes,
                 f"must be a non-empty list from {DECODING_MODES}")


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
class StateTrackingConfig(SyntheticStudyConfig):
    """``fullband eval-state``: linear probes of the final token's residual stream at every depth (paper Figure 7)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = STATE_PRESETS

    preset: str = doc("default", f"Sizes of everything left at none: one of {tuple(STATE_PRESETS)}.")
    out_dir: str = doc("runs/state-tracking", "Run directory: data/, baseline/, fullband/, results.json, report.md, "
                       "PNG.")
    tasks: tuple[str, ...] = doc(STATE_TASKS, f"Tasks (trained together, probed separately): from {STATE_TASKS}.")
    seq_len: int | None = doc(None, "Tokens per sequence, task letter and final '?' included (even).")
    train_per_task: int | None = doc(None, "Training sequences per task.")
    probe_train: int | None = doc(None, "Fresh sequences per task to fit each probe on.")
    probe_test: int | None = doc(None, "Fresh sequences per task to measure each probe on.")
    prefills: tuple[str, ...] = doc(STATE_PREFILLS, "Prefills probed: standard (1 pass), one-step (2 passes), exact.")
    ridge: float = doc(1e-2, "Ridge penalty of the probes (times the number of examples).")

    def validate(self) -> None:
        self.tasks, self.prefills = tuple(self.tasks), tuple(self.prefills)
        _require_ints(self, {"train_per_task": 1, "probe_train": 2, "probe_test": 1})
        _require(_is_int(self.seq_len) and self.seq_len >= 6 and self.seq_len % 2 == 0, "seq_len", self.seq_len,
                 "must be an even integer >= 6 (an odd one can never end with every bracket closed)")
        _require(len(self.tasks) > 0 and all(t in STATE_TASKS for t in self.tasks), "tasks", self.tasks,
                 f"must be a non-empty list from {STATE_TASKS}")
        _require(len(self.prefills) > 0 and all(p in STATE_PREFILLS for p in self.prefills), "prefills",
                 self.prefills, f"must be a non-empty list from {STATE_PREFILLS}")
        _require(_is_number(self.ridge) and self.ridge > 0, "ridge", self.ridge, "must be > 0")
