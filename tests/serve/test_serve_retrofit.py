"""A retrofitted transformers checkpoint served through ``fullband serve``'s own loader (load_any): its sequences are
prefilled and decoded in batches like a native model's, and concurrent requests of every mode equal generate()
alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from conftest import save_strong_retrofit
from serve_fixtures import LiveServer, request, run_engine

from fullband.data import ByteTokenizer
from fullband.families import load_any
from fullband.generation import generate
from fullband.modes import DecodeOptions
from fullband.serve.config import ServeConfig
from fullband.serve.engine import Engine
from fullband.serve.server import build_app

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def retrofit_server(tmp_path_factory):
    _, retrofitted, _ = save_strong_retrofit(tmp_path_factory.mktemp("retrofit"))
    app = build_app(ServeConfig(checkpoint=str(retrofitted), max_batch=4, decode=DecodeOptions(temperature=0.0)))
    live = LiveServer(app, load_any(retrofitted), app.state.engine)
    yield live
    live.stop()


def test_retrofitted_checkpoint_serves_every_mode_concurrently(retrofit_server):
    jobs = [("ROMEO:", mode, 8) for mode in ("standard", "soft", "fused:1", "exact")] + [("To be", "soft", 5)]

    def run(job):
        prompt, mode, max_tokens = job
        with retrofit_server.client() as client:
            response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "mode": mode})
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(run, jobs))
    tokenizer = ByteTokenizer()
    for (prompt, mode, max_tokens), text in zip(jobs, texts, strict=True):
        ids = generate(retrofit_server.model, tokenizer.encode(prompt), max_tokens, mode,
                                             stop_token_ids=[tokenizer.eos_id])[len(prompt) :]
        assert text == tokenizer.decode([t for t in ids if t != tokenizer.eos_id]), mode
    assert texts[0] != texts[1]  # standard and soft differ on this model, so the mode reached it
    metrics = {line.split()[0]: float(line.split()[1]) for line in httpx.get(retrofit_server.url + "/metrics").text
               .splitlines() if line.startswith("fullband_engine_")}
    # concurrent requests shared decoding steps: more rows than steps (a batch of one per sequence would be equal)
    assert metrics["fullband_engine_rows_total"] > metrics["fullband_engine_steps_total"], metrics


def test_retrofitted_requests_are_batched_and_each_equals_itself_alone(tmp_path):
    """float64, every request queued before the engine starts: one batched prefill per kind, batched steps."""
    _, retrofitted, _ = save_strong_retrofit(tmp_path)
    model = load_any(retrofitted, dtype=torch.float64)
    jobs = [([5, 17, 3], "standard"), ([8, 1, 2, 9, 4, 4], "soft"), ([3, 1, 4, 1, 5, 9], "exact"),
            ([6, 2], "exact"), ([9, 8, 7, 6], "fused:2"), ([1, 2, 3, 4, 5, 6, 7], "fused:2")]
    engine = Engine(model, max_batch=len(jobs))
    assert engine.regroups
    collectors = run_engine(engine, [request(p, m, 7) for p, m in jobs])
    for (prompt, mode), c in zip(jobs, collectors, strict=True):
        assert c.tokens == generate(model, prompt, 7, mode)[len(prompt):], mode
    assert (engine.prefills, engine.batched_prefills) == (2, 2)  # plain (with the exact prompts' first tokens), fused
    # decoded together, not one sequence per step (the exact prompts still feeding step in a lane of their own)
    assert engine.rows_stepped >= 2 * engine.steps
    assert engine.interleaved_prompt_tokens == 5 + 1
