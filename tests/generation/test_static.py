"""The static decode step (a preallocated KV cache and carried state written in place, generation/static.py) decodes
what the eager step does: the same greedy tokens in every mode, alone and batched with left padding, the same logits
to float64 rounding, rows plain and fused side by side, and through torch.compile (inductor on this CPU)."""

import time
import warnings

import pytest
import torch
from conftest import make_model

from fullband.config import ConfigError
from fullband.generation import generate
from fullband.generation.decoding import decode_step, left_pad, prefill
from fullband.generation.state import DecodeState
from fullband.generation.static import MIN_CAPACITY, StaticDecoder, capacity_for, static_decoder
from fullband.modes import DecodeOptions

PROMPT = [5, 17, 3, 44, 8, 21]
PROMPTS = [PROMPT, [9, 1], [33, 2, 60, 7, 12, 13, 14, 15, 40], [4]]
NEW = 9
MODES = ["standard", "soft", "fused:2", "exact"]

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@torch.no_grad()
@pytest.mark.parametrize("mode", MODES)
def test_static_step_greedy_tokens_equal_the_eager_path(model, mode):
    # The eager path (model forward per token) is the reference; float64, where exactness is claimed.
    assert generate(model, PROMPT, NEW, mode, step="static") == generate(model, PROMPT, NEW, mode)
    assert generate(model, PROMPTS, NEW, mode, step="static") == generate(model, PROMPTS, NEW, mode)


@torch.no_grad()
@pytest.mark.parametrize("position_encoding", ["rope", "none"])
@pytest.mark.parametrize("mode", MODES)
def test_static_step_logits_equal_the_eager_step(mode, position_encoding):
    """Step by step from one prefill: the static step's logits and carried state are the eager step's to float64
    rounding (attention sums over the unused, masked slots too), fed the same tokens; with RoPE and with NoPE."""
    model = make_model(position_encoding=position_encoding)
    ids, mask = left_pad(PROMPTS)
    eager = prefill(model, ids, mask, mode, ids.shape[1] + NEW)
    decoder = StaticDecoder(model, len(PROMPTS), capacity_for(model, ids.shape[1] + NEW))
    static = prefill(model, ids, mask, mode, ids.shape[1] + NEW, cache=decoder.fresh_cache())
    for _ in range(NEW):
        token = eager.next_logits.argmax(-1)
        torch.testing.assert_close(static.next_logits, eager.next_logits, rtol=0, atol=1e-12)
        decode_step(model, eager, token)
        decoder.step(static, token)
        if eager.carried is not None:
            torch.testing.assert_close(static.carried, eager.carried, rtol=0, atol=1e-12)
    assert static.cache.length == eager.cache.length
    assert torch.equal(static.cache.next_position, eager.cache.next_position)
    L = eager.cache.length
    assert torch.equal(static.cache.valid[:, :L], eager.cache.valid[:, :L])


@torch.no_grad()
def test_plain_and_fused_rows_side_by_side_and_a_foreign_cache_adopted():
    """The server's batches: rows decoded plain next to fused ones (DecodeState.plain_rows), over a cache the
    decoder did not allocate (copied in at the first step)."""
    model = make_model()
    ids, mask = left_pad(PROMPTS)
    length = ids.shape[1] + NEW
    eager = prefill(model, ids, mask, "soft", length)
    eager.plain_rows = torch.tensor([False, True, False, True])
    other = prefill(model, ids, mask, "soft", length)
    static = DecodeState(other.cache, other.carried, other.next_logits, other.prompt_len, eager.plain_rows)
    decoder = StaticDecoder(model, len(PROMPTS), capacity_for(model, length))
    for _ in range(NEW):
        token = eager.next_logits.argmax(-1)
        decode_step(model, eager, token)
        decoder.step(static, token)
        torch.testing.assert_close(static.next_logits, eager.next_logits, rtol=0, atol=1e-12)
    assert static.cache is decoder.cache


@torch.no_grad()
def test_one_decoder_serves_every_call_of_its_shape():
    # The cache (and a compiled step's graph) is reused: a second decode empties it rather than allocating one.
    model = make_model()
    first = static_decoder(model, 2, 20, compiled=False)
    assert static_decoder(model, 2, 30, compiled=False) is first and first.cache.max_len == MIN_CAPACITY
    assert static_decoder(model, 3, 20, compiled=False) is not first
    for prompts in ([PROMPT, [4, 4]], [[7], PROMPT[::-1]]):
        assert generate(model, prompts, NEW, "soft", step="static") == generate(model, prompts, NEW, "soft")
    assert capacity_for(model, 10_000) == model.config.max_seq_len


def test_decode_options_check_the_step():
    assert DecodeOptions(step="compiled").step == "compiled"
    with pytest.raises(ConfigError, match="step"):
        DecodeOptions(step="graphs")


@torch.no_grad()
@pytest.mark.parametrize("mode", ["soft", pytest.param("standard", marks=pytest.mark.slow)])
def test_compiled_step_tokens_equal_the_eager_path(mode, monkeypatch):
    """torch.compile (inductor on a CPU; reduce-overhead with CUDA graphs on CUDA, checked by
    benchmarks/gpu_check.py) of the static step: float32 as it would run, one tiny model, one row and batched with
    left padding. The products as a CPU decoding step traces them (fullband.model.linear.traced_decoding: one row a
    reduction, several oneDNN's kernel), the size floor lowered so the tiny model's weights take that path. A fused
    mode by default (~15 s of compiling); the plain one with -m slow."""
    from fullband.model import linear

    monkeypatch.setitem(linear.ONEDNN_MIN_WEIGHT, "threads", 0)
    model = make_model(dtype=torch.float32)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert generate(model, PROMPTS, NEW, mode, step="compiled") == generate(model, PROMPTS, NEW, mode)
        assert generate(model, PROMPT, NEW, mode, step="compiled") == generate(model, PROMPT, NEW, mode)
    assert not [w for w in caught if "compiled decode step failed" in str(w.message)]  # it ran compiled
    print(f"compiled static step ({mode}): {time.perf_counter() - start:.1f} s with compiling")


@torch.no_grad()
def test_a_compiled_step_that_fails_to_compile_decodes_uncompiled(monkeypatch):
    """A compiler error (or dynamo's limit of graphs reached) comes before the step runs: the decoder warns and takes
    the static step uncompiled, with the same tokens."""
    def failing(*args, **kwargs):
        raise torch._dynamo.exc.FailOnRecompileLimitHit("too many graphs")

    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: failing)
    model = make_model(seed=3)
    with pytest.warns(UserWarning, match="decoding with the static step uncompiled"):
        got = generate(model, PROMPTS, NEW, "soft", step="compiled")
    assert got == generate(model, PROMPTS, NEW, "soft")


def test_released_decoders_are_built_afresh():
    from fullband.generation.static import release_static_decoders

    model = make_model()
    first = static_decoder(model, 2, 20, compiled=False)
    release_static_decoders(model)
    assert static_decoder(model, 2, 20, compiled=False) is not first
