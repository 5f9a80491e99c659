"""``MultiPassObjective(reuse_prefix=True)``: passes after the first run only the positions after a plain prefix that
every row shares, attending to pass 1's keys and values of it. The objective, every pass's loss, the last logits and
every gradient are the full passes' to float64 rounding, in each form, with truncated gradients from the fixed point
and with jitter; the passes really skip the prefix; and the FLOPs a study counts for it are what runs."""

import pytest
import torch

from fullband.experiments.core.flops import Shape, forward_flops, positions_flops, step_flops
from fullband.training import MultiPassObjective

FORMS = {
    "default": {},
    "nope": dict(position_encoding="none"),
    "span_1": dict(n_layers=3, feedback_target=1),
    "paper_form": dict(input_norm="paper", gate_norm="shared"),  # no reuse: its plain inputs change at pass 2
}
P, T = 7, 12  # a plain prefix of 7 positions (a table before the start cup), 5 fused positions after it
# (passes, grad_passes, jitter): every pass with gradients; the exact count with the last 2 from the fixed point; jitter
SETTINGS = [(4, 0, 0.0), (T - P + 1, 2, 0.0), (3, 0, 0.05)]


def objective_and_grads(model, tokens, labels, passes, grad_passes, jitter, reuse):
    torch.manual_seed(11)  # the jitter's draws
    objective = MultiPassObjective(feedback_weight=0.7, grad_passes=grad_passes, jitter=jitter, reuse_prefix=reuse)
    model.zero_grad(set_to_none=True)
    out = objective(model, tokens, labels, passes, P)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("setting", SETTINGS, ids=["all_grad", "fixed_point", "jitter"])
@pytest.mark.parametrize("form", FORMS)
def test_reusing_the_prefix_gives_the_full_passes_objective_and_gradients(form, setting):
    from conftest import make_model

    model = make_model(**FORMS[form]).train()
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 61, (3, T), generator=generator)
    labels = tokens.clone()  # the prefix's positions scored too: their logits are pass 1's
    full, full_grads = objective_and_grads(model, tokens, labels, *setting, reuse=False)
    reused, reused_grads = objective_and_grads(model, tokens, labels, *setting, reuse=True)
    assert reused.passes == full.passes and len(reused.pass_losses) == len(full.pass_losses) > 1
    torch.testing.assert_close(reused.loss, full.loss, rtol=1e-12, atol=0)
    for a, b in zip(reused.pass_losses, full.pass_losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    torch.testing.assert_close(reused.logits, full.logits, rtol=0, atol=1e-12)
    assert reused_grads.keys() == full_grads.keys() and any("fusion" in name for name in full_grads)
    for name, grad in full_grads.items():
        torch.testing.assert_close(reused_grads[name], grad, rtol=0, atol=1e-12, msg=name)


def test_the_passes_after_the_first_run_only_the_positions_after_the_prefix():
    from conftest import make_model

    model = make_model().train()
    seen: list[int] = []
    model.blocks[0].register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    tokens = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(4))
    MultiPassObjective(reuse_prefix=True)(model, tokens, tokens, 4, P)
    assert seen == [T, T - P, T - P, T - P]
    seen.clear()
    MultiPassObjective(reuse_prefix=True)(model, tokens, tokens, 4, 1)  # no plain prefix to reuse: whole passes
    assert seen == [T] * 4


def test_step_flops_count_the_positions_the_reusing_passes_run():
    shape = Shape(d_model=32, n_layers=2, kv_dim=16, ffn_dim=64, vocab_size=61)
    plain = forward_flops(shape, T, False)
    later = positions_flops(shape, P + 1, T, True, upper=True)
    assert step_flops(shape, 3, T, 4, feedback=True, reused_prefix=P) == 3 * (3 * plain + 3 * 3 * later)
    assert step_flops(shape, 3, T, 4, feedback=True, reused_prefix=1) == step_flops(shape, 3, T, 4, feedback=True)
    assert later < forward_flops(shape, T, True, upper=True)
