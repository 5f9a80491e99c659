"""The data of ``fullband eval-reasoning``: held-out test problems of every length, the training file (every trace
granularity mixed, test problems excluded) and the models' context length."""

from __future__ import annotations

import random
from pathlib import Path

from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.tasks.base import write_jsonl
from fullband.tasks.reasoning import (
    Problem,
    ReasoningTask,
    TracedProblem,
    prompt,
    random_problem,
    sample_problems,
    trace,
)

TEST_SHARE = 0.5  # at most half of the problems of a length are held out, the rest can be trained on
EXTRA_TOKENS = 8  # decoding budget beyond the reference trace


def task_of(cfg: ReasoningConfig) -> ReasoningTask:
    return ReasoningTask(cfg.family, tuple(range(cfg.min_length, cfg.max_length + 1)), cfg.strides, cfg.modulus)


def unseen_lengths(cfg: ReasoningConfig) -> list[int]:
    """The test lengths outside the trained range (length generalisation)."""
    return sorted(n for n in set(cfg.test_lengths) if not cfg.min_length <= n <= cfg.max_length)


def pass_mix_of(passes: int) -> tuple[float, ...]:
    """The schedule's pass mix (probabilities of 2, 3, ... passes) that always runs ``passes``."""
    return (0.0,) * (passes - 2) + (1.0,)


def train_stride(cfg: ReasoningConfig, rng: random.Random) -> int:
    """A training example's stride: uniform over ``strides``, or answer-only with probability ``answer_share``."""
    if cfg.answer_share is None:
        return rng.choice(cfg.strides)
    return 0 if rng.random() < cfg.answer_share else rng.choice([s for s in cfg.strides if s != 0])


def build_data(cfg: ReasoningConfig, data_dir: Path) -> tuple[list[Problem], Path, Path]:
    """Held-out test problems (trained lengths, then the unseen ``test_lengths``), ``train.jsonl`` (random
    lengths and strides, test problems excluded; shortest problems first under a curriculum) and ``test.jsonl``
    (every test problem of a trained length at every stride; ``test_unseen.jsonl`` the rest)."""
    rng = random.Random(cfg.seed)
    task = task_of(cfg)
    test = sample_problems(cfg.family, range(cfg.min_length, cfg.max_length + 1), cfg.test_per_length, rng,
                           cfg.modulus, max_share=TEST_SHARE)
    held_out = frozenset(test)
    for n in unseen_lengths(cfg):  # never trained on, so nothing to hold out
        test += sample_problems(cfg.family, range(n, n + 1), cfg.test_per_length, rng, cfg.modulus)
    examples = []
    while len(examples) < cfg.train_examples:
        problem = task.problem(rng)
        if problem not in held_out:
            examples.append(TracedProblem(problem, train_stride(cfg, rng)))
    if cfg.curriculum > 0:  # the training file's order is the curriculum's (fullband train --data.curriculum)
        examples.sort(key=lambda e: e.problem.n)
    train_path = write_jsonl(data_dir / "train.jsonl", [task.row(e) for e in examples])
    # test.jsonl (the held-out loss of training) has the trained lengths only: unseen lengths reach positions
    # never trained on, whose loss would swamp it; they go to test_unseen.jsonl.
    def rows(problems: list[Problem]) -> list[dict[str, str]]:
        return [task.row(TracedProblem(p, s)) for p in problems for s in cfg.strides]

    test_path = write_jsonl(data_dir / "test.jsonl", rows([p for p in test if p in held_out]))
    if unseen := [p for p in test if p not in held_out]:
        write_jsonl(data_dir / "test_unseen.jsonl", rows(unseen))
    return test, train_path, test_path


def context_length(cfg: ReasoningConfig) -> int:
    """Tokens of the longest example (prompt + finest trace + end-of-text) plus the decoding slack, rounded up to
    a multiple of 8."""
    longest = random_problem(cfg.family, max((cfg.max_length, *cfg.test_lengths)), random.Random(0), cfg.modulus)
    finest = min((s for s in cfg.strides if s > 0), default=0)
    n = len(prompt(longest, max(cfg.strides))) + len(trace(longest, finest)) + 1 + EXTRA_TOKENS
    return 8 * -(-n // 8)
