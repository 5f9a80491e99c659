"""Word problems over S5 and A5 as ball tracking, one token per step (DESIGN.md §7, ``fullband eval-controls``).

A ball starts under one of five cups; each step applies one generator of the group to the cups and the ball moves
with its cup. The answer after ``n`` steps is the ball's cup.

- ``s5``: the 10 transpositions of two cups (they generate S5, whose word problem is NC1-complete).
- ``a5``: the 20 three-cycles of three cups (they generate A5, the smallest non-solvable group).

Tracking one ball is as hard as the whole word problem: Barrington's programs over A5 tell a 5-cycle from the
identity, and a 5-cycle moves every cup, so one ball's final cup tells them apart; any element of either group is a
product of a bounded number of these generators. No fixed-depth transformer should answer it at every length
(unless TC0 = NC1), while a one-layer RNN can (Merrill et al., "The illusion of state").

A problem of ``n`` steps is one sequence (:class:`WordBatch`)::

    tokens  [start cup, step 1, ..., step n, END]        (n + 2 tokens)
    labels  [  -,        -,      cup after 1, ..., cup after n]

aligned as a language model's labels (position t predicts label t + 1): the token of step t predicts the ball's cup
after step t, so every prefix of a sequence is a problem of its own length and one sequence of length 64 scores
lengths 1..64. ``END`` only holds the last label's place. There are no step names: every length uses the same
tokens (the start cups and the generators), so a longer problem differs from a shorter one in length only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

GROUPS = ("s5", "a5")
CUPS = 5
IGNORE_INDEX = -100


def group_generators(group: str) -> tuple[tuple[int, ...], ...]:
    """The generators of ``group`` as cycles of cups: transpositions (s5) or three-cycles (a5)."""
    if group == "s5":
        return tuple(itertools.combinations(range(CUPS), 2))
    if group == "a5":
        return tuple(cycle for a, b, c in itertools.combinations(range(CUPS), 3) for cycle in ((a, b, c), (a, c, b)))
    raise ValueError(f"unknown group {group!r}: must be one of {GROUPS}")


def apply_cycle(cycle: tuple[int, ...], cup: int) -> int:
    """Where the ball under ``cup`` goes when ``cycle`` moves the cups (each cup of the cycle to the next one)."""
    return cycle[(cycle.index(cup) + 1) % len(cycle)] if cup in cycle else cup


@dataclass(frozen=True)
class WordBatch:
    tokens: torch.Tensor  # (B, prefix + n + 2) int64: [prefix,] start cup, the n steps, END
    labels: torch.Tensor  # (B, prefix + n + 2) int64: IGNORE_INDEX up to the start cup, then the cup after each step
    starts: torch.Tensor  # (B,) the start cups
    steps: torch.Tensor  # (B, n) generator index of each step
    cups: torch.Tensor  # (B, n) the ball's cup after each step
    prefix: int = 0  # tokens before the start cup (a lookup problem's table and separator: tasks.lookup_problems)

    @property
    def length(self) -> int:
        return self.steps.shape[1]

    def to(self, device: torch.device) -> WordBatch:
        """The batch with its tensors on ``device``."""
        return WordBatch(*(t.to(device) for t in (self.tokens, self.labels, self.starts, self.steps, self.cups)),
                         self.prefix)


@dataclass(frozen=True)
class WordProblems:
    """Ball-tracking problems over ``group``: the vocabulary and random batches."""

    group: str

    @cached_property
    def generators(self) -> tuple[tuple[int, ...], ...]:
        return group_generators(self.group)

    @cached_property
    def moves(self) -> torch.Tensor:
        """(generators, CUPS): the cup the ball goes to from each cup under each generator."""
        return torch.tensor([[apply_cycle(g, cup) for cup in range(CUPS)] for g in self.generators])

    # Token ids: the cups 0..4 (start tokens and answers), then the generators, then END.
    @property
    def first_step_token(self) -> int:
        return CUPS

    @property
    def end_token(self) -> int:
        return CUPS + len(self.generators)

    @property
    def vocab_size(self) -> int:
        return self.end_token + 1

    mean_prefix = 0.0  # tokens before the start cup (a lookup problem's table: tasks.lookup_problems)

    def max_tokens(self, n: int) -> int:
        """Tokens of the longest problem of ``n`` steps."""
        return n + 2

    def training_batch(self, rows: int, length: int, generator: torch.Generator) -> WordBatch:
        """A batch of training problems (:meth:`batch`; a lookup problem draws its table size here too)."""
        return self.batch(rows, length, generator)

    def batch(self, rows: int, length: int, generator: torch.Generator) -> WordBatch:
        """``rows`` random problems of ``length`` steps: start cups and steps uniform, drawn from ``generator``."""
        if length < 1:
            raise ValueError(f"a problem needs at least one step, got length={length}")
        starts = torch.randint(0, CUPS, (rows,), generator=generator)
        steps = torch.randint(0, len(self.generators), (rows, length), generator=generator)
        cups = self.track(starts, steps)
        end = torch.full((rows, 1), self.end_token)
        tokens = torch.cat((starts[:, None], steps + self.first_step_token, end), dim=1)
        labels = torch.cat((torch.full((rows, 2), IGNORE_INDEX), cups), dim=1)
        return WordBatch(tokens, labels, starts, steps, cups)

    def track(self, starts: torch.Tensor, steps: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """(B, n): the ball's cup after every step; with ``upto``, steps past the first ``upto`` are ignored (a
        tracker that stops there)."""
        cup, out = starts.clone(), []
        for t in range(steps.shape[1]):
            if upto is None or t < upto:
                cup = self.moves[steps[:, t], cup]
            out.append(cup)
        return torch.stack(out, dim=1)


def answer_logits(logits: torch.Tensor, prefix: int = 0) -> torch.Tensor:
    """(B, prefix + n + 2, V) logits over a batch's tokens -> (B, n, V): the prediction of the cup after each step."""
    return logits[:, prefix + 1 : -1]


def accuracy_by_length(logits: torch.Tensor, batch: WordBatch) -> torch.Tensor:
    """(n,) float64: the share of rows answering the problem of each length 1..n right (argmax over the cups)."""
    answers = answer_logits(logits, batch.prefix)[..., :CUPS].argmax(-1)
    return (answers == batch.cups).double().mean(0)


def floors(problems: WordProblems, batch: WordBatch, tracked_steps: int) -> dict[str, list[float]]:
    """Accuracy of answers that need no model, per length 1..n of ``batch``: the most common answer of that length
    (the best constant), the start cup (the ball never moves), and a tracker that follows the first
    ``tracked_steps`` steps and ignores the rest (what fitting only the trained lengths buys)."""
    cups = batch.cups
    majority = [float(torch.bincount(cups[:, t], minlength=CUPS).max()) / cups.shape[0] for t in range(batch.length)]
    stay = (batch.starts[:, None] == cups).double().mean(0)
    prefix = (problems.track(batch.starts, batch.steps, upto=tracked_steps) == cups).double().mean(0)
    return {"majority": majority, "start cup": stay.tolist(), f"first {tracked_steps} steps": prefix.tolist()}
