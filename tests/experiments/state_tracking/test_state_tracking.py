"""The state-tracking study: the per-depth residual stream (equal to the model's own forward in every prefill),
the ridge probes, and ``fullband eval-state --preset smoke`` end to end (the tasks and their labels:
tests/tasks/test_state_tracking_tasks.py)."""

import json

import pytest
import torch
from conftest import Killed, kill_training_at, make_model

from fullband.cli import main
from fullband.experiments.core.records import key_problems
from fullband.experiments.state_tracking.probes import fit_ridge_probe, probe_accuracy, residual_stream
from fullband.experiments.state_tracking.records import ProbeCell, StateTrackingResults

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


@pytest.mark.parametrize("passes", [1, 2, 3, None])
def test_residual_stream_top_equals_the_models_forward(passes):
    model = make_model()
    with torch.no_grad():
        model.fusion.state_proj.weight.mul_(20)
    tokens = torch.randint(0, 61, (3, 11), generator=torch.Generator().manual_seed(0))
    stream = residual_stream(model, tokens, passes)
    assert stream.shape == (model.config.n_layers + 1, 3, 11, model.config.d_model)
    reference = model.forward_exact(tokens, plain_prefix=1) if passes is None else model(tokens, passes=passes)
    torch.testing.assert_close(stream[-1], reference.hidden, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.lm_head(model.norm(stream[-1])), reference.logits, rtol=0, atol=1e-12)
    # Position 1 is always plain: depth 0 holds what the first block sees, its raw embedding (DESIGN.md §1).
    torch.testing.assert_close(stream[0, :, 0], model.embed(tokens[:, 0]))
    # Depth 0 of the last position: its embedding when plain, otherwise it depends on the earlier tokens.
    other = torch.cat((tokens[:, :1], (tokens[:, 1:-1] + 1) % 61, tokens[:, -1:]), dim=1)
    changed = (residual_stream(model, other, passes)[0, :, -1] - stream[0, :, -1]).abs().max()
    assert (changed == 0) if passes == 1 else (changed > 1e-3)


def test_baseline_stream_is_the_same_under_every_prefill():
    model = make_model(feedback=False)
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    plain = residual_stream(model, tokens, 1)
    for passes in (2, None):
        torch.testing.assert_close(residual_stream(model, tokens, passes), plain, rtol=0, atol=0)


def test_ridge_probe_decodes_a_linear_label_and_a_constant_feature_gives_the_majority():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(600, 8, generator=generator) * torch.arange(1, 9)  # uneven scales: standardisation matters
    y = (x @ torch.randn(8, 3, generator=generator)).argmax(1)  # linearly separable classes
    assert probe_accuracy(x[:400], y[:400], x[400:], y[400:], 3) > 0.9
    assert probe_accuracy(x[:400], y[:400], x[400:], y[400:].flip(0), 3) < 0.6  # held-out labels matter
    constant = torch.ones(600, 8)
    labels = torch.tensor([0] * 350 + [1] * 250)
    probe = fit_ridge_probe(constant[:300], labels[:300], 2)
    assert probe.accuracy(constant[300:], labels[300:]) == pytest.approx(50 / 300)


def test_eval_state_smoke_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["eval-state", "--preset", "smoke", "--out_dir", str(out), "--progress", "false"]) == 0
    printed = capsys.readouterr().out
    assert "probe_registers:" in printed and "fullband one-step" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["variants"] == ["baseline", "fullband standard", "fullband one-step", "fullband exact"]
    assert len(results["cells"]) == 3 * 4
    assert key_problems(results, StateTrackingResults) == []  # the typed records the report reads
    assert [p for cell in results["cells"] for p in key_problems(cell, ProbeCell)] == []
    for cell in results["cells"]:
        assert len(cell["probe_accuracy"]) == 3  # depths 0..n_layers
        if cell["prefill"] == "standard":  # the shared final token's embedding: a constant feature
            assert cell["probe_accuracy"][0] == pytest.approx(cell["chance"])
    assert (out / "probe_accuracy_vs_depth.png").stat().st_size > 10_000
    assert "## Probe accuracy at the final token" in (out / "report.md").read_text()


def test_a_killed_study_resumes_to_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch, capsys):
    """kill -9 while the full-bandwidth model trains: ``--resume true`` reuses the finished baseline, continues the
    interrupted run from its latest checkpoint (not from scratch), and ends with the uninterrupted study's numbers;
    a second resume reads every cell back instead of probing again."""
    from fullband.experiments.state_tracking import study as state_tracking

    args = ["eval-state", "--preset", "smoke", "--train.max_steps", "6", "--progress", "false"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main([*args, "--out_dir", str(whole)]) == 0
    revive = kill_training_at(monkeypatch, "fullband", 4)
    with pytest.raises(Killed):
        main([*args, "--out_dir", str(killed)])
    revive()
    assert not (killed / "fullband" / "model").exists() and (killed / "baseline" / "model").is_dir()
    capsys.readouterr()
    assert main([*args, "--out_dir", str(killed), "--resume", "true", "--progress", "true"]) == 0
    printed = capsys.readouterr().out
    assert "training fullband (6 steps, resumed from step-0000004)" in printed
    assert "training baseline" not in printed  # the finished model is reused
    before, after = (json.loads((d / "results.json").read_text()) for d in (whole, killed))
    assert after["cells"] == before["cells"]
    for kind in ("baseline", "fullband"):
        assert after["training"][kind]["final_loss"] == before["training"][kind]["final_loss"], kind
    # Everything finished: resuming again probes nothing (the cached cells come back as they were).
    monkeypatch.setattr(state_tracking, "probe_model", lambda *a, **k: pytest.fail("probed a cached cell"))
    assert main([*args, "--out_dir", str(killed), "--resume", "true"]) == 0
    assert json.loads((killed / "results.json").read_text())["cells"] == before["cells"]
    # A resume with nothing to resume is one line.
    assert main([*args, "--out_dir", str(tmp_path / "empty"), "--resume", "true"]) == 2
    assert "holds no eval-state study to resume" in capsys.readouterr().err
