"""Between token ids and the text an OpenAI client sees: prompts, chat rendering, streamed text with stop strings.

Without a tokenizer the server speaks token ids: a prompt must be ids and each generated token reads as
``" <id>"`` (as ``fullband generate`` prints them).

Chat template: a tokenizer with its own (a transformers tokenizer that has ``chat_template``) uses it;
every other model gets the plain-text template ``fullband train`` fine-tunes chat models with
(:func:`fullband.data.sft.encode_chat`)::

    <|system|>\\n{content}\\n
    <|user|>\\n{content}\\n
    <|assistant|>\\n{content}<eos>
    ...
    <|assistant|>\\n                  <- the reply is generated from here
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fullband.data.sft import ROLES, encode_chat
from fullband.data.tokenizer import Tokenizer, TransformersTokenizer

# A reply ends at the next turn's header, should the model not stop by itself.
CHAT_STOP = "\n<|user|>"


def token_text(tokenizer: Tokenizer | None, ids: Sequence[int]) -> str:
    if tokenizer is None:
        return "".join(f" {t}" for t in ids)
    return tokenizer.decode(list(ids))


def chat_prompt(tokenizer: Tokenizer | None, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], list[str]]:
    """(prompt ids, extra stop strings) for a chat; messages are already checked to be {role, content}."""
    if tokenizer is None:
        raise ValueError("this checkpoint has no tokenizer, so it cannot render chat messages: use /v1/completions "
                         "with token ids")
    hf = tokenizer.hf_tokenizer if isinstance(tokenizer, TransformersTokenizer) else None
    if hf is not None and getattr(hf, "chat_template", None):
        ids = hf.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"]), []
    unknown = [m["role"] for m in messages if m["role"] not in ROLES]
    if unknown:
        raise ValueError(f"role {unknown[0]!r} is not one of {', '.join(ROLES)}")
    return encode_chat(tokenizer, messages, add_generation_prompt=True).input_ids, [CHAT_STOP]


class TextStream:
    """Generated tokens -> text pieces to send, holding back what may still become a stop string.

    Decodes the whole continuation each time (a byte tokenizer can split a UTF-8 character across tokens).
    """

    def __init__(self, tokenizer: Tokenizer | None, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = ""  # text already handed out
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Take one token; return the new text that is safe to send (sets ``stopped`` at a stop string)."""
        self.ids.append(token_id)
        text = token_text(self.tokenizer, self.ids)
        cut = min((i for s in self.stops if (i := text.find(s, max(len(self.sent) - len(s), 0))) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._advance(text[:cut])
        if text.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
            return ""
        hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return self._advance(text[: len(text) - hold])

    def flush(self) -> str:
        """At the end: whatever was held back (no stop string came)."""
        return "" if self.stopped else self._advance(token_text(self.tokenizer, self.ids))

    def _advance(self, upto: str) -> str:
        if len(upto) <= len(self.sent):
            return ""
        piece, self.sent = upto[len(self.sent) :], upto
        return piece
