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


def save_tiny_gpt2(directory, vocab_size: int = 320, n_positions: int = 128, seed: int = 0):
    """A tiny random GPT-2 saved as a pretrained transformers model, with fullband's byte tokenizer beside it
    (ids 0..256, so any text fits its vocabulary). Returns the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fullband.data import ByteTokenizer

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=n_positions,
                        bos_token_id=256, eos_token_id=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    ByteTokenizer().save(directory)
    return model
