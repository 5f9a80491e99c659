"""Lookup-then-compose word problems (fullband.tasks.lookup_problems): the layout of a problem, its labels against
the table read back by hand, names unique within a problem, every test token seen in training, and the two
diagnostic variants."""

import pytest
import torch

from fullband.tasks.lookup_problems import NAMES, LookupProblems
from fullband.tasks.word_problems import IGNORE_INDEX, apply_cycle, group_generators


def _read(problems: LookupProblems, tokens: list[int], K: int) -> tuple[dict[int, int], int, list[int]]:
    """Decode one problem by hand: the binding name -> generator index, the start cup, the steps' names."""
    table = {tokens[2 * i] - problems.first_name_token: tokens[2 * i + 1] - problems.first_move_token
             for i in range(problems.table_size(K))}
    at = problems.prefix(K)
    assert tokens[at - 1] == problems.sep_token and tokens[-1] == problems.end_token
    return table, tokens[at], [t - problems.first_name_token for t in tokens[at + 1 : -1]]


@pytest.mark.parametrize("group", ["s5", "a5"])
def test_labels_are_the_ball_after_each_looked_up_move(group):
    problems = LookupProblems(group)
    generators = group_generators(group)
    batch = problems.batch(8, 5, 7, torch.Generator().manual_seed(0))
    assert batch.tokens.shape == (8, 2 * 5 + 1 + 1 + 7 + 1)  # table, SEP, start cup, steps, END
    for row in range(8):
        tokens, labels = batch.tokens[row].tolist(), batch.labels[row].tolist()
        table, start, names = _read(problems, tokens, 5)
        assert len(table) == 5  # names unique within the problem (a repeated name would collapse the dict)
        cup, expected = start, []
        for name in names:
            assert name in table  # every step names a binding of this problem's table
            cup = apply_cycle(generators[table[name]], cup)
            expected.append(cup)
        prefix = problems.prefix(5)
        assert labels[: prefix + 2] == [IGNORE_INDEX] * (prefix + 2) and labels[prefix + 2 :] == expected
        assert batch.cups[row].tolist() == expected and batch.prefix == prefix


def test_the_diagnostic_variants():
    generators = group_generators("a5")
    lookup = LookupProblems("a5", "lookup").batch(6, 4, 5, torch.Generator().manual_seed(1))
    problems = LookupProblems("a5", "lookup")
    for row in range(6):
        table, start, names = _read(problems, lookup.tokens[row].tolist(), 4)
        assert lookup.cups[row].tolist() == [apply_cycle(generators[table[n]], start) for n in names]  # no composing
    compose = LookupProblems("a5", "compose")
    batch = compose.batch(6, 4, 5, torch.Generator().manual_seed(1))
    assert batch.prefix == 1 and batch.tokens.shape[1] == 5 + 3  # no table: SEP, start, steps, END
    for row in range(6):
        _, start, names = _read(compose, batch.tokens[row].tolist(), 4)
        cup = start
        for name, got in zip(names, batch.cups[row].tolist(), strict=True):  # the global binding name -> i mod |G|
            cup = apply_cycle(generators[name % len(generators)], cup)
            assert got == cup


def test_every_test_token_occurs_in_training():
    problems = LookupProblems("s5", tables=32)
    seen = set()
    generator = torch.Generator().manual_seed(2)
    for _ in range(40):
        seen |= set(problems.training_batch(64, 6, generator).tokens.flatten().tolist())
    test = problems.batch(200, 64, 64, torch.Generator().manual_seed(3))  # a table larger than any trained
    assert set(test.tokens.flatten().tolist()) <= seen
    assert len({t for t in seen if problems.first_name_token <= t < problems.sep_token}) == NAMES
    with pytest.raises(ValueError, match="table holds"):
        problems.batch(1, 65, 3, generator)
