"""The multi-pass objective (MultiPassObjective, the one object training runs): the paper's loss combination,
per-row prefixes, z-loss, jitter, detach, truncated gradients and cost accounting, each against the model's own
forward (the network, which takes none of these)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model

from fullband.training import MultiPassObjective, sample_plain_prefix
from fullband.training.config import TrainConfig
from fullband.training.objective import z_loss

B, T = 4, 12


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(5))
    labels = inputs.clone()
    labels[0, :3] = -100  # a masked prompt
    return inputs, labels


def ntp(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def multipass_loss(model, inputs, labels, passes, cfg, generator, *, z_loss_weight=0.0, plain_prefix=None,
                   fixed_point=None):
    """The objective of ``fullband train``'s [train] section ``cfg`` on one batch, its prefixes drawn as the trainer
    draws them (one per row from ``generator``, or 1 without the prefix mixin): (loss, metrics)."""
    if plain_prefix is None:
        plain_prefix = sample_plain_prefix(B, T, generator) if cfg.prefix_mixin else torch.ones(B, dtype=torch.long)
    objective = MultiPassObjective.of(cfg)
    if z_loss_weight:
        objective = dataclasses.replace(objective, z_loss=z_loss_weight, z_loss_when="always")
    out = objective(model, inputs, labels, passes, plain_prefix, fixed_point=fixed_point)
    return out.loss, out.metrics()


def test_prefixes_are_per_row_uniform_and_reproducible():
    draw = sample_plain_prefix(20_000, T, torch.Generator().manual_seed(0))
    assert draw.dtype == torch.long and draw.shape == (20_000,)
    assert int(draw.min()) == 1 and int(draw.max()) == T - 1  # never an all-plain row
    counts = torch.bincount(draw, minlength=T)[1:]
    assert (counts.float() / 20_000 - 1 / (T - 1)).abs().max() < 0.01
    again = sample_plain_prefix(20_000, T, torch.Generator().manual_seed(0))
    assert torch.equal(draw, again)


def test_loss_is_pass_one_plus_weighted_mean_of_later_passes(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0, feedback_weight=0.5)
    loss, metrics = multipass_loss(model, inputs, labels, 3, cfg, torch.Generator().manual_seed(1))
    prefix = sample_plain_prefix(B, T, torch.Generator().manual_seed(1))  # the same draw
    assert len(set(prefix.tolist())) > 1  # rows really differ
    # Pass k of a 3-pass run is the k-pass forward, whose NTP loss we compute by hand.
    manual = [ntp(model(inputs, passes=k, plain_prefix=prefix).logits, labels) for k in (1, 2, 3)]
    torch.testing.assert_close(torch.stack(metrics["pass_losses"]), torch.stack(manual), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, manual[0] + 0.5 * (manual[1] + manual[2]) / 2, rtol=1e-12, atol=1e-12)
    assert metrics["passes"] == 3 and metrics["tokens"] == B * T and metrics["token_equiv_compute"] == 3 * B * T
    assert loss.requires_grad and not metrics["objective"].requires_grad


def test_without_prefix_mixin_every_row_has_prefix_one(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False)
    loss, _ = multipass_loss(model, inputs, labels, 2, cfg, None)
    one = MultiPassObjective(jitter=0.0)(model, inputs, labels, 2, 1).loss
    torch.testing.assert_close(loss, one, rtol=0, atol=0)


def test_z_loss_is_added_from_the_last_pass_logits(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0)
    base, _ = multipass_loss(model, inputs, labels, 2, cfg, torch.Generator().manual_seed(2))
    loss, metrics = multipass_loss(model, inputs, labels, 2, cfg, torch.Generator().manual_seed(2), z_loss_weight=1e-2)
    prefix = sample_plain_prefix(B, T, torch.Generator().manual_seed(2))
    logits = model(inputs, passes=2, plain_prefix=prefix).logits
    lse = torch.logsumexp(logits[:, :-1], -1)
    valid = labels[:, 1:] != -100
    expected_z = lse[valid].square().mean()
    torch.testing.assert_close(metrics["z_loss"].double(), expected_z, rtol=1e-6, atol=0)
    torch.testing.assert_close(loss, base + 1e-2 * metrics["z_loss"], rtol=1e-6, atol=0)
    assert z_loss(logits, torch.full_like(labels, -100)) == 0  # nothing to predict: no z-loss, no NaN


def test_jitter_comes_from_the_global_rng_and_is_reproducible(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.5)
    torch.manual_seed(11)
    first, _ = multipass_loss(model, inputs, labels, 2, cfg, torch.Generator().manual_seed(0))
    torch.manual_seed(11)
    second, _ = multipass_loss(model, inputs, labels, 2, cfg, torch.Generator().manual_seed(0))
    quiet, _ = multipass_loss(model, inputs, labels, 2, TrainConfig(seq_len=T, jitter=0.0),
                              torch.Generator().manual_seed(0))
    assert first == second and first != quiet


def test_baseline_model_runs_one_pass_and_counts_one_pass_of_compute(batch):
    inputs, labels = batch
    model = make_model(feedback=False)
    loss, metrics = multipass_loss(model, inputs, labels, 3, TrainConfig(seq_len=T), torch.Generator())
    assert metrics["passes"] == 1 and metrics["token_equiv_compute"] == B * T
    torch.testing.assert_close(loss, ntp(model(inputs).logits, labels), rtol=1e-12, atol=1e-12)


def test_truncated_gradient_keeps_the_values_and_cuts_the_middle_passes(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=2, feedback_weight=0.5)
    loss, metrics = multipass_loss(model, inputs, labels, 6, cfg, None)
    # Scored: pass 1 and the last two passes, each the value of the k-pass forward.
    manual = [ntp(model(inputs, passes=k, plain_prefix=1).logits, labels) for k in (1, 5, 6)]
    torch.testing.assert_close(torch.stack(metrics["pass_losses"]), torch.stack(manual), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, manual[0] + 0.5 * (manual[1] + manual[2]) / 2, rtol=1e-12, atol=1e-12)
    assert metrics["passes"] == 6
    # Gradient: pass 1 and passes 5-6 with pass 4's states as constants (detached), nothing through passes 2-4.
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    four = [s.hidden for s in model.iterate_passes(inputs, 4, 1)][-1].detach()
    five = model.stack_inputs(inputs, four)
    h5, head5 = model.run_stack(five, torch.arange(T).expand(B, T))
    _, head6 = model.run_stack(model.stack_inputs(inputs, h5), torch.arange(T).expand(B, T))
    one = ntp(model(inputs, passes=1).logits, labels)
    (one + 0.5 * (ntp(model.lm_head(head5), labels) + ntp(model.lm_head(head6), labels)) / 2).backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(got[name], param.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_truncated_gradient_stops_at_the_exact_pass_count(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=1)
    _, metrics = multipass_loss(model, inputs, labels, 50, cfg, None)
    assert metrics["passes"] == T  # every position exact after T passes with plain prefix 1
    exact = model.forward_exact(inputs, plain_prefix=1).logits
    torch.testing.assert_close(ntp(exact, labels), metrics["pass_losses"][-1], rtol=1e-10, atol=1e-10)
    baseline = make_model(feedback=False)
    _, metrics = multipass_loss(baseline, inputs, labels, 5, cfg, None)
    assert metrics["passes"] == 1 and len(metrics["pass_losses"]) == 1


def test_truncated_gradient_from_the_fixed_point_backpropagates_through_the_last_passes_only(batch):
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=2)
    loss, metrics = multipass_loss(model, inputs, labels, 100, cfg, None)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    fixed = model.forward_exact(inputs, plain_prefix=1).hidden  # no gradient: the fixed point as a constant
    positions = torch.arange(T).expand(B, T)
    h, head = model.run_stack(model.stack_inputs(inputs, fixed), positions)
    _, head2 = model.run_stack(model.stack_inputs(inputs, h), positions)
    one = ntp(model(inputs, passes=1).logits, labels)
    (one + (ntp(model.lm_head(head), labels) + ntp(model.lm_head(head2), labels)) / 2).backward()
    assert metrics["passes"] == T and set(got) == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, param in model.named_parameters():
        torch.testing.assert_close(got[name], param.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_truncation_is_decided_from_the_plain_prefixes():
    # Capped at the exact count; the fixed point only with one prefix for all rows, passes reaching the exact count
    # and some passes without gradients.
    def truncation(prefix, T, passes, grad_passes, fused=None):
        return MultiPassObjective(grad_passes=grad_passes).step_passes(passes, T, prefix, fused)

    assert truncation(torch.ones(B, dtype=torch.long), T, 50, 2) == (T, True)
    assert truncation(torch.ones(B, dtype=torch.long), T, 6, 2) == (6, False)  # short of the exact count
    assert truncation(torch.ones(B, dtype=torch.long), T, 50, T - 1) == (T, False)  # every pass has gradients
    assert truncation(torch.tensor([3, 5, 3, 4]), T, 50, 2) == (T - 2, False)  # rows differ: the loop, to T - 3 + 1
    assert truncation(torch.full((3, B), 2), T, 50, 2) == (T - 1, False)  # a prefix per pass has no fixed point
    assert truncation(4, T, 50, 2) == (T - 3, True)
    assert MultiPassObjective().step_passes(50, T, 1) == (50, None)  # no truncation: every pass asked for runs
    # A plan with plain positions inside the rows: each pass makes one more fused position exact.
    fused = torch.ones(B, T, dtype=torch.bool)
    fused[:, 5] = False  # a document starts at position 6 of every row
    assert truncation(1, T, 50, 2, fused) == (T - 1, True)
    fused[0, 8] = False
    assert truncation(1, T, 50, 2, fused) == (T - 1, True)  # the longest row decides
    assert truncation(1, T, 50, 2, fused.expand(3, B, T)) == (T - 1, False)  # a plan per pass: no fixed point


def test_truncated_gradient_from_the_passes_when_told_not_to_use_the_fixed_point(batch):
    # fixed_point=False (what data-parallel training passes when the global batch's rows differ, with the passes
    # it capped): passes 2..T-2 run without gradients, so the scored passes are the k-pass forwards' own.
    inputs, labels = batch
    model = make_model()
    cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=2)
    _, metrics = multipass_loss(model, inputs, labels, T, cfg, None, fixed_point=False)
    assert metrics["passes"] == T
    manual = [ntp(model(inputs, passes=k).logits, labels) for k in (1, T - 1, T)]
    torch.testing.assert_close(torch.stack(metrics["pass_losses"]), torch.stack(manual), rtol=1e-12, atol=1e-12)


def test_truncated_gradient_on_a_looped_model_runs_the_passes(batch):
    # A looped model has no sequential fixed point (forward_exact refuses it): the passes run, capped as usual.
    inputs, labels = batch
    looped = make_model(feedback_shift=0)
    cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=2)
    loss, metrics = multipass_loss(looped, inputs, labels, 50, cfg, None)
    manual = [ntp(looped(inputs, passes=k).logits, labels) for k in (1, T - 1, T)]
    assert metrics["passes"] == T
    torch.testing.assert_close(torch.stack(metrics["pass_losses"]), torch.stack(manual), rtol=1e-12, atol=1e-12)
    loss.backward()
    assert looped.fusion.state_proj.weight.grad.abs().sum() > 0  # through the scored passes' fusion


@pytest.mark.parametrize("passes", [6, 16])  # 16: capped at the exact count (12), from the fixed point
def test_truncated_gradient_applies_jitter_and_keeps_detach(batch, passes):
    inputs, labels = batch
    model = make_model()
    quiet = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=2)
    noisy = TrainConfig(seq_len=T, jitter=0.5, prefix_mixin=False, grad_passes=2)
    a, _ = multipass_loss(model, inputs, labels, passes, quiet, None)
    again, _ = multipass_loss(model, inputs, labels, passes, quiet, None)
    torch.manual_seed(3)
    b, _ = multipass_loss(model, inputs, labels, passes, noisy, None)
    torch.manual_seed(3)
    b_again, _ = multipass_loss(model, inputs, labels, passes, noisy, None)
    assert torch.equal(a, again) and torch.equal(b, b_again)  # jitter draws from the global RNG, reproducibly
    assert not torch.equal(a, b)  # train.jitter applies with truncated gradients too (it was ignored before)
    # detach_passes cuts the gradient from pass 6 into pass 5's states: pass 5's loss alone then reaches the
    # network through pass 5, so the gradients differ from the undetached run's.
    grads = []
    for detach in (False, True):
        model.zero_grad()
        cfg = TrainConfig(seq_len=T, jitter=0.0, prefix_mixin=False, grad_passes=2, detach_passes=detach)
        multipass_loss(model, inputs, labels, 6, cfg, None)[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert not torch.allclose(grads[0], grads[1])


def test_the_forward_takes_no_training_objective_arguments(batch):
    # The network's forward is the network's (DESIGN.md §3, issue 53): labels, loss weights, jitter, detach and
    # gradient truncation belong to the objective.
    inputs, labels = batch
    model = make_model()
    for argument in ("labels", "feedback_weight", "jitter", "grad_passes", "detach_passes", "fixed_point"):
        with pytest.raises(TypeError, match=argument):
            model(inputs, passes=2, **{argument: labels if argument == "labels" else 1})


def test_loss_combines_passes_with_feedback_weight(model, tokens):
    labels = tokens.clone()
    labels[:, :3] = -100
    out = MultiPassObjective(feedback_weight=0.5)(model, tokens, labels, 3, 2)
    assert len(out.pass_losses) == 3
    expected = out.pass_losses[0] + 0.5 * (out.pass_losses[1] + out.pass_losses[2]) / 2
    torch.testing.assert_close(out.loss, expected)
    manual = F.cross_entropy(out.logits[:, :-1].reshape(-1, 61), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.pass_losses[-1], manual)


def test_detach_passes_keeps_values_and_cuts_gradient_between_passes(model, tokens):
    attached = MultiPassObjective()(model, tokens, tokens, 2)
    detached = MultiPassObjective(detach_passes=True)(model, tokens, tokens, 2)
    torch.testing.assert_close(attached.loss, detached.loss, atol=0, rtol=0)
    # Pass 2's loss reaches the fusion weights either way, but reaches pass 1 only without detach.
    grads = []
    for out in (attached, detached):
        model.zero_grad()
        out.pass_losses[1].backward()
        grads.append(model.blocks[0].attn.q_proj.weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])


def test_jitter_perturbs_only_fused_inputs(model, tokens):
    torch.manual_seed(0)
    clean = MultiPassObjective()(model, tokens, tokens, 2, 1)
    noisy = MultiPassObjective(jitter=0.02)(model, tokens, tokens, 2, 1)
    single_noisy = MultiPassObjective(jitter=0.02)(model, tokens, tokens, 1)
    assert not torch.allclose(clean.logits, noisy.logits)
    torch.testing.assert_close(clean.logits[:, 0], noisy.logits[:, 0], atol=1e-9, rtol=0)  # position 1 is plain
    torch.testing.assert_close(single_noisy.logits, model(tokens).logits, atol=0, rtol=0)
