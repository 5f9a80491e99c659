"""Failure behaviour of the real server: 400 naming the field, 429 on a full queue, a client that leaves frees its
slot; none of it disturbs other requests."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_fixtures import (  # noqa: F401 (fixtures)
    VOCAB,
    ids_of,
    long_server_fixture,
    save_checkpoint,
    server_fixture,
    text_server_fixture,
    wait_until_idle,
)

from fullband.generation import generate

BAD = [
    ({"prompt": [1, 2], "mode": "turbo"}, "mode"),
    ({"prompt": [1, 2], "mode": "fused:-1"}, "mode"),
    ({"prompt": [1, 2], "mode": "fused"}, "mode"),  # the count is part of the mode: fused:K
    ({"prompt": [1, 2], "mode": "fused(2)"}, "mode"),  # a report's spelling
    ({"prompt": [1, 2], "max_tokens": -3}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "5"}, "max_tokens"),
    ({"prompt": [1, 2], "temperature": "hot"}, "temperature"),
    ({"prompt": [1] * 64, "max_tokens": 1}, "prompt"),
    ({"prompt": [1, 2], "max_tokens": 64}, "max_tokens"),  # more than the context could hold after any prompt
    ({"prompt": [1, VOCAB], "max_tokens": 2}, "prompt"),
    ({"prompt": [1, -1], "max_tokens": 2}, "prompt"),
    ({"prompt": 3.5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "text"}, "prompt"),  # this checkpoint has no tokenizer
    ({"max_tokens": 2}, "prompt"),
    ({"prompt": [1], "prefill_passes": 2}, "prefill_passes"),  # retired: "mode": "fused:2"
    ({"prompt": [1], "top_p": 0}, "top_p"),
    ({"prompt": [1], "n": 0}, "n"),
    ({"prompt": [1], "stream": "yes"}, "stream"),
    ({"prompt": [1], "logprobs": 99}, "logprobs"),
    ({"prompt": [1], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD)])
def test_bad_request_gets_400_naming_the_field(server, body, param):
    with server.client() as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split(".")[0] in error["message"] or param == "prompt", error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
def test_bad_json_gets_400(server, raw):
    with server.client() as client:
        response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_chat_bad_messages_get_400(text_server):
    with text_server.client() as client:
        no_role = client.post("/v1/chat/completions", json={"messages": [{"content": "hi"}]})
        empty = client.post("/v1/chat/completions", json={"messages": []})
        bad_role = client.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "hi"}]})
    assert no_role.status_code == empty.status_code == bad_role.status_code == 400
    assert no_role.json()["error"]["param"].startswith("messages")
    assert bad_role.json()["error"]["param"] == "messages"


def test_bad_requests_do_not_disturb_the_others(server):
    """Good and bad requests at once: every good one still equals its request alone."""
    good = {"prompt": [3, 1, 4, 1, 5], "max_tokens": 10, "temperature": 0, "mode": "soft"}
    bodies = [good if i % 2 else BAD[i % len(BAD)][0] for i in range(16)]
    with ThreadPoolExecutor(16) as pool, server.client() as client:
        responses = list(pool.map(lambda b: client.post("/v1/completions", json=b), bodies))
    expected = generate(server.model, good["prompt"], 10, "soft")[5:]
    for body, response in zip(bodies, responses, strict=True):
        if body is good:
            assert ids_of(response.json()["choices"][0]["text"]) == expected
        else:
            assert response.status_code == 400


def test_full_queue_gets_429_and_the_accepted_requests_finish(long_server):
    """max_batch=1, max_queue=1: of 6 simultaneous long requests at most 2 get in."""
    body = {"prompt": [1, 2, 3], "max_tokens": 400, "temperature": 0, "mode": "standard"}
    with ThreadPoolExecutor(6) as pool, long_server.client() as client:
        responses = list(pool.map(lambda _: client.post("/v1/completions", json=body), range(6)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) in (1, 2) and set(codes) <= {200, 429}, codes
    rejected_response = next(r for r in responses if r.status_code == 429)
    assert rejected_response.headers["retry-after"] == "1"
    rejected = rejected_response.json()["error"]
    assert rejected["code"] == "rate_limit_exceeded" and "queue" in rejected["message"]
    expected = generate(long_server.model, body["prompt"], 400, "standard")[3:]
    assert all(ids_of(r.json()["choices"][0]["text"]) == expected for r in responses if r.status_code == 200)
    assert wait_until_idle(long_server)["active"] == 0
    with long_server.client() as client:  # room again
        assert client.post("/v1/completions", json={**body, "max_tokens": 2}).status_code == 200


def test_streaming_client_that_disconnects_frees_its_slot(long_server):
    body = {"prompt": [5], "max_tokens": 4000, "temperature": 0, "stream": True}
    before = httpx.get(long_server.url + "/metrics").text
    with long_server.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")
        assert httpx.get(long_server.url + "/health").json()["active"] == 1
    assert wait_until_idle(long_server, 3)["active"] == 0
    after = httpx.get(long_server.url + "/metrics").text
    generated = _metric(after, "fullband_generated_tokens_total") - _metric(before, "fullband_generated_tokens_total")
    assert generated < 4000, "the request ran to the end although its client left"
    with long_server.client() as client:  # the slot is usable at once
        assert client.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2}).status_code == 200


def test_non_streaming_client_that_times_out_frees_its_slot(long_server):
    body = {"prompt": [5], "max_tokens": 4000, "temperature": 0}
    with httpx.Client(base_url=long_server.url, timeout=0.3) as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/completions", json=body)
    assert wait_until_idle(long_server, 3)["active"] == 0


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_serve_bad_option_is_answered_before_torch_or_fastapi_is_imported():
    code = ("import sys; from fullband.cli import main; "
            "rc = main(['serve', '--checkpoint', 'x', '--decode.mode', 'fast']);"
            "assert rc == 2 and not {'torch', 'fastapi', 'uvicorn'} & set(sys.modules), sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == ("fullband serve: error: decode.mode='fast' is invalid: must be one of "
                                   "standard, soft, fused:K, exact")


def test_serve_missing_checkpoint_is_one_line(tmp_path):
    from fullband.cli import main

    assert main(["serve", "--checkpoint", str(tmp_path / "nope")]) == 2


def test_chat_errors_name_the_chat_fields(text_server):
    with text_server.client() as client:
        top = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                        "logprobs": True, "top_logprobs": 50})
        many = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                         "max_completion_tokens": 256})
    assert top.status_code == many.status_code == 400
    assert top.json()["error"]["param"] == "top_logprobs" and "top_logprobs" in top.json()["error"]["message"]
    assert many.json()["error"]["param"] == "max_completion_tokens"
