"""The named recipes of ``fullband train`` (``--preset``), one source for every command that trains: the defaults
of :class:`~fullband.training.config.OptimConfig`, :class:`~fullband.training.config.ScheduleConfig` and
:class:`~fullband.config.ModelConfig` *are* the ``recipe`` preset, which ``fullband compare`` and ``fullband recipe``
train with; the others say what they change. Torch-free (the configs import it)."""

from __future__ import annotations

# The presets of ``fullband train`` (what each changes relative to the defaults, which *are* the "recipe" preset).
# recipe: the best recipe our recipe study measured (docs/results/recipe/report.md), the one `fullband compare` and
#   `fullband recipe` train with: NorMuon on the blocks' and the fusion's matrices (muon_lr 0.02, wd 0.01), AdamW
#   at 1e-3 on the rest, the fusion at 3x the learning rate, 25 warmup steps, multi-pass batches (88% 2 passes, 12%
#   3) from the first step, raw plain inputs and normalised fused inputs (ModelConfig's input_norm="fused",
#   gate_norm="own"). In the recipe study's full ablation (docs/LOG.md, issue 24) the paper's late feedback start
#   was the weakest variant: its fused(1) mode was worth 0.40x its training tokens.
# paper: the paper's published recipe (DESIGN.md section 3, paper section 4): NorMuon (lr 1e-2, wd 0.01) on the
#   matrices, Adam (lr 5e-4, no weight decay) on the rest, WSD with 200 warmup steps and a 25% cool-down to zero,
#   the fusion at the common rate, single-pass until 75% of the steps, then 88% 2-pass / 12% 3-pass batches (the
#   75/22/3 split). Set for its 1B runs (~170K feedback steps, a quarter of the run), not for small ones.
TRAIN_PRESETS: dict[str, dict[str, object]] = {
    "recipe": {},
    "paper": {
        "optim": {"optimizer": "normuon", "muon_lr": 1e-2, "muon_weight_decay": 0.01, "lr": 5e-4,
                  "weight_decay": 0.0, "fusion_lr_mult": 1.0, "warmup_steps": 200, "schedule": "wsd",
                  "decay_fraction": 0.25, "min_lr_ratio": 0.0},
        "schedule": {"feedback_start": 0.75, "pass_mix": (0.88, 0.12)},
    },
}
