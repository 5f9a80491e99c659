"""A new user's session with ``fullband train``, run as they would: the installed command in subprocesses, on their own
text file, a tiny model. A run is never lost: a rerun without --resume is refused and changes nothing, --resume true
alone continues with the run's own settings to the uninterrupted run's weights, a conflicting flag is one short line,
and Ctrl-C saves a checkpoint and prints the command that continues it, which works as printed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

FULLBAND = Path(sys.executable).parent / "fullband"  # the console script pip installed with the package
TINY = ["--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.eval_every", "0", "--train.compile", "false", "--train.log_every", "1",
        "--threads", "1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The user's own text file (a few thousand lines)."""
    path = tmp_path_factory.mktemp("data") / "notes.txt"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    path.write_text("".join(f"{words[i % 8]} {words[(i * 3) % 8]} {i % 97}\n" for i in range(3000)))
    return path


def fullband(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FULLBAND), *args], capture_output=True, text=True, timeout=300, env=ENV)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def test_a_run_is_never_lost_and_resume_is_one_flag(tmp_path, corpus):
    run = tmp_path / "R"
    first = fullband("train", "--out_dir", str(run), *TINY, "--data.source", str(corpus), "--train.max_steps", "8",
                     "--train.checkpoint_every", "4")
    assert first.returncode == 0, first.stderr
    # What it says before step 1: parameters, device, threads, the data's tokens.
    assert "parameters" in first.stdout and "device: cpu, 1 threads" in first.stdout
    assert "training tokens" in first.stdout
    uninterrupted = load_file(run / "model" / "model.safetensors")
    saved = {name: (run / name).read_bytes() for name in ("config.toml", "metrics.jsonl")}

    # Forgetting --resume (and giving other settings): refused in one line; the run's files are untouched.
    again = fullband("train", "--out_dir", str(run), "--model.d_model", "256", "--data.source", "shakespeare")
    assert "already holds checkpoints" in one_line(again) and "--resume true" in one_line(again)
    assert {name: (run / name).read_bytes() for name in saved} == saved

    # Killed after step 4's checkpoint: --resume true alone continues with the run's own settings (its d_model, its
    # file, its steps) and ends where the uninterrupted run ended, bit for bit.
    (run / "checkpoints" / "step-0000008" / "manifest.json").unlink()
    resumed = fullband("train", "--out_dir", str(run), "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "config.toml").read_bytes() == saved["config.toml"]
    assert steps(run) == list(range(8))
    weights = load_file(run / "model" / "model.safetensors")
    assert weights.keys() == uninterrupted.keys()
    assert all((weights[k] == uninterrupted[k]).all() for k in weights)

    # A setting the run cannot change: one short line naming it and both values.
    conflict = one_line(fullband("train", "--out_dir", str(run), "--resume", "true", "--model.d_model", "999"))
    assert "model.d_model=999" in conflict and "model.d_model=32" in conflict and len(conflict) < 200, conflict


def test_ctrl_c_saves_a_checkpoint_and_the_printed_command_resumes_it(tmp_path, corpus):
    run = tmp_path / "S"
    args = [*TINY, "--data.source", str(corpus), "--train.max_steps", "200", "--train.checkpoint_every", "1000"]
    process = subprocess.Popen([str(FULLBAND), "train", "--out_dir", str(run), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=ENV)
    log, deadline = run / "metrics.jsonl", time.monotonic() + 120
    while not (log.is_file() and len(log.read_text().splitlines()) >= 5):  # a few steps in
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    lines = out.splitlines()
    command = lines[lines.index(next(line for line in lines if line.startswith("interrupted: "))) + 1].strip()
    interrupted_at = len(steps(run))
    assert 5 <= interrupted_at < 200 and (run / "checkpoints" / f"step-{interrupted_at:07d}").is_dir()
    argv = shlex.split(command)
    assert argv[:2] == ["fullband", "train"], command
    resumed = subprocess.run([str(FULLBAND), *argv[1:]], capture_output=True, text=True, timeout=300, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert steps(run) == list(range(200))
    # The same weights as the run without the interruption.
    whole = tmp_path / "whole"
    assert fullband("train", "--out_dir", str(whole), *args).returncode == 0
    expected, got = (load_file(d / "model" / "model.safetensors") for d in (whole, run))
    assert all((got[k] == expected[k]).all() for k in expected)
