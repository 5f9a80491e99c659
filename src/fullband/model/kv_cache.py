"""Preallocated key/value cache for a batch decoded in lockstep (left padding for ragged prompts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch


class CacheSlots:
    """The bookkeeping every decoding cache shares: committed ``length``, which slots hold real tokens
    (``valid``, for left padding) and each row's ``next_position`` (its RoPE position)."""

    # Whether a forward over a chunk on this cache may take a carried state per position (B, T, D): a Jacobi pass over
    # the chunk after a cached prefix (PrefixKV); a decoding cache takes the state before the chunk only.
    per_position_states: ClassVar[bool] = False

    def __init__(self, batch_size: int, max_len: int, device: torch.device | str) -> None:
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # real token (not pad)
        self.next_position = torch.zeros(batch_size, dtype=torch.long, device=device)  # real tokens so far
        self.length = 0  # committed slots
        self.max_len = max_len

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.max_len:
            raise ValueError(
                f"KV cache full: {self.length} cached + {n_new} new tokens > capacity {self.max_len}; "
                "allocate a larger cache (max_len) or generate fewer tokens"
            )

    def commit(self, chunk_valid: torch.Tensor) -> None:
        """Make the pending chunk (B, T) permanent."""
        end = self.length + chunk_valid.shape[1]
        self.valid[:, self.length : end] = chunk_valid
        self.next_position += chunk_valid.sum(dim=1)
        self.length = end

    def truncate(self, length: int) -> None:
        """Forget every committed slot from ``length`` on (a speculative drafter drops its rejected tokens); the
        stale entries there are overwritten by the next chunk."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} committed slots to {length}")
        self.next_position -= self.valid[:, length : self.length].sum(dim=1)
        self.valid[:, length : self.length] = False
        self.length = length

    def can_gather_rows(self) -> bool:
        """Whether :meth:`gather_rows` works for this cache (what continuous batching regroups)."""
        return False

    def gather_rows(self, rows: Sequence[tuple[CacheSlots, int]]) -> None:
        """Fill this fresh cache, one row per ``(source cache, row)`` of ``rows`` (caches of this kind), with each
        source row's cached tokens right-aligned (left padding, as batched decoding does): rows of any length then
        decode side by side. ``valid`` marks the real slots and ``next_position`` keeps each row's RoPE position."""
        if self.length or len(rows) != self.batch_size:
            raise ValueError(f"gather_rows fills a fresh cache of {len(rows)} rows; this one has {self.batch_size} "
                             f"rows and {self.length} committed slots")
        lengths = [int(src.next_position[i]) for src, i in rows]
        L = max(lengths)
        self.check_room(L)
        self._copy_rows(rows, lengths, L)
        for new_row, n in enumerate(lengths):
            self.valid[new_row, L - n : L] = True
        self.next_position[:] = torch.tensor(lengths, device=self.next_position.device)
        self.length = L

    def _copy_rows(self, rows: Sequence[tuple[CacheSlots, int]], lengths: list[int], L: int) -> None:
        """Copy the last ``lengths[j]`` committed slots of source row ``rows[j]`` into slots ``L - n .. L`` of row
        ``j`` (each row's real tokens are its last committed slots: every cache is left-padded)."""
        raise NotImplementedError(f"rows of a {type(self).__name__} cannot be gathered")


class KVCache(CacheSlots):
    """Keys/values of every layer, which slots hold real tokens, and each row's next RoPE position.

    A forward over a chunk writes its keys/values at slots ``[length, length + T)``; several passes over the
    same chunk overwrite them, and :meth:`commit` makes the last pass's entries permanent.
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__(batch_size, max_len, device)
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's k, v (B, Hkv, T, hd); return all keys/values up to its end (B, Hkv, S, hd)."""
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def can_gather_rows(self) -> bool:
        return True

    def _copy_rows(self, rows: Sequence[tuple[CacheSlots, int]], lengths: list[int], L: int) -> None:
        for new_row, ((src, i), n) in enumerate(zip(rows, lengths, strict=True)):
            if not isinstance(src, KVCache):
                raise TypeError(f"a KVCache gathers rows of KVCaches, not of a {type(src).__name__}")
            self.keys[:, new_row, :, L - n : L] = src.keys[:, i, :, src.length - n : src.length]
            self.values[:, new_row, :, L - n : L] = src.values[:, i, :, src.length - n : src.length]


class PrefixKV(CacheSlots):
    """The keys and values one forward over whole sequences wrote, kept as that forward made them (with their
    autograd graph, for training): later passes over the positions after a plain prefix attend to the prefix's
    without computing the prefix again (``MultiPassObjective(reuse_prefix=True)``).

    Empty, it records: a forward over the sequences (B, T) stores what each layer writes. :meth:`prefix` gives a
    read-only view of its first ``P`` positions, on which a forward over positions ``P..`` attends to them and stores
    nothing (nor commits), so every later pass reads the same prefix."""

    per_position_states: ClassVar[bool] = True

    def __init__(self, batch_size: int, max_len: int, device: torch.device | str) -> None:
        super().__init__(batch_size, max_len, device)
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.read_only = False

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_only:
            return torch.cat((self.keys[layer], k), 2), torch.cat((self.values[layer], v), 2)
        if self.length:
            raise ValueError("a PrefixKV records one forward over whole sequences; take prefix() to read it")
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def commit(self, chunk_valid: torch.Tensor) -> None:
        if not self.read_only:
            super().commit(chunk_valid)

    def prefix(self, length: int) -> PrefixKV:
        """The first ``length`` recorded positions, read-only."""
        if not 0 < length <= self.length:
            raise ValueError(f"a prefix of {length} positions of a record of {self.length}")
        view = PrefixKV(self.batch_size, self.max_len, self.valid.device)
        view.keys = {layer: k[:, :, :length] for layer, k in self.keys.items()}
        view.values = {layer: v[:, :, :length] for layer, v in self.values.items()}
        view.valid[:, :length] = self.valid[:, :length]
        view.next_position[:] = self.valid[:, :length].sum(dim=1)
        view.length, view.read_only = length, True
        return view
