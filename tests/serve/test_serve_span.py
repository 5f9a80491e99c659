"""The server at a recurrence span (issue 53): its engine batches requests of every mode for a model whose state goes
from block 3 into the stream after block 1, each getting the tokens generate() decodes alone."""

import pytest
from conftest import make_model
from serve_fixtures import request, run_engine

from fullband.generation import generate
from fullband.serve.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_the_engine_batches_every_mode_at_a_span_as_generate_decodes_them():
    model = make_model(n_layers=4, feedback_source="layer:3", feedback_target=1, max_seq_len=64)
    jobs = [([5, 17, 3, 44, 8, 21], "standard"), ([9, 2, 33], "soft"), ([1, 2, 3, 4], "exact"),
            ([5, 17, 3, 44], "fused:2"), ([3, 1, 4, 1, 5, 9, 2], "exact")]
    collectors = run_engine(Engine(model, max_batch=len(jobs)), [request(p, m, 6) for p, m in jobs])
    for (prompt, mode), c in zip(jobs, collectors, strict=True):
        assert c.tokens == generate(model, prompt, 6, mode)[len(prompt):], (prompt, mode)
