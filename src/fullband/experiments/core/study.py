"""The one shape of every study: train several models, evaluate them, then write results.json, the plots and
report.md into a run directory, and say in a few lines what came out. Torch-free at import (the report code
imports it).

:class:`Study` is that shape; a study supplies what differs: ``collect`` (train and evaluate -> the results dict),
``analyse``, ``plot``, ``report`` (a :class:`~fullband.experiments.core.report.Report` fed from the results alone)
and ``summary`` (what the command prints). :class:`fullband.experiments.core.pair.PairStudy` is the synthetic-task
study of two models trained on the same data.
"""

from __future__ import annotations

import json
import shlex
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from fullband import rundir
from fullband.config import ConfigError, install_hint
from fullband.configio import config_to_dict, save_resolved_config
from fullband.experiments.core import plots as plotting
from fullband.experiments.core.report import REPORT, Report, header_command
from fullband.files import write_json


class Study:
    """Run many models, then report. :meth:`run`: check ``out_dir`` (:meth:`prepare`), train and evaluate every
    model (:meth:`collect`), :meth:`analyse`, then write results.json, the plots and report.md (:meth:`write`);
    :meth:`summary` is what the command prints afterwards.

    ``cfg`` is the study's config (a :class:`fullband.experiments.core.config.StudyConfig`, torch-free, in the
    study's package): it has a ``preset`` and an ``out_dir``; ``resume`` where the study can continue an
    interrupted run.
    """

    command: ClassVar[str]  # the ``fullband`` subcommand
    fresh_out_dir: ClassVar[bool] = True  # refuse an out_dir that is not empty (unless cfg.resume)
    timed: ClassVar[bool] = True  # results["seconds"]: the wall time of this invocation
    command_skip: ClassVar[tuple[str, ...]] = ()  # config keys that never go into the rerun command
    records_command: ClassVar[bool] = True  # results["command"]: the report's header names it

    def __init__(self, cfg: Any, progress: bool | None = None) -> None:
        self.cfg = cfg
        self.progress = getattr(cfg, "progress", True) if progress is None else progress  # None: the config's
        self.out_dir = Path(cfg.out_dir)

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.check_resumable()
        self.prepare()
        return self.finish(self.collect(), start)

    def check_resumable(self) -> None:
        """``resume`` true with nothing in out_dir: one line, not a fresh study (the CLI's conventions)."""
        if getattr(self.cfg, "resume", False) and not (self.out_dir.is_dir() and any(self.out_dir.iterdir())):
            raise ConfigError(f"out_dir={self.cfg.out_dir!r} holds no {self.command} study to resume: run without "
                              "--resume true to start one there")

    def finish(self, results: dict[str, Any], start: float) -> dict[str, Any]:
        """Add the analysis, the wall time since ``start`` (``timed``) and the date to ``results``; write them."""
        results.update(self.analyse(results))
        if self.records_command:
            results.setdefault("command", self.command_line())
        if self.timed:
            results["seconds"] = time.perf_counter() - start
        results["finished"] = time.strftime("%Y-%m-%d %H:%M %Z")  # a report re-rendered later keeps this date
        self.write(results)
        return results

    def prepare(self) -> None:
        """A fresh (or, with ``resume``, an interrupted) run directory holding the resolved config."""
        if not self.fresh_out_dir:
            return
        resume = getattr(self.cfg, "resume", False)
        if self.out_dir.exists() and any(self.out_dir.iterdir()) and not resume:
            hint = ", or --resume true to continue an interrupted study" if hasattr(self.cfg, "resume") else ""
            raise ConfigError(f"out_dir={self.cfg.out_dir!r} is invalid: it is not empty; pick a new --out_dir (or "
                              f"delete it){hint}")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        save_resolved_config(self.cfg, self.out_dir / rundir.SETTINGS)

    def collect(self) -> dict[str, Any]:
        """Train and evaluate every model -> the results dict (what results.json holds)."""
        raise NotImplementedError

    def analyse(self, results: dict[str, Any]) -> dict[str, Any]:
        """What the report reads off the runs, added to ``results``."""
        return {}

    def plot(self, results: dict[str, Any]) -> None:
        """Draw the study's figures into ``out_dir`` (matplotlib is there)."""

    def report(self, results: dict[str, Any], plots: bool) -> Report:
        """report.md, from ``results`` alone; ``plots``: whether the figures were drawn."""
        raise NotImplementedError

    def summary(self, results: dict[str, Any]) -> str:
        """What the command prints when the study is done: the headline and where the report is."""
        return f"report: {self.out_dir / REPORT}"

    def write(self, results: dict[str, Any], plots: bool | None = None) -> None:
        write_study(self.out_dir, results, self.plot, self.report, plots)

    def command_line(self) -> str:
        """The one command that reruns this study from scratch."""
        return equivalent_command(self.cfg, self.command, type(self.cfg)(preset=self.cfg.preset),
                                  skip=self.command_skip)


def run_study(study: Study) -> str:
    """Run ``study`` -> its terminal summary (what the command prints)."""
    return study.summary(study.run())


def write_study(out_dir: Path, results: dict[str, Any], plot: Callable[[dict[str, Any]], None],
                report: Callable[[dict[str, Any], bool], Report], plots: bool | None = None) -> None:
    """results.json, then the plots (skipped, with a warning, without matplotlib), then report.md."""
    write_json(out_dir / rundir.RESULTS, results)
    if plots is None:
        plots = plotting.have_matplotlib()
        if not plots:
            warnings.warn(f"matplotlib is not installed, so the report has no plots: {install_hint('plot')}",
                          stacklevel=3)
    if plots:
        plot(results)
    report(results, plots).write(out_dir)


def rerender(out_dir: Path, report: Callable[[dict[str, Any], bool], Report]) -> str:
    """report.md of ``out_dir`` rendered again from its results.json (the figures as drawn before). Results
    written before studies kept their command take it from the report they replace."""
    results = json.loads((Path(out_dir) / rundir.RESULTS).read_text())
    old = Path(out_dir) / REPORT
    if "command" not in results and old.is_file():
        results["command"] = header_command(old.read_text()) or ""
    return report(results, True).render()


def equivalent_command(cfg: Any, command: str, base: Any, skip: tuple[str, ...] = ()) -> str:
    """``fullband <command>`` with the preset and every flag whose value differs from ``base`` (the preset's
    config): the command of this run. Keys in ``skip`` are left out."""
    defaults = leaves(config_to_dict(base))
    args = ["fullband", command] + (["--preset", cfg.preset] if cfg.preset != "default" else [])
    for key, value in leaves(config_to_dict(cfg)).items():
        if key != "preset" and key not in skip and value != defaults.get(key):
            args += [f"--{key}", _flag_value(value)]
    return shlex.join(args)


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def _flag_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(_flag_value, value))
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def resolve_study_device(cfg: Any) -> None:
    """``cfg.device`` as the device it names here ('auto' -> cuda or cpu), as the CLI sets it, so a study called
    from Python trains and then loads its models for evaluation on one real device."""
    from fullband.devices import resolve_device

    cfg.device = str(resolve_device(cfg.device))


def set_threads(threads: str | int) -> int:
    """The study's ``threads`` option applied (:func:`fullband.devices.apply_threads`); returns the count set."""
    from fullband.devices import apply_threads

    return apply_threads(threads)
