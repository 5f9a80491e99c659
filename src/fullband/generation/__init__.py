"""Sampling and decoding modes (standard / soft / fused / exact), batched and streaming."""

from fullband.generation.decoding import MODES, DecodeState, decode_step, generate, left_pad, prefill, stream
from fullband.generation.sampling import sample_next

__all__ = ["MODES", "DecodeState", "decode_step", "generate", "left_pad", "prefill", "sample_next", "stream"]
