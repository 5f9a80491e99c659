"""Conversion between a baseline fullband model (``feedback=False``) and ``LlamaForCausalLM``, both ways.

The baseline is a Llama: pre-norm RMSNorm, rotate-half RoPE, grouped-query attention without biases, SwiGLU
MLP. The tensors map one to one (same shapes, same layout); only the names and the config keys differ. A baseline
feeds raw embeddings, as a Llama does, except in the ``input_norm="all"`` form, whose input RMSNorm is a function of
the token id alone: ``to_llama`` folds it into the embedding table (the head then keeps the unnormalised table,
untied); a Llama comes back in the default form.
"""

from __future__ import annotations

import re

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fullband.config import ModelConfig
from fullband.model import FullBandwidthLM

# native name pattern -> Llama name pattern (per block: \1 is the block index)
_NAMES = [
    (r"embed\.weight", "model.embed_tokens.weight"),
    (r"norm\.weight", "model.norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
    (r"blocks\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blocks\.(\d+)\.mlp_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blocks\.(\d+)\.attn\.(\w_proj)\.weight", r"model.layers.\1.self_attn.\2.weight"),
    (r"blocks\.(\d+)\.mlp\.(\w+_proj)\.weight", r"model.layers.\1.mlp.\2.weight"),
]


def llama_name(native_name: str) -> str:
    """The ``LlamaForCausalLM`` parameter name of a native parameter name."""
    for pattern, replacement in _NAMES:
        if re.fullmatch(pattern, native_name):
            return re.sub(pattern, replacement, native_name)
    raise KeyError(f"no Llama counterpart for {native_name!r}")


# LlamaConfig key -> (the ModelConfig field it sets, the ModelConfig attribute that gives its value)
_CONFIG_KEYS = {
    "vocab_size": ("vocab_size", "vocab_size"),
    "hidden_size": ("d_model", "d_model"),
    "intermediate_size": ("d_ff", "ffn_dim"),
    "num_hidden_layers": ("n_layers", "n_layers"),
    "num_attention_heads": ("n_heads", "n_heads"),
    "num_key_value_heads": ("n_kv_heads", "kv_heads"),
    "max_position_embeddings": ("max_seq_len", "max_seq_len"),
    "rms_norm_eps": ("norm_eps", "norm_eps"),
    "initializer_range": ("init_std", "init_std"),
}


def llama_config(config: ModelConfig) -> LlamaConfig:
    """The LlamaConfig of a baseline ModelConfig (no special tokens: fullband models carry none)."""
    require(not config.feedback, "feedback", config.feedback, "to_llama needs a baseline (feedback=False) model")
    require(config.position_encoding == "rope", "position_encoding", config.position_encoding,
            "a Llama has rotary position embeddings only; to_llama needs position_encoding='rope'")
    return LlamaConfig(
        **{key: getattr(config, attr) for key, (_, attr) in _CONFIG_KEYS.items()},
        head_dim=config.head_dim,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings and config.input_norm != "all",  # folded norm: untied
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def model_config(llama: LlamaConfig) -> ModelConfig:
    """The baseline ModelConfig of a LlamaConfig; features the native model lacks are rejected by name."""
    require(llama.hidden_act == "silu", "hidden_act", llama.hidden_act, "fullband's MLP is SwiGLU ('silu')")
    require(not llama.attention_bias, "attention_bias", llama.attention_bias, "fullband projections have no bias")
    require(not llama.mlp_bias, "mlp_bias", llama.mlp_bias, "fullband projections have no bias")
    require(getattr(llama, "pretraining_tp", 1) in (1, None), "pretraining_tp", llama.pretraining_tp, "must be 1")
    head_dim = getattr(llama, "head_dim", None) or llama.hidden_size // llama.num_attention_heads
    require(head_dim * llama.num_attention_heads == llama.hidden_size, "head_dim", head_dim,
            f"fullband needs head_dim = hidden_size / num_attention_heads = "
            f"{llama.hidden_size // llama.num_attention_heads}")
    rope = _rope_parameters(llama)
    require(rope.get("rope_type", "default") == "default", "rope_scaling", rope,
            "fullband implements the default (unscaled) RoPE only")
    return ModelConfig(
        **{name: getattr(llama, key) for key, (name, _) in _CONFIG_KEYS.items()},
        rope_theta=float(rope["rope_theta"]),
        tie_embeddings=bool(llama.tie_word_embeddings),
        feedback=False,
        input_norm="fused",  # a Llama feeds its raw embeddings
    )


def to_llama(model: FullBandwidthLM) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` computing the same logits as the baseline ``model`` (same dtype and device)."""
    llama = LlamaForCausalLM(llama_config(model.config))
    state = {llama_name(name): tensor for name, tensor in model.state_dict().items() if name != "input_norm.weight"}
    if model.config.input_norm == "all":
        with torch.no_grad():  # every row of the table normalised as the stack would normalise that token's input
            state["model.embed_tokens.weight"] = model.input_norm(model.embed.weight).clone()
        state["lm_head.weight"] = model.lm_head.weight
    llama.load_state_dict(state, strict=True)
    p = model.embed.weight
    return llama.to(device=p.device, dtype=p.dtype).train(model.training)


def from_llama(llama: LlamaForCausalLM) -> FullBandwidthLM:
    """A baseline ``FullBandwidthLM`` (feedback=False) computing the same logits as ``llama``."""
    model = FullBandwidthLM(model_config(llama.config))
    source = llama.state_dict()
    state = {name: source[llama_name(name)] for name in model.state_dict()}
    model.load_state_dict(state, strict=True)
    p = llama.get_input_embeddings().weight
    return model.to(device=p.device, dtype=p.dtype).train(llama.training)


def _rope_parameters(llama: LlamaConfig) -> dict:
    # transformers 5 keeps RoPE settings in ``rope_parameters``; older configs had rope_theta + rope_scaling.
    params = getattr(llama, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = getattr(llama, "rope_scaling", None) or {}
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), "rope_theta": llama.rope_theta}


def require(ok: bool, name: str, value: object, why: str) -> None:
    if not ok:
        raise ValueError(f"cannot convert: {name}={value!r} ({why})")
