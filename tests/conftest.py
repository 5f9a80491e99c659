import pytest
import torch

from fullband import FullBandwidthLM, ModelConfig


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> FullBandwidthLM:
    """A tiny random model; the default init gives non-trivial fusion weights (W_U, W_G ~ N(0, 0.02))."""
    settings = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    settings.update(overrides)
    torch.manual_seed(seed)
    return FullBandwidthLM(ModelConfig(**settings)).to(dtype).eval()


@pytest.fixture
def model() -> FullBandwidthLM:
    return make_model()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(1))
