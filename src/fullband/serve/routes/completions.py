"""``POST /v1/completions``: a text or token-id prompt (or several), OpenAI's completion object or its chunks."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from fullband.serve.responses import Builder
from fullband.serve.routes.generation import (
    Prompt,
    check_model,
    generation_responses,
    max_tokens_of,
    respond,
    start,
    stop_strings,
)
from fullband.serve.schema import APIError, CompletionBody
from fullband.serve.state import ServerState

PATH = "/v1/completions"


def add_completions(app: FastAPI, state: ServerState) -> None:
    @app.post(PATH, responses=generation_responses(state))
    async def completions(body: CompletionBody, request: Request) -> Any:
        check_model(state, body)
        if body.echo:
            raise APIError(400, "echo: echoing the prompt is not supported", "echo", code="invalid_value")
        raw = body.prompt
        prompts = [raw] if isinstance(raw, str) or not raw or isinstance(raw[0], int) else list(raw)
        run, prompt_tokens = start(state, body, [_encode(state, p) for p in prompts], stop_strings(body.stop),
                                   body.logprobs, max_tokens_of(state, {"max_tokens": body.max_tokens}))
        builder = Builder("text_completion", state.model_name, state.tokenizer, len(run.handles), prompt_tokens,
                          body.logprobs is not None, body)
        return await respond(state, PATH, request, run, body.stream, builder)


def _encode(state: ServerState, prompt: str | list[int]) -> Prompt:
    if isinstance(prompt, str):
        if state.tokenizer is None:
            raise APIError(400, "prompt: this checkpoint has no tokenizer, so the prompt must be a list of token ids",
                           "prompt", code="invalid_value")
        return Prompt(state.tokenizer.encode(prompt), text=True)
    return Prompt(list(prompt), text=False)
