"""``fullband serve``: load a checkpoint, build the engine and the app, run uvicorn until Ctrl-C / SIGTERM.

uvicorn turns either signal into a graceful shutdown: it stops accepting connections, lets in-flight requests
finish for up to ``graceful_timeout`` seconds, cancels the rest (their slots are freed), then the app's
shutdown closes the engine.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from typing import Any

from fullband.config import ConfigError, install_hint
from fullband.serve.config import LOOPBACK_HOSTS, ServeConfig


def build_app(cfg: ServeConfig) -> Any:
    """The app for ``cfg`` (model, tokenizer and engine loaded; the engine starts with the app)."""
    try:
        from fullband.serve.app import Defaults, Limits, create_app
    except ImportError as err:
        raise ConfigError(f"fullband serve needs FastAPI, uvicorn and prometheus-client: "
                          f"{install_hint('serve')} ({err})") from None
    import torch

    from fullband.devices import resolve_device
    from fullband.families import checkpoint_dir, load_any, load_tokenizer_of
    from fullband.serve.engine import Engine

    # a model argument of any family, as its spec loads it; the KV cache takes the weights' dtype
    model = load_any(cfg.checkpoint, device=resolve_device(cfg.device), dtype=getattr(torch, cfg.dtype))
    tokenizer = load_tokenizer_of(cfg.checkpoint)
    engine = Engine(model, max_batch=cfg.max_batch, max_queue=cfg.max_queue,
                    exact_chunk_size=cfg.decode.exact_chunk_size, interleave_prefill=cfg.interleave_prefill,
                    decode_step=cfg.decode.step)
    name = cfg.model_name or checkpoint_dir(cfg.checkpoint).resolve().name
    defaults = Defaults(cfg.decode, cfg.max_tokens)
    api_key = cfg.resolved_api_key(os.environ)
    if not api_key and cfg.host not in LOOPBACK_HOSTS:
        print(f"fullband serve: warning: listening on {cfg.host} without an API key: anyone who reaches the port can "
              "use the model; give --api_key or set FULLBAND_API_KEY", file=sys.stderr)
    limits = Limits(cfg.max_tokens_limit, cfg.max_body_bytes, cfg.request_timeout)
    return create_app(engine, tokenizer, name, defaults, api_key=api_key or None, limits=limits)


def uvicorn_server(app: Any, cfg: ServeConfig, announce: bool = False) -> Any:
    """uvicorn's server for ``app``; ``announce``: print ``listening on http://HOST:PORT`` once it is ready."""
    import uvicorn

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=cfg.access_log,
                            timeout_graceful_shutdown=cfg.graceful_timeout or None, lifespan="on")
    if cfg.access_log:  # uvicorn gives its access logger the log level: one line per request whatever it says
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            # uvicorn logs its own address line only for sockets it binds itself, and ours is bound before the model
            # loads (run_serve): say where it listens, with the port the OS gave for --port 0, once serving.
            if announce and self.started:
                print(f"fullband serve: listening on {address(self.servers[0].sockets[0])}", flush=True)

    return Server(config)


def address(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a listening socket (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def listen(cfg: ServeConfig) -> socket.socket:
    """The listening socket of ``--host`` and ``--port``, bound before the model loads: a port in use is one line
    and exit status 2 (ConfigError), as every bad option is."""
    try:
        family = socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise ConfigError(f"host={cfg.host!r} is invalid: {err.strerror or err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # what uvicorn sets: a restart binds at once
        sock.bind((cfg.host, cfg.port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(f"port={cfg.port} is in use on {cfg.host}: stop what listens there or pick another "
                              "--port (0 = any free port)") from None
        raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port}: {err.strerror or err}") from None
    return sock


def run_serve(cfg: ServeConfig) -> None:
    sock = listen(cfg)
    try:
        app = build_app(cfg)
        # uvicorn re-raises the signal it shut down for once it is done; after a graceful shutdown SIGTERM then
        # exits with status 0 (Ctrl-C keeps Python's KeyboardInterrupt: the CLI's status 130).
        signal.signal(signal.SIGTERM, _exit_after_shutdown)
        uvicorn_server(app, cfg, announce=True).run(sockets=[sock])  # returns after Ctrl-C / SIGTERM, once shut down
    finally:
        sock.close()


def _exit_after_shutdown(signum: int, frame: object) -> None:
    raise SystemExit(0)
