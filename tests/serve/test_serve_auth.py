"""``fullband serve --api_key``: every endpoint but /health wants ``Authorization: Bearer <key>`` (OpenAI's 401 body
otherwise), the real ``openai`` client authenticates with it, the key may come from FULLBAND_API_KEY, and a server
listening beyond localhost without a key warns."""

from __future__ import annotations

import pytest
from serve_fixtures import LiveServer, save_checkpoint

from fullband.serve.config import API_KEY_ENV, ServeConfig

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def locked(tmp_path_factory, one_thread_per_module):
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("auth"), with_tokenizer=True)
    live = LiveServer.native(checkpoint, with_tokenizer=True, api_key=KEY)
    yield live
    live.stop()


@pytest.mark.parametrize(("headers", "what"), [({}, "no API key"), ({"Authorization": "Bearer sk-wrong"},
                                                                      "a wrong API key"),
                                               ({"Authorization": KEY}, "a wrong API key")])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions", "/metrics", "/openapi.json"])
def test_without_the_key_every_endpoint_but_health_answers_401(locked, headers, what, path):
    with locked.client() as client:
        if path == "/v1/completions":
            response = client.post(path, json={"prompt": "a", "max_tokens": 2}, headers=headers)
        else:
            response = client.get(path, headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert what in error["message"] and "Authorization: Bearer" in error["message"]


def test_with_the_key_requests_succeed_and_health_needs_none(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    with locked.client() as client:
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"
        response = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3}, headers=auth)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3


def test_the_openai_client_authenticates_with_the_key(locked):
    import openai

    good = openai.OpenAI(base_url=f"{locked.url}/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(model="tiny", prompt="ab", max_tokens=2).usage.completion_tokens == 2
    bad = openai.OpenAI(base_url=f"{locked.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_the_key_comes_from_the_flag_or_the_environment():
    assert ServeConfig(checkpoint="x", api_key="k1").resolved_api_key({API_KEY_ENV: "k2"}) == "k1"
    assert ServeConfig(checkpoint="x").resolved_api_key({API_KEY_ENV: "k2"}) == "k2"
    assert ServeConfig(checkpoint="x").resolved_api_key({}) == ""


@pytest.mark.parametrize(("host", "key", "warns"), [("0.0.0.0", "", True), ("0.0.0.0", KEY, False),
                                                    ("127.0.0.1", "", False)])
def test_listening_beyond_localhost_without_a_key_warns(tmp_path, capsys, monkeypatch, host, key, warns):
    from fullband.serve.server import build_app

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    checkpoint = save_checkpoint(tmp_path, with_tokenizer=True)
    build_app(ServeConfig(checkpoint=str(checkpoint), host=host, api_key=key))
    assert ("without an API key" in capsys.readouterr().err) == warns
