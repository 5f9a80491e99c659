"""The config and presets of ``fullband eval-reasoning`` (torch-free: the command line checks them before torch
loads): a synthetic-task study of two models (:class:`fullband.experiments.core.config.SyntheticStudyConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fullband.config import doc, is_int, is_number, require, require_ints, resume_field
from fullband.experiments.core.config import ALIASES, SyntheticStudyConfig, pinned, sectioned
from fullband.modes import DECODING_MODES
from fullband.training.config import DataConfig

REASONING_ALIASES = ALIASES | {
    "input_norm": "model.input_norm", "grad_passes": "train.grad_passes", "prefix_mixin": "train.prefix_mixin",
    "feedback_weight": "train.feedback_weight", "optimizer": "optim.optimizer", "muon_lr": "optim.muon_lr",
    "fusion_lr_mult": "optim.fusion_lr_mult"}

# Each preset fills the fields left at None. smoke: the tests (seconds); default: the committed report's sizes with
# fullband train's recipe, like every command that trains; adamw: the committed report (docs/results/reasoning, AdamW,
# feedback from 75% of the steps; minutes on 2 CPU cores); long: more steps and problems, for a GPU or a patient CPU.
_DEFAULT_SIZES = dict(min_length=2, max_length=6, strides=(1, 2, 4, 0), train_examples=100_000, test_per_length=60,
                      d_model=64, n_layers=2, n_heads=4, steps=4000, batch_size=64, lr=5e-4)
_REASONING_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(min_length=2, max_length=4, strides=(1, 0), train_examples=500, test_per_length=4, d_model=32,
                  n_layers=1, n_heads=2, steps=8, batch_size=8, lr=3e-3),
    "default": _DEFAULT_SIZES,
    "adamw": _DEFAULT_SIZES,
    "long": dict(min_length=2, max_length=12, strides=(1, 2, 3, 4, 0), train_examples=200_000, test_per_length=200,
                 d_model=128, n_layers=4, n_heads=4, steps=10_000, batch_size=64, lr=2e-3),
    # Issue 17: train the recurrence exact mode runs. Every batch of the full-bandwidth model runs to its exact
    # count (passes >= its length) with no plain prefix, so its last passes are the fully recurrent states: the
    # fixed point computed without gradients (sequentially), then 4 passes with them (truncated backpropagation,
    # train.grad_passes) next to the plain pass 1. AdamW (Muon fit the training set lower with no held-out gain,
    # docs/LOG.md), fusion LR x3, plain positions unnormalised, mostly answer-only training on n <= 6 with a length
    # curriculum, tested on n = 8, 12, 16 too; fused(k), k = 1..8, shows the iteration short of the fixed point.
    "exact-recurrence": dict(min_length=2, max_length=6, test_lengths=(8, 12, 16), strides=(1, 0), answer_share=0.75,
                   train_examples=100_000, test_per_length=40, d_model=64, n_layers=2, n_heads=4, steps=1200,
                   batch_size=64, lr=1e-3, optimizer="adamw", fusion_lr_mult=3.0, input_norm="fused",
                   feedback_start=0.0, passes=32, grad_passes=4, prefix_mixin=False, curriculum=0.3,
                   fused_passes=(1, 2, 4, 8)),
}
# Issue 17's positive results (docs/results/reasoning-sum-recurrent, and -swaps-recurrent with --family swaps):
# exact-recurrence's recipe with the fixed-point passes' loss weighted 0.3, 2.5x the steps, gradients through the last 8
# passes, two seeds side by side (one per core: 23-26 min on 2 quiet cores). With 4 gradient passes and 3600 steps
# sum extrapolates as well but swaps with one seed of two (the -g4 reports).
_REASONING_PRESETS["exact-recurrence-tuned"] = _REASONING_PRESETS["exact-recurrence"] | dict(
    family="sum", feedback_weight=0.3, steps=3000, grad_passes=8, seeds=2, workers=2)
# Issue 29: the controls of DESIGN.md section 7 next to the recurrent recipe, on the three families, 3 seeds, 200
# test problems per length (or half of a length's problems where it has fewer), answer-only decoding. The length
# curriculum over 60% of the steps, not 30%: with 30% the recipe solved swaps on 2 of 4 seeds it was not tuned on;
# with 60% (3000 steps) on 2 of 2, the failed seed among them, as with 6000 steps (4 runs of 4) at half their cost
# (docs/results/reasoning-swaps-curriculum06-seeds10-11, -6000-seeds10-11, docs/LOG.md).
_REASONING_PRESETS["controls"] = _REASONING_PRESETS["exact-recurrence-tuned"] | dict(
    families=("swaps", "swaps5", "sum"), controls=("looped", "equal_flops"), seeds=3, test_per_length=200,
    modes=("standard", "exact"), curriculum=0.6)
# The recipe where no committed report pins AdamW (STUDY_ADAMW): smoke, default and long.
REASONING_PRESETS = {name: pinned(sectioned(p, REASONING_ALIASES), name in ("smoke", "default", "long"))
                     for name, p in _REASONING_PRESETS.items()}
# The names of the committed reports' commands: serial (its recipe trains the serial, fully recurrent computation)
# and recurrent (issue 17's results).
REASONING_PRESET_ALIASES = {"serial": "exact-recurrence", "recurrent": "exact-recurrence-tuned"}
REASONING_FAMILIES = ("swaps", "swaps5", "sum")
CONTROLS = ("looped", "equal_flops")


@dataclass
class ReasoningConfig(SyntheticStudyConfig):
    """``fullband eval-reasoning``: shorter traces at equal accuracy? (fullband.experiments.reasoning.study)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = REASONING_PRESETS
    PRESET_ALIASES: ClassVar[dict[str, str]] = REASONING_PRESET_ALIASES
    ALIASES: ClassVar[dict[str, str]] = REASONING_ALIASES

    preset: str = doc("default", f"Settings to start from: one of {tuple(REASONING_PRESETS)}. smoke = seconds, "
                      "fullband train's recipe (a check of the plumbing: no verdict); default = the committed report's "
                      "sizes with fullband train's recipe; adamw = the committed report (AdamW, feedback from 75% of "
                      "the steps); long = more steps and problems, the recipe; "
                      "exact-recurrence (also: serial) = the full-bandwidth model trained on its fully recurrent "
                      "(exact) passes; exact-recurrence-tuned (also: recurrent) = that with lambda 0.3, 3000 steps, 8 "
                      "gradient passes, 2 seeds on sum; controls = that beside the looped and equal-FLOPs controls on "
                      "three families.")
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
    curriculum: float = doc(0.0, "Length curriculum: over the first this fraction of the steps, training draws "
                            "from the shortest problems first, widening linearly to all lengths; 0 = none.")
    passes: int = doc(
        0, "fullband model: every multi-pass batch runs this many passes instead of pass_mix's (at most the "
        "batch's exact count: with passes >= the longest example and prefix_mixin false, the last pass is the "
        "fully recurrent one exact mode runs); 0 = schedule.pass_mix.")
    controls: tuple[str, ...] = doc(
        (), f"Control models trained on the same batches and decoded answer-only, from {CONTROLS}: looped = the "
        "full-bandwidth model with feedback_shift=0 (pass k fuses h_t, not h_{t-1}); equal_flops = a plain model as "
        "deep as its training FLOPs match the full-bandwidth model's (fullband.experiments.reasoning.controls.train).")
    families: tuple[str, ...] = doc(
        (), f"Run the study once per family (from {REASONING_FAMILIES}) into out_dir/<family>/ and write one report "
        "over all of them in out_dir; empty = the one family of --family.")
    resume: str = resume_field(
        "finished models and evaluated cells are reused, a training run left unfinished continues from its latest "
        "checkpoint: the numbers of an uninterrupted run")

    def validate(self) -> None:
        self.strides = tuple(self.strides)
        self.modes = tuple(self.modes)
        self.test_lengths = tuple(self.test_lengths)
        self.fused_passes = (self.fused_passes,) if is_int(self.fused_passes) else tuple(self.fused_passes)
        require_ints(self, {"min_length": 1, "train_examples": 1, "test_per_length": 1, "seeds": 1,
                            "workers": 1})
        require(len(self.fused_passes) > 0 and all(is_int(k) and k >= 0 for k in self.fused_passes),
                "fused_passes", self.fused_passes, "must be a non-empty list of integers >= 0")
        require(all(is_int(n) and 1 <= n <= 26 for n in self.test_lengths), "test_lengths", self.test_lengths,
                "must be integers in 1..26 (the trained range is min_length..max_length)")
        require(self.answer_share is None or (is_number(self.answer_share) and 0 <= self.answer_share <= 1
                                               and 0 in self.strides and len(set(self.strides)) > 1),
                "answer_share", self.answer_share, "must be in [0, 1], with 0 and another stride in strides, or none")
        DataConfig(curriculum=self.curriculum)  # validates it
        require(is_int(self.passes) and (self.passes == 0 or self.passes >= 2), "passes", self.passes,
                "must be an integer >= 2, or 0 (pass_mix)")
        require(self.family in REASONING_FAMILIES, "family", self.family, f"must be one of {REASONING_FAMILIES}")
        self.controls, self.families = tuple(self.controls), tuple(self.families)
        require(all(c in CONTROLS for c in self.controls) and len(set(self.controls)) == len(self.controls),
                "controls", self.controls, f"must be distinct names from {CONTROLS}")
        require(all(f in REASONING_FAMILIES for f in self.families) and len(set(self.families)) == len(self.families),
                "families", self.families, f"must be distinct names from {REASONING_FAMILIES}")
        require(not self.controls or 0 in self.strides, "controls", self.controls,
                "are decoded answer-only: add 0 to strides")
        require(is_int(self.modulus) and 2 <= self.modulus <= 10, "modulus", self.modulus, "must be in 2..10")
        require(is_int(self.max_length) and self.min_length <= self.max_length <= 26, "max_length",
                self.max_length, f"must be in min_length={self.min_length}..26")
        require(len(self.strides) > 0 and all(is_int(s) and s >= 0 for s in self.strides), "strides",
                self.strides, "must be a non-empty list of integers >= 0 (0 = answer only)")
        require(len(self.modes) > 0 and all(m in DECODING_MODES for m in self.modes), "modes", self.modes,
                f"must be a non-empty list from {DECODING_MODES}")
