"""fullband: the full-bandwidth transformer (latent feedback of the top-layer state)."""

from fullband.config import ConfigError, ModelConfig
from fullband.model import FullBandwidthLM, KVCache, LMOutput

__version__ = "0.1.0"
__all__ = ["ConfigError", "FullBandwidthLM", "KVCache", "LMOutput", "ModelConfig", "__version__"]
