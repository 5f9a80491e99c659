"""The OpenAI-compatible HTTP layer over :class:`~fullband.serve.engine.Engine` (FastAPI).

``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or server-sent events ending with
``data: [DONE]``), ``GET /v1/models``, ``GET /health`` and Prometheus ``GET /metrics``. Extra request fields:
``mode`` (standard | soft | fused | exact), ``prefill_passes`` and ``top_k``. Bad input gets HTTP 400 with
OpenAI's error body naming the field; a full queue gets 429.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.exceptions import HTTPException as StarletteHTTPException

from fullband.data.tokenizer import Tokenizer
from fullband.modes import DecodeOptions
from fullband.serve.body_limit import BodyLimit, drain
from fullband.serve.engine import (
    Engine,
    FinishEvent,
    GenerationRequest,
    QueueFull,
    RequestError,
)
from fullband.serve.requests import decode_options
from fullband.serve.responses import Builder
from fullband.serve.schema import (
    APIError,
    ChatBody,
    CommonBody,
    CompletionBody,
    ErrorBody,
    document_limits,
    validation_error,
)
from fullband.serve.text import TextStream, chat_prompt


@dataclass
class Defaults:
    """What a request that leaves a field out gets (``fullband serve``'s options)."""

    # mode, sampling settings (OpenAI's default temperature), stop ids besides end-of-text
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions(temperature=1.0))
    max_tokens: int = 16


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (``fullband serve``'s options): beyond them it gets a 400 or a 413."""

    max_tokens: int = 0  # largest max_tokens a request may ask for; 0 = only the model's context limits it
    max_body_bytes: int = 1 << 20  # largest request body (by its Content-Length)
    request_timeout: float = 600.0  # seconds from arrival to the last token (queueing included); 0 = no deadline


# ---------------------------------------------------------------------------------------------- one request


class _Run:
    """The engine requests behind one HTTP request (prompts x n choices) and their events on this event loop."""

    def __init__(self, engine: Engine, requests: list[GenerationRequest], tokenizer: Tokenizer | None,
                 stops: list[str], timeout: float = 0.0) -> None:
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout > 0 else None
        loop = asyncio.get_running_loop()
        self.texts = [TextStream(tokenizer, stops) for _ in requests]
        self.finish: list[str | None] = [None] * len(requests)
        self.completion_tokens = 0

        def listener(index: int) -> Callable[[Any], None]:
            return lambda event: loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

        self.handles = engine.submit(requests, [listener(i) for i in range(len(requests))])

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()

    async def events(self, request: Request) -> AsyncIterator[tuple[int, str, Any]]:
        """(choice, text piece, token event or None) as they come, then (choice, text, finish reason) at the end
        of each choice. Raises APIError on an engine error (500), at the deadline (504) and when the engine
        cancelled the request itself (503, shutting down): a cut-short choice never gets a finish reason. Cancels
        everything if the client goes away."""
        watcher = asyncio.create_task(self._watch(request))
        try:
            while any(f is None for f in self.finish):
                index, event = await self._next()
                if index < 0:
                    return  # the client left
                if self.finish[index] is not None:
                    continue  # what comes after a stop string
                text = self.texts[index]
                if isinstance(event, FinishEvent):
                    if event.reason == "error":
                        raise APIError(500, event.error or "generation failed", None, "server_error")
                    if event.reason == "cancelled":  # not by us (we stop listening first): the engine shut down
                        raise APIError(503, "the server shut down before this request finished: retry it", None,
                                       "server_error", "server_shutting_down")
                    self.finish[index] = event.reason
                    yield index, text.flush(), None
                    yield index, "", self.finish[index]
                    continue
                self.completion_tokens += 1
                piece = text.add(event.token_id)
                yield index, piece, event
                if text.stopped:
                    self.handles[index].cancel()
                    self.finish[index] = "stop"
                    yield index, "", "stop"
        finally:
            watcher.cancel()
            self.cancel()  # no-op for finished sequences; frees the slots of a client that left

    async def _next(self) -> tuple[int, Any]:
        """The next event, or APIError 504 once the deadline has passed (the engine frees the slots)."""
        if self.deadline is None:
            return await self.queue.get()
        try:
            return await asyncio.wait_for(self.queue.get(), max(self.deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            self.cancel()
            raise APIError(504, f"the request did not finish within this server's limit of {self.timeout:g} s "
                                "(fullband serve --request_timeout): ask for fewer tokens or retry later", None,
                           "timeout", "request_timeout") from None

    async def _watch(self, request: Request) -> None:
        """Wait for the client to disconnect (the body is already read, so the next ASGI message says so)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.cancel()
        self.queue.put_nowait((-1, None))


# ---------------------------------------------------------------------------------------------- the app


def create_app(
    engine: Engine, tokenizer: Tokenizer | None, model_name: str, defaults: Defaults | None = None,
    api_key: str | None = None, limits: Limits | None = None,
) -> FastAPI:
    """The FastAPI app; it starts ``engine`` on startup and closes it on shutdown. With ``api_key`` every path but
    /health answers 401 unless the request carries ``Authorization: Bearer <api_key>``."""
    defaults, limits = defaults or Defaults(), limits or Limits()
    created = int(time.time())
    registry = CollectorRegistry()
    requests_total = Counter("fullband_requests", "HTTP requests by endpoint and status.", ["endpoint", "status"],
                             registry=registry)
    latency = Histogram("fullband_request_latency_seconds", "Time from request to last token.", ["endpoint"],
                        registry=registry, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
    registry.register(_EngineCollector(engine))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="fullband", lifespan=lifespan)
    app.state.engine = engine
    # The most tokens a request may ask for: the server's cap, else what the context leaves after a one-token prompt.
    max_tokens_allowed = limits.max_tokens or engine.context - 1
    max_tokens_why = "this server's limit" if limits.max_tokens else "what the model's context leaves after the prompt,"

    async def refuse_body(scope: dict[str, Any], receive: Any, send: Any, size: int) -> None:
        response = _error(Request(scope), APIError(
            413, f"the request body has {size} bytes, over this server's limit of {limits.max_body_bytes} (fullband "
                 "serve --max_body_bytes): send a shorter request", None, code="request_too_large"))
        await response(scope, receive, send)

    app.add_middleware(BodyLimit, limit=limits.max_body_bytes, refuse=refuse_body)

    if api_key is not None:  # added after the body limit, so it runs first: a stranger learns no limits
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def authenticate(request: Request, call_next: Callable[[Request], Any]) -> Any:
            given = request.headers.get("authorization", "").encode()
            # compare_digest: the time taken does not tell how much of a guessed key was right.
            if request.url.path != "/health" and not hmac.compare_digest(given, expected):
                what = "a wrong API key" if given else "no API key"
                await drain(request.receive)  # so that a client sending its body before it reads gets the answer
                return _error(request, APIError(401, f"the request carries {what}: send the header "
                                               "`Authorization: Bearer <key>` with the server's key",
                                               code="invalid_api_key"))
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, err: RequestValidationError) -> JSONResponse:
        return _error(request, validation_error(err))

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> JSONResponse:
        return _error(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # What Starlette and FastAPI answer themselves (an unknown path, a wrong method, a body that does not parse)
        # gets the same error body as every other answer; its headers (Allow) are kept.
        response = _error(request, APIError(err.status_code, str(err.detail), None))
        response.headers.update(err.headers or {})
        return response

    def _error(request: Request, err: APIError) -> JSONResponse:
        requests_total.labels(request.url.path, str(err.status)).inc()
        # A full queue drains within a few decoding steps: tell clients to retry soon rather than give up.
        headers = {"Retry-After": "1"} if err.status == 429 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    def start(body: CommonBody, prompts: list[list[int]], stops: list[str], logprobs: int | None,
              renamed: dict[str, str] | None = None) -> _Run:
        max_tokens = body.max_tokens if body.max_tokens is not None else defaults.max_tokens
        if max_tokens > max_tokens_allowed:
            raise APIError(400, f"max_tokens={max_tokens} is over {max_tokens_why} of {max_tokens_allowed}: ask for "
                                f"at most {max_tokens_allowed}", "max_tokens")
        eos = (tokenizer.eos_id,) if tokenizer is not None and tokenizer.eos_id is not None else ()
        try:
            decode = decode_options(defaults.decode, mode=body.mode, prefill_passes=body.prefill_passes,
                                    temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed)
            decode = dataclasses.replace(decode, stop_token_ids=(*eos, *defaults.decode.stop_token_ids))
            seeds = [decode.seed + choice if decode.seed is not None else None for choice in range(body.n)]
            requests = [
                GenerationRequest(
                    tuple(prompt), decode_options(decode, seed=seeds[choice]),
                    # More tokens than the prompt leaves room for in the context: up to its end (finish_reason length).
                    min(max_tokens, max(engine.context - len(prompt), 1)), logprobs,
                )
                for prompt in prompts for choice in range(body.n)
            ]
            return _Run(engine, requests, tokenizer, stops, limits.request_timeout)
        except RequestError as err:
            param = (renamed or {}).get(err.param or "", err.param)  # the field as this endpoint spells it
            raise APIError(400, str(err).replace(f"{err.param}", f"{param}", 1), param) from None
        except QueueFull as err:
            raise APIError(429, str(err), None, "requests", "rate_limit_exceeded") from None

    def check_model(body: CommonBody) -> None:
        if body.model is not None and body.model != model_name:  # as vLLM answers
            raise APIError(404, f"The model `{body.model}` does not exist: this server serves `{model_name}`",
                           "model", code="model_not_found")

    def stop_strings(stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 4:
            raise APIError(400, f"stop: at most 4 stop strings, got {len(stops)}", "stop")
        return stops

    def encode(prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if tokenizer is None:
                raise APIError(400, "prompt: this checkpoint has no tokenizer, so the prompt must be a list of token "
                                    "ids", "prompt")
            return tokenizer.encode(prompt)
        return list(prompt)

    async def respond(endpoint: str, request: Request, run: _Run, stream: bool, builder: Builder) -> Any:
        began = time.perf_counter()

        def done(status: str) -> None:
            requests_total.labels(endpoint, status).inc()
            latency.labels(endpoint).observe(time.perf_counter() - began)

        if stream:
            async def sse() -> AsyncIterator[str]:
                status = "200"
                try:
                    async for index, piece, item in run.events(request):
                        chunk = builder.chunk(index, piece, item)
                        if chunk is not None:
                            yield f"data: {json.dumps(chunk)}\n\n"
                    yield f"data: {json.dumps(builder.usage_chunk(run))}\n\n" if builder.include_usage else ""
                except APIError as err:
                    # The error event ends the stream: no [DONE], so nothing reads a cut-short stream as complete.
                    status = str(err.status)
                    yield f"data: {json.dumps(err.body())}\n\n"
                    return
                finally:
                    done(status)
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            async for index, piece, item in run.events(request):
                builder.add(index, piece, item)
        except APIError as err:
            done(str(err.status))
            raise
        done("200")
        return builder.full(run)

    # What each path may answer, in its OpenAPI schema: every error with OpenAI's error body.
    guarded = {401: "No or a wrong API key (`Authorization: Bearer KEY`)."} if api_key is not None else {}
    generation = _documented({
        200: None, 400: "A field out of range or a request the model cannot run; `param` names the field.",
        404: "`model` names another model than the one served.", 413: "The body is over --max_body_bytes.",
        429: "The queue is full: retry (Retry-After).", 500: "The engine failed.",
        503: "The server shut down before the request finished.", 504: "Past --request_timeout.", **guarded})
    # A stream's events (schemathesis reads an event-stream schema per event): data = a JSON chunk, the error body
    # that ends a cut-short stream, or [DONE].
    event = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
    generation[200]["content"] = {"application/json": {"schema": {"type": "object"}},
                                  "text/event-stream": {"schema": event}}

    @app.post("/v1/completions", responses=generation)
    async def completions(body: CompletionBody, request: Request) -> Any:
        check_model(body)
        if body.echo:
            raise APIError(400, "echo: echoing the prompt is not supported", "echo")
        raw = body.prompt
        prompts = [raw] if isinstance(raw, str) or not raw or isinstance(raw[0], int) else list(raw)
        prompt_ids = [encode(p) for p in prompts]  # type: ignore[arg-type]
        run = start(body, prompt_ids, stop_strings(body.stop), body.logprobs)
        builder = Builder("text_completion", model_name, tokenizer, len(run.handles),
                           sum(len(p) for p in prompt_ids), body.logprobs is not None, body)
        return await respond("/v1/completions", request, run, body.stream, builder)

    @app.post("/v1/chat/completions", responses=generation)
    async def chat(body: ChatBody, request: Request) -> Any:
        check_model(body)
        try:
            prompt, extra_stops = chat_prompt(tokenizer, [m.model_dump() for m in body.messages])
        except ValueError as err:
            raise APIError(400, f"messages: {err}", "messages") from None
        if body.max_tokens is None and body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        run = start(body, [prompt], stop_strings(body.stop) + extra_stops, logprobs,
                    {"logprobs": "top_logprobs", "prompt": "messages"})
        builder = Builder("chat.completion", model_name, tokenizer, len(run.handles), len(prompt),
                           body.logprobs, body)
        return await respond("/v1/chat/completions", request, run, body.stream, builder)

    @app.get("/v1/models", responses=_documented(guarded))
    async def models() -> dict[str, Any]:
        config = engine.model.config
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "fullband",
            "max_model_len": int(config.max_seq_len), "feedback": engine.model.fuse is not None,
            "default_mode": defaults.decode.mode,
        }]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "active": engine.active, "queued": engine.queue_depth}

    @app.get("/metrics", response_class=PlainTextResponse, responses=_documented(guarded))
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    def openapi() -> dict[str, Any]:
        """FastAPI's schema, less its 422 (validation errors answer 400), with this model's limits."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for unused in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(unused, None)
            document_limits(schema, model_name, engine.vocab_size, engine.context, max_tokens_allowed)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _documented(statuses: dict[int, str | None]) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses`` for these statuses: errors (with their description) in OpenAI's error body."""
    return {status: {"description": "OK"} if status < 400 else {"model": ErrorBody, "description": why}
            for status, why in statuses.items()}


class _EngineCollector:
    """Engine gauges and counters, read at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Any:
        e = self.engine
        yield GaugeMetricFamily("fullband_queue_depth", "Requests waiting for a batch slot.", value=e.queue_depth)
        yield GaugeMetricFamily("fullband_batch_size", "Sequences decoding now (the current batch).", value=e.active)
        yield CounterMetricFamily("fullband_engine_steps", "Batched decoding steps.", value=e.steps)
        yield CounterMetricFamily("fullband_engine_rows", "Rows over all steps (mean batch = rows / steps).",
                                  value=e.rows_stepped)
        yield CounterMetricFamily("fullband_generated_tokens", "Tokens generated.", value=e.tokens_generated)
        yield CounterMetricFamily("fullband_prompt_tokens", "Prompt tokens prefilled.", value=e.prompt_tokens)
        yield CounterMetricFamily("fullband_failed_sequences", "Sequences ended by an engine error.", value=e.failed)
        yield CounterMetricFamily("fullband_prefills", "Prefill forwards (one per group of arrivals).",
                                  value=e.prefills)
        yield CounterMetricFamily("fullband_batched_prefills", "Prefill forwards that took several requests at once.",
                                  value=e.batched_prefills)
        yield CounterMetricFamily("fullband_interleaved_prompt_tokens",
                                  "Exact-mode prompt tokens fed inside decoding steps (sequential exact prefill "
                                  "interleaved with the running streams).", value=e.interleaved_prompt_tokens)
        yield CounterMetricFamily("fullband_prefill_chunks", "Exact Jacobi prompt chunks prefilled one per engine "
                                  "iteration, between decoding steps (exact_chunk_size > 1).", value=e.prefill_chunks)
