"""What ``/v1/completions`` and ``/v1/chat/completions`` share: a request's engine requests, and the answer, whole
or streamed."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from fullband.serve.engine import GenerationRequest, QueueFull, RequestError
from fullband.serve.openapi import documented, guarded
from fullband.serve.requests import decode_options
from fullband.serve.responses import Builder
from fullband.serve.run import RequestRun
from fullband.serve.schema import APIError, CommonBody
from fullband.serve.state import ServerState


def check_model(state: ServerState, body: CommonBody) -> None:
    if body.model is not None and body.model != state.model_name:  # as vLLM answers
        raise APIError(404, f"The model `{body.model}` does not exist: this server serves `{state.model_name}`",
                       "model", code="model_not_found")


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4:
        raise APIError(400, f"stop: at most 4 stop strings, got {len(stops)}", "stop")
    return stops


def start(state: ServerState, body: CommonBody, prompts: list[list[int]], stops: list[str], logprobs: int | None,
          renamed: dict[str, str] | None = None) -> RequestRun:
    """The engine requests of ``prompts`` x ``body.n`` choices, submitted, as one run."""
    max_tokens = body.max_tokens if body.max_tokens is not None else state.defaults.max_tokens
    allowed = state.max_tokens_allowed
    if max_tokens > allowed:
        why = "this server's limit" if state.limits.max_tokens else "what the model's context leaves after the prompt,"
        raise APIError(400, f"max_tokens={max_tokens} is over {why} of {allowed}: ask for at most {allowed}",
                       "max_tokens")
    tokenizer, context = state.tokenizer, state.engine.context
    eos = (tokenizer.eos_id,) if tokenizer is not None and tokenizer.eos_id is not None else ()
    try:
        decode = decode_options(state.defaults.decode, mode=body.mode, prefill_passes=body.prefill_passes,
                                temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed)
        decode = dataclasses.replace(decode, stop_token_ids=(*eos, *state.defaults.decode.stop_token_ids))
        seeds = [decode.seed + choice if decode.seed is not None else None for choice in range(body.n)]
        requests = [
            GenerationRequest(
                tuple(prompt), decode_options(decode, seed=seeds[choice]),
                # More tokens than the prompt leaves room for in the context: up to its end (finish_reason length).
                min(max_tokens, max(context - len(prompt), 1)), logprobs,
            )
            for prompt in prompts for choice in range(body.n)
        ]
        return RequestRun(state.engine, requests, tokenizer, stops, state.limits.request_timeout)
    except RequestError as err:
        param = (renamed or {}).get(err.param or "", err.param)  # the field as this endpoint spells it
        raise APIError(400, str(err).replace(f"{err.param}", f"{param}", 1), param) from None
    except QueueFull as err:
        raise APIError(429, str(err), None, "requests", "rate_limit_exceeded") from None


async def respond(state: ServerState, endpoint: str, request: Request, run: RequestRun, stream: bool,
                  builder: Builder) -> Any:
    """The answer: the whole response, or server-sent events ending with ``data: [DONE]`` (or with the error that
    cut the run short)."""
    began = time.perf_counter()

    def done(status: str) -> None:
        state.metrics.answered(endpoint, status)
        state.metrics.latency.labels(endpoint).observe(time.perf_counter() - began)

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


def generation_responses(state: ServerState) -> dict[int | str, dict[str, Any]]:
    """What a generation path may answer, in its OpenAPI schema: every error with OpenAI's error body."""
    responses = documented({
        200: None, 400: "A field out of range or a request the model cannot run; `param` names the field.",
        404: "`model` names another model than the one served.", 413: "The body is over --max_body_bytes.",
        429: "The queue is full: retry (Retry-After).", 500: "The engine failed.",
        503: "The server shut down before the request finished.", 504: "Past --request_timeout.", **guarded(state)})
    # A stream's events (schemathesis reads an event-stream schema per event): data = a JSON chunk, the error body
    # that ends a cut-short stream, or [DONE].
    event = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
    responses[200]["content"] = {"application/json": {"schema": {"type": "object"}},
                                 "text/event-stream": {"schema": event}}
    return responses
