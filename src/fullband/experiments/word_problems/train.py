"""One training run of ``fullband eval-controls``: one arm, one knob value, one learning rate, one seed, scored at
one or more step counts. Every arm trains in this one loop, on the same batches for the same seed.

Schedule: AdamW, linear warmup, then WSD (constant, then a linear cool-down to 0 over the last
``cooldown_fraction``). A run scored at several step counts (the tuning grid's 1x and 2x) trains the longest
schedule and branches each shorter one off it where that one's cool-down starts: the branch cools down to its own
end, is scored, and the main run goes on from the state before the branch. Both schedules are then complete, and a
later run of only the shorter count computes the same numbers (batches are a function of the seed and the step).

What a run leaves in its directory: ``result.json`` (written last: a directory without it is an unfinished run) and
``model-<steps>.safetensors`` for each scored step count. While it trains, ``progress.pt`` keeps its state (weights,
AdamW's state, the curve and checkpoints so far) at a validation step on the main schedule, every
:data:`KEEP_EVERY_SECONDS` at most: a run stopped part-way (a study spans sittings) goes on from there, to the same
numbers bit for bit, as every step's batch and random draws are functions of the seed and the step.

Each checkpoint is scored on the validation problems (the trained lengths), the test problems (``test_problems`` of
the longest of ``test_lengths``) and, for a run with ``long_test``, the long test problems (``long_test_problems`` of
the config's ``max_test_length``: fewer problems, as a looped model's cost grows with the square of the length).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model

from fullband import rundir
from fullband.devices import cpu_flags, cpu_name, resolve_device
from fullband.experiments.word_problems.arms import Arm, make_arm
from fullband.experiments.word_problems.config import ControlsConfig
from fullband.experiments.word_problems.models import parameters
from fullband.files import write_bytes, write_json
from fullband.model.recurrence import ntp_loss
from fullband.tasks.lookup_problems import LookupProblems
from fullband.tasks.word_problems import WordBatch, WordProblems, accuracy_by_length
from fullband.training.optim import lr_at, set_lr
from fullband.training.sections import OptimConfig

RESULT = rundir.RUN_RESULT
PROGRESS = rundir.RUN_PROGRESS
KEEP_EVERY_SECONDS = 300.0  # how often an unfinished run keeps its state (at the next validation step after that)
EXTRAPOLATION = "extrapolation.json"  # a tuning run's checkpoints scored on the selection problems of unseen lengths
GRAD_CLIP = 1.0  # fullband train's default
VALIDATION_SEED, TEST_SEED = 1_000_003, 2_000_003  # the held-out sets: the same for every seed and arm
EXTRAPOLATION_SEED = 3_000_017  # the second selection's problems: neither the validation nor the test problems
LONG_TEST_SEED = 4_000_037  # the long test problems (eval-decisive)


@dataclass(frozen=True)
class RunSpec:
    """What one run trains: ``arm`` (in its ``variant``, see :mod:`.arms`) with ``knob`` at peak ``lr`` on
    ``seed``'s batches, scored after each of ``stops`` steps (on the long test problems too with ``long_test``)."""

    group: str
    arm: str
    knob: Any
    lr: float
    seed: int
    stops: tuple[int, ...]
    variant: str = ""
    long_test: bool = False

    def directory(self, root: Path) -> Path:
        knob = f"{self.knob:g}" if isinstance(self.knob, float) else str(self.knob)
        arm = Path(self.arm, self.variant) if self.variant else Path(self.arm)
        return root / "runs" / self.group / arm / f"{knob}-lr{self.lr:g}" / f"seed{self.seed}-{self.stops[-1]}"


VALIDATION = "validation"  # the sets whose names start with it choose the settings (the others are tested)


def evaluation_sets(cfg: ControlsConfig, problems: WordProblems | LookupProblems,
                    long_test: bool = False) -> dict[str, WordBatch]:
    """The named problem sets every checkpoint is scored on. Word problems: ``validation`` (the trained lengths),
    ``test`` and, with ``long_test``, ``long_test``. Lookup problems: ``validation_K<K>`` and ``test_K<K>`` for each
    of the config's validation and test table sizes (problems of one table size per set: no row is padded)."""
    if isinstance(problems, LookupProblems):
        sets = {f"{VALIDATION}_K{K}": problems.batch(cfg.validation_problems, K, cfg.train_length,
                                                     torch.Generator().manual_seed(VALIDATION_SEED + K))
                for K in cfg.validation_tables}
        return sets | {f"test_K{K}": problems.batch(cfg.test_problems, K, max(cfg.test_lengths),
                                                    torch.Generator().manual_seed(TEST_SEED + K))
                       for K in cfg.test_tables}
    sets = {VALIDATION: validation_set(cfg, problems), "test": test_set(cfg, problems)}
    return sets | ({"long_test": long_test_set(cfg, problems)} if long_test else {})


def mean_of(accuracies: Iterable[list[float]]) -> float:
    """The mean accuracy over every length of every set (equal weight to each length)."""
    values = [value for accuracy in accuracies for value in accuracy]
    return sum(values) / len(values)


def validation_set(cfg: ControlsConfig, problems: WordProblems) -> WordBatch:
    return problems.batch(cfg.validation_problems, cfg.train_length, torch.Generator().manual_seed(VALIDATION_SEED))


def test_set(cfg: ControlsConfig, problems: WordProblems) -> WordBatch:
    return problems.batch(cfg.test_problems, max(cfg.test_lengths), torch.Generator().manual_seed(TEST_SEED))


def long_test_set(cfg: ControlsConfig, problems: WordProblems) -> WordBatch:
    """The long test problems (their own seed: not the test problems extended)."""
    return problems.batch(cfg.long_test_problems, cfg.max_test_length, torch.Generator().manual_seed(LONG_TEST_SEED))


def extrapolation_set(cfg: ControlsConfig, problems: WordProblems) -> WordBatch:
    return problems.batch(cfg.validation_problems, cfg.extrapolation_length,
                          torch.Generator().manual_seed(EXTRAPOLATION_SEED))


def training_batch(cfg: ControlsConfig, problems: WordProblems | LookupProblems, seed: int, step: int) -> WordBatch:
    """The batch of ``step`` for ``seed``: every arm of a seed trains on the same batches."""
    generator = torch.Generator().manual_seed(seed * 1_000_033 + step)
    return problems.training_batch(cfg.batch_size, cfg.train_length, generator)


@torch.no_grad()
def score(arm: Arm, model: torch.nn.Module, knob: Any, batch: WordBatch, rows: int = 250,
          other_modes: bool = True) -> dict[str, Any]:
    """Accuracy at every length of ``batch`` and the loss over its labels, in chunks of ``rows`` problems (and, with
    ``other_modes``, the accuracy of the arm's other ways of answering)."""
    model.eval()
    logits = torch.cat([arm.logits(model, batch.tokens[i : i + rows], knob, batch.prefix)
                        for i in range(0, len(batch.tokens), rows)])
    out = {"accuracy": accuracy_by_length(logits, batch).tolist(), "loss": ntp_loss(logits, batch.labels).item()}
    # the same model answering another way (fullband: without its feedback)
    for mode in arm.other_modes if other_modes else ():
        other = torch.cat([arm.mode_logits(mode, model, batch.tokens[i : i + rows], batch.prefix)
                           for i in range(0, len(batch.tokens), rows)])
        out[f"{mode}_accuracy"] = accuracy_by_length(other, batch).tolist()
    model.train()
    return out


def train_run(cfg: ControlsConfig, spec: RunSpec, root: str) -> dict[str, Any]:
    """Train ``spec`` (or read back its finished result) -> its result (what result.json holds)."""
    directory = spec.directory(Path(root))
    if (directory / RESULT).is_file():
        return read_result(directory)
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    problems = cfg.problems(spec.group)
    arm = make_arm(spec.arm, cfg, problems, spec.variant)
    torch.manual_seed(10_007 * spec.seed + 1)  # the initial weights: one per seed, the same for every lr
    model = arm.build(spec.knob).to(device)
    optim_cfg = OptimConfig(optimizer="adamw", lr=spec.lr, warmup_steps=round(cfg.warmup_fraction * cfg.steps),
                            schedule="wsd", decay_fraction=cfg.cooldown_fraction, min_lr_ratio=0.0)
    optimizer = torch.optim.AdamW(arm.optimizer_groups(model, spec.knob), lr=spec.lr, betas=optim_cfg.betas,
                                  eps=optim_cfg.eps)
    sets = {name: _to(batch, device) for name, batch in evaluation_sets(cfg, problems, spec.long_test).items()}
    validations = [batch for name, batch in sets.items() if name.startswith(VALIDATION)]
    curve: dict[str, list[float]] = {"step": [], "train_loss": [], "validation_accuracy": [], "validation_loss": []}
    checkpoints: dict[str, Any] = {}
    last = spec.stops[-1]
    branches = {round((1 - cfg.cooldown_fraction) * s): s for s in spec.stops[:-1]}  # branch step -> its end
    losses: list[float] = []
    scoring = [0.0]  # seconds spent scoring checkpoints (the rest of the run's time is training)
    earlier = 0.0  # seconds of the sittings before this one (up to the state kept)
    step = 0
    if (kept := _kept_progress(directory, spec)) is not None:
        model.load_state_dict(kept["model"])
        optimizer.load_state_dict(kept["optimizer"])
        step, curve, checkpoints = kept["step"], kept["curve"], kept["checkpoints"]
        scoring[0], earlier = kept["scoring_seconds"], kept["seconds"]
    kept_at = [time.perf_counter()]

    def keep_progress(at: int) -> None:
        """Keep the run's state after ``at`` steps of the main schedule (at a validation: no loss is pending)."""
        if time.perf_counter() - kept_at[0] < KEEP_EVERY_SECONDS:
            return
        state = {"spec": _spec_record(spec), "step": at, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "curve": curve, "checkpoints": checkpoints,
                 "scoring_seconds": scoring[0], "seconds": earlier + time.perf_counter() - start}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        write_bytes(directory / PROGRESS, buffer.getvalue())
        kept_at[0] = time.perf_counter()

    def steps_to(begin: int, end: int, total: int, record: bool) -> None:
        for step in range(begin, end):
            set_lr(optimizer, lr_at(step, optim_cfg, total))
            torch.manual_seed(spec.seed * 1_000_033 + step + 17)  # an arm's random draws (jitter) are the step's
            loss = arm.loss(model, _to(training_batch(cfg, problems, spec.seed, step), device), spec.knob, step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            if record:
                losses.append(loss.item())
                if (step + 1) % cfg.eval_every == 0:
                    scored = [score(arm, model, spec.knob, batch, other_modes=False) for batch in validations]
                    curve["step"].append(step + 1)
                    curve["train_loss"].append(sum(losses) / len(losses))
                    curve["validation_accuracy"].append(mean_of(s["accuracy"] for s in scored))
                    curve["validation_loss"].append(sum(s["loss"] for s in scored) / len(scored))
                    losses.clear()
                    _progress(cfg, spec, step + 1, curve)
                    keep_progress(step + 1)

    def checkpoint(steps: int) -> None:
        began = time.perf_counter()
        checkpoints[str(steps)] = {name: score(arm, model, spec.knob, batch) for name, batch in sets.items()}
        scoring[0] += time.perf_counter() - began
        save_model(model, str(directory / f"model-{steps}.safetensors"))

    for branch_at in sorted(branches):
        if branch_at < step:  # branched before the kept state: its checkpoint is kept
            continue
        steps_to(step, branch_at, last, record=True)
        saved = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
        steps_to(branch_at, branches[branch_at], branches[branch_at], record=False)
        checkpoint(branches[branch_at])
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        step = branch_at
    steps_to(step, last, last, record=True)
    checkpoint(last)
    variant = {"variant": spec.variant} if spec.variant else {}  # eval-controls' runs keep their result.json
    result = {"group": spec.group, "arm": spec.arm, **variant, "knob": spec.knob, "lr": spec.lr, "seed": spec.seed,
              "stops": list(spec.stops), "checkpoints": checkpoints, "curve": curve, "parameters": parameters(model),
              "describe": arm.describe(spec.knob), "train_flops_per_step": arm.train_flops(spec.knob),
              "inference_flops": inference_costs(cfg, arm, spec.knob),
              "seconds": earlier + time.perf_counter() - start, "scoring_seconds": scoring[0],
              "threads": torch.get_num_threads(), "processor": cpu_name(),
              "avx512_bf16": "avx512_bf16" in cpu_flags()}
    write_json(directory / RESULT, rundir.stamped(result))
    (directory / PROGRESS).unlink(missing_ok=True)
    return read_result(directory)


def _spec_record(spec: RunSpec) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(spec)))  # tuples as lists, as a kept state holds them


def _kept_progress(directory: Path, spec: RunSpec) -> dict[str, Any] | None:
    """The state an unfinished run of ``spec`` kept in ``directory`` (None: none, or one of another spec, which the
    run then starts over and replaces)."""
    path = directory / PROGRESS
    if not path.is_file():
        return None
    kept = torch.load(path, map_location="cpu", weights_only=True)
    return kept if kept.get("spec") == _spec_record(spec) else None


def inference_costs(cfg: ControlsConfig, arm: Arm, knob: Any) -> dict[str, float]:
    """FLOPs of answering one problem at each reported length (and each test table size of lookup problems:
    ``"K16 n64"``)."""
    if isinstance(arm.problems, LookupProblems):
        return {f"K{K} n{n}": arm.inference_flops(knob, n, arm.problems.prefix(K))
                for K in cfg.test_tables for n in cfg.reported_lengths}
    return {str(n): arm.inference_flops(knob, n) for n in cfg.reported_lengths}


def read_result(directory: Path) -> dict[str, Any]:
    """A finished run's result.json (its format checked; runs from before format_version read as version 1)."""
    result = json.loads((directory / RESULT).read_text())
    rundir.check_format(result, directory / RESULT)
    return result


def run_specs(cfg: ControlsConfig, specs: list[RunSpec], root: str | Path, phase: str) -> list[dict[str, Any]]:
    """Every run of ``specs`` under ``root`` (finished ones read back), ``cfg.workers`` at a time, the costliest
    first -> their results, in the order of ``specs``."""
    from fullband.experiments.core.parallel import map_jobs

    root = Path(root)
    todo = [s for s in specs if not (s.directory(root) / RESULT).is_file()]
    if cfg.progress:
        print(f"{phase}: {len(specs)} runs, {len(specs) - len(todo)} already done", flush=True)

    def cost(spec: RunSpec) -> float:
        return make_arm(spec.arm, cfg, cfg.problems(spec.group), spec.variant).train_flops(spec.knob) * spec.stops[-1]

    order = sorted(todo, key=lambda s: -cost(s))
    for done, result in enumerate(map_jobs(train_run, [(cfg, s, str(root)) for s in order], cfg.workers), start=1):
        if cfg.progress:
            print(f"[{phase} {done}/{len(order)}] {result['group']} {result['arm']} {result['describe']} lr "
                  f"{result['lr']:g} seed {result['seed']}: {result['seconds']:.0f} s", flush=True)
    return [read_result(s.directory(root)) for s in specs]


def extrapolation_scores(cfg: ControlsConfig, spec: RunSpec, root: str) -> dict[str, list[float]]:
    """A finished run's checkpoints scored on the selection problems of the unseen lengths: step count -> accuracy
    at every length 1..extrapolation_length. Kept in the run's extrapolation.json (computed once; read back while
    the length and the number of problems are the same)."""
    from safetensors.torch import load_model

    directory = spec.directory(Path(root))
    stamp = {"length": cfg.extrapolation_length, "problems": cfg.validation_problems}
    kept_file = directory / EXTRAPOLATION
    if kept_file.is_file() and (kept := json.loads(kept_file.read_text()))["set"] == stamp:
        return kept["accuracy"]
    device = resolve_device(cfg.device)
    problems = cfg.problems(spec.group)
    arm = make_arm(spec.arm, cfg, problems, spec.variant)
    batch = _to(extrapolation_set(cfg, problems), device)
    accuracy = {}
    for steps in spec.stops:
        model = arm.build(spec.knob).to(device)
        load_model(model, str(directory / f"model-{steps}.safetensors"), device=str(device))
        accuracy[str(steps)] = score(arm, model, spec.knob, batch, other_modes=False)["accuracy"]
    write_json(directory / EXTRAPOLATION, {"set": stamp, "accuracy": accuracy})
    return accuracy


def _to(batch: WordBatch, device: torch.device) -> WordBatch:
    return batch if device.type == "cpu" else batch.to(device)


def _progress(cfg: ControlsConfig, spec: RunSpec, step: int, curve: dict[str, list[float]]) -> None:
    if cfg.progress:
        print(f"  {spec.group} {spec.arm} {spec.knob} lr {spec.lr:g} seed {spec.seed}: step {step}/{spec.stops[-1]} "
              f"loss {curve['train_loss'][-1]:.4f} validation accuracy {curve['validation_accuracy'][-1]:.3f}",
              flush=True)
