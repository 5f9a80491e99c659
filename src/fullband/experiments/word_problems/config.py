"""``fullband eval-controls``: the settings of the controls study (torch-free, so ``--help`` and bad values are
answered before torch loads). See :mod:`fullband.experiments.word_problems` for what the study does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fullband.config import (
    ModelConfig,
    device_field,
    doc,
    is_int,
    is_number,
    require,
    require_ints,
    resume_field,
    threads_field,
)
from fullband.experiments.core.config import StudyConfig

GROUPS = ("s5", "a5")  # fullband.tasks.word_problems.GROUPS, repeated here to keep this module torch-free
ARMS = ("baseline", "equal_flops", "looped", "rnn", "fullband")
ABLATIONS = ("shift0",)
EQUAL_FLOPS_SHAPES = ("deep", "wide")
RNN_CELLS = ("gru", "lstm")

# smoke: the tests (seconds); default: the committed report (hours on 2 CPU cores, resumable).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(groups=("s5",), train_length=3, test_lengths=(4, 6), steps=12, batch_size=8, seeds=2,
                  learning_rates=(1e-3, 3e-3), d_model=16, n_heads=2, validation_problems=32, test_problems=32,
                  eval_every=6, extrapolation_length=5),
    "default": dict(),
}


@dataclass
class ControlsConfig(StudyConfig):
    """``fullband eval-controls``: the full-bandwidth model against controls trained to win (DESIGN.md §7), on
    ball-tracking word problems over S5 and A5 (fullband.tasks.word_problems)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    TUPLES: ClassVar[tuple[str, ...]] = ("groups", "arms", "ablations", "test_lengths", "learning_rates",
                                         "weight_decays", "equal_flops_shapes", "loops_per_step", "rnn_cells",
                                         "feedback_weights")

    preset: str = doc("default", f"Settings to start from: one of {tuple(PRESETS)}. smoke = seconds (plumbing "
                      "only: its report gives no verdict); default = the committed report.")
    out_dir: str = doc("runs/controls", "Run directory: runs/ (one folder per training run), results.json, "
                       "report.md, PNGs.")
    groups: tuple[str, ...] = doc(GROUPS, f"Word-problem groups, from {GROUPS}.")
    arms: tuple[str, ...] = doc(ARMS, "Models compared, each tuned on its own grid: baseline (a 1-pass transformer, "
                                "knob: weight decay), equal_flops (a plain transformer with the full-bandwidth "
                                "model's training FLOPs, knob: deeper or wider), looped (the blocks looped "
                                "loops_per_step x n times with input injection), rnn (GRU or LSTM with as many "
                                "parameters as the full-bandwidth model), fullband (knob: the feedback passes' "
                                "loss weight).")
    ablations: tuple[str, ...] = doc(ABLATIONS, f"Ablations trained with the full-bandwidth model's chosen settings "
                                     f"(not tuned), from {ABLATIONS}: shift0 = the pass loop with feedback_shift 0 "
                                     "(pass k fuses a position's own state), decoded with its training's pass count.")
    train_length: int = doc(6, "Steps of every training problem; its prefixes are the trained lengths 1..this.")
    test_lengths: tuple[int, ...] = doc((8, 12, 16, 24, 32, 48, 64), "Unseen lengths reported in the tables; "
                                        "accuracy is measured at every length up to the longest.")
    steps: int = doc(2000, "1x training steps. Tuning scores each run at 1x and 2x (WSD: the 1x model is a "
                     "cool-down branched off the 2x run, so both have a full schedule).")
    batch_size: int = doc(64, "Problems per training step.")
    learning_rates: tuple[float, ...] = doc((3e-4, 1e-3, 3e-3), "Peak AdamW learning rates of every arm's grid.")
    warmup_fraction: float = doc(0.05, "Linear warmup over this fraction of 1x steps.")
    cooldown_fraction: float = doc(0.25, "WSD: the learning rate decays linearly to 0 over this last fraction.")
    d_model: int = doc(64, "Width of the transformers (baseline, looped, fullband; equal_flops' deep shape).")
    n_layers: int = doc(2, "Blocks of the transformers (equal_flops' wide shape too).")
    n_heads: int = doc(4, "Attention heads of every transformer.")
    weight_decays: tuple[float, ...] = doc((0.0, 0.1), "baseline's knob: AdamW weight decay (the other arms: 0).")
    equal_flops_shapes: tuple[str, ...] = doc(EQUAL_FLOPS_SHAPES, "equal_flops' knob: deep = d_model wide with "
                                              "more blocks, wide = n_layers deep and wider.")
    loops_per_step: tuple[int, ...] = doc((1, 2), "looped's knob: loops per problem step (k = this x n).")
    rnn_cells: tuple[str, ...] = doc(RNN_CELLS, "rnn's knob: the recurrent cell.")
    feedback_weights: tuple[float, ...] = doc((0.3, 1.0), "fullband's knob: lambda, the weight of the feedback "
                                              "passes' mean loss against pass 1's.")
    grad_passes: int = doc(8, "fullband: gradients through pass 1 and the last this many passes (the recipe's).")
    fusion_lr_mult: float = doc(3.0, "fullband: the fusion's learning rate over the others' (the recipe's).")
    feedback_source: str = doc("residual", "fullband's span (DESIGN.md section 1): the state fed back, 'residual' (the "
                               "top block's output), 'normed' or 'layer:N' (N in 1..n_layers); every committed run "
                               "used the default.")
    feedback_target: int = doc(0, "fullband's span: the state enters after this many blocks, below the source (0 = "
                               "the embedding, the full-bandwidth model of every committed run).")
    seeds: int = doc(5, "Seeds 0..seeds-1 (training data and initial weights); the first one tunes every arm.")
    validation_problems: int = doc(1000, "Held-out problems of the trained lengths that choose each arm's setting.")
    # Why the study has a second selection (what seed 0's grid showed) is in docs/evaluation.md, not in --help.
    extrapolation_length: int = doc(16, "The second selection: each arm's grid point with the highest mean accuracy "
                                    "at the unseen lengths train_length+1..this, on validation_problems selection "
                                    "problems of their own (never the test problems), then trained on seeds "
                                    "1..seeds, none of which took part in the choice. 0 = skip it.")
    test_problems: int = doc(1000, "Test problems, each as long as the longest test length (every prefix scored).")
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
        return max(self.test_lengths)

    @property
    def reported_lengths(self) -> tuple[int, ...]:
        """The unseen lengths the tables show (each run records its inference FLOPs at them)."""
        return self.test_lengths

    def validate(self) -> None:
        validate_training_grid(self, {"groups": GROUPS, "arms": ARMS, "equal_flops_shapes": EQUAL_FLOPS_SHAPES,
                                      "rnn_cells": RNN_CELLS}, {"seeds": 1})
        require(all(v in ABLATIONS for v in self.ablations) and len(set(self.ablations)) == len(self.ablations),
                "ablations", self.ablations, f"must be distinct names from {ABLATIONS}")
        require("fullband" in self.arms and "baseline" in self.arms, "arms", self.arms,
                "must include fullband (the model under test) and baseline (the reference every control must "
                "match at the trained lengths)")
        require(self.extrapolation_length == 0 or (is_int(self.extrapolation_length)
                                                   and self.extrapolation_length > self.train_length),
                "extrapolation_length", self.extrapolation_length,
                f"must be 0 (no second selection) or an integer > train_length={self.train_length}")
        # The span as ModelConfig checks it, in the one line that names the fields.
        ModelConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                    feedback_source=self.feedback_source, feedback_target=self.feedback_target)


def validate_training_grid(cfg: Any, names: dict[str, tuple[str, ...]], ints: dict[str, int]) -> None:
    """The checks every word-problem study's config shares (each then checks its own fields): ``names`` the fields
    that list distinct names from an allowed set (non-empty), ``ints`` its own integer fields and their minimums,
    beside the training grid's (steps, sizes, learning rates, knobs, schedule)."""
    require_ints(cfg, {"train_length": 1, "steps": 4, "batch_size": 1, "d_model": 8, "n_layers": 1, "n_heads": 1,
                       "grad_passes": 1, "validation_problems": 1, "test_problems": 1, "eval_every": 1, "workers": 1}
                 | ints)
    for name, allowed in names.items():
        value = getattr(cfg, name)
        require(len(value) > 0 and all(v in allowed for v in value) and len(set(value)) == len(value), name, value,
                f"must be distinct names from {allowed}")
    require(len(cfg.test_lengths) > 0 and all(is_int(n) and n > cfg.train_length for n in cfg.test_lengths),
            "test_lengths", cfg.test_lengths, f"must be integers > train_length={cfg.train_length}")
    for name in ("learning_rates", "feedback_weights"):
        value = getattr(cfg, name)
        require(len(value) > 0 and all(is_number(v) and v > 0 for v in value), name, value,
                "must be a non-empty list of numbers > 0")
    require(len(cfg.weight_decays) > 0 and all(is_number(v) and v >= 0 for v in cfg.weight_decays),
            "weight_decays", cfg.weight_decays, "must be a non-empty list of numbers >= 0")
    require(len(cfg.loops_per_step) > 0 and all(is_int(v) and v >= 1 for v in cfg.loops_per_step),
            "loops_per_step", cfg.loops_per_step, "must be a non-empty list of integers >= 1")
    require(cfg.d_model % cfg.n_heads == 0 and (cfg.d_model // cfg.n_heads) % 2 == 0, "n_heads", cfg.n_heads,
            f"must divide d_model={cfg.d_model} into heads of even size (RoPE)")
    for name in ("warmup_fraction", "cooldown_fraction"):
        value = getattr(cfg, name)
        require(is_number(value) and 0 <= value < 1, name, value, "must be in [0, 1)")
    require(cfg.warmup_fraction < 1 - cfg.cooldown_fraction, "warmup_fraction", cfg.warmup_fraction,
            f"must end before the cool-down starts (at {1 - cfg.cooldown_fraction:g} of the steps)")
    require(is_number(cfg.fusion_lr_mult) and cfg.fusion_lr_mult > 0, "fusion_lr_mult", cfg.fusion_lr_mult,
            "must be > 0")
