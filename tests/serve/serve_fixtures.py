"""A real server for the serve tests (fixtures the test modules import): uvicorn on a free port in a thread, over a
tiny random checkpoint. Not a conftest.py: the tests import the root conftest by that name."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn

from fullband import FullBandwidthLM, ModelConfig
from fullband.data import ByteTokenizer
from fullband.modes import DecodeOptions
from fullband.serve.app import Defaults, Limits, create_app
from fullband.serve.engine import Engine, FinishEvent, GenerationRequest, TokenEvent

VOCAB = 257  # the byte tokenizer's 256 bytes + eos


class LiveServer:
    """uvicorn serving an app from a thread; ``url`` once it listens, ``stop()`` shuts it down. ``model`` is a
    second copy of the served weights for the references."""

    def __init__(self, app, model, engine: Engine) -> None:
        self.model, self.engine = model, engine
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def native(cls, checkpoint: Path, with_tokenizer: bool, max_batch: int = 8, max_queue: int = 8,
               api_key: str | None = None, limits: Limits | None = None) -> LiveServer:
        # float64: batched and alone agree to the last bit that matters, so no near-tie can flip a greedy token.
        engine = Engine(FullBandwidthLM.from_pretrained(checkpoint, dtype=torch.float64), max_batch=max_batch,
                        max_queue=max_queue)
        tokenizer = ByteTokenizer() if with_tokenizer else None
        app = create_app(engine, tokenizer, "tiny", Defaults(DecodeOptions("soft", temperature=0.0), max_tokens=8),
                         api_key=api_key, limits=limits)
        return cls(app, FullBandwidthLM.from_pretrained(checkpoint, dtype=torch.float64), engine)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def save_checkpoint(directory: Path, with_tokenizer: bool, seed: int = 0, **overrides) -> Path:
    settings = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    settings.update(overrides)
    torch.manual_seed(seed)
    FullBandwidthLM(ModelConfig(**settings)).save_pretrained(directory)
    if with_tokenizer:
        ByteTokenizer().save(directory)
    return directory


@pytest.fixture(scope="module", name="server")
def server_fixture(tmp_path_factory, one_thread_per_module) -> Iterator[LiveServer]:
    """Speaks token ids (no tokenizer): a generated token reads " <id>", so texts map back to ids exactly."""
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("ids"), with_tokenizer=False)
    live = LiveServer.native(checkpoint, with_tokenizer=False)
    yield live
    live.stop()


@pytest.fixture(scope="module", name="text_server")
def text_server_fixture(tmp_path_factory, one_thread_per_module) -> Iterator[LiveServer]:
    """With the byte tokenizer: string prompts, chat, stop strings."""
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("bytes"), with_tokenizer=True, max_seq_len=256)
    live = LiveServer.native(checkpoint, with_tokenizer=True)
    yield live
    live.stop()


def ids_of(text: str) -> list[int]:
    return [int(piece) for piece in text.split()]


@pytest.fixture(scope="module", name="long_server")
def long_server_fixture(tmp_path_factory, one_thread_per_module) -> Iterator[LiveServer]:
    """A long context, so a request can run for seconds (disconnects, a full queue)."""
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("long"), with_tokenizer=False, max_seq_len=4096)
    live = LiveServer.native(checkpoint, with_tokenizer=False, max_batch=1, max_queue=1)
    yield live
    live.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_server(checkpoint: Path, port: int, *options: str):
    """``fullband serve`` as a real subprocess (its own signal handling); :func:`wait_up` waits until it answers."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "fullband.cli", "serve", "--checkpoint", str(checkpoint), "--port", str(port),
         "--log_level", "warning", *options],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_up(url: str, process, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.1)


def wait_until_idle(server: LiveServer, seconds: float = 5.0) -> dict:
    """/health once nothing is active or queued (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        health = httpx.get(server.url + "/health").json()
        if (health["active"] == 0 and health["queued"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.02)


# ---------------------------------------------------------------- the engine without HTTP


class Collector:
    """Events of one request, with the time each came."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.times: list[float] = []
        self.finish: str | None = None
        self.done = threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, TokenEvent):
            self.tokens.append(event.token_id)
            self.logprobs.append(event.logprob)
            self.times.append(time.perf_counter())
        elif isinstance(event, FinishEvent):
            self.finish = event.reason
            self.done.set()


def run_engine(engine: Engine, requests: list[GenerationRequest]) -> list[Collector]:
    """Queue every request before the engine starts, so its first iteration admits them together."""
    collectors = [Collector() for _ in requests]
    engine.submit(requests, collectors)
    engine.start()
    try:
        for c in collectors:
            assert c.done.wait(120)
    finally:
        engine.close()
    return collectors


def request(prompt: list[int], mode: str, max_tokens: int = 6, logprobs: int | None = None):
    return GenerationRequest(tuple(prompt), DecodeOptions(mode), max_tokens, logprobs)
