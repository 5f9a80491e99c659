"""Baseline fullband <-> LlamaForCausalLM: same logits (float32, 1e-5) and same greedy tokens, both ways."""

import dataclasses
import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from conftest import make_model
from transformers import LlamaConfig, LlamaForCausalLM

from fullband import FullBandwidthLM
from fullband.generation import generate
from fullband.integrations.llama import from_llama, to_llama

ATOL = 1e-5  # float32
PROMPT = [5, 17, 3, 44, 8, 21]


def scaled_baseline(tie: bool, max_seq_len: int = 64, input_norm: str = "fused") -> FullBandwidthLM:
    """A baseline whose logits are O(1-10), so a 1e-5 agreement means something."""
    model = make_model(dtype=torch.float32, feedback=False, tie_embeddings=tie, init_std=0.3, rope_theta=5e4,
                       max_seq_len=max_seq_len, input_norm=input_norm)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def random_llama(tie: bool) -> LlamaForCausalLM:
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=2e4,
                         rms_norm_eps=1e-6, tie_word_embeddings=tie, initializer_range=0.3, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 48), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
@pytest.mark.parametrize("input_norm", ["fused", "paper", "all"])
@pytest.mark.parametrize("tie", [True, False])
def test_to_llama_logits_agree(tie, input_norm, tokens):
    model = scaled_baseline(tie, input_norm=input_norm)
    llama = to_llama(model).eval()
    expected = model(tokens).logits
    assert expected.abs().max() > 3
    torch.testing.assert_close(llama(tokens).logits, expected, atol=ATOL, rtol=0)
    # The input norm folds into the embedding table, so the head keeps its own (untied) copy.
    assert llama.config.tie_word_embeddings == (tie and input_norm != "all")
    assert (llama.lm_head.weight is llama.model.embed_tokens.weight) == (tie and input_norm != "all")


@torch.no_grad()
def test_long_sequences_agree_too():
    # RoPE angles are computed in float32 exactly as in transformers, so parity does not decay with position.
    model = scaled_baseline(tie=True, max_seq_len=512)
    tokens = torch.randint(0, 61, (1, 512), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(to_llama(model).eval()(tokens).logits, model(tokens).logits, atol=ATOL, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("tie", [True, False])
def test_from_llama_logits_agree(tie, tokens):
    llama = random_llama(tie)
    model = from_llama(llama).eval()
    assert not model.config.feedback and model.config.d_ff == 80 and model.config.rope_theta == 2e4
    assert model.config.norm_eps == 1e-6 and model.config.kv_heads == 2 and model.config.tie_embeddings == tie
    expected = llama(tokens).logits
    assert expected.abs().max() > 3
    torch.testing.assert_close(model(tokens).logits, expected, atol=ATOL, rtol=0)


@torch.no_grad()
def test_round_trip_is_lossless():
    model = scaled_baseline(tie=False, input_norm="fused")  # a Llama has no input norm to come back with
    back = from_llama(to_llama(model))
    assert back.config == dataclasses.replace(model.config, d_ff=model.config.ffn_dim)  # d_ff made explicit
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


@torch.no_grad()
def test_greedy_generate_agrees_both_ways():
    model = scaled_baseline(tie=True)
    llama = to_llama(model).eval()
    hf_tokens = llama.generate(torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False)[0].tolist()
    assert hf_tokens == generate(model, PROMPT, 20, mode="standard")
    llama = random_llama(tie=False)
    hf_tokens = llama.generate(torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False)[0].tolist()
    assert hf_tokens == generate(from_llama(llama).eval(), PROMPT, 20, mode="standard")


def test_unconvertible_models_are_refused():
    with pytest.raises(ValueError, match="feedback"):
        to_llama(make_model())
    with pytest.raises(ValueError, match=r"position_encoding='none' \(a Llama has rotary position embeddings only"):
        to_llama(make_model(feedback=False, position_encoding="none"))
    llama = random_llama(tie=True)
    llama.config.attention_bias = True
    with pytest.raises(ValueError, match="attention_bias"):
        from_llama(llama)
