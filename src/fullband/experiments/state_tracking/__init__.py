"""`fullband eval-state`: state tracking at the input layer (paper Figure 7): probes, study, report."""

from fullband.experiments.core.registry import StudyCommand

COMMANDS = (StudyCommand(
    "eval-state", "Study: linear probes of the state at every depth (Fig. 7).",
    config="fullband.experiments.state_tracking.config:StateTrackingConfig",
    study="fullband.experiments.state_tracking.study:StateTrackingStudy",
    reports={"state tracking at the input layer": "fullband.experiments.state_tracking.report:report"}),)
