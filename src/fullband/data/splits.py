"""Deterministic train/validation/test splits.

Two rules, both independent of Python/NumPy RNG implementations so a split never changes between
versions:

- ``split_names``: split whole documents by name. Each name is ranked by ``sha256(seed + name)``;
  the first ``max(1, round(test_fraction * n))`` go to test, the next ``max(1, round(val_fraction * n))``
  to validation, the rest to train (a fraction of 0 holds out none). Splitting by document (a play, a
  file) keeps validation text out of training.
- ``split_text``: split one text into contiguous pieces: train first, then validation, then test, each
  cut moved forward to the next line start (a text file).
- ``split_files``: split a directory's files, in path order, by bytes: validation is the first ``val_fraction`` of
  all their bytes, test the next ``test_fraction``, each cut moved forward to the next line end, and training the
  rest; a file a cut falls in gives a piece to each side. ``fullband prepare`` holds out its validation split by the
  same rule (fullband.data.prepare_inputs.file_chunks), so a directory's validation text is the same in both, and a
  few files hold out about the share asked for (whole files would hold out at least one file per split: 2 of 6).

The fractions are ``HELD_OUT`` = (validation, test) = (0.05, 0.05) unless given (``fullband train``'s
``--data.val_fraction`` and ``--data.test_fraction``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from fullband.data.errors import DataError

SPLITS = ("train", "validation", "test")
SPLIT_SEED = "fullband-split-v1"
HELD_OUT = (0.05, 0.05)  # the shares of validation and test: fullband train's --data.val_fraction, --data.test_fraction

_ALIASES = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}


def normalize_split(split: str) -> str:
    """Canonical split name (``val``/``valid``/``dev`` mean ``validation``); DataError for others."""
    try:
        return _ALIASES[split.strip().lower()]
    except (KeyError, AttributeError):
        raise DataError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}") from None


def split_names(names: Iterable[str], seed: str = SPLIT_SEED,
                held_out: tuple[float, float] = HELD_OUT) -> dict[str, list[str]]:
    """Assign each name to one split (see module doc); each split's names come back sorted."""
    names = sorted(set(names))
    if len(names) < 3:
        raise DataError(f"need at least 3 documents to split by document, got {len(names)}")
    ranked = sorted(names, key=lambda n: hashlib.sha256(f"{seed}\0{n}".encode()).hexdigest())
    n_val, n_test = (max(1, round(len(names) * fraction)) if fraction > 0 else 0 for fraction in held_out)
    if n_val + n_test >= len(names):
        raise DataError(f"{len(names)} documents leave none for training after holding out {n_val} for validation "
                        f"and {n_test} for test; lower the held-out fractions or give more documents")
    return {
        "test": sorted(ranked[:n_test]),
        "validation": sorted(ranked[n_test : n_test + n_val]),
        "train": sorted(ranked[n_test + n_val :]),
    }


def split_text(text: str, held_out: tuple[float, float] = HELD_OUT) -> dict[str, str]:
    """Cut one text into contiguous train/validation/test pieces at line starts (see module doc)."""

    def cut(fraction: float) -> int:
        pos = int(len(text) * fraction)
        nl = text.find("\n", pos)
        return len(text) if nl < 0 else nl + 1

    val, test = held_out
    a, b = cut(1 - (val + test)), cut(1 - test)
    return {"train": text[:a], "validation": text[a:b], "test": text[b:]}


def split_files(contents: list[bytes], held_out: tuple[float, float] = HELD_OUT) -> dict[str, list[bytes]]:
    """Cut files (their bytes, in path order) into validation, test and train pieces by bytes (see module doc); each
    split's pieces in file order, empty ones left out."""
    total = sum(len(c) for c in contents)
    val, test = held_out
    cuts = [_line_end_at(contents, math.ceil(val * total)), _line_end_at(contents, math.ceil((val + test) * total))]
    pieces: dict[str, list[bytes]] = {"validation": [], "test": [], "train": []}
    offset = 0
    for data in contents:
        for split, start, end in (("validation", 0, cuts[0]), ("test", cuts[0], cuts[1]), ("train", cuts[1], total)):
            piece = data[max(start - offset, 0) : max(min(end - offset, len(data)), 0)]
            if piece:
                pieces[split].append(piece)
        offset += len(data)
    return pieces


def _line_end_at(contents: list[bytes], position: int) -> int:
    """The smallest position >= ``position`` of the files joined that is a file's start or end or just after a
    newline (where fullband prepare cuts)."""
    offset = 0
    for data in contents:
        if offset < position < offset + len(data):
            newline = data.find(b"\n", position - offset - 1)
            return offset + (len(data) if newline < 0 else newline + 1)
        offset += len(data)
    return min(position, offset)
