"""fullband's Linear: oneDNN for large float32 CPU inference layers, F.linear everywhere else."""

import pytest
import torch
import torch.nn.functional as F

from fullband import FullBandwidthLM, ModelConfig
from fullband.generation import generate
from fullband.model import linear
from fullband.model.linear import ONEDNN_MIN_WEIGHT, Linear, onednn_min_rows
from fullband.training import MultiPassObjective

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


# ---------------------------------------------------------------- fused products of one input (decoding steps)


@pytest.fixture
def fused_on():
    with linear.fused_inference(True):
        yield


def decode_logits(model, tokens, steps: int = 6):
    """The logits and carried states of ``steps`` one-token decoding steps after a plain prefill of ``tokens``."""
    cache = model.new_cache(tokens.shape[0], tokens.shape[1] + steps)
    with torch.no_grad():
        out = model(tokens, cache=cache)
        logits, carried = [out.logits[:, -1]], out.hidden[:, -1]
        for t in range(steps):
            step = torch.full((tokens.shape[0], 1), t + 3)
            out = model(step, plain_prefix=tokens.shape[1], cache=cache, carried_state=carried)
            logits.append(out.logits[:, -1])
            carried = out.hidden[:, -1]
    return torch.stack(logits, 1), carried


@pytest.mark.parametrize("position_encoding", ["rope", "none"])
def test_fused_inference_decodes_the_same_numbers(fused_on, position_encoding):
    """A decoding step runs q/k/v and gate/up as one product each (and one mask, one RMSNorm op): float64 logits
    and carried states within 1e-12 of the unfused step's, the same greedy tokens in every mode; a forward of more
    rows, or with gradients, never fuses."""
    from conftest import make_model

    model = make_model(n_kv_heads=2, position_encoding=position_encoding)
    tokens = torch.randint(0, 61, (3, 5), generator=torch.Generator().manual_seed(2))
    fused = decode_logits(model, tokens)
    held = {name: linear._FUSED[m][1] for name, m in model.named_modules() if m in linear._FUSED}
    c = model.config
    assert {name: tuple(w.shape) for name, w in held.items()} == {  # q|k|v and gate|up of every block
        **{f"blocks.{i}.attn": ((c.n_heads + 2 * c.kv_heads) * c.head_dim, c.d_model) for i in range(c.n_layers)},
        **{f"blocks.{i}.mlp": (2 * c.ffn_dim, c.d_model) for i in range(c.n_layers)}}
    decode_logits(model, tokens)
    assert all(linear._FUSED[model.get_submodule(name)][1] is w for name, w in held.items())  # kept, not rebuilt
    linear.set_fused_inference(False)
    unfused = decode_logits(model, tokens)
    for a, b in zip(fused, unfused, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for mode in ("standard", "soft", "fused:2", "exact"):
        off = generate(model, tokens, max_new_tokens=8, mode=mode)
        linear.set_fused_inference(True)
        assert torch.equal(generate(model, tokens, max_new_tokens=8, mode=mode), off), mode
        linear.set_fused_inference(False)
    linear.set_fused_inference(True)
    x = torch.randn(17, 1, model.config.d_model, dtype=torch.float64)  # more rows than FUSE_MAX_ROWS
    y = torch.randn(2, 1, model.config.d_model, dtype=torch.float64)
    with torch.no_grad():
        assert not linear.fuses(x) and linear.fuses(y)
    assert not linear.fuses(y)  # gradients on


def test_the_fused_weight_follows_the_weights(fused_on):
    """Changed in place (an optimizer step, a load), replaced (a new submodule, .to) or released: the next step uses
    the weights the parameters hold now."""
    from conftest import make_model

    model = make_model()
    tokens = torch.randint(0, 61, (2, 4), generator=torch.Generator().manual_seed(3))

    def unfused():
        with linear.fused_inference(False):
            return decode_logits(model, tokens)[0]

    before = decode_logits(model, tokens)[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    MultiPassObjective()(model, tokens, tokens, 1).loss.backward()
    optimizer.step()  # in place: the version counters move
    after = decode_logits(model, tokens)[0]
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, unfused(), rtol=0, atol=1e-12)
    model.load_state_dict(make_model(seed=4).state_dict())  # copied in place too
    torch.testing.assert_close(decode_logits(model, tokens)[0], unfused(), rtol=0, atol=1e-12)
    replaced = Linear(model.config.d_model, model.blocks[0].attn.q_proj.out_features, bias=False).double()
    model.blocks[0].attn.q_proj = replaced  # a submodule replaced: its weight is read from the module tables
    torch.testing.assert_close(decode_logits(model, tokens)[0], unfused(), rtol=0, atol=1e-12)
    model.float()  # new storages
    torch.testing.assert_close(decode_logits(model, tokens)[0], unfused(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.data.mul_(0.5)  # through .data: no check sees it
    linear.release_fused_weights(model)
    torch.testing.assert_close(decode_logits(model, tokens)[0], unfused(), rtol=1e-5, atol=1e-6)
    assert not any("fused" in name for name in model.state_dict())  # the parameters and checkpoints are as before


# ---------------------------------------------------------------- packed weights (fused steps of several rows)


@pytest.fixture
def packing_on():
    previous = linear.set_packed_weights(True)
    yield
    linear.set_packed_weights(previous)


def onednn_sized_model() -> FullBandwidthLM:
    """float32, every product (q|k|v, o, gate|up, down, the head) at or above oneDNN's threshold with one thread."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=1024, d_model=768, n_layers=1, n_heads=6, max_seq_len=32)
    model = FullBandwidthLM(config).eval()
    assert min(p.numel() for p in model.parameters() if p.dim() == 2) >= max(ONEDNN_MIN_WEIGHT.values())
    return model


@needs_onednn
def test_steps_of_several_rows_multiply_packed_weights_to_the_same_numbers(onednn_on, fused_on, packing_on):
    """From PACK_MIN_ROWS rows a fused step reads every block weight and the head in oneDNN's packed layout (kept,
    like the concatenations, and packed again when a weight changes); the logits are the plain layout's to float32
    rounding (bit for bit on the AMD EPYC measured) and the greedy tokens the same. One row keeps the plain layout
    (a prefill of up to FUSE_MAX_ROWS tokens is a fused step of that many rows)."""
    model = onednn_sized_model()
    tokens = torch.randint(0, 1024, (linear.PACK_ROWS, 4), generator=torch.Generator().manual_seed(5))

    def both():
        packed = decode_logits(model, tokens, steps=3), generate(model, tokens, max_new_tokens=3, mode="soft")
        with_plain = linear.set_packed_weights(False)
        plain = decode_logits(model, tokens, steps=3), generate(model, tokens, max_new_tokens=3, mode="soft")
        linear.set_packed_weights(with_plain)
        for a, b in zip(packed[0], plain[0], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert torch.equal(packed[1], plain[1])

    generate(model, tokens[:1, :1], max_new_tokens=2, mode="soft")
    assert not any(m in linear._PACKED for m in model.modules())  # one row at a time: the plain layout
    both()
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    assert set(linear._PACKED[attn]) == {("q_proj", "k_proj", "v_proj"), ("o_proj",)}
    assert set(linear._PACKED[mlp]) == {("gate_proj", "up_proj"), ("down_proj",)}
    assert set(linear._PACKED[model]) == {("lm_head",)}  # the head of decode_token
    held = linear._PACKED[mlp][("down_proj",)][1]
    with torch.no_grad():
        mlp.down_proj.weight.mul_(0.5)  # in place: its version counter moves
    both()
    assert linear._PACKED[mlp][("down_proj",)][1] is not held
    # Kept against the parameters, not the concatenation: one-row steps rebuild q|k|v after each change (a freed
    # concatenation's address can come back) and pack nothing; the next step of several rows packs the weights now.
    for _ in range(2):
        with torch.no_grad():
            attn.q_proj.weight.mul_(0.9)
        generate(model, tokens[:1, :1], max_new_tokens=1, mode="soft")
    both()
    linear.release_fused_weights(model)
    assert not any(m in linear._PACKED for m in model.modules())


@needs_onednn
def test_a_torch_without_packed_weights_falls_back_with_one_warning(onednn_on, fused_on, packing_on, monkeypatch):
    def missing(*args):
        raise RuntimeError("mkldnn::_reorder_linear_weight is not available")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing, raising=False)
    model = onednn_sized_model()
    x = torch.randn(linear.PACK_ROWS, 1, 768)
    with pytest.warns(UserWarning, match="packed weights unavailable"), torch.no_grad():
        got = linear.product(x, model.blocks[0].attn, ("o_proj",))
    with torch.no_grad():
        assert torch.equal(got, linear.linear(x, model.blocks[0].attn.o_proj.weight))
    assert not linear._packing


@needs_onednn
@pytest.mark.parametrize("rows", [1, 8])
def test_a_traced_decoding_product_streams_one_row_and_keeps_onednn_for_several(onednn_on, fused_on, rows):
    """Under torch.compile (the compiled decode step) a CPU product of one row is a reduction inductor makes one
    kernel of (no matrix-multiply call in the generated code), several rows stay oneDNN's opaque kernel; both are
    F.linear's numbers to float32 rounding. With gradients (training) inductor gets F.linear."""
    from torch._inductor.utils import run_and_get_code

    layer = large_layer()
    x = torch.randn(rows, 1, 512)
    torch._dynamo.reset()
    with torch.no_grad():
        got, code = run_and_get_code(torch.compile(layer, fullgraph=True), x)
    torch.testing.assert_close(got, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    code = "\n".join(code)
    if rows == 1:
        assert "_linear_pointwise" not in code and "extern_kernels.mm" not in code and "addmm" not in code
    else:
        assert "onednn_product" in code
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(layer, fullgraph=True), x.requires_grad_())
    assert "onednn_product" not in "\n".join(code)
