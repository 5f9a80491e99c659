"""The training loop: scheduled multi-pass steps, logging, validation and resumable checkpoints.

Step numbers are 0-based indices: step ``s`` trains on ``batch_fn(s, rank, world_size)`` with
``schedule.passes_at(s)`` passes at ``lr_at(s)``, and its metrics record says ``"step": s``. A checkpoint
holds the state after some number of steps ``n`` (directory ``step-{n}``) and a resumed run continues with
step ``n``. Everything random is either a pure function of (seed, step) or an RNG state in the checkpoint,
so a resumed run repeats the uninterrupted one bit for bit on the same hardware.

Parallelism is applied from outside: ``trainer.raw_model`` is the FullBandwidthLM, or a RetrofittedLM (a
transformers model with the fusion, which has the same API), that is saved, loaded and evaluated;
``trainer.model`` is what the training forward calls and may be replaced by a DDP wrapper.
FSDP2 (``wrap_fsdp``) instead shards ``raw_model`` in place (the two are then the same module) and rebuilds
``trainer.optimizer`` over the shards; checkpoints then go through :func:`save_sharded_checkpoint`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from fullband import rundir
from fullband.config import ConfigError
from fullband.configio import config_to_dict
from fullband.model import FeedbackLM
from fullband.training.checkpoint import load_checkpoint, save_checkpoint, save_sharded_checkpoint, set_aside
from fullband.training.checkpoint_layout import (
    TrainingState,
    list_checkpoints,
    newest_complete_checkpoint,
    warn_skipped,
)
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training.errors import NonFiniteLossError, TrainingError
from fullband.training.interrupt import Interrupted
from fullband.training.metrics import MetricsLog, flops_per_token, peak_flops
from fullband.training.objective import BoundObjective, MultiPassObjective, document_plan
from fullband.training.optim import build_optimizer, in_cooldown, lr_at, optimizer_ns_dtype, set_lr
from fullband.training.rng_state import capture_process_rng
from fullband.training.schedule import FeedbackSchedule
from fullband.training.sharded import is_sharded
from fullband.training.step_scalars import (
    PENDING,
    PendingStep,
    StepWindow,
    check_token_range,
    read_scalars,
    shown,
)
from fullband.training.step_setup import accumulate, autocast_dtype, compile_work, plain_prefixes, should_compile

# batch_fn(step, rank, world_size) -> (inputs, labels), each (batch_size * grad_accum, T): this process's
# rows of optimizer step ``step``, all micro-batches together; must be a pure function of its arguments.
BatchFn = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]
# eval_fn(model, step) -> {"name": value}; called in eval mode under torch.no_grad.
EvalFn = Callable[[FeedbackLM, int], dict[str, float]]



class Trainer:
    """Trains ``model`` with the scheduled multi-pass objective; see the module docstring."""

    def __init__(
        self,
        model: FeedbackLM,
        train_cfg: TrainConfig,
        optim_cfg: OptimConfig,
        schedule_cfg: ScheduleConfig,
        batch_fn: BatchFn,
        eval_fn: EvalFn | None = None,
        out_dir: str | Path = "runs/fullband",
        *,
        rank: int = 0,
        world_size: int = 1,
        run_config: dict[str, Any] | None = None,  # extra sections (data, ...) stored with checkpoints
        progress: bool = True,
        write_extra: Callable[[Path], None] | None = None,  # adds files (the tokenizer) to every checkpoint
        separator: int | None = None,  # the end-of-text id between packed documents (train.restart_at_documents)
    ) -> None:
        if train_cfg.seq_len > model.config.max_seq_len:
            raise ConfigError(f"train.seq_len={train_cfg.seq_len} is invalid: must be at most the model's "
                              f"max_seq_len={model.config.max_seq_len}")
        total = train_cfg.total_steps(world_size)
        work = compile_work(total, train_cfg.tokens_per_step(), model.config.d_model, model.config.n_layers,
                            model.config.feedback)
        self.compiled = should_compile(train_cfg.compile, next(model.parameters()).device, total, work)
        if self.compiled:
            model.compile_blocks()
        self._compile_checked = not self.compiled  # the first compiled step falls back to eager if it fails
        if train_cfg.activation_checkpointing:
            model.checkpoint_activations()
        if train_cfg.restart_at_documents and separator is None:
            raise ConfigError("train.restart_at_documents=true is invalid here: the tokenizer has no end-of-text id "
                              "to find where a packed document starts; leave it false")
        self.raw_model = model
        # The one objective of every step (DESIGN.md §3), bound to the model: what DDP wraps (one forward a step).
        self.objective = MultiPassObjective.of(train_cfg, optim_cfg)
        self.model: torch.nn.Module = BoundObjective(model, self.objective)
        self.separator = separator if train_cfg.restart_at_documents else None
        self.cfg, self.optim_cfg, self.schedule_cfg = train_cfg, optim_cfg, schedule_cfg
        self.batch_fn, self.eval_fn = batch_fn, eval_fn
        self.out_dir = Path(out_dir)
        self.rank, self.world_size = rank, world_size
        self.progress = progress and rank == 0
        self.device = next(model.parameters()).device
        self.total_steps = train_cfg.total_steps(world_size)
        self.schedule = FeedbackSchedule(schedule_cfg, self.total_steps, train_cfg.seed,
                                         feedback=model.config.feedback)
        self.optimizer = build_optimizer(model, optim_cfg)
        # Prefix lengths come from their own CPU generator, identical on every rank (each takes its slice of
        # the global draw), so they do not depend on the device or on how the batch is split.
        self.generator = torch.Generator()
        self.autocast_dtype = autocast_dtype(train_cfg.autocast, self.device)
        self.state = TrainingState(schedule=self.schedule.state_dict())
        self.run_config = {
            "model": model.config.to_dict(),
            "train": config_to_dict(train_cfg),
            "optim": config_to_dict(optim_cfg),
            "schedule": config_to_dict(schedule_cfg),
            "torch_threads": torch.get_num_threads(),  # what this process ran with (fullband train sets it: --threads)
            # What optim.ns_dtype (auto) chose on this machine: bf16 and float32 orthogonalisation differ in the last
            # bits, so a rerun elsewhere reproduces the numbers only with this value set explicitly.
            "ns_dtype": optimizer_ns_dtype(self.optimizer),
            **(run_config or {}),
        }
        self._flops_per_token = flops_per_token(model.num_parameters(), model.config.n_layers, model.config.d_model,
                                                train_cfg.seq_len)
        peak = peak_flops(self.device, self.autocast_dtype or next(model.parameters()).dtype)
        self._peak_flops = peak * world_size if peak is not None else None
        # On CUDA a step's scalars stay on the device until read_back (every log_every steps, before evaluating and
        # saving): a read per step makes the host wait for the GPU at every step (docs/LOG.md, 2026-12-04: Trainer /
        # bare step 1.21 on an H200). On a CPU, which runs in step with the host, every step reads its own.
        self.sync_every_step = self.device.type != "cuda"
        self._unread: dict[str, Any] | None = None
        self._window = StepWindow()
        self.log: MetricsLog | None = None
        self.write_extra = write_extra
        self.last_record: dict[str, Any] | None = None  # the metrics of the last step this process trained
        self._resume_choice: tuple[Path | None, list[tuple[Path, str]]] | None = None  # checkpoint_to_resume's

    # ------------------------------------------------------------------ one step

    def train_step(self, step: int) -> dict[str, Any]:
        """Run optimizer step ``step`` (gradient accumulation, clipping, optimiser step); return its metrics (on CUDA,
        after the first step, only ``kind`` and ``step`` with the scalars still on the device: :meth:`fit` reads them
        back every ``log_every`` steps)."""
        if self._compile_checked:
            return self._train_step(step)
        rng = (torch.random.get_rng_state(), self.generator.get_state())
        try:
            record = self._train_step(step)
        except torch._dynamo.exc.TorchDynamoException as error:  # what the compiler raises (InductorError, ...)
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            record = self._train_eagerly(step, rng, f"torch.compile failed ({type(error).__name__}: {message[:200]})")
        except NonFiniteLossError:
            # Seen with inductor kernels cached for another ISA; the eager step raises again if it is the model's.
            record = self._train_eagerly(step, rng, "the compiled blocks' first step was not finite")
        self._compile_checked = True
        return record

    def _train_eagerly(self, step: int, rng: tuple[torch.Tensor, torch.Tensor], why: str) -> dict[str, Any]:
        """Step ``step`` again with eager blocks from the same random state (nothing was applied), and from now on."""
        self.raw_model.uncompile_blocks()
        self.compiled = False
        self.optimizer.zero_grad(set_to_none=True)
        torch.random.set_rng_state(rng[0])
        self.generator.set_state(rng[1])
        warnings.warn(f"{why}; training eagerly. Set train.compile false to skip the attempt.", stacklevel=3)
        return self._train_step(step)

    def _train_step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.model.train()
        cfg = self.cfg
        passes = self.schedule.passes_at(step)
        lr = lr_at(step, self.optim_cfg, self.total_steps)
        set_lr(self.optimizer, lr)
        cooldown = in_cooldown(step, self.optim_cfg, self.total_steps)

        inputs, labels = self.batch_fn(step, self.rank, self.world_size)
        rows, seq_len = inputs.shape
        if rows != cfg.batch_size * cfg.grad_accum or labels.shape != inputs.shape:
            raise TrainingError(
                f"batch_fn returned inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)}; expected both "
                f"({cfg.batch_size * cfg.grad_accum}, T) = (batch_size * grad_accum, T) for one optimizer step"
            )
        if self.device.type == "cuda" and not inputs.is_cuda:
            check_token_range(inputs, self.raw_model.config.vocab_size)  # here, on the host: no device sync
            # From pinned memory the copies run asynchronously, behind the previous step's kernels.
            inputs, labels = inputs.pin_memory(), labels.pin_memory()
        inputs = inputs.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        prefixes, everyone = plain_prefixes(self.cfg, self.generator, rows, seq_len, passes, self.rank,
                                            self.world_size)  # (rows,), or (passes, rows) per pass
        if self.device.type == "cuda":  # copied now, without waiting (the forward would copy them from pageable memory)
            prefixes = prefixes.pin_memory().to(self.device, non_blocking=True)
        # Truncated gradients: the passes and where they start are decided on the step's global batch (its prefixes;
        # document starts only lower the exact count), so every micro-batch of every process runs what one would.
        passes, fixed_point = self.objective.step_passes(passes, seq_len, everyone)
        fused = document_plan(inputs, self.separator) if self.separator is not None else None  # (rows, T) or None

        totals: dict[str, Any] = {}
        for micro in range(cfg.grad_accum):
            rows_here = slice(micro * cfg.batch_size, (micro + 1) * cfg.batch_size)
            with self._grad_sync(micro == cfg.grad_accum - 1):
                with self._autocast():
                    loss, metrics = self.model(inputs[rows_here], labels[rows_here], passes, prefixes[..., rows_here],
                                               fused=fused[rows_here] if fused is not None else None,
                                               fixed_point=fixed_point, cooldown=cooldown)
                (loss / cfg.grad_accum if cfg.grad_accum > 1 else loss).backward()
            accumulate(totals, metrics, cfg.grad_accum)

        names = [k for k in ("objective", "z_loss") if k in totals]
        values = self._mean_over_ranks(torch.stack([totals[k] for k in names] + totals["pass_losses"]).float())
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
        sync = self.sync_every_step or not self._compile_checked  # a first compiled step is checked before applied
        if sync:  # one host sync for all scalars; it also makes the timing below honest
            scalars = read_scalars(names, values)
            if not math.isfinite(scalars["objective"]):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError("the loss", scalars["objective"], step)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        if sync:
            grad_norm = float(grad_norm)
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError("the gradient norm", grad_norm, step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        step_tokens = totals["tokens"] * self.world_size
        step_compute = totals["token_equiv_compute"] * self.world_size
        self.state.step = step + 1
        self.state.tokens += step_tokens
        self.state.token_equiv_compute += step_compute
        self.state.lr = lr
        pending = PendingStep(step, names, values, grad_norm, lr, totals["passes"], self.state.tokens,
                              self.state.token_equiv_compute, step_tokens, step_compute)
        if not sync:  # read back later (read_back): the tensors stay on the device
            self._window.add(time.perf_counter() - t0)
            return {"kind": "train", "step": step, PENDING: pending}
        self.state.loss = scalars["objective"]
        return pending.record(scalars, grad_norm, time.perf_counter() - t0, self._flops_per_token, self._peak_flops)

    def read_back(self) -> None:
        """Read the unread steps' scalars from the device (the one host sync of a window of steps on CUDA): fill the
        last step's record, check the window for a non-finite loss or gradient norm, and time the window."""
        record, self._unread = self._unread, None
        if record is None:
            return
        pending: PendingStep = record.pop(PENDING)
        scalars = read_scalars(pending.names, pending.values)
        grad_norm = float(pending.grad_norm)
        for what, value in (("the loss", scalars["objective"]), ("the gradient norm", grad_norm)):
            if not math.isfinite(value):  # the window's steps were applied, but no checkpoint keeps them
                raise NonFiniteLossError(what, value, pending.step)
        self.state.loss = scalars["objective"]
        record.update(pending.record(scalars, grad_norm, self._window.per_step(), self._flops_per_token,
                                     self._peak_flops))

    def _grad_sync(self, last_micro: bool) -> contextlib.AbstractContextManager:
        # Under DDP only the last micro-batch's backward needs to all-reduce the gradients. FSDP2 has no no_sync:
        # it reduce-scatters after every micro-batch, which keeps only sharded gradients in memory.
        if last_micro or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        if self._distributed:
            torch.distributed.all_reduce(values)  # SUM: gloo has no AVG in older torch releases
            values = values / self.world_size
        return values

    # ------------------------------------------------------------------ the loop

    def fit(self, resume: bool | str = False, until: int | None = None,
            stop_on_interrupt: bool = False) -> TrainingState:
        """Train to the end of the run (or to step ``until``, exclusive), checkpointing on the way.

        ``resume=True`` (or "true") continues from the latest complete checkpoint in ``out_dir`` and raises
        TrainingError when there is none; "auto" continues from one if there is one, else starts fresh;
        ``resume=False`` (or "false") refuses an ``out_dir`` that already holds checkpoints.

        ``stop_on_interrupt``: the first Ctrl-C (SIGINT) lets the running step finish, saves a checkpoint of it and
        then raises KeyboardInterrupt (a second one interrupts at once); one process only, from the main thread.
        """
        stop = self.total_steps if until is None else min(until, self.total_steps)
        mode = str(resume).lower()
        start = self._resume(required=mode == "true") if mode in ("true", "auto") else self._start_fresh()
        bar = tqdm(total=self.total_steps, initial=start, disable=not self.progress, unit="step", dynamic_ncols=True)
        interrupted = Interrupted() if stop_on_interrupt else contextlib.nullcontext()
        try:
            with interrupted:
                for step in range(start, stop):
                    if step == start and self.compiled and not self._compile_checked and self.progress:
                        tqdm.write("compiling the transformer blocks (torch.compile: about 15-20 s on a CPU the first "
                                   "time, a few seconds from the compile cache after; --train.compile false skips it)")
                    self._step(step, stop, bar)
                    if isinstance(interrupted, Interrupted) and interrupted.requested and step + 1 < stop:
                        if not self._saved_at(step + 1):
                            self.save()
                        raise KeyboardInterrupt
        finally:
            bar.close()
            if self.log is not None:
                self.log.close()
        return self.state

    def _step(self, step: int, stop: int, bar: Any) -> None:
        """Step ``step`` of a run that stops at ``stop``: train, log, validate and checkpoint as configured."""
        t0 = time.perf_counter()
        record = self.train_step(step)
        self.last_record = record
        done = step + 1
        logged = step % self.cfg.log_every == 0 or done == stop
        evaluated = self.eval_fn is not None and self.cfg.eval_every and (
            done % self.cfg.eval_every == 0 or done == self.total_steps)
        if PENDING in record:  # on CUDA: read back every log_every steps, and before evaluating or saving
            self._unread = record
            if logged or evaluated or self._saved_at(done) or done == stop:
                self.read_back()
        if self.rank == 0 and logged:
            self.log.write(record)
        bar.update(1)
        if PENDING not in record:
            bar.set_postfix(shown(record, self.raw_model.config.feedback), refresh=False)
        if evaluated:
            self.evaluate(step)
        self.state.train_seconds += time.perf_counter() - t0  # kept in checkpoints: a resumed run adds on
        if (self.cfg.checkpoint_every and done % self.cfg.checkpoint_every == 0) or done == stop:
            self.save()  # after evaluation, so the saved RNG state is the one the next step starts from

    def _saved_at(self, step: int) -> bool:
        return self.cfg.checkpoint_every > 0 and step % self.cfg.checkpoint_every == 0

    def evaluate(self, step: int) -> dict[str, float]:
        """Run ``eval_fn`` on the raw model (eval mode, no grad) and log its numbers under ``step``.

        Every process calls it (so a sharded eval_fn may all-reduce); rank 0 logs what its call returns.
        """
        self.raw_model.eval()
        try:
            with torch.no_grad(), self._autocast():
                results = dict(self.eval_fn(self.raw_model, step))
        finally:
            self.raw_model.train()
        if self.rank == 0:
            self.log.write({"kind": "eval", "step": step, **results})
            if self.progress:
                tqdm.write(f"step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in results.items()))
        return results

    def save(self) -> Path | None:
        """Checkpoint the current state; call on every process (rank 0 returns the path, the others None).

        Rank 0 writes it alone, except under FSDP, where every process writes its shards.
        """
        self.read_back()  # the state's loss is the last step's, checked finite
        process_rng = [capture_process_rng()]
        if self._distributed:  # each rank's jitter stream differs, so each rank's RNG state is kept
            process_rng = [None] * self.world_size
            torch.distributed.all_gather_object(process_rng, capture_process_rng())
        if self.rank == 0:
            self.state.metrics_bytes = self.log.tell()
        rest = dict(generator=self.generator, process_rng=process_rng, run_config=self.run_config,
                    keep_last=self.cfg.keep_last, write_extra=self.write_extra)
        path = None
        if is_sharded(self.raw_model):
            path = save_sharded_checkpoint(self.out_dir, self.raw_model, self.optimizer, self.state, rank=self.rank,
                                           **rest)
        elif self.rank == 0:
            path = save_checkpoint(self.out_dir, self.raw_model, self.optimizer, self.state, **rest)
        if self._distributed:
            torch.distributed.barrier()  # nobody runs ahead (or exits) before the checkpoint is complete
        return path

    @property
    def _distributed(self) -> bool:
        return self.world_size > 1 and torch.distributed.is_initialized()

    def _start_fresh(self) -> int:
        if list_checkpoints(self.out_dir):
            raise TrainingError(f"{self.out_dir} already holds checkpoints: continue that run with resume='true' "
                                "(fullband train --resume true) or pick a new output directory")
        seed = self.cfg.seed + self.rank  # each process its own jitter noise
        torch.manual_seed(seed)  # the jitter noise draws from the global generator (CUDA seeded too)
        np.random.seed(seed)
        random.seed(seed)
        self.generator.manual_seed(self.cfg.seed)  # the same on every rank: each takes its slice of one draw
        self.state = TrainingState(schedule=self.schedule.state_dict())
        self._open_log(resume_bytes=None, start_step=0)
        return 0

    def checkpoint_to_resume(self) -> tuple[Path | None, list[tuple[Path, str]]]:
        """The newest complete checkpoint in ``out_dir`` (None when there is none) and the newer incomplete ones passed
        over, each with what is wrong with it. Verified once (hashing every file) and kept for :meth:`fit`; in a
        distributed run rank 0 verifies and picks it for every process (under FSDP loading is collective)."""
        if self._resume_choice is None:
            choice = [newest_complete_checkpoint(self.out_dir) if self.rank == 0 else None]
            if self._distributed:
                torch.distributed.broadcast_object_list(choice, src=0)
            self._resume_choice = choice[0]
        return self._resume_choice

    def _resume(self, required: bool) -> int:
        path, skipped = self.checkpoint_to_resume()
        if path is None:
            if skipped:  # only incomplete checkpoints: set them aside, so nothing is lost and the run can start
                what = f"{skipped[0][0].name}: {skipped[0][1]}" + (f"; and {len(skipped) - 1} more" if len(skipped) > 1
                                                                     else "")
                if required:
                    raise TrainingError(f"resume=true, but {self.out_dir} holds no complete checkpoint ({what}): "
                                        "resume='auto' (--resume auto) starts the run again, the incomplete "
                                        "checkpoints set aside")
                moved = [set_aside(p) for p, _ in skipped] if self.rank == 0 else []
                if self._distributed:
                    torch.distributed.barrier()  # every process sees them gone before it checks the directory
                if self.rank == 0:
                    warnings.warn(f"{self.out_dir} holds no complete checkpoint ({what}); starting from scratch, with "
                                  f"the incomplete checkpoints moved aside to {', '.join(map(str, moved))}",
                                  stacklevel=3)
            elif required:
                raise TrainingError(f"resume=true, but {self.out_dir} holds no complete checkpoint to resume: check "
                                    "out_dir, or use --resume auto to start from scratch when there is none")
            else:
                warnings.warn(f"no complete checkpoint under {self.out_dir}; starting from scratch", stacklevel=3)
            return self._start_fresh()
        if self.rank == 0:
            warn_skipped(skipped, stacklevel=4)
        self.state = load_checkpoint(path, self.raw_model, self.optimizer, generator=self.generator, rank=self.rank)
        current = self.schedule.state_dict()
        if self.state.schedule != current:
            warnings.warn(f"the feedback schedule changed since {path} ({self.state.schedule} -> {current}); "
                          "continuing with the new one", stacklevel=3)
            self.state.schedule = current
        self._open_log(resume_bytes=self.state.metrics_bytes, start_step=self.state.step)
        if self.progress:
            tqdm.write(f"resumed from {path} at step {self.state.step}")
        return self.state.step

    def _open_log(self, resume_bytes: int | None, start_step: int) -> None:
        if self.rank == 0:
            self.log = MetricsLog(self.out_dir / rundir.METRICS, resume_bytes=resume_bytes,
                                  tensorboard_dir=self.out_dir / "tensorboard", start_step=start_step,
                                  wandb_project=self.cfg.wandb_project, wandb_config=self.run_config)
