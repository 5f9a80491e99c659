"""Deterministic train/validation/test splits.

Two rules, both independent of Python/NumPy RNG implementations so a split never changes between
versions:

- ``split_names``: split whole documents by name. Each name is ranked by ``sha256(seed + name)``;
  the first ``max(1, round(5%))`` go to test, the next ``max(1, round(5%))`` to validation, the
  rest to train. Splitting by document (a play, a file) keeps validation text out of training.
- ``split_text``: split one text into contiguous pieces, first 90% train, next 5% validation,
  last 5% test, with cuts moved forward to the next line start. Used when there are too few
  documents to split by document.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from fullband.data.errors import DataError

SPLITS = ("train", "validation", "test")
SPLIT_SEED = "fullband-split-v1"
HELDOUT_FRACTION = 0.05  # each of validation and test

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


def split_names(names: Iterable[str], seed: str = SPLIT_SEED) -> dict[str, list[str]]:
    """Assign each name to one split (see module doc); each split's names come back sorted."""
    names = sorted(set(names))
    if len(names) < 3:
        raise DataError(f"need at least 3 documents to split by document, got {len(names)}")
    ranked = sorted(names, key=lambda n: hashlib.sha256(f"{seed}\0{n}".encode()).hexdigest())
    n_held = max(1, round(len(names) * HELDOUT_FRACTION))
    return {
        "test": sorted(ranked[:n_held]),
        "validation": sorted(ranked[n_held : 2 * n_held]),
        "train": sorted(ranked[2 * n_held :]),
    }


def split_text(text: str) -> dict[str, str]:
    """Cut one text into contiguous train/validation/test pieces at line starts (see module doc)."""

    def cut(fraction: float) -> int:
        pos = int(len(text) * fraction)
        nl = text.find("\n", pos)
        return len(text) if nl < 0 else nl + 1

    a, b = cut(1 - 2 * HELDOUT_FRACTION), cut(1 - HELDOUT_FRACTION)
    return {"train": text[:a], "validation": text[a:b], "test": text[b:]}
