"""Sampling and decoding modes (standard / soft / fused / exact), batched and streaming, and speculative
decoding.

:mod:`fullband.generation.decoding` binds its :func:`generate` and :func:`stream` as the models' ``generate`` /
``stream`` methods when it is imported (the model package imports nothing from here). The names below load it on
first use, so ``fullband.generation.config`` (torch-free) can be imported without it.
"""

from typing import Any

_EXPORTS = {"MODES": "decoding", "DecodeState": "decoding", "decode_step": "decoding", "generate": "decoding",
            "left_pad": "decoding", "prefill": "decoding", "stream": "decoding", "sample_next": "sampling",
            "SpeculativeConfig": "speculative", "SpeculativeDecoder": "speculative", "SpeculativeStats": "speculative"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fullband.generation' has no attribute {name!r}")
    from fullband.generation import decoding, sampling, speculative

    modules = {"decoding": decoding, "sampling": sampling, "speculative": speculative}
    return getattr(modules[_EXPORTS[name]], name)
