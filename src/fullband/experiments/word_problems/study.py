"""``fullband eval-controls``: tune every arm on one seed, train the chosen settings on every seed, report.

1. Tuning (the first seed): every arm x its knob values x the learning rates, each run scored at 1x and 2x steps
   on the validation problems (the trained lengths only). Each arm keeps its best grid point
   (:func:`~fullband.experiments.word_problems.analysis.choose`).
2. Seeds: every arm's chosen setting on the other seeds; the ablations with the full-bandwidth model's chosen
   setting on every seed.
3. Second selection (a follow-up; ``extrapolation_length`` 0 skips it): every tuning checkpoint scored on selection
   problems of unseen lengths, each arm's best there trained on seeds 1..seeds, which took no part in the choice.
4. Analysis and report: accuracy at every length 1..max(test_lengths) on the test problems, per seed.

Every run is a directory of its own under out_dir/runs/ whose result.json is written last: ``--resume true``
reads finished runs back and trains the rest (an interrupted run starts again and computes the same numbers).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from typing import TYPE_CHECKING, Any

from fullband.configio import config_to_dict
from fullband.experiments.core.parallel import map_jobs
from fullband.experiments.core.report import Report
from fullband.experiments.core.study import Study, set_threads
from fullband.experiments.word_problems.analysis import (
    MODEL,
    analyse_group,
    choose,
    choose_extrapolating,
    same_setting,
)
from fullband.experiments.word_problems.config import ControlsConfig
from fullband.experiments.word_problems.cpu_spread import SPREAD_FILE
from fullband.experiments.word_problems.report import (
    has_second_selection,
    plot_accuracy,
    plot_curves,
    report,
    verdict,
)
from fullband.experiments.word_problems.train import RunSpec, extrapolation_scores, run_specs, test_set

if TYPE_CHECKING:
    from fullband.experiments.word_problems.arms import Arm


class ControlsStudy(Study):
    command = "eval-controls"
    command_skip = ("resume", "workers", "progress", "threads")

    def collect(self) -> dict[str, Any]:
        cfg = self.cfg
        set_threads(cfg.threads)
        tuning_seed, single, double = 0, cfg.steps, 2 * cfg.steps
        grid_specs = [RunSpec(group, arm, knob, lr, tuning_seed, (single, double))
                      for group in cfg.groups for arm in cfg.arms for knob in self.arm(group, arm).knobs()
                      for lr in cfg.learning_rates]
        grid_runs = self.run_all(grid_specs, "tuning")
        chosen = {group: {arm: choose(grid_points([r for r in grid_runs if r["group"] == group and r["arm"] == arm]))
                          for arm in cfg.arms} for group in cfg.groups}
        seed_specs = []
        for group in cfg.groups:
            for arm in (*cfg.arms, *cfg.ablations):
                pick = chosen[group][MODEL if arm in cfg.ablations else arm]
                seeds = range(cfg.seeds) if arm in cfg.ablations else range(1, cfg.seeds)
                seed_specs += [RunSpec(group, arm, pick["knob"], pick["lr"], seed, (pick["steps"],)) for seed in seeds]
        seed_runs = self.run_all(seed_specs, "seeds")
        groups = {}
        for group in cfg.groups:
            runs = [r for r in grid_runs if r["group"] == group]
            picked = [r for r in runs if r["seed"] == tuning_seed and
                      (r["knob"], r["lr"]) == (chosen[group][r["arm"]]["knob"], chosen[group][r["arm"]]["lr"])]
            groups[group] = assemble(cfg, group, runs, picked + [r for r in seed_runs if r["group"] == group],
                                     chosen[group])
        if cfg.extrapolation_length:
            self.second_selection(grid_specs, grid_runs, groups)
        results = {"study": "controls", "config": config_to_dict(cfg), "groups": groups, "machine": machine()}
        if (spread := self.out_dir / SPREAD_FILE).is_file():  # written by .cpu_spread after a finished study
            results["cpu_spread"] = json.loads(spread.read_text())
        return results

    def second_selection(self, grid_specs: list[RunSpec], grid_runs: list[dict[str, Any]],
                         groups: dict[str, dict[str, Any]]) -> None:
        """Score every tuning checkpoint on the selection problems of the unseen lengths, keep each arm's best there
        and train it on seeds 1..seeds; adds each group's "extrapolation" part and the grid's "extrapolation" scores."""
        cfg, root = self.cfg, str(self.out_dir)
        if cfg.progress:
            print(f"second selection: scoring {len(grid_specs)} tuning runs at lengths up to "
                  f"{cfg.extrapolation_length}", flush=True)
        scores = list(map_jobs(extrapolation_scores, [(cfg, s, root) for s in grid_specs], cfg.workers))
        unseen = slice(cfg.train_length, cfg.extrapolation_length)
        chosen: dict[str, dict[str, Any]] = {group: {} for group in cfg.groups}
        for group in cfg.groups:
            for arm in cfg.arms:
                points = [point | {"extrapolation_accuracy": statistics.fmean(accuracy[str(point["steps"])][unseen])}
                          for run, accuracy in zip(grid_runs, scores, strict=True)
                          if (run["group"], run["arm"]) == (group, arm) for point in grid_points([run])]
                chosen[group][arm] = choose_extrapolating(points)
                for entry in groups[group]["grid"]:  # the report's grid shows what this selection saw
                    if entry["arm"] == arm:
                        entry["extrapolation"] = next(p["extrapolation_accuracy"] for p in points
                                                      if same_setting(p, entry))
        specs = [RunSpec(group, arm, pick["knob"], pick["lr"], seed, (pick["steps"],))
                 for group in cfg.groups for arm, pick in chosen[group].items() for seed in range(1, cfg.seeds + 1)]
        runs = self.run_all(specs, "second selection seeds")
        for group in cfg.groups:
            groups[group]["extrapolation"] = {"length": cfg.extrapolation_length, "chosen": chosen[group],
                                              **chosen_runs(cfg, [r for r in runs if r["group"] == group],
                                                            chosen[group])}

    def arm(self, group: str, name: str) -> Arm:
        from fullband.experiments.word_problems.arms import make_arm

        return make_arm(name, self.cfg, self.cfg.problems(group))

    def run_all(self, specs: list[RunSpec], phase: str) -> list[dict[str, Any]]:
        """Every run of ``specs`` (finished ones read back), ``workers`` at a time, the costliest first."""
        return run_specs(self.cfg, specs, self.out_dir, phase)

    def analyse(self, results: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        for group in results["groups"].values():
            for part in (group, group.get("extrapolation")):
                if part is not None:
                    part["analysis"] = analyse_group(part, cfg.arms, cfg.test_lengths, cfg.train_length)
        return {}

    def plot(self, results: dict[str, Any]) -> None:
        plot_accuracy(results, self.out_dir)
        if has_second_selection(results):
            plot_accuracy(results, self.out_dir, second=True)
        plot_curves(results, self.out_dir)

    def report(self, results: dict[str, Any], plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: dict[str, Any]) -> str:
        return "\n".join([*verdict(results), "", super().summary(results)])


def grid_points(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (knob, lr, steps) of an arm's tuning runs with its validation scores (the selection's inputs)."""
    points = []
    for run in runs:
        for steps, scores in run["checkpoints"].items():
            accuracy = scores["validation"]["accuracy"]
            points.append({"knob": run["knob"], "lr": run["lr"], "steps": int(steps),
                           "validation_accuracy": sum(accuracy) / len(accuracy),
                           "validation_loss": scores["validation"]["loss"]})
    return points


def assemble(cfg: ControlsConfig, group: str, grid_runs: list[dict[str, Any]], picked: list[dict[str, Any]],
             chosen: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One group's part of results.json: the grid, the choices, every arm's cells and curves per seed, the
    floors, the costs."""
    from fullband.experiments.word_problems.arms import make_arm
    from fullband.tasks.word_problems import WordProblems, floors

    grid = []
    for run in grid_runs:
        for point in grid_points([run]):
            test = run["checkpoints"][str(point["steps"])]["test"]["accuracy"]
            grid.append({"arm": run["arm"], **point, "test": {str(n): test[n - 1] for n in cfg.test_lengths}})
    problems = WordProblems(group)
    test = test_set(cfg, problems)
    return {"grid": grid, "chosen": chosen, **chosen_runs(cfg, picked, chosen),
            "floors": floors(problems, test, cfg.train_length),
            "knob_names": {a: make_arm(a, cfg, problems).knob_name for a in (*cfg.arms, *cfg.ablations)}}


def chosen_runs(cfg: ControlsConfig, picked: list[dict[str, Any]], chosen: dict[str, dict[str, Any]]
                ) -> dict[str, Any]:
    """The runs of the chosen settings (an ablation at the model's): every arm's cells and curves per seed, and its
    costs."""
    cells: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, Any]] = {}
    costs: dict[str, Any] = {}
    for run in picked:
        steps = chosen[MODEL if run["arm"] in cfg.ablations else run["arm"]]["steps"]
        scores = run["checkpoints"][str(steps)]
        cell = {"validation": scores["validation"]["accuracy"], "validation_loss": scores["validation"]["loss"],
                "test": scores["test"]["accuracy"]}
        cell |= {k.removesuffix("_accuracy"): v for k, v in scores["test"].items()
                 if k.endswith("_accuracy") and k != "accuracy"}
        cells.setdefault(run["arm"], {})[str(run["seed"])] = cell
        curves.setdefault(run["arm"], {})[str(run["seed"])] = run["curve"] | {"seconds": run["seconds"]}
        costs[run["arm"]] = {"describe": run["describe"], "parameters": run["parameters"], "steps": steps,
                             "knob": run["knob"], "lr": run["lr"],
                             "training_flops": run["train_flops_per_step"] * steps,
                             "inference_flops": run["inference_flops"]}
    return {"cells": {a: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for a, c in cells.items()},
            "curves": curves, "costs": costs}


def machine() -> dict[str, Any]:
    """Where the study ran: the CPU kind decides the last bits of every float (results.json records it)."""
    import torch

    from fullband.devices import cpu_flags, cpu_name

    return {"processor": cpu_name(), "avx512_bf16": "avx512_bf16" in cpu_flags(), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "default")}


def run_controls(cfg: ControlsConfig) -> dict[str, Any]:
    """The whole study (see the module docstring); returns what results.json holds."""
    return ControlsStudy(cfg, cfg.progress).run()
