"""The OpenAI-compatible HTTP layer over :class:`~fullband.serve.engine.Engine` (FastAPI).

``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or server-sent events ending with
``data: [DONE]``), ``GET /v1/models``, ``GET /health`` and Prometheus ``GET /metrics``. Extra request fields:
``mode`` (a registered mode's spelling: standard | soft | fused:K | exact) and ``top_k``. Bad input gets HTTP 400
with OpenAI's error body naming the field; a full queue gets 429.

:func:`create_app` only wires the parts together: the state they share (:class:`~fullband.serve.state.ServerState`),
the route groups (:mod:`fullband.serve.routes`: completions, chat, info, errors and guards) and the OpenAPI schema
(:mod:`fullband.serve.openapi`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from fullband.data.tokenizer import Tokenizer
from fullband.serve.engine import Engine
from fullband.serve.openapi import install_openapi
from fullband.serve.routes.chat import add_chat
from fullband.serve.routes.completions import add_completions
from fullband.serve.routes.errors import add_error_handlers, add_guards
from fullband.serve.routes.info import add_info
from fullband.serve.state import Defaults, Limits, Metrics, ServerState

__all__ = ["Defaults", "Limits", "create_app"]


def create_app(
    engine: Engine, tokenizer: Tokenizer | None, model_name: str, defaults: Defaults | None = None,
    api_key: str | None = None, limits: Limits | None = None,
) -> FastAPI:
    """The FastAPI app; it starts ``engine`` on startup and closes it on shutdown. With ``api_key`` every path but
    /health answers 401 unless the request carries ``Authorization: Bearer <api_key>``."""
    state = ServerState(engine, tokenizer, model_name, defaults or Defaults(), limits or Limits(), Metrics(engine),
                        api_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="fullband", lifespan=lifespan)
    app.state.engine = engine
    app.state.server = state
    add_guards(app, state)
    add_error_handlers(app, state)
    add_completions(app, state)
    add_chat(app, state)
    add_info(app, state)
    install_openapi(app, state)
    return app
