"""Token streams for language-model training: a split tokenized once into a cached flat array, and
deterministic batches drawn from it.

A split becomes one 1-D array: its documents' tokens joined with ``eos_id`` between documents. The
array is cached as ``<cache>/tokens/<source>/<split>-<key>.npy`` (uint16 when every id fits, else
uint32) and opened as a read-only memmap; ``key`` hashes the split's text and the tokenizer's
fingerprint, so an edited corpus or a different tokenizer can never hit a stale cache. A JSON file
next to it records the number of UTF-8 bytes of the raw text (eos not counted), which turns a loss in
nats per token into bits per byte, the tokenizer-independent figure to compare runs with.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fullband.data.cache import cache_dir
from fullband.data.corpus import load_corpus
from fullband.data.errors import DataError
from fullband.data.splits import HELD_OUT, normalize_split
from fullband.data.tokenizer import Tokenizer
from fullband.files import write_file, write_json


def bits_per_byte(nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
    """Mean loss ``nats_per_token`` over ``n_tokens`` tokens that encode ``n_bytes`` bytes, in bits per byte."""
    if n_bytes <= 0:
        raise DataError(f"bits_per_byte needs a positive byte count, got {n_bytes}")
    return nats_per_token * n_tokens / (n_bytes * math.log(2))


@dataclass(frozen=True)
class TokenSplit:
    """One tokenized split: the flat token array and what is needed to report bits per byte."""

    tokens: np.ndarray
    n_bytes: int
    n_docs: int
    path: Path | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def bits_per_byte(self, nats_per_token: float) -> float:
        return bits_per_byte(nats_per_token, self.n_tokens, self.n_bytes)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_documents(texts: Sequence[str], tokenizer: Tokenizer) -> np.ndarray:
    """Tokenize ``texts`` into one flat array with ``eos_id`` between documents."""
    dtype = token_dtype(tokenizer.vocab_size)
    parts: list[np.ndarray] = []
    for i, ids in enumerate(tokenizer.encode_batch(texts)):
        if i:
            parts.append(np.array([tokenizer.eos_id], dtype=dtype))
        parts.append(np.asarray(ids, dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def load_tokens(source: str | Path, split: str, tokenizer: Tokenizer, *, cache: str | Path | None = None,
                held_out: tuple[float, float] = HELD_OUT) -> TokenSplit:
    """The tokenized ``split`` of corpus ``source`` (any ``load_corpus`` source, split with ``held_out``), built once
    and cached.

    ``cache`` overrides the cache root (default: ``cache_dir()``).
    """
    split = normalize_split(split)
    texts = load_corpus(source, split, held_out)
    key = hashlib.sha256()
    for t in texts:  # length-prefixed so document boundaries are part of the key
        b = t.encode("utf-8")
        key.update(len(b).to_bytes(8, "little") + b)
    key.update(tokenizer.fingerprint.encode())
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(source)).name or str(source)).strip("._") or "corpus"
    path = Path(cache or cache_dir()) / "tokens" / slug / f"{split}-{key.hexdigest()[:16]}.npy"
    meta_path = path.with_suffix(".json")
    if not meta_path.is_file():  # the JSON is written last, so its presence means the .npy is complete
        tokens = encode_documents(texts, tokenizer)
        write_file(path, lambda f: np.save(f, tokens))
        write_json(
            meta_path,
            {
                "source": str(source),
                "split": split,
                "n_tokens": int(tokens.shape[0]),
                "n_docs": len(texts),
                "n_bytes": sum(len(t.encode("utf-8")) for t in texts),
                "dtype": tokens.dtype.name,
                "tokenizer": tokenizer.config(),
            },
            sort_keys=True,
        )
    meta = json.loads(meta_path.read_text())
    tokens = np.load(path, mmap_mode="r")
    return TokenSplit(tokens=tokens, n_bytes=meta["n_bytes"], n_docs=meta["n_docs"], path=path)


def _check_length(tokens: np.ndarray, seq_len: int) -> None:
    if seq_len < 1:
        raise DataError(f"seq_len must be positive, got {seq_len}")
    if tokens.ndim != 1 or tokens.shape[0] < seq_len + 1:
        raise DataError(
            f"need a 1-D token array of at least seq_len + 1 = {seq_len + 1} tokens, "
            f"got shape {tuple(tokens.shape)}; use a shorter seq_len or a larger split"
        )


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    """The contiguous part of a global batch of ``batch_size`` rows that ``rank`` trains on."""
    if world_size < 1 or batch_size % world_size:
        raise DataError(f"global batch_size {batch_size} is not divisible by world_size {world_size}")
    if not 0 <= rank < world_size:
        raise DataError(f"rank {rank} out of range for world_size {world_size}")
    local = batch_size // world_size
    return slice(rank * local, (rank + 1) * local)


class TokenBatches:
    """Random training windows, reproducible from ``(seed, step)`` alone.

    ``batch(step)`` draws the global batch's window starts from ``np.random.default_rng([seed, step])``,
    so resuming at any step, or changing the number of ranks, replays exactly the same data. Each
    rank takes its contiguous slice of the global batch (its own rows: no two ranks train on the same row).
    ``labels`` holds the same values as ``inputs`` (HF convention: the model shifts them internally), as a
    separate tensor.

    ``tokens`` is one array or a sequence of them (the shards of a prepared split, memory-mapped): a window lies
    inside one shard, and a start is drawn uniformly over all shards' possible starts, so one array and a
    one-element sequence give the same batches. Nothing is concatenated: memory stays that of the batch.
    """

    def __init__(self, tokens: np.ndarray | Sequence[np.ndarray], seq_len: int, batch_size: int,
                 seed: int = 0) -> None:
        parts = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
        if not parts:
            raise DataError("no tokens to draw batches from (an empty split)")
        _check_length(max(parts, key=len), seq_len)
        if batch_size < 1:
            raise DataError(f"batch_size must be positive, got {batch_size}")
        self.parts, self.seq_len, self.batch_size, self.seed = parts, seq_len, batch_size, seed
        # starts_before[i]: how many window starts the parts before part i hold
        self._starts = np.cumsum([0] + [max(0, len(p) - seq_len + 1) for p in parts])

    @property
    def tokens(self) -> np.ndarray:
        """The token array (the first part when there are several)."""
        return self.parts[0]

    def offsets(self, step: int) -> np.ndarray:
        """Start positions of the global batch's windows at ``step``, counted over all parts' possible starts."""
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, self.n_windows, size=self.batch_size)

    @property
    def n_windows(self) -> int:
        """How many windows (global starts) all parts hold together."""
        return int(self._starts[-1])

    def locate(self, starts: np.ndarray) -> list[tuple[int, int]]:
        """``(part, start)`` of each global start in ``starts`` (each in ``0..n_windows-1``): the window lies inside
        that part, and a part too short for one window is skipped."""
        starts = np.asarray(starts, dtype=np.int64)
        # side="right": a start equal to the count before part i belongs to part i (or to the next part that
        # has windows, when part i has none and so repeats that count).
        part = np.searchsorted(self._starts, starts, side="right") - 1
        return [(int(p), int(s - self._starts[p])) for p, s in zip(part, starts, strict=True)]

    def windows(self, step: int, rank: int = 0, world_size: int = 1) -> list[tuple[int, int]]:
        """``(part, start)`` of each window this rank trains on at ``step``."""
        return self.locate(self.offsets(step)[rank_slice(self.batch_size, rank, world_size)])

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)``, each LongTensor[batch_size // world_size, seq_len], for this rank."""
        rows = [np.asarray(self.parts[p][s : s + self.seq_len], dtype=np.int64)
                for p, s in self.windows(step, rank, world_size)]
        inputs = torch.from_numpy(np.stack(rows))
        return inputs, inputs.clone()


def eval_windows(
    tokens: np.ndarray, seq_len: int, max_windows: int | None = None, batch_size: int = 1
) -> Iterator[torch.Tensor]:
    """Non-overlapping consecutive windows for evaluation, as LongTensor[<=batch_size, seq_len] batches.

    With ``max_windows``, that many windows evenly spread over the split (not just its beginning, which
    would cover only the first document). A trailing partial window is dropped. Inside each window the
    first token is context only, so report bits per byte from the mean loss per predicted token.
    """
    _check_length(tokens, seq_len)
    if max_windows is not None and max_windows < 1:
        raise DataError(f"max_windows must be positive (or None for all), got {max_windows}")
    n = tokens.shape[0] // seq_len
    index = np.arange(n)
    if max_windows is not None and max_windows < n:
        index = np.unique(np.linspace(0, n - 1, num=max_windows).round().astype(np.int64))
    for i in range(0, len(index), batch_size):
        rows = [np.asarray(tokens[w * seq_len : (w + 1) * seq_len], dtype=np.int64) for w in index[i : i + batch_size]]
        yield torch.from_numpy(np.stack(rows))
