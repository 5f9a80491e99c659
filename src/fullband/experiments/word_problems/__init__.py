"""``fullband eval-controls``: does latent feedback do serial work that controls trained to win cannot?

The full-bandwidth model against a baseline, an equal-FLOPs transformer, a looped transformer with input injection
and an RNN reference on ball-tracking word problems over S5 and A5 (DESIGN.md §7). One package: the settings
(:mod:`.config`), the arms (:mod:`.arms`, :mod:`.models`), one training loop (:mod:`.train`), the study
(:mod:`.study`), the analysis (:mod:`.analysis`) and the report (:mod:`.report`).
"""

from fullband.experiments.core.registry import StudyCommand

COMMANDS = (StudyCommand(
    "eval-controls", "Study: the full-bandwidth model vs controls trained to win on S5/A5 word problems.",
    config="fullband.experiments.word_problems.config:ControlsConfig",
    study="fullband.experiments.word_problems.study:ControlsStudy",
    reports={"controls": "fullband.experiments.word_problems.report:report"}),
    StudyCommand(
    "eval-decisive", "Study: vs the controls that decide length generalisation, by a rule fixed before the runs.",
    config="fullband.experiments.word_problems.decisive.config:DecisiveConfig",
    study="fullband.experiments.word_problems.decisive.study:DecisiveStudy",
    reports={"decisive": "fullband.experiments.word_problems.decisive.report:report"}),
    StudyCommand(
    "eval-recall", "Study: lookup-then-compose problems that need attention and recurrence at once.",
    config="fullband.experiments.word_problems.recall.config:RecallConfig",
    study="fullband.experiments.word_problems.recall.study:RecallStudy",
    reports={"recall": "fullband.experiments.word_problems.recall.report:report"}),)
