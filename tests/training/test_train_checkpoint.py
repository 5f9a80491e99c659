"""Training checkpoints: atomic layout, manifest verification, skipping corrupt ones, pruning, RNG restore."""

import json
import random

import numpy as np
import pytest
import torch
from conftest import ADAMW, make_model

from fullband.training import (
    CheckpointError,
    CheckpointWarning,
    NonFiniteLossError,
    TrainingState,
    build_optimizer,
    latest_good_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from fullband.training.checkpoint_layout import checkpoint_path, list_checkpoints
from fullband.training.config import OptimConfig
from fullband.training.objective import MultiPassObjective


def trained_pair(seed: int = 0):
    model = make_model(seed=seed, dtype=torch.float32)
    optimizer = build_optimizer(model, OptimConfig(**ADAMW, lr=1e-2))
    tokens = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(seed))
    MultiPassObjective()(model, tokens, tokens, 2).loss.backward()
    optimizer.step()
    return model, optimizer


def save(out, model, optimizer, step, keep_last=5, generator=None, loss=1.0):
    state = TrainingState(step=step, loss=loss, lr=1e-2, tokens=16 * step)
    return save_checkpoint(out, model, optimizer, state, generator=generator, run_config={"train": {"seed": 0}},
                           keep_last=keep_last)


def test_layout_and_manifest(tmp_path):
    model, optimizer = trained_pair()
    path = save(tmp_path, model, optimizer, step=4)
    assert path == tmp_path / "checkpoints" / "step-0000004"
    names = sorted(p.name for p in path.iterdir())
    assert names == ["README.md", "config.json", "configuration_fullband.py", "manifest.json", "model.safetensors",
                     "modeling_fullband.py", "optimizer.pt", "rng.pt", "run_config.json", "trainer_state.json"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 4 and set(manifest["files"]) == set(names) - {"manifest.json"}
    assert verify_checkpoint(path) is None
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_round_trip_restores_weights_optimizer_and_rngs(tmp_path):
    model, optimizer = trained_pair(seed=0)
    generator = torch.Generator().manual_seed(9)
    path = save(tmp_path, model, optimizer, step=3, generator=generator)
    expected = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=generator))

    fresh_model, fresh_optimizer = trained_pair(seed=1)
    fresh_generator = torch.Generator()
    state = load_checkpoint(path, fresh_model, fresh_optimizer, generator=fresh_generator)
    assert state.step == 3 and state.loss == 1.0 and state.tokens == 48
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    saved_opt, loaded_opt = optimizer.state_dict(), fresh_optimizer.state_dict()
    for key in saved_opt["state"]:
        for name, value in saved_opt["state"][key].items():
            assert torch.equal(value, loaded_opt["state"][key][name])
    got = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=fresh_generator))
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2] and torch.equal(got[3], expected[3])


@pytest.mark.parametrize("damage", ["truncate_weights", "flip_optimizer_byte", "no_manifest", "missing_file"])
def test_corrupt_or_partial_checkpoint_is_skipped_with_a_warning(tmp_path, damage):
    model, optimizer = trained_pair()
    good = save(tmp_path, model, optimizer, step=2)
    bad = save(tmp_path, model, optimizer, step=4)
    if damage == "truncate_weights":
        data = (bad / "model.safetensors").read_bytes()
        (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "flip_optimizer_byte":
        data = bytearray((bad / "optimizer.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (bad / "optimizer.pt").write_bytes(bytes(data))
    elif damage == "no_manifest":
        (bad / "manifest.json").unlink()
    else:
        (bad / "rng.pt").unlink()
    assert verify_checkpoint(bad) is not None
    with pytest.warns(CheckpointWarning, match=r"skipping partial or corrupt checkpoint .*step-0000004.*not be loaded"):
        assert latest_good_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_checkpoint(bad, make_model(dtype=torch.float32))


def test_unfinished_temp_directory_is_never_a_candidate(tmp_path):
    model, optimizer = trained_pair()
    good = save(tmp_path, model, optimizer, step=2)
    (tmp_path / "checkpoints" / ".tmp-step-0000004").mkdir()  # a crash mid-write
    assert latest_good_checkpoint(tmp_path) == good
    save(tmp_path, model, optimizer, step=6)
    assert not (tmp_path / "checkpoints" / ".tmp-step-0000004").exists()  # cleaned up by the next save


def test_keeps_only_the_last_n_and_replaces_a_rewritten_step(tmp_path):
    model, optimizer = trained_pair()
    for step in (1, 2, 3, 4):
        save(tmp_path, model, optimizer, step=step, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    save(tmp_path, model, optimizer, step=4, keep_last=2, loss=0.5)  # same step again, after a resume from 3
    state = json.loads((checkpoint_path(tmp_path, 4) / "trainer_state.json").read_text())
    assert state["loss"] == 0.5 and verify_checkpoint(checkpoint_path(tmp_path, 4)) is None


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_refuses_to_save_a_non_finite_loss(tmp_path, loss):
    model, optimizer = trained_pair()
    with pytest.raises(NonFiniteLossError, match=r"at step 7.*no checkpoint.*--optim\.lr.*--optim\.grad_clip"):
        save(tmp_path, model, optimizer, step=7, loss=loss)
    assert list_checkpoints(tmp_path) == []


def test_model_mismatch_is_a_clear_error(tmp_path):
    model, optimizer = trained_pair()
    path = save(tmp_path, model, optimizer, step=1)
    with pytest.raises(CheckpointError, match="holds another model") as error:
        load_checkpoint(path, make_model(dtype=torch.float32, d_model=64))
    message = str(error.value)
    assert "d_model=32 there, 64 here" in message and "--resume true" in message and len(message) < 300 + len(str(path))
