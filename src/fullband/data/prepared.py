"""Reading what ``fullband prepare`` wrote: a split's shards as read-only memory maps (never concatenated in memory),
checked against the index, with the counts bits per byte needs.

``--data.source DIR`` trains on such a directory (one with ``index.json``); its own tokenizer is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fullband import rundir
from fullband.data.config import INDEX_FILE, PROGRESS_FILE, SHARDS_FORMAT, TOKENIZER_DIR
from fullband.data.errors import DataError
from fullband.data.shards import TokenSplit, bits_per_byte, load_tokens
from fullband.data.splits import HELD_OUT, normalize_split
from fullband.data.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class ShardSplit:
    """One split of prepared shards: ``tokens`` is a tuple of memmaps, one per shard, in order (TokenBatches takes
    it as is). ``n_tokens`` counts eos separators, ``n_bytes`` only text, as :class:`~fullband.data.TokenSplit`."""

    tokens: tuple[np.ndarray, ...]
    n_tokens: int
    n_bytes: int
    n_docs: int

    def bits_per_byte(self, nats_per_token: float) -> float:
        return bits_per_byte(nats_per_token, self.n_tokens, self.n_bytes)


def is_prepared(source: str | Path) -> bool:
    """True when ``source`` is a directory ``fullband prepare`` finished (it has index.json); a directory with shard
    files but no index is an interrupted prepare: DataError saying to rerun it."""
    path = Path(source).expanduser()
    if not path.is_dir():
        return False
    if (path / INDEX_FILE).is_file():
        return _index(path).get("format") == SHARDS_FORMAT
    if (path / PROGRESS_FILE).is_file():
        raise DataError(f"{path} holds an unfinished fullband prepare (no {INDEX_FILE} yet); run the same prepare "
                        "command again to finish it")
    return False


def _index(directory: Path) -> dict[str, Any]:
    try:
        index = json.loads((directory / INDEX_FILE).read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{directory / INDEX_FILE} cannot be read ({err}); prepare the data again") from None
    return index if isinstance(index, dict) else {}


def prepared_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer the shards in ``directory`` were made with (saved beside them)."""
    directory = Path(directory).expanduser()
    tokenizer = load_tokenizer(directory / _index(directory).get("tokenizer_dir", TOKENIZER_DIR))
    if tokenizer is None:
        raise DataError(f"{directory} has no tokenizer/ beside its shards; prepare the data again")
    return tokenizer


def load_prepared(directory: str | Path, split: str, tokenizer: Tokenizer | None = None) -> ShardSplit:
    """``split`` of the prepared ``directory`` as memory maps; with ``tokenizer``, checks the shards were made by it."""
    directory = Path(directory).expanduser()
    split = normalize_split(split)
    index = _index(directory)
    if index.get("format") != SHARDS_FORMAT:
        raise DataError(f"{directory / INDEX_FILE} is not a fullband prepare index")
    rundir.check_format(index, directory / INDEX_FILE, legacy_key="version")
    if tokenizer is not None and index["settings"]["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise DataError(f"{directory} was tokenized with another tokenizer ({index['tokenizer'].get('type')}, "
                        f"vocab_size {index['vocab_size']}) than this run's ({tokenizer!r}); train on it with its own "
                        f"tokenizer ({directory}/tokenizer) or prepare the data again")
    if split not in index["splits"]:
        raise DataError(f"{directory} has no {split!r} split (it has: {', '.join(index['splits'])})")
    info, dtype = index["splits"][split], np.dtype(index["dtype"])
    parts = []
    for shard in info["shards"]:
        path = directory / shard["file"]
        expected = shard["tokens"] * dtype.itemsize
        if not path.is_file() or path.stat().st_size != expected:
            raise DataError(f"shard {path} is missing or has the wrong size (expected {expected} bytes); prepare the "
                            "data again")
        parts.append(np.memmap(path, dtype=dtype, mode="r", shape=(shard["tokens"],)))
    return ShardSplit(tuple(parts), int(info["tokens"]), int(info["bytes"]), int(info["docs"]))


def scored_split(source: str | Path) -> str:
    """The split a study scores its models on: ``test``, or ``validation`` for prepared shards (they have no test
    split: the held-out documents of ``fullband prepare`` are its validation split)."""
    return "validation" if is_prepared(source) else "test"


def load_flat_split(source: str | Path, split: str, tokenizer: Tokenizer,
                    held_out: tuple[float, float] = HELD_OUT) -> TokenSplit:
    """``split`` of any text source (prepared shards too) as one flat token array, for evaluation windows.

    A prepared split of one shard stays a memory map; several are joined in memory, which evaluation splits (the
    held-out share, ``--val_fraction``) are small enough for."""
    if not is_prepared(source):
        return load_tokens(source, split, tokenizer, held_out=held_out)
    shards = load_prepared(source, split, tokenizer)
    if not shards.n_tokens:
        raise DataError(f"{source} has an empty {normalize_split(split)!r} split (prepared with --val_fraction 0); "
                        "prepare it again with --val_fraction > 0 to evaluate on it")
    tokens = shards.tokens[0] if len(shards.tokens) == 1 else np.concatenate(shards.tokens)
    return TokenSplit(tokens=tokens, n_bytes=shards.n_bytes, n_docs=shards.n_docs)
