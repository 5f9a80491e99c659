"""The request bodies of the OpenAI-compatible API (pydantic; they make the OpenAPI schema) and its error body."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from fullband.data.sft import ROLES
from fullband.modes import MODE_PATTERN
from fullband.serve.engine import MAX_TOP_LOGPROBS


def _whole_number(value: Any) -> Any:
    # JSON Schema's integer includes 4.0 (what some clients send for 4); strict validation alone would refuse it.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_whole_number)]
Text = Annotated[str, Field(min_length=1)]  # a prompt with at least one character (an empty one has no token)
Ids = Annotated[list[Int], Field(min_length=1)]


class CommonBody(BaseModel):
    # strict: "5" is not a number; unknown OpenAI fields (user, presence_penalty, ...) are accepted and ignored.
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    # json_schema_extra documents the ranges in the OpenAPI schema; the engine checks them with its own messages.
    max_tokens: Int | None = Field(None, json_schema_extra={"minimum": 1})
    temperature: float | None = Field(None, json_schema_extra={"minimum": 0})
    # None: the server's [decode] setting (by default top_p 1 and top_k 0, both off)
    top_p: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
    top_k: Int | None = Field(None, json_schema_extra={"minimum": 0})
    n: Int = Field(1, ge=1, le=16)
    stream: bool = False
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: Int | None = Field(None, json_schema_extra={"minimum": -(2**63), "maximum": 2**64 - 1})  # torch's seeds
    mode: str | None = Field(None, json_schema_extra={"pattern": MODE_PATTERN})  # standard | soft | fused[:K] | exact
    prefill_passes: Int | None = Field(None, json_schema_extra={"minimum": 0})
    stream_options: dict[str, Any] | None = None


class CompletionBody(CommonBody):
    prompt: Text | Ids | Annotated[list[Text], Field(min_length=1)] | Annotated[list[Ids], Field(min_length=1)]
    logprobs: Int | None = Field(None, json_schema_extra={"minimum": 0, "maximum": MAX_TOP_LOGPROBS})
    echo: bool = Field(False, json_schema_extra={"enum": [False]})  # echoing the prompt is not supported


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    # The plain template's roles, documented in the schema (a model's own chat template may take others).
    role: str = Field(json_schema_extra={"enum": list(ROLES)})
    content: str


class ChatBody(CommonBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, json_schema_extra={"minimum": 1})
    logprobs: bool = False
    # Without logprobs=true it asks for nothing (no log-probabilities are returned).
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), BeforeValidator(_whole_number)] | None = None


# ---------------------------------------------------------------------------------------------- errors


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error answer's body (OpenAI's)."""

    error: ErrorDetail


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(err: RequestValidationError) -> APIError:
    first = err.errors()[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg', '')}", None, code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # A union's failure names the member type last (prompt.str, prompt.list[int].0): keep the field path.
    param = ".".join(p for p in loc if not any(ch in p for ch in "[]") and p not in ("str", "int", "float", "bool")
                     and not p.startswith("constrained-"))
    if not param:
        return APIError(400, f"the request body must be a JSON object: {first.get('msg', '')}", None)
    got = first.get("input")
    shown = json.dumps(got)[:60] if got is not None and first.get("type") != "missing" else ""
    message = f"{param}: {first.get('msg', 'invalid value')}" + (f" (got {shown})" if shown else "")
    return APIError(400, message, param, code="invalid_value")



def document_limits(openapi: dict[str, Any], model_name: str, vocab_size: int, context: int,
                    max_tokens: int) -> None:
    """Write into the app's OpenAPI schema what it accepts of this model: the served model's name, token ids in
    0..vocab_size-1, at most ``context - 1`` of them in a prompt, and ``max_tokens`` at most (a larger one gets 400;
    one beyond the room a prompt leaves in the context generates to its end). A text prompt's length in tokens
    depends on the tokenizer, which a schema cannot say: one past the context gets 400."""
    bodies = openapi.get("components", {}).get("schemas", {})
    for name in ("CompletionBody", "ChatBody"):
        fields = bodies.get(name, {}).get("properties", {})
        fields.get("model", {}).setdefault("anyOf", [{"type": "string"}])[0]["enum"] = [model_name]
        for key in ("max_tokens", "max_completion_tokens"):
            if key in fields:
                fields[key]["maximum"] = max_tokens
    if "prompt" in bodies.get("CompletionBody", {}).get("properties", {}):
        _limit_ids(bodies["CompletionBody"]["properties"]["prompt"], vocab_size, context)


def _limit_ids(node: Any, vocab_size: int, context: int) -> None:
    """Every list of token ids under ``node``: ids in range, at most ``context - 1`` of them."""
    if isinstance(node, list):
        for item in node:
            _limit_ids(item, vocab_size, context)
    elif isinstance(node, dict):
        if node.get("type") == "array" and node.get("items", {}).get("type") == "integer":
            node["maxItems"] = context - 1
            node["items"].update(minimum=0, maximum=vocab_size - 1)
        for value in node.values():
            _limit_ids(value, vocab_size, context)
