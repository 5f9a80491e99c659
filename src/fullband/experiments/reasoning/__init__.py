"""`fullband eval-reasoning`: shorter reasoning traces at equal accuracy? Its data, evaluation, report and its
compute-matched controls (:mod:`.controls`)."""

from fullband.experiments.core.registry import StudyCommand

COMMANDS = (StudyCommand(
    "eval-reasoning", "Study: shorter reasoning traces at equal accuracy?",
    config="fullband.experiments.reasoning.config:ReasoningConfig",
    study="fullband.experiments.reasoning.controls.study:reasoning_study",
    reports={"reasoning traces": "fullband.experiments.reasoning.report:report",
             "reasoning controls": "fullband.experiments.reasoning.controls.report:report"}),)
