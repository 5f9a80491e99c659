"""A retrofitted transformers checkpoint served through ``fullband serve``'s own loader (load_any): its sequences
decode as batches of one in the shared loop, and concurrent requests of every mode equal generate() alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import save_strong_retrofit
from serve_fixtures import LiveServer

from fullband.data import ByteTokenizer
from fullband.model_io import load_any
from fullband.serve.config import ServeConfig
from fullband.serve.server import build_app

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def retrofit_server(tmp_path_factory):
    _, retrofitted, _ = save_strong_retrofit(tmp_path_factory.mktemp("retrofit"))
    app = build_app(ServeConfig(checkpoint=str(retrofitted), max_batch=4, temperature=0.0))
    live = LiveServer(app, load_any(retrofitted), app.state.engine)
    yield live
    live.stop()


def test_retrofitted_checkpoint_serves_every_mode_concurrently(retrofit_server):
    jobs = [("ROMEO:", mode, 8) for mode in ("standard", "soft", "fused", "exact")] + [("To be", "soft", 5)]

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
        ids = retrofit_server.model.generate(tokenizer.encode(prompt), max_tokens, mode,
                                             stop_token_ids=[tokenizer.eos_id])[len(prompt) :]
        assert text == tokenizer.decode([t for t in ids if t != tokenizer.eos_id]), mode
    assert texts[0] != texts[1]  # standard and soft differ on this model, so the mode reached it
