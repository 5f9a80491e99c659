"""``--threads``: auto = the cores this process may use, capped by OMP_NUM_THREADS, less those other running processes
hold; every command applies it; the count a training run used is in its run metadata. (Bad values:
tests/test_bad_inputs.py.)"""

import json

import pytest
import torch

from fullband.cli import main
from fullband.configio import build_config
from fullband.devices import apply_threads, busy_elsewhere, resolve_threads
from fullband.generation.config import GenerateConfig


@pytest.fixture
def six_cores(monkeypatch):
    """A process allowed on 6 cores of a larger machine, with no thread variables set."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {2, 3, 4, 5, 6, 7}, raising=False)
    monkeypatch.setattr("fullband.devices.busy_elsewhere", lambda: 0)  # a quiet machine
    for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_is_the_affinity_capped_by_omp_num_threads(six_cores, monkeypatch):
    assert resolve_threads("auto") == 6  # the affinity mask, not os.cpu_count()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert resolve_threads("auto") == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # a cap, never more than the usable cores
    assert resolve_threads("auto") == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a count: ignored, as OpenMP ignores it
    assert resolve_threads("auto") == 6
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's processes on this machine share the cores
    assert resolve_threads("auto") == 1


def test_auto_leaves_the_cores_other_running_processes_hold(six_cores, monkeypatch):
    monkeypatch.setattr("fullband.devices.busy_elsewhere", lambda: 2)
    assert resolve_threads("auto") == 4
    monkeypatch.setattr("fullband.devices.busy_elsewhere", lambda: 9)
    assert resolve_threads("auto") == 1  # never fewer than one
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # the other torchrun process is running too: not a neighbour
    monkeypatch.setattr("fullband.devices.busy_elsewhere", lambda: 1)
    assert resolve_threads("auto") == 3
    assert resolve_threads("5") == 5  # an explicit count is taken as given


def test_busy_elsewhere_reads_the_running_count_less_this_process(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("2.41 2.10 1.95 3/412 12345\n")
    assert busy_elsewhere(samples=2, loadavg=str(loadavg)) == 2
    loadavg.write_text("0.00 0.00 0.00 1/80 1\n")
    assert busy_elsewhere(samples=1, loadavg=str(loadavg)) == 0
    assert busy_elsewhere(loadavg=str(tmp_path / "missing")) == 0  # no /proc (macOS, Windows): nothing known


def test_an_explicit_count_wins(six_cores, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert resolve_threads("3") == resolve_threads(3) == 3


def test_config_files_and_python_may_give_a_number():
    assert build_config(GenerateConfig, {"checkpoint": "x", "threads": 2}, {}).threads == "2"
    assert GenerateConfig(checkpoint="x", threads=3).threads == "3"
    assert GenerateConfig(checkpoint="x").threads == "auto"


def test_apply_sets_torch(restore_threads):
    assert apply_threads("1") == 1 and torch.get_num_threads() == 1


def test_train_applies_threads_and_records_the_count(tmp_path, restore_threads):
    out = tmp_path / "run"
    assert main(["train", "--out_dir", str(out), "--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads",
                 "2", "--train.batch_size", "2", "--train.seq_len", "16", "--train.max_steps", "1", "--device", "cpu",
                 "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1
    run_config = json.loads(next(out.glob("checkpoints/*/run_config.json")).read_text())
    assert run_config["torch_threads"] == 1 and run_config["threads"] == "1"
    assert 'threads = "1"' in (out / "config.toml").read_text()
