"""The synthetic-task study of two models, the baseline and the full-bandwidth model, trained on the same batches:
:class:`PairStudy`, the training of its models (resumable, reusable) and the training table of its report."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from fullband import rundir
from fullband.config import ConfigError
from fullband.configio import save_resolved_config
from fullband.experiments.core.config import flat_view
from fullband.experiments.core.study import Study, resolve_study_device, set_threads
from fullband.files import write_json
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
        finished = (run_dir / SUMMARY_FILE).is_file() and (run_dir / rundir.MODEL_DIR).is_dir()
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
        save_resolved_config(run_cfg, run_dir / rundir.SETTINGS)  # as an uninterrupted run's
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
    if not path.is_file() or not (run_dir / rundir.MODEL_DIR).is_dir():
        raise ConfigError(f"{run_dir} holds no finished training run ({SUMMARY_FILE} and model/); delete it and rerun")
    return json.loads(path.read_text())



# ---------------------------------------------------------------------------------------------- report pieces


def summarize(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "median": math.nan}
    return {"mean": statistics.fmean(values), "median": float(statistics.median(values))}


def counted_flops(training: dict[str, dict[str, Any]]) -> bool:
    """Whether every run's training FLOPs were counted (the controls count them: a deeper model's tokens x passes
    equal the baseline's)."""
    return all("training_flops" in t for t in training.values())


def training_table(training: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows: tokens, compute (tokens x passes; training FLOPs where the study counted them) and held-out
    loss (1 pass = standard, 3 passes = fused prefill) of each model."""
    flops = counted_flops(training)
    rows = [[kind, t["steps"], t["tokens"], t["token_equiv_compute"],
             *([f"{t['training_flops']:.3g}"] if flops else []),
             f"{t['val_loss_1pass']:.4f}", f"{t['val_loss_3pass']:.4f}", f"{t['seconds']:.0f}"]
            for kind, t in training.items()]
    return (["model", "steps", "tokens", "token-equiv. compute", *(["training FLOPs"] * flops),
             "held-out loss, 1 pass", "3 passes", "seconds"], rows)
