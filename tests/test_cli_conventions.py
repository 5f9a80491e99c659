"""One command-line convention for every command (issue 25): --version, --device auto and --threads auto by default,
sectioned flags where a command trains, and --resume true that fails in one line when there is nothing to resume."""

import argparse
import re

import pytest

from fullband.cli import build_parser, commands, main
from fullband.config import ConfigError
from fullband.configio import build_config, load_config_file
from fullband.training.config import TrainRunConfig
from fullband.version import __version__

COMMANDS = commands()  # every subcommand, the studies' from their registry

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


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "prepare"])  # prepare tokenizes: no model
def test_every_command_that_runs_a_model_takes_device(command):
    assert "(default: auto)" in options(command)["--device"]


def test_check_runs_on_the_device_given(capsys):
    assert main(["check", "--device", "cpu", "--seq_len", "12", "--plain_prefix", "4", "--threads", "1"]) == 0
    assert "float64 on cpu" in capsys.readouterr().out


def test_section_descriptions_in_help_are_whole_sentences():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    descriptions = {g.title: g.description for g in sub._action_groups if g.description}
    assert descriptions["optim"].endswith("see fullband.training.recipes."), descriptions["optim"]
    assert all(d.endswith((".", ")")) for d in descriptions.values()), descriptions


def test_help_texts_tell_no_history():
    history = re.compile(r"issue \d|earlier name|the default before|\(--preset paper\)", re.IGNORECASE)
    for command in COMMANDS:
        told = [f"{flag}: {text}" for flag, text in options(command).items() if history.search(text or "")]
        assert not told, (command, told)


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
def test_synthetic_studies_take_the_training_sections_and_refuse_the_retired_flat_names(command, capsys):
    shown = options(command)
    for flag in ("--model.d_model", "--train.max_steps", "--train.batch_size", "--optim.lr", "--optim.optimizer",
                 "--schedule.feedback_start", "--schedule.pass_mix"):
        assert flag in shown, flag
    config_cls = COMMANDS[command].config
    sectioned = ["--model.d_model", "48", "--train.max_steps", "7", "--optim.lr", "0.01", "--train.seed", "3",
                 "--schedule.feedback_start", "0.5"]
    cfg = build_config(config_cls, None, build_parser().parse_args([command, "--preset", "smoke", *sectioned]))
    assert (cfg.model.d_model, cfg.train.max_steps, cfg.optim.lr, cfg.seed, cfg.schedule.feedback_start) == (
        48, 7, 0.01, 3, 0.5)
    assert cfg.model.n_layers == config_cls(preset="smoke").model.n_layers  # the rest from the preset
    # The flat names they took before: one line naming the flag that replaced each, on the command line and in a file.
    for flat, dotted in (("--steps", "--train.max_steps"), ("--d_model", "--model.d_model"), ("--lr", "--optim.lr")):
        assert "--" + flat[2:] not in shown
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--preset", "smoke", flat, "7"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{flat} is now {dotted}" in err, err
    with pytest.raises(ConfigError, match=r"steps is now train.max_steps \(\[train\] max_steps in a config file\)"):
        build_config(config_cls, {"steps": 7}, {})


@pytest.mark.parametrize("command", ["train", "compare", "recipe", "eval-reasoning", "eval-state"])
def test_every_command_that_resumes_takes_true_auto_and_false(command, tmp_path):
    config_cls = COMMANDS[command].config
    words = {}
    for word in ("true", "auto", "false", "yes", "no"):
        args = build_parser().parse_args([command, "--out_dir", str(tmp_path / "new"), "--resume", word])
        words[word] = build_config(config_cls, None, args).resume
    if command == "train":  # the trainer decides auto by the checkpoints it finds
        assert words == {"true": "true", "auto": "auto", "false": "false", "yes": "true", "no": "false"}
    else:  # a study: auto continues when out_dir holds a study (its config.toml), here none
        assert words == {"true": True, "auto": False, "false": False, "yes": True, "no": False}
        (tmp_path / "old").mkdir()
        (tmp_path / "old" / "config.toml").write_text("")
        args = build_parser().parse_args([command, "--out_dir", str(tmp_path / "old"), "--resume", "auto"])
        assert build_config(config_cls, None, args).resume is True


@pytest.mark.parametrize("flag", ["--model.max_seq_len", "--train.seq_len", "--optim.warmup_steps"])
def test_synthetic_studies_refuse_the_keys_they_set_themselves(flag, capsys):
    assert main(["eval-state", "--preset", "smoke", "--out_dir", "unused", flag, "7"]) == 2
    assert f"{flag[2:]}=7 is invalid: the study sets it" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "eval-reasoning", "eval-state"])
def test_every_command_that_trains_starts_from_the_recipe(command, tmp_path):
    """A bare command trains with fullband train's recipe (the optimizer and feedback schedule of OptimConfig's and
    ScheduleConfig's defaults); the committed AdamW reports are reproduced by naming their preset (adamw)."""
    recipe = TrainRunConfig()
    cfg = build_config(COMMANDS[command].config, None, build_parser().parse_args([command, "--out_dir", str(tmp_path)]))
    for section, key in (("optim", "optimizer"), ("optim", "fusion_lr_mult"), ("optim", "weight_decay"),
                         ("schedule", "feedback_start"), ("schedule", "pass_mix")):
        assert getattr(getattr(cfg, section), key) == getattr(getattr(recipe, section), key), (section, key)
    if command != "train":
        adamw = build_config(COMMANDS[command].config, None,
                             build_parser().parse_args([command, "--preset", "adamw", "--out_dir", str(tmp_path)]))
        assert (adamw.optim.optimizer, adamw.schedule.feedback_start) == ("adamw", 0.75)
        assert adamw.model == cfg.model and adamw.train.max_steps == cfg.train.max_steps  # the same sizes
