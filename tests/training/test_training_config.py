"""Training config sections: validation messages name the field and the allowed range; files/flags parse."""

from dataclasses import dataclass, field

import pytest

from fullband.config import ConfigError
from fullband.configio import build_config, config_to_dict
from fullband.training.config import TRAIN_PRESETS, OptimConfig, ScheduleConfig, TrainConfig


@dataclass
class Run:
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


def test_the_paper_presets_mix_is_the_papers_overall_split():
    cfg = ScheduleConfig(**TRAIN_PRESETS["paper"]["schedule"])
    after = 1 - cfg.feedback_start
    assert cfg.feedback_start == pytest.approx(0.75)
    assert [after * p for p in cfg.pass_mix] == pytest.approx([0.22, 0.03])


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (ScheduleConfig, {"feedback_start": 1.5}, r"feedback_start=1.5 .*\[0, 1\]"),
        (ScheduleConfig, {"pass_mix": (0.5, 0.4)}, r"pass_mix=.*must sum to 1"),
        (ScheduleConfig, {"pass_mix": ()}, r"pass_mix=.*non-empty"),
        (ScheduleConfig, {"pass_mix": (1.2, -0.2)}, r"pass_mix=.*\[0, 1\]"),
        (ScheduleConfig, {"ramp_steps": -1}, r"ramp_steps=-1 .*>= 0"),
        (OptimConfig, {"lr": 0.0}, r"lr=0.0 .*> 0"),
        (OptimConfig, {"betas": (0.9, 1.0)}, r"betas=.*\[0, 1\)"),
        (OptimConfig, {"schedule": "linear"}, r"schedule='linear' .*cosine"),
        (OptimConfig, {"decay_fraction": 0.0}, r"decay_fraction=0.0 .*\(0, 1\]"),
        (OptimConfig, {"z_loss_when": "sometimes"}, r"z_loss_when='sometimes' .*cooldown"),
        (OptimConfig, {"grad_clip": -1.0}, r"grad_clip=-1.0 .*>= 0"),
        (TrainConfig, {"seq_len": 1}, r"seq_len=1 .*>= 2"),
        (TrainConfig, {"grad_accum": 0}, r"grad_accum=0 .*>= 1"),
        (TrainConfig, {"token_budget": 0}, r"token_budget=0 .*>= 1"),
        (TrainConfig, {"autocast": "fp16"}, r"autocast='fp16' .*auto"),
        (TrainConfig, {"jitter": float("nan")}, r"jitter=nan .*>= 0"),
        (OptimConfig, {"optimizer": "sgd"}, r"optimizer='sgd' .*adamw.*muon.*normuon"),
        (OptimConfig, {"muon_lr": -1.0}, r"muon_lr=-1.0 .*> 0"),
        (OptimConfig, {"muon_momentum": 1.0}, r"muon_momentum=1.0 .*\[0, 1\)"),
        (OptimConfig, {"fusion_lr_mult": 0.0}, r"fusion_lr_mult=0.0 .*> 0"),
        (OptimConfig, {"muon_params": ()}, r"muon_params=.*non-empty"),
        (OptimConfig, {"normuon_beta2": 1.0}, r"normuon_beta2=1.0 .*\[0, 1\)"),
        (OptimConfig, {"ns_dtype": "float16"}, r"ns_dtype='float16' .*auto.*float32.*bfloat16"),
        (OptimConfig, {"ns_steps": 0}, r"ns_steps=0 .*integer >= 1"),
        (ScheduleConfig, {"two_pass_until": 1.5}, r"two_pass_until=1.5 .*\[0, 1\]"),
        (ScheduleConfig, {"feedback_end": 1.2}, r"feedback_end=1.2 .*cannot outlast the run"),
        (ScheduleConfig, {"feedback_start": 0.5, "feedback_end": 0.5}, r"feedback_end=0.5 .*after feedback_start"),
        (ScheduleConfig, {"feedback_start": 0.5, "two_pass_until": 0.25}, r"two_pass_until=0.25 .*feedback_start"),
    ],
)
def test_bad_values_name_field_and_range(cls, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


def test_token_budget_sets_the_step_count():
    cfg = TrainConfig(token_budget=10_000, batch_size=4, seq_len=32, grad_accum=2)
    assert cfg.tokens_per_step(world_size=2) == 512
    assert cfg.total_steps(world_size=2) == 20  # ceil(10000 / 512)
    assert TrainConfig(max_steps=7).total_steps() == 7


def test_sections_parse_from_flags_and_round_trip():
    flags = {"--schedule.pass_mix": "0,1", "--optim.betas": "0.8,0.9", "--train.token_budget": "none"}
    run = build_config(Run, {"schedule": {"feedback_start": 0}}, flags)
    assert run.schedule.pass_mix == (0.0, 1.0) and run.schedule.feedback_start == 0.0
    assert run.optim.betas == (0.8, 0.9)
    assert build_config(Run, config_to_dict(run), {}) == run
    with pytest.raises(ConfigError, match=r"schedule\.pass_mix=.*must sum to 1"):
        build_config(Run, None, {"--schedule.pass_mix": "0.5"})
