"""The HTTP edges of ``fullband serve``: oversize bodies answered so every client reads the 413, the served model's
name (404 for another, as vLLM), max_tokens past the context, the OpenAPI schema's statuses and limits, a busy port,
the access log."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import openai
import pytest
from serve_fixtures import VOCAB, save_checkpoint, server_fixture  # noqa: F401 (fixture)

from fullband import FullBandwidthLM
from fullband.cli import main
from fullband.config import ConfigError
from fullband.serve.app import create_app
from fullband.serve.config import ServeConfig
from fullband.serve.engine import Engine
from fullband.serve.server import listen, uvicorn_server

EIGHT_MB = json.dumps({"prompt": "x" * (8 << 20), "max_tokens": 2}).encode()
CONTEXT = 64  # the fixtures' checkpoints: max_seq_len 64, the default --max_body_bytes (1 MiB)


def test_an_8_mb_body_gets_a_413_that_urllib_reads(server):
    request = urllib.request.Request(server.url + "/v1/completions", data=EIGHT_MB,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answer:  # not a connection reset
        urllib.request.urlopen(request, timeout=60)
    assert answer.value.code == 413
    error = json.loads(answer.value.read())["error"]
    assert error["code"] == "request_too_large" and "max_body_bytes" in error["message"]


def test_an_8_mb_body_gets_a_413_that_the_openai_client_reads(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as answer:
        client.completions.create(model="tiny", prompt="x" * (8 << 20), max_tokens=2)
    assert answer.value.status_code == 413 and answer.value.body["code"] == "request_too_large"


def test_a_chunked_body_over_the_limit_gets_413_and_one_under_it_is_served(server):
    def chunks(body: bytes):  # no Content-Length: httpx sends it chunked
        for start in range(0, len(body), 1 << 16):
            yield body[start : start + (1 << 16)]

    with server.client() as client:
        over = client.post("/v1/completions", content=chunks(EIGHT_MB), headers={"Content-Type": "application/json"})
        small = json.dumps({"prompt": [1, 2], "max_tokens": 2, "temperature": 0}).encode()
        under = client.post("/v1/completions", content=chunks(small), headers={"Content-Type": "application/json"})
    assert over.status_code == 413 and over.json()["error"]["code"] == "request_too_large"
    assert under.status_code == 200 and under.json()["usage"]["completion_tokens"] == 2


def test_another_model_name_gets_404_as_vllm_answers(server):
    with server.client() as client:
        other = client.post("/v1/completions", json={"model": "gpt-4", "prompt": [1], "max_tokens": 1})
        chat = client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user",
                                                                                          "content": "x"}]})
        served = client.post("/v1/completions", json={"model": "tiny", "prompt": [1], "max_tokens": 1})
        unnamed = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 1})
        listed = client.get("/v1/models").json()["data"][0]["id"]
    assert other.status_code == 404 and chat.status_code == 404
    error = other.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and "`gpt-4`" in error["message"]
    assert served.status_code == unnamed.status_code == 200 and listed == "tiny"


def test_max_tokens_past_the_context_generates_to_its_end(server):
    with server.client() as client:
        near_end = client.post("/v1/completions", json={"prompt": [1] * 60, "max_tokens": 10, "temperature": 0})
        too_many = client.post("/v1/completions", json={"prompt": [1], "max_tokens": CONTEXT})
    assert near_end.status_code == 200
    assert near_end.json()["usage"]["completion_tokens"] == CONTEXT - 60
    assert near_end.json()["choices"][0]["finish_reason"] == "length"
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
    assert f"at most {CONTEXT - 1}" in too_many.json()["error"]["message"]


def test_the_openapi_schema_documents_every_status_its_error_body_and_the_models_limits(server):
    schema = httpx.get(server.url + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert set(responses) == {"200", "400", "404", "413", "429", "500", "503", "504"}, path  # no 422: 400
        assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
        assert responses["413"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    body = schema["components"]["schemas"]["CompletionBody"]["properties"]
    ids = next(branch for branch in body["prompt"]["anyOf"] if branch.get("items", {}).get("type") == "integer")
    assert (ids["maxItems"], ids["items"]["minimum"], ids["items"]["maximum"]) == (CONTEXT - 1, 0, VOCAB - 1)
    assert body["max_tokens"]["maximum"] == CONTEXT - 1 and body["model"]["anyOf"][0]["enum"] == ["tiny"]


def test_a_busy_port_is_one_line_and_exit_2(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port={port} is in use on 127.0.0.1"):
            listen(ServeConfig(checkpoint="unused", port=port))
        # Answered before the checkpoint is even looked at, as every bad option is.
        assert main(["serve", "--checkpoint", str(tmp_path / "nope"), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"port={port} is in use" in err and "--port" in err


def test_access_log_on_request_logs_every_request(tmp_path, one_thread):
    checkpoint = save_checkpoint(tmp_path, with_tokenizer=False)
    app = create_app(Engine(FullBandwidthLM.from_pretrained(checkpoint), max_batch=2, max_queue=2), None, "tiny")
    # log_level warning: the access log is on all the same (it was asked for)
    server = uvicorn_server(app, ServeConfig(checkpoint=str(checkpoint), port=0, log_level="warning",
                                             access_log=True))
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("uvicorn.access").addHandler(handler)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        assert httpx.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 1}).status_code == 200
        assert httpx.get(url + "/health").status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)
        logging.getLogger("uvicorn.access").removeHandler(handler)
    assert any('"POST /v1/completions HTTP/1.1" 200' in line for line in lines), lines
    assert any('"GET /health HTTP/1.1" 200' in line for line in lines), lines


def test_serve_takes_access_log_and_model_name_options():
    cfg = ServeConfig(checkpoint="x", access_log=True, model_name="served")
    assert cfg.access_log and cfg.model_name == "served"
    with pytest.raises(ConfigError, match="access_log="):
        ServeConfig(checkpoint="x", access_log="sometimes")  # type: ignore[arg-type]



def test_serve_on_port_0_prints_the_address_it_listens_on_once_ready(tmp_path):
    """`fullband serve --port 0` (any free port, as the help and the port-in-use error say) through the CLI: one line
    `listening on http://HOST:PORT` with the port the OS gave, once the server answers; a request to it is served."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    checkpoint = save_checkpoint(tmp_path, with_tokenizer=False)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "fullband.cli", "serve", "--checkpoint", str(checkpoint),
                                "--port", "0", "--log_level", "warning"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 90
        while not lines:
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.05)
        prefix = "fullband serve: listening on http://127.0.0.1:"
        assert lines[0].startswith(prefix), lines
        port = int(lines[0].strip().removeprefix(prefix))
        assert port != 0
        url = f"http://127.0.0.1:{port}"
        answer = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3}, timeout=30)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        reader.join(10)
    assert process.returncode == 0
    assert sum("listening on" in line for line in lines) == 1, lines
