"""The real server (uvicorn on a free port) against the generation module: every mode, streaming, chat, sampling,
logprobs, and continuous batching == each request alone (greedy)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from serve_fixtures import ids_of, server_fixture, text_server_fixture  # noqa: F401 (fixtures)

from fullband.data import ByteTokenizer
from fullband.data.sft import encode_chat
from fullband.generation import generate
from fullband.serve.text import CHAT_STOP

MODES = ["standard", "soft", "fused:0", "fused:1", "fused:3", "exact"]


def complete(client: httpx.Client, **body) -> dict:
    response = client.post("/v1/completions", json={"temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def reference(server, prompt: list[int], max_tokens: int, mode: str, **kwargs) -> list[int]:
    """The same request decoded alone by the generation module."""
    return generate(server.model, prompt, max_tokens, mode, **kwargs)[len(prompt) :]


@pytest.mark.parametrize("mode", MODES)
def test_completion_equals_generate_in_every_mode(server, mode):
    prompt = [5, 17, 42, 8, 99, 3, 250]
    with server.client() as client:
        out = complete(client, prompt=prompt, max_tokens=12, mode=mode)
    assert ids_of(out["choices"][0]["text"]) == reference(server, prompt, 12, mode)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}


def test_modes_differ_on_this_model(server):
    """The mode really reaches the model: standard and soft decode differently here (a precondition of the rest)."""
    prompt = [5, 17, 42, 8, 99, 3, 250]
    assert reference(server, prompt, 12, "standard") != reference(server, prompt, 12, "soft")


def test_streaming_sse_matches_non_streaming_and_ends_with_done(server):
    prompt = [7, 7, 1, 200]
    with server.client() as client:
        whole = complete(client, prompt=prompt, max_tokens=10, mode="fused:2")
        body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "mode": "fused:2"}
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"


def test_openai_client_completions_stream_and_not(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    prompt = [9, 8, 7]
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"mode": "exact"})
    assert ids_of(out.choices[0].text) == reference(server, prompt, 6, "exact")
    pieces = [c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=6, temperature=0, stream=True, extra_body={"mode": "exact"})]
    assert "".join(pieces) == out.choices[0].text
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_concurrent_mixed_modes_and_lengths_equal_each_request_alone(server):
    """Continuous batching: requests of every mode, prompt length and max_tokens decode in one batch, joining and
    leaving at different steps, and each gets the tokens it gets alone."""
    g = torch.Generator().manual_seed(3)
    jobs = []
    for i in range(16):
        mode = MODES[i % len(MODES)]
        prompt = torch.randint(0, 257, (1 + (7 * i) % 23,), generator=g).tolist()
        jobs.append((prompt, 4 + (5 * i) % 17, mode))
    before = httpx.get(server.url + "/metrics").text

    def run(job):
        prompt, max_tokens, mode = job
        with server.client() as client:
            return ids_of(complete(client, prompt=prompt, max_tokens=max_tokens, mode=mode)["choices"][0]["text"])

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(run, jobs))
    for (prompt, max_tokens, mode), tokens in zip(jobs, got, strict=True):
        assert tokens == reference(server, prompt, max_tokens, mode), (mode, len(prompt), max_tokens)
    after = httpx.get(server.url + "/metrics").text
    steps = metric(after, "fullband_engine_steps_total") - metric(before, "fullband_engine_steps_total")
    rows = metric(after, "fullband_engine_rows_total") - metric(before, "fullband_engine_rows_total")
    assert rows / steps > 2, "the requests were not decoded together"


def metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_seeded_sampling_equals_generate_and_n_choices_use_consecutive_seeds(server):
    prompt = [4, 44, 144]
    with server.client() as client:
        out = complete(client, prompt=prompt, max_tokens=10, temperature=0.9, top_p=0.8, seed=11, n=2, mode="soft")
    for choice, seed in zip(out["choices"], (11, 12), strict=True):
        assert ids_of(choice["text"]) == reference(server, prompt, 10, "soft", temperature=0.9, top_p=0.8, seed=seed)
    assert out["choices"][0]["text"] != out["choices"][1]["text"]


def test_logprobs_are_the_models_log_softmax(server):
    prompt = [10, 20, 30]
    with server.client() as client:
        out = complete(client, prompt=prompt, max_tokens=5, mode="standard", logprobs=3)
    lp = out["choices"][0]["logprobs"]
    tokens = ids_of(out["choices"][0]["text"])
    for k, token in enumerate(tokens):
        with torch.no_grad():
            logits = server.model(torch.tensor([prompt + tokens[:k]])).logits[0, -1]
        expected = torch.log_softmax(logits, -1)
        assert lp["tokens"][k] == f" {token}"
        assert lp["token_logprobs"][k] == pytest.approx(float(expected[token]), abs=1e-9)
        top = torch.topk(expected, 3)
        top_tokens = [f" {t}" for t in top.indices.tolist()]
        assert lp["top_logprobs"][k] == pytest.approx(dict(zip(top_tokens, top.values.tolist(), strict=True)))


def test_stop_string_cuts_the_text_streaming_and_not(server):
    prompt = [1, 2, 3]
    with server.client() as client:
        full = complete(client, prompt=prompt, max_tokens=12)["choices"][0]["text"]
        stop = " " + full.split()[6] + " "
        expected = full[: full.find(stop)]
        out = complete(client, prompt=prompt, max_tokens=12, stop=[stop])["choices"][0]
        with client.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                             "stop": stop, "stream": True}) as r:
            chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert (out["text"], out["finish_reason"]) == (expected, "stop")
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_uses_the_plain_template_and_openai_client(text_server):
    client = openai.OpenAI(base_url=text_server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                         extra_body={"mode": "fused:2"})
    tokenizer = ByteTokenizer()
    prompt = encode_chat(tokenizer, messages, add_generation_prompt=True).input_ids
    expected = tokenizer.decode(reference(text_server, prompt, 20, "fused:2", stop_token_ids=[tokenizer.eos_id]))
    expected = expected.removesuffix(tokenizer.decode([tokenizer.eos_id])).split(CHAT_STOP)[0]
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected
    assert out.usage.prompt_tokens == len(prompt)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                            stream=True, extra_body={"mode": "fused:2"})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_logprobs_and_string_prompt(text_server):
    with text_server.client() as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 4,
                                                      "temperature": 0, "logprobs": True, "top_logprobs": 2})
        text = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "temperature": 0}).json()
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert 1 <= len(content) <= 4 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] >= c["logprob"] - 1e-12 for c in content)
    assert text["usage"]["prompt_tokens"] == 3


def test_models_health_and_metrics(server):
    with server.client() as client:
        complete(client, prompt=[1], max_tokens=3)
        health = client.get("/health").json()
        models = client.get("/v1/models").json()
        metrics = client.get("/metrics").text
    assert health["status"] == "ok" and health["active"] == 0
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 64
    assert 'fullband_requests_total{endpoint="/v1/completions",status="200"}' in metrics
    for name in ("fullband_queue_depth", "fullband_batch_size", "fullband_generated_tokens_total",
                 "fullband_request_latency_seconds_bucket"):
        assert name in metrics
    assert metric(metrics, "fullband_generated_tokens_total") >= 3


def test_concurrent_seeded_sampling_equals_each_request_alone(server):
    """Each sequence samples with its own generator, so batching does not change a seeded draw."""
    jobs = [([3 + i, 50, 7 * i], MODES[i % len(MODES)], 100 + i) for i in range(10)]

    def run(job):
        prompt, mode, seed = job
        with server.client() as client:
            out = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 9, "temperature": 1.3,
                                                       "top_p": 0.95, "seed": seed, "mode": mode})
        return ids_of(out.json()["choices"][0]["text"])

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(run, jobs))
    for (prompt, mode, seed), tokens in zip(jobs, got, strict=True):
        assert tokens == reference(server, prompt, 9, mode, temperature=1.3, top_p=0.95, seed=seed), mode
