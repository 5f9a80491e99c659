"""The config and presets of ``fullband eval-state`` (torch-free: the command line checks them before torch
loads): a synthetic-task study of two models (:class:`fullband.experiments.core.config.SyntheticStudyConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fullband.config import doc, is_int, is_number, require, require_ints, resume_field
from fullband.experiments.core.config import ALIASES, SyntheticStudyConfig, pinned, sectioned
from fullband.modes import EXACT, STANDARD, fused

STATE_TASKS = ("completion", "memory", "registers")
STATE_PREFILLS = ("standard", "one-step", "exact")
# The decoding mode whose prefill each probed prefill is (fullband.modes.prefill_of gives its passes).
STATE_PREFILL_MODES = {"standard": STANDARD, "one-step": fused(1), "exact": EXACT}
_DEFAULT_SIZES = dict(seq_len=24, train_per_task=10_000, probe_train=600, probe_test=400, d_model=64, n_layers=3,
                      n_heads=4, steps=2000, batch_size=64, lr=1e-3)
_STATE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(seq_len=12, train_per_task=200, probe_train=32, probe_test=32, d_model=32, n_layers=2, n_heads=2,
                  steps=8, batch_size=8, lr=3e-3),
    "default": _DEFAULT_SIZES,
    "adamw": _DEFAULT_SIZES,
    "long": dict(seq_len=32, train_per_task=40_000, probe_train=2000, probe_test=1000, d_model=128, n_layers=4,
                 n_heads=4, steps=6000, batch_size=64, lr=2e-3),
}
# adamw: the committed report (docs/results/state-tracking: AdamW, feedback from 75% of the steps); every other preset
# trains with fullband train's recipe, as every command that trains does by default.
STATE_PRESETS = {name: pinned(sectioned(p, ALIASES), name != "adamw") for name, p in _STATE_PRESETS.items()}


@dataclass
class StateTrackingConfig(SyntheticStudyConfig):
    """``fullband eval-state``: linear probes of the final token's residual stream at every depth (paper Figure 7)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = STATE_PRESETS

    preset: str = doc("default", f"Sizes of everything left at none: one of {tuple(STATE_PRESETS)}: smoke = seconds, "
                      "fullband train's recipe (a check of the plumbing: no verdict); default = the committed report's "
                      "sizes with fullband train's recipe; adamw = the committed report (AdamW, feedback from 75% of "
                      "the steps); long = larger, the recipe.")
    out_dir: str = doc("runs/state-tracking", "Run directory: data/, baseline/, fullband/, results.json, report.md, "
                       "PNG.")
    tasks: tuple[str, ...] = doc(STATE_TASKS, f"Tasks (trained together, probed separately): from {STATE_TASKS}.")
    seq_len: int | None = doc(None, "Tokens per sequence, task letter and final '?' included (even).")
    train_per_task: int | None = doc(None, "Training sequences per task.")
    probe_train: int | None = doc(None, "Fresh sequences per task to fit each probe on.")
    probe_test: int | None = doc(None, "Fresh sequences per task to measure each probe on.")
    prefills: tuple[str, ...] = doc(STATE_PREFILLS, "Prefills probed: standard (1 pass), one-step (2 passes), exact.")
    ridge: float = doc(1e-2, "Ridge penalty of the probes (times the number of examples).")
    resume: str = resume_field(
        "with the same settings: finished models and probed cells are reused, and a training run left unfinished "
        "continues from its latest checkpoint: the numbers of an uninterrupted study")

    def validate(self) -> None:
        self.tasks, self.prefills = tuple(self.tasks), tuple(self.prefills)
        require_ints(self, {"train_per_task": 1, "probe_train": 2, "probe_test": 1})
        require(is_int(self.seq_len) and self.seq_len >= 6 and self.seq_len % 2 == 0, "seq_len", self.seq_len,
                "must be an even integer >= 6 (an odd one can never end with every bracket closed)")
        require(len(self.tasks) > 0 and all(t in STATE_TASKS for t in self.tasks), "tasks", self.tasks,
                f"must be a non-empty list from {STATE_TASKS}")
        require(len(self.prefills) > 0 and all(p in STATE_PREFILLS for p in self.prefills), "prefills",
                self.prefills, f"must be a non-empty list from {STATE_PREFILLS}")
        require(is_number(self.ridge) and self.ridge > 0, "ridge", self.ridge, "must be > 0")
