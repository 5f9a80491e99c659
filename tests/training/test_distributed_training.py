"""Two gloo processes with DDP train exactly like one process on the same global batch."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import make_model

from fullband import FullBandwidthLM
from fullband.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training import Trainer
from fullband.training.checkpoint import checkpoint_path
from fullband.training.distributed import wrap_ddp

GLOBAL_ROWS, T, STEPS = 4, 12, 4


def global_batch(step: int) -> torch.Tensor:
    return torch.randint(0, 61, (GLOBAL_ROWS, T), generator=torch.Generator().manual_seed(step))


def rank_rows(step: int, rank: int, world_size: int):
    """This rank's contiguous share of the global batch (rank 0 of 1 gets all of it)."""
    rows = GLOBAL_ROWS // world_size
    tokens = global_batch(step)[rank * rows : (rank + 1) * rows]
    return tokens, tokens.clone()


def make_trainer(out: Path, rank: int, world_size: int) -> Trainer:
    # 2 processes x 1 row x 2 micro-batches == 1 process x 4 rows: the same global batch, and no_sync exercised.
    batch_size, grad_accum = (4, 1) if world_size == 1 else (1, 2)
    train = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum=grad_accum, seq_len=T, log_every=1,
                        checkpoint_every=0, jitter=0.0)  # jitter noise is per process, so off for the comparison
    optim = OptimConfig(lr=3e-3, warmup_steps=1, z_loss_when="always", z_loss=1e-3)
    schedule = ScheduleConfig(feedback_start=0.25, pass_mix=(0.5, 0.5))  # step 0 single-pass: unused fusion weights
    model = make_model(dtype=torch.float32)
    return Trainer(model, train, optim, schedule, rank_rows, out_dir=out, rank=rank, world_size=world_size,
                   progress=False)


def _worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        trainer = make_trainer(Path(out), rank, world_size)
        wrap_ddp(trainer)
        trainer.fit()
    finally:
        dist.destroy_process_group()


def losses(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("step", "passes", "tokens", "loss", "pass_losses", "grad_norm")} for r in lines]


@pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/DDP chatter on CPU
def test_two_gloo_processes_match_one_process(tmp_path):
    single = make_trainer(tmp_path / "single", rank=0, world_size=1)
    single.fit()
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "ddp")), nprocs=2, join=True)

    expected, got = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert [r["passes"] for r in got] == [r["passes"] for r in expected] and max(r["passes"] for r in got) > 1
    for a, b in zip(expected, got, strict=True):
        assert a["tokens"] == b["tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], abs=1e-5)
    ddp_model = FullBandwidthLM.from_pretrained(checkpoint_path(tmp_path / "ddp", STEPS))
    for a, b in zip(single.raw_model.parameters(), ddp_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    rng = torch.load(checkpoint_path(tmp_path / "ddp", STEPS) / "rng.pt", weights_only=True)
    assert len(rng["processes"]) == 2  # both ranks' RNG states, for an exact resume
