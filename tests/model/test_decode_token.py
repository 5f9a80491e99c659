"""``decode_token``, the one-token decoding step without the general forward's checks and plan: bit for bit the
forward's numbers and cache in every input form, span and encoding, with or without padding, fused inference on or
off; and ``rotate``, the fused step's RoPE, equal to ``apply_rope`` bit for bit."""

import copy

import pytest
import torch

from fullband.generation.decoding import DecodeState, decode_step
from fullband.model import linear
from fullband.model.layers import apply_rope, rope_angles, rope_inv_freq, rotate

FORMS = {
    "default": {},
    "paper_form": dict(input_norm="paper", gate_norm="shared"),
    "all_inputs_normed": dict(input_norm="all"),
    "nope": dict(position_encoding="none"),
    "span_1_to_layer_1": dict(n_layers=3, feedback_target=1, feedback_source="layer:2"),
    "normed_source": dict(feedback_source="normed"),
    "baseline": dict(feedback=False),
}


def prefilled(model, padded: bool):
    """A cache after a plain prefill of two rows (the second left-padded by two when ``padded``), and the carried
    states."""
    tokens = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(tokens)
    if padded:
        mask[1, :2] = 0
    cache = model.new_cache(2, 12)
    with torch.no_grad():
        out = model(tokens, cache=cache, attention_mask=mask)
    return cache, out.hidden[:, -1]


@pytest.mark.parametrize("fused_inference", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
@pytest.mark.parametrize("form", FORMS)
def test_decode_token_is_the_forward_of_one_token(form, padded, fused_inference):
    from conftest import make_model

    model = make_model(**FORMS[form])
    with linear.fused_inference(fused_inference):
        for carries in (True, False):
            cache, carried = prefilled(model, padded)
            twin = copy.deepcopy(cache)
            state = carried if carries else None
            for token in (7, 11, 3):
                tokens = torch.full((2,), token)
                got = model.decode_token(tokens, cache, state)
                with torch.no_grad():
                    want = model(tokens[:, None], plain_prefix=twin.length, cache=twin, carried_state=state,
                                 attention_mask=torch.ones(2, 1, dtype=torch.long))
                torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=0)
                torch.testing.assert_close(got.hidden, want.hidden, rtol=0, atol=0)
                state = got.hidden[:, -1] if carries else None
            assert (cache.length, cache.valid.tolist(), cache.next_position.tolist()) == \
                (twin.length, twin.valid.tolist(), twin.next_position.tolist())
            torch.testing.assert_close(cache.keys, twin.keys, rtol=0, atol=0)
            torch.testing.assert_close(cache.values, twin.values, rtol=0, atol=0)


def test_decode_step_takes_the_general_forward_for_mixed_rows():
    """A batch whose rows differ (plain rows beside fused ones, as a server mixes them) keeps the general forward,
    which fuses row by row: its plain row decodes as the plain step would."""
    from conftest import make_model

    model = make_model()
    cache, carried = prefilled(model, padded=False)
    plain_twin = copy.deepcopy(cache)
    state = DecodeState(cache=cache, carried=carried, next_logits=torch.zeros(2, 61), prompt_len=5,
                        plain_rows=torch.tensor([False, True]))
    decode_step(model, state, torch.tensor([7, 7]))
    plain = model.decode_token(torch.tensor([7, 7]), plain_twin, None)
    torch.testing.assert_close(state.next_logits[1], plain.logits[1, -1], rtol=0, atol=0)
    assert not torch.allclose(state.next_logits[0], plain.logits[0, -1])  # the fused row did fuse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rotate_is_apply_rope_bit_for_bit(dtype):
    """The fused step's RoPE (x cos + roll(x) sin over the whole head) gives apply_rope's numbers exactly, on a
    strided view as the fused q/k slice is."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 10, 16, generator=generator, dtype=dtype).transpose(1, 2)[:, :6]  # (B, heads, T, hd)
    positions = torch.randint(0, 500, (3, 2), generator=generator)
    rope = rope_angles(positions, rope_inv_freq(16, 10000.0), dtype)
    assert torch.equal(rotate(x, rope), apply_rope(x, *rope))
