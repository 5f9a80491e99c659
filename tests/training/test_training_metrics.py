"""Metrics helpers: the MFU peak table, the FLOPs estimate, the resumable JSONL log and its TensorBoard mirror."""

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fullband.training.metrics import MetricsLog, flops_per_token, peak_flops


@pytest.mark.parametrize(
    ("name", "peak"),
    [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989e12),
     ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12), ("Tesla T4", None)],
)
def test_peak_flops_by_device_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == peak


def test_no_peak_and_so_no_mfu_on_cpu():
    assert peak_flops(torch.device("cpu")) is None


def test_flops_per_token_is_6n_plus_attention():
    assert flops_per_token(1000, n_layers=2, d_model=8, seq_len=16) == 6 * 1000 + 12 * 2 * 8 * 16


def test_resumed_log_drops_records_written_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"kind": "train", "step": 0, "loss": 2.0})
    offset = log.tell()
    log.write({"kind": "train", "step": 1, "loss": 1.5})  # written after the checkpoint, then the run died
    log.close()
    resumed = MetricsLog(path, resume_bytes=offset, tensorboard_dir=tmp_path / "tb", start_step=1)
    resumed.write({"kind": "train", "step": 1, "loss": 1.4, "pass_losses": [1.4]})
    resumed.close()
    assert [json.loads(line)["loss"] for line in path.read_text().splitlines()] == [2.0, 1.4]
    assert MetricsLog(path).tell() == 0  # a fresh run starts an empty log


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for ``directory``: {tag: [(step, value), ...]} (resumed runs purged)."""
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_mirrors_the_log_and_a_resume_replaces_the_rerun_steps(tmp_path, monkeypatch):
    # The case that failed by chance: both writers within one second, their event files numbered 9 and 10 by
    # tensorboard's process-wide counter, which names compare as text ("10" < "9"). The mirror must not care.
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer.time, "time", lambda: 1_800_000_000.0)
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    # Values exact in float32, as TensorBoard stores them.
    path, tb = tmp_path / "metrics.jsonl", tmp_path / "tb"
    log = MetricsLog(path, tensorboard_dir=tb)
    log.write({"kind": "train", "step": 0, "loss": 2.0, "pass_losses": [2.0], "tokens": 64, "finite": True})
    offset = log.tell()
    log.write({"kind": "train", "step": 1, "loss": 1.5, "pass_losses": [1.25, 1.75], "tokens": 128})
    log.write({"kind": "eval", "step": 1, "val_loss_1pass": 3.0, "val_loss_2pass": float("nan")})
    log.close()
    resumed = MetricsLog(path, resume_bytes=offset, tensorboard_dir=tb, start_step=1)  # step 1 runs again
    resumed.write({"kind": "train", "step": 1, "loss": 1.375, "pass_losses": [1.5, 1.125], "tokens": 128})
    resumed.write({"kind": "eval", "step": 1, "val_loss_1pass": 2.5})
    resumed.close()
    assert [f.name.rsplit(".", 1)[1] for f in tb.iterdir()] == ["10"]  # one file: the log rewritten, then appended
    assert tensorboard_scalars(tb) == {
        "train/loss": [(0, 2.0), (1, 1.375)],
        "train/pass_losses_1": [(0, 2.0), (1, 1.5)],
        "train/pass_losses_2": [(1, 1.125)],
        "train/tokens": [(0, 64.0), (1, 128.0)],
        "eval/val_loss_1pass": [(1, 2.5)],
    }  # no booleans, no NaN, and nothing from the interrupted run past the checkpoint
