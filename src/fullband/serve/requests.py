"""What the engine takes and gives: requests with their decoding settings, their validation, and the events a
request's listener gets (torch-free)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from fullband.config import ConfigError
from fullband.context import ContextError, fit_context
from fullband.modes import DecodeOptions, DecodingMode

MAX_TOP_LOGPROBS = 20


class RequestError(ValueError):
    """A request the engine cannot run; ``param`` names the offending field, ``code`` is OpenAI's error code."""

    def __init__(self, param: str | None, message: str, code: str | None = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class QueueFull(RuntimeError):
    """Every batch slot and queue place is taken: try again later (HTTP 429)."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    decode: DecodeOptions  # the mode as the client typed it (standard | soft | fused:K | exact), its sampling
    max_tokens: int  # at most; generation also stops at the context's end (fullband.context)
    logprobs: int | None = None  # alternatives per token besides the chosen one's log-probability; None = none

    @property
    def decoding(self) -> DecodingMode:
        """The parsed mode."""
        return self.decode.decoding_mode


@dataclass
class TokenEvent:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class FinishEvent:
    reason: str  # "stop" (stop token) | "length" (max_tokens) | "cancelled" | "error"
    error: str | None = None


Event = TokenEvent | FinishEvent
Listener = Callable[[Event], None]


class Handle:
    """What :meth:`Engine.submit` returns: cancel the request (the client went away, a stop string matched)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake  # the engine's loop looks at cancellations when it wakes
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self._wake()


def validate_request(request: GenerationRequest, vocab_size: int, context: int) -> GenerationRequest:
    """``request`` as the engine runs it (its max_tokens cut at the context's end), or :class:`RequestError` naming
    the field for anything a model of ``vocab_size`` ids and ``context`` positions cannot run."""
    s = request  # its DecodeOptions checked themselves when they were made (decode_options turns that into this)
    if not is_int(s.max_tokens):
        raise RequestError("max_tokens", f"max_tokens={s.max_tokens!r} is invalid: must be an integer",
                           "invalid_type")
    if s.logprobs is not None and not 0 <= s.logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError("logprobs", f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {s.logprobs!r}")
    prompt = request.prompt_ids
    if len(prompt) == 0:
        raise RequestError("prompt", "the prompt is empty: give at least one token")
    if bad := [t for t in prompt if not (is_int(t) and 0 <= t < vocab_size)]:
        raise RequestError("prompt", f"token id {bad[0]!r} is out of range: this model's ids are "
                                     f"0..{vocab_size - 1}")
    try:  # the one context rule (fullband.context): token ids, so nothing is dropped
        fit = fit_context(len(prompt), s.max_tokens, context, text=False)
    except ContextError as err:
        raise RequestError(err.field, str(err), err.code) from None
    return dataclasses.replace(request, max_tokens=fit.new_tokens)


def decode_options(defaults: DecodeOptions, **given: object) -> DecodeOptions:
    """A request's decoding: ``defaults`` (the server's [decode]) with the request's own settings (those not None);
    a bad one raises :class:`RequestError` naming it."""
    try:
        return dataclasses.replace(defaults, **{k: v for k, v in given.items() if v is not None})
    except ConfigError as err:
        raise RequestError(err.field, str(err)) from None


def useful_passes(passes: int, prompt_len: int) -> int:
    """A prefill's whole-prompt passes, capped where they stop changing anything: after 1 + (T - 1) passes a
    T-token prompt is exact (DESIGN.md §2) and every further pass reproduces it, so a request cannot hold the engine
    for millions of passes (``fused:1000000000000``)."""
    return min(passes, prompt_len)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
