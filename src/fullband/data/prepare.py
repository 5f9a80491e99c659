"""``fullband prepare``: tokenize a corpus once into memory-mapped token shards, the way nanoGPT and nanochat keep
their data.

    out_dir/
      index.json            written last: dtype, vocabulary, tokenizer, every shard's token/byte/document counts
      tokenizer/            the tokenizer the shards were made with (training loads it from here)
      val_000000.bin ...    the held-out validation split (the first val_fraction of the input)
      train_000000.bin ...  the training split
      progress.json         while unfinished: the shards done so far and the next chunk to tokenize

Each ``.bin`` is a flat array of token ids (uint16 when the vocabulary fits, else uint32; no header), documents
joined with the tokenizer's eos between them, so ``np.memmap(path, dtype)`` reads it. Concatenating a split's shards
gives exactly ``encode_documents`` of its documents. Chunks are tokenized by ``workers`` processes and written in
input order; a shard is written atomically once full, then ``progress.json`` is updated, so a prepare killed at any
point and run again with the same options continues after the last complete shard and ends with the same files.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fullband import rundir
from fullband.config import HF_PREFIX
from fullband.data.config import INDEX_FILE, PROGRESS_FILE, SHARDS_FORMAT, TOKENIZER_DIR, PrepareConfig
from fullband.data.errors import DataError
from fullband.data.prepare_inputs import (
    Chunk,
    Encoded,
    dataset_chunks,
    encode_chunk,
    file_chunks,
    input_files,
    open_dataset,
)
from fullband.data.tokenizer import Tokenizer, load_tokenizer, named_tokenizer
from fullband.files import write_file, write_json

FILE_PREFIX = {"validation": "val", "train": "train"}


def resolve_tokenizer(spec: str) -> Tokenizer:
    """``byte``, ``hf:PATH`` (a tokenizer.json or transformers tokenizer directory) or a saved tokenizer directory."""
    if (named := named_tokenizer(spec)) is not None:
        return named
    if spec == "bpe":
        raise DataError(f"tokenizer='bpe' is trained by fullband train; for prepare give byte, {HF_PREFIX}PATH, or "
                        "the tokenizer directory of a run that trained one (runs/x/tokenizer)")
    tokenizer = load_tokenizer(Path(spec).expanduser()) if Path(spec).expanduser().is_dir() else None
    if tokenizer is None:
        raise DataError(f"tokenizer={spec!r}: not byte, {HF_PREFIX}PATH or a directory holding a saved tokenizer")
    return tokenizer


def shard_dtype(setting: str, vocab_size: int) -> np.dtype:
    if setting == "auto":
        return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    dtype = np.dtype(setting)
    if vocab_size > int(np.iinfo(dtype).max) + 1:
        raise DataError(f"dtype={setting!r} holds ids up to {np.iinfo(dtype).max}, but the tokenizer's vocabulary "
                        f"has {vocab_size} tokens; use --dtype uint32 (or auto)")
    return dtype


def _plan(cfg: PrepareConfig) -> tuple[Callable[[], Iterator[Chunk]], int, dict[str, Any], str]:
    """(a function giving the chunks in order, progress total, what identifies the input, progress unit)."""
    if cfg.input.startswith(HF_PREFIX):
        target = cfg.input[len(HF_PREFIX):]
        if not target:
            raise DataError(f"input={HF_PREFIX!r} needs a dataset name or path, e.g. {HF_PREFIX}./my_dataset")
        data = open_dataset(target, cfg.hf_config, cfg.split, cfg.field, cfg.val_fraction)
        source = {"dataset": target, "config": cfg.hf_config, "split": cfg.split, "rows": data.n_rows}
        return (lambda: dataset_chunks(data, cfg.chunk_bytes, cfg.val_fraction, cfg.field)), data.n_rows or 0, \
            source, "rows"
    root = Path(cfg.input).expanduser()
    files = input_files(root)
    base = root if root.is_dir() else root.parent
    source = {"path": str(root.resolve()),
              "files": [[f.relative_to(base).as_posix(), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
    total = sum(f.stat().st_size for f in files)
    return (lambda: file_chunks(files, cfg.chunk_bytes, cfg.val_fraction, cfg.field)), total, source, "B"


# ------------------------------------------------------------------------------------ worker processes

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Tokenizer, dtype: np.dtype) -> None:
    _WORKER.update(tokenizer=tokenizer, dtype=dtype)


def _encode(chunk: Chunk) -> Encoded:
    return encode_chunk(chunk, _WORKER["tokenizer"], _WORKER["dtype"])


def _encoded(chunks: Iterator[Chunk], workers: int, tokenizer: Tokenizer, dtype: np.dtype) -> Iterator[Encoded]:
    """Tokenized chunks in input order; at most 2 x workers chunks in flight (bounded memory on any input size)."""
    if workers <= 1:
        for chunk in chunks:
            yield encode_chunk(chunk, tokenizer, dtype)
        return
    # Each process tokenizes one chunk at a time; the Rust tokenizers' own thread pool would oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    context = multiprocessing.get_context("spawn")  # fork after torch or tokenizers threads started can deadlock
    with context.Pool(workers, initializer=_init_worker, initargs=(tokenizer, dtype)) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ------------------------------------------------------------------------------------ the command


def _settings(cfg: PrepareConfig, tokenizer: Tokenizer, dtype: np.dtype, source: dict[str, Any]) -> dict[str, Any]:
    """Everything the output depends on: a rerun resumes only when these are equal."""
    return {"input": source, "field": cfg.field, "val_fraction": cfg.val_fraction, "shard_tokens": cfg.shard_tokens,
            "chunk_bytes": cfg.chunk_bytes, "dtype": dtype.name, "tokenizer_fingerprint": tokenizer.fingerprint}


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _start(out: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The progress to continue from (None: the output is already complete); refuses a foreign out_dir."""
    index = _read_json(out / INDEX_FILE)
    if index is not None:
        if index.get("settings") != settings:
            raise DataError(f"{out} already holds shards prepared from other input or options; use another --out_dir "
                            "or delete it")
        return None
    progress = _read_json(out / PROGRESS_FILE)
    if progress is not None and progress.get("settings") != settings:
        raise DataError(f"{out} holds an unfinished prepare of other input or options (its {PROGRESS_FILE}): rerun "
                        f"that command to finish it, remove the directory to start again (rm -r {out}), or use "
                        "another --out_dir")
    if progress is None and out.is_dir() and any(p.name != TOKENIZER_DIR for p in out.iterdir()):
        raise DataError(f"out_dir {str(out)!r} is not empty; give a new or empty directory for the shards")
    for stale in out.glob(".*.tmp") if out.is_dir() else []:  # a shard being written when a run was killed
        stale.unlink()
    if progress is not None:
        for shard in progress["shards"]:
            path = out / shard["file"]
            if not path.is_file() or path.stat().st_size != shard["tokens"] * np.dtype(settings["dtype"]).itemsize:
                raise DataError(f"{path} is missing or damaged; delete {out} and prepare again")
    return progress or {"settings": settings, "shards": [], "next_chunk": 0}


def prepare_shards(cfg: PrepareConfig) -> dict[str, Any]:
    """Tokenize ``cfg.input`` into shards in ``cfg.out_dir`` (resuming an unfinished run there); returns the index
    plus ``seconds`` and ``input_bytes`` (bytes or rows read in this call)."""
    started_at = time.perf_counter()
    tokenizer = resolve_tokenizer(cfg.tokenizer)
    dtype = shard_dtype(cfg.dtype, tokenizer.vocab_size)
    make_chunks, total, source, unit = _plan(cfg)
    out = Path(cfg.out_dir).expanduser()
    settings = _settings(cfg, tokenizer, dtype, source)
    created = not out.exists()
    progress = _start(out, settings)
    if progress is None:
        return {**_read_json(out / INDEX_FILE), "seconds": 0.0, "input_bytes": 0, "already_done": True}
    try:
        index, read = _prepare(cfg, out, tokenizer, dtype, make_chunks, total, unit, settings, progress)
    except ValueError:  # DataError is one
        # The input is at fault (not UTF-8, not JSON, no such field, no text): the same command can never finish
        # this prepare, so nothing of it is kept to block the rerun once the input is fixed. An interrupt, a kill or
        # a full disk keep it: the same command continues from the last shard.
        _remove_unfinished(out, progress["shards"], created)
        raise
    return {**index, "seconds": time.perf_counter() - started_at, "input_bytes": read if unit == "B" else 0,
            "already_done": False}


def _remove_unfinished(out: Path, shards: list[dict[str, Any]], created: bool) -> None:
    """Delete what an unfinished prepare wrote in ``out`` (and ``out`` itself when it made it and it is empty)."""
    import shutil

    for path in [out / PROGRESS_FILE, *(out / r["file"] for r in shards), *out.glob(".*.tmp")]:
        path.unlink(missing_ok=True)
    shutil.rmtree(out / TOKENIZER_DIR, ignore_errors=True)
    if created and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _prepare(cfg: PrepareConfig, out: Path, tokenizer: Tokenizer, dtype: np.dtype,
             make_chunks: Callable[[], Iterator[Chunk]], total: int, unit: str, settings: dict[str, Any],
             progress: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Tokenize what ``progress`` has not done yet into shards and write the index; (the index, units read)."""
    from tqdm import tqdm

    tokenizer.save(out / TOKENIZER_DIR)
    # before any shard: a rerun always knows the directory is ours
    write_json(out / PROGRESS_FILE, progress, sort_keys=True)
    shards: list[dict[str, Any]] = progress["shards"]
    begun = {s: any(r["split"] == s and r["tokens"] for r in shards) for s in FILE_PREFIX}
    workers = cfg.workers or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    bar = tqdm(total=total or None, unit=unit, unit_scale=True, desc="prepare", disable=not cfg.progress)
    read = [0]  # bytes (or rows) tokenized in this call

    def todo() -> Iterator[Chunk]:
        for chunk in make_chunks():
            if chunk.index < progress["next_chunk"]:
                bar.update(chunk.size)
            else:
                yield chunk

    results = _Peekable(_encoded(todo(), workers or 1, tokenizer, dtype))
    with bar:
        while results.peek() is not None:
            split = results.peek().split
            number = sum(r["split"] == split for r in shards)
            record = {"split": split, "file": f"{FILE_PREFIX[split]}_{number:06d}.bin", "tokens": 0, "bytes": 0,
                      "docs": 0}
            last = [progress["next_chunk"] - 1]

            def write(f: Any, split: str = split, record: dict = record, last: list = last) -> None:
                while (e := results.peek()) is not None and e.split == split and record["tokens"] < cfg.shard_tokens:
                    next(results)
                    tokens = e.tokens[1:] if e.leads_with_eos and not begun[split] else e.tokens
                    begun[split] = begun[split] or tokens.size > 0
                    f.write(tokens.tobytes())
                    record["tokens"] += int(tokens.size)
                    record["bytes"] += e.n_bytes
                    record["docs"] += e.n_docs
                    last[0] = e.index
                    read[0] += e.size
                    bar.update(e.size)

            write_file(out / record["file"], write)
            if record["tokens"]:
                shards.append(record)
            else:  # chunks that held no text: nothing to keep
                (out / record["file"]).unlink()
            progress["next_chunk"] = last[0] + 1
            write_json(out / PROGRESS_FILE, progress, sort_keys=True)
    index = _index(shards, tokenizer, dtype, settings)
    if not index["splits"]["train"]["tokens"]:
        raise DataError(f"the train split of {cfg.input!r} is empty (all of it went to validation or it has no text); "
                        "lower --val_fraction or give more text")
    write_json(out / INDEX_FILE, index, sort_keys=True)  # last: its presence means the shards are complete
    (out / PROGRESS_FILE).unlink(missing_ok=True)
    return index, read[0]


def _index(shards: list[dict[str, Any]], tokenizer: Tokenizer, dtype: np.dtype, settings: dict) -> dict[str, Any]:
    splits = {}
    for split in ("train", "validation"):
        mine = [{k: v for k, v in r.items() if k != "split"} for r in shards if r["split"] == split]
        splits[split] = {"tokens": sum(r["tokens"] for r in mine), "bytes": sum(r["bytes"] for r in mine),
                         "docs": sum(r["docs"] for r in mine), "shards": mine}
    return {"format": SHARDS_FORMAT, **rundir.stamped({
        "dtype": dtype.name, "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id,
        "tokenizer": tokenizer.config(), "tokenizer_dir": TOKENIZER_DIR, "splits": splits, "settings": settings})}


class _Peekable:
    """An iterator with one item of look-ahead (``peek`` gives None at the end)."""

    _END = object()

    def __init__(self, it: Iterator[Any]) -> None:
        self._it, self._next = it, self._END

    def peek(self) -> Any:
        if self._next is self._END:
            self._next = next(self._it, None)
        return self._next

    def __next__(self) -> Any:
        item = self.peek()
        self._next = self._END
        return item
