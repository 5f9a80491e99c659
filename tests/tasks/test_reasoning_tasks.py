"""Reasoning problems and their traces at every granularity (fullband.tasks.reasoning)."""

import random

import pytest

from fullband.tasks.reasoning import Problem, parse_answer, prompt, random_problem, trace


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


@pytest.mark.parametrize("family", ["swaps", "sum"])
def test_every_trace_is_answered_right_by_its_own_parser(family):
    rng = random.Random(0)
    for _ in range(200):
        problem = random_problem(family, rng.randint(1, 12), rng, rng.randint(2, 10))
        for stride in (0, 1, 2, 3, 5):
            assert parse_answer(trace(problem, stride)) == problem.answer
