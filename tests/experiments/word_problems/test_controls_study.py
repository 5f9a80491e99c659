"""``fullband eval-controls``: the arms (the looped rule in training and answering, matched parameters and FLOPs),
the one training loop (a 1x model branched off a 2x run equals a 1x run), the analysis against numbers worked out
here, and the study end to end with resume."""

import json
import math
import shutil

import pytest
import torch

from fullband.config import ConfigError
from fullband.experiments.core.flops import step_flops
from fullband.experiments.word_problems import report as controls_report
from fullband.experiments.word_problems.analysis import (
    choose,
    choose_extrapolating,
    failed_to_train,
    longest_kept,
    t_interval,
)
from fullband.experiments.word_problems.arms import make_arm
from fullband.experiments.word_problems.config import ControlsConfig
from fullband.experiments.word_problems.models import LoopedTransformer, parameters
from fullband.experiments.word_problems.train import RESULT, RunSpec, train_run, training_batch
from fullband.model.recurrence import ntp_loss
from fullband.tasks.word_problems import WordProblems
from fullband.training.objective import MultiPassObjective


@pytest.fixture
def smoke() -> ControlsConfig:
    return ControlsConfig(preset="smoke", progress=False, workers=1)


SMOKE_STUDY = ["eval-controls", "--preset", "smoke", "--workers", "1", "--progress", "false"]


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    """``fullband eval-controls --preset smoke``, run once for the tests of the finished study (read it, or copy it
    with :func:`study_copy` to change it)."""
    from fullband.cli import main

    out = tmp_path_factory.mktemp("controls_smoke") / "controls"
    assert main([*SMOKE_STUDY, "--out_dir", str(out)]) in (0, None)
    return out


def study_copy(study, tmp_path):
    """A copy of the finished study to resume or extend (file times kept, so a rerun that rewrites a run shows)."""
    out = tmp_path / "controls"
    shutil.copytree(study, out)
    return out


def test_looped_reads_each_step_after_its_own_loop_count():
    """Position t after c*t loops over the whole sequence == the last position of a run over its first t+1 tokens
    with c*t loops: one rule in training (one run, every prefix) and answering (one problem)."""
    torch.manual_seed(0)
    problems = WordProblems("s5")
    cfg = ControlsConfig(preset="smoke")
    model = LoopedTransformer(make_arm("looped", cfg, problems).model_config(), loops_per_step=2).double()
    tokens = problems.batch(3, 5, torch.Generator().manual_seed(1)).tokens[:, :-1]
    whole = model(tokens)
    for t in range(1, 6):
        prefix = tokens[:, : t + 1]
        *_, last = model.loop_logits(prefix, 2 * t)
        torch.testing.assert_close(whole[:, t], last[:, -1], rtol=0, atol=1e-12)
    # Injection: a loop's input is the previous loop's state plus the embedding, so the token counts at every loop.
    loops = list(model.loop_logits(tokens, 3))
    assert not torch.allclose(loops[1], loops[2])


@pytest.mark.parametrize("arm_name", ["baseline", "equal_flops", "looped", "rnn", "fullband", "shift0"])
def test_each_arm_trains_on_what_it_answers_with(smoke, arm_name):
    """An arm's training loss at gradient-free settings equals the next-token loss of the logits it answers with
    (fullband: pass 1 plus lambda x the mean of the later passes, whose last is the exact answer)."""
    torch.manual_seed(0)
    problems = WordProblems("a5")
    arm = make_arm(arm_name, smoke, problems)
    knob = arm.knobs()[0] if arm_name != "shift0" else 0.3
    model = arm.build(knob).double()
    batch = training_batch(smoke, problems, 0, 0)
    with torch.no_grad():
        loss = arm.loss(model, batch, knob)
        answered = ntp_loss(arm.logits(model, batch.tokens, knob), batch.labels)
    if arm_name in ("fullband", "shift0"):
        out = MultiPassObjective()(model, batch.tokens, batch.labels, batch.tokens.shape[1])
        expected = out.pass_losses[0] + knob * torch.stack(out.pass_losses[1:]).mean()
        torch.testing.assert_close(loss, expected)
        if arm_name == "fullband":  # the last pass is the exact recurrence it answers with
            torch.testing.assert_close(out.pass_losses[-1], answered)
    else:
        torch.testing.assert_close(loss, answered)


def test_rnn_and_equal_flops_are_matched(smoke):
    cfg = ControlsConfig(progress=False)
    problems = WordProblems("s5")
    fullband = make_arm("fullband", cfg, problems)
    target_params = parameters(fullband.build(0.3))
    for cell in ("gru", "lstm"):
        rnn = make_arm("rnn", cfg, problems)
        assert abs(parameters(rnn.build(cell)) - target_params) / target_params < 0.02
    equal = make_arm("equal_flops", cfg, problems)
    target = fullband.train_flops(0.3)
    for shape in ("deep", "wide"):
        assert abs(equal.train_flops(shape) - target) / target < 0.1
        s = equal.shape(shape)
        assert equal.train_flops(shape) == step_flops(s, cfg.batch_size, cfg.train_length + 2, 1, feedback=False)
    assert equal.shape("deep").d_model == cfg.d_model and equal.shape("deep").n_layers > cfg.n_layers
    assert equal.shape("wide").n_layers == cfg.n_layers and equal.shape("wide").d_model > cfg.d_model


def test_a_1x_branch_of_a_2x_run_equals_a_1x_run(smoke, tmp_path):
    """The tuning grid scores 1x as a cool-down branched off the 2x run; the seeds retrain 1x alone: same weights,
    same scores."""
    both = train_run(smoke, RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12, 24)), str(tmp_path))
    alone = train_run(smoke, RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12,)), str(tmp_path))
    assert both["checkpoints"]["12"] == alone["checkpoints"]["12"]
    assert both["checkpoints"]["24"] != alone["checkpoints"]["12"]
    from safetensors.torch import load_file

    a = load_file(RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12, 24)).directory(tmp_path) / "model-12.safetensors")
    b = load_file(RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12,)).directory(tmp_path) / "model-12.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("stop_after", [1, 3])  # kept states: at step 6 (before the 1x branch at 9), at 18 (after)
def test_a_run_stopped_part_way_goes_on_to_the_numbers_of_one_never_stopped(smoke, tmp_path, monkeypatch, stop_after):
    """A study spans sittings: a run keeps its state at validation steps (progress.pt) and, stopped, goes on from
    the last one kept to the numbers of a run never stopped, bit for bit; the finished run removes it."""
    from safetensors.torch import load_file

    from fullband.experiments.word_problems import train

    spec = RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12, 24))
    whole = train_run(smoke, spec, str(tmp_path / "whole"))
    monkeypatch.setattr(train, "KEEP_EVERY_SECONDS", 0.0)
    kept = []

    def keep_then_stop(path, data):
        train_write(path, data)
        kept.append(torch.load(path, weights_only=True)["step"])
        if len(kept) == stop_after:
            raise KeyboardInterrupt  # the sitting ends

    train_write = train.write_bytes
    monkeypatch.setattr(train, "write_bytes", keep_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_run(smoke, spec, str(tmp_path / "stopped"))
    directory = spec.directory(tmp_path / "stopped")
    assert (directory / train.PROGRESS).is_file() and not (directory / RESULT).is_file()
    monkeypatch.setattr(train, "write_bytes", train_write)
    again = train_run(smoke, spec, str(tmp_path / "stopped"))
    assert kept[-1] == (6 if stop_after == 1 else 18)
    assert again["checkpoints"] == whole["checkpoints"] and again["curve"] == whole["curve"]
    for steps in (12, 24):
        a, b = (load_file(spec.directory(tmp_path / name) / f"model-{steps}.safetensors") for name in ("whole",
                                                                                                        "stopped"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (directory / train.PROGRESS).exists()


def test_a_kept_state_of_another_spec_in_the_same_directory_is_not_taken(smoke, tmp_path, monkeypatch):
    """A run scored at 24 steps only shares the directory of one scored at 12 and 24: it starts over rather than
    take the other's state (which holds the 12-step checkpoint)."""
    from fullband.experiments.word_problems import train

    monkeypatch.setattr(train, "KEEP_EVERY_SECONDS", 0.0)
    real = train.write_bytes

    def keep_then_stop(path, data):
        real(path, data)
        if torch.load(path, weights_only=True)["step"] == 18:
            raise KeyboardInterrupt

    monkeypatch.setattr(train, "write_bytes", keep_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_run(smoke, RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12, 24)), str(tmp_path))
    monkeypatch.setattr(train, "write_bytes", real)
    alone = train_run(smoke, RunSpec("s5", "fullband", 0.3, 3e-3, 1, (24,)), str(tmp_path))
    assert set(alone["checkpoints"]) == {"24"} and alone["curve"]["step"] == [6, 12, 18, 24]


def test_analysis_numbers():
    assert longest_kept([1.0, 0.95, 0.91, 0.89, 0.99]) == 3
    assert longest_kept([0.5, 1.0]) == 0 and longest_kept([0.9, 0.9]) == 2
    mean, low, high = t_interval([0.1, 0.3, 0.2])
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert mean == pytest.approx(0.2) and low == pytest.approx(0.2 - half) and high == pytest.approx(0.2 + half)
    grid = [{"validation_accuracy": 0.9, "validation_loss": 0.3, "steps": 10},
            {"validation_accuracy": 0.95, "validation_loss": 0.5, "steps": 20},
            {"validation_accuracy": 0.95, "validation_loss": 0.4, "steps": 20},
            {"validation_accuracy": 0.95, "validation_loss": 0.4, "steps": 10}]
    assert choose(grid) is grid[3]
    # The second selection: the unseen-length score first, then the same order.
    scored = [p | {"extrapolation_accuracy": a} for p, a in zip(grid, (0.5, 0.2, 0.5, 0.4), strict=True)]
    assert choose_extrapolating(scored) is scored[2]  # ties with [0] at 0.5; its validation accuracy is higher
    cells = {"baseline": {"0": {"validation": [1.0, 0.8]}, "1": {"validation": [1.0, 0.8]}},
             "looped": {"0": {"validation": [1.0, 0.79]}, "1": {"validation": [0.97, 1.0]}}}
    assert failed_to_train(cells, "looped", 2) == ["1"]  # 0.79 is within the tolerance of 0.8; 0.97 is not of 1.0


def test_study_end_to_end_and_resume(smoke_study, tmp_path):
    from fullband.cli import main

    out = study_copy(smoke_study, tmp_path)
    results = json.loads((out / "results.json").read_text())
    group = results["groups"]["s5"]
    assert set(group["cells"]) == {"baseline", "equal_flops", "looped", "rnn", "fullband", "shift0"}
    assert all(len(seeds) == 2 for seeds in group["cells"].values())
    assert all(len(cell["test"]) == 6 for seeds in group["cells"].values() for cell in seeds.values())
    assert len(group["grid"]) == 5 * 2 * 2 * 2  # arms x knob values x learning rates x step counts
    report = (out / "report.md").read_text()
    assert "gives no verdict" in report and "Tuning grid" in report
    # The hindsight table: each arm's best test accuracy over its whole grid at each unseen length.
    hindsight = report.split("Best of the grid with hindsight")[1].split("\n## ")[0]
    for arm, title in (("looped", "looped (input injection)"), ("fullband", "full-bandwidth exact")):
        row = next(line for line in hindsight.splitlines() if line.startswith(f"| {title} |"))
        best = [max(p["test"][str(n)] for p in group["grid"] if p["arm"] == arm) for n in (4, 6)]
        assert row.split("|")[2:4] == [f" {v:.2f} " for v in best]
    results_files = sorted(out.glob("runs/**/" + RESULT))
    stamps = {p: p.stat().st_mtime_ns for p in results_files}
    assert main([*SMOKE_STUDY, "--out_dir", str(out), "--resume", "true"]) in (0, None)
    assert {p: p.stat().st_mtime_ns for p in sorted(out.glob("runs/**/" + RESULT))} == stamps  # nothing retrained
    again = json.loads((out / "results.json").read_text())
    assert again["groups"]["s5"]["cells"] == group["cells"]
    assert again["groups"]["s5"]["extrapolation"]["cells"] == group["extrapolation"]["cells"]


def test_second_selection_keeps_each_arms_best_at_unseen_lengths_and_trains_fresh_seeds(smoke_study, tmp_path):
    from fullband.cli import main
    from fullband.experiments.word_problems.train import EXTRAPOLATION

    out = study_copy(smoke_study, tmp_path)
    args = [*SMOKE_STUDY, "--out_dir", str(out)]
    group = json.loads((out / "results.json").read_text())["groups"]["s5"]
    second = group["extrapolation"]
    for arm, pick in second["chosen"].items():  # each arm's grid point with the best selection score
        points = [p for p in group["grid"] if p["arm"] == arm]
        assert pick["extrapolation_accuracy"] == max(p["extrapolation"] for p in points)
        assert pick["extrapolation_accuracy"] == next(p["extrapolation"] for p in points if all(
            p[k] == pick[k] for k in ("knob", "lr", "steps")))
        assert set(second["cells"][arm]) == {"1", "2"}  # seeds 1..seeds; seed 0 took part in the choice
        assert second["costs"][arm]["lr"] == pick["lr"] and second["costs"][arm]["steps"] == pick["steps"]
    # The score is the mean accuracy at lengths train_length+1..extrapolation_length of the run's own file.
    pick = second["chosen"]["fullband"]
    run = next(out.glob(f"runs/s5/fullband/{pick['knob']:g}-lr{pick['lr']:g}/seed0-*"))
    kept = json.loads((run / EXTRAPOLATION).read_text())
    assert kept["set"] == {"length": 5, "problems": 32}
    assert pick["extrapolation_accuracy"] == pytest.approx(sum(kept["accuracy"][str(pick["steps"])][3:5]) / 2)
    report = (out / "report.md").read_text()
    assert "## Second selection: on unseen lengths" in report
    assert "## S5 (transpositions of 5 cups), second selection" in report
    # its own per-seed cells: lengths 1..3 (trained) and the test lengths 4 and 6
    second_part = report.split("## S5 (transpositions of 5 cups), second selection")[1]
    cell = second["cells"]["fullband"]["2"]["test"]
    row = " | ".join(f"{cell[n - 1]:.2f}" for n in (1, 2, 3, 4, 6))
    assert f"| full-bandwidth exact | 2 | {row} |" in second_part.split("### Every seed")[1]
    assert "Lengths up to 5 took part in the choice" in report  # test length 6 did not
    results = json.loads((out / "results.json").read_text())
    results["config"]["extrapolation_length"] = 6  # a selection that looks at every test length says so
    assert "Every test length took part in the choice" in controls_report.report(results, plots=False).render()
    assert (out / "accuracy_vs_length_second_selection.png").is_file()
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/**/" + EXTRAPOLATION)}
    main([*args, "--resume", "true"])
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/**/" + EXTRAPOLATION)} == stamps  # read back
    main([*args, "--resume", "true", "--extrapolation_length", "0"])
    assert "extrapolation" not in json.loads((out / "results.json").read_text())["groups"]["s5"]


def test_cpu_spread_retrains_a_seed_with_avx2_kernels_and_the_report_shows_it(smoke_study, tmp_path, capsys):
    from fullband.cli import main
    from fullband.experiments.word_problems import cpu_spread

    out = study_copy(smoke_study, tmp_path)
    assert cpu_spread.main(["--out_dir", str(out), "--seed", "1"]) == 0
    spread = json.loads((out / cpu_spread.SPREAD_FILE).read_text())
    assert spread["environment"]["ATEN_CPU_CAPABILITY"] == "avx2"
    arms = spread["groups"]["s5"]
    assert set(arms) == {"baseline", "equal_flops", "looped", "rnn", "fullband", "shift0"}
    retrained = json.loads(next((out / cpu_spread.SPREAD_DIR).glob("runs/s5/rnn/*/seed1-*/result.json")).read_text())
    native = json.loads((out / "results.json").read_text())["groups"]["s5"]["cells"]["rnn"]["1"]["test"]
    other = retrained["checkpoints"][str(retrained["stops"][-1])]["test"]["accuracy"]
    assert arms["rnn"]["max_abs_difference"] == max(abs(a - b) for a, b in zip(native, other, strict=True))
    assert cpu_spread.main(["--out_dir", str(out), "--seed", "1", "--arms", "rnn,fullband"]) == 0  # a subset
    assert set(json.loads((out / cpu_spread.SPREAD_FILE).read_text())["groups"]["s5"]) == {"rnn", "fullband"}
    with pytest.raises(SystemExit):
        cpu_spread.main(["--out_dir", str(out), "--arms", "gru"])
    assert "--arms: gru not in this study" in capsys.readouterr().err
    main([*SMOKE_STUDY, "--out_dir", str(out), "--resume", "true"])
    assert "## Across CPU kinds" in (out / "report.md").read_text()


def test_the_numbers_do_not_depend_on_the_threads(tmp_path):
    """What ``workers`` changes: the torch threads of each run (1 or 2 here), not its weights."""
    cfg = ControlsConfig(preset="smoke", progress=False, batch_size=32, d_model=32, n_heads=4)
    threads = torch.get_num_threads()
    weights = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            spec = RunSpec("s5", "fullband", 0.3, 3e-3, 1, (12,))
            train_run(cfg, spec, str(tmp_path / str(count)))
            from safetensors.torch import load_file

            weights.append(load_file(spec.directory(tmp_path / str(count)) / "model-12.safetensors"))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="test_lengths"):
        ControlsConfig(train_length=8, test_lengths=(8, 12))
    with pytest.raises(ConfigError, match="arms"):
        ControlsConfig(arms=("looped", "rnn"))
    with pytest.raises(ConfigError, match=r"extrapolation_length.*train_length=6"):
        ControlsConfig(extrapolation_length=6)
    assert ControlsConfig(extrapolation_length=0).extrapolation_length == 0  # 0 skips the second selection
