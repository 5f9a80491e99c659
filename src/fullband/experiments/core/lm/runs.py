"""Language-model runs of a study: every run is ``fullband train`` of one model (a baseline at a token budget, or the
full-bandwidth model), scored on the test split in every decoding mode, with the stability diagnostic for feedback
models, several at a time (:func:`run_jobs`), resumable; and the token multipliers read off the baseline curve. The
machinery ``fullband compare`` and ``fullband recipe`` share (each plans its own runs)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fullband import rundir
from fullband.configio import build_config, save_resolved_config
from fullband.data import eval_windows, load_tokenizer
from fullband.data.prepared import load_flat_split, scored_split
from fullband.devices import cpu_name, usable_cores
from fullband.experiments.core.lm.config import LMRunsConfig
from fullband.experiments.core.lm.multiplier import tokens_to_match
from fullband.experiments.core.lm.perplexity import ExactSpec, evaluate_modes, exact_agreement
from fullband.experiments.core.lm.records import RunRecord
from fullband.experiments.core.lm.stability import stability_curve
from fullband.experiments.core.parallel import map_jobs
from fullband.families import load_any
from fullband.files import write_json
from fullband.model.recurrence import auto_exact_method
from fullband.training.checkpoint_layout import latest_good_checkpoint, load_training_state
from fullband.training.config import TrainRunConfig
from fullband.training.run import resolve_device, run_train
from fullband.training.step_setup import should_compile

FEEDBACK = "feedback"  # the full-bandwidth model with the configured (paper) schedule
TWO_PASS = "feedback-2pass"  # the stability ablation: only 1- and 2-pass batches


@dataclass(frozen=True)
class RunSpec:
    kind: str  # "baseline", FEEDBACK or TWO_PASS
    budget: float  # multiple of train.token_budget
    seed: int
    label: str = ""  # a study's name for the run (its directory and report row); "" = from kind and budget

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return f"baseline-{self.budget:g}x" if self.kind == "baseline" else self.kind


def preset_config(preset: str = "default", overrides: dict[str, Any] | None = None) -> LMRunsConfig:
    """A LMRunsConfig from a preset plus ``{"section.key": value}`` overrides, as the command line builds it."""
    return build_config(LMRunsConfig, None, {"preset": preset, **(overrides or {})})


def plan_runs(cfg: LMRunsConfig) -> list[RunSpec]:
    kinds = [FEEDBACK, TWO_PASS] if cfg.stability_ablation else [FEEDBACK]
    runs = []
    for seed in range(cfg.train.seed, cfg.train.seed + cfg.seeds):
        runs += [RunSpec("baseline", b, seed) for b in cfg.budgets]
        runs += [RunSpec(kind, 1.0, seed) for kind in kinds]
    return runs


def train_config(cfg: LMRunsConfig, spec: RunSpec, out_dir: Path) -> TrainRunConfig:
    """The ``fullband train`` configuration of one run: only feedback, budget, seed and schedule differ."""
    schedule = cfg.schedule
    if spec.kind == TWO_PASS:  # the same phase and ramp, but every multi-pass batch runs 2 passes
        schedule = dataclasses.replace(schedule, pass_mix=(1.0,), two_pass_until=0.0)
    train = dataclasses.replace(cfg.train, token_budget=round(spec.budget * cfg.train.token_budget),
                                seed=spec.seed, eval_every=0, compile=study_compile(cfg))
    # Validation during training: the gaps against tokens. The 1x baseline validates at the feedback runs' steps
    # (the same step count), so the feedback-vs-baseline gap compares models at the same point of one schedule.
    if cfg.train_eval_points and (spec.kind != "baseline" or spec.budget == 1.0):
        train.eval_every = max(1, math.ceil(train.total_steps() / cfg.train_eval_points))
    return TrainRunConfig(
        model=dataclasses.replace(cfg.model, feedback=spec.kind != "baseline"),
        data=cfg.data,
        train=train,
        optim=cfg.optim,
        schedule=schedule,
        out_dir=str(out_dir / f"seed{spec.seed}" / spec.name),
        device=cfg.device,
        eval_passes=(1,) if spec.kind == "baseline" else (1, 2, 3),
    )


def shortest_run_steps(cfg: LMRunsConfig) -> int:
    """Training steps of the study's shortest run (its smallest budget)."""
    budget = min(spec.budget for spec in plan_runs(cfg))
    return dataclasses.replace(cfg.train, token_budget=round(budget * cfg.train.token_budget)).total_steps()


def study_compile(cfg: LMRunsConfig) -> str:
    """``train.compile`` of every run: 'auto' decided once for the study, by its shortest run, so one baseline
    curve never mixes eager and compiled blocks (their numerics differ in rounding)."""
    if cfg.train.compile != "auto":
        return cfg.train.compile
    return "true" if should_compile("auto", resolve_device(cfg.device), shortest_run_steps(cfg)) else "false"


def training_blocks(cfg: LMRunsConfig) -> str:
    """How the study's runs train their blocks, for its report's machine section (the choice depends on the machine)."""
    how = "compiled (torch.compile)" if study_compile(cfg) == "true" else "eager"
    return f"{how}, train.compile {cfg.train.compile}"


Job = tuple[LMRunsConfig, RunSpec, Path]  # the compare settings of the run, the run, the study's out_dir


def run_jobs(jobs: list[Job], workers: int, progress: bool,
             resume: bool = False) -> list[tuple[RunRecord, list[dict[str, Any]]]]:
    """Train and evaluate every job -> (record, stability curves) in the order of ``jobs``.

    ``workers > 1`` runs that many jobs at a time in fresh processes, each with the machine's threads shared out
    (runs are deterministic functions of their configs, so the numbers do not depend on ``workers``).
    ``resume`` takes every run an interrupted study finished from its directory (see :func:`finished_job`) and
    continues the others from their latest checkpoints (see :func:`train_and_evaluate`).
    """
    if resume:
        done = {i: finished_job(job) for i, job in enumerate(jobs)}
        todo = [job for i, job in enumerate(jobs) if done[i] is None]
        _say(progress, f"resuming: {len(jobs) - len(todo)} of {len(jobs)} runs finished earlier")
        fresh = iter(_run_fresh(todo, workers, progress, resume=True))
        return [done[i] if done[i] is not None else next(fresh) for i in range(len(jobs))]
    return _run_fresh(jobs, workers, progress)


def _run_fresh(jobs: list[Job], workers: int, progress: bool,
               resume: bool = False) -> list[tuple[RunRecord, list[dict[str, Any]]]]:
    # Several at a time, the costliest first: started in plan order, the study's last feedback run trained alone
    # while the other worker idled (longest-first scheduling shortens the whole by about as much). The numbers do
    # not depend on the order; the results come back in the order of ``jobs``.
    order = sorted(range(len(jobs)), key=lambda i: -job_cost(jobs[i])) if workers > 1 else range(len(jobs))
    results: dict[int, tuple[RunRecord, list[dict[str, Any]]]] = {}
    arguments = [(jobs[i], i + 1, len(jobs), progress and workers <= 1, resume) for i in order]
    for i, (record, stability) in zip(order, map_jobs(train_and_evaluate, arguments, workers), strict=True):
        results[i] = (record, stability)
        if workers > 1:
            _say(progress, f"finished {record['name']} (seed {record['seed']}): {record['train_seconds']:.0f} s "
                 "training")
    return [results[i] for i in range(len(jobs))]


def job_cost(job: Job) -> float:
    """A run's cost in 1x-baseline units, to order the runs (not a measurement): its budget, twice that for a
    feedback run (mostly 2- and 3-pass steps, its evaluation in every mode and the stability diagnostic)."""
    _, spec, _ = job
    return spec.budget * (1.0 if spec.kind == "baseline" else 2.0)


def train_and_evaluate(job: Job, index: int, count: int, progress: bool,
                       resume: bool = False) -> tuple[RunRecord, list[dict[str, Any]]]:
    """``fullband train`` one run of a study, then score it on the test split (and its stability curve).

    ``resume``: a run directory an interrupted study left continues from its latest complete checkpoint (the
    trainer's resume, bit for bit on the same machine); without one the run starts again from scratch."""
    cfg, spec, out_dir = job
    run_cfg = train_config(cfg, spec, out_dir)
    steps = run_cfg.train.total_steps()
    checkpoint = latest_good_checkpoint(run_cfg.out_dir) if resume else None
    start = f" (resumed at step {load_state_step(checkpoint)})" if checkpoint is not None else ""
    print(f"[{index}/{count}] seed {spec.seed} {spec.name}: {steps} steps, "
          f"{steps * run_cfg.train.tokens_per_step():,} tokens{start} -> {run_cfg.out_dir}", flush=True)
    if checkpoint is not None:
        trained = run_train(dataclasses.replace(run_cfg, resume=True), progress=progress)
        save_resolved_config(run_cfg, Path(run_cfg.out_dir) / rundir.SETTINGS)  # as an uninterrupted run's
    else:
        # A run killed before its first checkpoint starts again: clear what it left (its log and checkpoint
        # temporaries), so the fresh run is the uninterrupted one.
        if resume and Path(run_cfg.out_dir).exists():
            shutil.rmtree(run_cfg.out_dir)
        trained = run_train(run_cfg, progress=progress)
    record: RunRecord = {
        "name": spec.name, "kind": spec.kind, "budget": spec.budget, "seed": spec.seed,
        "out_dir": str(trained.out_dir), "steps": trained.steps, "tokens": trained.tokens,
        "token_equiv_compute": trained.token_equiv_compute, "train_seconds": trained.train_seconds,
        "final_train_loss": trained.final_loss, "validation": trained.validation}
    if checkpoint is not None:
        record["resumed_from_step"] = load_state_step(checkpoint)
    if run_cfg.train.eval_every:
        record["validation_history"] = validation_history(trained.out_dir)
    stability: list[dict[str, Any]] = []
    evaluate_run(cfg, record, trained.model_dir, resolve_device(cfg.device), stability, progress)
    write_json(Path(run_cfg.out_dir) / JOB_RECORD, {"record": record, "stability": stability})
    return record, stability


JOB_RECORD = "compare_record.json"  # a run's record and stability curves, written once it is evaluated


def finished_job(job: Job) -> tuple[RunRecord, list[dict[str, Any]]] | None:
    """(record, stability) of a run that an earlier, interrupted study finished and evaluated; None otherwise."""
    cfg, spec, out_dir = job
    path = Path(train_config(cfg, spec, out_dir).out_dir) / JOB_RECORD
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["record"], saved["stability"]


def load_state_step(checkpoint: Path) -> int:
    """The optimizer steps a checkpoint holds."""
    return load_training_state(checkpoint).step


def validation_history(run_dir: Path) -> list[dict[str, Any]]:
    """The validation records a run logged during training (metrics.jsonl), oldest first."""
    lines = (run_dir / rundir.METRICS).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "eval"]


def evaluate_run(cfg: LMRunsConfig, record: RunRecord, model_dir: Path, device: torch.device,
                 stability: list[dict[str, Any]], progress: bool) -> None:
    """Test-split scores of one trained model in every mode (into ``record``); stability curves of feedback ones."""
    t0 = time.perf_counter()
    model = load_any(model_dir, device=device).eval()
    tokenizer = load_tokenizer(model_dir)
    split = scored_split(cfg.data.source)  # prepared shards: their validation split (they have no test split)
    test = load_flat_split(cfg.data.source, split, tokenizer, cfg.data.held_out())
    batches = [w.to(device) for w in eval_windows(test.tokens, cfg.train.seq_len, cfg.eval_windows,
                                                  cfg.eval_batch_size)]
    method = cfg.exact_method
    if method == "auto":  # the method forward_exact would pick here, recorded for the report
        method = auto_exact_method(device, cfg.exact_tol or None)
    record["exact_method"] = method
    exact = ExactSpec(method, cfg.exact_tol or None, cfg.exact_chunk_size)
    modes = evaluate_modes(model, batches, test, cfg.fused_passes, exact, progress=progress,
                           desc=f"test {record['name']}")
    record["parameters"] = model.num_parameters()
    record["test"] = {name: dataclasses.asdict(r) for name, r in modes.items()}
    record["test_windows"] = sum(b.shape[0] for b in batches)
    record["scored_split"] = split
    if model.fusion is not None and method != "sequential" and cfg.exact_check_windows:
        check = torch.cat(batches)[: cfg.exact_check_windows]
        record["exact_check"] = exact_agreement(model, check, exact)
    record["eval_seconds"] = time.perf_counter() - t0
    if model.fusion is None:
        return
    t0 = time.perf_counter()
    val = test if split == "validation" else load_flat_split(cfg.data.source, "validation", tokenizer,
                                                              cfg.data.held_out())
    seq_len = cfg.stability_seq_len or cfg.train.seq_len
    windows = [w.to(device) for w in eval_windows(val.tokens, seq_len, cfg.stability_windows, cfg.eval_batch_size)]
    curve = stability_curve(model, windows, val, cfg.stability_passes, progress=progress,
                            desc=f"stability {record['name']}")
    stability.append({"name": record["name"], "seed": record["seed"], "window_len": curve.window_len,
                      "windows": curve.windows, "passes": curve.passes, "loss": curve.loss,
                      "bits_per_byte": curve.bits_per_byte, "delta_max": curve.delta_max,
                      "delta_mean": curve.delta_mean, "state_norm": curve.state_norm})
    record["stability_seconds"] = time.perf_counter() - t0


def multipliers(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per feedback model, mode and seed: baseline tokens to match its test loss, and the two multipliers."""
    out: dict[str, Any] = {}
    for run in runs:
        if run["kind"] == "baseline":
            continue
        baselines = [r for r in runs if r["kind"] == "baseline" and r["seed"] == run["seed"]]
        tokens = [r["tokens"] for r in baselines]
        losses = [r["test"]["standard"]["loss"] for r in baselines]
        for mode, scores in run["test"].items():
            match = tokens_to_match(tokens, losses, scores["loss"], run["tokens"])
            compute = None if match.tokens is None else match.tokens / run["token_equiv_compute"]
            out.setdefault(run["name"], {}).setdefault(mode, []).append(
                {"seed": run["seed"], "loss": scores["loss"], "baseline_tokens": match.tokens,
                 "token_multiplier": match.multiplier, "compute_multiplier": compute, "fit": match.flag})
    return out


def machine_info(device: torch.device, workers: int = 1) -> dict[str, Any]:
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": max(1, torch.get_num_threads() // workers),
            "workers": workers, "device": str(device), "usable_cores": usable_cores()}
    threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ}
    if threads:
        info["thread_env"] = threads
    if hasattr(os, "getloadavg"):  # other work on the machine slows the runs; say how busy it was
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def collect_runs(cfg: Any, jobs: list[Job], header: dict[str, Any], progress: bool) -> dict[str, Any]:
    """What a study of language-model runs holds before its analysis: its config ``cfg`` (the study's own: its
    ``workers`` and ``resume`` run the jobs), ``header`` (machine, commands), every run's record and the stability
    curves, in the order of ``jobs``."""
    from fullband.configio import config_to_dict

    results: dict[str, Any] = {"config": config_to_dict(cfg), **header, "runs": [], "stability": []}
    for record, stability in run_jobs(jobs, cfg.workers, progress, resume=cfg.resume):
        results["runs"].append(record)
        results["stability"] += stability
    return results


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, flush=True)
