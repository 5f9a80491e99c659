"""fullband: the full-bandwidth transformer (latent feedback of the top-layer state)."""

from typing import Any

from fullband.config import ConfigError, ModelConfig
from fullband.model import FullBandwidthLM, KVCache, LMOutput

__version__ = "0.1.0"
__all__ = ["ConfigError", "FullBandwidthLM", "KVCache", "LMOutput", "ModelConfig", "__version__"]  # + retrofit, lazily


def __getattr__(name: str) -> Any:
    # fullband.retrofit needs transformers (the hf extra): import it on first use, not with fullband.
    if name == "retrofit":
        from fullband.integrations.retrofit import retrofit

        return retrofit
    raise AttributeError(f"module 'fullband' has no attribute {name!r}")
