"""Ball-tracking word problems over S5 and A5: generators, the token layout, the labels against a tracker written
out here, every test token seen in training, and the floors."""

import itertools

import pytest
import torch

from fullband.tasks.word_problems import (
    CUPS,
    IGNORE_INDEX,
    WordProblems,
    accuracy_by_length,
    apply_cycle,
    floors,
    group_generators,
)


def permutation(cycle: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(apply_cycle(cycle, cup) for cup in range(CUPS))


def closure(generators: list[tuple[int, ...]]) -> set[tuple[int, ...]]:
    """Every product of the generators' permutations (the group they generate)."""
    group = {tuple(range(CUPS))}
    frontier = list(group)
    while frontier:
        p = frontier.pop()
        for g in generators:
            q = tuple(g[p[i]] for i in range(CUPS))
            if q not in group:
                group.add(q)
                frontier.append(q)
    return group


def sign(p: tuple[int, ...]) -> int:
    return (-1) ** sum(p[i] > p[j] for i, j in itertools.combinations(range(CUPS), 2))


@pytest.mark.parametrize(("group", "count", "order"), [("s5", 10, 120), ("a5", 20, 60)])
def test_generators_generate_the_group(group, count, order):
    perms = [permutation(c) for c in group_generators(group)]
    assert len(set(perms)) == count
    assert len(closure(perms)) == order
    if group == "a5":
        assert all(sign(p) == 1 for p in perms)  # three-cycles are even: A5, not S5


def test_apply_cycle_moves_the_ball_with_its_cup():
    assert apply_cycle((0, 3), 0) == 3 and apply_cycle((0, 3), 3) == 0 and apply_cycle((0, 3), 2) == 2
    assert [apply_cycle((1, 4, 2), c) for c in range(CUPS)] == [0, 4, 1, 3, 2]


@pytest.mark.parametrize("group", ["s5", "a5"])
def test_batch_layout_and_labels_follow_the_ball(group):
    problems = WordProblems(group)
    batch = problems.batch(16, 7, torch.Generator().manual_seed(3))
    assert batch.tokens.shape == batch.labels.shape == (16, 9)
    assert (batch.labels[:, :2] == IGNORE_INDEX).all()
    assert (batch.tokens[:, -1] == problems.end_token).all()
    for row in range(16):
        cup = int(batch.tokens[row, 0])
        assert cup < CUPS
        for t in range(1, 8):
            cycle = problems.generators[int(batch.tokens[row, t]) - problems.first_step_token]
            cup = apply_cycle(cycle, cup)
            assert int(batch.labels[row, t + 1]) == cup == int(batch.cups[row, t - 1])


@pytest.mark.parametrize("group", ["s5", "a5"])
def test_every_test_token_occurs_in_training(group):
    """Unseen lengths differ from training in length only (DESIGN.md §7): no step names, one alphabet."""
    problems = WordProblems(group)
    train = set()
    for step in range(20):
        train |= set(problems.batch(64, 6, torch.Generator().manual_seed(step)).tokens.unique().tolist())
    test = set(problems.batch(200, 64, torch.Generator().manual_seed(99)).tokens.unique().tolist())
    assert test <= train
    assert train == set(range(problems.vocab_size))


def test_accuracy_by_length_reads_the_position_of_each_step():
    problems = WordProblems("s5")
    batch = problems.batch(8, 5, torch.Generator().manual_seed(0))
    logits = torch.zeros(8, 7, problems.vocab_size)
    logits[:, 1:-1].scatter_(2, batch.cups[..., None], 1.0)  # right at every length
    logits[:3, 4, :] = 0
    logits[:3, 4, (batch.cups[:3, 3] + 1) % CUPS] = 1.0  # wrong at length 4 in 3 rows
    assert accuracy_by_length(logits, batch).tolist() == [1, 1, 1, 5 / 8, 1]


def test_floors():
    problems = WordProblems("a5")
    batch = problems.batch(400, 10, torch.Generator().manual_seed(1))
    f = floors(problems, batch, tracked_steps=4)
    assert f["first 4 steps"][:4] == [1.0] * 4 and f["first 4 steps"][9] < 0.6
    # A three-cycle leaves a given cup in place 2 times in 5: after one step the ball stays with probability 0.4.
    assert abs(f["start cup"][0] - 0.4) < 0.08
    assert all(1 / CUPS <= m <= 1 for m in f["majority"])
