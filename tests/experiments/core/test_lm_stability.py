"""The stability recorder: what it records after pass k is what a k-pass forward gives."""

import numpy as np
import pytest
import torch
from conftest import make_model

from fullband.data import TokenSplit
from fullband.experiments.core.lm.stability import stability_curve
from fullband.model.recurrence import ntp_loss

SPLIT = TokenSplit(tokens=np.zeros(10, dtype=np.uint16), n_bytes=10, n_docs=1)


@torch.no_grad()
def test_pass_k_loss_and_state_change_match_direct_forwards():
    model = make_model()
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 61, (2, 10), generator=g), torch.randint(0, 61, (3, 10), generator=g)]
    n = 13  # past the window length: exact after 10 passes, so nothing moves from pass 11 on
    curve = stability_curve(model, batches, SPLIT, n)
    assert curve.passes == list(range(1, n + 1)) and curve.windows == 5 and curve.exact_after == 10
    for k in range(1, n + 1):
        outs = [model(x, passes=k, plain_prefix=1) for x in batches]
        expected = sum(float(ntp_loss(o.logits, x)) * x.shape[0] for o, x in zip(outs, batches, strict=True)) / 5
        assert curve.loss[k - 1] == pytest.approx(expected, rel=1e-10)
        assert curve.bits_per_byte[k - 1] == pytest.approx(expected / np.log(2))
        if k == 1:
            assert curve.delta_max[0] is None and curve.delta_mean[0] is None
            continue
        prev = [model(x, passes=k - 1, plain_prefix=1).hidden for x in batches]
        changes = torch.cat([(o.hidden - p)[:, 1:].norm(dim=-1).flatten() for o, p in zip(outs, prev, strict=True)])
        assert curve.delta_max[k - 1] == pytest.approx(float(changes.max()), rel=1e-9, abs=1e-15)
        assert curve.delta_mean[k - 1] == pytest.approx(float(changes.mean()), rel=1e-9, abs=1e-15)
    assert curve.delta_max[1] > 0
    assert curve.delta_max[10] == 0.0  # pass 11 repeats the exact pass 10
    exact = model.forward_exact(batches[0], plain_prefix=1)
    assert curve.loss[-1] == pytest.approx(  # and the loss there is the exact loss
        (float(ntp_loss(exact.logits, batches[0])) * 2
         + float(ntp_loss(model.forward_exact(batches[1], plain_prefix=1).logits, batches[1])) * 3) / 5, rel=1e-9)


def test_needs_a_feedback_model():
    with pytest.raises(ValueError, match="feedback"):
        stability_curve(make_model(feedback=False), [torch.zeros(1, 4, dtype=torch.long)], SPLIT, 3)
