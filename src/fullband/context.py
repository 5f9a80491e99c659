"""The one context rule of ``fullband generate`` and ``fullband serve``: how a prompt and the tokens asked for fit a
model's context (its ``max_seq_len`` positions), with one wording and one error code per failure (torch-free).

- The tokens asked for (the server's ``max_tokens``, generate's ``--max_new_tokens``) are at most ``context - 1``,
  what the shortest prompt (one token) leaves; more could never be generated and is refused. Fewer than the minimum
  (1 for a request, 0 for the command) is refused too.
- Token ids are exact: a prompt of more than ``context - 1`` ids is refused (one token must fit after it), and
  generation stops at the context's end (the server's ``finish_reason: length``) when the prompt leaves less room
  than was asked for.
- A text (a completion's text prompt, a chat) is as long as the tokenizer makes it, which neither a client nor the
  server's OpenAPI schema can count before sending it: when it and the tokens asked for do not fit, its beginning is
  dropped so that they do (nanoGPT's sampler crops its input to the context the same way), and the count of
  prompt tokens reported is what the model read.

The error codes are OpenAI's: ``integer_below_min_value``, ``integer_above_max_value`` and
``context_length_exceeded`` (the server's wrong-type answer, ``invalid_type``, comes from its schema).
"""

from __future__ import annotations

from dataclasses import dataclass

from fullband.config import ConfigError


class ContextError(ConfigError):
    """A prompt or a token count that cannot fit; ``field`` names the option, ``code`` is OpenAI's error code."""

    def __init__(self, message: str, field: str, code: str) -> None:
        super().__init__(message, field)
        self.code = code


@dataclass(frozen=True)
class Fit:
    """What runs: the prompt's last ``keep`` tokens, then at most ``new_tokens`` generated ones."""

    keep: int
    new_tokens: int
    dropped: int = 0  # tokens dropped from the start of a text prompt


def check_count(max_tokens: int, context: int, *, minimum: int = 1, cap: int = 0, cap_option: str = "",
                name: str = "max_tokens") -> None:
    """The tokens asked for alone: at least ``minimum``, at most ``cap`` (if set) and ``context - 1``."""
    if max_tokens < minimum:
        raise ContextError(f"{name}={max_tokens} is invalid: must be an integer >= {minimum}", name,
                           "integer_below_min_value")
    if cap and max_tokens > cap:
        raise ContextError(f"{name}={max_tokens} is over this server's limit of {cap} ({cap_option}): ask for at "
                           f"most {cap}", name, "integer_above_max_value")
    if max_tokens > context - 1:
        raise ContextError(f"{name}={max_tokens} is more than the model's context of {context} tokens leaves after a "
                           f"one-token prompt: ask for at most {context - 1}", name, "integer_above_max_value")


def fit_context(prompt_tokens: int, max_tokens: int, context: int, *, text: bool, minimum: int = 1,
                cap: int = 0, cap_option: str = "", name: str = "max_tokens", prompt: str = "prompt") -> Fit:
    """Fit a prompt of ``prompt_tokens`` tokens and ``max_tokens`` more into ``context`` positions (the module
    docstring's rule), or raise :class:`ContextError`. ``text``: the prompt is a text (its start may be dropped), not
    token ids. ``cap``: a lower limit on ``max_tokens`` than the context's (0 = none), set by ``cap_option``.
    ``name`` and ``prompt`` are the options as the caller spells them."""
    check_count(max_tokens, context, minimum=minimum, cap=cap, cap_option=cap_option, name=name)
    if text and prompt_tokens + max_tokens > context:
        keep = context - max_tokens
        return Fit(keep, max_tokens, prompt_tokens - keep)
    if prompt_tokens > context - 1:
        raise ContextError(f"the {prompt} has {prompt_tokens} tokens but the model's context is {context}: shorten it "
                           f"to at most {context - 1} (one token must fit after it)", prompt,
                           "context_length_exceeded")
    return Fit(prompt_tokens, min(max_tokens, context - prompt_tokens))
