"""``fullband eval-recall``: the arms it adds (causal, reading the steps after the table), the paper schedule's pass
draw, the parameter and FLOP matches of the hybrid and the wide LSTM, the target as the rule computes it, and the
study end to end with resume."""

import dataclasses
import json

import pytest
import torch

from fullband.experiments.word_problems.arms import make_arm
from fullband.experiments.word_problems.train import RESULT
from fullband.model.recurrence import ntp_loss


@pytest.mark.parametrize("arm_name", ["hybrid", "wide_lstm", "fullband_paper", "fullband", "looped"])
def test_the_recall_arms_are_causal_and_read_steps_after_the_table(arm_name):
    """Logits at a position depend on tokens up to it only (a later token changed changes nothing before it), for
    the arms eval-recall adds and for those whose reading depends on the table's length."""
    from fullband.experiments.word_problems.recall.config import RecallConfig

    torch.manual_seed(0)
    cfg = RecallConfig(preset="smoke")
    problems = cfg.problems("s5/full")
    variant = {"looped": "position=rope,injection=normed", "wide_lstm": ""}.get(arm_name, "position=rope")
    arm = make_arm(arm_name, cfg, problems, variant)
    knob = arm.knobs()[-1]
    model = arm.build(knob).double().eval()
    batch = problems.batch(3, 3, 5, torch.Generator().manual_seed(4))
    t = batch.prefix + 3  # a step's position, past the table and the start cup
    changed = batch.tokens.clone()
    changed[:, t] = problems.first_name_token + (changed[:, t] - problems.first_name_token + 1) % 64
    with torch.no_grad():
        before = arm.logits(model, batch.tokens, knob, batch.prefix)
        after = arm.logits(model, changed, knob, batch.prefix)
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=0)
    assert not torch.allclose(after[:, t], before[:, t])
    with torch.no_grad():  # what it trains on is what it answers with (the paper arm: its own pass count)
        loss = arm.loss(model, batch, knob, step=5)
    if arm_name not in ("fullband", "fullband_paper"):
        torch.testing.assert_close(loss, ntp_loss(before, batch.labels))


def test_the_paper_arm_draws_a_few_passes_per_step_and_the_hybrid_is_parameter_matched():
    from fullband.experiments.word_problems.arms import PAPER_PASS_MIX, full_bandwidth_parameters
    from fullband.experiments.word_problems.recall.config import RecallConfig

    cfg = RecallConfig()
    problems = cfg.problems("a5/full")
    paper = make_arm("fullband_paper", cfg, problems, "position=rope")
    counts = [paper.passes_at(step) for step in range(4000)]
    assert set(counts) == set(PAPER_PASS_MIX) and counts == [paper.passes_at(s) for s in range(4000)]
    for passes, share in PAPER_PASS_MIX.items():
        assert abs(counts.count(passes) / len(counts) - share) < 0.03
    target = full_bandwidth_parameters(paper)
    for blocks in (1, 2):
        hybrid = make_arm("hybrid", cfg, problems, "position=rope")
        built = sum(p.numel() for p in hybrid.build(blocks).parameters())
        assert abs(built - target) / target < 0.02
    wide = make_arm("wide_lstm", cfg, problems)
    full_bandwidth = make_arm("fullband", cfg, problems, "position=rope").train_flops(1.0)
    assert abs(wide.train_flops("lstm") / full_bandwidth - 1) < 0.02
    # The diagnostic variants train the same LSTM (sized on the full task; compose-only's problems are shorter).
    for variant in ("compose", "lookup"):
        assert make_arm("wide_lstm", cfg, dataclasses.replace(problems, variant=variant)).hidden("lstm") == \
            wide.hidden("lstm")


@pytest.mark.parametrize("blocks", [1, 2])
def test_the_hybrids_parameter_count_is_the_built_modules(blocks):
    """The width search counts the hybrid's parameters without building it at every width: the count is the built
    module's, at the matched width and others."""
    from fullband.experiments.word_problems.models import AttentionThenLSTM, hybrid_parameters
    from fullband.experiments.word_problems.recall.config import RecallConfig

    cfg = RecallConfig()
    arm = make_arm("hybrid", cfg, cfg.problems("a5/full"), "position=rope")
    config = arm.blocks_config(blocks)
    for hidden in (1, 17, arm.hidden(blocks)):
        built = AttentionThenLSTM(config, hidden)
        assert hybrid_parameters(config, hidden) == sum(p.numel() for p in built.parameters())


def test_recall_study_end_to_end(tmp_path):
    from fullband.cli import main

    out = tmp_path / "recall"
    assert main(["eval-recall", "--preset", "smoke", "--out_dir", str(out), "--workers", "1", "--progress",
                 "false"]) == 0
    results = json.loads((out / "results.json").read_text())
    group = results["groups"]["s5"]
    arms = {"baseline", "looped", "rnn", "wide_lstm", "hybrid", "fullband", "fullband_paper"}
    assert set(group["cells"]) == {"2", "6"}  # groups.<g>.cells.<K>.<arm>.<seed>.test
    assert set(group["cells"]["6"]) == arms and set(group["hindsight_cells"]["6"]) == arms - {"fullband",
                                                                                              "fullband_paper"}
    assert all(len(c["test"]) == 6 for c in group["cells"]["6"]["fullband"].values())
    assert set(group["variants"]) == {"compose", "lookup"} and set(group["variants"]["lookup"]["cells"]["2"]) == arms
    assert {p["arm"] for p in group["grid"] if "position=none" in p["variant"]} == {"baseline"}  # NoPE: 1-pass only
    text = (out / "report.md").read_text()
    assert "## Predictions, written before the runs" in text
    assert "the columns are replicates" in text  # compose-only has no table: its K columns say so
    # Floors per table size (lookup-only has no composition to track), validation at the trained lengths in every
    # cell, the controls that failed to train, inference costs: all in results.json and the report.
    assert set(group["floors"]) == {"2", "6"} and len(group["floors"]["6"]["start cup"]) == 6
    assert set(group["floors"]["6"]) == {"majority", "start cup", "first 3 steps"}
    assert set(group["variants"]["lookup"]["floors"]["2"]) == {"majority", "start cup"}
    assert all(len(c["validation"]) == 3 for c in group["cells"]["6"]["rnn"].values())
    assert set(group["analysis"]["failed_to_train"]["fair"]) == arms - {"baseline"}
    assert "floor: start cup" in text and "failed to train (seeds)" in text and "inference FLOPs (K = 6" in text
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("**/" + RESULT)}
    assert main(["eval-recall", "--preset", "smoke", "--out_dir", str(out), "--workers", "1", "--progress", "false",
                 "--resume", "true"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/" + RESULT)} == stamps


def test_recall_target_reads_the_median_seeds_longest_n_kept_and_names_controls_that_failed_to_train():
    """eval-recall's n* is the decisive study's: a full-bandwidth arm's longest n kept at every length 1..n, on its
    median seed (the lower median); a control more than FIT_TOLERANCE below the 1-pass transformer at a trained
    length failed to train there."""
    from fullband.experiments.word_problems.recall.analysis import analyse_group as recall_analysis

    def cell(kept, validation=(1.0, 1.0), length=8):
        return {"test": [0.95] * kept + [0.5] * (length - kept), "validation": list(validation)}

    seeds = ["100", "101", "102"]
    exact = {s: cell(k) for s, k in zip(seeds, (6, 4, 8), strict=True)}
    exact["102"]["test"][2] = 0.5  # a dip at n = 3: this seed keeps 2, whatever follows
    paper = {s: cell(k) for s, k in zip(seeds, (3, 3, 4), strict=True)}
    baseline = {s: cell(2) for s in seeds}
    rnn = {s: cell(3, validation=(1.0, 0.9)) for s in seeds}  # 0.1 below the transformer at n = 2
    group = {"cells": {"32": {"baseline": baseline, "rnn": rnn, "fullband": exact, "fullband_paper": paper}},
             "hindsight_cells": {"32": {"baseline": baseline, "rnn": rnn}}}
    a = recall_analysis(group, 2)
    target = a["target"]
    assert target["reach"] == {"fullband": 4, "fullband_paper": 3}  # kept 6, 4, 2 -> 4; 3, 3, 4 -> 3
    assert target["model"] == "fullband" and target["n"] == 4
    assert target["margin"]["per_seed"] == pytest.approx({"100": 0.45, "101": 0.45, "102": 0.45})
    assert target["lead"] and target["paper_keeps_half"] and target["met"]  # median 3 >= median 4 / 2
    assert a["failed_to_train"]["fair"]["rnn"] == seeds and a["failed_to_train"]["fair"]["fullband"] == []
    assert a["failed_to_train"]["hindsight"]["baseline"] == []
