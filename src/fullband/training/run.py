"""``fullband train``: wire a run config to data, tokenizer, model and Trainer (one process or torchrun).

    out_dir/
      config.toml        the resolved configuration (re-run with ``--config out_dir/config.toml``)
      tokenizer/         the tokenizer (also inside every checkpoint and the final model)
      metrics.jsonl      one record per logged step and per validation
      checkpoints/       step-NNNNNNN/ (atomic, verified, last N kept)
      model/             the final model: ``fullband.families.load_any`` / ``fullband generate``

``init_from`` names a model directory of any model family (``fullband.families``), which continues
training it, or a source a family builds from: ``hf:PATH`` gives the transformers causal LM saved in the local
directory PATH latent feedback (its options section, [retrofit]) and tokenizes with its own tokenizer
(``AutoTokenizer.from_pretrained(PATH)``, as a :class:`~fullband.data.TransformersTokenizer`). Checkpoints and
``model/`` then hold that family's files and the tokenizer's own. Only families that say so are sharded by FSDP.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fullband import families, hub, rundir
from fullband.config import ConfigError, install_hint, plural
from fullband.configio import config_to_dict, save_resolved_config
from fullband.data import (
    SFTBatches,
    TokenBatches,
    Tokenizer,
    is_prepared,
    load_corpus,
    load_prepared,
    load_sft,
    load_tokenizer,
    load_tokens,
    named_tokenizer,
    prepared_tokenizer,
    train_bpe,
)
from fullband.devices import resolve_device
from fullband.families.loading import AnyLM, init_from
from fullband.training.checkpoint_layout import (
    latest_good_checkpoint,
    list_checkpoints,
    load_training_state,
    newest_complete_checkpoint,
)
from fullband.training.config import TrainRunConfig
from fullband.training.distributed import cleanup_distributed, init_distributed, wrap_ddp, wrap_fsdp
from fullband.training.errors import TrainingError
from fullband.training.sharded import save_model
from fullband.training.trainer import Trainer
from fullband.training.validation import loss_eval

BatchFn = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TrainResult:
    out_dir: Path
    model_dir: Path
    steps: int
    tokens: int
    token_equiv_compute: int
    final_loss: float | None  # the objective of the last step: NTP(pass 1) + feedback_weight * mean(later passes)
    validation: dict[str, float]
    seconds: float  # wall time of this invocation
    train_seconds: float  # time in training steps and validation, summed over every invocation of the run
    final_pass_losses: list[float] | None = None  # next-token loss of each pass of the last step this invocation ran
    final_mfu: float | None = None  # the last record's model FLOPs utilisation (a GPU with a known peak), else None


def check_writable(directory: Path) -> None:
    """ConfigError unless ``directory`` can be created or written to; writes nothing (a run writes only once its
    checks have passed)."""
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    why = ("not a directory" if not existing.is_dir() else
           "permission denied" if not os.access(existing, os.W_OK | os.X_OK) else None)
    if why is not None:
        raise ConfigError(f"out_dir={str(directory)!r} is not writable ({existing}: {why}); pick another --out_dir")


def check_run_directory(cfg: TrainRunConfig) -> bool:
    """Whether the run continues from a checkpoint in ``out_dir``: TrainingError when it holds checkpoints and the
    run does not resume (nothing of that run is touched), or resume=true and it holds none."""
    out_dir = Path(cfg.out_dir)
    check_writable(out_dir)
    has_checkpoints = bool(list_checkpoints(out_dir))
    if cfg.resume == "false" and has_checkpoints:
        if newest_complete_checkpoint(out_dir)[0] is None:  # resume=true could not continue it: say what can
            raise TrainingError(f"{out_dir} holds only incomplete checkpoints: start that run again with "
                                f"`{resume_command(out_dir, 'auto')}` (they are moved aside, not deleted), or pick a "
                                "new --out_dir")
        raise TrainingError(f"{out_dir} already holds checkpoints: continue that run with `{resume_command(out_dir)}`, "
                            "or pick a new --out_dir")
    if cfg.resume == "true" and not has_checkpoints:
        raise TrainingError(f"resume=true, but {out_dir} holds no complete checkpoint to resume: check out_dir, or use "
                            "--resume auto to start from scratch when there is none")
    return has_checkpoints and cfg.resume != "false"


def check_resume(cfg: TrainRunConfig, trainer: Trainer, world_size: int) -> None:
    """TrainingError, before anything is written, when a resume cannot go as asked: resume=true and no complete
    checkpoint (resume=auto starts the run again instead), or a run length that ends before the checkpoint's step
    (a resumed run cannot go back: running it would only rewrite the run's config.toml and model/)."""
    out_dir = Path(cfg.out_dir)
    path, skipped = trainer.checkpoint_to_resume()
    if path is None:
        if cfg.resume == "true" and skipped:
            raise TrainingError(f"{out_dir} holds no complete checkpoint ({skipped[0][0].name}: {skipped[0][1]}): "
                                f"start the run again with `{resume_command(out_dir, 'auto')}` (the incomplete "
                                "checkpoints are moved aside, not deleted), or pick a new --out_dir")
        return
    done, total = load_training_state(path).step, cfg.train.total_steps(world_size)
    if total < done:
        asked = (f"train.max_steps={total}" if cfg.train.token_budget is None else
                 f"train.token_budget={cfg.train.token_budget} ({total} steps)")
        raise TrainingError(f"{asked} cannot apply: the run is already at step {done} ({path.name}); give "
                            f"--train.max_steps {done} or more, or leave it out to train to the run's own length")


def resume_command(out_dir: Path, resume: str = "true") -> str:
    """The command that continues the run in ``out_dir`` (its settings come from the run: fullband.training.resume);
    ``resume='auto'`` starts it again when it holds no complete checkpoint."""
    return f"fullband train --out_dir {shlex.quote(str(out_dir))} --resume {resume}"


def build_tokenizer(cfg: TrainRunConfig, resume_dir: Path | None, is_main: bool,
                    share: Callable[[Any], Any]) -> Tokenizer:
    """The run's tokenizer: the one saved in ``resume_dir`` (the run being resumed), the init_from model's (as its
    family finds it), or a new one. ``share(x)`` gives every process rank 0's ``x``: a BPE tokenizer is trained once,
    by rank 0, and handed to the others in memory (nothing is written into out_dir before the run's checks pass)."""
    if resume_dir is not None and (tokenizer := load_tokenizer(resume_dir / rundir.TOKENIZER_DIR)) is not None:
        return tokenizer
    if cfg.init_from and (tokenizer := init_from(cfg.init_from).tokenizer()) is not None:
        return tokenizer
    if cfg.data.format == "text" and is_prepared(cfg.data.source):
        return _prepared_tokenizer(cfg)
    if (named := named_tokenizer(cfg.data.tokenizer)) is not None:  # byte, or a pretrained tokenizer's files
        return named
    if cfg.data.format == "sft":
        raise ConfigError("data.tokenizer='bpe' is invalid with data.format='sft': fine-tune a pretrained model "
                          "with --init_from DIR (its tokenizer is used) or use data.tokenizer='byte'")
    trained = None
    if is_main:
        trained = train_bpe(load_corpus(cfg.data.source, "train", held_out=cfg.data.held_out()),
                            vocab_size=cfg.data.bpe_vocab_size)
    return share(trained)


def _prepared_tokenizer(cfg: TrainRunConfig) -> Tokenizer:
    """The tokenizer saved beside prepared shards; data.tokenizer may only name the same one (or stay 'byte')."""
    tokenizer = prepared_tokenizer(cfg.data.source)
    asked = cfg.data.tokenizer
    named = named_tokenizer(asked) if asked not in ("bpe", "byte") else None
    if asked == "bpe" or (named is not None and named.fingerprint != tokenizer.fingerprint):
        raise ConfigError(f"data.tokenizer={asked!r} differs from the tokenizer {cfg.data.source!r} was prepared with; "
                          "leave data.tokenizer out (the shards' own is used) or prepare the data with this one")
    return tokenizer


def build_model(cfg: TrainRunConfig, tokenizer: Tokenizer, device: torch.device) -> AnyLM:
    """A fresh model of the default family from [model], or the one init_from names, as its family's spec loads it
    for training (a source in float32 with the family's options section)."""
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every process and every rerun
    if not cfg.init_from:
        return families.DEFAULT.build(cfg.model.resolve(tokenizer.vocab_size)).to(device)
    start = init_from(cfg.init_from)
    model = start.model(cfg.family_options(start.family), cfg.model.feedback)
    if model.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"init_from={cfg.init_from!r} has vocab_size={model.config.vocab_size} but the "
                          f"tokenizer has {tokenizer.vocab_size} tokens; {start.vocab_fix()}")
    return model.to(device)


@dataclass
class RunData:
    """What ``build_batches`` gives a run: its batches, its validation (or None) and the tokens of each split."""

    batch_fn: BatchFn
    eval_fn: Callable | None
    train_tokens: int
    validation_tokens: int


def build_batches(cfg: TrainRunConfig, tokenizer: Tokenizer, world_size: int) -> RunData:
    """The train batches and validation of the data section."""
    t = cfg.train
    rows = t.batch_size * t.grad_accum * world_size  # global rows of one optimizer step
    if cfg.data.format == "sft":
        pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        examples = load_sft(cfg.data.source, tokenizer, t.seq_len)
        train = SFTBatches(examples, rows, pad, seed=t.seed,
                           curriculum_steps=round(cfg.data.curriculum * t.total_steps(world_size)))
        evaluate, val_tokens = None, 0
        if cfg.data.validation_source:
            held_out = load_sft(cfg.data.validation_source, tokenizer, t.seq_len)
            val = SFTBatches(held_out, t.batch_size, pad, seed=t.seed + 1)
            evaluate = loss_eval(val.batch, t.eval_batches, cfg.eval_passes, separator=_separator(t, tokenizer))
            val_tokens = _sft_tokens(held_out)
        return RunData(train.batch, evaluate, _sft_tokens(examples), val_tokens)
    if is_prepared(cfg.data.source):  # token shards: memory maps, the held-out split from the index
        train_split = load_prepared(cfg.data.source, "train", tokenizer)
        val_split = load_prepared(cfg.data.source, "validation", tokenizer)
        if not val_split.n_tokens:  # prepared with val_fraction=0
            return RunData(TokenBatches(train_split.tokens, t.seq_len, rows, seed=t.seed).batch, None,
                           train_split.n_tokens, 0)
    else:
        held_out = cfg.data.held_out()
        train_split = load_tokens(cfg.data.source, "train", tokenizer, held_out=held_out)
        val_split = load_tokens(cfg.data.source, "validation", tokenizer, held_out=held_out)
    train = TokenBatches(train_split.tokens, t.seq_len, rows, seed=t.seed)
    val = TokenBatches(val_split.tokens, t.seq_len, t.batch_size, seed=t.seed + 1)
    losses = loss_eval(val.batch, t.eval_batches, cfg.eval_passes, separator=_separator(t, tokenizer))

    def evaluate(model: AnyLM, step: int) -> dict[str, float]:
        results = losses(model, step)
        # Bits per byte compare across tokenizers: nats/token x tokens/byte of the split / ln 2.
        bpb = {k.replace("val_loss", "val_bpb"): val_split.bits_per_byte(v) for k, v in results.items()}
        return {**results, **bpb}

    return RunData(train.batch, evaluate, train_split.n_tokens, val_split.n_tokens)


def _separator(train: Any, tokenizer: Tokenizer) -> int | None:
    """The end-of-text id at which validation restarts the recurrence (``train.restart_at_documents``), or None."""
    return tokenizer.eos_id if train.restart_at_documents else None


def _sft_tokens(examples: Any) -> int:
    return sum(len(example.input_ids) for example in examples)


def run_train(cfg: TrainRunConfig, progress: bool = True, announce: bool = False) -> TrainResult:
    """Train as configured (DDP or FSDP when launched by torchrun); returns where the final model is.

    Nothing is written into ``out_dir`` before the run's checks have passed (options, data, model, checkpoints
    there). ``announce``: print what the run trains (parameters, device, threads, data) before its first step, and
    on Ctrl-C finish the step, save a checkpoint and print the command that resumes it (``fullband train``)."""
    start = time.perf_counter()
    env = init_distributed()
    try:
        device = resolve_device(cfg.device, env.local_rank)
        out_dir = Path(cfg.out_dir)
        resuming = check_run_directory(cfg)
        if cfg.train.wandb_project and importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"train.wandb_project={cfg.train.wandb_project!r} needs the wandb package: "
                              f"{install_hint('wandb')} (or leave train.wandb_project unset)")

        def barrier() -> None:
            if env.world_size > 1:
                torch.distributed.barrier()

        def share(value: Any) -> Any:  # rank 0's value on every process
            if env.world_size == 1:
                return value
            holder = [value]
            torch.distributed.broadcast_object_list(holder, src=0)
            return holder[0]

        tokenizer = build_tokenizer(cfg, out_dir if resuming else None, env.is_main, share)
        model = build_model(cfg, tokenizer, device)
        if env.world_size > 1 and cfg.train.parallel == "fsdp" and not model.shardable:
            raise ConfigError(f"train.parallel='fsdp' is invalid for {families.family_named(model.family).description} "
                              f"(init_from={cfg.init_from!r}): FSDP shards native models only; use 'ddp'")
        if env.is_main:  # data caches (download, tokenization) are filled once, then read by everyone
            data = build_batches(cfg, tokenizer, env.world_size)
        barrier()
        if not env.is_main:
            data = build_batches(cfg, tokenizer, env.world_size)
        trainer = Trainer(
            model, cfg.train, cfg.optim, cfg.schedule, data.batch_fn, data.eval_fn, out_dir,
            rank=env.rank, world_size=env.world_size, progress=progress and env.is_main,
            run_config=_run_config(cfg, tokenizer), write_extra=tokenizer.save, separator=tokenizer.eos_id,
        )
        if resuming:
            check_resume(cfg, trainer, env.world_size)
        if announce and env.is_main:
            print(_summary(cfg, model, tokenizer, data, device, env.world_size), flush=True)
        # The run's checks have passed: from here on it writes into out_dir.
        if env.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
            # The settings the run trains with (a resumed run's are its own: fullband.training.resume), written
            # atomically and saying resume=false, so that `--config` with them trains the run again from scratch.
            save_resolved_config(dataclasses.replace(cfg, resume="false"), out_dir / rundir.SETTINGS)
            tokenizer.save(out_dir / rundir.TOKENIZER_DIR)
        barrier()
        if env.world_size > 1:
            (wrap_fsdp if cfg.train.parallel == "fsdp" else wrap_ddp)(trainer)
        try:
            state = trainer.fit(resume=cfg.resume, stop_on_interrupt=announce and env.world_size == 1)
        except KeyboardInterrupt:
            if announce and env.is_main:
                _say_how_to_resume(out_dir)
            raise
        validation: dict[str, float] = {}
        if data.eval_fn is not None and cfg.train.eval_every:
            validation = _last_eval(out_dir)  # the Trainer validated (and logged) at the last step
        elif data.eval_fn is not None:  # no periodic validation: still report one at the end (not logged)
            model.eval()
            with torch.no_grad():
                validation = data.eval_fn(model, state.step)
        model_dir = out_dir / rundir.MODEL_DIR
        save_model(model, model_dir, env.rank)  # under FSDP every process takes part in gathering the weights
        if env.is_main:
            tokenizer.save(model_dir)
            _record_training(model_dir, cfg, state)
        last = trainer.last_record
        # Free DDP's reducer while the process group is still alive and every process is here: destroyed after
        # the group (or after a peer has exited) its gloo destructor can wait forever.
        trainer.model = trainer.raw_model
        del trainer
        gc.collect()
        barrier()
        return TrainResult(out_dir, model_dir, state.step, state.tokens, state.token_equiv_compute, state.loss,
                           validation, time.perf_counter() - start, state.train_seconds,
                           last["pass_losses"] if last is not None else None,
                           last.get("mfu") if last is not None else None)
    finally:
        cleanup_distributed()


def _summary(cfg: TrainRunConfig, model: AnyLM, tokenizer: Tokenizer, data: RunData, device: torch.device,
             world_size: int) -> str:
    """What the run trains, before its first step: the model, where, on what data, for how long."""
    c, t = model.config, cfg.train
    feedback = "full-bandwidth (latent feedback)" if c.feedback else "baseline (no feedback)"
    sized = hasattr(c, "d_model") and hasattr(c, "n_layers")
    size = f", d_model {c.d_model}, {plural(c.n_layers, 'layer')}" if sized else ""
    processes = f" x {world_size} processes" if world_size > 1 else ""
    held_out = f", {data.validation_tokens:,} validation tokens" if data.eval_fn is not None else ", no validation"
    every = f"every {t.checkpoint_every} steps and " if t.checkpoint_every else ""
    return "\n".join([
        f"model: {model.num_parameters():,} parameters, {feedback}{size}",
        f"device: {device}, {plural(torch.get_num_threads(), 'thread')}{processes}",
        f"data: {cfg.data.source} ({tokenizer.config()['type']} tokenizer, {tokenizer.vocab_size:,} ids): "
        f"{data.train_tokens:,} training tokens{held_out}",
        f"run: {t.total_steps(world_size):,} steps of {t.tokens_per_step(world_size):,} tokens; checkpoints "
        f"{every}at the end in {cfg.out_dir}",
    ])


def _say_how_to_resume(out_dir: Path) -> None:
    """After Ctrl-C: the last complete checkpoint and the command that continues from it."""
    last = latest_good_checkpoint(out_dir)
    if last is None:
        print(f"\ninterrupted before the first checkpoint: {out_dir} holds nothing to resume", flush=True)
    else:
        print(f"\ninterrupted: the last checkpoint is {last}; continue the run with:\n  {resume_command(out_dir)}",
              flush=True)


def _record_training(model_dir: Path, cfg: TrainRunConfig, state: Any) -> None:
    """The model card states what this run trained on (tokens, steps, data, starting point)."""
    config = json.loads((model_dir / rundir.MODEL_CONFIG).read_text())
    hub.write_model_card(model_dir, config, {
        "tokens": state.tokens, "token_equiv_compute": state.token_equiv_compute, "steps": state.step,
        "data": cfg.data.source, "data_format": cfg.data.format, "init_from": cfg.init_from,
    })


def _run_config(cfg: TrainRunConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    resolved = config_to_dict(cfg)
    resolved["tokenizer"] = tokenizer.config()
    resolved["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))
    return {k: v for k, v in resolved.items() if k not in ("model", "train", "optim", "schedule")}


def _last_eval(out_dir: Path) -> dict[str, float]:
    last: dict[str, float] = {}
    path = out_dir / rundir.METRICS
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "eval":
                # a non-finite loss is written as null (fullband.files): read it back as NaN
                last = {k: float("nan") if v is None else v for k, v in record.items() if k.startswith("val_")}
    return last
