"""The decoding cache of a retrofitted model: a transformers DynamicCache plus the native KVCache's bookkeeping.

The shared decoding code (:mod:`fullband.generation`) and the exact evaluation hand a cache back to the model's
forward and never look inside, so this only has to offer what the retrofit forward needs, under the native
names: committed ``length``, which slots hold real tokens (``valid``, for left padding), each row's
``next_position`` (its RoPE position), ``check_room`` and ``commit``.

Several passes over one chunk must each overwrite the chunk's keys/values, as the native cache does by writing
at fixed slots. A DynamicCache appends instead, so every pass first :meth:`rewind`\\ s the cache to the committed
length (cropping what the previous pass appended). That keeps chunked exact prefill on top of a filled cache
possible, which "run the passes without a cache, then one more pass to fill it" would not.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig

from fullband.integrations._hf_compat import crop_cache


class RetrofitCache:
    def __init__(self, config: PretrainedConfig, batch_size: int, max_len: int, device: torch.device) -> None:
        try:
            self.kv = DynamicCache(config=config)  # knows the model's layer types (sliding windows)
        except TypeError:  # pragma: no cover - releases whose DynamicCache takes no config
            self.kv = DynamicCache()
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # real token (not pad)
        self.next_position = torch.zeros(batch_size, dtype=torch.long, device=device)  # real tokens so far
        self.length = 0  # committed positions
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

    def rewind(self) -> None:
        """Drop what an earlier pass over the pending chunk appended, so this pass takes its place."""
        crop_cache(self.kv, self.length)

    def commit(self, chunk_valid: torch.Tensor) -> None:
        """Make the pending chunk (B, T) permanent."""
        end = self.length + chunk_valid.shape[1]
        self.valid[:, self.length : end] = chunk_valid
        self.next_position += chunk_valid.sum(dim=1)
        self.length = end
