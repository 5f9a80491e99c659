"""Preallocated key/value cache for a batch decoded in lockstep (left padding for ragged prompts)."""

from __future__ import annotations

import torch


class CacheSlots:
    """The bookkeeping every decoding cache shares: committed ``length``, which slots hold real tokens
    (``valid``, for left padding) and each row's ``next_position`` (its RoPE position)."""

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
