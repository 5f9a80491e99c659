"""``fullband eval-decisive``: the decisive-controls study (DESIGN.md §7), in four phases, each resumable run by run.

1. Tuning on ``tuning_seed``: every arm x its variants (positional encoding; looped's injection) x its knob x the
   learning rates, each run scored at 1x and 2x steps on validation problems of the trained lengths and on the test
   problems (lengths up to the longest of ``test_lengths``).
2. Choice by the rule written before the runs (:mod:`.analysis`): every arm's fair setting, every control's
   hindsight setting.
3. Fresh seeds: both settings of every arm (the full-bandwidth model: the fair one only; the RNN: every cell and
   learning rate, the ceiling), each run scored on the test and the long test problems.
4. The second training range: the full-bandwidth model (fair) and the strongest controls (their better setting)
   trained on problems of ``long_train_length`` steps on the fresh seeds, no re-tuning.

Every run is a directory of its own under out_dir/runs/ (phase 4: out_dir/range16/runs/) whose result.json is
written last: ``--resume true`` reads finished runs back and trains the rest.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any

from fullband.configio import config_to_dict
from fullband.experiments.core.report import Report
from fullband.experiments.core.study import Study, set_threads
from fullband.experiments.word_problems.decisive.analysis import (
    MODEL,
    REFERENCE,
    analyse_group,
    analyse_range,
    controls_of,
    fair_choice,
    hindsight_choice,
    strongest_controls,
)
from fullband.experiments.word_problems.decisive.config import DecisiveConfig
from fullband.experiments.word_problems.decisive.report import plot_accuracy, report, verdict
from fullband.experiments.word_problems.study import machine
from fullband.experiments.word_problems.train import RunSpec, run_specs

if TYPE_CHECKING:
    from fullband.experiments.word_problems.arms import Arm

RANGE_DIR = "range16"  # the second training range's runs (whatever its length: the directory keeps one name)


def variants(cfg: DecisiveConfig, arm_type: type[Arm]) -> list[str]:
    """Every variant of an arm in this study: the product of its variant axes' configured values."""
    from fullband.experiments.word_problems.arms import variant_name

    values = {"position": cfg.positions, "injection": cfg.injections}
    axes = arm_type.variant_axes
    return [variant_name(dict(zip(axes, combo, strict=True)))
            for combo in itertools.product(*(values[axis] for axis in axes))]


class DecisiveStudy(Study):
    command = "eval-decisive"
    command_skip = ("resume", "workers", "progress", "threads")

    def collect(self) -> dict[str, Any]:
        from fullband.experiments.word_problems.arms import ARM_TYPES

        cfg = self.cfg
        set_threads(cfg.threads)
        grid_specs = [RunSpec(group, arm, knob, lr, cfg.tuning_seed, (cfg.steps, 2 * cfg.steps), variant)
                      for group in cfg.groups for arm in cfg.arms for variant in variants(cfg, ARM_TYPES[arm])
                      for knob in self.arm(cfg, group, arm, variant).knobs() for lr in cfg.learning_rates]
        grid_runs = run_specs(cfg, grid_specs, self.out_dir, "tuning")
        groups: dict[str, dict[str, Any]] = {}
        for group in cfg.groups:
            points = {arm: grid_points(cfg, [r for r in grid_runs if (r["group"], r["arm"]) == (group, arm)])
                      for arm in cfg.arms}
            groups[group] = {"grid": [p for arm in cfg.arms for p in points[arm]],
                             "chosen": {arm: fair_choice(points[arm]) for arm in cfg.arms},
                             "hindsight": {arm: hindsight_choice(points[arm], cfg.train_length, cfg.hindsight_length)
                                           for arm in controls_of(cfg.arms)}}
        fresh = self.fresh_specs(groups)
        runs = dict(zip(fresh, run_specs(cfg, fresh, self.out_dir, "fresh seeds"), strict=True))
        for group, data in groups.items():
            self.assemble(group, data, runs)
        if cfg.long_train_length:
            for group, data in groups.items():
                data["range"] = self.second_range(group, data)
        return {"study": "decisive", "config": config_to_dict(cfg), "groups": groups, "machine": machine()}

    def arm(self, cfg: DecisiveConfig, group: str, name: str, variant: str = "") -> Arm:
        from fullband.experiments.word_problems.arms import make_arm

        return make_arm(name, cfg, cfg.problems(group), variant)

    def fresh_specs(self, groups: dict[str, dict[str, Any]]) -> list[RunSpec]:
        """Phase 3's runs: each arm's fair setting, each control's hindsight one, the RNN at every cell and rate."""
        cfg = self.cfg
        specs: list[RunSpec] = []
        for group, data in groups.items():
            picks = [p for arm, p in data["chosen"].items() if arm != REFERENCE] + list(data["hindsight"].values())
            for pick in picks:
                specs += [spec_of(group, pick, seed) for seed in cfg.fresh_seeds]
            if REFERENCE in cfg.arms:  # the ceiling: every cell and learning rate, both step counts in one run
                specs += [RunSpec(group, REFERENCE, cell, lr, seed, (cfg.steps, 2 * cfg.steps), long_test=True)
                          for cell in cfg.rnn_cells for lr in cfg.learning_rates for seed in cfg.fresh_seeds]
        return list(dict.fromkeys(specs))  # a hindsight setting equal to the fair one is one set of runs

    def assemble(self, group: str, data: dict[str, Any], runs: dict[RunSpec, dict[str, Any]]) -> None:
        """A group's cells (fair and hindsight settings, the RNN ceiling), curves and costs from phase 3's runs."""
        cfg = self.cfg

        def cells_of(pick: dict[str, Any]) -> dict[str, Any]:
            found = {seed: run_at(runs, spec_of(group, pick, seed), pick["steps"]) for seed in cfg.fresh_seeds}
            return {str(seed): cell_of(result, pick["steps"], cfg) for seed, result in found.items()}

        data["cells"] = {arm: cells_of(pick) for arm, pick in data["chosen"].items()}
        data["hindsight_cells"] = {arm: cells_of(pick) for arm, pick in data["hindsight"].items()}
        data["costs"] = {setting: {arm: cost_of([run_at(runs, spec_of(group, pick, s), pick["steps"])
                                                 for s in cfg.fresh_seeds], pick) for arm, pick in picks.items()}
                         for setting, picks in (("fair", data["chosen"]), ("hindsight", data["hindsight"]))}
        data["curves"] = {arm: {str(s): run_at(runs, spec_of(group, pick, s), pick["steps"])["curve"]
                                for s in cfg.fresh_seeds} for arm, pick in data["chosen"].items()}
        if REFERENCE in cfg.arms:
            data["rnn"] = [{"knob": cell, "lr": lr, "steps": steps, "cells": {
                str(seed): cell_of(runs[RunSpec(group, REFERENCE, cell, lr, seed, (cfg.steps, 2 * cfg.steps),
                                                long_test=True)], steps, cfg) for seed in cfg.fresh_seeds}}
                for cell in cfg.rnn_cells for lr in cfg.learning_rates for steps in (cfg.steps, 2 * cfg.steps)]
        data["floors"] = floors_of(cfg, group)
        data["knob_names"] = {arm: self.arm(cfg, group, arm).knob_name for arm in cfg.arms}
        data["analysis"] = analyse_group(data, cfg.arms, cfg.train_length, cfg.hindsight_length)

    def second_range(self, group: str, data: dict[str, Any]) -> dict[str, Any]:
        """Phase 4: the model and the strongest controls on the longer training range, fresh seeds."""
        cfg = self.cfg
        L = cfg.long_train_length
        range_cfg = dataclasses.replace(cfg, train_length=L, long_train_length=0,
                                        test_lengths=tuple(n for n in cfg.test_lengths if n > L))
        better = {arm: data["hindsight_cells"][arm] if data["analysis"]["better"][arm] == "hindsight"
                  else data["cells"][arm] for arm in data["analysis"]["better"]}
        strongest = strongest_controls(better, cfg.strongest, cfg.train_length, cfg.hindsight_length)
        chosen = {MODEL: data["chosen"][MODEL] | {"setting": "fair"}}
        for arm in strongest:
            setting = data["analysis"]["better"][arm]
            chosen[arm] = (data["hindsight"] if setting == "hindsight" else data["chosen"])[arm] | {"setting": setting}
        specs = [spec_of(group, pick, seed) for pick in chosen.values() for seed in cfg.fresh_seeds]
        root = self.out_dir / RANGE_DIR
        runs = dict(zip(specs, run_specs(range_cfg, specs, root, f"second range ({group}, n <= {L})"), strict=True))
        part = {"train_length": L, "chosen": chosen,
                "cells": {arm: {str(s): cell_of(runs[spec_of(group, pick, s)], pick["steps"], range_cfg)
                                for s in cfg.fresh_seeds} for arm, pick in chosen.items()},
                "costs": {arm: cost_of([runs[spec_of(group, pick, s)] for s in cfg.fresh_seeds], pick)
                          for arm, pick in chosen.items()},
                "floors": floors_of(range_cfg, group)}
        part["analysis"] = analyse_range(part)
        return part

    def analyse(self, results: dict[str, Any]) -> dict[str, Any]:
        return {}  # each group's analysis is made as it is assembled (the second range needs it)

    def plot(self, results: dict[str, Any]) -> None:
        plot_accuracy(results, self.out_dir)

    def report(self, results: dict[str, Any], plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: dict[str, Any]) -> str:
        return "\n".join([*verdict(results), "", super().summary(results)])


def spec_of(group: str, pick: dict[str, Any], seed: int) -> RunSpec:
    """The fresh-seed run of a chosen setting (scored on the long test problems too)."""
    return RunSpec(group, pick["arm"], pick["knob"], pick["lr"], seed, (pick["steps"],), pick.get("variant", ""),
                   long_test=True)


def run_at(runs: dict[RunSpec, dict[str, Any]], spec: RunSpec, steps: int) -> dict[str, Any]:
    """The run of ``spec`` (an RNN's fair setting is one of its every-rate runs, which score both step counts)."""
    if spec in runs:
        return runs[spec]
    twin = next(s for s in runs if (s.group, s.arm, s.knob, s.lr, s.seed) == (spec.group, spec.arm, spec.knob,
                                                                               spec.lr, spec.seed)
                and steps in s.stops)
    return runs[twin]


def grid_points(cfg: DecisiveConfig, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (variant, knob, lr, steps) of an arm's tuning runs with what the rule reads: validation accuracy (mean
    over the trained lengths) and loss, and test accuracy at every length (the hindsight setting's)."""
    points = []
    for run in runs:
        for steps, scores in run["checkpoints"].items():
            accuracy = scores["validation"]["accuracy"]
            points.append({"arm": run["arm"], "variant": run.get("variant", ""), "knob": run["knob"], "lr": run["lr"],
                           "steps": int(steps), "describe": run["describe"],
                           "validation_accuracy": sum(accuracy) / len(accuracy),
                           "validation_loss": scores["validation"]["loss"], "test": scores["test"]["accuracy"]})
    return points


def cell_of(run: dict[str, Any], steps: int, cfg: DecisiveConfig) -> dict[str, Any]:
    """One seed's cell: validation accuracy by trained length and loss, and accuracy at every length 1..max: the
    test problems up to the longest test length, the long test problems beyond (and the same for the model's other
    ways of answering)."""
    scores = run["checkpoints"][str(steps)]
    short, long = scores["test"], scores["long_test"]
    cut = max(cfg.test_lengths)
    cell = {"validation": scores["validation"]["accuracy"], "validation_loss": scores["validation"]["loss"],
            "test": short["accuracy"][:cut] + long["accuracy"][cut:]}
    for key in short:
        if key.endswith("_accuracy") and key != "accuracy":
            cell[key.removesuffix("_accuracy")] = short[key][:cut] + long[key][cut:]
    return cell


def cost_of(runs: list[dict[str, Any]], pick: dict[str, Any]) -> dict[str, Any]:
    """What a chosen setting costs: per run (the fresh seeds'), training FLOPs, inference FLOPs and seconds."""
    first = runs[0]
    train_seconds = [r["seconds"] - r["scoring_seconds"] for r in runs]
    return {"describe": first["describe"], "parameters": first["parameters"], "variant": pick.get("variant", ""),
            "knob": pick["knob"], "lr": pick["lr"], "steps": pick["steps"],
            "training_flops": first["train_flops_per_step"] * pick["steps"],
            "inference_flops": first["inference_flops"],
            "training_seconds": sum(train_seconds) / len(runs),
            "scoring_seconds": sum(r["scoring_seconds"] for r in runs) / len(runs),
            "processors": sorted({f"{r['processor']}{' (avx512_bf16)' if r['avx512_bf16'] else ''}" for r in runs}),
            "threads": sorted({r["threads"] for r in runs})}


def floors_of(cfg: DecisiveConfig, group: str) -> dict[str, list[float]]:
    """The floors (no model) at every length 1..max, from the test problems and the long ones as the cells."""
    from fullband.experiments.word_problems.train import long_test_set, test_set
    from fullband.tasks.word_problems import WordProblems, floors

    problems = WordProblems(group)
    short = floors(problems, test_set(cfg, problems), cfg.train_length)
    long = floors(problems, long_test_set(cfg, problems), cfg.train_length)
    cut = max(cfg.test_lengths)
    return {name: short[name][:cut] + long[name][cut:] for name in short}


def run_decisive(cfg: DecisiveConfig) -> dict[str, Any]:
    """The whole study (see the module docstring); returns what results.json holds."""
    return DecisiveStudy(cfg, cfg.progress).run()

