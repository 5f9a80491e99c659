"""The reasoning-traces study: the data split, the equal-accuracy analysis, and ``fullband eval-reasoning --preset
smoke`` end to end (the problems and traces themselves: tests/tasks/test_reasoning_tasks.py)."""

import copy
import json
import random
import re

import pytest

from fullband.cli import main
from fullband.config import ConfigError, explicit_keys
from fullband.configio import build_config
from fullband.experiments.core.records import key_problems
from fullband.experiments.core.report import SMOKE_NOTE
from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.experiments.reasoning.data import build_data, context_length
from fullband.experiments.reasoning.evaluation import equal_accuracy, over_seeds, pooled
from fullband.experiments.reasoning.records import Cell, ReasoningResults
from fullband.experiments.reasoning.report import chance, verdict
from fullband.tasks.reasoning import sample_problems
from fullband.training.config import TrainConfig

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


def test_unseen_test_lengths_answer_share_and_curriculum_order(tmp_path):
    cfg = ReasoningConfig(preset="smoke", min_length=2, max_length=3, test_lengths=(3, 6), train_examples=400,
                          test_per_length=5, answer_share=0.8, curriculum=0.5)
    test, train_path, test_path = build_data(cfg, tmp_path)
    assert sorted({p.n for p in test}) == [2, 3, 6] and sum(p.n == 6 for p in test) == 5
    # The held-out loss of training reads the trained lengths only; the unseen ones have their own file.
    assert len(test_path.read_text().splitlines()) == (len(test) - 5) * len(cfg.strides)
    assert len((tmp_path / "test_unseen.jsonl").read_text().splitlines()) == 5 * len(cfg.strides)
    rows = [json.loads(line) for line in train_path.read_text().splitlines()]
    lengths = [len(r["prompt"].split("/")[0]) // 2 for r in rows]  # start + 2 characters a step
    assert set(lengths) == {2, 3} and lengths == sorted(lengths)  # never n = 6; shortest first (curriculum)
    answer_only = sum(r["prompt"].endswith("/0:") for r in rows) / len(rows)
    assert 0.7 < answer_only < 0.9
    assert context_length(cfg) > context_length(ReasoningConfig(preset="smoke", min_length=2, max_length=3))


def test_over_seeds_gives_mean_and_sd_per_cell():
    def cell(seed, accuracy, length=4):
        return {"variant": "fullband exact", "model": "fullband", "mode": "exact", "stride": 0, "length": length,
                "n": 10, "accuracy": accuracy, "exact_trace": accuracy, "mean_len": 2.0, "median_len": 2.0,
                "ms_per_problem": 1.0, "seed": seed}

    cells = [cell(0, 0.5), cell(1, 0.7), cell(0, 1.0, 6), cell(1, 0.8, 6)]
    out = {c["length"]: c for c in over_seeds(cells + pooled(cells))}
    assert out[4]["accuracy"] == pytest.approx(0.6) and out[4]["accuracy_sd"] == pytest.approx(0.1414, abs=1e-4)
    assert out["all"]["accuracy"] == pytest.approx(0.75)  # seed means 0.75 and 0.75
    assert out["all"]["accuracy_sd"] == pytest.approx(0.0) and out[6]["seeds"] == 2 and "seed" not in out[6]


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
    with pytest.raises(ConfigError, match=r"answer_share=0\.5 is invalid"):
        ReasoningConfig(preset="smoke", strides=(1, 2), answer_share=0.5)
    with pytest.raises(ConfigError, match="optimizer='sgd' is invalid"):
        build_config(ReasoningConfig, None, {"preset": "smoke", "optim.optimizer": "sgd"})
    with pytest.raises(ConfigError, match="curriculum=2 is invalid"):
        ReasoningConfig(preset="smoke", curriculum=2)
    serial = ReasoningConfig(preset="exact-recurrence")
    assert (serial.passes, serial.train.grad_passes, serial.train.prefix_mixin) == (32, 4, False)
    assert ReasoningConfig(preset="serial") == serial  # the other name, in committed reports' commands
    # as from the command line: the pass mix again
    shallow = build_config(ReasoningConfig, None, {"preset": "serial", "passes": 0, "--train.grad_passes": "0"})
    assert (shallow.passes, shallow.train.grad_passes) == (0, 0)
    # Truncated gradients train without jitter in these studies (as the committed reports were trained), unless
    # train.jitter is given: the presets and --train.grad_passes say so in the run config.
    assert serial.train.jitter == 0.0 and shallow.train.jitter == TrainConfig().jitter > 0
    given = build_config(ReasoningConfig, None, {"preset": "smoke", "train.grad_passes": 2})
    assert given.train.jitter == 0.0
    noisy = build_config(ReasoningConfig, None, {"preset": "smoke", "train.grad_passes": 2, "train.jitter": 0.05})
    assert noisy.train.jitter == 0.05
    with pytest.raises(ConfigError, match="passes=1 is invalid"):
        ReasoningConfig(preset="smoke", passes=1)
    with pytest.raises(ConfigError, match="grad_passes=-1 is invalid"):
        build_config(ReasoningConfig, None, {"preset": "smoke", "train.grad_passes": -1})
    with pytest.raises(ConfigError, match=r"feedback_weight=-1\.0 is invalid"):
        build_config(ReasoningConfig, None, {"preset": "smoke", "train.feedback_weight": -1})
    with pytest.raises(ConfigError, match="workers=0 is invalid"):
        ReasoningConfig(preset="smoke", workers=0)
    # the tuned result: exact-recurrence on sum, λ = 0.3, 2 seeds at once
    recurrent = ReasoningConfig(preset="exact-recurrence-tuned")
    assert (recurrent.family, recurrent.train.feedback_weight, recurrent.train.max_steps, recurrent.train.grad_passes,
            recurrent.seeds, recurrent.workers, recurrent.passes) == ("sum", 0.3, 3000, 8, 2, 2, 32)
    assert ReasoningConfig(preset="recurrent") == recurrent
    with explicit_keys({"family"}):  # --family swaps on the command line beats the preset's sum
        assert ReasoningConfig(preset="recurrent", family="swaps").family == "swaps"


def test_deep_truncated_passes_reach_the_training_run(tmp_path):
    out = tmp_path / "study"
    assert main(["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false", "--modes",
                 "exact", "--schedule.feedback_start", "0", "--passes", "40", "--train.grad_passes", "2",
                 "--train.prefix_mixin", "false",
                 "--train.feedback_weight", "2"]) == 0
    records = [json.loads(line) for line in (out / "fullband" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    # Every batch runs to its exact count (its length: no prefix mixin) with 3 scored passes (1 and the last 2).
    assert all(r["passes"] > 2 and len(r["pass_losses"]) == 3 for r in train)
    config = json.loads((out / "results.json").read_text())["config"]
    assert (config["passes"], config["grad_passes"], config["prefix_mixin"]) == (40, 2, False)
    report = (out / "report.md").read_text()
    assert "40 passes each" in report and "last 2 passes only" in report and "λ = 2" in report


def test_eval_reasoning_smoke_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "study"
    args = ["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false", "--test_lengths",
            "6", "--optim.optimizer", "muon", "--schedule.feedback_start", "0", "--schedule.pass_mix", "0,1",
            "--fused_passes", "1,3"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "equal_accuracy:" in printed and "fullband exact" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["variants"] == ["baseline", "fullband standard", "fullband soft", "fullband fused(1)",
                                   "fullband fused(3)", "fullband exact"]
    lengths, strides = [2, 3, 4, 6], results["config"]["strides"]
    assert len(results["cells"]) == 6 * len(strides) * (len(lengths) + 1)  # + pooled over lengths
    for cell in results["cells"]:
        assert 0 <= cell["accuracy"] <= 1 and cell["mean_len"] >= 0 and cell["ms_per_problem"] > 0
    # what the report reads is the typed record
    assert key_problems(results, ReasoningResults) == []
    assert [p for c in results["cells"] + results["seed_cells"] for p in key_problems(c, Cell)] == []
    assert {c["length"] for c in results["cells"]} == {*lengths, "all"}
    assert results["training"]["fullband"]["token_equiv_compute"] > results["training"]["baseline"]["tokens"]
    for plot in ("accuracy_vs_trace_length.png", "accuracy_vs_length.png"):
        assert (out / plot).stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert report.splitlines()[2] == SMOKE_NOTE  # a smoke run checks the plumbing and says so under the title
    # the writer's one-line header (report.md's line 4) and the verdict below it
    assert report.splitlines()[6] == "## Verdict" and "Answer-only accuracy with exact prefill" in report
    assert "Unseen lengths (never trained on): n=6" in report and "## Equal accuracy" in report
    assert "Past the trained lengths it" in report.splitlines()[8]  # the verdict's first line
    assert "- Wall time of this command: " in report and "the seeds one after the other" in report
    assert "the baseline's tokens × passes (pass mix" in report  # FLOPs are counted with controls only
    # Ahead of the baseline but no better than a guess is "at chance", not "beats".
    edited, level = copy.deepcopy(results), chance(results["config"])
    for c in edited["cells"]:
        if c["stride"] == 0 and c["length"] == 6:
            c["accuracy"] = level if c["variant"] == "fullband exact" else level - 0.2
    assert "**Past the trained lengths it is at chance, like the baseline**" in verdict(edited)[0]
    next(c for c in edited["cells"] if c["stride"] == 0 and c["length"] == 6
         and c["variant"] == "fullband exact")["accuracy"] = level + 0.2
    assert "**Past the trained lengths it beats the baseline**" in verdict(edited)[0]
    # A second run into the same directory must not silently retrain; --reuse_models evaluates again.
    assert main(args) == 2
    assert "already holds a trained baseline" in capsys.readouterr().err
    assert main([*args, "--reuse_models", "true"]) == 0

    def untimed(cells):
        return [{k: v for k, v in c.items() if not k.startswith("ms_per_problem")} for c in cells]

    assert untimed(json.loads((out / "results.json").read_text())["cells"]) == untimed(results["cells"])


def test_eval_reasoning_two_seeds_train_apart_and_report_sd(tmp_path, capfd):
    out = tmp_path / "study"
    assert main(["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false", "--seeds", "2",
                 "--modes", "standard,exact", "--curriculum", "0.5"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["training"]) == {"baseline seed0", "fullband seed0", "baseline seed1", "fullband seed1"}
    assert (out / "seed1" / "fullband" / "model").is_dir()
    assert {c["seed"] for c in results["seed_cells"]} == {0, 1} and all(c["seeds"] == 2 for c in results["cells"])
    assert "mean ± sd over 2 seeds" in (out / "report.md").read_text()
    # The seeds side by side in two worker processes: the same models, the same cells.
    side_by_side = tmp_path / "workers"
    capfd.readouterr()
    assert main(["eval-reasoning", "--preset", "smoke", "--out_dir", str(side_by_side), "--progress", "true",
                 "--seeds", "2", "--modes", "standard,exact", "--curriculum", "0.5", "--workers", "2"]) == 0
    parallel = json.loads((side_by_side / "results.json").read_text())
    captured = capfd.readouterr()  # the workers' lines, not bars: one as each seed starts, one when it is done
    printed = captured.out
    assert "training baseline" not in printed and "decoding" not in captured.err, captured.err
    for seed in (0, 1):
        assert f"swaps seed {seed}: training and evaluating in {side_by_side / f'seed{seed}'}" in printed
        assert re.search(rf"swaps seed {seed}: done in \d+\.\d min", printed), printed

    def untimed(cells):
        return [{k: v for k, v in c.items() if not k.startswith("ms_per_problem")} for c in cells]

    assert untimed(parallel["seed_cells"]) == untimed(results["seed_cells"])
    for run, summary in results["training"].items():
        assert parallel["training"][run]["final_loss"] == summary["final_loss"], run
    assert "--workers 2" in (side_by_side / "report.md").read_text()
    assert "the seeds side by side in 2 processes" in (side_by_side / "report.md").read_text()


def test_a_study_called_from_python_resolves_device_auto_before_it_loads_models(tmp_path):
    from fullband.experiments.reasoning.study import run_reasoning

    cfg = ReasoningConfig(preset="smoke", out_dir=str(tmp_path / "study"), progress=False, modes=("standard",))
    assert cfg.device == "auto"
    results = run_reasoning(cfg)  # the CLI resolves "auto" itself; a Python caller used to fail at evaluation
    assert cfg.device == "cpu" and results["variants"] == ["baseline", "fullband standard"]
