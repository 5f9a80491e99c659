"""``GET /v1/models``, ``GET /health`` and Prometheus ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest

from fullband.serve.openapi import documented, guarded
from fullband.serve.state import ServerState


def add_info(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models", responses=documented(guarded(state)))
    async def models() -> dict[str, Any]:
        engine = state.engine
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "fullband",
            "max_model_len": int(engine.model.config.max_seq_len), "feedback": engine.model.fuse is not None,
            "default_mode": state.defaults.decode.mode,
        }]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        engine = state.engine
        return {"status": "ok", "model": state.model_name, "active": engine.active, "queued": engine.queue_depth}

    @app.get("/metrics", response_class=PlainTextResponse, responses=documented(guarded(state)))
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(state.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")
