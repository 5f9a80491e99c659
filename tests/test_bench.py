"""``fullband bench --preset quick``: the table's structure and the correctness checks it carries (identical greedy
tokens to LlamaForCausalLM.generate, the same loss on the same weights). Timing is not asserted: ratios are for
the committed run in docs/LOG.md, never for a unit test."""

import json
import math
import re

import pytest
import torch

from fullband.bench.config import SECTIONS, BenchConfig, BenchDecodeConfig, BenchOptimConfig
from fullband.bench.run import decode_summary
from fullband.bench.steps import baseline_twin, timed_optimizer_step, train_model, training_products, without_onednn
from fullband.bench.workers import combined_share
from fullband.cli import main
from fullband.devices import CPU_FEATURES, cpu_flags
from fullband.experiments.compare.config import CompareConfig
from fullband.experiments.core.lm.runs import study_compile
from fullband.model.linear import Linear
from fullband.training.metrics import flops_per_token
from fullband.training.muon import resolve_ns_dtype

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
    assert printed[1].startswith("# CPU features:") and "absent:" in printed[1]
    assert printed[header].split() == ["section", "case", "ms", "figure", "ratio", "target", "of_limit", "check"]
    assert set(printed[header + 1]) == {"-"}
    results = json.loads(out.read_text())
    rows = results["rows"]
    body = [line for line in printed[header + 2:] if not line.startswith(("results:", "# decoding:"))]
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
    for batch in (1, 8):  # decoding against the copy bandwidth of its own rounds, and against its GEMVs alone
        for case in ("fullband greedy (standard)", "its weights' matrix products alone (ceiling)"):
            assert re.fullmatch(r"\d+\.\d% mem bw", cases[f"{case}, batch {batch}"]["of_limit"]), case
        assert math.isfinite(cases[f"standard step beyond its matrix products, batch {batch}"]["ms"])
    assert cases["fullband greedy (standard), batch 1"]["target"] == ">= 60%"
    ns = resolve_ns_dtype("auto", "cpu", cpu_flags())
    optim_steps = [r for r in rows if r["section"] == "optim" and r["case"].startswith("train step (")]
    fp32 = [] if ns == "float32" else ["Muon (NS float32 forced)"]  # what CPUs without bf16 run, timed on one with
    # The blocks as compare's default study trains them (compiled where its shortest run compiles), and then
    # the eager AdamW step beside them.
    compiled = study_compile(CompareConfig(device="cpu")) == "true"
    blocks = "compiled blocks" if compiled else "eager blocks"
    names = ["AdamW", f"Muon (NS {ns})", f"NorMuon (NS {ns})", *fp32, "Muon (NS bf16 forced, emulated)"]
    expected = [f"train step (1 pass, {blocks}), {name}" for name in names]
    expected += ["train step (1 pass, eager blocks), AdamW"] if compiled else []
    assert [r["case"] for r in optim_steps] == expected
    for row in optim_steps:  # the optimizer's share of the step, and model FLOP/s against the matmul peak
        share = int(re.fullmatch(r"optimizer (\d+)% of it", row["check"]).group(1))
        assert 0 <= share <= 100 and re.fullmatch(r"\d+\.\d% matmul", row["of_limit"])
        assert row["target"] == (">= 45%" if blocks in row["case"] else "")  # the target is the step compare runs
    # compare's own layout: its runs side by side in processes of their own, the threads shared out, against
    # the matmuls the same workers timed in the same rounds
    workers = CompareConfig().workers
    threads = max(1, results["machine_at_start"]["torch_threads"] // workers)
    each = f"{threads} thread{'s' if threads > 1 else ''} each"
    side_by_side = [r for r in rows if r["case"].startswith("train step as compare runs it")]
    assert [r["case"] for r in side_by_side] == [f"train step as compare runs it ({workers} at a time, {each}), {name}"
                                                 for name in ("AdamW", f"NorMuon (NS {ns})")]
    for row in side_by_side:
        assert re.fullmatch(r"\d+\.\d% matmul", row["of_limit"]) and row["target"] == ">= 45%"
        assert row["ms"] > 0 and row["figure"].endswith("k tok/s in all")
    assert sorted(k for k in results["times_s"] if k.startswith("optim-worker")) == [f"optim-worker{i}"
                                                                                     for i in range(workers)]
    # the ceiling: the step's weight products alone, against the peak matmul timed in the same rounds
    assert re.fullmatch(r"\d+\.\d% matmul", cases["its weights' matrix products alone (ceiling)"]["of_limit"])
    assert cases["matmul float32 peak, timed in the same rounds"]["figure"].endswith(" GFLOP/s")
    assert math.isfinite(cases[f"AdamW step ({blocks}) beyond its weight products"]["ms"])
    if compiled:
        assert cases["AdamW eager / compiled blocks step time"]["ratio"] > 0
    for case in (f"Muon (NS {ns}) / AdamW step time", f"NorMuon (NS {ns}) / AdamW step time"):
        assert cases[case]["ratio"] > 0 and cases[case]["target"] == "<= 1.2"
    assert results["machine_at_start"]["cpu_features"] == [f for f in CPU_FEATURES if f in cpu_flags()]
    for batch in (1, 8):  # the same step with its fused products off, in the same rounds: the same tokens
        assert cases[f"speed fused / unfused inference, batch {batch}"]["ratio"] > 0
        assert cases[f"speed fused / unfused inference, batch {batch}"]["check"] == "identical tokens"
    # packed weights at batch 8 only (from PACK_MIN_ROWS rows), against the plain layout: the same tokens
    assert cases["speed packed / plain weight layout, batch 8"]["check"] == "identical tokens"
    assert "speed packed / plain weight layout, batch 1" not in cases
    checked = [r for r in rows if r["ok"] is not None]
    assert len(checked) == 6 and all(r["ok"] for r in checked), checked  # same loss; identical tokens at 1 and 8
    summary = printed[header + 2 + len(rows)]  # the decoding figures the targets name, after the table
    one = cases["fullband greedy (standard), batch 1"]["of_limit"].replace(" mem bw", "")
    assert summary.startswith(f"# decoding: batch-1 greedy (standard) {one} of the copy bandwidth (target >= 60%); "
                              "soft/standard ") and "at batch 8 (target >= 0.98); fullband/generate" in summary
    assert all(float(r["check"].split()[-1]) < 1e-3 for r in rows if r["section"] == "exact")
    auto = cases["forward_exact auto, tol 0.0001 (= sequential here)"]  # a CPU: sequential even with a tolerance
    assert auto["figure"] == "16 passes" and auto["ratio"] == 1.0


def test_sections_are_checked():
    with pytest.raises(ValueError, match=r"sections=.*must be one or more of"):
        BenchConfig(sections=("speed",))
    assert BenchConfig(preset="quick").train.d_model == 32
    assert BenchConfig().decode.steps == ("compiled",) and BenchConfig(preset="quick").decode.steps == ()
    assert BenchDecodeConfig(steps=["static"]).steps == ("static",)
    with pytest.raises(ValueError, match=r"decode\.steps=\('eager',\)"):
        BenchDecodeConfig(steps=("eager",))  # the step every row runs already


def test_optim_section_runs_the_compare_defaults_model_and_batch():
    compare, bench = CompareConfig(), BenchOptimConfig()
    m = compare.model
    assert (m.d_model, m.n_layers, m.n_heads) == (bench.d_model, bench.n_layers, bench.n_heads)
    assert (compare.train.batch_size, compare.train.seq_len) == (bench.batch_size, bench.seq_len)
    with pytest.raises(ValueError, match=r"optim\.ns_dtype='float16'"):
        BenchOptimConfig(ns_dtype="float16")


def test_timed_step_records_the_optimizer_time_inside_its_context():
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.5)
    seen, seconds = [], []
    optimizer.register_step_pre_hook(lambda *_: seen.append(torch.backends.mkldnn.enabled))
    before = torch.backends.mkldnn.enabled
    timed_optimizer_step(lambda: (param * param).sum(), optimizer, [param], seconds, grad_clip=100.0,
                         optimizer_context=without_onednn)
    assert seen == [False] and torch.backends.mkldnn.enabled == before  # off for the step only
    assert len(seconds) == 1 and seconds[0] >= 0 and param.grad is None
    assert torch.equal(param.detach(), torch.zeros(3))  # 1 - 0.5 * 2


def test_training_products_count_the_three_products_of_every_weight_but_the_fusions():
    model, tokens = train_model(BenchConfig(preset="quick").optim)
    run, flops = training_products(model, tokens.numel())
    run()  # shapes agree
    weights = [m.weight for name, m in model.named_modules()
               if isinstance(m, Linear) and not name.startswith("fusion.")]
    assert model.fusion is not None and len(weights) == 7 * model.config.n_layers + 1  # 7 projections a block, head
    assert flops == 6 * tokens.numel() * sum(w.numel() for w in weights)
    assert flops <= tokens.numel() * flops_per_token(baseline_twin(model).num_parameters(), model.config.n_layers,
                                                     model.config.d_model, tokens.shape[1])


def test_side_by_side_share_sums_the_workers_flops_and_their_peaks_round_by_round():
    # Round 0: worker 0's steps at its matmul's FLOP/s, worker 1's at half of its twice-as-fast matmul; round 1:
    # both steps twice as fast. Each round's share is the summed FLOP/s over the summed peaks.
    workers = [{"normuon": [1.0, 0.5], "matmul": [0.5, 0.5]}, {"normuon": [1.0, 0.5], "matmul": [0.25, 0.25]}]
    # round 0: (4 + 4) / (2·2 + 2·4) = 8 / 12; round 1: (8 + 8) / 12; the median of the two
    assert combined_share(workers, "normuon", step_flops=4.0, peak_flops=2.0) == pytest.approx((8 / 12 + 16 / 12) / 2)


def test_an_error_in_the_side_by_side_workers_reaches_the_bench():
    from fullband.bench.workers import time_in_workers

    with pytest.raises(AttributeError):  # no optimizer config: build_optimizer fails in each worker
        time_in_workers({"adamw": None}, BenchConfig(preset="quick").optim, compiled=False, workers=2, rounds=1,
                        seed=0)


def test_the_decoding_summary_names_the_compiled_steps_share_when_timed():
    def row(case, of_limit="", ratio=None):
        return {"section": "decode", "case": case, "of_limit": of_limit, "ratio": ratio}

    rows = [row("fullband greedy (standard), batch 1", "55.0% mem bw"),
            row("speed soft / standard, batch 1", ratio=1.0), row("speed fullband / generate, batch 1", ratio=1.6)]
    assert decode_summary(rows)[0].startswith("# decoding: batch-1 greedy (standard) 55.0% of the copy bandwidth")
    rows.append(row("fullband greedy, compiled step, batch 1", "80.0% mem bw"))
    assert decode_summary(rows)[0].startswith("# decoding: batch-1 greedy (standard) 55.0%, compiled step 80.0% of "
                                              "the copy bandwidth (target >= 60%); soft/standard 1.00 at batch 1")


def test_a_compiled_step_that_fell_back_is_named_in_its_row(monkeypatch, restore_threads):
    """Where torch.compile fails (no C++ compiler), the compiled step decodes as the static step uncompiled: the
    bench still times it, and says so in the row rather than passing the static step's time off as compiled."""
    from fullband.bench.run import run_bench

    def failing(*args, **kwargs):
        raise torch._dynamo.exc.FailOnRecompileLimitHit("no compiler")

    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: failing)
    cfg = BenchConfig(preset="quick", sections=("decode",), threads=1)
    cfg.decode.steps, cfg.decode.batch_sizes = ("compiled",), (1,)
    with pytest.warns(UserWarning, match="the compiled decode step failed"):
        rows = {r["case"]: r for r in run_bench(cfg)["rows"]}
    row = rows["speed eager / compiled step, batch 1"]
    assert row["check"] == "identical tokens; FELL BACK TO UNCOMPILED" and row["ok"] is False
