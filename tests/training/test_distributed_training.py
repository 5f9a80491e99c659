"""Two gloo processes with DDP train exactly like one process on the same global batch, and resume bit for bit.

One spawn of two processes runs all the DDP trainings (module fixture); each test checks one claim.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ADAMW, make_model

from fullband import FullBandwidthLM
from fullband.training import Trainer
from fullband.training.checkpoint_layout import checkpoint_path
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training.distributed import wrap_ddp

GLOBAL_ROWS, T, STEPS = 4, 12, 4


def global_batch(step: int) -> torch.Tensor:
    return torch.randint(0, 61, (GLOBAL_ROWS, T), generator=torch.Generator().manual_seed(step))


def rank_rows(step: int, rank: int, world_size: int):
    """This rank's contiguous share of the global batch (rank 0 of 1 gets all of it)."""
    rows = GLOBAL_ROWS // world_size
    tokens = global_batch(step)[rank * rows : (rank + 1) * rows]
    return tokens, tokens.clone()


def make_trainer(out: Path, rank: int, world_size: int, jitter: float = 0.0, checkpoint_every: int = 0,
                 seed: int = 0) -> Trainer:
    # 2 processes x 1 row x 2 micro-batches == 1 process x 4 rows: the same global batch, and no_sync exercised.
    batch_size, grad_accum = (4, 1) if world_size == 1 else (1, 2)
    # Jitter noise is drawn per process, so it is off to compare with one process and on to test the resume.
    train = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum=grad_accum, seq_len=T, log_every=1,
                        checkpoint_every=checkpoint_every, jitter=jitter)
    optim = OptimConfig(**ADAMW, lr=3e-3, warmup_steps=1, z_loss_when="always", z_loss=1e-3)
    schedule = ScheduleConfig(feedback_start=0.25, pass_mix=(0.5, 0.5))  # step 0 single-pass: unused fusion weights
    model = make_model(seed=seed, dtype=torch.float32)
    return Trainer(model, train, optim, schedule, rank_rows, out_dir=out, rank=rank, world_size=world_size,
                   progress=False)


def _ddp_trainer(out: Path, rank: int, **kwargs) -> Trainer:
    trainer = make_trainer(out, rank, 2, **kwargs)
    wrap_ddp(trainer)
    return trainer


def _worker(rank: int, init_file: str, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        root = Path(root)
        _ddp_trainer(root / "ddp", rank).fit()  # compared with one process
        # With jitter (drawn from each rank's own RNG): straight, and interrupted after step 2 then resumed by
        # trainers built from other weights, so everything must come from the checkpoint.
        _ddp_trainer(root / "straight", rank, jitter=0.1, checkpoint_every=2).fit()
        _ddp_trainer(root / "resumed", rank, jitter=0.1, checkpoint_every=2).fit(until=2)
        torch.manual_seed(1234 + rank)  # the RNG state the resumed run must not use
        _ddp_trainer(root / "resumed", rank, jitter=0.1, checkpoint_every=2, seed=7).fit(resume=True)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ddp")
    single = make_trainer(root / "single", rank=0, world_size=1)
    single.fit()
    torch.save([p.detach().clone() for p in single.raw_model.parameters()], root / "single_params.pt")
    mp.spawn(_worker, args=(str(root / "init"), str(root)), nprocs=2, join=True)
    return root


def losses(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("step", "passes", "tokens", "objective", "pass_losses", "grad_norm")} for r in lines]


@pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/DDP chatter on CPU
def test_two_gloo_processes_match_one_process(runs):
    expected, got = losses(runs / "single"), losses(runs / "ddp")
    assert [r["passes"] for r in got] == [r["passes"] for r in expected] and max(r["passes"] for r in got) > 1
    for a, b in zip(expected, got, strict=True):
        assert a["tokens"] == b["tokens"]
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], abs=1e-5)
        # The mean gradient over ranks, not their sum: the parameters alone would not show it (clipping and
        # Adam's scale invariance absorb a factor of world_size).
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    ddp_model = FullBandwidthLM.from_pretrained(checkpoint_path(runs / "ddp", STEPS))
    for a, b in zip(torch.load(runs / "single_params.pt"), ddp_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_ddp_resume_restores_each_ranks_rng_and_repeats_the_run(runs):
    rng = torch.load(checkpoint_path(runs / "resumed", 2) / "rng.pt", weights_only=True)
    states = [r["torch"] for r in rng["processes"]]
    assert len(states) == 2 and not torch.equal(states[0], states[1])  # each rank's own jitter stream
    expected, got = losses(runs / "straight"), losses(runs / "resumed")
    assert [r["step"] for r in got] == list(range(STEPS)) and {r["passes"] for r in got[2:]} != {1}
    assert got == expected  # == on floats: bit-exact, so rank 1's jitter continued from rank 1's state
    straight = FullBandwidthLM.from_pretrained(checkpoint_path(runs / "straight", STEPS))
    resumed = FullBandwidthLM.from_pretrained(checkpoint_path(runs / "resumed", STEPS))
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
