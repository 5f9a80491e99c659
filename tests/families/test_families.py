"""A model family added as one spec in the family table, nothing else: loading, starting a training run,
training checkpoints and the optimiser find it through its spec and the model-family interface (docs/DESIGN.md §6)."""

import json
from pathlib import Path

import pytest
import torch
from conftest import make_model

from fullband import families
from fullband.families import FamilySpec, load_any
from fullband.model import FullBandwidthLM
from fullband.model.family import ParamRole
from fullband.training import (
    CheckpointError,
    TrainingState,
    build_optimizer,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from fullband.training.config import OptimConfig
from fullband.training.objective import MultiPassObjective

MARKER = "toy.json"


class ToyLM(FullBandwidthLM):
    """A family of its own: its checkpoints carry a marker file, and only its MLP down-projections are hidden
    matrices for Muon."""

    family = "toy"

    def save_pretrained(self, directory, **decoding):
        super().save_pretrained(directory, **decoding)
        (Path(directory) / MARKER).write_text(json.dumps({"family": "toy"}))

    @classmethod
    def checkpoint_problem(cls, files):
        return super().checkpoint_problem(files) or (None if MARKER in files else f"does not list {MARKER}")

    def parameter_roles(self):
        return {name: ParamRole.OTHER if role == ParamRole.BLOCK_MATRIX and "down_proj" not in name else role
                for name, role in super().parameter_roles().items()}


@pytest.fixture(autouse=True)
def toy_family(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, "toy", FamilySpec("toy", f"{__name__}:ToyLM", "a toy model", marker=MARKER))


def toy(seed: int = 0) -> ToyLM:
    native = make_model(seed=seed, dtype=torch.float32)
    model = ToyLM(native.config)
    model.load_state_dict(native.state_dict())
    return model


def test_load_any_finds_the_family_by_its_marker(tmp_path):
    model = toy().eval()
    families.FAMILIES["toy"].save(model, tmp_path)  # the spec saves through the class's own files
    assert families.family_of(tmp_path).name == "toy"
    loaded = load_any(tmp_path)
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(1))
    assert type(loaded) is ToyLM
    assert torch.equal(loaded(tokens, passes=3).logits, model(tokens, passes=3).logits)


def test_its_roles_pick_muons_matrices_and_its_checkpoints_resume(tmp_path):
    model = toy()
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon"))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: [names[id(p)] for p in g["params"]] for g in optimizer.param_groups}
    assert groups["muon"] == [n for n, p in model.named_parameters() if "down_proj" in n]
    assert "blocks.0.attn.q_proj.weight" in groups["decay"]
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(2))
    MultiPassObjective()(model, tokens, tokens, 2).loss.backward()
    optimizer.step()
    path = save_checkpoint(tmp_path, model, optimizer, TrainingState(step=1, loss=1.0))
    assert (path / MARKER).is_file() and verify_checkpoint(path) is None
    resumed = toy(seed=1)
    resumed_optimizer = build_optimizer(resumed, OptimConfig(optimizer="muon"))
    load_checkpoint(path, resumed, resumed_optimizer, restore_rng=False)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), model.parameters(), strict=True))
    assert str(resumed_optimizer.state_dict()) == str(optimizer.state_dict())
    with pytest.raises(CheckpointError, match="holds a toy model; it cannot be loaded into a FullBandwidthLM"):
        load_checkpoint(path, make_model(dtype=torch.float32), restore_rng=False)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["files"]["model.safetensors"]  # the family's checkpoint_problem sees its weights are not covered
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert verify_checkpoint(path) == "manifest.json does not list model.safetensors"


def test_a_training_run_starts_from_it_through_its_spec(tmp_path):
    # fullband train --init_from DIR asks the spec (families.init_from): its class, in training mode, its weights.
    model = toy().eval()
    model.save_pretrained(tmp_path)
    start = families.init_from(str(tmp_path))
    assert start.family.name == "toy" and not start.built_from_source
    trained = start.model(None, None)
    assert type(trained) is ToyLM and trained.training
    assert all(torch.equal(a, b) for a, b in zip(trained.parameters(), model.parameters(), strict=True))
    assert start.tokenizer() is None  # it saved none: the run's data section picks one
