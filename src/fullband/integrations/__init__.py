"""Integrations with other libraries (the ``hf`` extra: transformers).

Nothing here is imported with ``fullband``; each submodule imports its library when it is imported itself:

- :mod:`fullband.integrations.hf`: ``FullBandwidthConfig`` / ``FullBandwidthForCausalLM`` for the Auto classes
  (registered on import) and ``generate``;
- :mod:`fullband.integrations.llama`: ``to_llama`` / ``from_llama`` for baseline (feedback=False) models;
- :mod:`fullband.integrations.hf_retrofit`: the same for retrofitted checkpoints;
- :mod:`fullband.integrations.retrofit`: ``retrofit(model)`` -> ``RetrofittedLM``, latent feedback on a
  pretrained transformers causal LM (a subpackage: config, model, cache, checkpoints).
"""

import importlib
from collections.abc import Callable
from typing import Any

_LAZY = {
    "FullBandwidthConfig": "fullband.integrations.hf",
    "FullBandwidthForCausalLM": "fullband.integrations.hf",
    "to_llama": "fullband.integrations.llama",
    "from_llama": "fullband.integrations.llama",
    "RetrofittedLM": "fullband.integrations.retrofit.lm",
    "retrofit": "fullband.integrations.retrofit.lm",
}
__all__ = sorted(_LAZY)


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` (a module) on first use of ``name``."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__


__getattr__ = lazy_exports(__name__, _LAZY)
