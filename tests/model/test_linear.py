"""fullband's Linear: oneDNN for large float32 CPU inference layers, F.linear everywhere else."""

import pytest
import torch
import torch.nn.functional as F

from fullband import FullBandwidthLM, ModelConfig
from fullband.generation import generate
from fullband.model import linear
from fullband.model.linear import ONEDNN_MIN_WEIGHT, Linear, onednn_min_rows

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def onednn_on(monkeypatch):
    """oneDNN on from one row, whatever this machine's CPU vendor keeps for F.linear."""
    monkeypatch.setattr(linear, "_min_rows", 1)
    previous = linear.set_onednn(True)
    yield
    linear.set_onednn(previous)


def large_layer() -> Linear:
    torch.manual_seed(0)
    return Linear(512, 1024, bias=False)  # 2^19 entries: at the threshold with one thread or more


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 512), (8, 512), (3, 5, 512)])
def test_inference_matches_f_linear_to_float32_rounding(onednn_on, shape):
    layer = large_layer()
    assert layer.weight.numel() >= max(ONEDNN_MIN_WEIGHT.values())
    x = torch.randn(*shape)
    with torch.no_grad():
        got = layer(x)
    want = F.linear(x, layer.weight)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_small_layers_and_float64_use_f_linear_bit_for_bit(onednn_on):
    layer = large_layer()
    x = torch.randn(4, 512)
    assert torch.equal(layer(x), F.linear(x, layer.weight))  # gradients on: the training kernel, unchanged
    small = Linear(64, 64, bias=False)
    y = torch.randn(4, 64)
    with torch.no_grad():
        assert torch.equal(small(y), F.linear(y, small.weight))
        double = large_layer().double()
        z = torch.randn(4, 512, dtype=torch.float64)
        assert torch.equal(double(z), F.linear(z, double.weight))


def test_turning_it_off_gives_f_linear_exactly():
    layer = large_layer()
    x = torch.randn(8, 512)
    previous = linear.set_onednn(False)
    try:
        assert not linear.onednn_enabled()
        with torch.no_grad():
            assert torch.equal(layer(x), F.linear(x, layer.weight))
    finally:
        linear.set_onednn(previous)


@needs_onednn
def test_greedy_decoding_is_the_same_with_either_kernel(onednn_on):
    torch.manual_seed(0)
    model = FullBandwidthLM(ModelConfig(vocab_size=2048, d_model=256, n_layers=1, n_heads=4, max_seq_len=32)).eval()
    assert model.lm_head.weight.numel() >= max(ONEDNN_MIN_WEIGHT.values())  # the head goes through oneDNN
    prompts = torch.randint(0, 2048, (3, 6))
    with_onednn = generate(model, prompts, max_new_tokens=12, mode="soft")
    linear.set_onednn(False)
    assert torch.equal(generate(model, prompts, max_new_tokens=12, mode="soft"), with_onednn)


@needs_onednn
def test_intel_cpus_keep_f_linear_below_four_rows(onednn_on, monkeypatch):
    assert (onednn_min_rows("GenuineIntel"), onednn_min_rows("AuthenticAMD"), onednn_min_rows("")) == (4, 1, 1)
    calls = []

    def spy(x, weight, bias):
        calls.append(x.shape)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    monkeypatch.setattr(linear, "_onednn_linear", spy)
    layer = large_layer()
    for vendor, shape, through_onednn in [("GenuineIntel", (1, 512), False), ("GenuineIntel", (1, 3, 512), False),
                                          ("GenuineIntel", (2, 2, 512), True), ("AuthenticAMD", (1, 512), True)]:
        monkeypatch.setattr(linear, "_min_rows", onednn_min_rows(vendor))
        calls.clear()
        x = torch.randn(*shape)
        with torch.no_grad():
            got = layer(x)
        assert calls == ([x.shape] if through_onednn else []), (vendor, shape)
        if not through_onednn:
            assert torch.equal(got, F.linear(x, layer.weight))


def test_a_torch_without_the_kernel_falls_back_with_one_warning(onednn_on, monkeypatch):
    def missing(*args):
        raise RuntimeError("mkldnn::_linear_pointwise is not available")

    monkeypatch.setattr(linear, "_onednn", True)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", missing, raising=False)
    layer = large_layer()
    x = torch.randn(2, 512)
    with pytest.warns(UserWarning, match="oneDNN linear unavailable"), torch.no_grad():
        got = layer(x)
    assert torch.equal(got, F.linear(x, layer.weight)) and not linear.onednn_enabled()
