"""One command-line convention for every command (issue 25): --version, --device auto and --threads auto by default,
sectioned flags where a command trains, and --resume true that fails in one line when there is nothing to resume."""

import argparse

import pytest

from fullband.cli import COMMANDS, build_parser, main
from fullband.config import ConfigError
from fullband.configio import build_config, load_config_file
from fullband.training.config import TrainRunConfig
from fullband.version import __version__

TINY = ["--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.max_steps", "2", "--train.eval_every", "0", "--device", "cpu",
        "--threads", "1"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"fullband {__version__}"


def options(command: str) -> dict[str, str]:
    """--option -> its help text, for one subcommand."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {s: a.help for a in sub._actions for s in a.option_strings if a.help != argparse.SUPPRESS}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_defaults_to_device_auto_and_threads_auto(command):
    shown = options(command)
    assert "(default: auto)" in shown["--threads"], command
    if "--device" in shown:
        assert "(default: auto)" in shown["--device"], command
    assert "--config" in shown


def test_train_resume_true_with_nothing_to_resume_fails_in_one_line(tmp_path, capsys):
    assert main(["train", "--out_dir", str(tmp_path / "run"), *TINY, "--resume", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("fullband train: error: resume=true, but") and "--resume auto" in err
    assert not (tmp_path / "run" / "model").exists()


def test_train_resume_auto_starts_when_there_is_nothing_then_continues(tmp_path):
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="starting from scratch"):
        assert main(["train", "--out_dir", str(out), *TINY, "--resume", "auto"]) == 0
    assert (out / "model").is_dir()
    # now there is a checkpoint (step 2): auto and true both continue from it (nothing left to train)
    assert main(["train", "--out_dir", str(out), *TINY, "--resume", "auto"]) == 0
    assert main(["train", "--out_dir", str(out), *TINY, "--resume", "true"]) == 0


def test_resume_words_and_file_booleans(tmp_path):
    assert TrainRunConfig(resume=True).resume == "true" and TrainRunConfig(resume="no").resume == "false"
    path = tmp_path / "run.toml"
    path.write_text("resume = true\n")  # what config.toml of an earlier run holds
    assert build_config(TrainRunConfig, load_config_file(path), {}).resume == "true"
    with pytest.raises(ConfigError, match=r"resume='sometimes' is invalid: use true .* auto"):
        build_config(TrainRunConfig, None, {"resume": "sometimes"})


@pytest.mark.parametrize("command", ["compare", "recipe", "eval-reasoning"])
def test_study_resume_true_with_nothing_to_resume_fails_in_one_line(tmp_path, capsys, command):
    assert main([command, "--preset", "smoke", "--out_dir", str(tmp_path / "study"), "--resume", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"fullband {command}: error: out_dir=")
    assert "to resume" in err


@pytest.mark.parametrize("command", ["eval-reasoning", "eval-state"])
def test_synthetic_studies_take_the_training_sections_and_the_earlier_flat_names(command):
    shown = options(command)
    for flag in ("--model.d_model", "--train.max_steps", "--train.batch_size", "--optim.lr", "--optim.optimizer",
                 "--schedule.feedback_start", "--schedule.pass_mix"):
        assert flag in shown, flag
    assert "--d_model" not in shown and "--steps" not in shown and "--lr" not in shown  # hidden aliases
    config_cls = COMMANDS[command][0]
    sectioned = ["--model.d_model", "48", "--train.max_steps", "7", "--optim.lr", "0.01", "--train.seed", "3",
                 "--schedule.feedback_start", "0.5"]
    flat = ["--d_model", "48", "--steps", "7", "--lr", "0.01", "--seed", "3", "--feedback_start", "0.5"]
    configs = [build_config(config_cls, None, build_parser().parse_args([command, "--preset", "smoke", *argv]))
               for argv in (sectioned, flat)]
    assert configs[0] == configs[1]
    cfg = configs[0]
    assert (cfg.model.d_model, cfg.train.max_steps, cfg.optim.lr, cfg.seed, cfg.schedule.feedback_start) == (
        48, 7, 0.01, 3, 0.5)
    assert cfg.model.n_layers == config_cls(preset="smoke").model.n_layers  # the rest from the preset


@pytest.mark.parametrize("flag", ["--model.max_seq_len", "--train.seq_len", "--optim.warmup_steps"])
def test_synthetic_studies_refuse_the_keys_they_set_themselves(flag, capsys):
    assert main(["eval-state", "--preset", "smoke", "--out_dir", "unused", flag, "7"]) == 2
    assert f"{flag[2:]}=7 is invalid: the study sets it" in capsys.readouterr().err
