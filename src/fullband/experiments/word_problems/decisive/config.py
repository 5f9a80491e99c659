"""``fullband eval-decisive``: the settings of the decisive-controls study (torch-free, so ``--help`` and bad values are
answered before torch loads). See :mod:`fullband.experiments.word_problems.decisive.study` for what it does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fullband.config import (
    device_field,
    doc,
    is_int,
    require,
    resume_field,
    threads_field,
)
from fullband.experiments.core.config import StudyConfig
from fullband.experiments.word_problems.config import EQUAL_FLOPS_SHAPES, GROUPS, RNN_CELLS, validate_training_grid

ARMS = ("baseline", "equal_flops", "looped", "growing_depth", "rnn", "fullband")
POSITIONS = ("rope", "none")  # fullband.config.POSITION_ENCODINGS
INJECTIONS = ("normed", "raw")  # word_problems.models.INJECTIONS

# smoke: the tests (seconds); default: the committed report (a day of 2-core time, resumable across sittings).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(groups=("s5",), train_length=3, test_lengths=(4, 6), long_test_lengths=(8,), steps=12,
                  batch_size=8, learning_rates=(1e-3, 3e-3), d_model=16, n_heads=2, validation_problems=32,
                  test_problems=32, long_test_problems=16, eval_every=6, fresh_seeds=(100, 101), hindsight_length=6,
                  long_train_length=4, loops_per_step=(1,), feedback_weights=(0.3,)),
    "default": dict(),
}


@dataclass
class DecisiveConfig(StudyConfig):
    """``fullband eval-decisive``: the full-bandwidth model against the transformer controls that decide length
    generalisation, on ball-tracking word problems over S5 and A5 (fullband.tasks.word_problems), each arm chosen by
    the rule of DESIGN.md §7 written before the runs and confirmed on fresh seeds."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    TUPLES: ClassVar[tuple[str, ...]] = ("groups", "arms", "positions", "injections", "test_lengths",
                                         "long_test_lengths", "learning_rates", "weight_decays", "equal_flops_shapes",
                                         "loops_per_step", "rnn_cells", "feedback_weights", "fresh_seeds")

    preset: str = doc("default", f"Settings to start from: one of {tuple(PRESETS)}. smoke = seconds (plumbing "
                      "only: its report gives no verdict); default = the committed report.")
    out_dir: str = doc("runs/decisive", "Run directory: runs/ and range16/ (one folder per training run), "
                       "results.json, report.md, PNGs.")
    groups: tuple[str, ...] = doc(GROUPS, f"Word-problem groups, from {GROUPS}.")
    arms: tuple[str, ...] = doc(ARMS, "Models compared, each on its own grid: baseline (a 1-pass transformer, knob: "
                                "weight decay), equal_flops (a plain transformer with the full-bandwidth model's "
                                "training FLOPs, knob: deeper or wider), looped (the blocks looped c x n times with "
                                "input injection, knob: c), growing_depth (the full-bandwidth pass loop with shift 0 "
                                "read after c x n passes, knob: c), rnn (GRU or LSTM with the full-bandwidth model's "
                                "parameters: the reference), fullband (knob: lambda, the feedback passes' loss "
                                "weight).")
    positions: tuple[str, ...] = doc(POSITIONS, f"Positional encodings in every transformer arm's grid, from "
                                     f"{POSITIONS} (none = NoPE).")
    injections: tuple[str, ...] = doc(INJECTIONS, f"What looped feeds back, from {INJECTIONS}: normed = the state "
                                      "after the final RMSNorm (the literature's form), raw = the residual stream.")
    train_length: int = doc(6, "Steps of every training problem; its prefixes are the trained lengths 1..this.")
    test_lengths: tuple[int, ...] = doc((8, 12, 16, 24, 32, 48, 64), "Unseen lengths in the tables, scored on "
                                        "test_problems problems as long as the longest (every prefix scored).")
    long_test_lengths: tuple[int, ...] = doc((96, 128, 192, 256), "Longer unseen lengths in the tables, scored on "
                                             "long_test_problems problems as long as the longest (fresh seeds only).")
    steps: int = doc(2000, "1x training steps. Tuning scores each run at 1x and 2x (WSD: the 1x model is a "
                     "cool-down branched off the 2x run, so both have a full schedule).")
    batch_size: int = doc(64, "Problems per training step.")
    learning_rates: tuple[float, ...] = doc((3e-4, 1e-3, 3e-3), "Peak AdamW learning rates of every arm's grid.")
    warmup_fraction: float = doc(0.05, "Linear warmup over this fraction of 1x steps.")
    cooldown_fraction: float = doc(0.25, "WSD: the learning rate decays linearly to 0 over this last fraction.")
    d_model: int = doc(64, "Width of the transformers (equal_flops' deep shape too).")
    n_layers: int = doc(2, "Blocks of the transformers (equal_flops' wide shape too).")
    n_heads: int = doc(4, "Attention heads of every transformer.")
    weight_decays: tuple[float, ...] = doc((0.0, 0.1), "baseline's knob: AdamW weight decay (the other arms: 0).")
    equal_flops_shapes: tuple[str, ...] = doc(EQUAL_FLOPS_SHAPES, "equal_flops' knob: deep = d_model wide with "
                                              "more blocks, wide = n_layers deep and wider.")
    loops_per_step: tuple[int, ...] = doc((1, 2), "The knob of looped and growing_depth: loops (passes) per problem "
                                          "step, c in k = c x n.")
    rnn_cells: tuple[str, ...] = doc(RNN_CELLS, "rnn's knob: the recurrent cell.")
    feedback_weights: tuple[float, ...] = doc((0.3, 1.0), "fullband's knob: lambda, the weight of the feedback "
                                              "passes' mean loss against pass 1's.")
    grad_passes: int = doc(8, "fullband: gradients through pass 1 and the last this many passes (the recipe's).")
    fusion_lr_mult: float = doc(3.0, "fullband and growing_depth: the fusion's learning rate over the others'.")
    tuning_seed: int = doc(0, "The seed of the tuning grid (training data and initial weights).")
    fresh_seeds: tuple[int, ...] = doc((100, 101, 102, 103, 104), "Seeds that confirm the choices: none took part "
                                       "in any choice, here or in an earlier study.")
    validation_problems: int = doc(1000, "Held-out problems of the trained lengths that choose each arm's setting.")
    test_problems: int = doc(1000, "Test problems, each as long as the longest of test_lengths.")
    long_test_problems: int = doc(250, "Long test problems, each as long as the longest of long_test_lengths.")
    hindsight_length: int = doc(64, "A control's hindsight setting is its best on the tuning seed's test problems at "
                                "the unseen lengths train_length+1..this (an upper bound on what its grid gives).")
    long_train_length: int = doc(16, "The second training range: the full-bandwidth model and the strongest "
                                 "controls trained on problems of this many steps with their chosen settings (no "
                                 "re-tuning), fresh seeds. 0 = skip it.")
    strongest: int = doc(2, "How many controls (the strongest by the rule) the second training range trains.")
    eval_every: int = doc(200, "Validation during training every this many steps (the training curves).")
    workers: int = doc(2, "Training runs at a time, each in its own process with the torch threads shared out. "
                       "The numbers do not depend on it.")
    threads: str = threads_field()
    device: str = device_field("for training and evaluation")
    progress: bool = doc(True, "Progress lines.")
    resume: str = resume_field("finished runs are read back, an unfinished one starts again: the numbers of an "
                               "uninterrupted study")

    def problems(self, group: str) -> Any:
        """The problems of ``group`` (fullband.tasks.word_problems.WordProblems)."""
        from fullband.tasks.word_problems import WordProblems

        return WordProblems(group)

    @property
    def max_test_length(self) -> int:
        """The longest length any run is scored at (the models' context is this + 2)."""
        return max(self.reported_lengths)

    @property
    def reported_lengths(self) -> tuple[int, ...]:
        """The unseen lengths the tables show (each run records its inference FLOPs at them)."""
        return (*self.test_lengths, *self.long_test_lengths)

    def validate(self) -> None:
        validate_training_grid(self, {"groups": GROUPS, "arms": ARMS, "positions": POSITIONS, "injections": INJECTIONS,
                                      "equal_flops_shapes": EQUAL_FLOPS_SHAPES, "rnn_cells": RNN_CELLS},
                               {"tuning_seed": 0, "long_test_problems": 1, "hindsight_length": 1,
                                "long_train_length": 0, "strongest": 1})
        require("fullband" in self.arms and "baseline" in self.arms, "arms", self.arms,
                "must include fullband (the model under test) and baseline (the reference every control must "
                "match at the trained lengths)")
        require(all(is_int(n) and n > max(self.test_lengths) for n in self.long_test_lengths), "long_test_lengths",
                self.long_test_lengths, f"must be longer than every test length (> {max(self.test_lengths)})")
        require(self.train_length < self.hindsight_length <= max(self.test_lengths), "hindsight_length",
                self.hindsight_length, f"must be in {self.train_length + 1}..{max(self.test_lengths)} (unseen "
                "lengths of the test problems)")
        require(self.long_train_length == 0 or self.train_length < self.long_train_length < max(self.test_lengths),
                "long_train_length", self.long_train_length,
                f"must be 0 (skip) or in {self.train_length + 1}..{max(self.test_lengths) - 1}")
        require(len(self.fresh_seeds) > 0 and all(is_int(s) and s >= 0 and s != self.tuning_seed
                                                  for s in self.fresh_seeds) and len(set(self.fresh_seeds))
                == len(self.fresh_seeds), "fresh_seeds", self.fresh_seeds,
                f"must be distinct integers >= 0 other than tuning_seed={self.tuning_seed}")
