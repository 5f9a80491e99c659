"""``fullband recipe``'s config, presets and variants (each ingredient of the recipe toggled)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from fullband.config import (
    device_field,
    doc,
    is_int,
    require,
    require_ints,
    resume_field,
    threads_field,
)
from fullband.experiments.core.config import StudyConfig
from fullband.experiments.core.lm.config import LM_PRESETS
from fullband.training.config import DataConfig

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
class RecipeConfig(StudyConfig):
    """``fullband recipe``: which ingredient of the recipe moves the fused-vs-plain gap, by how much, and how the
    gap moves with width and with feedback steps. Every run is a ``fullband compare`` run of the preset."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = RECIPE_PRESETS
    SECTIONS: ClassVar[tuple[str, ...]] = ("data",)
    TUPLES: ClassVar[tuple[str, ...]] = ("variants", "widths")

    preset: str = doc("default", f"One of {tuple(RECIPE_PRESETS)}: default = the compare default preset and widths "
                      "64,256 (about an hour on 2 CPU cores); smoke = seconds (tests).")
    compare_preset: str | None = doc(None, "The fullband compare preset every run starts from (none = the preset's).")
    variants: tuple[str, ...] = doc(tuple(RECIPE_VARIANTS), f"Rows of the ablation, from {tuple(RECIPE_VARIANTS)}.")
    data: DataConfig = field(default_factory=DataConfig)  # every run's corpus and tokenizer (fullband compare's)
    widths: tuple[int, ...] | None = doc(
        None, "d_model of the extra best-recipe runs (baseline and feedback at 1x) next to the preset's own width.")
    seeds: int = doc(2, "Seeds per run: every number is a mean over them.")
    eval_windows: int | None = doc(None, "Test windows per model (none = the compare preset's).")
    train_eval_points: int = doc(8, "Validations during each feedback run (the gap against feedback steps).")
    workers: int = doc(2, "Training runs at a time (see fullband compare --workers).")
    out_dir: str = doc("runs/recipe", "Run directory: runs, report.md, results.json, plots.")
    report_only: bool = doc(False, "Analyse the results.json in out_dir again and rewrite its report (no training).")
    resume: str = resume_field("runs it finished and evaluated are kept")
    device: str = device_field("for training and evaluation")
    threads: str = threads_field()

    def validate(self) -> None:
        require(self.compare_preset in LM_PRESETS, "compare_preset", self.compare_preset,
                f"must be one of {tuple(LM_PRESETS)}")
        require(len(self.variants) > 0 and all(v in RECIPE_VARIANTS for v in self.variants), "variants",
                self.variants, f"must be a non-empty list from {tuple(RECIPE_VARIANTS)}")
        require(all(is_int(w) and w >= 8 and w % 8 == 0 for w in self.widths), "widths", self.widths,
                "must be integers >= 8 and divisible by 8 (4 heads of an even size)")
        require_ints(self, {"seeds": 1, "train_eval_points": 0, "workers": 1})
        if self.eval_windows is not None:
            require_ints(self, {"eval_windows": 1})
