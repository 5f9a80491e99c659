"""State-tracking tasks and their labels (fullband.tasks.state_tracking)."""

import random

import pytest

from fullband.tasks.state_tracking import FINAL, MAX_DEPTH, TASKS, make_example, num_classes


def recomputed_label(task: str, body: str) -> str:
    if task == "completion":
        depths = [body[: i + 1].count("(") - body[: i + 1].count(")") for i in range(len(body))]
        assert min(depths) >= 0 and max(depths) <= MAX_DEPTH
        return "1" if depths[-1] == 0 else "0"
    if task == "memory":
        (digit,) = [c for c in body if c.isdigit()]
        return digit
    writes = [body[i : i + 2] for i in range(0, len(body) - 1, 2) if body[i] in "abcd"]
    return [w[1] for w in writes if w[0] == "a"][-1]


@pytest.mark.parametrize("task", TASKS)
def test_examples_have_one_length_the_shared_final_token_and_the_right_label(task):
    rng = random.Random(0)
    examples = [make_example(task, 20, rng) for _ in range(300)]
    for e in examples:
        assert len(e.text) == 20 and e.text.endswith(FINAL) and e.text.count(FINAL) == 1
        assert e.label == recomputed_label(task, e.text[1:-1])
        assert 0 <= e.target < num_classes(task)
    counts = {label: sum(e.label == label for e in examples) for label in {e.label for e in examples}}
    assert len(counts) == num_classes(task) and min(counts.values()) > 300 / num_classes(task) / 2


def test_registers_vary_the_number_of_distractor_writes():
    rng = random.Random(1)
    trailing = set()
    for _ in range(200):
        body = make_example("registers", 24, rng).text[1:-1]
        registers = [body[i] for i in range(0, len(body) - 1, 2) if body[i] in "abcd"]
        trailing.add(len(registers) - 1 - max(i for i, r in enumerate(registers) if r == "a"))
    assert trailing == set(range(11))
