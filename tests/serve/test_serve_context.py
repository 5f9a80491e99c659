"""One context rule for ``fullband generate`` and the server (fullband.context), with the same wording and OpenAI's
error codes, and the server's OpenAPI schema agreeing with what the server does (issue 55: max_completion_tokens
past the schema's maximum, seeds, prompts past the context)."""

from __future__ import annotations

import random
import time

import pytest
import torch
from serve_fixtures import (  # noqa: F401 (fixtures)
    ids_of,
    save_checkpoint,
    server_fixture,
    text_server_fixture,
)

from fullband import FullBandwidthLM, ModelConfig
from fullband.cli import main
from fullband.data import ByteTokenizer
from fullband.generation import generate
from fullband.modes import mode_pattern
from fullband.serve.app import Defaults, create_app
from fullband.serve.engine import Engine

CONTEXT = 64  # the ids server's checkpoint; the text server's is 256


def post(server, body: dict, path: str = "/v1/completions"):
    with server.client() as client:
        return client.post(path, json=body)


@pytest.mark.parametrize(("value", "code", "says"), [
    (-3, "integer_below_min_value", "max_tokens=-3 is invalid: must be an integer >= 1"),
    (0, "integer_below_min_value", "max_tokens=0 is invalid: must be an integer >= 1"),
    ("5", "invalid_type", "max_tokens: Input should be a valid integer"),
    (3.5, "invalid_type", "max_tokens: Input should be a valid integer"),
    (True, "invalid_type", "max_tokens: Input should be a valid integer"),
    (CONTEXT, "integer_above_max_value", f"max_tokens={CONTEXT} is more than the model's context of {CONTEXT} tokens "
                                         f"leaves after a one-token prompt: ask for at most {CONTEXT - 1}"),
])
def test_a_bad_max_tokens_gets_400_with_openais_code_for_its_kind(server, value, code, says):
    response = post(server, {"prompt": [1, 2], "max_tokens": value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", code) and error["message"].startswith(says), error


def test_generate_and_the_server_refuse_with_the_same_words(server, tmp_path, capsys):
    """The same checkpoint kind (token ids, context 64) through `fullband generate` and the server: the same
    sentence, only the option's name differs."""
    checkpoint = str(save_checkpoint(tmp_path, with_tokenizer=False))
    cases = [(["--prompt", "1 2", "--max_new_tokens", str(CONTEXT)], {"prompt": [1, 2], "max_tokens": CONTEXT}),
             (["--prompt", " ".join(["1"] * CONTEXT), "--max_new_tokens", "1"], {"prompt": [1] * CONTEXT,
                                                                                  "max_tokens": 1})]
    for cli, body in cases:
        assert main(["generate", "--checkpoint", checkpoint, *cli]) == 2
        said = capsys.readouterr().err.strip().removeprefix("fullband generate: error: ")
        error = post(server, body).json()["error"]
        assert said.replace("max_new_tokens", "max_tokens") == error["message"], (said, error)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert error["message"] == (f"the prompt has {CONTEXT} tokens but the model's context is {CONTEXT}: shorten it to "
                                f"at most {CONTEXT - 1} (one token must fit after it)")


def test_token_ids_that_leave_less_room_generate_to_the_context_end_through_both(server, tmp_path, capsys):
    prompt = list(range(1, 61))
    answer = post(server, {"prompt": prompt, "max_tokens": 10, "temperature": 0}).json()
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 4
    assert ids_of(answer["choices"][0]["text"]) == generate(server.model, prompt, 4, "soft")[60:]
    checkpoint = save_checkpoint(tmp_path, with_tokenizer=False)
    model = FullBandwidthLM.from_pretrained(checkpoint)
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", " ".join(map(str, prompt)),
                 "--max_new_tokens", "10"]) == 0
    out, err = capsys.readouterr()
    assert [int(t) for t in out.split()] == generate(model, prompt, 4, "soft")
    assert "4 tokens fit after the 60-token prompt in the model's context of 64" in err


def test_a_text_longer_than_the_context_keeps_its_end_through_the_server_and_generate(text_server, tmp_path, capsys):
    """How many tokens a text is, neither a client nor the schema can count: a text that does not fit with the
    tokens asked for loses its start (as nanoGPT crops its input), so the schema's text prompt is never refused for
    its length. The ids prompt, which the schema bounds, is still refused past it."""
    context, tokenizer = 256, ByteTokenizer()
    text = "".join(random.Random(0).choice("abcdefgh ,.") for _ in range(300))
    ids = tokenizer.encode(text)
    answer = post(text_server, {"prompt": text, "max_tokens": 8, "temperature": 0}).json()
    assert answer["usage"]["prompt_tokens"] == context - 8
    expected = generate(text_server.model, ids[-(context - 8):], 8, "soft", stop_token_ids=[tokenizer.eos_id])
    generated = [t for t in expected[context - 8:] if t != tokenizer.eos_id]
    assert answer["choices"][0]["text"] == tokenizer.decode(generated)
    chat = post(text_server, {"messages": [{"role": "user", "content": text}], "max_tokens": 8},
                "/v1/chat/completions")
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == context - 8
    checkpoint = save_checkpoint(tmp_path, with_tokenizer=True, max_seq_len=context)
    model = FullBandwidthLM.from_pretrained(checkpoint)
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", text, "--max_new_tokens", "8",
                 "--decode.mode", "standard"]) == 0
    out, err = capsys.readouterr()
    kept = generate(model, ids[-(context - 8):], 8, "standard", stop_token_ids=[tokenizer.eos_id])
    assert out.rstrip("\n") == tokenizer.decode([t for t in kept if t != tokenizer.eos_id])
    assert f"the prompt's first {len(ids) - (context - 8)} of {len(ids)} tokens were dropped" in err


def test_max_completion_tokens_past_the_schemas_maximum_is_refused_and_wins_over_max_tokens(text_server):
    with text_server.client() as client:
        schema = client.get("/openapi.json").json()["components"]["schemas"]["ChatBody"]["properties"]
        chat = {"messages": [{"role": "user", "content": "a"}], "temperature": 0}
        over = client.post("/v1/chat/completions", json={**chat, "max_tokens": 4, "max_completion_tokens": 256})
        both = client.post("/v1/chat/completions", json={**chat, "max_tokens": 2, "max_completion_tokens": 5})
    assert schema["max_completion_tokens"]["maximum"] == 255
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_completion_tokens"
    assert over.json()["error"]["code"] == "integer_above_max_value"
    assert both.json()["usage"]["completion_tokens"] == 5  # the newer field, as OpenAI and vLLM read it


def test_the_retired_prefill_passes_and_a_bare_fused_are_refused_naming_fused_k_as_the_schema_says(server):
    with server.client() as client:
        schema = client.get("/openapi.json").json()["components"]["schemas"]["CompletionBody"]["properties"]
    assert schema["prefill_passes"]["not"] == {} and schema["mode"]["anyOf"][0]["pattern"] == mode_pattern()
    retired = post(server, {"prompt": [1, 2], "mode": "fused", "prefill_passes": 2}).json()["error"]
    assert retired["param"] == "prefill_passes" and '"mode": "fused:K"' in retired["message"]
    bare = post(server, {"prompt": [1, 2], "mode": "fused"}).json()["error"]
    assert bare["param"] == "mode" and "write fused:K" in bare["message"] and bare["code"] == "invalid_value"


def test_a_schemathesis_run_on_a_small_context_with_an_api_key_finds_no_conformance_failure(one_thread):
    """The issue's run, short: the server's own OpenAPI schema, an API key, a 64-token context (so text prompts
    longer than it are drawn), every schemathesis check: no schema-valid request refused (ST202), no invalid one
    accepted, no undocumented status."""
    pytest.importorskip("schemathesis")
    from fullband.serve.fuzz import fuzz_app

    torch.manual_seed(0)
    model = FullBandwidthLM(ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                        max_seq_len=CONTEXT))
    app = create_app(Engine(model, max_batch=4, max_queue=4), ByteTokenizer(), "tiny", Defaults(max_tokens=4),
                     api_key="sk-fuzz")
    began = time.process_time()  # CPU seconds: the run's budget, which a busy machine's wall clock would not keep
    report = fuzz_app(app, examples=40, seed=1, headers={"Authorization": "Bearer sk-fuzz"})
    assert report.failures == [] and dict(report.check_failures) == {}, report.check_examples
    assert report.by_status().get(200, 0) >= 40 and 401 not in report.by_status(), report.by_status()
    assert time.process_time() - began < 60
