"""The model: transformer blocks, latent fusion, KV cache, the one feedback forward (FeedbackLM) and the native
FullBandwidthLM. Imports nothing of fullband outside it but the config."""

from fullband.model.feedback import FeedbackLM
from fullband.model.fusion import LatentFusion
from fullband.model.kv_cache import KVCache
from fullband.model.lm import FullBandwidthLM
from fullband.model.recurrence import IGNORE_INDEX, LMOutput, LoopOptions, exact_pass_count, run_passes

__all__ = ["IGNORE_INDEX", "FeedbackLM", "FullBandwidthLM", "KVCache", "LMOutput", "LatentFusion", "LoopOptions",
           "exact_pass_count", "run_passes"]
