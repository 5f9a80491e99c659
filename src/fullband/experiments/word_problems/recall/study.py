"""``fullband eval-recall``: lookup-then-compose word problems (DESIGN.md §7 "Beyond recurrence"), in three phases,
each resumable run by run.

1. Tuning on ``tuning_seed``, the full task: every arm x its variants (positional encoding) x its knob x the learning
   rates, each run scored at 1x and 2x steps on validation problems of the trained lengths (table sizes
   ``validation_tables``) and on test problems at every table size of ``test_tables``.
2. Choice by the rule of the decisive study (:mod:`..decisive.analysis`): every arm's fair setting; every control's
   hindsight setting (its longest n kept on the tuning seed's test problems at K = 32).
3. Fresh seeds: the full task with both settings (the full-bandwidth arms: the fair one only), and the two diagnostic
   variants (compose-only, lookup-only) with every arm's fair setting, each run scored at every table size.

Runs are directories under out_dir/runs/<group>/<variant>/... whose result.json is written last; ``--resume true``
reads finished runs back.
"""

from __future__ import annotations

import itertools
import statistics
from typing import TYPE_CHECKING, Any

from fullband.configio import config_to_dict
from fullband.experiments.core.report import Report
from fullband.experiments.core.study import Study, set_threads
from fullband.experiments.word_problems.decisive.analysis import fair_choice, hindsight_choice
from fullband.experiments.word_problems.decisive.study import cost_of
from fullband.experiments.word_problems.recall.analysis import TARGET_K, analyse_group, controls_of
from fullband.experiments.word_problems.recall.config import RecallConfig
from fullband.experiments.word_problems.recall.report import plot_accuracy, report, verdict
from fullband.experiments.word_problems.study import machine
from fullband.experiments.word_problems.train import VALIDATION, RunSpec, run_specs

if TYPE_CHECKING:
    from fullband.experiments.word_problems.arms import Arm


def variants_of(cfg: RecallConfig, arm_type: type[Arm]) -> list[str]:
    """An arm's variants here: the 1-pass transformer's positional encodings (``positions``); the other transformer
    arms RoPE (issue 52's arms: the grid of the decisive study would double the costliest arms here), looped with the
    normalised injection only."""
    from fullband.experiments.word_problems.arms import variant_name

    positions = cfg.positions if arm_type.name == "baseline" else ("rope",)
    values = {"position": positions, "injection": cfg.injections}
    return [variant_name(dict(zip(arm_type.variant_axes, combo, strict=True)))
            for combo in itertools.product(*(values[axis] for axis in arm_type.variant_axes))]


def task(group: str, variant: str) -> str:
    """A run's ``group``: the moves' group and the task variant (RecallConfig.problems reads it)."""
    return f"{group}/{variant}"


class RecallStudy(Study):
    command = "eval-recall"
    command_skip = ("resume", "workers", "progress", "threads")

    def collect(self) -> dict[str, Any]:
        from fullband.experiments.word_problems.arms import ARM_TYPES

        cfg = self.cfg
        set_threads(cfg.threads)
        grid = [RunSpec(task(group, "full"), arm, knob, lr, cfg.tuning_seed, (cfg.steps, 2 * cfg.steps), variant)
                for group in cfg.groups for arm in cfg.arms for variant in variants_of(cfg, ARM_TYPES[arm])
                for knob in self.arm(task(group, "full"), arm, variant).knobs() for lr in cfg.learning_rates]
        grid_runs = run_specs(cfg, grid, self.out_dir, "tuning")
        groups: dict[str, dict[str, Any]] = {}
        for group in cfg.groups:
            points = {arm: grid_points([r for r in grid_runs if (r["group"], r["arm"]) == (task(group, "full"), arm)])
                      for arm in cfg.arms}
            target = f"test_K{TARGET_K}" if TARGET_K in cfg.test_tables else f"test_K{max(cfg.test_tables)}"
            groups[group] = {
                "grid": [p for arm in cfg.arms for p in points[arm]],
                "chosen": {arm: fair_choice(points[arm]) for arm in cfg.arms},
                "hindsight": {arm: hindsight_choice([p | {"test": p["tests"][target]} for p in points[arm]],
                                                    cfg.train_length, max(cfg.test_lengths))
                              for arm in controls_of(list(cfg.arms))}}
        specs = self.fresh_specs(groups)
        runs = dict(zip(specs, run_specs(cfg, specs, self.out_dir, "fresh seeds"), strict=True))
        for group, data in groups.items():
            self.assemble(group, data, runs)
        return {"study": "recall", "config": config_to_dict(cfg), "groups": groups, "machine": machine()}

    def arm(self, group: str, name: str, variant: str = "") -> Arm:
        from fullband.experiments.word_problems.arms import make_arm

        return make_arm(name, self.cfg, self.cfg.problems(group), variant)

    def fresh_specs(self, groups: dict[str, dict[str, Any]]) -> list[RunSpec]:
        specs = []
        for group, data in groups.items():
            for variant in self.cfg.variants:
                picks = list(data["chosen"].values())
                if variant == "full":
                    picks += list(data["hindsight"].values())
                specs += [spec_of(task(group, variant), p, s) for p in picks for s in self.cfg.fresh_seeds]
        return list(dict.fromkeys(specs))  # a hindsight setting equal to the fair one is one set of runs

    def assemble(self, group: str, data: dict[str, Any], runs: dict[RunSpec, dict[str, Any]]) -> None:
        cfg = self.cfg

        def cells_of(variant: str, picks: dict[str, dict[str, Any]]) -> dict[str, Any]:
            by_K: dict[str, Any] = {}
            for arm, pick in picks.items():
                for seed in cfg.fresh_seeds:
                    scores = runs[spec_of(task(group, variant), pick, seed)]["checkpoints"][str(pick["steps"])]
                    validation = [s["accuracy"] for name, s in scores.items() if name.startswith(VALIDATION)]
                    for name, score in scores.items():
                        if name.startswith("test_K"):
                            cell = {"test": score["accuracy"],  # and the trained lengths, mean over their tables
                                    "validation": [statistics.fmean(v) for v in zip(*validation, strict=True)]}
                            cell |= {k.removesuffix("_accuracy"): v for k, v in score.items()
                                     if k.endswith("_accuracy") and k != "accuracy"}
                            by_K.setdefault(name.removeprefix("test_K"), {}).setdefault(arm, {})[str(seed)] = cell
            return by_K

        data["cells"] = cells_of("full", data["chosen"])
        data["hindsight_cells"] = cells_of("full", data["hindsight"])
        data["floors"] = floors_of(cfg, task(group, "full"))
        data["variants"] = {variant: {"cells": cells_of(variant, data["chosen"]),
                                      "floors": floors_of(cfg, task(group, variant))}
                            for variant in cfg.variants if variant != "full"}
        data["costs"] = {setting: {arm: cost_of([runs[spec_of(task(group, "full"), p, s)] for s in cfg.fresh_seeds],
                                                p) for arm, p in picks.items()}
                         for setting, picks in (("fair", data["chosen"]), ("hindsight", data["hindsight"]))}
        data["knob_names"] = {arm: self.arm(task(group, "full"), arm).knob_name for arm in cfg.arms}
        data["analysis"] = analyse_group(data, cfg.train_length)

    def plot(self, results: dict[str, Any]) -> None:
        plot_accuracy(results, self.out_dir)

    def report(self, results: dict[str, Any], plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: dict[str, Any]) -> str:
        return "\n".join([*verdict(results), "", super().summary(results)])


def spec_of(group: str, pick: dict[str, Any], seed: int) -> RunSpec:
    return RunSpec(group, pick["arm"], pick["knob"], pick["lr"], seed, (pick["steps"],), pick.get("variant", ""))


def floors_of(cfg: RecallConfig, group: str) -> dict[str, dict[str, list[float]]]:
    """Per test table size K, the accuracy at every length 1..max of answers that need no model, on the test problems
    the cells are scored on (:func:`fullband.tasks.word_problems.floors`: the most common answer, the start cup, a
    tracker of the first train_length steps; lookup-only, whose label is one move from the start cup, has no
    composition to track)."""
    from fullband.experiments.word_problems.train import evaluation_sets
    from fullband.tasks.word_problems import floors

    problems = cfg.problems(group)
    out = {}
    for name, batch in evaluation_sets(cfg, problems).items():
        if name.startswith("test_K"):
            values = floors(problems.moves, batch, cfg.train_length)
            if problems.variant == "lookup":
                values = {k: v for k, v in values.items() if not k.startswith("first ")}
            out[name.removeprefix("test_K")] = values
    return out


def grid_points(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (variant, knob, lr, steps) of an arm's tuning runs: validation accuracy (mean over the validation table
    sizes and the trained lengths) and loss, and test accuracy by length at every table size."""
    points = []
    for run in runs:
        for steps, scores in run["checkpoints"].items():
            validation = [s for name, s in scores.items() if name.startswith(VALIDATION)]
            accuracies = [a for s in validation for a in s["accuracy"]]
            points.append({"arm": run["arm"], "variant": run.get("variant", ""), "knob": run["knob"], "lr": run["lr"],
                           "steps": int(steps), "describe": run["describe"],
                           "validation_accuracy": sum(accuracies) / len(accuracies),
                           "validation_loss": statistics.fmean(s["loss"] for s in validation),
                           "tests": {name: s["accuracy"] for name, s in scores.items() if name.startswith("test_K")}})
    return points
