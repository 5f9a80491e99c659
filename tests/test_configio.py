from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest

from fullband.config import ConfigError, ModelConfig, doc
from fullband.configio import (
    add_dataclass_arguments,
    build_config,
    config_from_args,
    config_to_dict,
    load_config_file,
    save_resolved_config,
)


@dataclass
class TrainConfig:
    """Optimisation settings."""

    lr: float = doc(3e-4, "Peak learning rate.")
    max_steps: int = doc(100, "Optimizer steps.")
    compile: bool = doc(False, "Compile the model with torch.compile.")
    warmup: int | None = doc(None, "Warmup steps; None = 10% of max_steps.")
    betas: tuple[float, float] = doc((0.9, 0.95), "AdamW betas.")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr!r} is invalid: must be > 0")


@dataclass
class DataConfig:
    name: str | None = doc("tiny", "Dataset name; none = synthetic.")
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Data seeds."})
    weights: list[float] = field(default_factory=list, metadata={"help": "Mixture weights."})


@dataclass
class Run:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=128), metadata={"help": "Model."})
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    out_dir: str = doc("runs/x", "Output directory.")


@dataclass
class Needs:
    out_dir: str = field(metadata={"help": "Where to write."})


def parse(argv: list[str], cls: type = Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    add_dataclass_arguments(parser, cls)
    return parser.parse_args(argv)


def test_help_lists_field_help_defaults_and_sections() -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Run)
    text = parser.format_help()
    assert "--train.max_steps INT" in text and "Optimizer steps. (default: 100)" in text
    assert "10%" in text and "(default: none)" in text
    assert "Optimisation settings." in text  # section docstring as the group description
    assert "(default: 128)" in text  # the section's default instance, not ModelConfig's class default
    assert "--train.max-steps" not in text  # the dash alias works but is not listed twice
    assert "Output directory. (default: runs/x)" in text


def test_precedence_cli_over_file_over_default(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('out_dir = "file"\n[train]\nlr = 0.1\nmax_steps = 7\n[model]\nn_layers = 2\n')
    args = parse(["--config", str(path), "--train.max-steps", "9", "--model.n_heads=8"])
    run = config_from_args(Run, args)
    assert run.train.lr == 0.1 and run.train.max_steps == 9  # file, then CLI
    assert run.model.n_layers == 2 and run.model.n_heads == 8 and run.model.d_model == 128
    assert run.out_dir == "file" and run.train.compile is False and run.data.seeds == [0]
    assert config_from_args(Run, parse([])) == Run()


def test_unknown_keys_rejected_with_suggestion(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key train\.max_stpes; did you mean train\.max_steps\?") as e:
        build_config(Run, {"train": {"max_stpes": 3}}, {})
    assert "valid keys in [train]: lr, max_steps" in str(e.value)
    with pytest.raises(ConfigError, match=r"--model\.n_head; did you mean --model\.n_heads\?"):
        build_config(Run, None, {"model.n_head": "4"})
    with pytest.raises(ConfigError, match=r"unknown key outdir; did you mean out_dir\?"):
        build_config(Run, {"outdir": "x"}, {})
    with pytest.raises(ConfigError, match=r"--train is a section"):
        build_config(Run, None, {"train": "1"})
    with pytest.raises(ConfigError, match=r"train: expected a mapping"):
        build_config(Run, {"train": 3}, {})


def test_bad_type_messages() -> None:
    with pytest.raises(ConfigError, match=r"--train\.lr='abc': expected a float"):
        build_config(Run, None, {"train.lr": "abc"})
    with pytest.raises(ConfigError, match=r"train\.max_steps=1\.5: expected an int"):
        build_config(Run, {"train": {"max_steps": 1.5}}, {})
    with pytest.raises(ConfigError, match=r"--train\.compile='maybe': expected a bool"):
        build_config(Run, None, {"train.compile": "maybe"})
    with pytest.raises(ConfigError, match=r"--data\.seeds='0,x': expected a comma-separated list of int"):
        build_config(Run, None, {"data.seeds": "0,x"})
    with pytest.raises(ConfigError, match=r"--train\.betas='0\.9': expected 2 comma-separated values"):
        build_config(Run, None, {"train.betas": "0.9"})
    with pytest.raises(ConfigError, match=r"--train\.max_steps='none': expected an int$"):
        build_config(Run, None, {"train.max_steps": "none"})
    with pytest.raises(ConfigError, match=r"missing required key out_dir"):
        build_config(Needs, None, {})


def test_bool_list_none_parsing() -> None:
    for text, want in [("true", True), ("1", True), ("YES", True), ("false", False), ("0", False), ("no", False)]:
        assert build_config(Run, None, {"train.compile": text}).train.compile is want
    run = build_config(Run, None, parse(["--data.seeds", "0,1,2", "--data.weights=0.5, 1.5", "--data.name", "none",
                                         "--train.warmup", "10", "--train.betas", "0.8,0.9"]))
    assert run.data.seeds == [0, 1, 2] and run.data.weights == [0.5, 1.5] and run.data.name is None
    assert run.train.warmup == 10 and run.train.betas == (0.8, 0.9)
    assert build_config(Run, None, {"data.seeds": ""}).data.seeds == []
    assert build_config(Run, None, {"--train.warmup": "null"}).train.warmup is None


def test_yaml_toml_and_json_load_alike(tmp_path) -> None:
    (tmp_path / "a.yaml").write_text("train:\n  lr: 3e-4\n  compile: yes\ndata:\n  seeds: [1, 2]\n  name: null\n")
    (tmp_path / "a.toml").write_text('[train]\nlr = 3e-4\ncompile = true\n[data]\nseeds = [1, 2]\nname = "none"\n')
    (tmp_path / "a.json").write_text(json.dumps({"train": {"lr": 3e-4, "compile": True},
                                                 "data": {"seeds": [1, 2], "name": None}}))
    runs = [build_config(Run, load_config_file(tmp_path / f"a.{ext}"), {}) for ext in ("yaml", "toml", "json")]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0].train.lr == 3e-4 and runs[0].train.compile is True and runs[0].data.name is None


def test_load_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config_file(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"unknown config file type '\.ini'"):
        load_config_file(tmp_path / "a.ini")
    (tmp_path / "bad.toml").write_text("[train\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML: "):
        load_config_file(tmp_path / "bad.toml")
    (tmp_path / "bad.yml").write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yml: invalid YAML: "):
        load_config_file(tmp_path / "bad.yml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_config_file(tmp_path / "list.yaml")


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_resolved_config_round_trip_is_exact(tmp_path, suffix) -> None:
    run = build_config(Run, None, {
        "model.n_kv_heads": "2", "model.feedback_source": "layer:3", "train.lr": "0.1", "train.warmup": "5",
        "data.name": "none", "data.weights": "0.1,1e-07", "out_dir": 'we"ird\\path \u00e9\x7f', "train.compile": "1",
    })
    path = tmp_path / f"resolved{suffix}"
    save_resolved_config(run, path)
    again = build_config(Run, load_config_file(path), {})
    assert again == run and again.data.name is None and again.model.d_ff is None
    assert config_to_dict(again)["train"]["betas"] == [0.9, 0.95]


def test_saving_the_string_none_in_an_optional_field_is_refused(tmp_path) -> None:
    run = Run(data=DataConfig(name="none"))
    with pytest.raises(ConfigError, match="reads this string back as None"):
        save_resolved_config(run, tmp_path / "r.toml")


def test_validation_errors_name_the_section() -> None:
    with pytest.raises(ConfigError, match=r"^model\.n_heads=3 is invalid: must divide d_model=128"):
        build_config(Run, None, {"model.n_heads": "3"})
    with pytest.raises(ConfigError, match=r"^train\.lr=-1\.0 is invalid: must be > 0"):
        build_config(Run, {"train": {"lr": -1}}, {})
