"""``torchrun`` launches ``fullband train`` on 2 CPU processes (gloo): same losses as 1 process, same global batch."""

import json
import subprocess
import sys

import pytest

from fullband.cli import main

# AdamW: (Nor)Muon refuses FSDP's shards, and its bf16 orthogonalisation turns the all-reduce's last-bit
# differences into ~1e-4 ones, more than this comparison of the gradient averaging allows.
TINY = ["--optim.optimizer", "adamw",
        "--model.d_model", "32", "--model.n_layers", "2", "--model.n_heads", "2", "--train.seq_len", "32",
        "--train.max_steps", "5", "--train.log_every", "1", "--optim.warmup_steps", "2",
        "--schedule.feedback_start", "0.5",
        # Jitter noise is drawn per process, so it differs between 1 and 2 processes; switch it off to compare.
        "--train.jitter", "0"]


def train_records(out_dir):
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def test_two_process_ddp_matches_one_process(tmp_path, one_thread):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ddp = subprocess.run([*torchrun, "-m", "fullband.cli", "train", "--out_dir", str(tmp_path / "ddp"),
                          "--train.batch_size", "2", *TINY], capture_output=True, text=True, timeout=120)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    # The one-process reference runs here, through the CLI's main (no second interpreter start-up to wait for).
    assert main(["train", "--out_dir", str(tmp_path / "one"), "--train.batch_size", "4", *TINY]) == 0
    got, expected = train_records(tmp_path / "ddp"), train_records(tmp_path / "one")
    assert len(got) == 5 and max(r["passes"] for r in got) > 1
    for a, b in zip(expected, got, strict=True):
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        # The ranks' gradients are averaged, not summed (the losses alone would not show a sum).
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
