"""Synthetic multi-step problems whose solutions can be written at several granularities.

A problem is a start state and ``n`` named steps ``A, B, C, ...`` that each update the state; the answer is the
final state. Two families:

- ``swaps`` (the shell game, the default): a ball under one of the cups ``a b c``; each step names the one cup
  it leaves in place and swaps the other two. Composing swaps is inherently sequential (a word problem over
  the permutations of 3 cups), so one forward pass cannot simply add things up. Prompt ``b`` + ``Ab Ba Cc ...``
  (without spaces): the ball starts under b; A swaps a-c, B swaps b-c, C swaps a-b.
- ``swaps5``: the shell game with 5 cups ``a b c d e``. Each step names the two cups it swaps, in alphabetical
  order (10 transpositions, which generate S5: a non-solvable group whose word problem is NC1-complete, so no
  fixed-depth transformer should track it answer-only as n grows). Prompt ``c`` + ``Aab Bce Cad ...`` (without
  spaces): the ball starts under c; A swaps a-b, B swaps c-e (the ball moves to e), C swaps a-d. Every step is
  its upper-case name and exactly two lower-case cups, so the prompt parses one way; states and traces are one
  cup each, as with 3 cups (``Be=e``).
- ``sum``: running sums modulo ``m`` (start 0; each step adds its digit ``0..m-1``). Prompt ``A3B5C8 ...``.
  Addition commutes, so a transformer can total all digits in parallel: a control family, not a hard one.

The prompt ends with the granularity the solution must use, and the solution (trace) follows it::

    prompt       bAbBaCcDaEc/2:          the ball under b, then swaps a-c, b-c, a-b, b-c, a-b; stride 2
    stride 1     AbBcCcDb=a              the state after every step but the last, then = and the answer
    stride 2     BcDb=a                  after every second step
    stride 3     Cc=a                    every third
    stride 0     =a                      answer only

A trace of stride ``s`` writes the states after steps ``s, 2s, ...`` (1-based) before the last, then ``=`` and the
final state. Each written step must apply ``s`` updates to the last written state (the answer step up to
``s``; answer-only all ``n``), so coarser traces are shorter but need more computation per token. The difficulty
of a problem is ``n``. Answers are checked by code (:func:`parse_answer`). :class:`ReasoningTask` is the family
as a :class:`~fullband.tasks.base.Task` (sample, prompt, completion, score).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fullband.tasks.base import Task

FAMILIES = ("swaps", "swaps5", "sum")
STEP_NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CUPS = "abc"
CUPS5 = "abcde"
TRANSPOSITIONS5 = tuple(a + b for i, a in enumerate(CUPS5) for b in CUPS5[i + 1 :])  # "ab", "ac", ... "de"
ANSWER_MARK = "="


@dataclass(frozen=True)
class Problem:
    family: str
    start: str  # start state: a cup (swaps, swaps5), "" (sum: starts at 0)
    ops: tuple[str, ...]  # per step: the cup left in place (swaps), the two cups swapped (swaps5), a digit (sum)
    modulus: int = 10  # sum only

    @property
    def n(self) -> int:
        return len(self.ops)

    def states(self) -> list[str]:
        """The state after every step, as the one character a trace writes."""
        out, state = [], 0 if self.family == "sum" else self.start
        for op in self.ops:
            if self.family == "swaps":  # the ball stays under the cup left in place, else moves to the third cup
                state = state if state == op else next(c for c in CUPS if c not in (state, op))
            elif self.family == "swaps5":  # the ball moves only if its cup is one of the two swapped
                state = op[1] if state == op[0] else op[0] if state == op[1] else state
            else:
                state = (state + int(op)) % self.modulus
            out.append(str(state))
        return out

    @property
    def answer(self) -> str:
        return self.states()[-1]

    def statement(self) -> str:
        return self.start + "".join(STEP_NAMES[i] + op for i, op in enumerate(self.ops))


def prompt(problem: Problem, stride: int) -> str:
    """The question plus the granularity its solution must use (``stride`` 0 = answer only)."""
    return f"{problem.statement()}/{stride}:"


def trace(problem: Problem, stride: int) -> str:
    """The solution written at ``stride`` (see the module docstring), ending with ``=answer``."""
    states = problem.states()
    steps = [] if stride == 0 else range(stride - 1, problem.n - 1, stride)
    return "".join(f"{STEP_NAMES[i]}{states[i]}" for i in steps) + f"{ANSWER_MARK}{states[-1]}"


def parse_answer(text: str) -> str | None:
    """The final answer of a generated trace: the character right after its last ``=`` (None if there is none)."""
    if ANSWER_MARK not in text:
        return None
    tail = text.rsplit(ANSWER_MARK, 1)[1]
    return tail[0] if tail else None


def count_problems(family: str, n: int, modulus: int = 10) -> int:
    if family == "swaps5":
        return len(CUPS5) * len(TRANSPOSITIONS5) ** n
    return len(CUPS) ** (n + 1) if family == "swaps" else modulus**n


def chance_level(family: str, modulus: int = 10) -> float:
    """Accuracy of a uniform guess at the answer: one of the cups, or one of the ``modulus`` sums."""
    return {"swaps": 1 / len(CUPS), "swaps5": 1 / len(CUPS5)}.get(family, 1 / modulus)


def random_problem(family: str, n: int, rng: random.Random, modulus: int = 10) -> Problem:
    if family not in FAMILIES:
        raise ValueError(f"unknown problem family {family!r}: must be one of {FAMILIES}")
    if not 1 <= n <= len(STEP_NAMES):
        raise ValueError(f"problem length must be in 1..{len(STEP_NAMES)}, got {n}")
    if family == "swaps":
        return Problem(family, rng.choice(CUPS), tuple(rng.choice(CUPS) for _ in range(n)))
    if family == "swaps5":
        return Problem(family, rng.choice(CUPS5), tuple(rng.choice(TRANSPOSITIONS5) for _ in range(n)))
    if not 2 <= modulus <= 10:
        raise ValueError(f"modulus must be in 2..10 (one digit per value), got {modulus}")
    return Problem(family, "", tuple(str(rng.randrange(modulus)) for _ in range(n)), modulus)


def sample_problems(
    family: str,
    lengths: range,
    per_length: int,
    rng: random.Random,
    modulus: int = 10,
    exclude: frozenset[Problem] = frozenset(),
    max_share: float = 1.0,
) -> list[Problem]:
    """``per_length`` distinct problems of each length, none in ``exclude``; at most ``max_share`` of all the
    problems of a length, so that a held-out test set leaves problems of every length to train on."""
    problems: list[Problem] = []
    for n in lengths:
        total = count_problems(family, n, modulus)
        wanted = min(per_length, int(max_share * total), total - sum(1 for p in exclude if p.n == n))
        seen: set[Problem] = set()
        while len(seen) < wanted:
            p = random_problem(family, n, rng, modulus)
            if p not in exclude:
                seen.add(p)
        problems.extend(sorted(seen, key=lambda p: (p.start, p.ops)))
    return problems


@dataclass(frozen=True)
class TracedProblem:
    """A problem and the granularity its solution is written at (``stride`` 0 = answer only)."""

    problem: Problem
    stride: int


@dataclass(frozen=True)
class ReasoningTask(Task[TracedProblem]):
    """Problems of ``family`` with ``lengths`` steps, solved at one of ``strides``, as a :class:`Task`."""

    family: str = "swaps"
    lengths: tuple[int, ...] = (4,)
    strides: tuple[int, ...] = (1, 0)
    modulus: int = 10

    def problem(self, rng: random.Random, n: int | None = None) -> Problem:
        """A random problem of ``n`` steps (a random one of ``lengths`` when None)."""
        return random_problem(self.family, rng.choice(self.lengths) if n is None else n, rng, self.modulus)

    def sample(self, rng: random.Random) -> TracedProblem:
        problem = self.problem(rng)
        return TracedProblem(problem, rng.choice(self.strides))

    def prompt(self, example: TracedProblem) -> str:
        return prompt(example.problem, example.stride)

    def completion(self, example: TracedProblem) -> str:
        return trace(example.problem, example.stride)

    def answer(self, example: TracedProblem) -> str:
        return example.problem.answer

    def parse_answer(self, output: str) -> str | None:
        return parse_answer(output)
