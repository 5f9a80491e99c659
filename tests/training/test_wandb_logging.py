"""``--train.wandb_project``: every metrics record also goes to a Weights & Biases run, here in offline mode
(nothing leaves the machine; W&B's own directories are redirected into the test's temporary directory)."""

import pytest

from fullband.cli import main
from fullband.config import ConfigError
from fullband.training.config import TrainConfig

pytest.importorskip("wandb")

TINY = ["--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.eval_batches", "1", "--train.log_every", "1", "--device", "cpu"]


@pytest.fixture
def corpus(tmp_path):
    directory = tmp_path / "corpus"
    directory.mkdir()
    for i in range(10):  # ten documents: enough for a train and a validation split
        (directory / f"part{i}.txt").write_text(f"To be or not to be, that is question {i}. " * 40)
    return directory


def test_wandb_logger_writes_an_offline_run_with_every_record(corpus, tmp_path, monkeypatch):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert main(["train", "--out_dir", str(out), "--data.source", str(corpus), *TINY, "--train.max_steps", "4",
                 "--train.eval_every", "2", "--train.wandb_project", "fullband-test"]) == 0
    run_id = (out / "wandb_run_id").read_text().strip()
    (log,) = (out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    data = log.read_bytes()
    # Four train records and two validations, each logged under kind/name as in TensorBoard.
    assert data.count(b"train/objective") >= 4 and data.count(b"eval/val_loss_1pass") >= 2
    assert b"fullband-test" in data


def test_wandb_is_off_by_default_and_project_names_are_checked():
    assert TrainConfig().wandb_project is None
    with pytest.raises(ConfigError, match="wandb_project='my project' is invalid"):
        TrainConfig(wandb_project="my project")
