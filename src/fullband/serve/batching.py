"""Rows of decoding caches gathered into one batch cache (continuous batching's regrouping), for every cache kind
the engine batches: the native :class:`~fullband.model.KVCache` and a retrofitted model's cache (a transformers
DynamicCache with full-attention layers, behind the same :class:`~fullband.model.kv_cache.CacheSlots` bookkeeping).

Each row's cached tokens are copied right-aligned (left padding, as batched decoding does), so rows of any length
decode side by side; ``valid`` marks the real slots and ``next_position`` keeps each row's RoPE position. When the
engine goes idle, :func:`release_free_memory` hands the freed batch caches' memory back to the OS.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence

import torch

from fullband.model import FeedbackLM, KVCache
from fullband.model.kv_cache import CacheSlots

Row = tuple[CacheSlots, int]  # (source cache, row in it)


def regroupable(cache: CacheSlots) -> bool:
    """Can rows of this kind of cache be gathered? A native cache, or a DynamicCache whose layers all keep every
    token (a sliding-window layer keeps a cropped window whose slots do not line up with ``valid``)."""
    if isinstance(cache, KVCache):
        return True
    layers = getattr(getattr(cache, "kv", None), "layers", None)
    # By name, so this module needs no transformers import; a subclass (sliding window) does not count.
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def gather_rows(model: FeedbackLM, rows: Sequence[Row], capacity: int) -> CacheSlots:
    """A fresh cache of ``len(rows)`` rows and room for ``capacity`` slots holding each row's cached tokens."""
    lengths = [int(src.next_position[i]) for src, i in rows]
    L = max(lengths)
    cache = model.new_cache(len(rows), capacity)
    if isinstance(cache, KVCache):
        for new_row, ((src, i), n) in enumerate(zip(rows, lengths, strict=True)):
            assert isinstance(src, KVCache)
            cache.keys[:, new_row, :, L - n : L] = src.keys[:, i, :, src.length - n : src.length]
            cache.values[:, new_row, :, L - n : L] = src.values[:, i, :, src.length - n : src.length]
    else:  # a DynamicCache: per layer keys/values (B, H, S, hd) holding exactly the committed slots
        for layer_index in range(len(cache.kv.layers)):  # type: ignore[attr-defined]
            first = rows[0][0].kv.layers[layer_index].keys  # type: ignore[attr-defined]
            keys = first.new_zeros(len(rows), first.shape[1], L, first.shape[3])
            values = torch.zeros_like(keys)
            for new_row, ((src, i), n) in enumerate(zip(rows, lengths, strict=True)):
                layer = src.kv.layers[layer_index]  # type: ignore[attr-defined]
                keys[new_row, :, L - n :] = layer.keys[i, :, src.length - n : src.length]
                values[new_row, :, L - n :] = layer.values[i, :, src.length - n : src.length]
            cache.kv.update(keys, values, layer_index)  # type: ignore[attr-defined]  # an empty layer takes them
    for new_row, n in enumerate(lengths):
        cache.valid[new_row, L - n : L] = True
    cache.next_position[:] = torch.tensor(lengths, device=cache.next_position.device)
    cache.length = L
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
