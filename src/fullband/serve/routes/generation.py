"""What ``/v1/completions`` and ``/v1/chat/completions`` share: a request's prompts fitted to the context
(:mod:`fullband.context`), its engine requests, and the answer, whole or streamed."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from fullband.context import ContextError, Fit, check_count, fit_context
from fullband.serve.engine import GenerationRequest, QueueFull, RequestError
from fullband.serve.openapi import documented, guarded
from fullband.serve.requests import decode_options
from fullband.serve.responses import Builder
from fullband.serve.run import RequestRun
from fullband.serve.schema import APIError, CommonBody
from fullband.serve.state import ServerState

CAP_OPTION = "fullband serve --max_tokens_limit"


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt of a request: its token ids, and whether they came from a text (whose start may be dropped to
    fit the context, fullband.context) rather than ids."""

    ids: list[int]
    text: bool


def check_model(state: ServerState, body: CommonBody) -> None:
    if body.model is not None and body.model != state.model_name:  # as vLLM answers
        raise APIError(404, f"The model `{body.model}` does not exist: this server serves `{state.model_name}`",
                       "model", code="model_not_found")


def check_retired(body: CommonBody) -> None:
    """A field the API no longer takes, refused in one line naming what replaced it (the schema forbids it)."""
    if body.prefill_passes is not None:
        raise APIError(400, 'prefill_passes is retired: the pass count is part of the mode, send "mode": "fused:K" '
                            '(e.g. "fused:2")', "prefill_passes", code="invalid_value")


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4:
        raise APIError(400, f"stop: at most 4 stop strings, got {len(stops)}", "stop", code="invalid_value")
    return stops


def max_tokens_of(state: ServerState, given: dict[str, int | None]) -> tuple[int, str]:
    """(the tokens asked for, the field that asked): the last given of ``given`` (field -> value, in order of
    precedence, lowest first; each given one is checked), else the server's default, within the allowed count."""
    asked = [(value, name) for name, value in given.items() if value is not None]
    for value, name in asked:  # each field given is checked, the one that wins and the others
        try:
            check_count(value, state.engine.context, cap=state.limits.max_tokens, cap_option=CAP_OPTION, name=name)
        except ContextError as err:
            raise APIError(400, str(err), err.field, code=err.code) from None
    if asked:
        return asked[-1]
    return min(state.defaults.max_tokens, state.max_tokens_allowed), next(iter(given))


def fit(state: ServerState, prompt: Prompt, max_tokens: int, name: str, prompt_field: str = "prompt") -> Fit:
    """fullband.context's rule for one prompt, its refusal as a 400 naming the field."""
    try:
        return fit_context(len(prompt.ids), max_tokens, state.engine.context, text=prompt.text,
                           cap=state.limits.max_tokens, cap_option=CAP_OPTION, name=name, prompt=prompt_field)
    except ContextError as err:
        raise APIError(400, str(err), err.field, code=err.code) from None


def start(state: ServerState, body: CommonBody, prompts: Sequence[Prompt], stops: list[str], logprobs: int | None,
          max_tokens: tuple[int, str], renamed: dict[str, str] | None = None) -> tuple[RequestRun, int]:
    """The engine requests of ``prompts`` x ``body.n`` choices, submitted -> (their run, the prompt tokens read)."""
    renamed = renamed or {}
    check_retired(body)
    fits = [fit(state, p, max_tokens[0], max_tokens[1], renamed.get("prompt", "prompt")) for p in prompts]
    tokenizer = state.tokenizer
    eos = (tokenizer.eos_id,) if tokenizer is not None and tokenizer.eos_id is not None else ()
    try:
        decode = decode_options(state.defaults.decode, mode=body.mode, temperature=body.temperature,
                                top_p=body.top_p, top_k=body.top_k, seed=body.seed)
        decode = dataclasses.replace(decode, stop_token_ids=(*eos, *state.defaults.decode.stop_token_ids))
        seeds = [decode.seed + choice if decode.seed is not None else None for choice in range(body.n)]
        requests = [
            GenerationRequest(tuple(p.ids[len(p.ids) - f.keep :]), decode_options(decode, seed=seeds[choice]),
                              f.new_tokens, logprobs)
            for p, f in zip(prompts, fits, strict=True) for choice in range(body.n)
        ]
        run = RequestRun(state.engine, requests, tokenizer, stops, state.limits.request_timeout)
    except RequestError as err:
        param = renamed.get(err.param or "", err.param)  # the field as this endpoint spells it
        raise APIError(400, str(err).replace(f"{err.param}", f"{param}", 1), param, code=err.code) from None
    except QueueFull as err:
        raise APIError(429, str(err), None, "requests", "rate_limit_exceeded") from None
    return run, sum(f.keep for f in fits)


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
