"""The server's engine with the static decode step ([decode].step = static, generation/static.py): each request gets
the tokens the eager generate gives it alone."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model
from serve_fixtures import request, run_engine

from fullband.generation import generate
from fullband.serve.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_server_engine_with_the_static_step_gives_each_request_its_tokens_alone():
    """Continuous batching (rows join and leave, so batches are repacked and decoders reused), modes mixed in one
    batch, an exact prompt fed inside the steps: each request's greedy tokens are its eager generate's."""
    model = make_model(dtype=torch.float64, max_seq_len=128)
    jobs = [([5, 17, 3], "standard", 4), ([8, 1, 2, 9, 4, 4], "soft", 9), ([2] * 11, "soft", 6),
            ([3, 1, 4, 1, 5, 9], "exact", 7), ([9, 8, 7, 6], "fused:2", 8)]
    engine = Engine(model, max_batch=3, decode_step="static")
    collectors = run_engine(engine, [request(p, m, n) for p, m, n in jobs])
    for (prompt, mode, n), c in zip(jobs, collectors, strict=True):
        assert c.tokens == generate(model, prompt, n, mode)[len(prompt):], (prompt, mode)
    assert engine._static is not None and engine._static._decoders  # the static path really ran


@pytest.mark.slow
def test_server_engine_with_the_compiled_step_gives_each_request_its_tokens_alone():
    """The same through torch.compile (inductor here; CUDA graphs on a GPU): a graph per batch size the engine
    meets, float32 as served."""
    model = make_model(dtype=torch.float32, max_seq_len=128)
    jobs = [([5, 17, 3], "standard", 4), ([8, 1, 2, 9, 4, 4], "soft", 9), ([2] * 11, "soft", 6)]
    engine = Engine(model, max_batch=2, decode_step="compiled")
    collectors = run_engine(engine, [request(p, m, n) for p, m, n in jobs])
    for (prompt, mode, n), c in zip(jobs, collectors, strict=True):
        assert c.tokens == generate(model, prompt, n, mode)[len(prompt):], (prompt, mode)
