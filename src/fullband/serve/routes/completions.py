"""``POST /v1/completions``: a text or token-id prompt (or several), OpenAI's completion object or its chunks."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from fullband.serve.responses import Builder
from fullband.serve.routes.generation import check_model, generation_responses, respond, start, stop_strings
from fullband.serve.schema import APIError, CompletionBody
from fullband.serve.state import ServerState

PATH = "/v1/completions"


def add_completions(app: FastAPI, state: ServerState) -> None:
    @app.post(PATH, responses=generation_responses(state))
    async def completions(body: CompletionBody, request: Request) -> Any:
        check_model(state, body)
        if body.echo:
            raise APIError(400, "echo: echoing the prompt is not supported", "echo")
        raw = body.prompt
        prompts = [raw] if isinstance(raw, str) or not raw or isinstance(raw[0], int) else list(raw)
        prompt_ids = [_encode(state, p) for p in prompts]  # type: ignore[arg-type]
        run = start(state, body, prompt_ids, stop_strings(body.stop), body.logprobs)
        builder = Builder("text_completion", state.model_name, state.tokenizer, len(run.handles),
                          sum(len(p) for p in prompt_ids), body.logprobs is not None, body)
        return await respond(state, PATH, request, run, body.stream, builder)


def _encode(state: ServerState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if state.tokenizer is None:
            raise APIError(400, "prompt: this checkpoint has no tokenizer, so the prompt must be a list of token ids",
                           "prompt")
        return state.tokenizer.encode(prompt)
    return list(prompt)
