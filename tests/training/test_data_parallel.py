"""DDP and FSDP2 (fully_shard) on two gloo processes train exactly like one process on the same global batch, and
resume bit for bit; with truncated gradients (``train.grad_passes``) too. FSDP's own claims: sharded checkpoints
whose full model.safetensors from_pretrained reads (and a plain process can load the shards), activation
checkpointing under FSDP, and the refusals (a plain checkpoint, wrapping after training).

One spawn of two processes runs every distributed training of this module (module fixture ``runs``); each test
checks one claim, the shared ones once per kind (``ddp``, ``fsdp``).
"""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ADAMW, make_model

from fullband import FullBandwidthLM
from fullband.model import linear as linear_module
from fullband.training import CheckpointError, Trainer, build_optimizer, load_checkpoint
from fullband.training.checkpoint_layout import checkpoint_path, list_checkpoints
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training.distributed import wrap_ddp, wrap_fsdp
from fullband.training.sharded import is_sharded

KINDS = ("ddp", "fsdp")
WRAP = {"ddp": wrap_ddp, "fsdp": wrap_fsdp}
GLOBAL_ROWS, T, STEPS = 4, 12, 6
EXACT_KEYS = ("step", "loss", "objective", "z_loss", "pass_losses", "lr", "passes", "tokens", "grad_norm")
# Gradient norms against one process: DDP's all-reduced mean within 1e-5 relative, FSDP's clip_grad_norm_ over DTensor
# gradients within 1e-5 absolute (each the tolerance its own module held before they were merged).
GRAD_NORM = {"ddp": {"rel": 1e-5}, "fsdp": {"abs": 1e-5}}

# Truncated gradients: two regimes, each trained by one process and by each kind on the same global batches.
# - ``fixed``: no prefix mixin and more passes than the exact count, so the gradient passes start from the
#   sequentially computed fixed point (a nested forward inside the wrapped forward);
# - ``mixed``: a random plain prefix per row, so the pass count (capped at the global batch's exact count) and the
#   choice of the loop over the fixed point must be made for the global batch: each process's single row would
#   alone choose the fixed point and fewer passes;
# - ``span``: ``mixed`` for a model whose state goes from block 3 into the stream after block 1 (issue 53), its
#   packed rows restarting the recurrence at each document (``train.restart_at_documents``).
GP_T, GP_STEPS, GRAD_PASSES = 10, 3, 2
REGIMES = {"fixed": False, "mixed": True, "span": True}  # regime -> prefix_mixin
SEPARATOR = 3  # the end-of-text id between packed documents (regime span)
GP_KEYS = ("step", "passes", "tokens", "objective", "pass_losses", "grad_norm")


def global_batch(step: int, seq_len: int) -> torch.Tensor:
    """The global batch of ``step``: GLOBAL_ROWS random rows of ``seq_len`` tokens."""
    return torch.randint(0, 61, (GLOBAL_ROWS, seq_len), generator=torch.Generator().manual_seed(step))


def share_of(tokens: torch.Tensor, rank: int, world_size: int):
    """This rank's contiguous share of a global batch (rank 0 of 1 gets all of it), as inputs and labels."""
    rows = GLOBAL_ROWS // world_size
    share = tokens[rank * rows : (rank + 1) * rows]
    return share, share.clone()


def rank_rows(step: int, rank: int, world_size: int):
    return share_of(global_batch(step, T), rank, world_size)


def grad_passes_rows(step: int, rank: int, world_size: int):
    """Rows of length GP_T with a document starting in a row of each process."""
    tokens = global_batch(step, GP_T)
    tokens[0, 4] = tokens[2, 6] = SEPARATOR
    return share_of(tokens, rank, world_size)


def probe_tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, T), generator=torch.Generator().manual_seed(99))


def make_trainer(out: Path, rank: int, world_size: int, parallel: str = "ddp", jitter: float = 0.0,
                 checkpoint_every: int = 0, seed: int = 0, activation_checkpointing: bool = False) -> Trainer:
    # 2 processes x 1 row x 2 micro-batches == 1 process x 4 rows: the same global batch; DDP's no_sync is exercised,
    # and FSDP2 reduce-scatters after each micro-batch (it has no no_sync).
    batch_size, grad_accum = (4, 1) if world_size == 1 else (1, 2)
    # Jitter noise is drawn per process, so it is off to compare with one process and on to test the resume.
    train = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum=grad_accum, seq_len=T, log_every=1,
                        checkpoint_every=checkpoint_every, keep_last=5, jitter=jitter, parallel=parallel,
                        compile="false", activation_checkpointing=activation_checkpointing)
    optim = OptimConfig(**ADAMW, lr=3e-3, warmup_steps=1, z_loss_when="always", z_loss=1e-3)  # weight decay 0.1
    # Passes [1, 1, 1, 3, 2, 2]: the fusion has no gradient (DDP: unused parameters) and so no AdamW state until
    # step 3.
    schedule = ScheduleConfig(feedback_start=0.5, pass_mix=(0.5, 0.5), ramp_steps=2)
    # vocab 61 does not split evenly over 2 ranks: FSDP2 pads the embedding's shards.
    model = make_model(seed=seed, dtype=torch.float32).train()
    return Trainer(model, train, optim, schedule, rank_rows, out_dir=out, rank=rank, world_size=world_size,
                   progress=False)


def grad_passes_trainer(out: Path, rank: int, world_size: int, regime: str, parallel: str = "ddp") -> Trainer:
    batch_size, grad_accum = (4, 1) if world_size == 1 else (1, 2)
    train = TrainConfig(max_steps=GP_STEPS, batch_size=batch_size, grad_accum=grad_accum, seq_len=GP_T, log_every=1,
                        grad_passes=GRAD_PASSES, prefix_mixin=REGIMES[regime], parallel=parallel,
                        restart_at_documents=regime == "span",
                        jitter=0.0)  # jitter noise is drawn per process: off, to compare with one process
    optim = OptimConfig(optimizer="adamw", lr=3e-3, warmup_steps=1)
    # Step 0 single-pass (the fusion unused), then 16 passes, more than any row's exact count (at most GP_T).
    schedule = ScheduleConfig(feedback_start=0.3, pass_mix=(0.0,) * 14 + (1.0,))
    # float64: Adam turns float32 rounding in a near-zero gradient into a visible step; here it stays far below 1e-5.
    span = dict(n_layers=4, feedback_source="layer:3", feedback_target=1) if regime == "span" else {}
    return Trainer(make_model(dtype=torch.float64, **span).train(), train, optim, schedule, grad_passes_rows,
                   out_dir=out, rank=rank, world_size=world_size, progress=False, separator=SEPARATOR)


def _wrapped(out: Path, rank: int, kind: str, **kwargs) -> Trainer:
    trainer = make_trainer(out, rank, 2, parallel=kind, **kwargs)
    WRAP[kind](trainer)
    return trainer


def _worker(rank: int, init_file: str, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        root = Path(root)
        # The truncated-gradient runs first. (The fixed-regime FSDP run once came out different from run to run: the
        # fused decoding path kept copies of sharded weights; test_sharded_blocks_keep_no_fused_copy_of_their_weights.)
        for regime in REGIMES:
            for kind in KINDS:
                trainer = grad_passes_trainer(root / f"{regime}-{kind}", rank, 2, regime, kind)
                WRAP[kind](trainer)
                trainer.fit()
        for kind in KINDS:
            # 1) The run compared with one process.
            trainer = _wrapped(root / kind, rank, kind)
            if kind == "fsdp":
                assert is_sharded(trainer.raw_model) and trainer.model.model is trainer.raw_model  # the objective bound
            trainer.fit()
            if kind == "fsdp":  # its last checkpoint and trained model feed the sharded-checkpoint test
                trainer.raw_model.eval()
                with torch.no_grad():  # a collective forward on every rank; rank 0 keeps what the sharded model says
                    logits = trainer.raw_model(probe_tokens(), passes=2).logits
                if rank == 0:
                    torch.save(logits, root / "sharded_logits.pt")
                # The same run with every block recomputed in backward (each block its own FSDP unit: recomputing
                # one gathers its weights again).
                _wrapped(root / "fsdp-recomputed", rank, kind, activation_checkpointing=True).fit()
            # 2) With jitter (per-rank RNG) and checkpoints every 2 steps: straight, and interrupted twice, once
            # before the fusion has optimizer state (step 2) and once after (step 4), each time resumed by a trainer
            # built from other weights and another RNG state, so everything must come from the checkpoint.
            _wrapped(root / f"{kind}-straight", rank, kind, jitter=0.02, checkpoint_every=2).fit()
            _wrapped(root / f"{kind}-resumed", rank, kind, jitter=0.02, checkpoint_every=2).fit(until=2)
            torch.manual_seed(1234 + rank)  # the RNG state the resumed run must not use
            _wrapped(root / f"{kind}-resumed", rank, kind, jitter=0.02, checkpoint_every=2, seed=7).fit(
                resume=True, until=4)
            torch.manual_seed(4321 + rank)
            _wrapped(root / f"{kind}-resumed", rank, kind, jitter=0.02, checkpoint_every=2, seed=8).fit(resume=True)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data_parallel")
    single = make_trainer(root / "single", rank=0, world_size=1)  # the reference of both kinds
    single.fit()
    torch.save([p.detach().clone() for p in single.raw_model.parameters()], root / "single_params.pt")
    torch.save(single.optimizer.state_dict()["state"], root / "single_optimizer_state.pt")
    for regime in REGIMES:
        one = grad_passes_trainer(root / f"{regime}-single", 0, 1, regime)
        one.fit()
        torch.save([p.detach().clone() for p in one.raw_model.parameters()], root / f"{regime}-params.pt")
    mp.spawn(_worker, args=(str(root / "init"), str(root)), nprocs=2, join=True)
    return root


def records(out: Path, keys: tuple[str, ...] = EXACT_KEYS) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in keys} for r in lines if r["kind"] == "train"]


@pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/DDP chatter on CPU
@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_match_one_process(runs, kind):
    expected, got = records(runs / "single"), records(runs / kind)
    assert [r["passes"] for r in got] == [r["passes"] for r in expected] == [1, 1, 1, 3, 2, 2]
    for a, b in zip(expected, got, strict=True):
        assert a["tokens"] == b["tokens"]
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], abs=1e-5)
        # The mean gradient over ranks, not their sum: the parameters alone would not show it (clipping and
        # Adam's scale invariance absorb a factor of world_size).
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], **GRAD_NORM[kind])
    # The single process's parameters vs the run's (FSDP: gathered, its checkpoint's full export).
    trained = FullBandwidthLM.from_pretrained(checkpoint_path(runs / kind, STEPS))
    for a, b in zip(torch.load(runs / "single_params.pt"), trained.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_restores_each_ranks_rng_and_repeats_the_run(runs, kind):
    rng = torch.load(checkpoint_path(runs / f"{kind}-resumed", 2) / "rng.pt", weights_only=True)
    states = [r["torch"] for r in rng["processes"]]
    assert len(states) == 2 and not torch.equal(states[0], states[1])  # each rank's own jitter stream
    expected, got = records(runs / f"{kind}-straight"), records(runs / f"{kind}-resumed")
    assert [r["step"] for r in got] == list(range(STEPS)) and {r["passes"] for r in got[2:]} != {1}
    assert got == expected  # == on floats: bit-exact, so each rank's jitter continued from its own state
    assert [s for s, _ in list_checkpoints(runs / f"{kind}-resumed")] == [2, 4, 6]
    files = json.loads((checkpoint_path(runs / f"{kind}-resumed", 4) / "manifest.json").read_text())["files"]
    if kind == "fsdp":  # the manifest covers the shards
        assert "distributed/.metadata" in files and "optimizer.pt" not in files
    else:
        assert "optimizer.pt" in files and not any(name.startswith("distributed/") for name in files)
    straight = FullBandwidthLM.from_pretrained(checkpoint_path(runs / f"{kind}-straight", STEPS))
    resumed = FullBandwidthLM.from_pretrained(checkpoint_path(runs / f"{kind}-resumed", STEPS))
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore::UserWarning")  # gloo/DDP chatter on CPU
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("regime", list(REGIMES))
def test_grad_passes_on_two_processes_match_one_process(runs, regime, kind):
    expected = records(runs / f"{regime}-single", GP_KEYS)
    got = records(runs / f"{regime}-{kind}", GP_KEYS)
    passes = [r["passes"] for r in expected]
    assert [r["passes"] for r in got] == passes and passes[0] == 1
    if regime == "fixed":
        assert passes[1:] == [GP_T] * (GP_STEPS - 1)  # capped at the exact count: GP_T passes with plain prefix 1
    else:
        assert all(2 < p <= GP_T for p in passes[1:])  # the global batch's smallest prefix sets the cap
    assert all(len(r["pass_losses"]) == 1 + GRAD_PASSES for r in expected[1:])  # pass 1 and the last m scored
    for a, b in zip(expected, got, strict=True):
        assert a["tokens"] == b["tokens"]
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    trained = FullBandwidthLM.from_pretrained(checkpoint_path(runs / f"{regime}-{kind}", GP_STEPS))
    for a, b in zip(torch.load(runs / f"{regime}-params.pt"), trained.parameters(), strict=True):
        torch.testing.assert_close(b, a.to(b.dtype), rtol=0, atol=1e-5)  # the checkpoint holds float32


# ---------------------------------------------------------------- FSDP only


def test_fsdp_checkpoint_full_model_loads_and_matches_the_sharded_model(runs):
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


def test_checkpointed_blocks_under_fsdp_train_to_the_same_losses(runs):
    stored, recomputed = records(runs / "fsdp"), records(runs / "fsdp-recomputed")
    assert max(r["passes"] for r in stored) == 3
    for a, b in zip(stored, recomputed, strict=True):
        assert (b["objective"], b["passes"]) == pytest.approx((a["objective"], a["passes"]), rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)


def test_fsdp_refuses_a_plain_checkpoint_and_wrapping_after_training(tmp_path):
    # A process group of one is enough to apply fully_shard in this process.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        trained = make_trainer(tmp_path / "run", rank=0, world_size=1, parallel="fsdp")
        trained.fit(until=2)  # a plain checkpoint: model.safetensors + optimizer.pt
        with pytest.raises(RuntimeError, match="wrap_fsdp must come before training"):
            wrap_fsdp(trained)
        trainer = make_trainer(tmp_path / "run", rank=0, world_size=1, parallel="fsdp")
        wrap_fsdp(trainer)
        with pytest.raises(CheckpointError, match=r"without FSDP .*parallel='ddp'"):
            trainer.fit(resume=True)
    finally:
        dist.destroy_process_group()


def test_sharded_blocks_keep_no_fused_copy_of_their_weights(tmp_path):
    """FSDP2 gathers a block's weights into memory it frees after each use and writes them without moving their
    version counters; a concatenated copy kept by the fused decoding path (fullband.model.linear) could then pass for
    the weights after an optimizer step whenever the memory came back at the same address. The fixed regime's fixed
    point is such a forward inside training: its FSDP run differed from one process's about once in 30 spawns
    (docs/LOG.md, 2026-12-07). Sharded blocks run unfused, the same numbers, and nothing is kept."""
    def kept(model):
        return [m for m in model.modules() if m in linear_module._FUSED]

    def full(tensor):
        return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    tokens = probe_tokens()[:1]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        trainer = grad_passes_trainer(tmp_path / "run", 0, 1, "fixed", "fsdp")
        model = trainer.raw_model
        with torch.no_grad():
            model.forward_exact(tokens, method="sequential")  # a decoding-sized forward: the fused path keeps copies
        assert kept(model)
        wrap_fsdp(trainer)
        assert not kept(model)  # released with the wrap
        trainer.fit()  # every multi-pass step computes the fixed point without gradients
        assert not kept(model)
        unsharded = make_model(dtype=torch.float64, vocab_size=61)
        with torch.no_grad():
            for mine, theirs in zip(unsharded.parameters(), model.parameters(), strict=True):
                mine.copy_(full(theirs))
            got = model.eval().forward_exact(tokens, method="sequential").logits
            want = unsharded.forward_exact(tokens, method="sequential").logits
        assert not kept(model)
        assert torch.equal(got, want)  # unfused under FSDP == fused in one process, bit for bit
    finally:
        dist.destroy_process_group()
