"""The looped control (``feedback_shift=0``, DESIGN.md §7): pass k feeds position t its own state from pass k-1,
and everything that needs the recurrence along the sequence refuses it."""

import pytest
import torch
from conftest import formula_input, make_model, stack_from_inputs

from fullband.config import ConfigError, ModelConfig
from fullband.generation import generate

TOL = 1e-9


@torch.no_grad()
@pytest.mark.parametrize("input_norm", [True, False])
def test_pass_k_fuses_the_same_positions_state_from_pass_k_minus_1(tokens, input_norm):
    looped = make_model(feedback_shift=0, input_norm=input_norm)
    emb = looped.embed.weight[tokens]
    plain_prefix = 3
    previous = looped(tokens, passes=1).hidden  # h^(1)
    for k in (2, 3, 4):
        inputs = torch.stack([formula_input(looped, emb[:, t], None if t < plain_prefix else previous[:, t])
                              for t in range(tokens.shape[1])], 1)  # u_t = fuse(e_t, h_t^(k-1)) past the prefix
        expected, _ = stack_from_inputs(looped, inputs)
        out = looped(tokens, passes=k, plain_prefix=plain_prefix)
        torch.testing.assert_close(out.hidden, expected, atol=TOL, rtol=0)
        previous = expected


@torch.no_grad()
def test_the_shift_is_the_only_difference(tokens):
    recurrent, looped = make_model(), make_model(feedback_shift=0)  # the same weights (same seed)
    assert recurrent.feedback_shift == 1 and looped.feedback_shift == 0
    torch.testing.assert_close(recurrent(tokens).hidden, looped(tokens).hidden, atol=0, rtol=0)  # pass 1: plain
    assert not torch.allclose(recurrent(tokens, passes=3).hidden, looped(tokens, passes=3).hidden)
    # Without the shift nothing moves along the sequence: the first position past the prefix is no longer exact
    # after two passes the way the recurrence's is (it reads its own state, not its plain predecessor's).
    exact = recurrent.forward_exact(tokens, 2).hidden
    assert (looped(tokens, passes=2, plain_prefix=2).hidden[:, 2] - exact[:, 2]).abs().max() > 1e-3


def test_looped_refuses_what_needs_the_recurrence(tokens):
    looped = make_model(feedback_shift=0)
    with pytest.raises(ValueError, match="looped model"):
        looped.forward_exact(tokens)
    with pytest.raises(ValueError, match="looped model"):
        looped(tokens, passes=2, cache=looped.new_cache(3, 20))
    with pytest.raises(ValueError, match="looped model"):
        looped(tokens[:, :1], carried_state=torch.zeros(3, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="mode='soft' is not available for a looped model"):
        generate(looped, tokens[0].tolist(), max_new_tokens=2, mode="soft")
    with pytest.raises(ValueError, match="speculative decoding is not available"):
        generate(looped, tokens[0].tolist(), max_new_tokens=2, mode="standard", speculative={"drafter": "standard"})
    with pytest.raises(ConfigError, match="feedback_shift=2 is invalid"):
        ModelConfig(feedback_shift=2)


@torch.no_grad()
def test_looped_decoding_reruns_the_k_pass_forward_over_the_whole_sequence(tokens):
    looped = make_model(feedback_shift=0)
    prompt = tokens[0, :6].tolist()
    for mode, passes in (("fused:3", 4), ("exact", None)):
        out = generate(looped, prompt, max_new_tokens=3, mode=mode)
        ids = list(prompt)
        for _ in range(3):  # greedy, by hand: the whole sequence, K passes, the last position's argmax
            k = passes or len(ids)
            ids.append(int(looped(torch.tensor([ids]), passes=k).logits[0, -1].argmax()))
        assert out == ids, mode
    # Left-padded rows decode as they do one by one; standard mode is the ordinary cached transformer.
    prompts = [tokens[0, :6].tolist(), tokens[1, :4].tolist()]
    batched = generate(looped, prompts, max_new_tokens=3, mode="fused:2")
    assert batched == [generate(looped, p, max_new_tokens=3, mode="fused:2") for p in prompts]
    assert generate(looped, prompt, max_new_tokens=3, mode="standard") == generate(make_model(),
        prompt, max_new_tokens=3, mode="standard")
