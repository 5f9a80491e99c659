"""``fullband train``: wire a run config to data, tokenizer, model and Trainer (one process or torchrun).

    out_dir/
      config.toml        the resolved configuration (re-run with ``--config out_dir/config.toml``)
      tokenizer/         the tokenizer (also inside every checkpoint and the final model)
      metrics.jsonl      one record per logged step and per validation
      checkpoints/       step-NNNNNNN/ (atomic, verified, last N kept)
      model/             the final model: ``fullband.model_io.load_any`` / ``fullband generate``

``init_from`` names a model directory of any model family (``fullband.integrations.families``), which continues
training it, or a source a family builds from: ``hf:PATH`` gives the transformers causal LM saved in the local
directory PATH latent feedback (its options section, [retrofit]) and tokenizes with its own tokenizer
(``AutoTokenizer.from_pretrained(PATH)``, as a :class:`~fullband.data.TransformersTokenizer`). Checkpoints and
``model/`` then hold that family's files and the tokenizer's own. Only families that say so are sharded by FSDP.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fullband.config import HF_PREFIX, ConfigError
from fullband.configio import config_to_dict, save_resolved_config
from fullband.data import (
    ByteTokenizer,
    DataError,
    SFTBatches,
    TokenBatches,
    Tokenizer,
    TransformersTokenizer,
    is_prepared,
    load_corpus,
    load_prepared,
    load_pretrained_tokenizer,
    load_sft,
    load_tokenizer,
    load_tokens,
    prepared_tokenizer,
    train_bpe,
)
from fullband.devices import resolve_device
from fullband.integrations import families
from fullband.model import hub
from fullband.model.serialization import CheckpointError
from fullband.model_io import AnyLM, build_from_source, load_any, model_class
from fullband.training.checkpoint import save_model
from fullband.training.config import TrainRunConfig
from fullband.training.distributed import cleanup_distributed, init_distributed, wrap_ddp, wrap_fsdp
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
    final_loss: float | None
    validation: dict[str, float]
    seconds: float  # wall time of this invocation
    train_seconds: float  # time in training steps and validation, summed over every invocation of the run


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"out_dir={str(directory)!r} is not writable ({err.strerror}); pick another "
                          "--out_dir") from None


def hf_init_path(cfg: TrainRunConfig) -> Path | None:
    """PATH of ``init_from="hf:PATH"`` (checked to be a directory), or None for any other init_from."""
    if not (cfg.init_from or "").startswith(HF_PREFIX):
        return None
    path = Path(cfg.init_from[len(HF_PREFIX):]).expanduser()
    if not path.is_dir():
        raise ConfigError(f"init_from={cfg.init_from!r} is invalid: {str(path)!r} is not a directory; give the "
                          "local directory a transformers causal LM and its tokenizer were saved to "
                          "(save_pretrained)")
    return path


def build_tokenizer(cfg: TrainRunConfig, out_dir: Path, is_main: bool, barrier: Callable[[], None]) -> Tokenizer:
    """The run's tokenizer: the one saved in out_dir (resume), the init_from model's, or a new one."""
    hf_path = hf_init_path(cfg)
    init_dir = Path(cfg.init_from) if cfg.init_from and hf_path is None else None
    for directory in (out_dir / "tokenizer", init_dir):
        if directory is not None and (tokenizer := load_tokenizer(directory)) is not None:
            return tokenizer
    if hf_path is not None:
        try:
            return TransformersTokenizer.from_pretrained(hf_path)
        except DataError as err:
            raise ConfigError(f"init_from={cfg.init_from!r}: {err} (save the model's tokenizer into the same "
                              "directory: tokenizer.save_pretrained(PATH))") from None
    if cfg.data.format == "text" and is_prepared(cfg.data.source):
        return _prepared_tokenizer(cfg)
    if cfg.data.tokenizer.startswith(HF_PREFIX):
        return load_pretrained_tokenizer(cfg.data.tokenizer[len(HF_PREFIX):])
    if cfg.data.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.data.format == "sft":
        raise ConfigError("data.tokenizer='bpe' is invalid with data.format='sft': fine-tune a pretrained model "
                          "with --init_from DIR (its tokenizer is used) or use data.tokenizer='byte'")
    # BPE is trained once, by rank 0, on the train split; the other processes load what it saved.
    if is_main:
        train_bpe(load_corpus(cfg.data.source, "train"), vocab_size=cfg.data.bpe_vocab_size).save(out_dir / "tokenizer")
    barrier()
    return load_tokenizer(out_dir / "tokenizer")


def _prepared_tokenizer(cfg: TrainRunConfig) -> Tokenizer:
    """The tokenizer saved beside prepared shards; data.tokenizer may only name the same one (or stay 'byte')."""
    tokenizer = prepared_tokenizer(cfg.data.source)
    asked = cfg.data.tokenizer
    if asked == "bpe" or (asked.startswith(HF_PREFIX) and load_pretrained_tokenizer(
            asked[len(HF_PREFIX):]).fingerprint != tokenizer.fingerprint):
        raise ConfigError(f"data.tokenizer={asked!r} differs from the tokenizer {cfg.data.source!r} was prepared with; "
                          "leave data.tokenizer out (the shards' own is used) or prepare the data with this one")
    return tokenizer


def build_model(cfg: TrainRunConfig, tokenizer: Tokenizer, device: torch.device) -> AnyLM:
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every process and every rerun
    hf_path = hf_init_path(cfg)
    if hf_path is not None:
        model = from_source(cfg)
    elif cfg.init_from:
        family = families.family_of(cfg.init_from)
        if family is families.DEFAULT:
            _refuse_transformers_dir(cfg.init_from)
        dtype = model_class(family, repr(cfg.init_from)).train_dtype
        model = load_any(cfg.init_from, dtype=dtype, feedback=cfg.model.feedback).train()
    else:
        model = families.new_model(cfg.model.resolve(tokenizer.vocab_size))  # the default family's: [model]
    if cfg.init_from and model.config.vocab_size < tokenizer.vocab_size:
        fix = ("resize the model's embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer))) and "
               "save it again" if hf_path is not None else "use the checkpoint's own tokenizer")
        raise ConfigError(f"init_from={cfg.init_from!r} has vocab_size={model.config.vocab_size} but the "
                          f"tokenizer has {tokenizer.vocab_size} tokens; {fix}")
    return model.to(device)


def _refuse_transformers_dir(init_from: str) -> None:
    """A plain init_from naming a transformers checkpoint: say to give it latent feedback (hf:PATH) rather than
    fail on its config.json."""
    try:
        saved = json.loads((Path(init_from) / "config.json").read_text())
    except (OSError, ValueError):
        return  # not readable here: the family's loader gives its own message
    model_type = saved.get("model_type") if isinstance(saved, dict) else None
    if model_type and model_type not in families.FAMILIES:
        raise ConfigError(f"init_from={init_from!r} is a transformers {model_type!r} model, not a fullband one; "
                          f"use init_from='hf:{init_from}' to give it latent feedback")


def from_source(cfg: TrainRunConfig) -> AnyLM:
    """The model ``init_from`` builds from a source (``hf:PATH``), in float32, with its family's options section;
    its problems as ConfigErrors naming ``init_from`` or the option."""
    family = families.source_family(cfg.init_from)
    try:
        model = build_from_source(cfg.init_from, cfg.family_options(family), torch.float32,
                                  f"init_from={cfg.init_from!r}")
        return model.train()
    except ConfigError:
        raise
    except CheckpointError as err:
        raise ConfigError(str(err)) from None
    except (ValueError, NotImplementedError) as err:
        raise ConfigError(f"init_from={cfg.init_from!r}: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def build_batches(cfg: TrainRunConfig, tokenizer: Tokenizer, world_size: int) -> tuple[BatchFn, Callable | None]:
    """(train batch_fn, eval_fn) for the data section."""
    t = cfg.train
    rows = t.batch_size * t.grad_accum * world_size  # global rows of one optimizer step
    if cfg.data.format == "sft":
        pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        train = SFTBatches(load_sft(cfg.data.source, tokenizer, t.seq_len), rows, pad, seed=t.seed,
                           curriculum_steps=round(cfg.data.curriculum * t.total_steps(world_size)))
        evaluate = None
        if cfg.data.validation_source:
            val = SFTBatches(load_sft(cfg.data.validation_source, tokenizer, t.seq_len), t.batch_size, pad,
                             seed=t.seed + 1)
            evaluate = loss_eval(val.batch, t.eval_batches, cfg.eval_passes)
        return train.batch, evaluate
    if is_prepared(cfg.data.source):  # token shards: memory maps, the held-out split from the index
        train_split = load_prepared(cfg.data.source, "train", tokenizer)
        val_split = load_prepared(cfg.data.source, "validation", tokenizer)
        if not val_split.n_tokens:  # prepared with val_fraction=0
            return TokenBatches(train_split.tokens, t.seq_len, rows, seed=t.seed).batch, None
    else:
        train_split = load_tokens(cfg.data.source, "train", tokenizer)
        val_split = load_tokens(cfg.data.source, "validation", tokenizer)
    train = TokenBatches(train_split.tokens, t.seq_len, rows, seed=t.seed)
    val = TokenBatches(val_split.tokens, t.seq_len, t.batch_size, seed=t.seed + 1)
    losses = loss_eval(val.batch, t.eval_batches, cfg.eval_passes)

    def evaluate(model: AnyLM, step: int) -> dict[str, float]:
        results = losses(model, step)
        # Bits per byte compare across tokenizers: nats/token x tokens/byte of the split / ln 2.
        bpb = {k.replace("val_loss", "val_bpb"): val_split.bits_per_byte(v) for k, v in results.items()}
        return {**results, **bpb}

    return train.batch, evaluate


def run_train(cfg: TrainRunConfig, progress: bool = True) -> TrainResult:
    """Train as configured (DDP or FSDP when launched by torchrun); returns where the final model is."""
    return _run_train(cfg, progress)


def _run_train(cfg: TrainRunConfig, progress: bool) -> TrainResult:
    start = time.perf_counter()
    env = init_distributed()
    try:
        device = resolve_device(cfg.device, env.local_rank)
        out_dir = Path(cfg.out_dir)
        if env.is_main:
            check_writable(out_dir)
        if cfg.train.wandb_project and importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"train.wandb_project={cfg.train.wandb_project!r} needs the wandb package: pip install "
                              "'fullband[wandb]' (or leave train.wandb_project unset)")

        def barrier() -> None:
            if env.world_size > 1:
                torch.distributed.barrier()

        tokenizer = build_tokenizer(cfg, out_dir, env.is_main, barrier)
        model = build_model(cfg, tokenizer, device)
        if env.world_size > 1 and cfg.train.parallel == "fsdp" and not model.shardable:
            raise ConfigError(f"train.parallel='fsdp' is invalid for {families.family_named(model.family).description} "
                              f"(init_from={cfg.init_from!r}): FSDP shards native models only; use 'ddp'")
        if env.is_main:  # data caches (download, tokenization) are filled once, then read by everyone
            batch_fn, eval_fn = build_batches(cfg, tokenizer, env.world_size)
        barrier()
        if not env.is_main:
            batch_fn, eval_fn = build_batches(cfg, tokenizer, env.world_size)
        if env.is_main:
            save_resolved_config(cfg, out_dir / "config.toml")
            tokenizer.save(out_dir / "tokenizer")
        trainer = Trainer(
            model, cfg.train, cfg.optim, cfg.schedule, batch_fn, eval_fn, out_dir,
            rank=env.rank, world_size=env.world_size, progress=progress and env.is_main,
            run_config=_run_config(cfg, tokenizer), write_extra=tokenizer.save,
        )
        if env.world_size > 1:
            (wrap_fsdp if cfg.train.parallel == "fsdp" else wrap_ddp)(trainer)
        state = trainer.fit(resume=cfg.resume)
        validation: dict[str, float] = {}
        if eval_fn is not None and cfg.train.eval_every:
            validation = _last_eval(out_dir)  # the Trainer validated (and logged) at the last step
        elif eval_fn is not None:  # no periodic validation: still report one at the end (not logged)
            model.eval()
            with torch.no_grad():
                validation = eval_fn(model, state.step)
        model_dir = out_dir / "model"
        save_model(model, model_dir, env.rank)  # under FSDP every process takes part in gathering the weights
        if env.is_main:
            tokenizer.save(model_dir)
            _record_training(model_dir, cfg, state)
        # Free DDP's reducer while the process group is still alive and every process is here: destroyed after
        # the group (or after a peer has exited) its gloo destructor can wait forever.
        trainer.model = trainer.raw_model
        del trainer
        gc.collect()
        barrier()
        return TrainResult(out_dir, model_dir, state.step, state.tokens, state.token_equiv_compute, state.loss,
                           validation, time.perf_counter() - start, state.train_seconds)
    finally:
        cleanup_distributed()


def _record_training(model_dir: Path, cfg: TrainRunConfig, state: Any) -> None:
    """The model card states what this run trained on (tokens, steps, data, starting point)."""
    config = json.loads((model_dir / "config.json").read_text())
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
    path = out_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "eval":
                last = {k: v for k, v in record.items() if k.startswith("val_")}
    return last
