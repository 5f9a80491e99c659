"""--request_timeout: a request past its deadline is cancelled in the engine (its slot freed) and answered with
HTTP 504; a stream that times out ends with an error event, never with a finish_reason or [DONE]."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from serve_fixtures import LiveServer, save_checkpoint, wait_until_idle

from fullband.config import ConfigError
from fullband.serve.app import Limits
from fullband.serve.config import ServeConfig

LONG = {"prompt": [5], "max_tokens": 4000, "temperature": 0, "mode": "standard"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, one_thread_per_module) -> Iterator[LiveServer]:
    """One slot, one queue place, a 0.5 s deadline: 4000 tokens cannot finish in time on any machine."""
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("deadline"), with_tokenizer=False, max_seq_len=4096)
    live = LiveServer.native(checkpoint, with_tokenizer=False, max_batch=1, max_queue=1,
                             limits=Limits(request_timeout=0.5))
    yield live
    live.stop()


def _generated(server: LiveServer) -> float:
    text = httpx.get(server.url + "/metrics").text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("fullband_generated_tokens_total "))


def test_request_past_its_deadline_gets_504_and_frees_its_slot(server):
    before = _generated(server)
    began = time.monotonic()
    with server.client() as client:
        response = client.post("/v1/completions", json=LONG)
    assert response.status_code == 504, response.text
    assert time.monotonic() - began < 5
    error = response.json()["error"]
    assert error["code"] == "request_timeout" and "--request_timeout" in error["message"]
    health = wait_until_idle(server)
    assert health["active"] == 0 and health["queued"] == 0
    generated = _generated(server) - before
    assert generated < 4000, "the engine kept decoding a request whose deadline had passed"
    time.sleep(0.3)
    assert _generated(server) - before == generated  # and it does not come back to it
    with server.client() as client:  # the slot is free at once, and a short request is within its deadline
        short = client.post("/v1/completions", json={**LONG, "max_tokens": 3})
    assert short.status_code == 200 and short.json()["choices"][0]["finish_reason"] == "length"


def test_stream_past_its_deadline_ends_with_an_error_event_and_no_finish_reason(server):
    with server.client() as client, client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200  # the headers went out before the deadline
        events = [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
                  for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["error"]["code"] == "request_timeout"
    tokens = events[:-1]
    assert tokens and all(e["choices"][0]["finish_reason"] is None for e in tokens)
    assert "[DONE]" not in events
    assert wait_until_idle(server)["active"] == 0


def test_queued_request_times_out_too_and_leaves_the_queue(server):
    """The deadline counts from arrival: a request still waiting for the one slot gets its 504 at its deadline."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool, server.client() as client:
        responses = list(pool.map(lambda _: client.post("/v1/completions", json=LONG), range(2)))
    assert [r.status_code for r in responses] == [504, 504]
    health = wait_until_idle(server)
    assert health["active"] == 0 and health["queued"] == 0


def test_chat_stream_through_the_openai_client_raises_at_the_deadline(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.completions.create(model="tiny", prompt=[5], max_tokens=4000, temperature=0, stream=True):
            pass


@pytest.mark.parametrize("value", [-1, "600", True])
def test_bad_request_timeout_is_rejected_naming_the_option(value):
    with pytest.raises(ConfigError, match="request_timeout"):
        ServeConfig(checkpoint="x", request_timeout=value)
