"""FullBandwidthForCausalLM: native weights and names, Auto-class round trip, generate() == native generate()."""

import json
import os
import subprocess
import sys

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # everything here is built locally; never touch the hub

import torch
from conftest import make_model
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

import fullband
import fullband.integrations.hf as hf
from fullband import ConfigError, FullBandwidthLM
from fullband.generation import generate
from fullband.integrations.hf import FullBandwidthConfig, FullBandwidthForCausalLM

PROMPT = [5, 17, 3, 44, 8, 21]
NEW = 7
MODES = ["standard", "soft", "fused:2", "exact"]


@pytest.fixture
def native() -> FullBandwidthLM:
    return make_model(dtype=torch.float32)


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(1))


def test_parameters_are_the_native_ones(native):
    model = FullBandwidthForCausalLM.from_native(native)
    assert set(model.state_dict()) == set(native.state_dict())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in native.state_dict().items())
    assert model.native.embed is model.get_input_embeddings()  # one set of modules, not a copy
    assert model.native.lm_head.weight is model.native.embed.weight  # tied, as configured
    model.to(torch.float64)  # moves reach the tensors the native forward reads, buffers included
    assert model.native.inv_freq.dtype == torch.float64 and model.native.embed.weight.dtype == torch.float64


@torch.no_grad()
def test_forward_is_the_native_forward(native, tokens):
    model = FullBandwidthForCausalLM.from_native(native).eval()
    torch.testing.assert_close(model(tokens).logits, native(tokens).logits, atol=0, rtol=0)
    out = model(tokens, passes=3, plain_prefix=2, labels=tokens)
    ref = native(tokens, passes=3, plain_prefix=2)
    torch.testing.assert_close(out.logits, ref.logits, atol=0, rtol=0)
    # labels= (transformers' convention): the next-token loss of the last pass; training runs MultiPassObjective
    expected = torch.nn.functional.cross_entropy(ref.logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    torch.testing.assert_close(out.loss, expected, atol=0, rtol=0)


@torch.no_grad()
def test_auto_class_round_trip_without_remote_code(native, tokens, tmp_path):
    FullBandwidthForCausalLM.from_native(native).save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "fullband"
    assert isinstance(AutoConfig.from_pretrained(tmp_path / "hf"), FullBandwidthConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # no trust_remote_code
    assert isinstance(loaded, FullBandwidthForCausalLM)
    for passes in (1, 4):
        torch.testing.assert_close(loaded(tokens, passes=passes).logits, native(tokens, passes=passes).logits,
                                   atol=0, rtol=0)
    # The weights file holds the native tensors under the native names.
    native.save_pretrained(tmp_path / "native")
    ours = load_file(tmp_path / "hf" / "model.safetensors")
    theirs = load_file(tmp_path / "native" / "model.safetensors")
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


@torch.no_grad()
def test_untied_baseline_round_trips(tmp_path, tokens):
    native = make_model(dtype=torch.float32, feedback=False, tie_embeddings=False)
    FullBandwidthForCausalLM.from_native(native).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.native.lm_head.weight is not loaded.native.embed.weight
    torch.testing.assert_close(loaded(tokens).logits, native(tokens).logits, atol=0, rtol=0)


@torch.no_grad()
def test_nope_model_round_trips_through_the_auto_classes_with_remote_code(tokens, tmp_path):
    """A model without a positional encoding keeps it through from_native, save_pretrained and
    AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True): the same config and the native logits and
    greedy tokens (the reference: the native model, whose NoPE forward tests/model checks against a definition).
    Here fullband is imported, so its registered class answers; test_hf_remote_code.py opens a NoPE checkpoint in
    a process that never imported it."""
    native = make_model(dtype=torch.float32, position_encoding="none")
    model = FullBandwidthForCausalLM.from_native(native).eval()
    assert model.config.position_encoding == "none"
    torch.testing.assert_close(model(tokens, passes=3).logits, native(tokens, passes=3).logits, atol=0, rtol=0)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["position_encoding"] == "none"
    assert "no positional encoding (NoPE)" in (tmp_path / "README.md").read_text()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert loaded.config.to_model_config() == native.config
    for passes in (1, 4):
        torch.testing.assert_close(loaded(tokens, passes=passes).logits, native(tokens, passes=passes).logits,
                                   atol=0, rtol=0)
    for mode in ("standard", "soft"):
        got = loaded.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, decoding_mode=mode)
        assert got[0].tolist() == generate(native, PROMPT, NEW, mode=mode)


@torch.no_grad()
@pytest.mark.parametrize("mode", MODES)
def test_greedy_generate_equals_native_generate(native, mode):
    model = FullBandwidthForCausalLM.from_native(native).eval()
    expected = generate(native, PROMPT, NEW, mode=mode)
    got = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, decoding_mode=mode)
    assert got[0].tolist() == expected


@torch.no_grad()
def test_a_config_json_saved_before_fused_k_reads_as_fused_k_and_saves_the_canonical_form(native, tmp_path):
    FullBandwidthForCausalLM.from_native(native).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["decoding_mode"] == "soft" and "prefill_passes" not in config  # a new save: the count is in the mode
    config.update(decoding_mode="fused", prefill_passes=3)  # what every save wrote before
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = FullBandwidthForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.decoding_mode == "fused:3" and "prefill_passes" not in loaded.config.to_dict()
    got = loaded.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False)[0].tolist()
    assert got == generate(native, PROMPT, NEW, mode="fused:3") != generate(native, PROMPT, NEW, mode="fused:0")
    loaded.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["decoding_mode"] == "fused:3" and "prefill_passes" not in again
    assert FullBandwidthLM.from_pretrained(tmp_path).config == native.config  # the native loader reads it too


def test_generate_refuses_the_retired_prefill_passes_and_a_bare_fused_naming_fused_k(native):
    model = FullBandwidthForCausalLM.from_native(native).eval()
    with pytest.raises(ConfigError, match=r'prefill_passes=2 is retired: .*decoding_mode="fused:K"'):
        model.generate(torch.tensor([PROMPT]), max_new_tokens=2, do_sample=False, decoding_mode="fused",
                       prefill_passes=2)
    with pytest.raises(ConfigError, match="write fused:K"):
        model.generate(torch.tensor([PROMPT]), max_new_tokens=2, do_sample=False, decoding_mode="fused")


@torch.no_grad()
def test_decoding_mode_from_the_config_and_the_modes_differ(native):
    model = FullBandwidthForCausalLM.from_native(native, decoding_mode="exact").eval()
    outputs = {}
    for mode in ("standard", "soft", "exact"):
        model.config.decoding_mode = mode  # the model attribute, saved with the model
        outputs[mode] = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False)[0].tolist()
        assert outputs[mode] == generate(native, PROMPT, NEW, mode=mode)
    assert len(set(map(tuple, outputs.values()))) == 3  # the latent state really is carried


@torch.no_grad()
@pytest.mark.parametrize("mode", ["soft", "exact"])
def test_batched_left_padded_generate_equals_native(native, mode):
    model = FullBandwidthForCausalLM.from_native(native).eval()
    prompts = [PROMPT, [9, 1], [33, 2, 60, 7, 12, 13, 14, 15, 40]]
    ids, mask = torch.zeros(3, 9, dtype=torch.long), torch.zeros(3, 9, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, 9 - len(p) :], mask[row, 9 - len(p) :] = torch.tensor(p), 1
    got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, decoding_mode=mode)
    for row, p in enumerate(prompts):
        assert got[row, 9:].tolist() == generate(native, p, NEW, mode=mode)[len(p) :]


@torch.no_grad()
def test_generate_past_the_first_cache_allocation(native, monkeypatch):
    monkeypatch.setattr(hf, "CACHE_GROWTH", 2)  # the decoding cache must grow several times
    model = FullBandwidthForCausalLM.from_native(native).eval()
    got = model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, decoding_mode="soft")
    assert got[0].tolist() == generate(native, PROMPT, 12, mode="soft")


@torch.no_grad()
def test_generate_stops_at_eos(native):
    model = FullBandwidthForCausalLM.from_native(native).eval()
    full = generate(native, PROMPT, NEW, mode="soft")
    eos = full[len(PROMPT) + 2]
    got = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                         pad_token_id=0, decoding_mode="soft")
    assert got[0].tolist() == full[: full.index(eos, len(PROMPT)) + 1]


def test_decoding_mode_without_a_cache_is_refused(native):
    model = FullBandwidthForCausalLM.from_native(native).eval()
    with pytest.raises(ValueError, match="use_cache"):
        model.generate(torch.tensor([PROMPT]), max_new_tokens=2, use_cache=False, decoding_mode="soft")


def test_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="n_heads"):
        FullBandwidthConfig(d_model=32, n_heads=3)
    with pytest.raises(ConfigError, match="mode"):
        FullBandwidthConfig(decoding_mode="greedy")
    assert FullBandwidthConfig(d_model=64, n_layers=3).to_model_config().d_model == 64
    assert FullBandwidthConfig(n_layers=3).num_hidden_layers == 3  # standard HF names map to ours


def test_import_fullband_does_not_import_transformers():
    code = ("import sys, fullband, fullband.integrations, fullband.model, fullband.generation; "
            "assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    from fullband.integrations.retrofit import retrofit

    assert fullband.retrofit is retrofit  # a lazy attribute of the package
