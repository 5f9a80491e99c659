"""OpenAI response objects, whole (non-streaming) or chunk by chunk."""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from fullband.data.tokenizer import Tokenizer
from fullband.serve.schema import CommonBody
from fullband.serve.text import token_text


class _Run(Protocol):
    """What a response reads of the HTTP layer's run of a request (fullband.serve.run.RequestRun)."""

    completion_tokens: int


class Builder:
    """OpenAI response objects: whole (non-streaming) or chunk by chunk."""

    def __init__(self, kind: str, model: str, tokenizer: Tokenizer | None, choices: int, prompt_tokens: int,
                 logprobs: bool, body: CommonBody) -> None:
        self.kind, self.model, self.tokenizer = kind, model, tokenizer
        self.chat = kind == "chat.completion"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.logprobs = logprobs
        self.include_usage = bool((getattr(body, "stream_options", None) or {}).get("include_usage"))
        self.text = [""] * choices
        self.lp: list[list[tuple[str, float, list[tuple[str, float]]]]] = [[] for _ in range(choices)]
        self.reason: list[str | None] = [None] * choices
        self.started = [False] * choices

    def _token(self, token_id: int) -> str:
        return token_text(self.tokenizer, [token_id])

    def _entry(self, item: Any) -> tuple[str, float, list[tuple[str, float]]]:
        top = [(self._token(t), lp) for t, lp in (item.top_logprobs or [])]
        return self._token(item.token_id), item.logprob, top

    def add(self, index: int, piece: str, item: Any) -> None:
        self.text[index] += piece
        if isinstance(item, str):
            self.reason[index] = item
        elif item is not None and self.logprobs:
            self.lp[index].append(self._entry(item))

    def _logprobs(self, entries: list[tuple[str, float, list[tuple[str, float]]]]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            def item(token: str, logprob: float) -> dict[str, Any]:
                return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

            return {"content": [{**item(t, lp), "top_logprobs": [item(a, b) for a, b in top]}
                                for t, lp, top in entries]}
        offsets, at = [], 0
        for t, _, _ in entries:
            offsets.append(at)
            at += len(t)
        return {"tokens": [t for t, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [dict(top) for _, _, top in entries], "text_offset": offsets}

    def _usage(self, run: _Run) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": run.completion_tokens,
                "total_tokens": self.prompt_tokens + run.completion_tokens}

    def full(self, run: _Run) -> dict[str, Any]:
        choices = []
        for i, text in enumerate(self.text):
            choice: dict[str, Any] = {"index": i, "logprobs": self._logprobs(self.lp[i]),
                                      "finish_reason": self.reason[i]}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model, "choices": choices,
                "usage": self._usage(run)}

    def chunk(self, index: int, piece: str, item: Any) -> dict[str, Any] | None:
        reason = item if isinstance(item, str) else None
        entries = [self._entry(item)] if self.logprobs and item is not None and not isinstance(item, str) else []
        if not piece and not entries and reason is None and (self.started[index] or not self.chat):
            return None
        choice: dict[str, Any] = {"index": index, "logprobs": self._logprobs(entries) if entries else None,
                                  "finish_reason": reason}
        if self.chat:
            delta: dict[str, Any] = {} if reason is not None else {"content": piece}
            if not self.started[index]:
                delta["role"] = "assistant"
                self.started[index] = True
            choice["delta"] = delta
        else:
            choice["text"] = piece
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def usage_chunk(self, run: _Run) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [],
                "usage": self._usage(run)}
