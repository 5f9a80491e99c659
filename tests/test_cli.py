"""The command line: help, generate from a checkpoint, clear errors with exit code 2."""

import pytest
import torch
from conftest import make_model

from fullband.cli import main


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
    assert "--prefill_passes" in out and "extra fused (Jacobi) passes over the prompt" in out


def test_generate_prints_token_ids_without_tokenizer(checkpoint, capsys):
    model, path = checkpoint
    assert main(["generate", "--checkpoint", path, "--prompt", "5 17 3", "--mode", "exact",
                 "--max-new-tokens", "6"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    assert printed == model.generate([5, 17, 3], max_new_tokens=6, mode="exact")


def test_generate_reads_a_config_file_and_flags_override_it(checkpoint, tmp_path, capsys):
    model, path = checkpoint
    config = f'checkpoint = "{path}"\nprompt = "1,2"\nmode = "standard"\nmax_new_tokens = 3\n'
    (tmp_path / "gen.toml").write_text(config)
    assert main(["generate", "--config", str(tmp_path / "gen.toml"), "--mode", "fused"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    assert printed == model.generate([1, 2], max_new_tokens=3, mode="fused")


def test_generate_with_a_drafter_prints_the_same_tokens(checkpoint, tmp_path, capsys):
    model, path = checkpoint
    make_model(seed=3, feedback=False, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
               dtype=torch.float32).save_pretrained(tmp_path / "small")
    expected = model.generate([5, 17, 3], max_new_tokens=12, mode="soft")
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
        (["--checkpoint", "CKPT", "--prompt", "1", "--mode", "fast"], "mode='fast' is invalid: must be one of"),
        (["--checkpoint", "CKPT", "--prompt", "1", "--top_p", "abc"], "expected a float"),
    ],
)
def test_generate_errors_are_one_clear_line(checkpoint, capsys, argv, message):
    argv = [a.replace("CKPT", checkpoint[1]) for a in argv]
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
