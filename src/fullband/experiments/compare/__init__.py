"""`fullband compare`: does latent feedback buy training tokens? Its config, study, analyses (per-mode scores,
stability, multipliers, gap trend) and report."""

from fullband.experiments.core.registry import StudyCommand

COMMANDS = (StudyCommand(
    "compare", "Baselines at several token budgets vs the full-bandwidth model: report.",
    config="fullband.experiments.compare.config:CompareConfig",
    study="fullband.experiments.compare.study:CompareStudy",
    reports={"compare": "fullband.experiments.compare.report:report"}),)
