"""``fullband eval-reasoning --families ...`` (``--preset controls``): the reasoning study with its controls once
per family (:class:`FamilyStudy`), then one report (:mod:`.report`). The controls themselves are trained
by :mod:`.train`; this module only runs the families, so :mod:`..study` and :mod:`.train` never import
each other."""

from __future__ import annotations

import dataclasses
from typing import Any

from fullband.config import explicit_keys
from fullband.experiments.core.config import flat_view
from fullband.experiments.core.parallel import map_jobs
from fullband.experiments.core.report import Report
from fullband.experiments.core.study import Study, resolve_study_device, set_threads
from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.experiments.reasoning.controls.report import FLOPS_PLOT, plot_flops, report, verdict
from fullband.experiments.reasoning.records import ControlsResults
from fullband.experiments.reasoning.study import ReasoningStudy, train_and_evaluate

# ---------------------------------------------------------------------------------------------- the study


class FamilyStudy(ReasoningStudy):
    """One family of :class:`ControlsStudy`: the reasoning study in out_dir/<family>/, its report naming the
    command that made the whole (which made this part)."""

    timed = False  # its seeds share the workers with the other families': only the whole study's time is its own

    def __init__(self, cfg: ReasoningConfig, progress: bool, command: str) -> None:
        super().__init__(cfg, progress)
        self.parent_command = command

    def command_line(self) -> str:
        return self.parent_command


class ControlsStudy(Study):
    """``fullband eval-reasoning --families ...`` (``--preset controls``): the reasoning study with its controls
    once per family, then one report: compute, answer-only accuracy with Wilson intervals, worst seeds, the
    accuracy-vs-training-FLOPs plot, a verdict per family."""

    command = "eval-reasoning"
    fresh_out_dir = False
    timed = True
    command_skip = ("reuse_models", "resume")

    def prepare(self) -> None:
        set_threads(self.cfg.threads)
        resolve_study_device(self.cfg)  # its results.json records the device, as each family's does
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def family_config(self, family: str) -> ReasoningConfig:
        cfg = self.cfg
        # Every field explicit: the preset must not fill families back in, nor undo a value given on purpose.
        keys = {f.name for f in dataclasses.fields(cfg)}
        keys |= {f"{section}.{f.name}" for section in cfg.SECTIONS for f in dataclasses.fields(getattr(cfg, section))}
        with explicit_keys(keys):
            return dataclasses.replace(cfg, family=family, families=(), out_dir=str(self.out_dir / family))

    def collect(self) -> ControlsResults:
        """Every family's seeds in one pool of ``workers`` (no core waits for a family's last seed); each family's
        report is written as soon as its seeds are done."""
        cfg = self.cfg
        studies = [FamilyStudy(self.family_config(family), cfg.progress, self.command_line())
                   for family in cfg.families]
        side_by_side = min(cfg.workers, len(studies) * cfg.seeds) > 1  # else map_jobs runs them here, with bars
        family_jobs = []
        for study in studies:
            study.prepare()
            family_jobs.append(study.seed_jobs(side_by_side))
        jobs = [job for each in family_jobs for job in each]
        if side_by_side and cfg.progress:
            print(f"training and evaluating {len(jobs)} runs ({len(studies)} families x {cfg.seeds} seeds), "
                  f"{min(cfg.workers, len(jobs))} at a time", flush=True)
        outputs = map_jobs(train_and_evaluate, jobs, cfg.workers)
        families = {}  # a family's results as soon as its own seeds are done (FamilyStudy is untimed: no start)
        for study, each in zip(studies, family_jobs, strict=True):
            families[study.cfg.family] = study.finish(study.assemble([next(outputs) for _ in each]), start=0.0)
        return {"study": "reasoning controls", "config": flat_view(self.cfg), "families": families,
                "resumed": bool(cfg.resume)}

    def analyse(self, results: ControlsResults) -> dict[str, Any]:
        return {"verdict": verdict(results)}

    def plot(self, results: ControlsResults) -> None:
        plot_flops(results, self.out_dir / FLOPS_PLOT)

    def report(self, results: ControlsResults, plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: ControlsResults) -> str:
        return "\n".join([*results["verdict"], "", super().summary(results)])


def run_families(cfg: ReasoningConfig) -> ControlsResults:
    """``fullband eval-reasoning`` with ``families``: one study per family and a report over them."""
    return ControlsStudy(cfg, cfg.progress).run()


def reasoning_study(cfg: ReasoningConfig) -> Study:
    """``fullband eval-reasoning``'s study: one per family with its compute-matched controls (``families``), else
    the reasoning-traces study of one family."""
    return ControlsStudy(cfg) if cfg.families else ReasoningStudy(cfg)
