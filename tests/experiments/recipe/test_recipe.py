"""``fullband recipe`` end to end at the smoke preset: every row, width and step curve, from real runs."""

import json

import pytest

from fullband.cli import main
from fullband.config import ConfigError
from fullband.experiments.core.report import SMOKE_NOTE
from fullband.experiments.recipe.config import RECIPE_VARIANTS, RecipeConfig
from fullband.experiments.recipe.report import verdict


def test_smoke_study_writes_every_row_width_and_curve(tmp_path, capsys):
    out = tmp_path / "recipe"
    argv = ["recipe", "--preset", "smoke", "--out_dir", str(out), "--seeds", "1", "--workers", "1",
            "--variants", "best,input-norm-all,2-pass-only", "--widths", "16", "--train_eval_points", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "None: a smoke run checks the plumbing." in printed and "report:" in printed  # no verdict on 4-step runs
    results = json.loads((out / "results.json").read_text())
    as_if_not_smoke = {**results, "config": {**results["config"], "preset": "default"}}
    assert any("fused(1)-vs-standard gap" in line for line in verdict(as_if_not_smoke))
    names = {r["name"] for r in results["runs"]}
    assert names == {"baseline-1x", "baseline-1.5x", "baseline-2x", "best", "input-norm-all",
                     "baseline-input-norm-all", "2-pass-only", "baseline-d16", "best-d16"}
    runs = {r["name"]: r for r in results["runs"]}
    # The toggled ingredient really changed the run, and only the paired variant got its own baseline.
    assert runs["input-norm-all"]["test"]["standard"]["loss"] != runs["best"]["test"]["standard"]["loss"]
    variants = results["variants"]
    assert variants["input-norm-all"]["reference"] == "baseline-input-norm-all"
    assert variants["2-pass-only"]["reference"] == "baseline-1x"
    gap = variants["best"]["modes"]["fused1"]["gap_to_baseline"][0]
    expected = runs["best"]["test"]["fused1"]["loss"] - runs["baseline-1x"]["test"]["standard"]["loss"]
    assert gap == pytest.approx(expected, abs=1e-12)
    assert variants["best"]["loss_after_passes"]["passes"] == 20
    assert set(results["widths"]) == {"16", "32"}
    assert results["widths"]["16"]["parameters"] < results["widths"]["32"]["parameters"]
    assert [s["step"] for s in results["steps"]] == [5, 10]
    for name in ("report.md", "gap_by_variant.png", "gap_vs_width.png", "gap_vs_steps.png", "config.toml"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert report.splitlines()[2] == SMOKE_NOTE and "None: a smoke run checks the plumbing." in report
    assert "## Verdict" in report and "`2-pass-only`" in report and "| 16 |" in report
    said = "\n".join(verdict(as_if_not_smoke))
    assert "Stability, `best`" in said and "Stability, `2-pass-only`" in said
    # The report is a function of the recorded runs: rewriting it from results.json gives the same analysis.
    (out / "report.md").unlink()
    assert main(["recipe", "--out_dir", str(out), "--report_only", "true", "--preset", "smoke"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["variants"] == results["variants"] and again["widths"] == results["widths"]
    assert (out / "report.md").read_text().split("## Setup")[1] == report.split("## Setup")[1]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"variants": ("best", "bigger")}, r"variants=.*must be a non-empty list from"),
    ({"widths": (60,)}, r"widths=.*divisible by 8"),
    ({"compare_preset": "huge"}, r"compare_preset='huge'"),
    ({"seeds": 0}, r"seeds=0 .*>= 1"),
])
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RecipeConfig(**kwargs)


def test_every_variant_is_a_valid_compare_config():
    from fullband.experiments.core.lm.runs import preset_config

    for overrides, _, _ in RECIPE_VARIANTS.values():
        preset_config("default", dict(overrides))  # raises on a key or value compare does not accept


def test_every_run_of_the_study_reads_its_data_section(tmp_path):
    from fullband.configio import build_config
    from fullband.experiments.recipe.study import plan

    cfg = build_config(RecipeConfig, None, {"preset": "smoke", "data.tokenizer": "bpe", "data.bpe_vocab_size": 300,
                                            "variants": ["best", "adamw"]})
    jobs = plan(cfg, tmp_path)
    assert len(jobs) > 4  # baselines, variants (one paired), widths
    for compare_cfg, _, _ in jobs:
        assert compare_cfg.data.tokenizer == "bpe" and compare_cfg.data.bpe_vocab_size == 300
    with pytest.raises(ConfigError, match="tokenizer"):
        build_config(RecipeConfig, None, {"preset": "smoke", "data.tokenizer": "words"})


def test_an_interrupted_study_resumes_with_the_same_numbers(tmp_path):
    import shutil

    out = tmp_path / "recipe"
    argv = ["recipe", "--preset", "smoke", "--out_dir", str(out), "--seeds", "1", "--workers", "1",
            "--variants", "best", "--widths", "16", "--train_eval_points", "0"]
    assert main(argv) == 0
    first = json.loads((out / "results.json").read_text())
    command = first["command"]  # the one command that reruns it: every flag that differs from the preset
    assert command.startswith("fullband recipe --preset smoke --variants best --seeds 1 ")  # widths: the preset's
    assert f"--out_dir {out}" in command and "--workers 1" in command and "resume" not in command
    # "Interrupted": one run never finished, the report was never written.
    shutil.rmtree(out / "seed0" / "best")
    for name in ("results.json", "report.md"):
        (out / name).unlink()
    assert main(argv) == 2  # a non-empty out_dir is refused without --resume
    assert main([*argv, "--resume", "true"]) == 0
    second = json.loads((out / "results.json").read_text())
    assert [(r["name"], r["test"]) for r in second["runs"]] == [(r["name"], r["test"]) for r in first["runs"]]
