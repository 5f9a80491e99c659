"""Speculative decoding (DESIGN.md §4) changes nothing but the speed.

Greedy: token for token the output of plain decoding in the same mode, for every drafter and several draft lengths,
batched with left padding and stops, and the KV cache and carried state afterwards equal plain decoding's. Sampling:
the rejection rule turns drafts from q into draws from p, and the sequences speculative sampling produces follow
the distribution of plain sampling, written out by enumerating every continuation of a tiny vocabulary.
All in float64 on tiny random models whose fusion weights are non-trivial (soft decoding differs from standard).
"""

import itertools

import pytest
import torch
from conftest import make_model
from scipy.stats import chisquare

from fullband.generation import SpeculativeConfig, SpeculativeDecoder, decode_step, generate, left_pad, prefill, stream
from fullband.generation.sampling import token_probs
from fullband.modes import DecodeOptions

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

PROMPT = [5, 17, 3, 44, 8, 21]
NEW = 24
MODES = ["standard", "soft", "fused:2", "exact"]


@pytest.fixture(scope="module")
def target():
    # Untied head: with tied embeddings a random model's greedy choice is mostly "repeat the last token".
    return make_model(tie_embeddings=False)


class ScriptedDrafter:
    """Proposes plain decoding's own tokens, known in advance, with every 4th one wrong: long accepted runs and
    rejections at known places, so verification runs many Jacobi passes and has to stop at the first wrong draft.
    (The real drafters on a random model agree with the fed-back target almost never.)"""

    def __init__(self, reference: torch.Tensor, prompt_len: int, vocab_size: int) -> None:
        self.reference, self.prompt_len, self.vocab_size = reference, prompt_len, vocab_size  # reference (B, NEW)

    def start(self, ids, mask, max_len):
        pass

    def propose(self, seq, gamma, sample):
        at = seq.shape[1] - self.prompt_len  # tokens generated so far, the pending one included
        drafts = self.reference[:, at : at + gamma].clone()
        wrong = torch.arange(at, at + gamma) % 4 == 3
        drafts[:, wrong] = (drafts[:, wrong] + 1) % self.vocab_size
        return drafts, None

    def rollback(self, kept):
        pass


@pytest.fixture(scope="module")
def drafters(target):
    """The three kinds: the target without feedback, its first block, and a small baseline sharing the vocab."""
    small = make_model(seed=3, feedback=False, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, tie_embeddings=False)
    return {"standard": "standard", "early_exit": "early_exit:1", "baseline": small, "scripted": None}


def reference_tokens(model, ids, mask, mode, new, **kwargs):
    """Plain decoding's tokens (B, new), padded with 0 after every row stopped."""
    steps = torch.stack(list(stream(model, ids, new, mode, attention_mask=mask, **kwargs)), 1)
    return torch.nn.functional.pad(steps, (0, new - steps.shape[1]))


def decoder_for(model, ids, mask, mode, new, drafter, gamma, **kwargs):
    if drafter is None:
        scripted = ScriptedDrafter(reference_tokens(model, ids, mask, mode, new, **kwargs), ids.shape[1],
                                   model.config.vocab_size)
        return SpeculativeDecoder(model, SpeculativeConfig(gamma=gamma), drafter=scripted)
    return SpeculativeDecoder(model, SpeculativeConfig(drafter, gamma))


def plain_state(model, ids, mask, mode, new):
    """Plain greedy decoding of ``new`` tokens as ``stream`` runs it: (tokens (B, new), the state at the end)."""
    state = prefill(model, ids, mask, mode, ids.shape[1] + new)
    tokens = []
    for step in range(new):
        tokens.append(state.next_logits.argmax(-1))
        if step < new - 1:
            decode_step(model, state, tokens[-1])
    return torch.stack(tokens, 1), state


def speculative_state(model, ids, mask, mode, new, drafter, gamma):
    state = prefill(model, ids, mask, mode, ids.shape[1] + new)
    decoder = decoder_for(model, ids, mask, mode, new, drafter, gamma)
    tokens = torch.stack(list(decoder.stream(state, ids, mask, new)), 1)
    return tokens, state, decoder.stats


@torch.no_grad()
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter", ["standard", "early_exit", "baseline", "scripted"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_equals_plain_decoding(target, drafters, mode, drafter, gamma):
    ids = torch.tensor([PROMPT])
    expected = reference_tokens(target, ids, torch.ones_like(ids), mode, NEW)
    tokens, _, stats = speculative_state(target, ids, torch.ones_like(ids), mode, NEW, drafters[drafter], gamma)
    assert torch.equal(tokens, expected)
    if drafter == "scripted":  # long accepted runs and rejections
        assert 0 < stats.accepted < stats.drafted
    if drafter != "scripted" and gamma == 3:  # the generate() entry point runs the same
        config = SpeculativeConfig(drafter=drafters[drafter], gamma=gamma)
        assert generate(target, PROMPT, NEW, mode=mode, speculative=config) == \
            PROMPT + expected[0].tolist()


@torch.no_grad()
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter", ["scripted", "baseline", "standard"])
def test_cache_and_carried_state_equal_plain_decoding(target, drafters, mode, drafter):
    ids = torch.tensor([PROMPT, [0, 0, 0, 9, 1, 40]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    tokens, plain = plain_state(target, ids, mask, mode, NEW)
    spec_tokens, spec, _ = speculative_state(target, ids, mask, mode, NEW, drafters[drafter], 5)
    assert torch.equal(spec_tokens, tokens)
    assert spec.cache.length == plain.cache.length == ids.shape[1] + NEW - 1
    n = plain.cache.length
    assert torch.equal(spec.cache.valid, plain.cache.valid)
    assert torch.equal(spec.cache.next_position, plain.cache.next_position)
    for name in ("keys", "values"):
        torch.testing.assert_close(getattr(spec.cache, name)[..., :n, :], getattr(plain.cache, name)[..., :n, :],
                                   rtol=0, atol=1e-12)
    torch.testing.assert_close(spec.next_logits, plain.next_logits, rtol=0, atol=1e-12)
    if mode == "standard":
        assert spec.carried is None and plain.carried is None
    else:
        torch.testing.assert_close(spec.carried, plain.carried, rtol=0, atol=1e-12)


@torch.no_grad()
@pytest.mark.parametrize("mode", ["soft", "standard"])
def test_feedback_verification_needs_one_pass_per_kept_token(target, mode):
    """Pass k makes block position k-1 exact: a round that keeps a drafts and proves the next token ran a + 1
    passes (a fully accepted block keeps its last draft as the next pending token), never more than gamma;
    without feedback one pass verifies the whole block."""
    ids = torch.tensor([PROMPT])
    _, _, stats = speculative_state(target, ids, torch.ones_like(ids), mode, NEW, None, 6)
    assert any(passes > 2 for _, _, passes in stats.per_round) or mode == "standard"
    for drafted, accepted, passes in stats.per_round:
        if mode == "standard":
            assert passes == 1
        else:
            full = accepted == drafted > 0
            assert passes == (drafted if full else accepted + 1) <= max(drafted, 1)
    if mode == "soft":
        assert stats.passes == stats.emitted  # as many sequential passes as plain decoding has steps


@torch.no_grad()
@pytest.mark.parametrize("mode", MODES)
def test_batched_with_left_padding_and_stops(target, drafters, mode):
    prompts = [PROMPT, [9, 1], [33, 2, 60, 7, 12, 13, 14, 15, 40], [4]]
    ids, mask = left_pad(prompts)
    plain = generate(target, prompts, NEW, mode=mode)
    stop = plain[0][len(PROMPT) + 5]  # stops a row early, the others later or never
    expected = generate(target, prompts, NEW, mode=mode, stop_token_ids=[stop])
    assert any(len(row) < len(p) + NEW for row, p in zip(expected, prompts, strict=True))
    for drafter, gamma in (("baseline", 4), ("standard", 2), ("early_exit", 6), ("scripted", 5)):
        state = prefill(target, ids, mask, mode, ids.shape[1] + NEW)
        decoder = decoder_for(target, ids, mask, mode, NEW, drafters[drafter], gamma, stop_token_ids=[stop])
        steps = torch.stack(list(decoder.stream(state, ids, mask, NEW, stop_token_ids=[stop])), 1)
        plain_steps = list(stream(target, ids, NEW, mode, attention_mask=mask, stop_token_ids=[stop]))
        assert torch.equal(steps, torch.stack(plain_steps, 1)), drafter  # the same steps, pads included
        got = generate(target, prompts, NEW, mode=mode, stop_token_ids=[stop],
                              speculative=SpeculativeConfig(drafters[drafter] or "standard", gamma))
        assert got == expected, drafter
    single = [generate(target, p, NEW, mode=mode, stop_token_ids=[stop],
                              speculative=SpeculativeConfig(drafters["baseline"], 4)) for p in prompts]
    assert single == expected


@torch.no_grad()
def test_adaptive_gamma_and_tensor_prompts(target):
    prompt = torch.tensor([PROMPT, PROMPT[::-1]])
    mask = torch.ones_like(prompt)
    expected = reference_tokens(target, prompt, mask, "soft", NEW)
    state = prefill(target, prompt, mask, "soft", prompt.shape[1] + NEW)
    scripted = ScriptedDrafter(expected, prompt.shape[1], target.config.vocab_size)
    decoder = SpeculativeDecoder(target, SpeculativeConfig(gamma=2, adaptive=True, max_gamma=6), drafter=scripted)
    assert torch.equal(torch.stack(list(decoder.stream(state, prompt, mask, NEW)), 1), expected)
    assert len({drafted for drafted, _, _ in decoder.stats.per_round}) > 2  # gamma moved both ways
    got = generate(target, prompt, NEW, mode="soft", speculative={"drafter": "standard", "adaptive": True})
    assert torch.equal(got, torch.cat((prompt, expected), 1))


# ------------------------------------------------------------------------------------------------------ sampling


def test_rejection_rule_turns_draws_from_q_into_draws_from_p():
    """One verification step on 200k independent rows: accept d ~ q with probability min(1, p(d)/q(d)), else draw
    from norm(max(0, p - q)); the kept token must follow p (target logits at temperature 0.7, top-k 3)."""
    draws = 200_000
    generator = torch.Generator().manual_seed(0)
    target_logits = torch.tensor([[2.0, 1.2, 0.3, -0.5, 0.9]], dtype=torch.float64).expand(draws, -1)
    q = torch.tensor([0.1, 0.5, 0.1, 0.2, 0.1]).expand(draws, -1)
    drafts = torch.multinomial(q, 1, generator=generator)  # (draws, 1)
    decoder = SpeculativeDecoder(make_model(vocab_size=5), SpeculativeConfig(), DecodeOptions(temperature=0.7, top_k=3),
                                 generator=generator)
    uniform = torch.rand(draws, 1, generator=generator, dtype=torch.float64)
    accepted = decoder._accepts(target_logits[:, None], drafts, q[:, None], uniform, torch.arange(1))[:, 0]
    kept = decoder._next_token(target_logits, drafts, q[:, None], accepted.long(), 0, 1)
    p = token_probs(target_logits[:1], 0.7, top_k=3)[0].double()
    frequencies = torch.bincount(kept, minlength=5).double() / draws
    assert frequencies[p == 0].sum() == 0
    torch.testing.assert_close(frequencies, p, atol=6e-3, rtol=0)  # 5 standard errors
    assert 0.2 < accepted.double().mean() < 0.9  # both branches ran


def sequence_distribution(model, prompt, new, mode, temperature):
    """P(x_1..x_new | prompt) of plain sampling for every continuation, from teacher-forced plain decoding."""
    vocab = model.config.vocab_size
    continuations = torch.tensor(list(itertools.product(range(vocab), repeat=new)))  # (V^new, new)
    ids = torch.tensor([prompt]).expand(len(continuations), -1)
    state = prefill(model, ids, torch.ones_like(ids), mode, len(prompt) + new)
    log_prob = torch.zeros(len(continuations), dtype=torch.float64)
    for step in range(new):
        probs = token_probs(state.next_logits, temperature).double()
        log_prob += probs.gather(1, continuations[:, step : step + 1]).squeeze(1).log()
        if step < new - 1:
            decode_step(model, state, continuations[:, step])
    return continuations, log_prob.exp()


@torch.no_grad()
@pytest.mark.parametrize("mode", ["soft", pytest.param("standard", marks=pytest.mark.slow)])
def test_speculative_sampling_follows_plain_sampling(mode):
    """4 tokens from a 3-token vocabulary (81 sequences), 2 rows x 1,000 calls drafted 2 at a time: the chi-square
    of the speculative samples against the enumerated distribution of plain sampling. The drafter's distribution
    differs from the target's (the target without feedback in soft mode, a small baseline in standard mode)."""
    vocab, prompt, new, rows, calls, temperature = 3, [1, 2], 4, 2, 500, 1.0
    target = make_model(vocab_size=vocab, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, init_std=0.3)
    small = make_model(seed=5, vocab_size=vocab, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, feedback=False,
                       init_std=0.3)
    drafter = "standard" if mode == "soft" else small
    continuations, expected = sequence_distribution(target, prompt, new, mode, temperature)
    assert abs(float(expected.sum()) - 1) < 1e-5  # token_probs works in float32
    generator = torch.Generator().manual_seed(0)
    ids = torch.tensor([prompt] * rows)
    mask = torch.ones_like(ids)
    counts = torch.zeros(len(continuations), dtype=torch.float64)
    accepted = drafted = 0
    for _ in range(calls):
        state = prefill(target, ids, mask, mode, len(prompt) + new)
        decoder = SpeculativeDecoder(target, SpeculativeConfig(drafter, gamma=2),
                                     DecodeOptions(temperature=temperature), generator=generator)
        out = torch.stack(list(decoder.stream(state, ids, mask, new)), 1)  # (rows, new)
        index = (out * vocab ** torch.arange(new - 1, -1, -1)).sum(1)  # the row of itertools.product's order
        counts += torch.bincount(index, minlength=len(continuations)).double()
        accepted, drafted = accepted + decoder.stats.accepted, drafted + decoder.stats.drafted
    assert 0.1 < accepted / drafted < 0.9  # drafts are kept (several per round) and rejected
    # Pool the sequences expected fewer than 5 times into one cell, as the chi-square approximation needs.
    n = rows * calls
    big = expected * n >= 5
    observed = torch.cat((counts[big], counts[~big].sum()[None]))
    wanted = torch.cat((expected[big], expected[~big].sum()[None])) * n
    wanted = wanted * observed.sum() / wanted.sum()  # the float32 rounding of the probabilities
    assert chisquare(observed.numpy(), wanted.numpy()).pvalue > 1e-3
