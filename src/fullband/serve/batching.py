"""Rows of decoding caches gathered into one batch cache (continuous batching's regrouping), through the caches'
own :meth:`~fullband.model.kv_cache.CacheSlots.gather_rows`: the native KVCache and a retrofitted model's cache
alike, without this module knowing either's layout. When the engine goes idle, :func:`release_free_memory` hands
the freed batch caches' memory back to the OS.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence

from fullband.model import FeedbackLM
from fullband.model.kv_cache import CacheSlots

Row = tuple[CacheSlots, int]  # (source cache, row in it)


def gather_rows(model: FeedbackLM, rows: Sequence[Row], capacity: int) -> CacheSlots:
    """A fresh cache of ``len(rows)`` rows and room for ``capacity`` slots holding each row's cached tokens."""
    cache = model.new_cache(len(rows), capacity)
    cache.gather_rows(rows)
    return cache


def release_free_memory() -> None:
    """glibc keeps freed heap memory (the per-step caches of a busy batch) for reuse; return it when idle, so a
    server's resident size falls back after a burst. A no-op where glibc's malloc_trim is not available."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
