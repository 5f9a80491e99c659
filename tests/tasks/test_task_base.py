"""The Task base (fullband.tasks.base): both synthetic tasks draw, write and score examples the same way."""

import json
import random

import pytest

from fullband.tasks.base import Task, write_jsonl
from fullband.tasks.reasoning import ReasoningTask, TracedProblem, prompt, trace
from fullband.tasks.state_tracking import StateTask, make_example


@pytest.mark.parametrize("task", [ReasoningTask("swaps", (3, 5), (1, 2, 0)), ReasoningTask("sum", (4,), (2,), 7),
                                  StateTask("registers", 12), StateTask("completion", 10)])
def test_a_task_scores_its_own_completion_right_and_a_wrong_answer_wrong(task: Task, tmp_path):
    examples = task.examples(20, random.Random(0))
    for e in examples:
        assert task.score(e, task.completion(e))
        wrong = next(c for c in "0123456789abc" if c != task.answer(e))
        assert not task.score(e, task.completion(e)[:-1] + wrong if isinstance(task, ReasoningTask) else wrong)
        assert not task.score(e, "")
    path = write_jsonl(tmp_path / "data.jsonl", map(task.row, examples))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"prompt": task.prompt(e), "completion": task.completion(e)} for e in examples]


def test_the_tasks_text_is_the_modules_text():
    rng = random.Random(3)
    traced = ReasoningTask("swaps", (4,), (2,)).sample(rng)
    assert isinstance(traced, TracedProblem) and traced.stride == 2 and traced.problem.n == 4
    task = ReasoningTask()
    assert task.prompt(traced) == prompt(traced.problem, 2) and task.completion(traced) == trace(traced.problem, 2)
    # The same draws as make_example: a StateTask is the task function behind one interface.
    assert StateTask("memory", 12).sample(random.Random(5)) == make_example("memory", 12, random.Random(5))
