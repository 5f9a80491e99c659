"""Batched prefill (arrivals whose prefills are the same computation share one forward) and exact-mode prompts fed
inside decoding steps (so a long exact prefill never stalls the running streams): the tokens are those of each
request alone, an interleaved exact prefill is bit-identical to the whole one, and the counters show it happened."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from conftest import make_model
from serve_fixtures import Collector, ids_of, request, run_engine, server_fixture  # noqa: F401 (fixture)

from fullband.generation import generate
from fullband.serve.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.parametrize("chunk", [1, 4])
def test_interleaved_exact_prefill_is_bit_identical_to_the_whole_one(chunk):
    """float32, one request: the same forwards in the same order, so the same logits to the last bit. Chunks of
    one ride in the decoding steps; larger exact Jacobi chunks run one per engine iteration."""
    model = make_model(dtype=torch.float32, max_seq_len=128)
    prompt = [(7 * i + 3) % 60 for i in range(42)]
    runs = {}
    for interleave in (True, False):
        engine = Engine(model, max_batch=4, exact_chunk_size=chunk, interleave_prefill=interleave)
        [c] = run_engine(engine, [request(prompt, "exact", 8, logprobs=0)])
        runs[interleave] = (c.tokens, c.logprobs)
        assert engine.interleaved_prompt_tokens == (len(prompt) - 1 if interleave and chunk == 1 else 0)
        assert engine.prefill_chunks == (11 if interleave and chunk == 4 else 0)  # ceil(42 / 4)
    assert runs[True] == runs[False]
    assert runs[True][0] == generate(model, prompt, 8, "exact", exact_chunk_size=chunk)[len(prompt):]


def test_arrivals_prefill_together_and_each_gets_its_tokens_alone():
    model = make_model(dtype=torch.float64, max_seq_len=128)
    jobs = [([5, 17, 3], "standard"), ([8, 1, 2, 9, 4, 4], "soft"), ([2] * 11, "soft"),
            ([3, 1, 4, 1, 5, 9], "exact"), ([6, 6, 1], "exact"), ([9, 8, 7, 6], "fused:2"),
            ([1, 2, 3, 4, 5, 6, 7], "fused:2")]
    engine = Engine(model, max_batch=len(jobs))
    collectors = run_engine(engine, [request(p, m, 7) for p, m in jobs])
    for (prompt, mode), c in zip(jobs, collectors, strict=True):
        assert c.finish == "length"
        assert c.tokens == generate(model, prompt, 7, mode)[len(prompt):], (prompt, mode)
    # standard + soft + the exact prompts' first tokens in one plain forward, the fused pair in another
    assert engine.prefills == 2 and engine.batched_prefills == 2
    assert engine.interleaved_prompt_tokens == 5 + 2


@pytest.mark.parametrize("chunk", [1, 4])
def test_a_long_exact_prefill_does_not_stall_a_running_stream(chunk):
    """While a 100-token exact prompt prefills, a running stream gets a token at every step (chunks of one) or at
    every exact chunk (chunks of 4: 25 of them)."""
    model = make_model(dtype=torch.float32, max_seq_len=256)
    engine = Engine(model, max_batch=4, exact_chunk_size=chunk).start()
    try:
        running = Collector()
        engine.submit([request([4, 2], "soft", 150)], [running])
        while len(running.tokens) < 5:
            time.sleep(0.001)
        long = Collector()
        prompt = [(5 * i + 1) % 60 for i in range(100)]
        engine.submit([request(prompt, "exact", 3)], [long])
        assert long.done.wait(120) and running.done.wait(120)
    finally:
        engine.close()
    prompt_done = long.times[0]  # its first token comes once its whole prompt is in
    during = [t for t in running.times if t < prompt_done]
    assert len(running.tokens) == 150
    assert (engine.interleaved_prompt_tokens, engine.prefill_chunks) == ((99, 0) if chunk == 1 else (0, 25))
    # the running stream got tokens while the prompt was fed, not only before and after it
    assert len(during) >= 5 + (90 if chunk == 1 else 22), (len(during), len(running.tokens))
    assert long.tokens == generate(model, prompt, 3, "exact", exact_chunk_size=chunk)[100:]


def test_a_feeding_exact_prompt_steps_in_its_own_lane_and_never_pads_the_streams(monkeypatch):
    """While a 60-token exact prompt feeds, the short streams step in a batch of their own whose cache stays short
    (it is not padded to the long prompt), and every request still gets its tokens alone."""
    model = make_model(dtype=torch.float64, max_seq_len=128)
    prompt = [(5 * i + 1) % 60 for i in range(60)]
    jobs = [([4, 2], "soft", 12), ([7, 7, 1], "standard", 12), (prompt, "exact", 2)]
    engine = Engine(model, max_batch=4)
    stepped = []  # (rows, cache capacity, feeding rows) of every step
    step = Engine._step

    def recording_step(self, batch):
        stepped.append((len(batch.sequences), batch.cache.max_len, sum(bool(s.feed) for s in batch.sequences)))
        step(self, batch)

    monkeypatch.setattr(Engine, "_step", recording_step)
    collectors = run_engine(engine, [request(p, m, k) for p, m, k in jobs])
    for (p, mode, k), c in zip(jobs, collectors, strict=True):
        assert c.tokens == generate(model, p, k, mode)[len(p):], mode
    last_feed = max(i for i, (_, _, feeding) in enumerate(stepped) if feeding)
    feeding = [rows for rows, _, feeding in stepped if feeding]
    streams = [(rows, room) for rows, room, feeding in stepped[:last_feed] if not feeding]
    assert feeding == [1] * (len(prompt) - 1)
    # both streams together at each of their 11 steps (the first of 12 tokens comes from the prefill)
    assert [rows for rows, _ in streams] == [2] * 11
    assert max(room for _, room in streams) < 20  # their cache never grew to the long prompt's length


def test_metrics_count_prefills_and_interleaved_prompt_tokens(server):
    def metric(name: str) -> float:
        text = httpx.get(server.url + "/metrics").text
        return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    before = metric("fullband_interleaved_prompt_tokens_total"), metric("fullband_prefills_total")
    prompt = list(range(1, 21))
    with server.client() as client:
        response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                                        "mode": "exact"})
    assert ids_of(response.json()["choices"][0]["text"]) == generate(server.model, prompt, 4, "exact")[20:]
    assert metric("fullband_interleaved_prompt_tokens_total") - before[0] == 19
    assert metric("fullband_prefills_total") - before[1] == 1
    assert "fullband_batched_prefills_total" in httpx.get(server.url + "/metrics").text
