"""The model: transformer blocks, latent fusion, KV cache and FullBandwidthLM (imports nothing else of fullband)."""

from fullband.model.fusion import LatentFusion
from fullband.model.kv_cache import KVCache
from fullband.model.lm import FullBandwidthLM
from fullband.model.recurrence import IGNORE_INDEX, LMOutput, exact_pass_count, run_passes

__all__ = ["IGNORE_INDEX", "FullBandwidthLM", "KVCache", "LMOutput", "LatentFusion", "exact_pass_count", "run_passes"]
