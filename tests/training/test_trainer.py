"""The Trainer: bit-exact resume, divergence handling, gradient accumulation, logging and learning."""

import json
from pathlib import Path

import pytest
import torch
from conftest import ADAMW, make_model
from test_training_metrics import tensorboard_scalars

from fullband.training import CheckpointWarning, NonFiniteLossError, Trainer, TrainingError, loss_eval
from fullband.training.checkpoint_layout import list_checkpoints, load_training_state
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig

VOCAB, T = 61, 16
# Deterministic quantities of a step (timing-based ones like tokens_per_s are left out).
EXACT_KEYS = ("step", "loss", "objective", "z_loss", "pass_losses", "lr", "passes", "tokens", "token_equiv_compute",
              "grad_norm")


def random_batches(rows: int):
    """batch_fn over random tokens: a pure function of the step, as the Trainer requires."""

    def batch_fn(step: int, rank: int, world_size: int):
        generator = torch.Generator().manual_seed(10_000 * rank + step)
        tokens = torch.randint(0, VOCAB, (rows, T), generator=generator)
        return tokens, tokens.clone()

    return batch_fn


def make_trainer(out: Path, seed: int = 0, batch_size: int = 2, grad_accum: int = 2, optim: OptimConfig | None = None,
                 **train) -> Trainer:
    train_cfg = TrainConfig(**{"max_steps": 8, "batch_size": batch_size, "grad_accum": grad_accum, "seq_len": T,
                               "log_every": 1, "checkpoint_every": 0, "seed": 3, **train})
    optim_cfg = optim or OptimConfig(**ADAMW, lr=3e-3, warmup_steps=2, schedule="cosine", z_loss_when="always",
                                     z_loss=1e-3)
    schedule_cfg = ScheduleConfig(feedback_start=0.25, pass_mix=(0.5, 0.5))  # multi-pass steps from step 2 on
    model = make_model(seed=seed, dtype=torch.float32)
    return Trainer(model, train_cfg, optim_cfg, schedule_cfg, random_batches(batch_size * grad_accum), out_dir=out,
                   progress=False)


def records(out: Path, kind: str = "train") -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in EXACT_KEYS if k in r} for r in map(json.loads, lines) if r["kind"] == kind]


MUON = OptimConfig(optimizer="muon", lr=3e-3, muon_lr=0.02, warmup_steps=2, schedule="cosine", fusion_lr_mult=2.0)
# NorMuon's second moments, and the float32 orthogonalisation of CPUs without bf16 instructions.
NORMUON_FP32 = OptimConfig(optimizer="normuon", lr=3e-3, muon_lr=0.02, warmup_steps=2, schedule="cosine",
                           fusion_lr_mult=2.0, ns_dtype="float32")


@pytest.mark.parametrize("optim", [None, MUON, NORMUON_FP32], ids=["adamw", "muon", "normuon-fp32"])
@pytest.mark.parametrize("prefix_per_pass", [False, True])
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path, optim, prefix_per_pass):
    straight = make_trainer(tmp_path / "straight", optim=optim, prefix_per_pass=prefix_per_pass)
    straight.fit()

    first = make_trainer(tmp_path / "resumed", optim=optim, prefix_per_pass=prefix_per_pass)
    first.fit(until=4)  # "interrupted" after 4 steps, with a checkpoint
    assert [s for s, _ in list_checkpoints(tmp_path / "resumed")] == [4]
    # A different init: everything must come from the checkpoint.
    second = make_trainer(tmp_path / "resumed", seed=123, optim=optim, prefix_per_pass=prefix_per_pass)
    second.fit(resume=True)

    expected, got = records(tmp_path / "straight"), records(tmp_path / "resumed")
    assert [r["step"] for r in got] == list(range(8))  # the log continues without gaps or repeats
    assert {r["passes"] for r in expected} == {1, 2, 3}  # the run exercised multi-pass steps, jitter and prefixes
    assert got == expected  # == on floats: bit-exact
    for a, b in zip(straight.raw_model.parameters(), second.raw_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_training_time_adds_up_over_a_resumed_runs_invocations(tmp_path):
    first = make_trainer(tmp_path, max_steps=6)
    first.fit(until=3)
    before = first.state.train_seconds
    assert before > 0 and load_training_state(tmp_path / "checkpoints" / "step-0000003").train_seconds == before
    second = make_trainer(tmp_path, max_steps=6)
    second.fit(resume=True)
    step_times = [json.loads(line)["step_time_s"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(step_times) == 6  # log_every=1: every step of both invocations
    # The total covers all six steps (and their validation), not only the three this invocation ran.
    assert second.state.train_seconds >= sum(step_times) > sum(step_times[3:]) and second.state.train_seconds > before


def test_resume_skips_a_corrupt_latest_checkpoint_and_still_matches(tmp_path):
    straight = make_trainer(tmp_path / "straight")
    straight.fit()
    make_trainer(tmp_path / "resumed", checkpoint_every=2).fit(until=6)
    latest = tmp_path / "resumed" / "checkpoints" / "step-0000006"
    (latest / "optimizer.pt").write_bytes(b"garbage")
    resumed = make_trainer(tmp_path / "resumed", seed=5, checkpoint_every=2)
    with pytest.warns(CheckpointWarning, match="step-0000006"):
        resumed.fit(resume=True)
    assert resumed.state.step == 8
    assert records(tmp_path / "resumed") == records(tmp_path / "straight")


def test_fresh_start_refuses_a_directory_with_checkpoints(tmp_path):
    make_trainer(tmp_path, max_steps=2).fit()
    with pytest.raises(TrainingError, match=r"already holds checkpoints.*--resume"):
        make_trainer(tmp_path, max_steps=2).fit()


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path):
    with pytest.warns(UserWarning, match="starting from scratch"):
        state = make_trainer(tmp_path, max_steps=2).fit(resume="auto")
    assert state.step == 2


@pytest.mark.parametrize("resume", [True, "true"])
def test_resume_true_without_checkpoints_is_an_error(tmp_path, resume):
    with pytest.raises(TrainingError, match=r"holds no complete checkpoint to resume.*--resume auto"):
        make_trainer(tmp_path, max_steps=2).fit(resume=resume)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_nan_loss_raises_and_writes_no_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path, checkpoint_every=1)
    clean = trainer.batch_fn

    def poisoned(step, rank, world_size):
        if step == 2:
            with torch.no_grad():
                trainer.raw_model.norm.weight.fill_(float("nan"))  # what a blown-up update leaves behind
        return clean(step, rank, world_size)

    trainer.batch_fn = poisoned
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 2.*--optim\.lr.*--optim\.grad_clip"):
        trainer.fit()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]  # states after steps 0 and 1; nothing after


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    big = make_trainer(tmp_path / "big", batch_size=4, grad_accum=1, max_steps=3, jitter=0.0)
    big.fit()
    small = make_trainer(tmp_path / "small", batch_size=2, grad_accum=2, max_steps=3, jitter=0.0)
    small.fit()
    for a, b in zip(records(tmp_path / "big"), records(tmp_path / "small"), strict=True):
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-5)
        assert a["tokens"] == b["tokens"]
        # The parameters alone cannot tell: clipping and Adam's scale invariance hide a gradient off by a factor.
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for a, b in zip(big.raw_model.parameters(), small.raw_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # Adam amplifies rounding in tiny grads


def test_metrics_log_and_validation(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=4, eval_every=2, log_every=2)
    trainer.eval_fn = loss_eval(random_batches(2), num_batches=2, passes=(1, 3))
    trainer.fit()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train] == [0, 2, 3]  # every log_every steps and the last one
    for r in train:
        assert len(r["pass_losses"]) == r["passes"]
        assert r["token_equiv_compute"] >= r["tokens"] == (r["step"] + 1) * 4 * T
        assert r["tokens_per_s"] == pytest.approx(4 * T / r["step_time_s"], rel=1e-9)  # this step's tokens only
        assert r["grad_norm"] > 0
        assert "mfu" not in r  # no known peak FLOPs on CPU
    evals = [r for r in lines if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [1, 3]
    assert set(evals[0]) == {"kind", "step", "val_loss_1pass", "val_loss_3pass"}
    # TensorBoard (a dev extra) mirrors the log.
    shown = tensorboard_scalars(tmp_path / "tensorboard")
    assert shown["train/objective"] == [(r["step"], pytest.approx(r["objective"], rel=1e-6)) for r in train]
    assert shown["eval/val_loss_3pass"] == [(r["step"], pytest.approx(r["val_loss_3pass"], rel=1e-6)) for r in evals]


def test_a_tiny_model_learns_a_repeating_sequence(tmp_path):
    pattern = torch.arange(T) % 7

    def batch_fn(step, rank, world_size):
        shift = torch.randint(0, 7, (4, 1), generator=torch.Generator().manual_seed(step))
        tokens = (pattern[None, :] + shift) % 7
        return tokens, tokens.clone()

    model = make_model(dtype=torch.float32)
    trainer = Trainer(model, TrainConfig(max_steps=40, batch_size=4, seq_len=T, log_every=1, checkpoint_every=0),
                      OptimConfig(**ADAMW, lr=1e-2, warmup_steps=5), ScheduleConfig(feedback_start=0.5), batch_fn,
                      out_dir=tmp_path, progress=False)
    trainer.fit()
    losses = [r["objective"] for r in records(tmp_path)]
    assert losses[-1] < 0.5 * losses[0]


def test_z_loss_applies_only_in_the_cooldown(tmp_path):
    optim = OptimConfig(**ADAMW, lr=3e-3, warmup_steps=2, decay_fraction=0.3, z_loss=1e-3, z_loss_when="cooldown")
    make_trainer(tmp_path, max_steps=10, optim=optim).fit()
    assert [r["step"] for r in records(tmp_path) if "z_loss" in r] == [7, 8, 9]


def test_a_batch_of_the_wrong_shape_is_a_clear_error(tmp_path):
    trainer = make_trainer(tmp_path, batch_size=2, grad_accum=2)
    trainer.batch_fn = random_batches(rows=2)  # forgot grad_accum
    with pytest.raises(TrainingError, match=r"expected both \(4, T\) = \(batch_size \* grad_accum, T\)"):
        trainer.fit()
