"""The reasoning-traces study: the data split, the equal-accuracy analysis, and ``fullband eval-reasoning --preset
smoke`` end to end (the problems and traces themselves: tests/tasks/test_reasoning_tasks.py)."""

import json
import random

import pytest

from fullband.cli import main
from fullband.config import ConfigError
from fullband.experiments.config import ReasoningConfig
from fullband.experiments.reasoning import build_data, equal_accuracy, pooled
from fullband.tasks.reasoning import sample_problems

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


def test_held_out_problems_never_reach_the_training_data(tmp_path):
    cfg = ReasoningConfig(preset="smoke", min_length=2, max_length=3, train_examples=300, test_per_length=40)
    test, train_path, test_path = build_data(cfg, tmp_path)
    statements = {p.statement() for p in test}
    for line in train_path.read_text().splitlines():
        assert json.loads(line)["prompt"].split("/")[0] not in statements
    # Length 2 has only 27 problems (3 cups x 3 swaps x 3 swaps): at most half are held out.
    assert sum(p.n == 2 for p in test) == 13 and sum(p.n == 3 for p in test) == 40
    assert len(test_path.read_text().splitlines()) == len(test) * len(cfg.strides)
    rest = sample_problems("swaps", range(2, 3), 100, random.Random(0), exclude=frozenset(test))
    assert len(rest) == 14 and not set(rest) & set(test)


def test_equal_accuracy_takes_the_shortest_trace_that_reaches_the_baselines_best():
    def cell(variant, stride, accuracy, mean_len, length=4):
        return {"variant": variant, "stride": stride, "length": length, "n": 10, "accuracy": accuracy,
                "exact_trace": accuracy, "mean_len": mean_len}

    cells = [cell("baseline", 1, 0.9, 8.0), cell("baseline", 0, 0.3, 2.0), cell("fullband soft", 1, 0.95, 8.0),
             cell("fullband soft", 2, 0.86, 5.0), cell("fullband soft", 0, 0.5, 2.0),
             cell("fullband fused(2)", 1, 0.5, 8.0)]
    rows = equal_accuracy(cells + pooled(cells), ["baseline", "fullband soft", "fullband fused(2)"])
    assert rows[0] == {"length": 4, "target_accuracy": 0.85, "baseline": 8.0, "fullband soft": 5.0,
                       "fullband fused(2)": None}
    assert rows[1]["length"] == "all"


def test_config_rejects_bad_values_by_name():
    with pytest.raises(ConfigError, match="max_length=1 is invalid"):
        ReasoningConfig(preset="smoke", min_length=2, max_length=1)
    with pytest.raises(ConfigError, match="modes=\\('turbo',\\) is invalid"):
        ReasoningConfig(preset="smoke", modes=("turbo",))
    with pytest.raises(ConfigError, match="preset='huge' is invalid"):
        ReasoningConfig(preset="huge")


def test_eval_reasoning_smoke_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false"]) == 0
    printed = capsys.readouterr().out
    assert "equal_accuracy:" in printed and "fullband fused(2)" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["variants"] == ["baseline", "fullband standard", "fullband soft", "fullband fused(2)"]
    lengths, strides = range(2, 5), results["config"]["strides"]
    assert len(results["cells"]) == 4 * len(strides) * (len(lengths) + 1)  # + pooled over lengths
    for cell in results["cells"]:
        assert 0 <= cell["accuracy"] <= 1 and cell["mean_len"] >= 0
    assert results["training"]["fullband"]["token_equiv_compute"] > results["training"]["baseline"]["tokens"]
    assert (out / "accuracy_vs_trace_length.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "## Equal accuracy" in report and "accuracy_vs_trace_length.png" in report
    # A second run into the same directory must not silently retrain; --reuse_models evaluates again.
    assert main(["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false"]) == 2
    assert "already holds a trained baseline" in capsys.readouterr().err
    assert main(["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false",
                 "--reuse_models", "true"]) == 0
    assert json.loads((out / "results.json").read_text())["cells"] == results["cells"]
