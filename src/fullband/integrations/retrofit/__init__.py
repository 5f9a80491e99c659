"""Retrofit latent feedback onto a pretrained transformers causal LM: ``retrofit(model)`` -> ``RetrofittedLM``.

- :mod:`.config`: :class:`RetrofitConfig` and the checkpoint layout (no torch, no transformers);
- :mod:`.lm`: :class:`RetrofittedLM`, the pretrained network under the shared feedback forward;
- :mod:`.cache`: its decoding cache (a transformers DynamicCache with the native cache's bookkeeping);
- :mod:`.io`: its checkpoints (the base in its own format, the fusion beside it).

The names below are imported on first use, so that reading :mod:`.config` needs no transformers.
"""

from fullband.integrations import lazy_exports

_LAZY = {
    "RetrofitConfig": "fullband.integrations.retrofit.config",
    "FeedbackSource": "fullband.integrations.retrofit.config",
    "RetrofittedLM": "fullband.integrations.retrofit.lm",
    "retrofit": "fullband.integrations.retrofit.lm",
}
__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
