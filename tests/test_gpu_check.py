"""benchmarks/gpu_check.py runs end to end on a CPU at smoke size (what a lent GPU runs at full size): it writes
results.json with the device, torch and every row (name, value, unit, target), prints the markdown table, and its
budget skips a section that does not fit instead of overrunning."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fullband.bench.gpu import Budget, markdown, run_check

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def run_script(tmp_path: Path, *args: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a target missed, which a CPU smoke run may
    return json.loads((tmp_path / "results.json").read_text()), done.stdout


def test_the_training_rows_at_smoke_size(tmp_path):
    results, table = run_script(tmp_path, "--sections", "train")
    assert results["device"] == "cpu" and results["torch"] == torch.__version__
    names = [row["name"] for row in results["rows"]]
    assert any(n.startswith("train MFU") for n in names) and "NorMuon / AdamW step time (bare steps)" in names
    for row in results["rows"]:
        assert set(row) >= {"name", "value", "unit", "target"}
        assert row["name"] in table
    ratios = [row["value"] for row in results["rows"] if row["unit"] == "x"]
    assert ratios and all(0 < r < 100 for r in ratios)


@pytest.mark.slow
def test_the_whole_check_at_smoke_size_in_under_a_minute(tmp_path):
    results, _ = run_script(tmp_path)
    assert results["seconds"] < 60
    decode = [row for row in results["rows"] if row["name"].startswith("greedy decode speed")]
    assert len(decode) == 2 and all(row["note"].startswith("identical tokens") for row in decode)


def test_a_section_that_does_not_fit_the_budget_is_skipped():
    results = run_check(torch.device("cpu"), budget_s=1.0, progress=lambda message: None)
    assert [row["note"].split(":")[0] for row in results["rows"]] == ["skipped", "skipped"]
    assert "skipped" in markdown(results)


def test_the_budget_stops_an_overrunning_section():
    import time

    from fullband.bench.gpu import BudgetExceeded

    with pytest.raises(BudgetExceeded), Budget(0.2).guard():
        time.sleep(2)


def test_the_mfu_counts_the_matrix_products_of_a_single_pass():
    """6N + attention over N = the blocks and the head: a tied embedding is the head (once), an untied one's lookup
    is no product, and the fusion does not run in one pass."""
    from conftest import make_model

    from fullband.bench.gpu import matmul_flops_per_token
    from fullband.training.metrics import flops_per_token

    for tied in (True, False):
        model = make_model(tie_embeddings=tied)
        blocks = sum(p.numel() for p in model.blocks.parameters()) + model.norm.weight.numel()
        head = model.lm_head.weight.numel()
        norms = model.input_norm.weight.numel() if model.input_norm is not None else 0
        expected = flops_per_token(blocks + head + norms, model.config.n_layers, model.config.d_model, 32)
        assert matmul_flops_per_token(model, 32) == expected


def test_a_failing_case_costs_its_rows_not_the_section():
    from fullband.bench.gpu import ratio_row, working

    def broken():
        raise RuntimeError("no kernel for this device")

    outputs: dict = {}
    cases, failed = working({"ours": lambda: 1, "theirs": broken}, outputs)
    assert list(cases) == ["ours"] and outputs == {"ours": 1} and "no kernel" in failed["theirs"]
    row = ratio_row("ours / theirs", {"ours": [1.0]}, failed, "ours", "theirs", "<= 1.2")
    assert row.value is None and row.ok is None and "theirs failed" in row.note
    row = ratio_row("a / b", {"a": [1.0, 1.0], "b": [2.0, 2.0]}, {}, "a", "b", ">= 0.4")
    assert (row.value, row.ok) == (0.5, True)
