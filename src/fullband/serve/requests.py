"""What the engine takes and gives: requests with their decoding settings, their validation, and the events a
request's listener gets (torch-free)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from fullband.config import ConfigError
from fullband.modes import DecodeOptions, DecodingMode

MAX_TOP_LOGPROBS = 20
# Below this a temperature is greedy: logits / 1e-320 overflow to inf, and the limit T -> 0 of sampling is argmax.
MIN_TEMPERATURE = 1e-5


class RequestError(ValueError):
    """A request the engine cannot run; ``param`` names the offending field."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class QueueFull(RuntimeError):
    """Every batch slot and queue place is taken: try again later (HTTP 429)."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    decode: DecodeOptions  # the mode as the client typed it (standard | soft | fused | fused:K | exact), its sampling
    max_tokens: int
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


def validate_request(request: GenerationRequest, vocab_size: int, context: int) -> None:
    """Raise :class:`RequestError` naming the field for anything a model of ``vocab_size`` ids and ``context``
    positions cannot run."""
    s = request  # its DecodeOptions checked themselves when they were made (decode_options turns that into this)
    if not _is_int(s.max_tokens) or s.max_tokens < 1:
        raise RequestError("max_tokens", f"max_tokens must be an integer >= 1, got {s.max_tokens!r}")
    if s.logprobs is not None and not 0 <= s.logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError("logprobs", f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {s.logprobs!r}")
    prompt = request.prompt_ids
    if len(prompt) == 0:
        raise RequestError("prompt", "the prompt is empty: give at least one token")
    if bad := [t for t in prompt if not (_is_int(t) and 0 <= t < vocab_size)]:
        raise RequestError("prompt", f"token id {bad[0]!r} is out of range: this model's ids are "
                                     f"0..{vocab_size - 1}")
    if len(prompt) >= context:
        raise RequestError("prompt", f"the prompt has {len(prompt)} tokens but the model's context is "
                                     f"{context}: shorten it to at most {context - 1}")
    if len(prompt) + s.max_tokens > context:
        raise RequestError("max_tokens", f"max_tokens={s.max_tokens} is too many: the prompt has {len(prompt)} "
                                         f"tokens and the context is {context}; use at most "
                                         f"{context - len(prompt)}")


def decode_options(defaults: DecodeOptions, **given: object) -> DecodeOptions:
    """A request's decoding: ``defaults`` (the server's [decode]) with the request's own settings (those not None);
    a bad one raises :class:`RequestError` naming it."""
    try:
        return dataclasses.replace(defaults, **{k: v for k, v in given.items() if v is not None})
    except ConfigError as err:
        raise RequestError(err.field, str(err)) from None


def useful_passes(prefill_passes: int, prompt_len: int) -> int:
    """Fused mode's extra prompt passes, capped where they stop changing anything: after 1 + (T - 1) passes a
    T-token prompt is exact (DESIGN.md §2) and every further pass reproduces it, so a request cannot hold the engine
    for millions of passes."""
    return min(prefill_passes, prompt_len - 1)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
