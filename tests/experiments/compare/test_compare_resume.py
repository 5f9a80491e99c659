"""``fullband compare --resume true``: a study killed mid-run continues from its finished runs and from the latest
checkpoint of the run it was training, and ends with the numbers of an uninterrupted study, bit for bit."""

import json

import pytest
from conftest import Killed, kill_training_at

from fullband.cli import main
from fullband.experiments.compare.study import run_compare
from fullband.experiments.core.lm.runs import preset_config

# 10 steps per 1x run, a checkpoint every 3; the 1x baseline and the feedback run validate at steps 4 and 9.
SMALL = {"budgets": (1.0, 2.0), "stability_ablation": False, "stability_passes": 3, "train_eval_points": 2,
         "train.checkpoint_every": 3, "workers": 1, "eval_windows": 4}
ARGV = ["--preset", "smoke", "--budgets", "1,2", "--stability_ablation", "false", "--stability_passes", "3",
        "--train_eval_points", "2", "--train.checkpoint_every", "3", "--workers", "1", "--eval_windows", "4"]
NUMBERS = ("name", "seed", "steps", "tokens", "token_equiv_compute", "final_train_loss", "validation",
           "validation_history", "test", "parameters", "exact_check")


def numbers(results):
    runs = [{k: r.get(k) for k in NUMBERS} for r in results["runs"]]
    # As results.json holds them (tuples as lists, int keys as strings), from either a file or run_compare.
    return json.loads(json.dumps([runs, results["stability"], results["multipliers"], results["gap_trend"]]))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    return run_compare(preset_config("smoke", {**SMALL, "out_dir": str(out)}), progress=False)


# (run killed, step it was about to train): mid-run after a checkpoint (resumed from step 6), and before the run's
# first checkpoint (trained again from scratch).
@pytest.mark.parametrize(("victim", "at_step", "finished"), [("feedback", 7, 2), ("baseline-2x", 1, 1)])
def test_a_killed_study_resumes_to_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch, capsys, uninterrupted,
                                                                       victim, at_step, finished):
    out = tmp_path / "cmp"
    revive = kill_training_at(monkeypatch, victim, at_step)
    with pytest.raises(Killed):
        run_compare(preset_config("smoke", {**SMALL, "out_dir": str(out)}), progress=False)
    assert not (out / "results.json").exists()
    assert (out / "seed0" / "baseline-1x" / "compare_record.json").is_file()  # finished before the kill
    revive()
    capsys.readouterr()
    assert main(["compare", *ARGV, "--out_dir", str(out), "--resume", "true"]) == 0
    printed = capsys.readouterr().out
    assert f"resuming: {finished} of 3 runs finished earlier" in printed
    assert ("(resumed at step 6)" in printed) == (at_step > 3)
    resumed = json.loads((out / "results.json").read_text())
    assert numbers(uninterrupted) == numbers(resumed)  # == on floats: the last digit
    run = next(r for r in resumed["runs"] if r["name"] == victim)
    assert run.get("resumed_from_step") == (6 if at_step > 3 else None)
    assert "--resume" not in resumed["commands"]["command"]
    assert "resume = false" in (out / "config.toml").read_text()  # the saved config reruns, not resumes


def test_resume_refuses_an_empty_or_foreign_directory_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for directory in (empty, tmp_path / "missing"):
        assert main(["compare", *ARGV, "--out_dir", str(directory), "--resume", "true"]) == 2
        err = capsys.readouterr().err.strip()
        assert "no compare study to resume" in err and "without --resume" in err and len(err.splitlines()) == 1
    other = tmp_path / "other"  # a compare study with other settings: say which, and how to resume it
    other.mkdir()
    (other / "config.toml").write_text('preset = "smoke"\nseeds = 3\n')
    assert main(["compare", *ARGV, "--out_dir", str(other), "--resume", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert "other settings (" in err and "seeds 3 there, 1 here" in err
    assert f"--config {other / 'config.toml'} --resume true" in err
    foreign = tmp_path / "foreign"  # not a compare config at all
    foreign.mkdir()
    (foreign / "config.toml").write_text("[model]\nwidth = 3\n")
    assert main(["compare", *ARGV, "--out_dir", str(foreign), "--resume", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not hold a fullband compare study" in err and len(err.splitlines()) == 1
