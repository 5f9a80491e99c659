"""The server's per-request caps: ``--max_tokens_limit`` (400 naming max_tokens) and ``--max_body_bytes`` (413),
both with OpenAI's error body; the options are checked before anything loads."""

from __future__ import annotations

import pytest
from serve_fixtures import LiveServer, save_checkpoint

from fullband.config import ConfigError
from fullband.serve.app import Limits
from fullband.serve.config import ServeConfig


@pytest.fixture(scope="module")
def capped(tmp_path_factory, one_thread_per_module):
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("caps"), with_tokenizer=False)
    live = LiveServer.native(checkpoint, with_tokenizer=False, limits=Limits(max_tokens=4, max_body_bytes=2048))
    yield live
    live.stop()


def test_max_tokens_over_the_limit_gets_400_naming_the_field(capped):
    with capped.client() as client:
        over = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 5})
        at = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 4, "temperature": 0})
        chat_over = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                              "max_tokens": 9})
    assert over.status_code == 400
    error = over.json()["error"]
    assert error["param"] == "max_tokens" and "limit of 4" in error["message"]
    assert at.status_code == 200 and at.json()["usage"]["completion_tokens"] == 4
    assert chat_over.status_code == 400  # (this checkpoint has no tokenizer, but the cap is checked either way)


def test_a_body_over_the_limit_gets_413(capped):
    with capped.client() as client:
        response = client.post("/v1/completions", json={"prompt": [1] * 3000, "max_tokens": 1})
        small = client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 1})
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and "2048" in error["message"] and "max_body_bytes" in error["message"]
    assert small.status_code == 200


@pytest.mark.parametrize(("options", "field"), [({"max_tokens_limit": -1}, "max_tokens_limit"),
                                                ({"max_tokens_limit": 8, "max_tokens": 16}, "max_tokens"),
                                                ({"max_body_bytes": 10}, "max_body_bytes")])
def test_bad_caps_are_refused_naming_the_field(options, field):
    with pytest.raises(ConfigError, match=f"^{field}="):
        ServeConfig(checkpoint="x", **options)


def test_bfloat16_serving_answers_and_the_weights_are_bfloat16(tmp_path):
    import torch

    from fullband.serve.server import build_app

    checkpoint = save_checkpoint(tmp_path, with_tokenizer=False)
    app = build_app(ServeConfig(checkpoint=str(checkpoint), dtype="bfloat16", device="cpu"))
    assert next(app.state.engine.model.parameters()).dtype == torch.bfloat16
    live = LiveServer(app, None, app.state.engine)
    try:
        with live.client() as client:
            response = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    finally:
        live.stop()


def test_serve_dtype_is_checked():
    with pytest.raises(ConfigError, match=r"^dtype='float16'"):
        ServeConfig(checkpoint="x", dtype="float16")
