"""Sampling from logits: which tokens survive top-k and top-p, and what temperature does to the distribution.

Each test draws many tokens from one row of logits (repeated, one multinomial call) and compares the
frequencies with the distribution written out from the definition.
"""

import pytest
import torch
from conftest import make_model

from fullband.generation import generate
from fullband.generation.sampling import sample_next, token_probs

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
DRAWS = 200_000  # frequency standard error <= 0.0012; the tolerance below is 5 of those


def frequencies(probs: torch.Tensor, **options) -> torch.Tensor:
    logits = probs.log().expand(DRAWS, -1)
    tokens = sample_next(logits, generator=torch.Generator().manual_seed(0), **options)
    return torch.bincount(tokens, minlength=len(probs)).double() / DRAWS


def assert_distribution(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got[expected == 0].sum() == 0  # a filtered-out token is never drawn
    torch.testing.assert_close(got, expected, atol=6e-3, rtol=0)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    # A token survives while the tokens ranked above it hold less than top_p: the token that crosses top_p
    # stays, the rest go; the top token always stays.
    [(0.3, [0]), (0.6, [0, 1]), (0.85, [0, 1, 2]), (0.97, [0, 1, 2, 3]), (1e-9, [0])],
)
def test_top_p_keeps_the_smallest_head_reaching_p_and_renormalises(top_p, kept):
    expected = torch.zeros_like(PROBS)
    expected[kept] = PROBS[kept] / PROBS[kept].sum()
    assert_distribution(frequencies(PROBS, temperature=1.0, top_p=top_p), expected)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_raises_the_probabilities_to_one_over_t(temperature):
    expected = PROBS ** (1 / temperature)  # softmax(logits / T)
    assert_distribution(frequencies(PROBS, temperature=temperature), expected / expected.sum())


def test_top_k_then_top_p_after_temperature():
    # T = 0.5 squares the probabilities; top_k = 3 drops the last token, leaving (0.690, 0.248, 0.062) once
    # renormalised; top_p = 0.9 then keeps the first two (the third has 0.938 >= 0.9 ranked above it).
    sharp = PROBS[:3] ** 2
    sharp = sharp / sharp.sum()
    expected = torch.zeros_like(PROBS)
    expected[:2] = sharp[:2] / sharp[:2].sum()
    assert sharp[0] < 0.9 <= sharp[:2].sum()
    assert_distribution(frequencies(PROBS, temperature=0.5, top_k=3, top_p=0.9), expected)


@torch.no_grad()
def test_generate_passes_top_p_through():
    model = make_model()
    prompt, new = [5, 17, 3, 44, 8, 21], 8
    greedy = generate(model, prompt, new, mode="soft")
    # A tiny nucleus keeps only the most likely token at every step, whatever the temperature or the seed.
    for seed in range(3):
        assert generate(model, prompt, new, mode="soft", temperature=5.0, top_p=1e-9, seed=seed) == greedy
    hot = [generate(model, prompt, new, mode="soft", temperature=5.0, seed=seed) for seed in range(3)]
    assert any(h != greedy for h in hot)  # ... which plain sampling at that temperature is not


def test_a_top_p_below_float32_range_keeps_the_top_token():
    """1e-93 rounds to 0 against float32 probabilities; the top token must still stay (found by fuzzing the server)."""
    logits = torch.randn(3, 50)
    probs = token_probs(logits, 1.0, 0, 1e-93)
    assert not probs.isnan().any()
    assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.allclose(probs.max(-1).values, torch.ones(3))


@pytest.mark.parametrize("temperature", [0.0, 1e-320, 5e-324, 1e-40, 1.1e-38])
def test_a_temperature_below_float32s_smallest_normal_is_greedy_in_the_sampler(temperature):
    """One rule, in the sampler: such a temperature is the argmax, with no draw (no generator state used)."""
    from fullband.generation.sampling import GREEDY_BELOW, is_greedy

    assert is_greedy(temperature) and GREEDY_BELOW == 2.0**-126
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [3.0, -2.0, 0.5, 0.0]])
    generator = torch.Generator().manual_seed(0)
    assert sample_next(logits, temperature, generator=generator).tolist() == [1, 0]
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())


@pytest.mark.parametrize("temperature", [2.0**-126, 1e-30, 1e-5])
def test_the_smallest_temperatures_that_sample_give_the_argmax_distribution_not_nan(temperature):
    """Above the threshold the logits are shifted before the division, so nothing overflows: at a tiny
    temperature the distribution is the argmax's (ties shared), never NaN."""
    from fullband.generation.sampling import is_greedy

    assert not is_greedy(temperature)
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [40.0, -2.0, 40.0, 0.0]])
    probs = token_probs(logits, temperature)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0]]))
    assert sample_next(logits, temperature, generator=torch.Generator().manual_seed(0))[0] == 1


@torch.no_grad()
def test_a_tiny_temperature_decodes_like_temperature_0_through_generate():
    model = make_model(seed=1)
    prompt = [5, 17, 3, 44]
    assert generate(model, prompt, 12, "soft", temperature=1e-320) == generate(model, prompt, 12, "soft")
