"""``fullband recipe``: which ingredient of the training recipe makes latent feedback pay, and by how much.

Every run is a language-model run of the shared machinery (:mod:`fullband.experiments.core.lm.runs`, as ``fullband
compare``'s) of a preset of :data:`~fullband.experiments.core.lm.config.LM_PRESETS`, so the numbers are the ones
``fullband compare`` would report:

- the baseline curve: baselines at the preset's budgets (the token multipliers are read off it);
- one full-bandwidth model per *variant*: the best recipe (the compare default) with one ingredient toggled
  (``RECIPE_VARIANTS``); a variant that changes the baseline too (the input norm, the optimiser) gets its own
  1x baseline, so its gap is measured against a baseline trained the same way;
- the best recipe at other widths, each with its own 1x baseline: the gap against scale;
- validation during every feedback run: the gap between fused and plain passes against feedback steps.

The *gap* of a mode is its test loss minus the reference baseline's (negative = feedback helps).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from fullband import rundir
from fullband.config import ConfigError
from fullband.configio import build_config, config_to_dict
from fullband.experiments.core.lm.config import LMRunsConfig
from fullband.experiments.core.lm.runs import (
    FEEDBACK,
    Job,
    RunSpec,
    collect_runs,
    machine_info,
    multipliers,
    plan_runs,
    preset_config,
    training_blocks,
)
from fullband.experiments.core.plots import have_matplotlib
from fullband.experiments.core.report import Report
from fullband.experiments.core.stats import mean_sd
from fullband.experiments.core.study import Study
from fullband.experiments.recipe.config import RECIPE_VARIANTS, RecipeConfig
from fullband.training.run import resolve_device

BEST = "best"


def variant_config(cfg: RecipeConfig, out_dir: Path, overrides: dict[str, Any]) -> LMRunsConfig:
    """The compare preset with ``overrides``, evaluated and validated as ``fullband compare`` would."""
    data = {f"data.{key}": value for key, value in dataclasses.asdict(cfg.data).items()}  # every run reads it
    study = {**data, "seeds": cfg.seeds, "workers": 1, "device": cfg.device, "threads": cfg.threads,
             "train_eval_points": cfg.train_eval_points,
             "out_dir": str(out_dir)}
    if cfg.eval_windows is not None:
        study["eval_windows"] = cfg.eval_windows
    return preset_config(cfg.compare_preset, {**overrides, **study})


def plan(cfg: RecipeConfig, out_dir: Path) -> list[Job]:
    """Every run of the study (see the module doc), as compare jobs."""
    base = variant_config(cfg, out_dir, {})
    jobs: list[Job] = [(base, spec, out_dir) for spec in plan_runs(base) if spec.kind == "baseline"]
    seeds = range(base.train.seed, base.train.seed + cfg.seeds)
    for name in cfg.variants:
        overrides, paired, _ = RECIPE_VARIANTS[name]
        variant = variant_config(cfg, out_dir, overrides)
        jobs += [(variant, RunSpec(FEEDBACK, 1.0, s, label=name), out_dir) for s in seeds]
        if paired:
            jobs += [(variant, RunSpec("baseline", 1.0, s, label=f"baseline-{name}"), out_dir) for s in seeds]
    for width in cfg.widths:
        sized = variant_config(cfg, out_dir, {"model.d_model": width})
        for s in seeds:
            jobs += [(sized, RunSpec("baseline", 1.0, s, label=f"baseline-d{width}"), out_dir),
                     (sized, RunSpec(FEEDBACK, 1.0, s, label=f"{BEST}-d{width}"), out_dir)]
    return jobs


class RecipeStudy(Study):
    """``fullband recipe``: the language-model runs of :func:`plan`, analysed per variant, width and step
    (:func:`analyse`), written down by :mod:`.report`. ``report_only`` re-analyses a finished study."""

    command = "recipe"
    command_skip = ("resume", "report_only")

    def run(self) -> dict[str, Any]:
        if self.cfg.report_only:
            return rewrite_report(self.out_dir)
        return super().run()

    def prepare(self) -> None:
        if self.cfg.resume and not (self.out_dir / rundir.SETTINGS).is_file():
            raise ConfigError(f"out_dir={self.cfg.out_dir!r} holds no recipe study to resume (no config.toml): run "
                              "without --resume true to start one there")
        super().prepare()  # the plots are optional here: no warning

    def plan(self) -> list[Job]:
        jobs = plan(self.cfg, self.out_dir)
        if self.progress:
            print(f"fullband recipe: {len(jobs)} training runs, {self.cfg.workers} at a time -> {self.out_dir}",
                  flush=True)
        return jobs

    def header(self, jobs: list[Job]) -> dict[str, Any]:
        return {"compare_config": config_to_dict(jobs[0][0]),
                "machine": {**machine_info(resolve_device(self.cfg.device), self.cfg.workers),
                            "training_blocks": training_blocks(jobs[0][0])},
                "command": self.command_line()}

    def collect(self) -> dict[str, Any]:
        jobs = self.plan()
        return collect_runs(self.cfg, jobs, self.header(jobs), self.progress)

    def analyse(self, results: dict[str, Any]) -> dict[str, Any]:
        return analyse(self.cfg, results["runs"], results["stability"])

    def plot(self, results: dict[str, Any]) -> None:
        from fullband.experiments.recipe.report import plot_recipe

        plot_recipe(results, self.out_dir)

    def report(self, results: dict[str, Any], plots: bool) -> Report:
        from fullband.experiments.recipe.report import report

        return report(results, plots)

    def summary(self, results: dict[str, Any]) -> str:
        from fullband.experiments.recipe.report import summary

        return summary(results)

    def write(self, results: dict[str, Any], plots: bool | None = None) -> None:
        from fullband.experiments.recipe.report import verdict

        results["verdict_lines"] = verdict(results)
        super().write(results, have_matplotlib() if plots is None else plots)


def run_recipe(cfg: RecipeConfig, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate every run, analyse, write results.json, plots and report.md; returns the results."""
    return RecipeStudy(cfg, progress).run()


def rewrite_report(out_dir: Path) -> dict[str, Any]:
    """Analyse the runs recorded in ``out_dir/results.json`` again and rewrite results.json, plots and report."""
    path = out_dir / rundir.RESULTS
    if not path.is_file():
        raise ConfigError(f"out_dir={str(out_dir)!r} holds no results.json: run the study first (without report_only)")
    results = json.loads(path.read_text())
    cfg = build_config(RecipeConfig, results["config"], {})  # as a config file: sections (data) and lists typed
    study = RecipeStudy(cfg)
    study.out_dir = out_dir
    results.update(study.analyse(results))
    results["command"] = study.command_line()
    study.write(results)
    return results


# ---------------------------------------------------------------------------------------------- analysis

def analyse(cfg: RecipeConfig, runs: list[dict[str, Any]], stability: list[dict[str, Any]]) -> dict[str, Any]:
    """Gaps, multipliers and curves per variant, per width and per feedback step (what the report shows)."""
    curve = [r for r in runs if r["kind"] == "baseline" and r["name"].endswith("x")]
    named = _by_name(runs)
    variants = {}
    for name in cfg.variants:
        paired = RECIPE_VARIANTS[name][1]
        reference = named[f"baseline-{name}"] if paired else [r for r in curve if r["budget"] == 1.0]
        fb = named[name]
        row = {"description": RECIPE_VARIANTS[name][2], "reference": f"baseline-{name}" if paired else "baseline-1x",
               "modes": _mode_gaps(fb, reference),
               "multipliers": multipliers(curve + fb).get(name, {}),
               "loss_after_passes": _last_pass_loss(stability, name),
               "train_seconds": mean_sd(r["train_seconds"] for r in fb)[0]}
        variants[name] = row
    widths = {}
    for width in sorted({preset_config(cfg.compare_preset).model.d_model, *cfg.widths}):
        own = width == preset_config(cfg.compare_preset).model.d_model
        if own and BEST not in named:
            continue
        fb = named[BEST] if own else named[f"{BEST}-d{width}"]
        base = [r for r in curve if r["budget"] == 1.0] if own else named[f"baseline-d{width}"]
        widths[str(width)] = {
            "parameters": fb[0]["parameters"], "baseline_parameters": base[0]["parameters"],
            "modes": _mode_gaps(fb, base)}
    return {"variants": variants, "widths": widths, "steps": _gap_by_step(named.get(BEST, []))}


def _by_name(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(r["name"], []).append(r)
    return out


def _mode_gaps(fb: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: test loss and its gap to the reference baseline of the same seed (mean, sd over seeds)."""
    base_by_seed = {r["seed"]: r["test"]["standard"]["loss"] for r in reference}
    out = {}
    for mode in fb[0]["test"]:
        losses = [r["test"][mode]["loss"] for r in fb]
        gaps = [r["test"][mode]["loss"] - base_by_seed[r["seed"]] for r in fb if r["seed"] in base_by_seed]
        within = [r["test"][mode]["loss"] - r["test"]["standard"]["loss"] for r in fb]
        out[mode] = {"loss": mean_sd(losses), "gap_to_baseline": mean_sd(gaps),
                     "gap_to_own_standard": mean_sd(within)}
    return out


def _last_pass_loss(stability: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    mine = [c for c in stability if c["name"] == name]
    if not mine:
        return None
    return {"passes": len(mine[0]["loss"]), "loss": mean_sd(c["loss"][-1] for c in mine),
            "first_pass_loss": mean_sd(c["loss"][0] for c in mine),
            "best_loss": mean_sd(min(c["loss"]) for c in mine),
            "delta_first": mean_sd(c["delta_mean"][1] for c in mine if len(c["delta_mean"]) > 1),
            "delta_last": mean_sd(c["delta_mean"][-1] for c in mine)}


def _gap_by_step(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validation loss after 1, 2 and 3 passes at each validation step of the best recipe (mean over seeds)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        for rec in r.get("validation_history", []):
            steps.setdefault(rec["step"], []).append(rec)
    out = []
    for step in sorted(steps):
        recs = steps[step]
        row = {"step": step + 1}
        for k in (1, 2, 3):
            row[f"loss_{k}pass"] = mean_sd(rec.get(f"val_loss_{k}pass") for rec in recs)[0]
        out.append(row)
    return out
