"""Every answer's error body (OpenAI's), and the guards that answer before a route runs: the body limit (413) and
the API key (401)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fullband.serve.body_limit import BodyLimit, drain
from fullband.serve.schema import APIError, validation_error
from fullband.serve.state import ServerState


def add_error_handlers(app: FastAPI, state: ServerState) -> None:
    """Validation errors (400, not FastAPI's 422), :class:`APIError` and what Starlette answers itself, all in
    OpenAI's error body and counted."""

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, err: RequestValidationError) -> JSONResponse:
        return state.error_response(request, validation_error(err))

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> JSONResponse:
        return state.error_response(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # What Starlette and FastAPI answer themselves (an unknown path, a wrong method, a body that does not parse)
        # gets the same error body as every other answer; its headers (Allow) are kept.
        response = state.error_response(request, APIError(err.status_code, str(err.detail), None))
        response.headers.update(err.headers or {})
        return response


def add_guards(app: FastAPI, state: ServerState) -> None:
    """The body limit, then (added after it, so it runs first: a stranger learns no limits) the API key."""

    async def refuse_body(scope: dict[str, Any], receive: Any, send: Any, size: int) -> None:
        response = state.error_response(Request(scope), APIError(
            413, f"the request body has {size} bytes, over this server's limit of {state.limits.max_body_bytes} "
                 "(fullband serve --max_body_bytes): send a shorter request", None, code="request_too_large"))
        await response(scope, receive, send)

    app.add_middleware(BodyLimit, limit=state.limits.max_body_bytes, refuse=refuse_body)
    if state.api_key is None:
        return
    expected = f"Bearer {state.api_key}".encode()

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Callable[[Request], Any]) -> Any:
        given = request.headers.get("authorization", "").encode()
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        if request.url.path != "/health" and not hmac.compare_digest(given, expected):
            what = "a wrong API key" if given else "no API key"
            await drain(request.receive)  # so that a client sending its body before it reads gets the answer
            return state.error_response(request, APIError(
                401, f"the request carries {what}: send the header `Authorization: Bearer <key>` with the server's "
                     "key", code="invalid_api_key"))
        return await call_next(request)
