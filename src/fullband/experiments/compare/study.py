"""``fullband compare``: does latent feedback buy training tokens?

For each seed: baselines (``model.feedback=false``) trained to each budget in ``budgets`` x the unit
``train.token_budget``; the full-bandwidth model trained to 1x with ``schedule`` (the recipe's by default:
multi-pass batches from the first step, fullband.training.recipes); and, for the stability diagnostic,
the same with only 1-/2-pass batches. Every run is ``fullband train`` (:func:`run_train`) with the same model size,
tokenizer, optimizer and data order, in its own directory under ``out_dir``. Then every model is scored on the test
split in every mode, the feedback models get the stability diagnostic on the validation split, the baseline's
loss-vs-tokens curve gives each mode's effective token multiplier, and
:mod:`fullband.experiments.compare.report` writes it all down.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from fullband import rundir
from fullband.config import ConfigError, install_hint
from fullband.configio import build_config, config_to_dict, load_config_file, save_resolved_config
from fullband.experiments.compare.config import CompareConfig
from fullband.experiments.compare.records import CompareResults
from fullband.experiments.compare.report import plot_compare, report, summary
from fullband.experiments.compare.trend import gap_trend
from fullband.experiments.core.lm.runs import (
    FEEDBACK,
    Job,
    collect_runs,
    machine_info,
    multipliers,
    plan_runs,
    training_blocks,
)
from fullband.experiments.core.plots import have_matplotlib
from fullband.experiments.core.report import Report
from fullband.experiments.core.study import Study, leaves
from fullband.training.run import resolve_device


class CompareStudy(Study):
    """``fullband compare`` (see the module doc): every run of :meth:`plan` trained and evaluated
    (:func:`run_jobs`), the multipliers read off the baseline curve, the report of :mod:`.report`."""

    command = "compare"
    command_skip = ("resume",)

    def prepare(self) -> None:
        if not have_matplotlib():  # say so now, not after the training
            warnings.warn("matplotlib is not installed, so the report will have no plots: "
                          f"{install_hint('plot')}", stacklevel=4)
        if self.cfg.resume:
            check_resumable(self.cfg, self.out_dir)
        super().prepare()
        if self.cfg.resume:  # the saved config reruns the study; it must not say "resume" to a fresh directory
            save_resolved_config(dataclasses.replace(self.cfg, resume=False), self.out_dir / rundir.SETTINGS)

    def plan(self) -> list[Job]:
        return [(self.cfg, spec, self.out_dir) for spec in plan_runs(self.cfg)]

    def header(self, jobs: list[Job]) -> dict[str, Any]:
        """What results.json holds before the runs: the machine and the commands."""
        return {"machine": {**machine_info(resolve_device(self.cfg.device), self.cfg.workers),
                            "training_blocks": training_blocks(self.cfg)},
                "commands": commands(self.cfg, self.out_dir)}

    def collect(self) -> CompareResults:
        jobs = self.plan()
        return collect_runs(self.cfg, jobs, self.header(jobs), self.progress)

    def analyse(self, results: CompareResults) -> dict[str, Any]:
        return {"multipliers": multipliers(results["runs"]), "gap_trend": gap_trend(results)}

    def plot(self, results: CompareResults) -> None:
        plot_compare(results, self.out_dir)

    records_command = False  # results["commands"] holds it, with the commands that reproduce each run

    def report(self, results: CompareResults, plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: CompareResults) -> str:
        return summary(results)


def check_resumable(cfg: CompareConfig, out_dir: Path) -> None:
    """Refuse ``--resume true`` unless ``out_dir`` holds a compare study with these settings (one line: what to
    do). Settings that do not change the numbers (resume, workers, threads, out_dir) may differ."""
    saved_path = out_dir / rundir.SETTINGS
    if not saved_path.is_file():
        raise ConfigError(f"out_dir={str(out_dir)!r} holds no compare study to resume (no config.toml): run "
                          "without --resume true to start one there")
    try:
        saved = build_config(CompareConfig, load_config_file(saved_path), {})
    except (ConfigError, ValueError, TypeError, OSError) as err:
        raise ConfigError(f"out_dir={str(out_dir)!r} does not hold a fullband compare study ({saved_path}: "
                          f"{err}); pick the directory of an interrupted compare run, or drop --resume") from None
    ignore = {"resume", "workers", "threads", "out_dir"}
    ours, theirs = (leaves({k: v for k, v in config_to_dict(c).items() if k not in ignore}) for c in (cfg, saved))
    differ = [k for k in ours if ours[k] != theirs.get(k)]
    if differ:
        shown = "; ".join(f"{k} {theirs.get(k)!r} there, {ours[k]!r} here" for k in differ[:3])
        raise ConfigError(f"out_dir={str(out_dir)!r} holds a compare study with other settings ({shown}): resume it "
                          f"with `fullband compare --config {saved_path} --resume true`")


def commands(cfg: CompareConfig, out_dir: Path) -> dict[str, str]:
    """The commands the report prints, each one that runs as printed: a saved config.toml names the directory it was
    trained in, which already holds that run, so each trains into a new one (--out_dir)."""
    seed, run = f"seed{cfg.train.seed}", FEEDBACK
    return {"command": CompareStudy(cfg).command_line(),
            "reproduce": f"fullband compare --config {out_dir / rundir.SETTINGS} --out_dir {out_dir}-rerun",
            "one_run": f"fullband train --config {out_dir}/{seed}/{run}/{rundir.SETTINGS} "
                       f"--out_dir {out_dir}-{seed}-{run}"}


def run_compare(cfg: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Train, evaluate and report (see the module doc); returns what results.json holds."""
    return CompareStudy(cfg, progress).run()
