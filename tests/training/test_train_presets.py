"""One recipe: ``fullband train``'s defaults are the recipe ``fullband compare`` trains with; the paper's
published recipe is the ``paper`` preset (fullband.training.config.TRAIN_PRESETS)."""

from pathlib import Path

import pytest

from fullband.config import ConfigError
from fullband.configio import build_config, load_config_file, save_resolved_config
from fullband.experiments.compare.config import CompareConfig
from fullband.experiments.core.lm.runs import plan_runs, preset_config, train_config
from fullband.training.config import OptimConfig, ScheduleConfig, TrainRunConfig


def test_train_defaults_are_the_recipe_compare_trains_with():
    train = build_config(TrainRunConfig, None, {})
    assert train.preset == "recipe"
    assert (train.optim.optimizer, train.optim.lr, train.optim.muon_lr, train.optim.muon_weight_decay,
            train.optim.fusion_lr_mult, train.optim.warmup_steps) == ("normuon", 1e-3, 0.02, 0.01, 3.0, 25)
    assert (train.schedule.feedback_start, train.schedule.pass_mix) == (0.0, (0.88, 0.12))
    assert (train.model.input_norm, train.model.gate_norm) == ("fused", "own")
    compare = CompareConfig()
    assert train.optim == compare.optim == OptimConfig()
    assert train.schedule == compare.schedule == ScheduleConfig()
    for name in ("input_norm", "input_norm_init", "gate_norm", "feedback_source", "fusion"):
        assert getattr(train.model, name) == getattr(compare.model, name)
    # and each compare run trains with exactly that recipe (only its size, budget, seed and feedback differ)
    for spec in plan_runs(preset_config("default")):
        run = train_config(preset_config("default"), spec, Path("/tmp/x"))
        assert run.optim == train.optim
        assert run.schedule.feedback_start == train.schedule.feedback_start


def test_the_paper_preset_is_the_papers_published_recipe():
    paper = build_config(TrainRunConfig, None, {"preset": "paper"})
    o, s = paper.optim, paper.schedule
    assert (o.optimizer, o.muon_lr, o.muon_weight_decay, o.lr, o.weight_decay) == ("normuon", 1e-2, 0.01, 5e-4, 0.0)
    assert (o.schedule, o.warmup_steps, o.decay_fraction, o.min_lr_ratio, o.fusion_lr_mult) == (
        "wsd", 200, 0.25, 0.0, 1.0)
    assert (s.feedback_start, s.pass_mix) == (0.75, (0.88, 0.12))
    # the rest is the recipe's (the preset names only what differs)
    assert paper.model == build_config(TrainRunConfig, None, {}).model
    assert paper.train == build_config(TrainRunConfig, None, {}).train


def test_flags_and_files_override_the_preset(tmp_path):
    cfg = build_config(TrainRunConfig, None, {"preset": "paper", "optim.lr": "3e-4", "schedule.feedback_start": "0.5"})
    assert (cfg.optim.lr, cfg.schedule.feedback_start, cfg.optim.warmup_steps) == (3e-4, 0.5, 200)
    path = tmp_path / "run.toml"
    path.write_text('preset = "paper"\n[optim]\nwarmup_steps = 10\n')
    cfg = build_config(TrainRunConfig, load_config_file(path), {})
    assert (cfg.optim.warmup_steps, cfg.optim.lr) == (10, 5e-4)
    # a resolved config written by a run loads back to the same config
    save_resolved_config(cfg, tmp_path / "resolved.toml")
    assert build_config(TrainRunConfig, load_config_file(tmp_path / "resolved.toml"), {}) == cfg


def test_an_unknown_preset_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"preset='fast' is invalid: must be one of \('recipe', 'paper'\)"):
        build_config(TrainRunConfig, None, {"preset": "fast"})
