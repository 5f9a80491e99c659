"""Reasoning problems and their traces at every granularity (fullband.tasks.reasoning)."""

import random

import pytest

from fullband.tasks.reasoning import (
    TRANSPOSITIONS5,
    Problem,
    chance_level,
    count_problems,
    parse_answer,
    prompt,
    random_problem,
    sample_problems,
    trace,
)


def test_traces_at_every_granularity_end_with_the_answer():
    swaps = Problem("swaps", "b", ("b", "a", "c", "a", "c"))  # swaps a-c, b-c, a-b, b-c, a-b: b, c, c, b, a
    assert swaps.states() == ["b", "c", "c", "b", "a"] and swaps.answer == "a"
    assert prompt(swaps, 2) == "bAbBaCcDaEc/2:"
    assert [trace(swaps, s) for s in (1, 2, 3, 4, 0)] == ["AbBcCcDb=a", "BcDb=a", "Cc=a", "Db=a", "=a"]
    sums = Problem("sum", "", ("3", "5", "8", "2", "4"))  # 3, 8, 6, 8, 2 (mod 10)
    assert sums.states() == ["3", "8", "6", "8", "2"] and prompt(sums, 0) == "A3B5C8D2E4/0:"
    assert [trace(sums, s) for s in (1, 2, 0)] == ["A3B8C6D8=2", "B8D8=2", "=2"]
    assert Problem("sum", "", ("4", "3", "2"), modulus=5).states() == ["4", "2", "4"]
    assert parse_answer("BcDb=a") == "a" and parse_answer("b8=3=7x") == "7"
    assert parse_answer("BcDb") is None and parse_answer("Bc=") is None


@pytest.mark.parametrize("family", ["swaps", "swaps5", "sum"])
def test_every_trace_is_answered_right_by_its_own_parser(family):
    rng = random.Random(0)
    for _ in range(200):
        problem = random_problem(family, rng.randint(1, 12), rng, rng.randint(2, 10))
        for stride in (0, 1, 2, 3, 5):
            assert parse_answer(trace(problem, stride)) == problem.answer


def test_five_cups_name_the_two_cups_swapped():
    five = Problem("swaps5", "c", ("ab", "ce", "ad", "de", "bc"))  # c -> c, e, e, d, d
    assert five.states() == ["c", "e", "e", "d", "d"] and five.answer == "d"
    assert prompt(five, 2) == "cAabBceCadDdeEbc/2:"
    assert [trace(five, s) for s in (1, 2, 0)] == ["AcBeCeDd=d", "BeDd=d", "=d"]
    assert count_problems("swaps5", 3) == 5 * 10**3 and count_problems("swaps", 3) == 3**4
    assert [chance_level(f, 5) for f in ("swaps", "swaps5", "sum")] == [1 / 3, 1 / 5, 1 / 5]
    rng = random.Random(0)
    problems = [random_problem("swaps5", 6, rng) for _ in range(300)]
    assert {op for p in problems for op in p.ops} == set(TRANSPOSITIONS5) and len(TRANSPOSITIONS5) == 10
    assert {p.answer for p in problems} == set("abcde")  # the ball reaches every cup
    # The statement parses back one way: an upper-case step name, then exactly two lower-case cups.
    for p in problems[:20]:
        body = p.statement()[1:]
        assert [body[i + 1 : i + 3] for i in range(0, len(body), 3)] == list(p.ops)


def test_sample_problems_holds_out_distinct_five_cup_problems():
    problems = sample_problems("swaps5", range(2, 4), 200, random.Random(0), max_share=0.5)
    assert [sum(p.n == n for p in problems) for n in (2, 3)] == [200, 200] and len(set(problems)) == 400
    assert len(sample_problems("swaps5", range(1, 2), 200, random.Random(0), max_share=0.5)) == 25  # half of 50
