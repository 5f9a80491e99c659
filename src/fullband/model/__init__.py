"""The model: transformer blocks, latent fusion, KV cache, the one feedback forward (FeedbackLM) and the native
FullBandwidthLM. Imports nothing of fullband outside it but the torch-free base."""

from fullband.model.feedback import FeedbackLM
from fullband.model.fusion import LatentFusion
from fullband.model.kv_cache import KVCache
from fullband.model.lm import FullBandwidthLM
from fullband.model.recurrence import (
    IGNORE_INDEX,
    LMOutput,
    exact_pass_count,
    exact_passes,
    fused_positions,
    ntp_loss,
    restart_at,
)

__all__ = ["IGNORE_INDEX", "FeedbackLM", "FullBandwidthLM", "KVCache", "LMOutput", "LatentFusion", "exact_pass_count",
           "exact_passes", "fused_positions", "ntp_loss", "restart_at"]
