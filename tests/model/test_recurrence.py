"""The recurrence computed every way DESIGN.md §2 lists must agree (float64, tiny random models)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model, rms_norm, sequential_reference

from fullband import FullBandwidthLM
from fullband.model import exact_pass_count
from fullband.model.recurrence import auto_exact_method

TOL = 1e-9


def test_auto_exact_method_rule(model, tokens):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # only the device type is read
    assert auto_exact_method(cpu, None) == auto_exact_method(cpu, 1e-4) == "sequential"
    assert auto_exact_method(cuda, None) == "sequential"  # solved to exactness nothing beats it
    assert auto_exact_method(cuda, 1e-4) == "chunked"
    with pytest.raises(ValueError, match="method must be one of"):
        model.forward_exact(tokens, 1, method="fastest")


@torch.no_grad()
@pytest.mark.parametrize("plain_prefix", [1, 2, 5, 13])
def test_all_execution_modes_agree(model, tokens, plain_prefix):
    T = tokens.shape[1]
    reference, reference_logits = sequential_reference(model, tokens, plain_prefix)
    sequential = model.forward_exact(tokens, plain_prefix, method="sequential")
    auto = model.forward_exact(tokens, plain_prefix)  # the default: sequential on a CPU
    auto_tol = model.forward_exact(tokens, plain_prefix, method="auto", tol=1e-12)
    multipass = model(tokens, passes=T - plain_prefix + 1, plain_prefix=plain_prefix)
    jacobi = model.forward_exact(tokens, plain_prefix, method="jacobi")
    jacobi_tol = model.forward_exact(tokens, plain_prefix, method="jacobi", tol=1e-12)
    chunked = [model.forward_exact(tokens, plain_prefix, method="chunked", chunk_size=c) for c in (1, 2, 3, 5, T)]
    assert sequential.passes == auto.passes == auto_tol.passes == T
    assert jacobi.passes == T - plain_prefix + 1 == exact_pass_count(plain_prefix, T, 0, False)
    for out in [sequential, auto, auto_tol, multipass, jacobi, jacobi_tol, *chunked]:
        torch.testing.assert_close(out.hidden, reference, atol=TOL, rtol=0)
        torch.testing.assert_close(out.logits, reference_logits, atol=TOL, rtol=0)


@torch.no_grad()
def test_kv_cache_step_by_step_equals_sequential(model, tokens):
    plain_prefix = 4
    reference, _ = sequential_reference(model, tokens, plain_prefix)
    cache = model.new_cache(tokens.shape[0], tokens.shape[1])
    out = model(tokens[:, :plain_prefix], cache=cache)  # plain prefill of the prefix
    hidden = [out.hidden]
    for t in range(plain_prefix, tokens.shape[1]):
        out = model(tokens[:, t : t + 1], plain_prefix=plain_prefix, cache=cache, carried_state=hidden[-1][:, -1])
        hidden.append(out.hidden)
    torch.testing.assert_close(torch.cat(hidden, 1), reference, atol=TOL, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("plain_prefix", [1, 3])
def test_k_passes_exact_exactly_up_to_p_plus_k_minus_1(model, tokens, plain_prefix):
    reference = model.forward_exact(tokens, plain_prefix).hidden
    T = tokens.shape[1]
    for k in range(1, T - plain_prefix + 1):
        hidden = model(tokens, passes=k, plain_prefix=plain_prefix).hidden
        error = (hidden - reference).abs().amax(dim=(0, 2))  # per position
        exact_upto = plain_prefix + k - 1  # 1-indexed
        assert error[:exact_upto].max() <= TOL, (k, error)
        # The next position was fed a not-yet-exact state: with random fusion weights it is far off.
        assert error[exact_upto] > 1e-3, (k, error)


@torch.no_grad()
def test_per_row_plain_prefix_equals_rows_one_by_one(model, tokens):
    prefixes = torch.tensor([1, 4, 9])
    batched = model(tokens, passes=3, plain_prefix=prefixes)
    for row, p in enumerate(prefixes.tolist()):
        single = model(tokens[row : row + 1], passes=3, plain_prefix=p)
        torch.testing.assert_close(batched.hidden[row], single.hidden[0], atol=TOL, rtol=0)


@torch.no_grad()
def test_left_padding_does_not_change_real_positions(model, tokens):
    pad = 3
    padded = torch.cat((torch.zeros(1, pad, dtype=torch.long), tokens[:1]), 1)
    mask = torch.cat((torch.zeros(1, pad, dtype=torch.long), torch.ones_like(tokens[:1])), 1)
    out = model(padded, passes=4, plain_prefix=pad + 1, attention_mask=mask)
    ref = model(tokens[:1], passes=4, plain_prefix=1)
    torch.testing.assert_close(out.hidden[:, pad:], ref.hidden, atol=TOL, rtol=0)
    exact = model.forward_exact(padded, torch.tensor([pad + 1]), method="chunked", chunk_size=4, attention_mask=mask)
    torch.testing.assert_close(exact.hidden[:, pad:], model.forward_exact(tokens[:1], 1).hidden, atol=TOL, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("source", ["normed", "layer:1"])
def test_other_feedback_sources_agree_across_modes(tokens, source):
    model = make_model(feedback_source=source)
    reference, _ = sequential_reference(model, tokens, 2)
    for out in (model.forward_exact(tokens, 2), model(tokens, passes=12, plain_prefix=2),
                model.forward_exact(tokens, 2, method="chunked", chunk_size=4)):
        torch.testing.assert_close(out.hidden, reference, atol=TOL, rtol=0)


@torch.no_grad()
def test_jacobi_tolerance_stops_early_and_reports_passes(model, tokens):
    loose = model.forward_exact(tokens, 1, method="jacobi", tol=1e6)
    change = (model(tokens, passes=2).hidden - model(tokens, passes=1).hidden).abs().max()
    assert loose.passes == 2 and loose.delta == change > 0  # max |h^(2) - h^(1)|, the change that stopped it


def test_float32_modes_agree_closely(tokens):
    model = make_model(dtype=torch.float32)
    with torch.no_grad():
        seq = model.forward_exact(tokens, 2)
        multi = model(tokens, passes=12, plain_prefix=2)
    torch.testing.assert_close(multi.logits, seq.logits, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- baseline (feedback=False)


def standard_transformer_reference(model: FullBandwidthLM, tokens: torch.Tensor) -> torch.Tensor:
    """A from-scratch pre-norm Llama-style forward (explicit softmax attention) with the model's weights; queries
    and keys rotated (RoPE) unless the config says position_encoding="none" (NoPE: causal mask only)."""
    cfg = model.config
    B, T = tokens.shape
    H, Hkv, hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim

    def rms(x, w):
        return rms_norm(x, w, cfg.norm_eps)

    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.arange(T).float()[:, None] * inv
    cos, sin = ang.cos().double(), ang.sin().double()

    def rope(x):  # (B, H, T, hd)
        if cfg.position_encoding == "none":
            return x
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)

    x = model.embed.weight[tokens]
    if cfg.input_norm == "all":
        x = rms(x, model.input_norm.weight)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for block in model.blocks:
        a = block.attn
        y = rms(x, block.attn_norm.weight)
        q = rope((y @ a.q_proj.weight.T).view(B, T, H, hd).transpose(1, 2))
        k = rope((y @ a.k_proj.weight.T).view(B, T, Hkv, hd).transpose(1, 2)).repeat_interleave(H // Hkv, 1)
        v = (y @ a.v_proj.weight.T).view(B, T, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, 1)
        scores = (q @ k.transpose(-1, -2) / hd**0.5).masked_fill(~causal, float("-inf"))
        x = x + (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1) @ a.o_proj.weight.T
        y = rms(x, block.mlp_norm.weight)
        m = block.mlp
        x = x + (F.silu(y @ m.gate_proj.weight.T) * (y @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    return rms(x, model.norm.weight) @ model.embed.weight.T


@torch.no_grad()
@pytest.mark.parametrize("position_encoding", ["rope", "none"])
def test_baseline_has_no_fusion_and_ignores_passes(tokens, position_encoding):
    model = make_model(feedback=False, position_encoding=position_encoding)
    assert model.fusion is None
    assert not any("fusion" in name for name in model.state_dict())
    one = model(tokens, passes=1)
    for passes in (2, 5):
        torch.testing.assert_close(model(tokens, passes=passes, plain_prefix=1).logits, one.logits, atol=0, rtol=0)
    torch.testing.assert_close(model.forward_exact(tokens).logits, one.logits, atol=TOL, rtol=0)
    torch.testing.assert_close(one.logits, standard_transformer_reference(model, tokens), atol=TOL, rtol=0)


@torch.no_grad()
def test_feedback_model_single_pass_is_the_standard_transformer(model, tokens):
    torch.testing.assert_close(model(tokens).logits, standard_transformer_reference(model, tokens), atol=TOL, rtol=0)


@torch.no_grad()
def test_nope_attention_sees_earlier_tokens_as_a_set(tokens):
    """Without a positional encoding, one block's keys and values at a position are functions of that token alone,
    so the last position attends to the earlier tokens as a set: permuting them leaves its logits unchanged. With
    RoPE the scores depend on the distance between positions, so the same permutation changes them. The earlier
    positions' logits change under NoPE too: each sees another causal prefix, which is how position stays inferable."""
    T = tokens.shape[1]
    order = torch.randperm(T - 1, generator=torch.Generator().manual_seed(4))
    shuffled = torch.cat((tokens[:, :-1][:, order], tokens[:, -1:]), 1)
    assert not torch.equal(shuffled, tokens)
    last, earlier = {}, {}
    for encoding in ("none", "rope"):
        model = make_model(feedback=False, n_layers=1, init_std=0.3, position_encoding=encoding)
        change = (model(shuffled).logits - model(tokens).logits).abs()
        last[encoding], earlier[encoding] = change[:, -1].max(), change[:, :-1].max()
    assert last["none"] < 1e-12
    assert last["rope"] > 1e-3
    assert earlier["none"] > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("feedback", [False, True])
def test_nope_stack_ignores_the_positions_it_is_given(tokens, feedback):
    """The stack reads no position with NoPE: other positions give the same states, while RoPE's change. The
    positions are spread as well as shifted, since RoPE sees only distances and a shift alone would not move it."""
    B, T = tokens.shape
    positions = torch.arange(T).expand(B, T)
    for encoding in ("none", "rope"):
        model = make_model(feedback=feedback, position_encoding=encoding)
        inputs = model.embed(tokens)
        at_zero = model.run_stack(inputs, positions)[1]
        shifted = model.run_stack(inputs, 3 * positions + 17)[1]
        if encoding == "none":
            torch.testing.assert_close(shifted, at_zero, atol=0, rtol=0)
        else:
            assert (shifted - at_zero).abs().max() > 1e-6


# ---------------------------------------------------------------- plans


@torch.no_grad()
def test_a_prefix_per_pass_applies_each_row_of_prefixes_to_its_own_pass(model, tokens):
    # Pass 1 is plain whatever the prefix, so a 2-pass forward depends only on the second row.
    first, second = torch.tensor([1, 5, 9]), torch.tensor([3, 2, 7])
    per_pass = model(tokens, passes=2, plain_prefix=torch.stack([first, second]))
    torch.testing.assert_close(per_pass.hidden, model(tokens, passes=2, plain_prefix=second).hidden, atol=0, rtol=0)
    three = model(tokens, passes=3, plain_prefix=torch.stack([first, second, first]))
    assert not torch.allclose(three.hidden, model(tokens, passes=3, plain_prefix=first).hidden)
    assert not torch.allclose(three.hidden, model(tokens, passes=3, plain_prefix=second).hidden)
