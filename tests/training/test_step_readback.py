"""Steps whose scalars stay on the device until a read-back every log_every steps (what the Trainer does on CUDA,
forced here on the CPU) log the values, keep the state and checkpoints, and stop on a non-finite loss, as reading
every step does (the CPU's path, today's numbers)."""

import dataclasses

import pytest
import torch
from test_trainer import make_trainer, records

from fullband.training import NonFiniteLossError
from fullband.training.checkpoint_layout import list_checkpoints, load_training_state


def untimed(state):
    # the seconds, and the log's length (its lines hold the timings), differ from run to run
    return dataclasses.replace(state, train_seconds=0.0, metrics_bytes=0)


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_read_back_every_log_every_steps_logs_what_reading_every_step_logs(tmp_path):
    runs = {}
    for name, per_step in (("every_step", True), ("deferred", False)):
        trainer = make_trainer(tmp_path / name, log_every=3, checkpoint_every=4, max_steps=10)
        trainer.sync_every_step = per_step
        state = trainer.fit()
        runs[name] = (records(tmp_path / name), state, trainer)
    (every, every_state, every_trainer), (deferred, deferred_state, deferred_trainer) = runs.values()
    assert [r["step"] for r in deferred] == [0, 3, 6, 9]  # log_every and the last step
    assert deferred == every  # losses, pass losses, grad norms, tokens: the same values
    assert untimed(deferred_state) == untimed(every_state)  # loss, lr, tokens, step
    saved = {name: [untimed(load_training_state(p)) for _, p in list_checkpoints(tmp_path / name)] for name in runs}
    assert [s.step for s in saved["deferred"]] == [4, 8, 10] and saved["deferred"] == saved["every_step"]
    for a, b in zip(every_trainer.raw_model.parameters(), deferred_trainer.raw_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert deferred_trainer.last_record["step"] == 9 and "mfu" not in deferred_trainer.last_record


def test_a_non_finite_loss_stops_the_run_at_the_read_back_and_is_never_saved(tmp_path):
    trainer = make_trainer(tmp_path, log_every=4, checkpoint_every=2, max_steps=8)
    trainer.sync_every_step = False
    with torch.no_grad():
        trainer.raw_model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError):
        trainer.fit()
    assert list_checkpoints(tmp_path) == []  # the read-back before the first save found it
