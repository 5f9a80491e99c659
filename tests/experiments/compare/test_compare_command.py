"""``fullband compare`` end to end with the smoke preset on the embedded corpus; presets vs overrides."""

import json

import pytest

import fullband.experiments.core.plots as plots
from fullband.cli import main
from fullband.config import ConfigError
from fullband.configio import build_config, config_to_dict
from fullband.experiments.compare.config import CompareConfig
from fullband.experiments.compare.records import CompareResults
from fullband.experiments.compare.report import write_report
from fullband.experiments.core.lm.config import LM_PRESETS
from fullband.experiments.core.lm.records import ModeScore, RunRecord
from fullband.experiments.core.lm.runs import plan_runs, preset_config, shortest_run_steps, study_compile, train_config
from fullband.experiments.core.records import key_problems
from fullband.experiments.core.report import SMOKE_NOTE
from fullband.training import step_setup
from fullband.training.config import COMPILE_MIN_CPU_STEPS


def test_smoke_preset_writes_report_results_and_plots(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", "smoke", "--out_dir", str(out), "--stability_passes", "7"]) == 0
    printed = capsys.readouterr().out
    assert "token multiplier feedback:" in printed and "baseline-1.5x" in printed and "report:" in printed
    assert "- training_blocks: eager, train.compile auto" in (out / "report.md").read_text()  # 10-step runs
    for name in ("report.md", "results.json", "loss_vs_tokens.png", "stability.png", "config.toml"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    runs = {r["name"]: r for r in results["runs"]}
    assert set(runs) == {"baseline-1x", "baseline-1.5x", "baseline-2x", "feedback", "feedback-2pass"}
    assert key_problems(results, CompareResults) == []  # what the report reads is the typed record
    for run in results["runs"]:
        assert key_problems(run, RunRecord) == []
        assert all(key_problems(score, ModeScore) == [] for score in run["test"].values())
    assert [runs[f"baseline-{b}x"]["tokens"] for b in ("1", "1.5", "2")] == [1280, 1920, 2560]
    assert runs["feedback"]["tokens"] == 1280 < runs["feedback"]["token_equiv_compute"]
    assert set(runs["baseline-1x"]["test"]) == {"standard"}
    modes = {"standard", "fused1", "fused2", "fused4", "exact"}
    assert set(runs["feedback"]["test"]) == modes
    for name in ("feedback", "feedback-2pass"):
        assert set(results["multipliers"][name]) == modes
        for per_seed in results["multipliers"][name].values():
            assert len(per_seed) == 1 and {"token_multiplier", "compute_multiplier", "fit"} <= set(per_seed[0])
    curves = {c["name"]: c for c in results["stability"]}
    assert set(curves) == {"feedback", "feedback-2pass"}
    assert all(len(c["loss"]) == len(c["delta_mean"]) == 7 for c in curves.values())
    assert curves["feedback"]["passes"] == list(range(1, 8))
    report = (out / "report.md").read_text()
    assert report.splitlines()[2] == SMOKE_NOTE and "None: a smoke run checks the plumbing." in report
    assert "## Effective token multiplier" in report
    assert f"fullband compare --preset smoke --stability_passes 7 --out_dir {out}" in report
    assert (out / "seed0" / "baseline-2x" / "model" / "model.safetensors").is_file()
    # The report is a function of results.json alone; without matplotlib it is written without plots.
    monkeypatch.setattr(plots, "have_matplotlib", lambda: False)
    again = tmp_path / "again"
    again.mkdir()
    with pytest.warns(UserWarning, match="matplotlib"):
        write_report(results, again)
    assert sorted(p.name for p in again.iterdir()) == ["report.md", "results.json"]
    assert "no plots" in (again / "report.md").read_text()
    # A second run into the same directory is refused before anything is trained.
    assert main(["compare", "--preset", "smoke", "--out_dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_precedence_is_defaults_then_preset_then_file_then_command_line(tmp_path):
    assert CompareConfig().model.d_model == build_config(CompareConfig, None, {}).model.d_model == 128
    smoke = preset_config("smoke")
    assert smoke.model.d_model == LM_PRESETS["smoke"]["model"]["d_model"]
    assert smoke.model.n_layers == 2 and smoke.train.token_budget == 1280
    assert smoke.schedule.pass_mix == (0.88, 0.12)  # not in the preset: the default stays
    file = tmp_path / "cmp.toml"
    file.write_text('preset = "smoke"\nseeds = 2\n[model]\nd_model = 48\nn_heads = 4\n')
    cfg = main_config(["--config", str(file), "--model.d_model", "64"])
    assert cfg.preset == "smoke" and cfg.seeds == 2 and cfg.model.n_layers == 2 and cfg.model.n_heads == 4
    assert cfg.model.d_model == 64  # command line > file > preset
    gpu = preset_config("gpu", {"train.token_budget": 1000})
    assert gpu.model.d_model == 384 and gpu.train.token_budget == 1000 and gpu.exact_method == "jacobi"


@pytest.mark.parametrize("name", sorted(LM_PRESETS))
def test_a_preset_means_the_same_from_python_as_from_the_command_line(name):
    assert CompareConfig(preset=name) == build_config(CompareConfig, None, {"preset": name})
    # The shared language-model runs' config (recipe's runs) means the same: compare's config is that one.
    assert config_to_dict(CompareConfig(preset=name)) == config_to_dict(preset_config(name))
    # What the caller gives wins over the preset, in Python as on the command line.
    given = CompareConfig(preset=name, seeds=5, eval_windows=3)
    assert given.seeds == 5 and given.eval_windows == 3
    assert given.model == CompareConfig(preset=name).model

def main_config(argv):
    from fullband.cli import build_parser
    from fullband.configio import config_from_args

    return config_from_args(CompareConfig, build_parser().parse_args(["compare", *argv]))


def test_every_run_shares_everything_but_feedback_budget_and_schedule(tmp_path):
    cfg = preset_config("smoke", {"seeds": 2, "train.seed": 5})
    specs = plan_runs(cfg)
    assert [(s.name, s.seed) for s in specs][:5] == [("baseline-1x", 5), ("baseline-1.5x", 5), ("baseline-2x", 5),
                                                     ("feedback", 5), ("feedback-2pass", 5)]
    assert len(specs) == 10 and specs[-1].seed == 6
    runs = {s.name: train_config(cfg, s, tmp_path) for s in specs if s.seed == 5}
    assert [runs[n].model.feedback for n in runs] == [False, False, False, True, True]
    assert runs["baseline-1.5x"].train.token_budget == 1920 and runs["feedback"].train.token_budget == 1280
    assert runs["feedback"].schedule == cfg.schedule
    assert runs["feedback-2pass"].schedule.pass_mix == (1.0,)
    for run in runs.values():
        assert run.train.seed == 5 and run.optim == cfg.optim and run.data == cfg.data
        assert run.model.d_model == cfg.model.d_model and run.train.batch_size == cfg.train.batch_size


@pytest.mark.parametrize("unit_steps", [COMPILE_MIN_CPU_STEPS - 1, COMPILE_MIN_CPU_STEPS, 2 * COMPILE_MIN_CPU_STEPS])
def test_compile_auto_is_decided_once_for_the_study_by_its_shortest_run(tmp_path, monkeypatch, unit_steps):
    # Budgets 0.5x-2x straddle the CPU threshold for some unit sizes: the runs still all compile or all stay eager,
    # so one baseline curve never mixes compiled and eager numerics.
    monkeypatch.setattr(step_setup, "_cxx_compiler", lambda: "/usr/bin/g++")
    cfg = CompareConfig(device="cpu", budgets=[0.5, 1.0, 2.0])
    cfg.train.token_budget = 2 * unit_steps * cfg.train.batch_size * cfg.train.seq_len
    shortest = shortest_run_steps(cfg)
    assert shortest == unit_steps
    settings = {train_config(cfg, spec, tmp_path).train.compile for spec in plan_runs(cfg)}
    assert settings == {"true" if shortest >= COMPILE_MIN_CPU_STEPS else "false"}
    cfg.train.compile = "false"  # an explicit choice stands
    assert {train_config(cfg, spec, tmp_path).train.compile for spec in plan_runs(cfg)} == {"false"}


def test_compare_default_compiles_its_runs_on_a_cpu_with_a_compiler(monkeypatch):
    monkeypatch.setattr(step_setup, "_cxx_compiler", lambda: "/usr/bin/g++")
    assert shortest_run_steps(CompareConfig()) == 125  # its 0.5x baseline
    assert study_compile(CompareConfig(device="cpu")) == "true"
    monkeypatch.setattr(step_setup, "_cxx_compiler", lambda: None)  # inductor could not build CPU kernels
    assert study_compile(CompareConfig(device="cpu")) == "false"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"preset": "huge"}, "preset"),
    ({"budgets": [1.0]}, "budgets"),
    ({"budgets": [1.0, 1.0]}, "budgets"),
    ({"train.token_budget": "none"}, "token_budget"),
    ({"exact_method": "magic"}, "exact_method"),
    ({"stability_seq_len": 5000}, "stability_seq_len"),
    ({"seeds": 0}, "seeds"),
])
def test_bad_values_are_rejected_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(CompareConfig, None, overrides)


def test_parallel_workers_give_the_numbers_of_one_process(tmp_path):
    from fullband.experiments.compare.study import run_compare

    overrides = {"budgets": (1.0, 2.0), "stability_ablation": False, "stability_passes": 3,
                 "train_eval_points": 2}
    results = [run_compare(preset_config("smoke", {**overrides, "workers": w, "out_dir": str(tmp_path / f"w{w}")}),
                           progress=False) for w in (1, 2)]
    serial, parallel = ([(r["name"], r["test"], r["validation"], r.get("validation_history")) for r in res["runs"]]
                        for res in results)
    assert serial == parallel  # == on floats: the same runs, bit for bit (the workers took them longest first)
    assert [r["step"] for r in results[0]["runs"][-1]["validation_history"]] == [4, 9]
    assert results[1]["machine"]["workers"] == 2


def test_workers_take_the_costliest_runs_first_and_return_them_in_plan_order(monkeypatch):
    """Several at a time, the feedback runs (twice a baseline's cost a token) and larger budgets start first, so no
    worker waits for one long run at the end; the results keep the plan's order."""
    from fullband.experiments.core.lm import runs

    cfg = preset_config("smoke", {"budgets": (0.5, 1.0, 1.5), "seeds": 2, "stability_ablation": True})
    jobs = [(cfg, spec, None) for spec in runs.plan_runs(cfg)]
    started = []

    def fake_map(fn, arguments, workers):
        for job, index, *_ in arguments:
            started.append(job[1].name)
            yield {"name": job[1].name, "seed": job[1].seed, "index": index, "train_seconds": 0.0}, []

    monkeypatch.setattr(runs, "map_jobs", fake_map)
    done = runs.run_jobs(jobs, workers=2, progress=False)
    assert [record["index"] for record, _ in done] == list(range(1, len(jobs) + 1))  # plan order, as numbered
    assert started == ["feedback", "feedback-2pass"] * 2 + ["baseline-1.5x"] * 2 + ["baseline-1x"] * 2 + [
        "baseline-0.5x"] * 2
    started.clear()
    runs.run_jobs(jobs, workers=1, progress=False)
    assert started == [spec.name for _, spec, _ in jobs]  # one at a time: the plan's order
