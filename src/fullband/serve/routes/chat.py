"""``POST /v1/chat/completions``: messages rendered by the chat template (fullband.serve.text), OpenAI's chat
completion object or its chunks."""

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
from fullband.serve.schema import APIError, ChatBody
from fullband.serve.state import ServerState
from fullband.serve.text import chat_prompt

PATH = "/v1/chat/completions"
# The engine's names for this endpoint's fields, as an error names them.
RENAMED = {"logprobs": "top_logprobs", "prompt": "messages"}


def add_chat(app: FastAPI, state: ServerState) -> None:
    @app.post(PATH, responses=generation_responses(state))
    async def chat(body: ChatBody, request: Request) -> Any:
        check_model(state, body)
        try:
            prompt, extra_stops = chat_prompt(state.tokenizer, [m.model_dump() for m in body.messages])
        except ValueError as err:
            raise APIError(400, f"messages: {err}", "messages", code="invalid_value") from None
        # max_completion_tokens replaces the older max_tokens (OpenAI's, vLLM's precedence); either is checked
        max_tokens = max_tokens_of(state, {"max_tokens": body.max_tokens,
                                           "max_completion_tokens": body.max_completion_tokens})
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        run, prompt_tokens = start(state, body, [Prompt(prompt, text=True)], stop_strings(body.stop) + extra_stops,
                                   logprobs, max_tokens, RENAMED)
        builder = Builder("chat.completion", state.model_name, state.tokenizer, len(run.handles), prompt_tokens,
                          body.logprobs, body)
        return await respond(state, PATH, request, run, body.stream, builder)
