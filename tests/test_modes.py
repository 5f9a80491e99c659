"""The decoding mode as one value: every accepted spelling parses to it, bad ones get one line naming the valid
values, one function maps a mode to its prefill, and the names the studies write stay the committed strings."""

import pytest

from fullband.config import ConfigError
from fullband.generation import generate
from fullband.modes import (
    DECODING_MODES,
    EXACT,
    MODE_PATTERN,
    SOFT,
    STANDARD,
    DecodeOptions,
    DecodingMode,
    Prefill,
    fused,
    mode_of_prefill,
    prefill_of,
)


@pytest.mark.parametrize(("text", "passes", "expected", "canonical"), [
    ("standard", 1, STANDARD, "standard"),
    ("soft", 1, SOFT, "soft"),
    ("exact", 1, EXACT, "exact"),
    ("fused", 1, fused(1), "fused:1"),
    ("fused", 3, fused(3), "fused:3"),  # the older spelling: mode=fused with a separate pass count
    ("fused:2", 1, fused(2), "fused:2"),  # fused:K carries its own count; prefill_passes is for a bare fused
    ("fused:0", 5, fused(0), "fused:0"),
    ("fused:12", 1, fused(12), "fused:12"),
    ("standard", 7, STANDARD, "standard"),  # a pass count means nothing outside fused
])
def test_every_spelling_parses_to_one_value_with_a_canonical_name(text, passes, expected, canonical):
    mode = DecodingMode.parse(text, passes)
    assert mode == expected and str(mode) == canonical
    assert DecodingMode.parse(str(mode)) == mode  # the canonical name parses back to the same value
    assert DecodingMode.parse(mode) is mode  # a parsed value passes through


@pytest.mark.parametrize("bad", ["turbo", "Soft", "fused:", "fused:-1", "fused:x", "fused:1.5", "fused:²", "", None, 3])
def test_a_bad_spelling_gets_one_line_naming_the_valid_ones(bad):
    with pytest.raises(ConfigError) as err:
        DecodingMode.parse(bad)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"mode={bad!r} is invalid")
    assert all(name in message for name in (*DECODING_MODES, "fused:K"))


def test_the_error_names_the_option_it_came_from():
    with pytest.raises(ConfigError, match=r"^score_mode='nope' is invalid"):
        DecodingMode.parse("nope", name="score_mode")
    with pytest.raises(ConfigError, match=r"^prefill_passes=-1 is invalid"):
        DecodingMode.parse("fused", -1)
    with pytest.raises(ConfigError, match=r"^prefill_passes=-1 is invalid"):  # checked in every mode, as before
        DecodeOptions("soft", -1)
    with pytest.raises(ConfigError, match="only fused"):
        DecodingMode("soft", 2)


def test_the_pattern_in_the_servers_schema_takes_exactly_what_parse_takes():
    import re

    for text in ("standard", "soft", "fused", "fused:0", "fused:17", "exact"):
        assert re.fullmatch(MODE_PATTERN.strip("^$"), text)
        DecodingMode.parse(text)
    for text in ("turbo", "fused:", "fused:-1", "fused:a", "exact:2"):
        assert not re.fullmatch(MODE_PATTERN.strip("^$"), text)
        with pytest.raises(ConfigError):
            DecodingMode.parse(text)


def test_one_function_maps_a_mode_to_its_prefill():
    assert prefill_of(STANDARD) == Prefill(passes=1, carries=False)  # one plain pass, plain decoding
    assert prefill_of(SOFT) == Prefill(passes=1, carries=True)  # one plain pass, fused decoding
    assert prefill_of(fused(3)) == Prefill(passes=4, carries=True)  # 1 + k passes, p = 1
    assert prefill_of(fused(0)) == Prefill(passes=1, carries=True)
    assert prefill_of(EXACT) == Prefill(passes=None, carries=True) and prefill_of(EXACT).exact
    assert not any(prefill_of(m).exact for m in (STANDARD, SOFT, fused(2)))


def test_the_names_written_into_results_stay_the_committed_strings():
    from fullband.experiments.core.lm.perplexity import mode_name
    from fullband.experiments.core.report import mode_label
    from fullband.experiments.reasoning.evaluation import variant_name
    from fullband.experiments.state_tracking.probes import PREFILLS

    # compare: results.json keys and their report labels (the formulas they replaced, spelled out)
    for k in range(0, 9):
        assert mode_name(k) == ("standard" if k == 0 else f"fused{k}")
    for key in ("standard", "exact", "fused1", "fused2", "fused16"):
        old = {"standard": "standard", "exact": "exact"}.get(key) or f"fused({key.removeprefix('fused')})"
        assert mode_label(key) == old
        assert DecodingMode.from_result_key(key).result_key == key
    # reasoning: the variant names of every mode and pass count
    for mode in DECODING_MODES:
        for k in (0, 1, 2, 8):
            assert variant_name("fullband", mode, k) == f"fullband {mode}" + (f"({k})" if mode == "fused" else "")
            assert variant_name("baseline", mode, k) == "baseline"
            label = variant_name("fullband", mode, k).split()[-1]
            assert DecodingMode.from_label(label) == DecodingMode.parse(mode, k)
    # state tracking: its prefills are the prefills of standard, fused(1) and exact
    assert PREFILLS == {"standard": 1, "one-step": 2, "exact": None}


def test_every_consumer_takes_fused_k_as_fused_with_k_passes():
    """generate, lm-eval scoring and transformers' generate read ``fused:2`` as ``fused`` with prefill_passes=2."""
    import torch

    from fullband import FullBandwidthLM, ModelConfig
    from fullband.evaluation.continuation import score_continuations
    from fullband.integrations.hf import FullBandwidthForCausalLM

    torch.manual_seed(0)
    model = FullBandwidthLM(ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, max_seq_len=32,
                                        feedback=True)).double().eval()
    with torch.no_grad():
        model.fusion.state_proj.weight.mul_(30)  # so that the pass count shows in the tokens
    prompt = [5, 17, 3, 44, 8, 21]
    two = generate(model, prompt, 8, mode="fused", prefill_passes=2)
    assert generate(model, prompt, 8, mode="fused:2") == two
    assert generate(model, prompt, 8, mode=fused(2), prefill_passes=7) == two  # a parsed value carries its count
    assert generate(model, prompt, 8, mode="fused:0") != two or generate(model, prompt, 8, mode="fused:1") != two
    pairs = [(prompt, [9, 2, 30]), (prompt[:2], [4])]
    assert score_continuations(model, pairs, "fused:2") == score_continuations(model, pairs, "fused", prefill_passes=2)
    hf = FullBandwidthForCausalLM.from_native(model, decoding_mode="fused:2").eval()
    assert hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist() == two


@pytest.mark.parametrize(("options", "field"), [
    (dict(mode="turbo"), "mode"), (dict(mode="fused:x"), "mode"), (dict(prefill_passes=-1), "prefill_passes"),
    (dict(exact_chunk_size=0), "exact_chunk_size"), (dict(temperature=-0.5), "temperature"),
    (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(seed=2**64), "seed"),
    (dict(seed=1.5), "seed"), (dict(stop_token_ids=(3, -1)), "stop_token_ids"), (dict(pad_token_id=-2), "pad_token_id"),
])
def test_decode_options_refuse_a_bad_value_naming_the_field(options, field):
    with pytest.raises(ConfigError) as err:
        DecodeOptions(**options)
    assert err.value.field == field and str(err.value).startswith(f"{field}=")  # what the server's 400 names


def test_decode_options_hold_the_parsed_mode_and_the_sampling_settings():
    assert DecodeOptions().decoding_mode == SOFT and DecodeOptions().greedy  # DESIGN.md §5's default
    assert DecodeOptions("fused", 3).decoding_mode == fused(3) == DecodeOptions("fused:3").decoding_mode
    assert DecodeOptions(fused(2)).mode == "fused:2"  # a parsed mode is held by its canonical spelling
    assert DecodeOptions(stop_token_ids=[2, 5]).stop_token_ids == (2, 5)
    assert not DecodeOptions(temperature=0.7).greedy


@pytest.mark.parametrize("mode", [STANDARD, SOFT, EXACT, fused(0), fused(1), fused(4)])
def test_the_mode_of_a_prefill_runs_that_prefill(mode):
    plan = prefill_of(mode)
    assert prefill_of(mode_of_prefill(plan)) == plan
