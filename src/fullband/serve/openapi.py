"""The app's OpenAPI schema: what each path may answer (every error in OpenAI's error body), and this model's and
the mode registry's limits written in (schema.document_limits), so that the schema and the server agree."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from fullband.serve.schema import ErrorBody, document_limits
from fullband.serve.state import ServerState


def documented(statuses: dict[int, str | None]) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses`` for these statuses: errors (with their description) in OpenAI's error body."""
    return {status: {"description": "OK"} if status < 400 else {"model": ErrorBody, "description": why}
            for status, why in statuses.items()}


def guarded(state: ServerState) -> dict[int, str | None]:
    """The 401 of a server with an API key, for every path that checks it."""
    return {401: "No or a wrong API key (`Authorization: Bearer KEY`)."} if state.api_key is not None else {}


def install_openapi(app: FastAPI, state: ServerState) -> None:
    """``app.openapi``: FastAPI's schema, less its 422 (validation errors answer 400), with this model's limits;
    made on the first request for it, so a mode registered before that is in it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for unused in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(unused, None)
            document_limits(schema, state.model_name, state.engine.vocab_size, state.engine.context,
                            state.max_tokens_allowed)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
