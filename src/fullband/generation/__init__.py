"""Sampling and decoding modes (standard / soft / fused / exact), batched and streaming, and speculative decoding.

Importing this package binds :func:`generate` and :func:`stream` as the models' ``generate`` / ``stream``
methods: the model package imports nothing from here.
"""

from fullband.generation.decoding import MODES, DecodeState, decode_step, generate, left_pad, prefill, stream
from fullband.generation.sampling import sample_next
from fullband.generation.speculative import SpeculativeConfig, SpeculativeDecoder, SpeculativeStats
from fullband.model import FeedbackLM

FeedbackLM.bind_decoding(generate, stream)

__all__ = ["MODES", "DecodeState", "SpeculativeConfig", "SpeculativeDecoder", "SpeculativeStats", "decode_step",
           "generate", "left_pad", "prefill", "sample_next", "stream"]
