"""``fullband eval-decisive``: the rule fixed before the runs (against choices worked out here), the new controls
(looped with a normalised state, depth that grows with n without the shift, NoPE in every transformer arm), the RNN's
parameter match against the built module, and the study end to end with resume."""

import json
import statistics

import pytest
import torch

from fullband.config import ConfigError
from fullband.experiments.word_problems.arms import make_arm, parse_variant
from fullband.experiments.word_problems.decisive.analysis import (
    analyse_group,
    better_setting,
    fair_choice,
    hindsight_choice,
    strongest_controls,
)
from fullband.experiments.word_problems.decisive.config import DecisiveConfig
from fullband.experiments.word_problems.decisive.study import variants
from fullband.experiments.word_problems.models import (
    RNN_CELLS,
    RNNLM,
    LoopedTransformer,
    growing_depth_logits,
    loops_per_position,
    matched_rnn_hidden,
    rnn_parameters,
)
from fullband.experiments.word_problems.train import RESULT, training_batch
from fullband.model.recurrence import ntp_loss
from fullband.tasks.word_problems import WordProblems


def point(acc, lr, steps, loss, **extra):
    return {"validation_accuracy": acc, "lr": lr, "steps": steps, "validation_loss": loss, **extra}


def test_fair_choice_ties_within_0002_then_lower_lr_fewer_steps_lower_loss():
    grid = [point(1.000, 3e-3, 2000, 0.01), point(0.9985, 3e-4, 4000, 0.20), point(0.9985, 3e-4, 2000, 0.30),
            point(0.997, 1e-4, 2000, 0.0)]
    assert fair_choice(grid) is grid[2]  # 0.9985 ties with 1.000; lr 3e-4 < 3e-3; then 2000 steps; 0.997 is out
    grid = [point(0.95, 1e-3, 2000, 0.5), point(0.95, 1e-3, 2000, 0.4)]
    assert fair_choice(grid) is grid[1]  # same rate and steps: the lower validation loss
    grid = [point(0.998, 3e-4, 2000, 0.5), point(1.0, 1e-3, 2000, 0.4)]
    assert fair_choice(grid) is grid[0]  # exactly 0.002 below the best is a tie (float rounding aside)


def test_hindsight_choice_keeps_the_longest_then_the_best_unseen_mean():
    L, length = 2, 6
    a = point(1.0, 1e-3, 10, 0.1, test=[1, 1, 0.95, 0.5, 0.5, 0.5])  # keeps 3
    b = point(1.0, 3e-4, 10, 0.1, test=[1, 1, 0.95, 0.95, 0.2, 0.2])  # keeps 4
    c = point(1.0, 3e-3, 10, 0.1, test=[1, 1, 0.95, 0.92, 0.5, 0.5])  # keeps 4, higher unseen mean than b
    assert hindsight_choice([a, b, c], L, length) is c
    assert hindsight_choice([a, b], L, length) is b
    # Only lengths up to `length` count.
    d = point(1.0, 3e-3, 10, 0.1, test=[1, 1, 0.95, 0.5, 0.5, 0.5, 1.0])
    assert hindsight_choice([a, d], L, length) is a  # tied on both; the lower learning rate


def cells(*tests, validation=(1.0, 1.0)):
    return {str(100 + i): {"test": list(t), "validation": list(validation)} for i, t in enumerate(tests)}


def test_better_setting_and_the_strongest_controls():
    fair = cells([1, 1, 0.95, 0.2], [1, 1, 0.5, 0.2], [1, 1, 0.95, 0.95])  # kept 3, 2, 4: median 3
    hind = cells([1, 1, 0.95, 0.95], [1, 1, 0.95, 0.2], [1, 1, 0.95, 0.2])  # kept 4, 3, 3: median 3, higher mean
    assert better_setting(fair, hind, 2, 4) == "hindsight"
    assert better_setting(fair, fair, 2, 4) == "fair"  # a tie goes to the fair one
    assert better_setting(fair, None, 2, 4) == "fair"
    weak = cells([1, 0.5, 0.2, 0.2], [1, 0.5, 0.2, 0.2], [1, 0.5, 0.2, 0.2])
    assert strongest_controls({"looped": fair, "baseline": weak, "equal_flops": hind}, 2, 2, 4) == [
        "equal_flops", "looped"]


def test_the_target_is_computed_as_the_rule_says():
    n = 40
    model = cells(*([1.0] * n for _ in range(3)))
    model["101"]["test"][35] = 0.5  # keeps 35 on one seed: median of (40, 35, 40) = 40
    control = cells(*([1.0] * 10 + [0.3] * (n - 10) for _ in range(3)))  # keeps 10
    hind = cells(*([1.0] * 12 + [0.4] * (n - 12) for _ in range(3)))  # keeps 12: the better setting
    rnn = cells(*([1.0] * n for _ in range(3)))
    group = {"cells": {"baseline": control, "looped": control, "rnn": rnn, "fullband": model},
             "hindsight_cells": {"baseline": control, "looped": hind}}
    a = analyse_group(group, ["baseline", "looped", "rnn", "fullband"], 2, 30)
    assert a["better"] == {"baseline": "fair", "looped": "hindsight"}
    assert a["median_kept"]["fullband"] == 40 and a["median_kept"]["looped"] == 12
    target = a["target"]
    assert target["n"] == 40 and target["depth"]  # 40 >= 32 and >= 2 x 12
    margin = target["margin"]
    assert margin["per_seed"] == {"100": pytest.approx(0.6), "101": pytest.approx(0.6), "102": pytest.approx(0.6)}
    assert margin["best_rival"]["100"] == "looped (hindsight)"  # the best control over both settings
    assert target["met"] and target["reference_margin"]["mean"] == 0.0
    hind_strong = cells(*([1.0] * 25 + [0.4] * (n - 25) for _ in range(3)))  # 25: 40 < 2 x 25
    group["hindsight_cells"]["looped"] = hind_strong
    assert not analyse_group(group, ["baseline", "looped", "rnn", "fullband"], 2, 30)["target"]["met"]


def test_looped_feeds_back_the_normalised_state_and_reads_each_step_at_its_own_depth():
    torch.manual_seed(0)
    problems = WordProblems("s5")
    cfg = DecisiveConfig(preset="smoke")
    arm = make_arm("looped", cfg, problems, "position=rope,injection=normed")
    model = LoopedTransformer(arm.model_config(), 2, "normed").double()
    with torch.no_grad():  # non-trivial final-norm gains, so "normed" is not "raw" scaled
        model.net.norm.weight.uniform_(0.5, 1.5)
    tokens = problems.batch(3, 5, torch.Generator().manual_seed(1)).tokens[:, :-1]
    net, emb = model.net, model.net.embed(tokens)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    state, _ = net.run_stack(emb, positions)
    _, normed2 = net.run_stack(net.norm(state) + emb, positions)  # x^(2) = RMSNorm(h^(1)) + e
    loops = list(model.loop_logits(tokens, 2))
    torch.testing.assert_close(loops[1], net.lm_head(normed2), rtol=0, atol=1e-12)
    raw = LoopedTransformer(arm.model_config(), 2, "raw").double()
    raw.load_state_dict(model.state_dict())
    assert not torch.allclose(list(raw.loop_logits(tokens, 2))[1], loops[1])
    whole = model(tokens)
    for t in range(1, 5):
        *_, last = model.loop_logits(tokens[:, : t + 1], 2 * t)
        torch.testing.assert_close(whole[:, t], last[:, -1], rtol=0, atol=1e-12)


def test_growing_depth_reads_step_t_after_c_t_passes_without_the_shift():
    """Position t after c*t shift-0 passes over the whole sequence == the last position of c*t passes over its
    prefix; the loss it trains on is the next-token loss of what it answers; logits at t depend on tokens <= t."""
    torch.manual_seed(0)
    problems = WordProblems("a5")
    cfg = DecisiveConfig(preset="smoke")
    arm = make_arm("growing_depth", cfg, problems)
    model = arm.build(2).double()
    assert model.config.feedback_shift == 0 and model.fusion is not None
    with torch.no_grad():
        for p in model.fusion.parameters():
            p.normal_(0, 0.3)
    tokens = problems.batch(3, 5, torch.Generator().manual_seed(1)).tokens[:, :-1]
    whole = growing_depth_logits(model, tokens, 2)
    assert loops_per_position(6, 2).tolist() == [1, 2, 4, 6, 8, 10]  # the rule looped reads with too
    for t in range(1, 5):
        passes = list(model.iterate_passes(tokens[:, : t + 1], 2 * t, plain_prefix=1))
        torch.testing.assert_close(whole[:, t], model.lm_head(passes[-1].head_input)[:, -1], rtol=0, atol=1e-12)
    changed = tokens.clone()
    changed[:, 3] = (changed[:, 3] - problems.first_step_token + 1) % 20 + problems.first_step_token
    after = growing_depth_logits(model, changed, 2)
    torch.testing.assert_close(after[:, :3], whole[:, :3], rtol=0, atol=0)  # causal
    assert not torch.allclose(after[:, 3], whole[:, 3])
    batch = training_batch(cfg, problems, 0, 0)
    with torch.no_grad():
        loss = arm.loss(model, batch, 2)
        answered = ntp_loss(arm.logits(model, batch.tokens, 2), batch.labels)
    torch.testing.assert_close(loss, answered)


@pytest.mark.parametrize("arm_name", ["baseline", "equal_flops", "looped", "growing_depth", "fullband"])
def test_every_transformer_arm_has_nope_in_its_variants(arm_name):
    from fullband.experiments.word_problems.arms import ARM_TYPES

    cfg = DecisiveConfig(preset="smoke")
    names = variants(cfg, ARM_TYPES[arm_name])
    assert {parse_variant(v)["position"] for v in names} == {"rope", "none"}
    arm = make_arm(arm_name, cfg, WordProblems("s5"), next(v for v in names if "position=none" in v))
    model = arm.build(arm.knobs()[0])
    config = model.config if hasattr(model, "config") else model.net.config
    assert config.position_encoding == "none" and "NoPE" in arm.describe(arm.knobs()[0])
    assert variants(cfg, ARM_TYPES["rnn"]) == [""]
    assert variants(cfg, ARM_TYPES["looped"]) == [f"position={p},injection={i}" for p in ("rope", "none")
                                                  for i in ("normed", "raw")]
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variant("position=alibi")


@pytest.mark.parametrize("cell", RNN_CELLS)
def test_rnn_parameter_count_is_the_built_modules(cell):
    for vocab, hidden in ((16, 8), (26, 61), (30, 100)):
        built = sum(p.numel() for p in RNNLM(vocab, hidden, cell).parameters())
        assert rnn_parameters(vocab, hidden, cell) == built
    target = 50_000
    h = matched_rnn_hidden(26, cell, target)
    counts = {x: sum(p.numel() for p in RNNLM(26, x, cell).parameters()) for x in (h - 1, h, h + 1)}
    assert abs(counts[h] - target) == min(abs(c - target) for c in counts.values())


def test_study_end_to_end_and_resume(tmp_path):
    from fullband.cli import main

    out = tmp_path / "decisive"
    args = ["eval-decisive", "--preset", "smoke", "--out_dir", str(out), "--workers", "1", "--progress", "false"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    cfg = results["config"]
    group = results["groups"]["s5"]
    arms = {"baseline", "equal_flops", "looped", "growing_depth", "rnn", "fullband"}
    assert set(group["cells"]) == arms
    assert set(group["hindsight_cells"]) == arms - {"rnn", "fullband"}  # the model never gets hindsight
    assert all(set(seeds) == {"100", "101"} for seeds in group["cells"].values())
    assert all(len(cell["test"]) == 8 for seeds in group["cells"].values() for cell in seeds.values())
    # The cells' long lengths come from the long test problems, the short ones from the test problems.
    pick = group["chosen"]["fullband"]
    run = json.loads(next(out.glob(f"runs/s5/fullband/{pick['variant']}/*-lr{pick['lr']:g}/seed100-*/"
                                   + RESULT)).read_text())
    scores = run["checkpoints"][str(pick["steps"])]
    assert group["cells"]["fullband"]["100"]["test"] == (scores["test"]["accuracy"][:6]
                                                        + scores["long_test"]["accuracy"][6:])
    # The grid: every arm x variant x knob x learning rate x 2 step counts; the fair choice is the rule's.
    sizes = {"baseline": 2 * 2, "equal_flops": 2 * 2, "looped": 4 * 1, "growing_depth": 2 * 1, "rnn": 2,
             "fullband": 2 * 1}
    assert len(group["grid"]) == sum(sizes.values()) * len(cfg["learning_rates"]) * 2
    for arm in arms:
        points = [p for p in group["grid"] if p["arm"] == arm]
        assert group["chosen"][arm] == fair_choice(points)
    assert len(group["rnn"]) == 2 * len(cfg["learning_rates"]) * 2  # every cell, rate and step count
    assert set(group["range"]["cells"]) == {"fullband", *strongest_controls(
        {a: group["hindsight_cells"][a] if group["analysis"]["better"][a] == "hindsight" else group["cells"][a]
         for a in group["analysis"]["better"]}, 2, cfg["train_length"], cfg["hindsight_length"])}
    assert group["range"]["train_length"] == 4
    assert any(out.glob("range16/runs/s5/fullband/**/" + RESULT))
    report = (out / "report.md").read_text()
    for heading in ("## The rule, fixed before the runs", "### Tuning grid (seed 0)", "## The second training range",
                    "### The RNN at every cell and learning rate"):
        assert heading in report
    assert "gives no verdict" in report
    median = statistics.median(group["analysis"]["kept"]["fair"]["fullband"].values())
    assert group["analysis"]["median_kept"]["fullband"] == median
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("**/" + RESULT)}
    assert main([*args, "--resume", "true"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/" + RESULT)} == stamps  # nothing retrained
    assert json.loads((out / "results.json").read_text())["groups"] == results["groups"]


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="fresh_seeds"):
        DecisiveConfig(fresh_seeds=(0, 1))  # the tuning seed
    with pytest.raises(ConfigError, match="long_test_lengths"):
        DecisiveConfig(long_test_lengths=(48,))
    with pytest.raises(ConfigError, match="hindsight_length"):
        DecisiveConfig(hindsight_length=6)
    with pytest.raises(ConfigError, match="positions"):
        DecisiveConfig(positions=("alibi",))
    assert DecisiveConfig().max_test_length == 256
