"""The configs and presets of the synthetic-task studies, ``fullband eval-reasoning`` and ``eval-state``: two models
(the baseline and the full-bandwidth one) of one size trained on the same batches (fullband.experiments.study)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fullband.config import (
    DECODING_MODES,
    ModelConfig,
    _is_int,
    _is_number,
    _require,
    _require_ints,
    apply_preset,
    doc,
    threads_field,
    validate_device_name,
    validate_threads,
)
from fullband.training.config import DataConfig, OptimConfig, ScheduleConfig, TrainConfig


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
