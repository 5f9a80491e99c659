"""The request bodies of the OpenAI-compatible API (pydantic; they make the OpenAPI schema) and its error body."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from fullband.data.sft import ROLES
from fullband.modes import mode_pattern
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
    # Any integer, read modulo 2**64 as torch reads a seed (fullband.modes.torch_seed); choice i of n draws with
    # seed + i. No bounds: a bound near 2**63 or 2**64 reads differently as a decimal and as a float.
    seed: Int | None = None
    mode: str | None = None  # a registered mode's spelling; its pattern is the registry's (document_limits)
    # Retired (the count is in the mode: fused:K): read only to refuse it in one line; the schema forbids it.
    prefill_passes: SkipJsonSchema[Any] = None
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
    kind = str(first.get("type", ""))
    # A union's failure names the member type last (prompt.str, prompt.list[int].0): keep the field path.
    param = ".".join(p for p in loc if not any(ch in p for ch in "[]") and p not in ("str", "int", "float", "bool")
                     and not p.startswith("constrained-"))
    if not param:
        return APIError(400, f"the request body must be a JSON object: {first.get('msg', '')}", None)
    got = first.get("input")
    shown = json.dumps(got)[:60] if got is not None and first.get("type") != "missing" else ""
    message = f"{param}: {first.get('msg', 'invalid value')}" + (f" (got {shown})" if shown else "")
    return APIError(400, message, param, code=_CODES.get(kind, "invalid_type" if kind.endswith(("_type", "_parsing"))
                                                         else "invalid_value"))


# pydantic's error types -> OpenAI's error codes (a wrong type is invalid_type, as "5" for an integer)
_CODES = {"missing": "missing_required_parameter", "greater_than_equal": "integer_below_min_value",
          "greater_than": "integer_below_min_value", "less_than_equal": "integer_above_max_value",
          "less_than": "integer_above_max_value"}



def document_limits(openapi: dict[str, Any], model_name: str, vocab_size: int, context: int,
                    max_tokens: int) -> None:
    """Write into the app's OpenAPI schema what it accepts of this model and of the registered decoding modes, so
    that the schema and the server agree (fullband.context has the rule): the served model's name, token ids in
    0..vocab_size-1, at most ``context - 1`` of them in a prompt, ``max_tokens`` (and ``max_completion_tokens``) at
    most ``max_tokens`` (a larger one gets 400; one beyond the room a prompt leaves in the context generates to its
    end), the modes' spellings, and the retired ``prefill_passes`` forbidden. A text prompt's length in tokens is the
    tokenizer's, which a schema cannot say: the server drops its start when it does not fit."""
    bodies = openapi.get("components", {}).get("schemas", {})
    for name in ("CompletionBody", "ChatBody"):
        fields = bodies.get(name, {}).get("properties", {})
        fields.get("model", {}).setdefault("anyOf", [{"type": "string"}])[0]["enum"] = [model_name]
        for key in ("max_tokens", "max_completion_tokens"):
            if key in fields:
                fields[key]["maximum"] = max_tokens
        if "mode" in fields:
            fields["mode"]["anyOf"][0]["pattern"] = mode_pattern()
            fields["prefill_passes"] = {"not": {}, "description": 'Retired: the count is part of the mode ("fused:K").'}
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
