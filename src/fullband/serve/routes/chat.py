"""``POST /v1/chat/completions``: messages rendered by the chat template (fullband.serve.text), OpenAI's chat
completion object or its chunks."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from fullband.serve.responses import Builder
from fullband.serve.routes.generation import check_model, generation_responses, respond, start, stop_strings
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
            raise APIError(400, f"messages: {err}", "messages") from None
        if body.max_tokens is None and body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        run = start(state, body, [prompt], stop_strings(body.stop) + extra_stops, logprobs, RENAMED)
        builder = Builder("chat.completion", state.model_name, state.tokenizer, len(run.handles), len(prompt),
                          body.logprobs, body)
        return await respond(state, PATH, request, run, body.stream, builder)
