"""Sampling and decoding modes (standard / soft / fused / exact), batched and streaming, and speculative
decoding.

Decoding lives here, outside the model (as nanochat keeps its Engine outside its GPT): :func:`generate` /
:func:`stream` take the model as their first argument, ``generate(model, prompt_ids, max_new_tokens, mode)``, and
:func:`~fullband.generation.decoding.decode` takes a :class:`~fullband.modes.DecodeOptions`. The model package
imports nothing from here and nothing here is bound onto a model class. The names below load their module on first
use, so ``fullband.generation.config`` (torch-free) can be imported without torch.
"""

from typing import Any

_EXPORTS = {"MODES": "decoding", "DecodeState": "decoding", "decode": "decoding", "decode_step": "decoding",
            "generate": "decoding",
            "left_pad": "decoding", "prefill": "decoding", "stream": "decoding", "sample_next": "sampling",
            "SpeculativeConfig": "speculative", "SpeculativeDecoder": "speculative", "SpeculativeStats": "speculative"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fullband.generation' has no attribute {name!r}")
    from fullband.generation import decoding, sampling, speculative

    modules = {"decoding": decoding, "sampling": sampling, "speculative": speculative}
    return getattr(modules[_EXPORTS[name]], name)
