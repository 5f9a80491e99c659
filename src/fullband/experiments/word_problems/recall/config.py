"""``fullband eval-recall``: the settings of the lookup-then-compose study (torch-free, so ``--help`` and bad values
are answered before torch loads). See :mod:`fullband.experiments.word_problems.recall.study`."""

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
from fullband.experiments.word_problems.config import GROUPS, validate_training_grid

ARMS = ("baseline", "looped", "rnn", "wide_lstm", "hybrid", "fullband", "fullband_paper")
VARIANTS = ("full", "compose", "lookup")  # fullband.tasks.lookup_problems.VARIANTS
POSITIONS = ("rope", "none")
NAMES = 64  # fullband.tasks.lookup_problems.NAMES: the largest table

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(groups=("s5",), train_length=3, train_tables=4, validation_tables=(4,), test_tables=(2, 6),
                  test_lengths=(4, 6), steps=12, batch_size=8, learning_rates=(3e-3,), d_model=16, n_heads=2,
                  validation_problems=16, test_problems=16, eval_every=6, fresh_seeds=(100, 101), loops_per_step=(1,),
                  feedback_weights=(1.0,), weight_decays=(0.0,)),
    "default": dict(),
}


@dataclass
class RecallConfig(StudyConfig):
    """``fullband eval-recall``: lookup-then-compose word problems over S5 and A5, every step looked up in a table at
    the start of the problem and then composed; the full-bandwidth model against controls that have one half or both
    (DESIGN.md §7), chosen by the rule fixed before the runs and confirmed on fresh seeds."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    TUPLES: ClassVar[tuple[str, ...]] = ("groups", "variants", "arms", "positions", "validation_tables", "test_tables",
                                         "test_lengths", "learning_rates", "weight_decays", "loops_per_step",
                                         "feedback_weights", "fresh_seeds")

    preset: str = doc("default", f"Settings to start from: one of {tuple(PRESETS)}. smoke = seconds (plumbing "
                      "only: its report gives no verdict); default = the committed report.")
    out_dir: str = doc("runs/recall", "Run directory: runs/ (one folder per training run), results.json, report.md, "
                       "PNGs.")
    groups: tuple[str, ...] = doc(GROUPS, f"Groups of the moves, from {GROUPS}.")
    variants: tuple[str, ...] = doc(VARIANTS, f"Task variants, from {VARIANTS}: full = look each step up in the "
                                    "problem's table, then compose (tuned here); compose = one global binding, "
                                    "composition only; lookup = the table, no composition (the two diagnostics, "
                                    "with full's chosen settings).")
    arms: tuple[str, ...] = doc(ARMS, "Models: baseline (a 1-pass transformer, knob: weight decay), looped (the "
                                "blocks looped c x n times, the normalised state injected, knob: c), rnn (an LSTM with "
                                "the full-bandwidth model's parameters), wide_lstm (an LSTM with its training FLOPs), "
                                "hybrid (transformer blocks then an LSTM, parameter-matched, knob: blocks), fullband "
                                "(trained on its exact recurrence, knob: lambda), fullband_paper (the paper's few "
                                "passes, knob: lambda); both full-bandwidth arms answer with exact prefill.")
    positions: tuple[str, ...] = doc(POSITIONS, f"Positional encodings in the 1-pass transformer's grid, from "
                                     f"{POSITIONS} (none = NoPE); the other transformer arms use RoPE.")
    train_length: int = doc(6, "Steps of every training problem; its prefixes are the trained lengths 1..this.")
    train_tables: int = doc(32, "Training tables hold 1..this bindings (one size per batch).")
    validation_tables: tuple[int, ...] = doc((8, 32), "Table sizes of the validation problems (trained lengths) that "
                                             "choose each arm's setting; their mean accuracy counts.")
    test_tables: tuple[int, ...] = doc((4, 16, 32, 64), f"Table sizes of the test problems (at most {NAMES}, the "
                                       "pool of names; above train_tables: a table larger than any trained).")
    test_lengths: tuple[int, ...] = doc((8, 12, 16, 24, 32, 48, 64), "Unseen lengths in the tables; accuracy is "
                                        "measured at every length up to the longest.")
    steps: int = doc(2000, "1x training steps. Tuning scores each run at 1x and 2x (WSD, the 1x model a cool-down "
                     "branched off the 2x run).")
    batch_size: int = doc(64, "Problems per training step.")
    learning_rates: tuple[float, ...] = doc((3e-4, 1e-3, 3e-3), "Peak AdamW learning rates of every arm's grid.")
    warmup_fraction: float = doc(0.05, "Linear warmup over this fraction of 1x steps.")
    cooldown_fraction: float = doc(0.25, "WSD: the learning rate decays linearly to 0 over this last fraction.")
    d_model: int = doc(64, "Width of the transformers (and of the hybrid's blocks).")
    n_layers: int = doc(2, "Blocks of the transformers (the hybrid's knob: 1..this blocks before its LSTM).")
    n_heads: int = doc(4, "Attention heads of every transformer.")
    weight_decays: tuple[float, ...] = doc((0.0, 0.1), "baseline's knob: AdamW weight decay (the other arms: 0).")
    loops_per_step: tuple[int, ...] = doc((1, 2), "looped's knob: loops per problem step, c in k = c x n.")
    feedback_weights: tuple[float, ...] = doc((0.3, 1.0), "The full-bandwidth arms' knob: lambda, the weight of the "
                                              "feedback passes' mean loss against pass 1's.")
    grad_passes: int = doc(8, "fullband: gradients through pass 1 and the last this many passes.")
    fusion_lr_mult: float = doc(3.0, "The full-bandwidth arms: the fusion's learning rate over the others'.")
    tuning_seed: int = doc(0, "The seed of the tuning grid.")
    fresh_seeds: tuple[int, ...] = doc((100, 101, 102, 103, 104), "Seeds that confirm the choices.")
    validation_problems: int = doc(500, "Validation problems per table size.")
    test_problems: int = doc(250, "Test problems per table size, each as long as the longest test length.")
    eval_every: int = doc(200, "Validation during training every this many steps (the training curves).")
    workers: int = doc(2, "Training runs at a time, each in its own process. The numbers do not depend on it.")
    threads: str = threads_field()
    device: str = device_field("for training and evaluation")
    progress: bool = doc(True, "Progress lines.")
    resume: str = resume_field("finished runs are read back, an unfinished one starts again: the numbers of an "
                               "uninterrupted study")

    # the arms' interface (fullband.experiments.word_problems.arms): the transformer shapes, the looped injection
    injections: ClassVar[tuple[str, ...]] = ("normed",)
    rnn_cells: ClassVar[tuple[str, ...]] = ("lstm",)
    equal_flops_shapes: ClassVar[tuple[str, ...]] = ()

    def problems(self, group: str) -> Any:
        """The problems of a run's ``group``: ``"s5/full"`` -> lookup problems over S5 in the full variant."""
        from fullband.tasks.lookup_problems import LookupProblems

        name, _, variant = group.partition("/")
        return LookupProblems(name, variant or "full", tables=self.train_tables, largest=max(self.test_tables))

    @property
    def max_test_length(self) -> int:
        return max(self.test_lengths)

    @property
    def reported_lengths(self) -> tuple[int, ...]:
        return self.test_lengths

    def validate(self) -> None:
        validate_training_grid(self, {"groups": GROUPS, "variants": VARIANTS, "arms": ARMS, "positions": POSITIONS},
                               {"train_tables": 1, "tuning_seed": 0})
        require(self.variants[0] == "full", "variants", self.variants, "must start with full (the tuned variant)")
        require("fullband" in self.arms, "arms", self.arms, "must include fullband (the model under test)")
        require(self.train_tables <= NAMES, "train_tables", self.train_tables, f"must be at most {NAMES}")
        for name in ("validation_tables", "test_tables"):
            value = getattr(self, name)
            require(len(value) > 0 and all(is_int(K) and 1 <= K <= NAMES for K in value), name, value,
                    f"must be table sizes in 1..{NAMES}")
        require(all(self.train_tables >= K for K in self.validation_tables), "validation_tables",
                self.validation_tables, f"must be trained sizes (at most train_tables={self.train_tables})")
        require(len(self.fresh_seeds) > 0 and self.tuning_seed not in self.fresh_seeds, "fresh_seeds",
                self.fresh_seeds, f"must be seeds other than tuning_seed={self.tuning_seed}")
