"""Faults of a real ``fullband serve`` subprocess: SIGTERM drains (in-flight requests finish, new ones are refused,
exit 0); kill -9 under load leaves no client with a response marked complete that was cut short, and a restarted
server on the same port serves again."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
from serve_fixtures import free_port, ids_of, save_checkpoint, spawn_server, wait_up


def _refused(url: str) -> bool:
    """A new request is turned away: the connection is refused, or the server answers 503."""
    try:
        return httpx.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 1}, timeout=5).status_code == 503
    except httpx.TransportError:
        return True


def test_sigterm_finishes_the_stream_in_flight_refuses_new_requests_and_exits_0(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "model", with_tokenizer=False, max_seq_len=2048)
    port = free_port()
    process = spawn_server(checkpoint, port, "--decode.mode", "standard", "--graceful_timeout", "60")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, process)
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "model"  # the checkpoint directory's name
        body = {"prompt": [1, 2], "max_tokens": 1500, "temperature": 0, "stream": True}
        with httpx.Client(base_url=url, timeout=60) as client, client.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(lines)
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 20
            while not _refused(url):  # the listening socket closes at once; the stream is still running
                assert time.monotonic() < deadline, "the server kept accepting new requests after SIGTERM"
                time.sleep(0.05)
            assert process.poll() is None, "the server exited before its in-flight request finished"
            rest = [line for line in lines if line]
        chunks = [json.loads(line[6:]) for line in [first, *rest] if line.startswith("data: {")]
        assert rest[-1] == "data: [DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len(ids_of("".join(c["choices"][0]["text"] for c in chunks))) == 1500
        assert process.wait(30) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _stream_until_broken(url: str, outcomes: list, stop: threading.Event) -> None:
    """Stream requests one after another; record each as ("complete", finish_reason, n_tokens) when it ended with
    [DONE], ("error", ...) when it broke off, or ("unmarked", ...) when it ended quietly without [DONE]."""
    body = {"prompt": [3, 1, 4], "max_tokens": 200, "temperature": 0, "stream": True}
    while not stop.is_set():
        lines: list[str] = []
        try:
            with httpx.Client(base_url=url, timeout=30) as client, \
                    client.stream("POST", "/v1/completions", json=body) as r:
                lines = [line for line in r.iter_lines() if line]
        except httpx.TransportError as err:
            outcomes.append(("error", type(err).__name__, len(lines)))
            return
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        tokens = len(ids_of("".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))))
        outcomes.append(("complete" if lines and lines[-1] == "data: [DONE]" else "unmarked", reasons[-1:], tokens))


def test_kill_9_under_load_cuts_no_response_short_as_complete_and_a_restart_serves(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "model", with_tokenizer=False, max_seq_len=512)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    options = ("--decode.mode", "soft", "--max_batch", "4", "--max_queue", "16")
    process = spawn_server(checkpoint, port, *options)
    outcomes: list = []
    stop = threading.Event()
    try:
        wait_up(url, process)
        clients = [threading.Thread(target=_stream_until_broken, args=(url, outcomes, stop)) for _ in range(6)]
        for thread in clients:
            thread.start()
        deadline = time.monotonic() + 60
        while sum(o[0] == "complete" for o in outcomes) < 3:  # under load: some requests have come back whole
            assert time.monotonic() < deadline and process.poll() is None, outcomes
            time.sleep(0.05)
        process.kill()  # SIGKILL: no shutdown code runs
        process.wait(10)
        stop.set()
        for thread in clients:
            thread.join(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not [o for o in outcomes if o[0] == "unmarked"], outcomes
    complete = [o for o in outcomes if o[0] == "complete"]
    assert all(reasons == ["length"] and tokens == 200 for _, reasons, tokens in complete), complete
    assert sum(o[0] == "error" for o in outcomes) == 6, outcomes  # every client was cut off by the kill
    restarted = spawn_server(checkpoint, port, *options)  # the same port: nothing of the old server holds it
    try:
        wait_up(url, restarted)
        response = httpx.post(url + "/v1/completions", json={"prompt": [3, 1, 4], "max_tokens": 5, "temperature": 0})
        assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"
    finally:
        restarted.terminate()
        assert restarted.wait(30) == 0


def test_a_stream_still_running_when_the_grace_ends_is_cut_off_not_marked_complete(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "model", with_tokenizer=False, max_seq_len=4096)
    port = free_port()
    process = spawn_server(checkpoint, port, "--decode.mode", "standard", "--graceful_timeout", "1")
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    try:
        wait_up(url, process)
        body = {"prompt": [1, 2], "max_tokens": 4000, "temperature": 0, "stream": True}
        try:
            with httpx.Client(base_url=url, timeout=60) as client, \
                    client.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                    if len(lines) == 1:
                        process.send_signal(signal.SIGTERM)
        except httpx.TransportError:
            pass  # cut off mid-stream: what a client should see
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "data: [DONE]" not in lines
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks if c.get("choices")), chunks[-1]
    assert len(ids_of("".join(c["choices"][0]["text"] for c in chunks if c.get("choices")))) < 4000
