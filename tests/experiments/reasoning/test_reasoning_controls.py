"""The controls of ``fullband eval-reasoning`` (issue 29): looped and equal-FLOPs models trained on the same
batches, FLOPs in the results, the report over families, and a resumed run giving an uninterrupted run's numbers."""

import copy
import json
import shutil
import statistics

import pytest
from conftest import Killed, kill_training_at

from fullband.cli import main
from fullband.config import ConfigError
from fullband.experiments.core.parallel import map_jobs
from fullband.experiments.core.records import key_problems
from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.experiments.reasoning.controls.report import family_verdict
from fullband.experiments.reasoning.records import Cell, ControlsResults, ReasoningResults

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ["eval-reasoning", "--preset", "smoke", "--progress", "false", "--controls", "looped,equal_flops",
        "--modes", "standard,exact", "--schedule.feedback_start", "0", "--passes", "6", "--train.grad_passes", "2",
        "--train.prefix_mixin", "false", "--test_lengths", "6", "--train.max_steps", "4"]


def untimed(cells):
    return [{k: v for k, v in c.items() if not k.startswith("ms_per_problem")} for c in cells]


def test_controls_preset_and_bad_options():
    cfg = ReasoningConfig(preset="controls")
    assert cfg.families == ("swaps", "swaps5", "sum") and cfg.controls == ("looped", "equal_flops")
    assert cfg.seeds >= 3 and cfg.test_per_length >= 200
    assert (cfg.passes, cfg.train.max_steps, cfg.curriculum) == (32, 3000, 0.6)
    assert ReasoningConfig(preset="recurrent").curriculum == 0.3  # its committed reports
    assert ReasoningConfig(preset="recurrent").controls == ()  # the existing presets compute what they did
    with pytest.raises(ConfigError, match="controls=\\('wide',\\) is invalid"):
        ReasoningConfig(preset="smoke", controls=("wide",))
    with pytest.raises(ConfigError, match="families=\\('cubes',\\) is invalid"):
        ReasoningConfig(preset="smoke", families=("cubes",))
    with pytest.raises(ConfigError, match="add 0 to strides"):
        ReasoningConfig(preset="smoke", strides=(1,), controls=("looped",))


def test_controls_train_on_the_same_batches_and_report_flops(tmp_path, monkeypatch):
    out = tmp_path / "study"
    pools = []

    def recorded(fn, jobs, workers):
        pools.append((len(jobs), workers))
        return map_jobs(fn, jobs, workers)

    monkeypatch.setattr("fullband.experiments.reasoning.controls.study.map_jobs", recorded)
    assert main([*ARGS, "--out_dir", str(out), "--families", "swaps5,sum", "--workers", "2"]) == 0
    assert pools == [(2, 2)]  # every family's seeds in one pool: no core waits for a family's last seed
    results = json.loads((out / "results.json").read_text())
    five = results["families"]["swaps5"]
    assert key_problems(results, ControlsResults) == []  # the typed records the report reads
    assert [p for family in results["families"].values() for p in key_problems(family, ReasoningResults)] == []
    assert [p for c in five["cells"] + five["seed_cells"] for p in key_problems(c, Cell)] == []
    assert five["variants"] == ["baseline", "fullband standard", "fullband exact", "looped", "equal-FLOPs baseline"]
    training = five["training"]
    assert training["looped"]["shape"] == training["fullband"]["shape"]
    looped_cfg = json.loads((out / "swaps5" / "looped" / "model" / "config.json").read_text())
    assert looped_cfg["feedback_shift"] == 0 and looped_cfg["feedback"]
    # The equal-FLOPs model is the plain one made deeper until its training FLOPs reach the full-bandwidth model's.
    eq, full, base = training["equal_flops"], training["fullband"], training["baseline"]
    assert eq["shape"]["n_layers"] > base["shape"]["n_layers"]
    per_layer = (eq["training_flops"] - base["training_flops"]) / (eq["shape"]["n_layers"] - 1)
    assert abs(eq["training_flops"] - full["training_flops"]) <= per_layer / 2
    assert full["training_flops"] > base["training_flops"]
    answer_only = [c for c in five["seed_cells"] if c["stride"] == 0]
    assert all(c["inference_flops"] > 0 for c in answer_only)
    assert {c["variant"] for c in five["seed_cells"] if c["stride"] == 1} == {
        "baseline", "fullband standard", "fullband exact"}  # the controls are decoded answer-only
    report = (out / "report.md").read_text()
    assert "## Verdict" in report and "5 cups (swaps5)" in report and "running sums (sum)" in report
    assert "at n = 6 against the best control" in report and "worst seed" in report and "95% [" in report
    assert (out / "accuracy_vs_training_flops.png").stat().st_size > 10_000
    # With several unseen lengths the verdict gives the margin over the best control at each (a deep control may
    # keep up for a few steps past the trained ones and not for many).
    assert "at each unseen length" not in family_verdict("5 cups", five)  # one unseen length: the headline says it
    at6 = {v: {c["seed"]: c["accuracy"] for c in five["seed_cells"] if c["length"] == 6 and c["stride"] == 0
               and c["variant"] == v} for v in ("fullband exact", "baseline", "looped", "equal-FLOPs baseline")}
    margins = ", ".join(f"seed {s} {a - max(at6[v][s] for v in list(at6)[1:]):+.2f}"
                        for s, a in sorted(at6["fullband exact"].items()))
    assert f"Seed by seed, over that seed's best control: {margins}." in family_verdict("5 cups", five)
    more = copy.deepcopy(five)
    more["seed_cells"] += [dict(c, length=7) for c in five["seed_cells"] if c["length"] == 6]
    for c in more["seed_cells"]:
        if c["length"] == 7 and c["variant"] == "fullband exact":
            c["accuracy"] = 1.0
    line = family_verdict("5 cups", more)

    def mean_at_7(variant):
        return statistics.fmean(c["accuracy"] for c in more["seed_cells"]
                                if c["length"] == 7 and c["variant"] == variant and c["stride"] == 0)

    best = max(("baseline", "looped", "equal-FLOPs baseline"), key=mean_at_7)
    assert "at each unseen length: n = 6 " in line and f", n = 7 {1 - mean_at_7(best):+.2f} ({best})." in line
    assert (out / "swaps5" / "report.md").is_file() and "looped" in (out / "sum" / "report.md").read_text()
    # The family's own report gives the same FLOPs ratio as the controls' compute table (not tokens x passes).
    ratio = full["training_flops"] / base["training_flops"]
    family_report = (out / "swaps5" / "report.md").read_text()
    assert f"took {ratio:.1f}x the baseline's training FLOPs" in family_report
    assert "| training FLOPs |" in family_report and f"| {eq['training_flops']:.3g} |" in family_report


def test_an_interrupted_run_resumes_to_the_uninterrupted_numbers(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    args = [*ARGS, "--families", "swaps5", "--seeds", "2"]
    assert main([*args, "--out_dir", str(whole)]) == 0
    # What kill -9 while seed 1's equal-FLOPs model trained leaves: no summary or cells for it (its run dir half
    # written), no study results; the looped model before it was decoded as soon as it was trained, so its cells are
    # all the resumed study needs of it (its weights deleted here).
    shutil.copytree(whole, resumed)
    for path in ("results.json", "report.md", "swaps5/results.json", "swaps5/seed1/equal_flops/study_training.json",
                 "swaps5/seed1/cells-equal_flops.json"):
        (resumed / path).unlink()
    for model in ("equal_flops", "looped"):
        shutil.rmtree(resumed / "swaps5" / "seed1" / model / "model")
    # Seed 0 finished: moved to another machine as its training summaries and decoded cells alone (no weights,
    # checkpoints or logs), it is not trained again.
    for run in (resumed / "swaps5" / "seed0").iterdir():
        if run.is_dir():
            for path in run.iterdir():
                if path.name != "study_training.json":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert main([*args, "--out_dir", str(resumed)]) == 2  # not without --resume
    assert main([*args, "--out_dir", str(resumed), "--resume", "true"]) == 0
    before = json.loads((whole / "results.json").read_text())["families"]["swaps5"]
    after = json.loads((resumed / "results.json").read_text())["families"]["swaps5"]
    assert untimed(after["seed_cells"]) == untimed(before["seed_cells"])
    for run, summary in before["training"].items():
        assert after["training"][run]["final_loss"] == summary["final_loss"], run
    assert not (resumed / "swaps5" / "seed0" / "fullband" / "model").exists()  # seed 0 was not trained again
    assert not (resumed / "swaps5" / "seed1" / "looped" / "model").exists()  # nor seed 1's looped model
    assert (resumed / "swaps5" / "seed1" / "equal_flops" / "model").is_dir()  # its equal-FLOPs model was
    assert "--resume" not in (resumed / "report.md").read_text()
    assert "resumed an interrupted run" in (resumed / "report.md").read_text()  # its time is the last invocation's
    assert "resumed an interrupted run" not in (whole / "report.md").read_text()


def test_a_run_killed_mid_training_continues_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    """kill -9 while the full-bandwidth model trains: the resumed study continues that run from its latest
    checkpoint (not from scratch) and ends with the uninterrupted study's numbers."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    args = [*ARGS[:5], *ARGS[7:], "--family", "swaps5", "--train.max_steps", "6"]  # no controls: one pair of models
    assert main([*args, "--out_dir", str(whole)]) == 0
    revive = kill_training_at(monkeypatch, "fullband", 4)
    with pytest.raises(Killed):
        main([*args, "--out_dir", str(killed)])
    revive()
    capsys.readouterr()
    assert main([*args, "--out_dir", str(killed), "--resume", "true", "--progress", "true"]) == 0
    assert "training fullband (6 steps, resumed from step-0000004)" in capsys.readouterr().out
    # Without controls no FLOPs are counted: tokens x passes, which the sequential fixed point makes an upper bound.
    assert "tokens × passes (6 passes each" in (killed / "report.md").read_text()
    assert "an upper bound on its FLOPs" in (killed / "report.md").read_text()
    before, after = (json.loads((d / "results.json").read_text()) for d in (whole, killed))
    assert untimed(after["cells"]) == untimed(before["cells"])
    for kind in ("baseline", "fullband"):
        assert after["training"][kind]["final_loss"] == before["training"][kind]["final_loss"], kind
    # Checkpointing itself changes no number (the committed reports were trained without checkpoints).
    monkeypatch.setattr("fullband.experiments.core.pair.study_checkpoint_every", lambda steps: 0)
    assert main([*args, "--out_dir", str(tmp_path / "plain")]) == 0
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert not list((tmp_path / "plain" / "fullband" / "checkpoints").glob("step-000000[1-5]"))
    assert untimed(plain["cells"]) == untimed(before["cells"])
    assert plain["training"]["fullband"]["final_loss"] == before["training"]["fullband"]["final_loss"]
