"""The three input forms of DESIGN.md §1, each against the formula, in training and at inference.

- ``fused`` (default): plain positions take the raw embedding in every pass, so pass 1 of a feedback model is the
  baseline's forward on the same weights;
- ``paper``: the paper's App. C code, which also normalises the plain-prefix positions of training passes >= 2;
- ``all``: every input normalised.
"""

import pytest
import torch
from conftest import formula_input, make_model, stack_from_inputs

from fullband import FullBandwidthLM, ModelConfig
from fullband.config import ConfigError
from fullband.generation import generate
from fullband.training.objective import MultiPassObjective

FORMS = ["fused", "paper", "all"]


def baseline_on_same_weights(model: FullBandwidthLM) -> FullBandwidthLM:
    """The baseline (feedback=False) holding every weight of ``model`` but its fusion."""
    config = ModelConfig(**{**model.config.to_dict(), "feedback": False})
    baseline = FullBandwidthLM(config).to(torch.float64)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("fusion.")}
    baseline.load_state_dict(state)
    return baseline.train(model.training)


@pytest.mark.parametrize("training", [True, False])
def test_pass_one_of_the_default_form_is_the_baseline(tokens, training):
    model = make_model().train(training)
    baseline = baseline_on_same_weights(model)
    objective = MultiPassObjective()  # the training objective's pass 1 is the baseline's forward and loss
    out = objective(model, tokens, tokens, 3, 2)
    plain = objective(baseline, tokens, tokens)
    torch.testing.assert_close(out.pass_losses[0], plain.loss, rtol=0, atol=0)
    torch.testing.assert_close(model(tokens, passes=1).logits, plain.logits, rtol=0, atol=0)
    # Standard decoding is the baseline's too.
    prompt = tokens[:2, :5]
    assert generate(model, prompt, max_new_tokens=6, mode="standard").tolist() == \
        generate(baseline, prompt, max_new_tokens=6, mode="standard").tolist()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("training", [True, False])
def test_second_pass_inputs_follow_the_formula(tokens, form, training):
    model = make_model(input_norm=form, gate_norm="shared" if form == "paper" else "own").train(training)
    with torch.no_grad():
        model.fusion.state_proj.weight.mul_(10)
    prefix = 4
    steps = list(model.iterate_passes(tokens, 2, plain_prefix=prefix))
    first = steps[0].hidden  # pass 1 is all plain
    e = model.embed.weight[tokens]
    T = e.shape[1]
    inputs = [formula_input(model, e[:, t], None if t < prefix else first[:, t - 1], feedback_pass=training)
              for t in range(T)]
    states, _ = stack_from_inputs(model, torch.stack(inputs, 1))
    torch.testing.assert_close(steps[1].hidden, states, rtol=0, atol=1e-12)
    # stack_inputs (the probes' entry, experiments/probes.py) agrees with the loop's pass 2.
    direct = model.stack_inputs(tokens, first, prefix)
    if form == "all":  # the stack normalises every input itself
        direct = model.input_norm(direct)
    torch.testing.assert_close(direct, torch.stack(inputs, 1), rtol=0, atol=1e-12)


def test_paper_form_normalises_plain_prefix_in_training_only(tokens):
    model = make_model(input_norm="paper", gate_norm="shared").train()
    e = model.embed.weight[tokens]
    first = next(model.iterate_passes(tokens, 1, plain_prefix=5)).hidden
    train_inputs = model.stack_inputs(tokens, first, 5)
    model.eval()
    eval_inputs = model.stack_inputs(tokens, first, 5)
    torch.testing.assert_close(eval_inputs[:, :5], e[:, :5], rtol=0, atol=0)  # raw at inference
    assert (train_inputs[:, :5] - e[:, :5]).abs().max() > 1e-3  # normalised in a training pass >= 2
    torch.testing.assert_close(train_inputs[:, 5:], eval_inputs[:, 5:], rtol=0, atol=0)  # fused: the same


@pytest.mark.parametrize("form", FORMS)
def test_default_gain_of_each_form(form):
    config = ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, input_norm=form)
    assert config.input_gain == (1.0 if form == "fused" else 0.02)
    model = FullBandwidthLM(config)
    norm = model.fusion.out_norm if form == "fused" else model.input_norm
    assert torch.all(norm.weight == config.input_gain)


@pytest.mark.parametrize(("value", "form"), [(True, "all"), (False, "fused"), ("true", "all"), ("false", "fused")])
def test_boolean_values_mean_the_old_forms(value, form):
    config = ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, input_norm=value)
    assert config.input_norm == form
    if form == "fused":
        assert config.input_gain == 1.0  # the old fused-only norm always started at 1


def test_unknown_form_names_the_choices():
    with pytest.raises(ConfigError, match=r"input_norm='both' is invalid: must be one of \('fused', 'paper', 'all'\)"):
        ModelConfig(input_norm="both")
