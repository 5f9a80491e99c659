"""The decoding mode as one value from one registry: each mode has one spelling that parses to it, other spellings
and bad ones get one line naming what to write, the registry maps a mode to its prefill and makes the names, the
help and the server's pattern, and the names the studies write stay the committed strings."""

import pytest

from fullband.config import ConfigError
from fullband.generation import generate
from fullband.modes import (
    DECODING_MODES,
    EXACT,
    REGISTRY,
    SOFT,
    STANDARD,
    DecodeOptions,
    DecodingMode,
    ModeSpec,
    Prefill,
    fused,
    mode_pattern,
    prefill_of,
    register_mode,
    spellings,
    unregister_mode,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("standard", STANDARD), ("soft", SOFT), ("exact", EXACT), ("fused:0", fused(0)), ("fused:2", fused(2)),
    ("fused:12", fused(12)),
])
def test_each_mode_has_one_spelling_that_parses_to_its_value_and_back(text, expected):
    mode = DecodingMode.parse(text)
    assert mode == expected and str(mode) == text  # str() is the canonical spelling
    assert DecodingMode.parse(mode) is mode  # a parsed value passes through


@pytest.mark.parametrize(("text", "use"), [
    ("fused", "fused:K"),  # the older two-option spelling (fused + prefill_passes): the count goes in the mode
    ("fused2", "fused:2"),  # a results.json key
    ("fused(2)", "fused:2"),  # a report label
    ("fused(12)", "fused:12"),
])
def test_other_spellings_are_refused_in_one_line_naming_the_canonical_one(text, use):
    with pytest.raises(ConfigError) as err:
        DecodingMode.parse(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"mode={text!r}") and f"write {use}" in message
    assert err.value.field == "mode"
    with pytest.raises(ConfigError, match=f"write {use}"):
        DecodeOptions(mode=text)  # what the command line, config files and the server build


@pytest.mark.parametrize("bad", ["turbo", "Soft", "fused:", "fused:-1", "fused:x", "fused:1.5", "fused:²", "soft:2",
                                 "", None, 3])
def test_a_bad_spelling_gets_one_line_naming_the_valid_ones(bad):
    with pytest.raises(ConfigError) as err:
        DecodingMode.parse(bad)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"mode={bad!r} is invalid")
    if bad != "soft:2":
        assert spellings() in message and spellings() == "standard, soft, fused:K, exact"


def test_the_error_names_the_option_it_came_from():
    with pytest.raises(ConfigError, match=r"^score_mode='nope' is invalid"):
        DecodingMode.parse("nope", name="score_mode")
    with pytest.raises(ConfigError, match="K must be an integer >= 0"):
        DecodingMode.parse("fused", -1)
    with pytest.raises(ConfigError, match="takes no pass count"):
        DecodingMode("soft", 2)


def test_a_name_and_a_count_held_apart_build_the_value_a_study_needs():
    """The reasoning study holds --modes and --fused_passes apart: parse(name, count) is its form, never typed."""
    assert DecodingMode.parse("fused", 3) == fused(3) and DecodingMode.parse("standard", 0) == STANDARD
    with pytest.raises(ConfigError, match="takes no pass count"):
        DecodingMode.parse("soft", 2)
    with pytest.raises(ConfigError, match="carries its pass count"):
        DecodingMode.parse("fused:2", 3)


def test_the_pattern_in_the_servers_schema_takes_exactly_what_parse_takes():
    import re

    pattern = mode_pattern()
    for text in ("standard", "soft", "fused:0", "fused:17", "exact"):
        assert re.fullmatch(pattern.strip("^$"), text)
        DecodingMode.parse(text)
    for text in ("turbo", "fused", "fused2", "fused(2)", "fused:", "fused:-1", "fused:a", "exact:2"):
        assert not re.fullmatch(pattern.strip("^$"), text)
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
        for k in (0, 1, 2, 8) if mode == "fused" else (0,):  # the study's loop: fused once per pass count
            assert variant_name("fullband", mode, k) == f"fullband {mode}" + (f"({k})" if mode == "fused" else "")
            assert variant_name("baseline", mode, k) == "baseline"
            label = variant_name("fullband", mode, k).split()[-1]
            assert DecodingMode.from_label(label) == DecodingMode.parse(mode, k)
    # state tracking: its prefills are the prefills of standard, fused(1) and exact
    assert PREFILLS == {"standard": 1, "one-step": 2, "exact": None}


def test_every_consumer_takes_fused_k_with_its_k_passes():
    """generate, lm-eval scoring and transformers' generate read ``fused:2`` as two extra prompt passes."""
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
    two = generate(model, prompt, 8, mode="fused:2")
    assert generate(model, prompt, 8, mode=fused(2)) == two
    with pytest.raises(ConfigError, match="fused:K"):  # one spelling, from Python too
        generate(model, prompt, 8, mode="fused")
    assert generate(model, prompt, 8, mode="fused:0") != two or generate(model, prompt, 8, mode="fused:1") != two
    pairs = [(prompt, [9, 2, 30]), (prompt[:2], [4])]
    assert score_continuations(model, pairs, "fused:2") == score_continuations(model, pairs, fused(2))
    assert score_continuations(model, pairs, "fused:2") != score_continuations(model, pairs, "fused:0")
    hf = FullBandwidthForCausalLM.from_native(model, decoding_mode="fused:2").eval()
    assert hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist() == two


@pytest.mark.parametrize(("options", "field"), [
    (dict(mode="turbo"), "mode"), (dict(mode="fused:x"), "mode"), (dict(mode="fused"), "mode"),
    (dict(exact_chunk_size=0), "exact_chunk_size"), (dict(temperature=-0.5), "temperature"),
    (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(seed="7"), "seed"),
    (dict(seed=1.5), "seed"), (dict(stop_token_ids=(3, -1)), "stop_token_ids"), (dict(pad_token_id=-2), "pad_token_id"),
])
def test_decode_options_refuse_a_bad_value_naming_the_field(options, field):
    with pytest.raises(ConfigError) as err:
        DecodeOptions(**options)
    assert err.value.field == field and str(err.value).startswith(f"{field}=")  # what the server's 400 names


def test_prefill_passes_is_no_option_of_decode_options():
    with pytest.raises(TypeError):
        DecodeOptions(prefill_passes=2)


def test_decode_options_hold_the_parsed_mode_and_the_sampling_settings():
    assert DecodeOptions().decoding_mode == SOFT and DecodeOptions().temperature == 0  # DESIGN.md §5's default
    assert DecodeOptions("fused:3").decoding_mode == fused(3)
    assert DecodeOptions(fused(2)).mode == "fused:2"  # a parsed mode is held by its canonical spelling
    assert DecodeOptions(stop_token_ids=[2, 5]).stop_token_ids == (2, 5)


def test_the_registry_makes_the_names_the_spellings_the_help_and_the_pattern():
    assert tuple(REGISTRY) == DECODING_MODES == ("standard", "soft", "fused", "exact")
    toy = register_mode(ModeSpec("toy_deep", lambda _: Prefill(3, carries=True), help="three prompt passes"))
    try:
        assert DecodingMode.parse("toy_deep") == DecodingMode("toy_deep") and prefill_of(DecodingMode("toy_deep")) == \
            Prefill(3, carries=True)
        assert spellings().endswith(", toy_deep") and "toy_deep" in mode_pattern()
        assert DecodeOptions(mode="toy_deep").decoding_mode.spec is toy
        with pytest.raises(ValueError, match="already registered"):
            register_mode(toy)
    finally:
        unregister_mode("toy_deep")
    assert "toy_deep" not in spellings() and "toy_deep" not in mode_pattern()
    with pytest.raises(ConfigError):
        DecodingMode.parse("toy_deep")
    with pytest.raises(ValueError, match="built in"):
        unregister_mode("soft")
    with pytest.raises(ValueError, match="no digits"):
        register_mode(ModeSpec("fused3", lambda _: Prefill(1, carries=True)))  # a results key of fused
