"""Lookup-then-compose word problems over S5 and A5 (DESIGN.md §7 "Beyond recurrence"; ``fullband eval-recall``).

Ball tracking as in :mod:`fullband.tasks.word_problems`, but each step is a *name* whose move must be looked up in a
table at the start of the problem, fresh for every problem:

    tokens  [name_1 move_1 ... name_K move_K  SEP  start cup  q_1 ... q_n  END]      (2K + n + 3 tokens)
    labels  [            -  (table, SEP, start cup)           -   c_1 ... c_n]

``q_t`` is one of the table's names (names: opaque tokens from a pool of :data:`NAMES`, unique within a problem;
moves: the group's generators), and the label after ``q_t`` is the ball's cup after the move bound to ``q_t``. So
each step needs attention (read the binding back from the table, which a fixed-size state cannot hold for large K)
and recurrence (compose the moves). Every prefix of a sequence is a problem of its own length, as in the word
problems: one sequence of n = 64 scores n = 1..64.

Variants, with the same tokens and layout:

- ``full``: the above.
- ``compose``: no table (K = 0): one fixed global binding, name i -> generator i mod |G|; composition only, today's
  word problems in other tokens.
- ``lookup``: the table as in ``full``, but the label after ``q_t`` is where the ball goes from the *start cup* under
  ``q_t``'s move alone: lookup only, no composition.

Every token of a test problem occurs in training (the pool's names, the moves, the cups), whatever its K or n.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from fullband.tasks.word_problems import CUPS, IGNORE_INDEX, WordBatch, WordProblems

NAMES = 64  # the pool of name tokens: the largest table holds every name once
VARIANTS = ("full", "compose", "lookup")


@dataclass(frozen=True)
class LookupProblems:
    """Lookup-then-compose problems over ``group`` in one of :data:`VARIANTS`: the vocabulary and random batches.

    Token ids: the cups 0..4 (start tokens and answers), the group's generators (the moves), the :data:`NAMES`
    names, then SEP and END."""

    group: str
    variant: str = "full"
    tables: int = 32  # training tables have 1..tables bindings
    largest: int = NAMES  # the largest table of any problem (the models' context)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if not 1 <= self.tables <= self.largest <= NAMES:
            raise ValueError(f"need 1 <= tables <= largest <= {NAMES}, got tables={self.tables}, "
                             f"largest={self.largest}")

    @cached_property
    def moves(self) -> WordProblems:
        return WordProblems(self.group)

    @property
    def first_move_token(self) -> int:
        return CUPS

    @property
    def first_name_token(self) -> int:
        return CUPS + len(self.moves.generators)

    @property
    def sep_token(self) -> int:
        return self.first_name_token + NAMES

    @property
    def end_token(self) -> int:
        return self.sep_token + 1

    @property
    def vocab_size(self) -> int:
        return self.end_token + 1

    def table_size(self, K: int) -> int:
        """The table's K (no table in the compose-only variant)."""
        return 0 if self.variant == "compose" else K

    def prefix(self, K: int) -> int:
        """Tokens before the start cup: the table and the separator."""
        return 2 * self.table_size(K) + 1

    @property
    def mean_prefix(self) -> float:
        """The mean prefix of a training problem (K uniform in 1..tables)."""
        return sum(self.prefix(K) for K in range(1, self.tables + 1)) / self.tables

    def max_tokens(self, n: int) -> int:
        """Tokens of the longest problem of ``n`` steps (the largest table)."""
        return self.prefix(self.largest) + n + 2

    def training_batch(self, rows: int, n: int, generator: torch.Generator) -> WordBatch:
        """A training batch: one table size K ~ Uniform{1..tables} for the whole batch (drawn first from
        ``generator``, so no row is padded), then :meth:`batch`."""
        K = int(torch.randint(1, self.tables + 1, (1,), generator=generator))
        return self.batch(rows, K, n, generator)

    def batch(self, rows: int, K: int, n: int, generator: torch.Generator) -> WordBatch:
        """``rows`` random problems with tables of ``K`` bindings (names and moves uniform, names distinct within a
        problem) and ``n`` steps, each a name drawn uniformly from the table; drawn from ``generator``."""
        if n < 1:
            raise ValueError(f"a problem needs at least one step, got n={n}")
        if not 1 <= K <= self.largest:
            raise ValueError(f"a table holds 1..{self.largest} bindings here, got K={K}")
        G = len(self.moves.generators)
        starts = torch.randint(0, CUPS, (rows,), generator=generator)
        if self.variant == "compose":
            names = torch.arange(NAMES).expand(rows, NAMES)  # the global binding: name i -> generator i mod G
            bound = names % G
            picks = torch.randint(0, NAMES, (rows, n), generator=generator)
        else:
            names = torch.stack([torch.randperm(NAMES, generator=generator)[:K] for _ in range(rows)])  # (rows, K)
            bound = torch.randint(0, G, (rows, K), generator=generator)
            picks = torch.randint(0, K, (rows, n), generator=generator)  # which binding each step names
        steps = bound.gather(1, picks)  # (rows, n) the generator each step applies
        if self.variant == "lookup":
            cups = self.moves.moves[steps, starts[:, None].expand(rows, n)]
        else:
            cups = self.moves.track(starts, steps)
        query = names.gather(1, picks) + self.first_name_token
        k = self.table_size(K)
        table = torch.stack((names[:, :k] + self.first_name_token, bound[:, :k] + self.first_move_token), dim=2)
        column = torch.full((rows, 1), 0)
        tokens = torch.cat((table.reshape(rows, 2 * k), column + self.sep_token, starts[:, None], query,
                            column + self.end_token), dim=1)
        prefix = self.prefix(K)
        labels = torch.cat((torch.full((rows, prefix + 2), IGNORE_INDEX), cups), dim=1)
        return WordBatch(tokens, labels, starts, steps, cups, prefix)
