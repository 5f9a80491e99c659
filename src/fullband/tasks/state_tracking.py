"""Synthetic state-tracking tasks (the paper's Figure 7), all ending on the same final token ``?``.

Every sequence has the same length (``length`` tokens, the final ``?`` included), starts with a task letter and
is followed, in training, by its label (one character). Because the final token is shared, its embedding says
nothing about the label: a linear probe at the input layer of the final position can only succeed when the
input there carries state from earlier positions, which plain (standard) prefill never does.

- ``completion`` (``C``): a walk over ``(`` and ``)`` that never closes more than it opened (at most
  ``MAX_DEPTH`` deep). Label: ``1`` if every bracket is closed at the end, else ``0``.
- ``memory`` (``M``, delayed memory): one value digit at a random position among filler letters; the delay
  (fillers after the value) varies. Label: the value.
- ``registers`` (``R``, multi-register latest write): writes ``<register><digit>`` to registers ``a b c d``; the
  last write to ``a`` is followed by a variable number of distractor writes to the others. Label: the digit
  last written to ``a``.

:class:`StateTask` is one of them as a :class:`~fullband.tasks.base.Task`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fullband.tasks.base import Task

TASKS = ("completion", "memory", "registers")
FINAL = "?"
TASK_LETTER = {"completion": "C", "memory": "M", "registers": "R"}
MAX_DEPTH = 4
VALUES = "01234567"  # labels of memory and registers
FILLERS = "xyzw"
REGISTERS = "abcd"


@dataclass(frozen=True)
class Example:
    task: str
    text: str  # the whole input, ending with FINAL
    label: str  # one character

    @property
    def target(self) -> int:
        """Class index of the label."""
        return int(self.label)


def num_classes(task: str) -> int:
    return 2 if task == "completion" else len(VALUES)


def make_example(task: str, length: int, rng: random.Random) -> Example:
    """One random example of ``task`` with ``length`` tokens (task letter ... FINAL)."""
    body = length - 2  # the task letter and the final token
    if task == "completion":
        text, label = _completion(body, rng)
    elif task == "memory":
        text, label = _memory(body, rng)
    elif task == "registers":
        text, label = _registers(body, rng)
    else:
        raise ValueError(f"unknown task {task!r}: must be one of {TASKS}")
    return Example(task, TASK_LETTER[task] + text + FINAL, label)


def _completion(body: int, rng: random.Random) -> tuple[str, str]:
    # Decide the label first so that both classes are equally common; an odd body can never end closed.
    want_closed = body % 2 == 0 and rng.random() < 0.5
    while True:
        depth, chars = 0, []
        for i in range(body):
            left = body - i
            if want_closed and depth >= left:  # must close from here on to end at depth 0
                step = -1
            elif depth == 0:
                step = 1
            elif depth == MAX_DEPTH:
                step = -1
            else:
                step = rng.choice((1, -1))
            depth += step
            chars.append("(" if step == 1 else ")")
        if (depth == 0) == want_closed:
            return "".join(chars), "1" if want_closed else "0"


def _memory(body: int, rng: random.Random) -> tuple[str, str]:
    value = rng.choice(VALUES)
    position = rng.randrange(body)  # the delay is body - 1 - position fillers
    chars = [rng.choice(FILLERS) for _ in range(body)]
    chars[position] = value
    return "".join(chars), value


def _registers(body: int, rng: random.Random) -> tuple[str, str]:
    writes = body // 2
    distractors = rng.randrange(writes)  # writes after the last write to register a
    pairs = [(rng.choice(REGISTERS), rng.choice(VALUES)) for _ in range(writes - distractors - 1)]
    value = rng.choice(VALUES)
    pairs.append(("a", value))
    pairs += [(rng.choice(REGISTERS[1:]), rng.choice(VALUES)) for _ in range(distractors)]
    text = "".join(r + v for r, v in pairs)
    return text + rng.choice(FILLERS) * (body - len(text)), value  # an odd body gets one filler at the end


@dataclass(frozen=True)
class StateTask(Task[Example]):
    """One task of sequences of ``length`` tokens as a :class:`~fullband.tasks.base.Task`: the prompt is the
    sequence, the completion its one-character label."""

    name: str
    length: int

    def sample(self, rng: random.Random) -> Example:
        return make_example(self.name, self.length, rng)

    def prompt(self, example: Example) -> str:
        return example.text

    def completion(self, example: Example) -> str:
        return example.label

    def answer(self, example: Example) -> str:
        return example.label

    def parse_answer(self, output: str) -> str | None:
        return output[:1] or None  # the label is the first character written


def make_examples(tasks: tuple[str, ...], per_task: int, length: int, rng: random.Random) -> list[Example]:
    """``per_task`` examples of each task in turn."""
    return [e for task in tasks for e in StateTask(task, length).examples(per_task, rng)]
