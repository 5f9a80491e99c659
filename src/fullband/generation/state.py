"""The decoding state of a batch, shared by plain and speculative decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fullband.model.kv_cache import CacheSlots


@dataclass
class DecodeState:
    """What a batch needs to take the next step: its KV cache and each row's last carried state."""

    cache: CacheSlots
    carried: torch.Tensor | None  # (B, D); None = plain decoding
    next_logits: torch.Tensor  # (B, V) logits for the next token
    prompt_len: int  # padded prompt length: generated positions start here
    # (B,) bool: rows decoded plain although the batch carries states (a server batch mixing standard requests with
    # fused ones); None = every row as ``carried`` says
    plain_rows: torch.Tensor | None = None
