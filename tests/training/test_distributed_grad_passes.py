"""Truncated gradients (train.grad_passes) under DDP and FSDP2: two gloo processes train like one process.

Two regimes, each trained by one process, by DDP and by FSDP on the same global batches (one spawn runs all four
distributed trainings):
- ``fixed``: no prefix mixin and more passes than the exact count, so the gradient passes start from the
  sequentially computed fixed point (a nested forward inside the wrapped forward);
- ``mixed``: a random plain prefix per row, so the pass count (capped at the global batch's exact count) and the
  choice of the loop over the fixed point must be made for the global batch: each process's single row would
  alone choose the fixed point and fewer passes;
- ``span``: ``mixed`` for a model whose state goes from block 3 into the stream after block 1 (issue 53), its
  packed rows restarting the recurrence at each document (``train.restart_at_documents``).
"""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import make_model

from fullband import FullBandwidthLM
from fullband.training import Trainer
from fullband.training.checkpoint_layout import checkpoint_path
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training.distributed import wrap_ddp, wrap_fsdp

GLOBAL_ROWS, T, STEPS, GRAD_PASSES = 4, 10, 3, 2
REGIMES = {"fixed": False, "mixed": True, "span": True}  # regime -> prefix_mixin
SEPARATOR = 3  # the end-of-text id between packed documents (regime span)
KEYS = ("step", "passes", "tokens", "objective", "pass_losses", "grad_norm")


def rank_rows(step: int, rank: int, world_size: int):
    """This rank's contiguous share of the global batch of ``step`` (rank 0 of 1 gets all of it)."""
    tokens = torch.randint(0, 61, (GLOBAL_ROWS, T), generator=torch.Generator().manual_seed(step))
    tokens[0, 4] = tokens[2, 6] = SEPARATOR  # a document starts in a row of each process
    rows = GLOBAL_ROWS // world_size
    share = tokens[rank * rows : (rank + 1) * rows]
    return share, share.clone()


def make_trainer(out: Path, rank: int, world_size: int, regime: str, parallel: str = "ddp") -> Trainer:
    # 2 processes x 1 row x 2 micro-batches == 1 process x 4 rows: the same global batch.
    batch_size, grad_accum = (4, 1) if world_size == 1 else (1, 2)
    train = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum=grad_accum, seq_len=T, log_every=1,
                        grad_passes=GRAD_PASSES, prefix_mixin=REGIMES[regime], parallel=parallel,
                        restart_at_documents=regime == "span",
                        jitter=0.0)  # jitter noise is drawn per process: off, to compare with one process
    optim = OptimConfig(optimizer="adamw", lr=3e-3, warmup_steps=1)
    # Step 0 single-pass (the fusion unused), then 16 passes, more than any row's exact count (at most T).
    schedule = ScheduleConfig(feedback_start=0.3, pass_mix=(0.0,) * 14 + (1.0,))
    # float64: Adam turns float32 rounding in a near-zero gradient into a visible step; here it stays far below 1e-5.
    span = dict(n_layers=4, feedback_source="layer:3", feedback_target=1) if regime == "span" else {}
    return Trainer(make_model(dtype=torch.float64, **span).train(), train, optim, schedule, rank_rows, out_dir=out,
                   rank=rank, world_size=world_size, progress=False, separator=SEPARATOR)


def _worker(rank: int, init_file: str, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        for regime in REGIMES:
            for parallel, wrap in (("ddp", wrap_ddp), ("fsdp", wrap_fsdp)):
                trainer = make_trainer(Path(root) / f"{regime}-{parallel}", rank, 2, regime, parallel)
                wrap(trainer)
                trainer.fit()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("grad_passes")
    for regime in REGIMES:
        single = make_trainer(root / f"{regime}-single", 0, 1, regime)
        single.fit()
        torch.save([p.detach().clone() for p in single.raw_model.parameters()], root / f"{regime}-params.pt")
    mp.spawn(_worker, args=(str(root / "init"), str(root)), nprocs=2, join=True)
    return root


def records(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in KEYS} for r in lines if r["kind"] == "train"]


@pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/DDP chatter on CPU
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("regime", list(REGIMES))
def test_grad_passes_on_two_processes_match_one_process(runs, regime, parallel):
    expected, got = records(runs / f"{regime}-single"), records(runs / f"{regime}-{parallel}")
    passes = [r["passes"] for r in expected]
    assert [r["passes"] for r in got] == passes and passes[0] == 1
    if regime == "fixed":
        assert passes[1:] == [T] * (STEPS - 1)  # capped at the exact count: T passes with plain prefix 1
    else:
        assert all(2 < p <= T for p in passes[1:])  # the global batch's smallest prefix sets the cap
    assert all(len(r["pass_losses"]) == 1 + GRAD_PASSES for r in expected[1:])  # pass 1 and the last m scored
    for a, b in zip(expected, got, strict=True):
        assert a["tokens"] == b["tokens"]
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    trained = FullBandwidthLM.from_pretrained(checkpoint_path(runs / f"{regime}-{parallel}", STEPS))
    for a, b in zip(torch.load(runs / f"{regime}-params.pt"), trained.parameters(), strict=True):
        torch.testing.assert_close(b, a.to(b.dtype), rtol=0, atol=1e-5)  # the checkpoint holds float32
