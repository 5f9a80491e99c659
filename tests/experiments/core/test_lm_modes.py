"""Per-mode evaluation: one loop of passes gives what separate forwards give; exact mode is forward_exact."""

import numpy as np
import pytest
import torch
from conftest import make_model

from fullband.data import TokenSplit
from fullband.experiments.core.lm.passes import iterate_passes, token_nll_sum
from fullband.experiments.core.lm.perplexity import ExactSpec, evaluate_modes, exact_agreement
from fullband.model.recurrence import ntp_loss

SPLIT = TokenSplit(tokens=np.zeros(100, dtype=np.uint16), n_bytes=150, n_docs=1)  # 2/3 token per byte


@pytest.fixture
def batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 61, (3, 12), generator=g), torch.randint(0, 61, (2, 12), generator=g)]


@torch.no_grad()
def direct_loss(model, batches, **forward) -> float:
    """Mean next-token loss over all windows from the model's own forward."""
    total = count = 0.0
    for x in batches:
        out = model(x, **forward) if forward else model.forward_exact(x, plain_prefix=1)
        total += float(ntp_loss(out.logits, x)) * x.shape[0] * (x.shape[1] - 1)
        count += x.shape[0] * (x.shape[1] - 1)
    return total / count


def test_each_pass_of_the_loop_is_the_forward_with_that_many_passes(batches):
    model = make_model()
    x = batches[0]
    for step in iterate_passes(model, x, 6):
        out = model(x, passes=step.passes, plain_prefix=1)
        torch.testing.assert_close(step.logits, out.logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(step.hidden, out.hidden, rtol=0, atol=1e-12)
        assert (step.previous is None) == (step.passes == 1)


def test_fused_k_is_the_forward_with_k_plus_one_passes_and_fused_0_is_standard(batches):
    model = make_model()
    results = evaluate_modes(model, batches, SPLIT, fused_passes=(1, 2, 4), exact=None)
    assert set(results) == {"standard", "fused1", "fused2", "fused4"}
    assert results["standard"].loss == pytest.approx(direct_loss(model, batches, passes=1), rel=1e-10)
    for k in (1, 2, 4):
        assert results[f"fused{k}"].loss == pytest.approx(direct_loss(model, batches, passes=k + 1, plain_prefix=1),
                                                          rel=1e-10)
        assert results[f"fused{k}"].passes == k + 1
    assert results["fused1"].loss != pytest.approx(results["standard"].loss)  # the fusion does something
    # bits/byte = nats/token x tokens/byte / ln 2
    assert results["standard"].bits_per_byte == pytest.approx(results["standard"].loss * (100 / 150) / np.log(2))
    assert results["standard"].predicted_tokens == 5 * 11


@pytest.mark.parametrize("exact", [ExactSpec("sequential"), ExactSpec("jacobi", tol=None),
                                   ExactSpec("jacobi", tol=1e-10), ExactSpec("chunked", tol=None, chunk_size=5)])
def test_exact_mode_is_forward_exact(batches, exact):
    model = make_model()
    results = evaluate_modes(model, batches, SPLIT, fused_passes=(1,), exact=exact)
    assert results["exact"].loss == pytest.approx(direct_loss(model, batches), rel=1e-9)
    agreement = exact_agreement(model, batches[0], exact)
    assert agreement["max_loss_diff"] < 1e-9 and agreement["windows"] == 3


def test_a_baseline_is_scored_in_standard_mode_only(batches):
    model = make_model(feedback=False)
    results = evaluate_modes(model, batches, SPLIT, fused_passes=(1, 2), exact=ExactSpec())
    assert list(results) == ["standard"]
    assert results["standard"].loss == pytest.approx(direct_loss(model, batches, passes=1), rel=1e-10)
    assert len(list(iterate_passes(model, batches[0], 5))) == 1


def test_token_nll_sum_is_the_summed_cross_entropy(batches):
    model = make_model()
    x = batches[0]
    logits = model(x).logits.detach()
    assert token_nll_sum(logits, x) == pytest.approx(float(ntp_loss(logits, x)) * 3 * 11, rel=1e-12)
