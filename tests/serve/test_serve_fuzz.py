"""Fuzzing from the server's own OpenAPI schema (schemathesis): a short run over an in-process app, and what earlier
runs found (each was an HTTP 500 or a stalled engine, now a 4xx or a normal answer)."""

from __future__ import annotations

import time

import pytest
import torch
from serve_fixtures import ids_of, server_fixture  # noqa: F401 (fixture)

from fullband import FullBandwidthLM, ModelConfig
from fullband.data import ByteTokenizer
from fullband.generation import generate
from fullband.serve.app import Defaults, Limits, create_app
from fullband.serve.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.fuzz
def test_fuzz_run_of_500_requests_gets_no_5xx_and_no_undocumented_answer():
    """schemathesis's every check (st run --checks all) on >= 500 requests from the server's own OpenAPI schema: no
    server error, every status and content type documented (ST103, ST105) and no schema-valid request refused
    (ST202). The context is long enough for the text prompts the fixed seed draws: how many tokens a text is, the
    schema cannot say (one longer than the context gets 400)."""
    pytest.importorskip("schemathesis")
    from fullband.serve.fuzz import fuzz_app

    torch.manual_seed(0)
    model = FullBandwidthLM(ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                        max_seq_len=1024))
    app = create_app(Engine(model, max_batch=4, max_queue=4), ByteTokenizer(), "tiny", Defaults(max_tokens=4),
                     limits=Limits(max_tokens=4))
    began = time.process_time()  # CPU seconds: the run's budget, which a busy machine's wall clock would not keep
    report = fuzz_app(app, examples=125, seed=0)
    assert report.failures == [], report.failures[:3]
    assert report.requests >= 500, report.counts
    assert report.by_status().get(200, 0) >= 100 and report.by_status().get(400, 0) >= 100, report.by_status()
    undocumented = {code: report.check_examples[code] for code in ("ST103", "ST105", "ST202")
                    if report.check_failures[code]}
    assert not undocumented, undocumented
    assert report.health_after == 200
    assert time.process_time() - began < 90


def test_a_tiny_temperature_is_greedy_not_a_500_the_same_tokens_as_generate(server):
    """One greedy rule, the sampler's (generation.sampling.is_greedy): the server and generate() agree on it."""
    with server.client() as client:
        tiny = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 1e-320})
        zero = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == zero.json()["choices"][0]["text"]
    expected = generate(server.model, [1, 2, 3], 6, "soft", temperature=1e-320)[3:]
    assert ids_of(tiny.json()["choices"][0]["text"]) == expected == generate(server.model, [1, 2, 3], 6, "soft")[3:]


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), 2**64, -(2**63) - 192, 10**30])
def test_every_integer_seed_the_schema_allows_serves_every_n_read_modulo_2_64_as_torch_reads_it(server, seed):
    """The schema sets no bounds on seed (one near 2**63 reads differently as a decimal and as a float: schemathesis
    sent -9223372036854776000, valid to a float reader), and the server reads every integer as torch reads a seed:
    modulo 2**64. Choice i of n draws with seed + i, past 2**64 - 1 too."""
    with server.client() as client:
        schema = client.get("/openapi.json").json()["components"]["schemas"]["CompletionBody"]["properties"]["seed"]
        response = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 4, "seed": seed, "n": 16,
                                                        "temperature": 1.5})
    assert not {"minimum", "maximum"} & set(schema) and response.status_code == 200, response.text
    for choice, got in enumerate(response.json()["choices"]):
        expected = generate(server.model, [1, 2], 4, "soft", temperature=1.5, seed=(seed + choice) % 2**64)[2:]
        assert ids_of(got["text"]) == expected, choice


def test_whole_floats_count_as_integers_as_json_schema_says(server):
    with server.client() as client:
        response = client.post("/v1/completions", json={"prompt": [1.0, 2.0], "max_tokens": 3.0, "n": 2.0,
                                                        "temperature": 0, "seed": 7.0})
        fraction = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3.5})
    assert response.status_code == 200, response.text
    assert [len(ids_of(c["text"])) for c in response.json()["choices"]] == [3, 3]
    assert fraction.status_code == 400 and fraction.json()["error"]["param"] == "max_tokens"


def test_huge_prefill_passes_are_capped_where_they_stop_changing_anything(server):
    """A 4-token prompt is exact after 1 + 3 passes: a trillion asked for answers at once, with those tokens."""
    body = {"prompt": [3, 1, 4, 1], "max_tokens": 6, "temperature": 0}
    began = time.monotonic()
    with server.client() as client:
        huge = client.post("/v1/completions", json={**body, "mode": f"fused:{10**12}"})
    assert huge.status_code == 200 and time.monotonic() - began < 10
    expected = generate(server.model, body["prompt"], 6, "fused:3")[4:]
    assert ids_of(huge.json()["choices"][0]["text"]) == expected
    assert generate(server.model, body["prompt"], 6, "fused:9")[4:] == expected  # more change nothing
