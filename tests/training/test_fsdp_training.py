"""FSDP2 (fully_shard) on two gloo processes: the same losses as one process, exact resume from sharded
checkpoints, and a full model.safetensors in every checkpoint that from_pretrained reads.

One spawn of two processes runs all the FSDP trainings (module fixture); each test checks one claim.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ADAMW, make_model

from fullband import FullBandwidthLM
from fullband.training import CheckpointError, Trainer, build_optimizer, load_checkpoint
from fullband.training.checkpoint_layout import checkpoint_path, list_checkpoints
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training.distributed import wrap_fsdp
from fullband.training.sharded import is_sharded

GLOBAL_ROWS, T, STEPS = 4, 12, 6
EXACT_KEYS = ("step", "loss", "objective", "z_loss", "pass_losses", "lr", "passes", "tokens", "grad_norm")


def rank_rows(step: int, rank: int, world_size: int):
    """This rank's contiguous share of the global batch of ``step`` (rank 0 of 1 gets all of it)."""
    tokens = torch.randint(0, 61, (GLOBAL_ROWS, T), generator=torch.Generator().manual_seed(step))
    rows = GLOBAL_ROWS // world_size
    share = tokens[rank * rows : (rank + 1) * rows]
    return share, share.clone()


def probe_tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, T), generator=torch.Generator().manual_seed(99))


def make_trainer(out: Path, rank: int, world_size: int, jitter: float = 0.0, checkpoint_every: int = 0,
                 seed: int = 0) -> Trainer:
    # 2 processes x 1 row x 2 micro-batches == 1 process x 4 rows: the same global batch, and FSDP2
    # reduce-scatters after each micro-batch (it has no no_sync).
    batch_size, grad_accum = (4, 1) if world_size == 1 else (1, 2)
    train = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum=grad_accum, seq_len=T, log_every=1,
                        checkpoint_every=checkpoint_every, keep_last=5, jitter=jitter, parallel="fsdp")
    optim = OptimConfig(**ADAMW, lr=3e-3, warmup_steps=1, z_loss_when="always", z_loss=1e-3)  # weight decay 0.1
    # Passes [1, 1, 1, 3, 2, 2]: the fusion has no gradient and so no AdamW state until step 3.
    schedule = ScheduleConfig(feedback_start=0.5, pass_mix=(0.5, 0.5), ramp_steps=2)
    # vocab 61 does not split evenly over 2 ranks: FSDP2 pads the embedding's shards.
    model = make_model(seed=seed, dtype=torch.float32).train()
    return Trainer(model, train, optim, schedule, rank_rows, out_dir=out, rank=rank, world_size=world_size,
                   progress=False)


def _fsdp_trainer(out: Path, rank: int, **kwargs) -> Trainer:
    trainer = make_trainer(out, rank, 2, **kwargs)
    wrap_fsdp(trainer)
    return trainer


def _worker(rank: int, init_file: str, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        root = Path(root)
        # 1) The run compared with one process; its last checkpoint and trained model feed test 3.
        trainer = _fsdp_trainer(root / "fsdp", rank)
        assert is_sharded(trainer.raw_model) and trainer.model.model is trainer.raw_model  # the objective bound to it
        trainer.fit()
        trainer.raw_model.eval()
        with torch.no_grad():  # a collective forward on every rank; rank 0 keeps what the sharded model says
            logits = trainer.raw_model(probe_tokens(), passes=2).logits
        if rank == 0:
            torch.save(logits, root / "sharded_logits.pt")
        # 2) With jitter (per-rank RNG) and checkpoints every 2 steps: straight, and interrupted twice, once
        # before the fusion has optimizer state (step 2) and once after (step 4).
        _fsdp_trainer(root / "straight", rank, jitter=0.02, checkpoint_every=2).fit()
        _fsdp_trainer(root / "resumed", rank, jitter=0.02, checkpoint_every=2).fit(until=2)
        _fsdp_trainer(root / "resumed", rank, jitter=0.02, checkpoint_every=2, seed=7).fit(resume=True, until=4)
        _fsdp_trainer(root / "resumed", rank, jitter=0.02, checkpoint_every=2, seed=8).fit(resume=True)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    single = make_trainer(root / "single", rank=0, world_size=1)  # parallel='fsdp' alone changes nothing
    single.fit()
    torch.save([p.detach().clone() for p in single.raw_model.parameters()], root / "single_params.pt")
    torch.save(single.optimizer.state_dict()["state"], root / "single_optimizer_state.pt")
    mp.spawn(_worker, args=(str(root / "init"), str(root)), nprocs=2, join=True)
    return root


def records(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in EXACT_KEYS} for r in lines if r["kind"] == "train"]


@pytest.mark.filterwarnings("ignore::UserWarning")  # gloo chatter on CPU
def test_two_fsdp_processes_match_one_process(runs):
    expected, got = records(runs / "single"), records(runs / "fsdp")
    assert [r["passes"] for r in got] == [r["passes"] for r in expected] == [1, 1, 1, 3, 2, 2]
    for a, b in zip(expected, got, strict=True):
        assert a["tokens"] == b["tokens"]
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], abs=1e-5)  # clip_grad_norm_ over DTensor grads
    # The single process's parameters vs the FSDP run's gathered ones (its checkpoint's full export).
    fsdp_model = FullBandwidthLM.from_pretrained(checkpoint_path(runs / "fsdp", STEPS))
    for a, b in zip(torch.load(runs / "single_params.pt"), fsdp_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_fsdp_resume_reproduces_the_uninterrupted_run(runs):
    expected, got = records(runs / "straight"), records(runs / "resumed")
    assert [r["step"] for r in got] == list(range(STEPS))
    assert got == expected  # == on floats: bit-exact, jitter included (each rank's RNG state restored)
    assert [s for s, _ in list_checkpoints(runs / "resumed")] == [2, 4, 6]
    files = json.loads((checkpoint_path(runs / "resumed", 4) / "manifest.json").read_text())["files"]
    assert "distributed/.metadata" in files and "optimizer.pt" not in files  # the manifest covers the shards


def test_checkpoint_full_model_loads_and_matches_the_sharded_model(runs):
    path = checkpoint_path(runs / "fsdp", STEPS)
    model = FullBandwidthLM.from_pretrained(path)
    torch.testing.assert_close(model(probe_tokens(), passes=2).logits, torch.load(runs / "sharded_logits.pt"),
                               rtol=0, atol=1e-6)
    # One plain process can also load the sharded files (model and AdamW state) directly.
    plain = make_model(seed=5, dtype=torch.float32)
    optimizer = build_optimizer(plain, OptimConfig(**ADAMW))
    state = load_checkpoint(path, plain, optimizer, restore_rng=False)
    assert state.step == STEPS
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    # The AdamW state read from the shards is the run's own: that of one process trained on the same batches.
    expected = torch.load(runs / "single_optimizer_state.pt")
    loaded = optimizer.state_dict()["state"]
    assert sorted(loaded) == sorted(expected) == list(range(len(list(plain.parameters()))))  # the fusion too
    for index, state in expected.items():
        assert sorted(loaded[index]) == sorted(state)
        for key, value in state.items():  # float32 on different reduction orders: within 0.1% of the largest entry
            scale = 1e-3 * float(value.abs().max())
            torch.testing.assert_close(loaded[index][key], value, rtol=0, atol=scale, msg=f"state[{index}][{key}]")


def test_fsdp_refuses_a_plain_checkpoint_and_wrapping_after_training(tmp_path):
    # A process group of one is enough to apply fully_shard in this process.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        trained = make_trainer(tmp_path / "run", rank=0, world_size=1)
        trained.fit(until=2)  # a plain checkpoint: model.safetensors + optimizer.pt
        with pytest.raises(RuntimeError, match="wrap_fsdp must come before training"):
            wrap_fsdp(trained)
        trainer = make_trainer(tmp_path / "run", rank=0, world_size=1)
        wrap_fsdp(trainer)
        with pytest.raises(CheckpointError, match=r"without FSDP .*parallel='ddp'"):
            trainer.fit(resume=True)
    finally:
        dist.destroy_process_group()
