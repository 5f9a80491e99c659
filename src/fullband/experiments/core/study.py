"""The one shape of every study (compare, recipe, reasoning traces, state tracking): train several models, evaluate
them, then write results.json, the plots and report.md into a run directory. Torch-free at import (the report
code imports it).

:class:`Study` is that shape; a study supplies what differs: ``collect`` (train and evaluate -> the results dict),
``analyse``, ``plot`` and ``render``. :class:`PairStudy` is the synthetic-task study of two models, the baseline
and the full-bandwidth model, trained on the same data (reasoning traces, state tracking).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import shutil
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from fullband.config import ConfigError
from fullband.configio import config_to_dict, save_resolved_config
from fullband.experiments.compare import plots as plotting
from fullband.experiments.core.config import flat_view
from fullband.files import write_json, write_text
from fullband.training.config import (
    DataConfig,
    OptimConfig,
    ScheduleConfig,
    TrainConfig,
    TrainModelConfig,
    TrainRunConfig,
)

MODEL_KINDS = ("baseline", "fullband")
SUMMARY_FILE = "study_training.json"
RESULTS = "results.json"
REPORT = "report.md"


class Study:
    """Run many models, then report. :meth:`run`: check ``out_dir`` (:meth:`prepare`), train and evaluate every
    model (:meth:`collect`), :meth:`analyse`, then write results.json, the plots and report.md (:meth:`write`).

    ``cfg`` is the study's config dataclass (torch-free, in the study's package): it has a
    ``preset`` and an ``out_dir``; ``resume`` where the study can continue an interrupted run.
    """

    command: ClassVar[str]  # the ``fullband`` subcommand
    fresh_out_dir: ClassVar[bool] = True  # refuse an out_dir that is not empty (unless cfg.resume)
    timed: ClassVar[bool] = True  # results["seconds"]: the wall time of this invocation
    command_skip: ClassVar[tuple[str, ...]] = ()  # config keys that never go into the rerun command

    def __init__(self, cfg: Any, progress: bool = True) -> None:
        self.cfg = cfg
        self.progress = progress
        self.out_dir = Path(cfg.out_dir)

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.prepare()
        return self.finish(self.collect(), start)

    def finish(self, results: dict[str, Any], start: float) -> dict[str, Any]:
        """Add the analysis, the wall time since ``start`` (``timed``) and the date to ``results``; write them."""
        results.update(self.analyse(results))
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
        save_resolved_config(self.cfg, self.out_dir / "config.toml")

    def collect(self) -> dict[str, Any]:
        """Train and evaluate every model -> the results dict (what results.json holds)."""
        raise NotImplementedError

    def analyse(self, results: dict[str, Any]) -> dict[str, Any]:
        """What the report reads off the runs, added to ``results``."""
        return {}

    def plot(self, results: dict[str, Any]) -> None:
        """Draw the study's figures into ``out_dir`` (matplotlib is there)."""

    def render(self, results: dict[str, Any], plots: bool) -> str:
        """report.md, from ``results`` alone; ``plots``: whether the figures were drawn."""
        raise NotImplementedError

    def write(self, results: dict[str, Any], plots: bool | None = None) -> None:
        write_study(self.out_dir, results, self.plot, self.render, plots)

    def command_line(self) -> str:
        """The one command that reruns this study from scratch."""
        return equivalent_command(self.cfg, self.command, type(self.cfg)(preset=self.cfg.preset),
                                  skip=self.command_skip)


# Every study's smoke preset trains tiny models for a few steps: its report checks that each part runs, no more.
SMOKE = "smoke"
SMOKE_NOTE = ("**Smoke preset: this report checks the plumbing (every part of the study runs) on tiny models "
              "trained for a few steps. It gives no verdict: its numbers answer no question.**")


def is_smoke(results: dict[str, Any]) -> bool:
    """Whether ``results`` come from a study's smoke preset."""
    return results.get("config", {}).get("preset") == SMOKE


def write_study(out_dir: Path, results: dict[str, Any], plot: Callable[[dict[str, Any]], None],
                render: Callable[[dict[str, Any], bool], str], plots: bool | None = None) -> None:
    """results.json, then the plots (skipped, with a warning, without matplotlib), then report.md (a smoke preset's
    says under its title that it checks the plumbing and gives no verdict)."""
    write_json(out_dir / RESULTS, results)
    if plots is None:
        plots = plotting.have_matplotlib()
        if not plots:
            warnings.warn("matplotlib is not installed, so the report has no plots: pip install 'fullband[plot]'",
                          stacklevel=3)
    if plots:
        plot(results)
    text = render(results, plots)
    if is_smoke(results):
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{SMOKE_NOTE}\n{rest}"
    write_text(out_dir / REPORT, text)


def equivalent_command(cfg: Any, command: str, base: Any, skip: tuple[str, ...] = ()) -> str:
    """``fullband <command>`` with the preset and every flag whose value differs from ``base`` (the preset's
    config): the command of this run. Keys in ``skip`` are left out."""
    defaults = _leaves(config_to_dict(base))
    args = ["fullband", command] + (["--preset", cfg.preset] if cfg.preset != "default" else [])
    for key, value in _leaves(config_to_dict(cfg)).items():
        if key != "preset" and key not in skip and value != defaults.get(key):
            args += [f"--{key}", _flag_value(value)]
    return shlex.join(args)


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def _flag_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(_flag_value, value))
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# ---------------------------------------------------------------------------------------------- two-model studies


@dataclasses.dataclass(frozen=True)
class StudyModel:
    """The training sections of a study's models for one seed: the study config's, with what the study decides
    filled in (context length, seed, warmup); :func:`sft_run_config` makes each model's run of them."""

    model: TrainModelConfig
    train: TrainConfig
    optim: OptimConfig
    schedule: ScheduleConfig
    curriculum: float = 0.0  # data.curriculum: the training file is in curriculum order
    device: str = "cpu"

    @property
    def batch_size(self) -> int:
        return self.train.batch_size


class PairStudy(Study):
    """A synthetic-task study: data files (:meth:`build_data`), the baseline and the full-bandwidth model trained
    on the same batches (:func:`train_both`), then every model/mode evaluated (:meth:`evaluate`).

    ``cfg`` is a :class:`fullband.experiments.core.config.SyntheticStudyConfig`. The run directory may hold the models
    of an earlier run: ``reuse_models`` evaluates them again.
    """

    fresh_out_dir = False
    timed = False
    command_skip = ("reuse_models",)
    title: ClassVar[str]  # results["study"]

    def prepare(self) -> None:
        import torch

        set_threads(self.cfg.threads)
        resolve_study_device(self.cfg)
        torch.manual_seed(self.cfg.seed)

    def collect(self) -> dict[str, Any]:
        cfg = self.cfg
        train_path, test_path = self.build_data(self.out_dir / "data")
        training = train_both(self.model_spec(cfg.seed), train_path, test_path, self.out_dir, cfg.progress,
                              reuse=cfg.reuse_models, resume=getattr(cfg, "resume", False))
        return {"study": self.title, "config": flat_view(cfg), "training": training, **self.evaluate(training)}

    def model_spec(self, seed: int) -> StudyModel:
        """Both models' training sections for seed ``seed``: the config's, sized to the task's context."""
        cfg, context = self.cfg, self.context_length()
        return StudyModel(model=dataclasses.replace(cfg.model, max_seq_len=context),
                          train=dataclasses.replace(cfg.train, seq_len=context, seed=seed),
                          # a short warmup: tiny models, few steps, synthetic data
                          optim=dataclasses.replace(cfg.optim, warmup_steps=max(1, cfg.train.max_steps // 20)),
                          schedule=cfg.schedule, curriculum=getattr(cfg, "curriculum", 0.0), device=cfg.device)

    def build_data(self, data_dir: Path) -> tuple[Path, Path]:
        """Write the training and validation JSONL (prompt/completion) -> their paths."""
        raise NotImplementedError

    def context_length(self) -> int:
        """The models' max_seq_len."""
        raise NotImplementedError

    def evaluate(self, training: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Score the trained models (``training[kind]["model_dir"]``) -> the rest of the results."""
        raise NotImplementedError


def sft_run_config(spec: StudyModel, data: Path, validation: Path, out_dir: Path, feedback: bool) -> TrainRunConfig:
    """SFT on ``data`` (prompt masked). Both models see the same batches in the same order (same seed); the
    full-bandwidth one runs the multi-pass objective of ``spec.schedule`` (DESIGN.md §3), the baseline none, at
    the fusion's LR multiplier of 1. ``validation`` gives the held-out loss with 1 pass (standard) and 3 passes
    (fused prefill, 2 extra passes) at the end."""
    return TrainRunConfig(
        model=dataclasses.replace(spec.model, feedback=feedback),
        data=DataConfig(source=str(data), format="sft", validation_source=str(validation), tokenizer="byte",
                        curriculum=spec.curriculum),
        train=dataclasses.replace(spec.train, checkpoint_every=study_checkpoint_every(spec.train.max_steps)),
        optim=spec.optim if feedback else dataclasses.replace(spec.optim, fusion_lr_mult=1.0),
        schedule=spec.schedule if feedback else ScheduleConfig(feedback_start=1.0, pass_mix=spec.schedule.pass_mix),
        out_dir=str(out_dir), device=spec.device, eval_passes=(1, 3),
    )


def study_checkpoint_every(steps: int) -> int:
    """Ten checkpoints a run: a study killed mid-run resumes its interrupted run losing at most a tenth of it
    (saving one changes no number: the trainer's checkpoints are bit-exact on CPU)."""
    return max(1, steps // 10)


def train_both(
    spec: StudyModel, data: Path, validation: Path, out_dir: Path, progress: bool = True, reuse: bool = False,
    resume: bool = False,
) -> dict[str, dict[str, Any]]:
    """Train ``baseline`` (feedback=False) and ``fullband`` on the same data -> per-kind summary + model_dir.

    ``reuse`` takes the models an earlier run left in ``out_dir`` (its training summary is read back); ``resume``
    also retrains from scratch a run an interrupted study left unfinished."""
    return {kind: train_run(kind, sft_run_config(spec, data, validation, out_dir / kind, kind == "fullband"),
                            progress, reuse, resume)
            for kind in MODEL_KINDS}


def train_run(kind: str, run_cfg: TrainRunConfig, progress: bool = True, reuse: bool = False,
              resume: bool = False) -> dict[str, Any]:
    """Train one model of a study into ``run_cfg.out_dir`` -> its summary (model_dir, tokens, losses, seconds).

    A finished run there is reused (``reuse``) or refused; an unfinished one (no summary: the study was killed
    while it trained) continues from its latest complete checkpoint with ``resume``, or is trained again from the
    start if it has none (runs are deterministic and resume bit for bit, so either gives the numbers of an
    uninterrupted run), else refused. With ``resume`` a finished run whose decoded cells the study kept
    (:func:`cells_cache`) needs no weights: a study moved between machines as its summaries and cells alone
    continues."""
    from fullband.training.checkpoint_layout import latest_good_checkpoint
    from fullband.training.run import run_train

    run_dir = Path(run_cfg.out_dir)
    resumed_from = None
    if run_dir.exists():
        finished = (run_dir / SUMMARY_FILE).is_file() and (run_dir / "model").is_dir()
        if resume and (run_dir / SUMMARY_FILE).is_file() and cells_cache(run_dir.parent, run_dir.name).is_file():
            return json.loads((run_dir / SUMMARY_FILE).read_text())  # finished (its summary is written last)
        if resume and not finished:
            resumed_from = latest_good_checkpoint(run_dir)
            if resumed_from is None:
                shutil.rmtree(run_dir)
        elif not reuse and not resume:
            raise ConfigError(f"out_dir={str(run_dir.parent)!r} already holds a trained {kind}: pick a new "
                              "--out_dir, or --reuse_models true to evaluate the trained models again")
        else:
            return _read_summary(run_dir)
    if progress:
        start = f", resumed from {resumed_from.name}" if resumed_from is not None else ""
        print(f"training {kind} ({run_cfg.train.max_steps} steps{start})", flush=True)
    if resumed_from is not None:
        result = run_train(dataclasses.replace(run_cfg, resume=True), progress=progress)
        save_resolved_config(run_cfg, run_dir / "config.toml")  # as an uninterrupted run's
    else:
        result = run_train(run_cfg, progress=progress)
    summary = {
        "model_dir": str(result.model_dir), "steps": result.steps, "tokens": result.tokens,
        "token_equiv_compute": result.token_equiv_compute, "final_loss": result.final_loss,
        "seconds": round(result.train_seconds, 1), **result.validation,  # every invocation's training time
    }
    write_json(run_dir / SUMMARY_FILE, summary)  # last: its presence marks the run finished
    return summary


def cells_cache(seed_dir: Path, kind: str) -> Path:
    """Where a study keeps the decoded cells of one seed's ``kind`` model (read back on resume)."""
    return seed_dir / f"cells-{kind}.json"


def _read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / SUMMARY_FILE
    if not path.is_file() or not (run_dir / "model").is_dir():
        raise ConfigError(f"{run_dir} holds no finished training run ({SUMMARY_FILE} and model/); delete it and rerun")
    return json.loads(path.read_text())


def resolve_study_device(cfg: Any) -> None:
    """``cfg.device`` as the device it names here ('auto' -> cuda or cpu), as the CLI sets it, so a study called
    from Python trains and then loads its models for evaluation on one real device."""
    from fullband.devices import resolve_device

    cfg.device = str(resolve_device(cfg.device))


def set_threads(threads: str | int) -> int:
    """The study's ``threads`` option applied (:func:`fullband.devices.apply_threads`); returns the count set."""
    from fullband.devices import apply_threads

    return apply_threads(threads)


# ---------------------------------------------------------------------------------------------- report pieces


def summarize(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "median": math.nan}
    return {"mean": statistics.fmean(values), "median": float(statistics.median(values))}


def counted_flops(training: dict[str, dict[str, Any]]) -> bool:
    """Whether every run's training FLOPs were counted (the controls count them: a deeper model's tokens x passes
    equal the baseline's)."""
    return all("training_flops" in t for t in training.values())


def training_table(training: dict[str, dict[str, Any]]) -> str:
    """Markdown: tokens, compute (tokens x passes; training FLOPs where the study counted them) and held-out loss
    (1 pass = standard, 3 passes = fused prefill) of each model."""
    flops = counted_flops(training)
    rows = [[kind, t["steps"], t["tokens"], t["token_equiv_compute"],
             *([f"{t['training_flops']:.3g}"] if flops else []),
             f"{t['val_loss_1pass']:.4f}", f"{t['val_loss_3pass']:.4f}", f"{t['seconds']:.0f}"]
            for kind, t in training.items()]
    return markdown_table(["model", "steps", "tokens", "token-equiv. compute", *(["training FLOPs"] * flops),
                           "held-out loss, 1 pass", "3 passes", "seconds"], rows)


def report_head(title: str, command: str, finished: str, details: str, verdict: Sequence[str]) -> list[str]:
    """The opening lines of a report.md: title, the command that generated it and when it finished (``details``
    follows the date), the verdict, then the "Setup" heading."""
    return [f"# {title}", "",
            f"Generated by `{command}` on {finished}{details} Do not edit by hand; rerun "
            "the command.", "", "## Verdict", "", *verdict, "", "## Setup", ""]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def line_style(variant: str) -> dict[str, Any]:
    # The baseline is drawn wide and pale underneath, so it stays visible where a fullband line covers it.
    return {"linewidth": 5, "alpha": 0.35, "zorder": 1} if variant == "baseline" else {"linewidth": 1.5, "zorder": 2}
