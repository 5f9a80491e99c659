"""Reasoning traces: does the full-bandwidth model reach the same accuracy with shorter traces?

``fullband eval-reasoning`` runs the whole study:

1. held-out test problems of every length (:mod:`fullband.tasks.reasoning`), then training data
   whose solutions mix every granularity (``strides``), test problems excluded;
2. the baseline (``feedback=False``) and the full-bandwidth model trained on the same batches;
3. greedy decoding of every test problem at every stride: the baseline in standard mode (its modes are all the
   same model), the full-bandwidth model in each of ``modes``;
4. accuracy (final answer checked by code), exact-trace rate and trace length (generated tokens, end-of-text
   not counted) per model, mode, stride and length; "equal accuracy": per length, the shortest trace with which
   each model/mode reaches the baseline's best accuracy (less ``TOLERANCE``).

    out_dir/
      data/train.jsonl, data/test.jsonl      the problems (prompt/completion JSONL; test_unseen.jsonl: the
                                             test_lengths outside the trained range)
      baseline/, fullband/                   the training runs (model/ inside each)
      results.json                           config, training summaries, every cell, equal-accuracy rows
      report.md, accuracy_vs_trace_length.png

One job per module: the data (:mod:`.data`), decoding and scoring (:mod:`.evaluation`), the report
(:mod:`.report`); here the study that runs them (one seed per job, seeds side by side).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from fullband.experiments.core.config import flat_view
from fullband.experiments.core.pair import PairStudy, StudyModel, train_both
from fullband.experiments.core.parallel import map_jobs
from fullband.experiments.core.report import Report
from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.experiments.reasoning.data import build_data, context_length, pass_mix_of
from fullband.experiments.reasoning.evaluation import equal_accuracy, evaluate, over_seeds, pooled
from fullband.experiments.reasoning.records import Cell, ReasoningResults
from fullband.experiments.reasoning.report import PLOT, draw, report, summary
from fullband.tasks.reasoning import Problem


class ReasoningStudy(PairStudy):
    """``fullband eval-reasoning`` (see the module doc)."""

    command = "eval-reasoning"
    title = "reasoning traces"
    command_skip = ("reuse_models", "resume")
    timed = True  # the report states the command's wall time (its cost, with the seeds run side by side or not)

    def plot(self, results: ReasoningResults) -> None:
        draw(results, self.out_dir / PLOT)

    def report(self, results: ReasoningResults, plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: ReasoningResults) -> str:
        return f"{summary(results)}\n\n{super().summary(results)}"

    def build_data(self, data_dir: Path) -> tuple[Path, Path]:
        self.test, train_path, test_path = build_data(self.cfg, data_dir)
        return train_path, test_path

    def context_length(self) -> int:
        return context_length(self.cfg)

    def model_spec(self, seed: int) -> StudyModel:
        spec = super().model_spec(seed)
        if self.cfg.passes:  # every multi-pass batch runs `passes` passes (0: the pass mix)
            spec = dataclasses.replace(spec, schedule=dataclasses.replace(spec.schedule,
                                                                          pass_mix=pass_mix_of(self.cfg.passes)))
        return spec

    def collect(self) -> ReasoningResults:
        """Both models per seed (one seed: in out_dir itself; more: out_dir/seed<k>/), every cell per seed, then
        the cells' means and sds over the seeds."""
        cfg = self.cfg
        side_by_side = min(cfg.workers, cfg.seeds) > 1  # else map_jobs runs them here, where bars can show
        jobs = self.seed_jobs(side_by_side)
        if side_by_side and cfg.progress:
            print(f"training and evaluating {cfg.seeds} seeds, {min(cfg.workers, cfg.seeds)} at a time", flush=True)
        return self.assemble(list(map_jobs(train_and_evaluate, jobs, cfg.workers)))

    def seed_jobs(self, side_by_side: bool) -> list[tuple[Any, ...]]:
        """The data files, then one :func:`train_and_evaluate` job per seed (``side_by_side``: the jobs run in
        worker processes, so they show no progress bars)."""
        cfg = self.cfg
        train_path, test_path = self.build_data(self.out_dir / "data")
        return [(cfg, self.model_spec(seed), train_path, test_path,
                 self.out_dir if cfg.seeds == 1 else self.out_dir / f"seed{seed}", self.test,
                 cfg.progress and not side_by_side, cfg.progress and side_by_side)
                for seed in range(cfg.seed, cfg.seed + cfg.seeds)]

    def assemble(self, outputs: list[tuple[dict[str, dict[str, Any]], list[Cell]]]) -> ReasoningResults:
        """The results of :meth:`seed_jobs`' outputs, in seed order: training summaries, every seed's cells, the
        cells over the seeds and the equal-accuracy rows."""
        cfg = self.cfg
        training: dict[str, dict[str, Any]] = {}
        seed_cells: list[Cell] = []
        for seed, (runs, cells) in zip(range(cfg.seed, cfg.seed + cfg.seeds), outputs, strict=True):
            training.update({kind if cfg.seeds == 1 else f"{kind} seed{seed}": t for kind, t in runs.items()})
            seed_cells += [c | {"seed": seed} for c in cells]
        variants = list(dict.fromkeys(c["variant"] for c in seed_cells))
        all_cells = over_seeds(seed_cells + pooled(seed_cells))
        return {"study": self.title, "config": flat_view(cfg), "training": training, "variants": variants,
                "cells": all_cells, "seed_cells": seed_cells, "equal_accuracy": equal_accuracy(all_cells, variants)}


def train_and_evaluate(cfg: ReasoningConfig, spec: StudyModel, train_path: Path, test_path: Path, run_dir: Path,
                       test: list[Problem], progress: bool, announce: bool = False,
                       ) -> tuple[dict[str, dict[str, Any]], list[Cell]]:
    """One seed: both models trained into ``run_dir`` (or reused), then every cell evaluated -> (training
    summaries, cells). Module-level, so that seeds can run in worker processes (``cfg.workers``); ``announce``:
    one line when the seed starts and one when it is done (a worker shows no progress bars)."""
    start, label = time.perf_counter(), f"{cfg.family} seed {spec.train.seed}"
    if announce:
        print(f"{label}: training and evaluating in {run_dir}", flush=True)
    runs = train_both(spec, train_path, test_path, run_dir, progress, reuse=cfg.reuse_models, resume=cfg.resume)
    # Each model decoded as soon as it is trained: its cells (cells-<kind>.json) are all a resumed study needs of it.
    cells = evaluate(cfg, {kind: t["model_dir"] for kind, t in runs.items()}, test, (), run_dir, progress)
    # the looped and equal-FLOPs models, and every model's FLOPs (fullband.experiments.reasoning.controls.train)
    if cfg.controls:
        from fullband.experiments.reasoning.controls.train import annotate_flops, train_controls

        runs, control_cells = train_controls(cfg, spec, train_path, test_path, run_dir, test, runs, progress)
        cells += control_cells
        annotate_flops(cfg, runs, cells, test)
    if announce:
        print(f"{label}: done in {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    return runs, cells


def run_reasoning(cfg: ReasoningConfig) -> dict[str, Any]:
    """The study of one family (see the module docstring); returns what results.json holds. Several families with
    their controls: :func:`fullband.experiments.reasoning.controls.study.run_families`."""
    return ReasoningStudy(cfg, cfg.progress).run()
