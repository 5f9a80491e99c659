"""``fullband bench --preset quick``: the table's structure and the correctness checks it carries (identical greedy
tokens to LlamaForCausalLM.generate, the same loss on the same weights). Timing is not asserted: ratios are for
the committed run in docs/LOG.md, never for a unit test."""

import json
import math

import pytest
import torch

from fullband.bench.config import SECTIONS, BenchConfig
from fullband.cli import main

pytest.importorskip("transformers")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_quick_bench_prints_one_table_and_writes_json(tmp_path, capsys, restore_threads):
    out = tmp_path / "bench.json"
    assert main(["bench", "--preset", "quick", "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(printed) if line.startswith("section"))
    assert printed[0].startswith("# fullband bench:") and "1 threads" in printed[0] and "load average" in printed[0]
    assert printed[header].split() == ["section", "case", "ms", "figure", "ratio", "target", "of_limit", "check"]
    assert set(printed[header + 1]) == {"-"}
    results = json.loads(out.read_text())
    rows = results["rows"]
    body = [line for line in printed[header + 2:] if not line.startswith("results:")]
    assert len(body) == len(rows) and [line.split()[0] for line in body] == [r["section"] for r in rows]
    assert {r["section"] for r in rows} == set(SECTIONS)
    assert results["limits"]["memory_gb_s"] > 0 and results["limits"]["matmul_gflop_s"] > 0
    cases = {r["case"]: r for r in rows}
    for case in ("speed fullband / LlamaForCausalLM", "speed fullband / GPT2LMHeadModel",
                 "Trainer.train_step / bare step time", "2-pass / 1-pass train step time",
                 "3-pass / 1-pass train step time", "speed fullband / generate, batch 1",
                 "speed fullband / generate, batch 8", "speed soft / standard, batch 8",
                 "forward_exact auto (= sequential here)", "forward_exact jacobi, tol 0.0001 / sequential time"):
        assert math.isfinite(cases[case]["ratio"]) and cases[case]["ratio"] > 0, case
    checked = [r for r in rows if r["ok"] is not None]
    assert len(checked) == 3 and all(r["ok"] for r in checked), checked  # same loss; identical tokens at 1 and 8
    assert all(float(r["check"].split()[-1]) < 1e-3 for r in rows if r["section"] == "exact")
    auto = cases["forward_exact auto, tol 0.0001 (= sequential here)"]  # a CPU: sequential even with a tolerance
    assert auto["figure"] == "16 passes" and auto["ratio"] == 1.0


def test_sections_are_checked():
    with pytest.raises(ValueError, match=r"sections=.*must be one or more of"):
        BenchConfig(sections=("speed",))
    assert BenchConfig(preset="quick").train.d_model == 32
