"""Bad input gets a message that says what to change."""

import pytest
import torch
from conftest import make_model

from fullband import ConfigError, ModelConfig
from fullband.generation import generate


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 0}, r"d_model=0 is invalid: must be an integer >= 1"),
        ({"n_heads": 3}, r"n_heads=3 is invalid: must divide d_model=32"),
        ({"n_kv_heads": 3}, r"n_kv_heads=3 is invalid: must be a positive divisor of n_heads=4"),
        ({"vocab_size": 2.5}, r"vocab_size=2.5 is invalid"),
        ({"feedback": "yes"}, r"feedback='yes' is invalid: must be true or false"),
        ({"feedback_source": "top"}, r"feedback_source='top' is invalid: must be one of"),
        ({"feedback_source": "layer:9"}, r"layer index must be in 1..n_layers=2"),
        ({"fusion": "add"}, r"fusion='add' is invalid: must be one of \('glu_cross',\)"),
        ({"norm_eps": 0}, r"norm_eps=0 is invalid: must be in \(0, 1\)"),
        ({"d_model": 36, "n_heads": 4, "n_kv_heads": None}, r"must be even for RoPE"),
        ({"position_encoding": "alibi"}, r"position_encoding='alibi' is invalid: must be one of \('rope', 'none'\)"),
    ],
)
def test_bad_model_configs(overrides, message):
    settings = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4)
    settings.update(overrides)
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**settings)


def test_odd_head_dims_are_refused_for_rope_only():
    # RoPE rotates pairs of dimensions; without it (NoPE) a head of any width works.
    config = ModelConfig(vocab_size=61, d_model=36, n_heads=4, position_encoding="none")
    assert config.head_dim == 9
    with pytest.raises(ConfigError, match="must be even for RoPE"):
        ModelConfig(vocab_size=61, d_model=36, n_heads=4)


def test_unknown_config_key():
    with pytest.raises(ConfigError, match=r"unknown ModelConfig key\(s\) \['n_layer'\]"):
        ModelConfig.from_dict({"n_layer": 3})


def test_token_ids_out_of_range(model):
    with pytest.raises(ValueError, match=r"token id 61 out of range: the model's vocab_size is 61"):
        model(torch.tensor([[1, 61]]))
    with pytest.raises(ValueError, match=r"token id -1 out of range"):
        generate(model, [3, -1], 4)


def test_sequence_longer_than_context(model):
    with pytest.raises(ValueError, match=r"65 tokens is longer than the model context max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"exceeds the model context max_seq_len=64; shorten the prompt"):
        generate(model, [1] * 60, max_new_tokens=10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "turbo"}, r"mode='turbo' is invalid: must be one of standard, soft, fused:K, exact"),
        ({"mode": "fused"}, r"mode='fused' needs its pass count: write fused:K \(K >= 0, e.g. fused:1\)"),
        ({"temperature": -1.0}, r"temperature=-1.0 is invalid: must be >= 0"),
        ({"top_p": 0.0}, r"top_p=0.0 is invalid: must be in \(0, 1\]"),
        ({"top_k": -2}, r"top_k=-2 is invalid: must be an integer >= 0"),
        ({"max_new_tokens": -1}, r"max_new_tokens=-1 is invalid: must be an integer >= 0"),
    ],
)
def test_bad_generate_options(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, [1, 2, 3], **{"max_new_tokens": 4, **kwargs})


def test_bad_forward_arguments(model):
    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"plain_prefix must be an integer >= 1"):
        model(tokens, passes=2, plain_prefix=0)
    with pytest.raises(ValueError, match=r"passes must be >= 1"):
        model(tokens, passes=0)
    with pytest.raises(ValueError, match=r"tokens must be an integer tensor of shape \(batch, seq_len\)"):
        model(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"method must be one of \('auto', 'sequential', 'chunked', 'jacobi'\)"):
        model.forward_exact(tokens, method="newton")
    with pytest.raises(ValueError, match=r"every prompt needs at least one token"):
        generate(model, [[1], []], 2)


def test_cache_overflow_is_reported():
    model = make_model()
    cache = model.new_cache(1, 4)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    with pytest.raises(ValueError, match=r"KV cache full: 3 cached \+ 2 new tokens > capacity 4"):
        model(torch.tensor([[1, 2]]), cache=cache)
