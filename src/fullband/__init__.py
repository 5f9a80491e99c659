"""fullband: the full-bandwidth transformer (latent feedback of the top-layer state)."""

from typing import Any

from fullband.config import ConfigError, ModelConfig
from fullband.version import __version__

# + retrofit, lazily
__all__ = ["ConfigError", "FullBandwidthLM", "KVCache", "LMOutput", "ModelConfig", "MultiPassObjective", "__version__",
           "generate", "stream"]

_MODEL_NAMES = ("FullBandwidthLM", "KVCache", "LMOutput")


def __getattr__(name: str) -> Any:
    # torch is imported on first use of the model, not with fullband: the command line checks its options (and
    # answers a bad one) before paying for it. fullband.retrofit needs transformers (the hf extra).
    if name in _MODEL_NAMES:
        import fullband.model

        return getattr(fullband.model, name)
    if name in ("generate", "stream"):  # decoding, outside the model: generate(model, prompt_ids, ...)
        import fullband.generation.decoding

        return getattr(fullband.generation.decoding, name)
    if name == "MultiPassObjective":  # training's objective, outside the model: objective(model, tokens, labels)
        from fullband.training.objective import MultiPassObjective

        return MultiPassObjective
    if name == "retrofit":
        from fullband.integrations.retrofit import retrofit  # (its module imports fullband.generation)

        return retrofit
    raise AttributeError(f"module 'fullband' has no attribute {name!r}")
