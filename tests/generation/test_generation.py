"""Greedy decoding in every mode equals its definition; batching, sampling, stopping, streaming."""

import pytest
import torch
from conftest import formula_input, make_model, sequential_reference, stack_from_inputs

from fullband import FullBandwidthLM
from fullband.generation import generate, stream

PROMPT = [5, 17, 3, 44, 8, 21]
NEW = 7


def greedy_from_definition(model: FullBandwidthLM, prompt: list[int], logits_of) -> list[int]:
    """Append argmax(logits_of(sequence)[last]) one token at a time, recomputing from scratch each step."""
    seq = list(prompt)
    for _ in range(NEW):
        logits = logits_of(torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    return seq


def fused_prefill_definition(model: FullBandwidthLM, prompt: list[int], k: int):
    """Logits for fused(k) with no cache: the prompt's inputs are those of pass k+1 of Jacobi (p = 1);
    generated positions then follow the exact recurrence on top of them (inputs from the formula)."""
    ids = torch.tensor([prompt])
    emb = model.embed.weight[ids]
    prev = model(ids, passes=k, plain_prefix=1).hidden  # the states pass k+1 fuses
    prompt_inputs = [formula_input(model, emb[:, 0], None)]
    prompt_inputs += [formula_input(model, emb[:, t], prev[:, t - 1]) for t in range(1, len(prompt))]

    def logits_of(seq: torch.Tensor) -> torch.Tensor:
        inputs = list(prompt_inputs)
        emb_all = model.embed.weight[seq]
        for t in range(len(prompt), seq.shape[1] + 1):
            states, normed = stack_from_inputs(model, torch.stack(inputs, 1))
            if t < seq.shape[1]:
                inputs.append(formula_input(model, emb_all[:, t], states[:, t - 1]))
        return normed @ model.lm_head.weight.T

    return logits_of


@torch.no_grad()
@pytest.mark.parametrize("mode", ["standard", "soft", "fused:2", "exact"])
def test_greedy_generate_equals_definition(model, mode):
    if mode == "standard":
        logits_of = lambda seq: model(seq).logits  # noqa: E731
    elif mode == "soft":
        logits_of = lambda seq: sequential_reference(model, seq, len(PROMPT))[1]  # noqa: E731
    elif mode == "exact":
        logits_of = lambda seq: sequential_reference(model, seq, 1)[1]  # noqa: E731
    else:
        logits_of = fused_prefill_definition(model, PROMPT, k=2)
    expected = greedy_from_definition(model, PROMPT, logits_of)
    got = generate(model, PROMPT, max_new_tokens=NEW, mode=mode)
    assert got == expected


@torch.no_grad()
def test_modes_really_differ(model):
    outputs = {mode: tuple(generate(model, PROMPT, NEW, mode=mode)) for mode in ("standard", "soft", "exact")}
    assert len(set(outputs.values())) == 3


@torch.no_grad()
@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_exact_mode_chunk_sizes_agree(model, chunk):
    expected = generate(model, PROMPT, NEW, mode="exact")
    assert generate(model, PROMPT, NEW, mode="exact", exact_chunk_size=chunk) == expected


@torch.no_grad()
def test_baseline_soft_equals_standard():
    model = make_model(feedback=False)
    assert generate(model, PROMPT, NEW, mode="soft") == generate(model, PROMPT, NEW, mode="standard")


@torch.no_grad()
@pytest.mark.parametrize("mode", ["standard", "soft", "fused:2", "exact"])
def test_batched_left_padding_equals_one_by_one(model, mode):
    prompts = [PROMPT, [9, 1], [33, 2, 60, 7, 12, 13, 14, 15, 40], [4]]
    batched = generate(model, prompts, NEW, mode=mode)
    single = [generate(model, p, NEW, mode=mode) for p in prompts]
    assert batched == single


@torch.no_grad()
def test_tensor_prompt_returns_prompt_plus_new_tokens(model):
    out = generate(model, torch.tensor([PROMPT, PROMPT]), NEW, mode="soft")
    assert out.shape == (2, len(PROMPT) + NEW)
    assert out[0].tolist() == generate(model, PROMPT, NEW, mode="soft")


@torch.no_grad()
def test_seeded_sampling_is_reproducible(model):
    kwargs = dict(max_new_tokens=12, mode="soft", temperature=1.0, top_k=20, top_p=0.9)
    first = generate(model, [PROMPT, PROMPT[:3]], seed=7, **kwargs)
    assert generate(model, [PROMPT, PROMPT[:3]], seed=7, **kwargs) == first
    others = [generate(model, [PROMPT, PROMPT[:3]], seed=s, **kwargs) for s in (8, 9, 10)]
    assert any(o != first for o in others)


@torch.no_grad()
def test_top_k_one_is_greedy(model):
    greedy = generate(model, PROMPT, NEW, mode="soft")
    assert generate(model, PROMPT, NEW, mode="soft", temperature=1.5, top_k=1, seed=0) == greedy


@torch.no_grad()
def test_stop_tokens_end_each_row(model):
    full = generate(model, PROMPT, NEW, mode="soft")
    stop = full[len(PROMPT) + 2]  # the third generated token
    out = generate(model, [PROMPT, PROMPT], NEW, mode="soft", stop_token_ids=[stop])
    first = full.index(stop, len(PROMPT))
    assert out == [full[: first + 1]] * 2
    # Decoding ends once every row has stopped; a tensor prompt gets a tensor cut at that step.
    tensor_out = generate(model, torch.tensor([PROMPT]), NEW, mode="soft", stop_token_ids=[stop])
    assert tensor_out[0].tolist() == full[: first + 1]
    # A row that stopped early is padded while the others go on.
    steps = list(stream(model, [PROMPT, [1, 2]], NEW, mode="soft", stop_token_ids=[stop], pad_token_id=0))
    row0 = [int(t[0]) for t in steps]
    assert row0[: first + 1 - len(PROMPT)] == full[len(PROMPT) : first + 1]
    assert set(row0[first + 1 - len(PROMPT) :]) <= {0}


@torch.no_grad()
def test_stream_yields_the_generated_tokens(model):
    steps = [int(t[0]) for t in stream(model, PROMPT, NEW, mode="fused:1")]
    assert PROMPT + steps == generate(model, PROMPT, NEW, mode="fused:1")


def test_mode_names_and_defaults_have_one_definition():
    import inspect

    from fullband import hub
    from fullband.evaluation.config import LmEvalConfig
    from fullband.evaluation.continuation import score_continuations
    from fullband.generation import MODES, generate, stream
    from fullband.generation.config import GenerateConfig
    from fullband.modes import DECODING_MODES, DEFAULT_MODE, DEFAULT_SCORE_MODE, DecodeOptions

    assert MODES == DECODING_MODES == ("standard", "soft", "fused", "exact")
    decoding_defaults = [inspect.signature(f).parameters["mode"].default for f in (generate, stream)]
    assert decoding_defaults == [DEFAULT_MODE] * 2 == ["soft"] * 2  # DESIGN.md §5
    assert DecodeOptions().mode == DEFAULT_MODE
    assert GenerateConfig(checkpoint="x").decode.mode == hub.DECODING_DEFAULTS["decoding_mode"] == DEFAULT_MODE
    # Scoring a given text defaults to the plain pass.
    score_default = inspect.signature(score_continuations).parameters["mode"].default
    eval_default = LmEvalConfig(checkpoint="x", tasks=("t",)).decode.mode
    assert eval_default == hub.DECODING_DEFAULTS["score_mode"] == score_default
    assert score_default == DEFAULT_SCORE_MODE == "standard"
