"""The one shape of a synthetic task: random examples, each a prompt and the completion a model should write after
it; the answer read back from a model's output and checked by code; prompt/completion JSONL for ``fullband train``
(SFT, prompt masked)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Generic, TypeVar

from fullband.files import dumps, write_text

E = TypeVar("E")


class Task(ABC, Generic[E]):
    """A synthetic task over examples of type ``E``: subclasses say how to draw one (:meth:`sample`), its text
    (:meth:`prompt`, :meth:`completion`) and its answer (:meth:`answer`, :meth:`parse_answer`)."""

    @abstractmethod
    def sample(self, rng: random.Random) -> E:
        """One random example."""

    @abstractmethod
    def prompt(self, example: E) -> str:
        """The input the model reads."""

    @abstractmethod
    def completion(self, example: E) -> str:
        """What the model should write after the prompt (the training target)."""

    @abstractmethod
    def answer(self, example: E) -> str:
        """The final answer, as :meth:`parse_answer` reads it from a completion."""

    def parse_answer(self, output: str) -> str | None:
        """The final answer in a model's output (the text after the prompt); None if it gives none."""
        return output or None

    def score(self, example: E, output: str) -> bool:
        """Whether ``output`` ends on the right answer."""
        return self.parse_answer(output) == self.answer(example)

    def examples(self, count: int, rng: random.Random) -> list[E]:
        return [self.sample(rng) for _ in range(count)]

    def row(self, example: E) -> dict[str, str]:
        """The SFT row of ``example`` (``fullband train --data.format sft``)."""
        return {"prompt": self.prompt(example), "completion": self.completion(example)}



def write_jsonl(path: Path, rows: Iterable[dict[str, str]]) -> Path:
    """One JSON object a line (the SFT data files of the studies)."""
    write_text(path, "".join(dumps(r, indent=None) + "\n" for r in rows))
    return path
