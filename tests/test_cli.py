"""The command line: help, generate from a checkpoint, clear errors with exit code 2."""

import pytest
import torch
from conftest import make_model

from fullband.cli import commands, main
from fullband.config import ConfigError
from fullband.configio import build_config
from fullband.generation import generate

COMMANDS = commands()  # every subcommand, the studies' from their registry


@pytest.fixture
def checkpoint(tmp_path):
    model = make_model(dtype=torch.float32)
    model.save_pretrained(tmp_path / "ckpt")
    return model, str(tmp_path / "ckpt")


def test_help_lists_commands_and_documented_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help text to the terminal width
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "generate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "fused:K = the prompt gets K >= 0 extra fused (Jacobi) passes" in " ".join(out.split())  # the registry's
    assert "prefill_passes" not in out  # retired: hidden, refused with a line naming fused:K


def test_generate_prints_token_ids_without_tokenizer(checkpoint, capsys):
    model, path = checkpoint
    assert main(["generate", "--checkpoint", path, "--prompt", "5 17 3", "--decode.mode", "exact",
                 "--max-new-tokens", "6"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    assert printed == generate(model, [5, 17, 3], max_new_tokens=6, mode="exact")


def test_generate_with_the_compiled_step_says_it_compiles_first(checkpoint, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: module)  # the tokens, without the compile's wait
    model, path = checkpoint
    assert main(["generate", "--checkpoint", path, "--prompt", "5 17 3", "--max-new-tokens", "4",
                 "--decode.step", "compiled"]) == 0
    out, err = capsys.readouterr()
    assert [int(t) for t in out.split()] == generate(model, [5, 17, 3], max_new_tokens=4)
    assert err.count("\n") == 1 and "the decode step compiles before its first token" in err


def test_generate_reads_a_config_file_and_flags_override_it(checkpoint, tmp_path, capsys):
    model, path = checkpoint
    config = f'checkpoint = "{path}"\nprompt = "1,2"\nmax_new_tokens = 3\n[decode]\nmode = "standard"\n'
    (tmp_path / "gen.toml").write_text(config)
    assert main(["generate", "--config", str(tmp_path / "gen.toml"), "--decode.mode", "fused:1"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    assert printed == generate(model, [1, 2], max_new_tokens=3, mode="fused:1")


def test_generate_with_a_drafter_prints_the_same_tokens(checkpoint, tmp_path, capsys):
    model, path = checkpoint
    make_model(seed=3, feedback=False, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
               dtype=torch.float32).save_pretrained(tmp_path / "small")
    expected = generate(model, [5, 17, 3], max_new_tokens=12, mode="soft")
    for drafter in ("standard", "early_exit", str(tmp_path / "small")):
        assert main(["generate", "--checkpoint", path, "--prompt", "5 17 3", "--max_new_tokens", "12",
                     "--drafter", drafter, "--gamma", "3", "--adaptive_gamma", "true"]) == 0
        assert [int(t) for t in capsys.readouterr().out.split()] == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint", "/nonexistent", "--prompt", "1"], "checkpoint '/nonexistent' does not exist"),
        (["--prompt", "1"], "checkpoint='' is invalid: give the model directory"),
        (["--checkpoint", "CKPT", "--prompt", "hello"], "the prompt must be token ids"),
        (["--checkpoint", "CKPT", "--prompt", "1", "--decode.mode", "fast"], "mode='fast' is invalid: must be one of"),
        (["--checkpoint", "CKPT", "--prompt", "1", "--decode.top_p", "abc"], "expected a float"),
    ],
)
def test_generate_errors_are_one_clear_line(checkpoint, capsys, argv, message):
    argv = [a.replace("CKPT", checkpoint[1]) for a in argv]
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("command", "flat"), [("generate", "--mode"), ("generate", "--temperature"),
                                               ("serve", "--temperature"), ("eval", "--exact_chunk_size")])
def test_the_flat_decoding_flags_are_refused_naming_the_decode_section(command, flat, capsys):
    # generate, serve and eval share [decode]; the flags they took before answer with the one that replaced each
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--checkpoint", "x", flat, "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flat} is now --decode.{flat[2:]}" in err, err
    with pytest.raises(ConfigError, match=rf"{flat[2:]} is now decode.{flat[2:]} \(\[decode\] {flat[2:]} in a config"):
        build_config(COMMANDS[command].config, {flat[2:]: 1}, {})


@pytest.mark.parametrize(("command", "argv", "says"), [
    ("generate", ["--decode.prefill_passes", "2"], "--decode.prefill_passes is retired: use --decode.mode fused:K"),
    ("serve", ["--decode.prefill-passes", "2"], "--decode.prefill-passes is retired: use --decode.mode fused:K"),
    ("eval", ["--prefill_passes", "2"], "--prefill_passes is retired: use --decode.mode fused:K"),
    ("generate", ["--decode.mode", "fused"], "decode.mode='fused' needs its pass count: write fused:K"),
    ("serve", ["--decode.mode", "fused2"], "write fused:2"),
    ("eval", ["--decode.mode", "fused(3)"], "write fused:3"),
])
def test_the_other_mode_spellings_are_refused_in_one_line_naming_fused_k(command, argv, says, capsys):
    """One spelling per mode as input (fused:K); the two-option spelling and the report spellings name it."""
    try:
        code = main([command, "--checkpoint", "x", *argv])
    except SystemExit as exit_info:  # argparse's error for a retired option
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_a_config_file_with_the_retired_prefill_passes_is_refused_naming_fused_k():
    from fullband.generation.config import GenerateConfig

    with pytest.raises(ConfigError, match=r'^decode.prefill_passes is retired: use mode = "fused:K" in \[decode\]'):
        build_config(GenerateConfig, {"checkpoint": "x", "decode": {"mode": "fused", "prefill_passes": 2}}, {})
    with pytest.raises(ConfigError, match=r'^prefill_passes is retired: use mode = "fused:K" in \[decode\]'):
        build_config(GenerateConfig, {"checkpoint": "x", "prefill_passes": 2}, {})
    assert build_config(GenerateConfig, {"checkpoint": "x", "decode": {"mode": "fused:2"}}, {}).decode.mode == "fused:2"
