"""``torchrun`` runs ``fullband train --train.parallel fsdp`` on 2 CPU processes (gloo): the same losses as one
process on the same global batch, sharded checkpoints, and a final model that loads and generates."""

import json
import subprocess
import sys

import pytest
import torch

from fullband import FullBandwidthLM
from fullband.cli import main

# AdamW: (Nor)Muon refuses FSDP's shards, and its bf16 orthogonalisation turns the all-reduce's last-bit
# differences into ~1e-4 ones, more than this comparison of the gradient averaging allows.
TINY = ["--optim.optimizer", "adamw",
        "--model.d_model", "32", "--model.n_layers", "2", "--model.n_heads", "2", "--train.seq_len", "32",
        "--train.max_steps", "4", "--train.log_every", "1", "--optim.warmup_steps", "2",
        "--schedule.feedback_start", "0.5", "--train.checkpoint_every", "2", "--train.parallel", "fsdp",
        "--train.eval_every", "4", "--train.eval_batches", "1",  # validation runs on the sharded model
        "--train.jitter", "0"]  # jitter noise is drawn per process: off, to compare with one process


def train_records(out_dir):
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def test_two_process_fsdp_matches_one_process_and_exports_the_model(tmp_path, one_thread):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    fsdp = subprocess.run([*torchrun, "-m", "fullband.cli", "train", "--out_dir", str(tmp_path / "fsdp"),
                           "--train.batch_size", "2", *TINY], capture_output=True, text=True, timeout=120)
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    # The one-process reference runs here, through the CLI's main (no second interpreter start-up to wait for).
    assert main(["train", "--out_dir", str(tmp_path / "one"), "--train.batch_size", "4", *TINY]) == 0

    got, expected = train_records(tmp_path / "fsdp"), train_records(tmp_path / "one")
    assert [r["passes"] for r in got] == [r["passes"] for r in expected] and max(r["passes"] for r in got) > 1
    assert len(got) == 4
    for a, b in zip(expected, got, strict=True):
        assert b["objective"] == pytest.approx(a["objective"], abs=1e-5)
        # Mean gradients over the ranks, not sums: clipping and Adam's scale invariance would hide a sum from the
        # losses and the weights.
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)

    last = tmp_path / "fsdp" / "checkpoints" / "step-0000004"
    assert (last / "distributed" / ".metadata").is_file() and not (last / "optimizer.pt").exists()
    final = FullBandwidthLM.from_pretrained(tmp_path / "fsdp" / "model")  # gathered from the shards at the end
    for a, b in zip(FullBandwidthLM.from_pretrained(last).parameters(), final.parameters(), strict=True):
        assert torch.equal(a, b)
    one = FullBandwidthLM.from_pretrained(tmp_path / "one" / "model")  # what one process trained
    for a, b in zip(one.parameters(), final.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    prompt = torch.tensor([[72, 101, 108]])
    torch.testing.assert_close(final(prompt, passes=2).logits, one(prompt, passes=2).logits, rtol=0, atol=1e-4)
    evals = [json.loads(line) for line in (tmp_path / "fsdp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r["kind"] == "eval"] == [3]  # validation ran on the sharded model
