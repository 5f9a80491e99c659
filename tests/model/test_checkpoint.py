"""save_pretrained / from_pretrained round trip and clear failures on bad checkpoints."""

import json

import pytest
import torch
from conftest import make_model

from fullband import FullBandwidthLM
from fullband.generation import generate
from fullband.model.serialization import CheckpointError


@pytest.mark.parametrize("overrides", [{}, {"feedback": False}, {"tie_embeddings": False},
                                       {"position_encoding": "none"}])
def test_round_trip_gives_identical_logits(tmp_path, tokens, overrides):
    model = make_model(dtype=torch.float32, **overrides)
    model.save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["position_encoding"] == model.config.position_encoding
    loaded = FullBandwidthLM.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, passes=3).logits, model(tokens, passes=3).logits, atol=0, rtol=0)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "README.md", "config.json", "configuration_fullband.py", "model.safetensors", "modeling_fullband.py"]
    if model.config.tie_embeddings:
        assert loaded.lm_head.weight is loaded.embed.weight


@pytest.mark.parametrize("feedback", [True, False])
def test_checkpoint_from_before_the_input_norm_decodes_as_trained(tmp_path, tokens, feedback):
    # Such a checkpoint's config.json has no input_norm key and its fusion holds out_norm (RMSNorm_in).
    model = make_model(dtype=torch.float32, input_norm="fused", feedback=feedback)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["input_norm"], config["input_norm_init"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = FullBandwidthLM.from_pretrained(tmp_path)
    assert loaded.config.input_norm == "fused" and loaded.input_norm is None
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, passes=3).logits, model(tokens, passes=3).logits, atol=0, rtol=0)
        assert generate(loaded, [1, 2, 3], max_new_tokens=5) == generate(model, [1, 2, 3], max_new_tokens=5)


@pytest.mark.parametrize("form", ["transformers", "bare"])
def test_checkpoint_from_before_the_position_encoding_option_loads_as_rope(tmp_path, tokens, form):
    # Every model had RoPE before position_encoding existed: a config.json without the key must read as "rope", in
    # transformers' form (model_type and decoding defaults beside the fields) and in the older bare ModelConfig one.
    model = make_model(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if form == "bare":
        config = model.config.to_dict()
    del config["position_encoding"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = FullBandwidthLM.from_pretrained(tmp_path)
    assert loaded.config.position_encoding == "rope" and loaded.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, passes=3).logits, model(tokens, passes=3).logits, atol=0, rtol=0)


@pytest.mark.parametrize(("written", "form"), [(True, "all"), (False, "fused")])
def test_boolean_input_norm_checkpoints_decode_as_trained(tmp_path, tokens, written, form):
    # Checkpoints from when input_norm was a boolean: true normalised every input, false only the fused ones.
    model = make_model(dtype=torch.float32, input_norm=form)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["input_norm"], config["input_norm_init"] = written, 0.02
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = FullBandwidthLM.from_pretrained(tmp_path)
    assert loaded.config.input_norm == form
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, passes=3).logits, model(tokens, passes=3).logits, atol=0, rtol=0)
        assert generate(loaded, [1, 2, 3], max_new_tokens=5, mode="soft") == \
            generate(model, [1, 2, 3], max_new_tokens=5, mode="soft")


@pytest.mark.parametrize("form", ["fused", "paper", "all"])
def test_checkpoints_record_the_input_form(tmp_path, tokens, form):
    model = make_model(dtype=torch.float32, input_norm=form)
    assert (model.fusion.out_norm is not None) == (form == "fused")  # else the model's input norm serves both
    assert (model.input_norm is None) == (form == "fused")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["input_norm"] == form
    loaded = FullBandwidthLM.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, passes=3).logits, model(tokens, passes=3).logits, atol=0, rtol=0)


def test_new_models_normalise_only_fused_inputs():
    config = make_model().config
    assert config.input_norm == "fused" and config.input_gain == 1.0


def test_load_casts_to_requested_dtype(tmp_path):
    make_model(dtype=torch.float32).save_pretrained(tmp_path)
    assert FullBandwidthLM.from_pretrained(tmp_path, dtype=torch.float64).embed.weight.dtype == torch.float64


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        FullBandwidthLM.from_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        FullBandwidthLM.from_pretrained(tmp_path)
    make_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"has no model\.safetensors"):
        FullBandwidthLM.from_pretrained(tmp_path)


def test_truncated_weights_are_reported_as_corrupted(tmp_path):
    make_model().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        FullBandwidthLM.from_pretrained(tmp_path)


def test_missing_and_misshapen_tensors_are_named(tmp_path):
    make_model(feedback=False).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "feedback": True}))
    with pytest.raises(CheckpointError, match=r"missing tensors \['fusion.gate_proj.weight'"):
        FullBandwidthLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 99}))
    with pytest.raises(CheckpointError, match=r"shape mismatches \['embed.weight: checkpoint \(61, 32\) vs model"):
        FullBandwidthLM.from_pretrained(tmp_path)


def test_bad_config_json_is_reported(tmp_path):
    make_model().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"d_model": 32, "colour": "red"}')
    with pytest.raises(CheckpointError, match="unknown ModelConfig key"):
        FullBandwidthLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        FullBandwidthLM.from_pretrained(tmp_path)


def test_adding_feedback_to_a_baseline_checkpoint_keeps_the_standard_path(tmp_path, tokens):
    baseline = make_model(feedback=False)
    baseline.save_pretrained(tmp_path)
    upgraded = FullBandwidthLM.from_pretrained(tmp_path, dtype=torch.float64, feedback=True)
    assert upgraded.fusion is not None and upgraded.config.feedback
    with torch.no_grad():
        torch.testing.assert_close(upgraded(tokens).logits, baseline(tokens).logits, atol=0, rtol=0)
        assert not torch.allclose(upgraded(tokens, passes=2).logits, baseline(tokens).logits)
    upgraded.save_pretrained(tmp_path / "fb")
    dropped = FullBandwidthLM.from_pretrained(tmp_path / "fb", dtype=torch.float64, feedback=False)
    assert dropped.fusion is None
