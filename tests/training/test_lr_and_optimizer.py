"""Learning-rate schedules and the AdamW weight-decay grouping."""

import itertools

import pytest
import torch
from conftest import ADAMW, make_model

from fullband.config import ConfigError
from fullband.training import build_optimizer, lr_at
from fullband.training.config import OptimConfig
from fullband.training.optim import decay_start, in_cooldown, muon_split, set_lr


def curve(cfg: OptimConfig, total: int) -> list[float]:
    return [lr_at(s, cfg, total) for s in range(total)]


def test_warmup_is_linear_to_the_peak():
    cfg = OptimConfig(lr=1e-3, warmup_steps=10, schedule="cosine")
    lrs = curve(cfg, 100)
    assert lrs[:10] == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    assert lrs[0] > 0 and max(lrs) == pytest.approx(1e-3)


def test_cosine_decays_monotonically_to_min_lr_at_the_last_step():
    cfg = OptimConfig(lr=1e-3, min_lr_ratio=0.1, warmup_steps=10, schedule="cosine")
    lrs = curve(cfg, 100)
    after = lrs[9:]
    assert all(a >= b for a, b in itertools.pairwise(after))
    assert lrs[-1] == pytest.approx(1e-4)
    assert lrs[9 + 45] == pytest.approx(0.55e-3, rel=0.05)  # half way: half way between peak and floor


def test_wsd_holds_the_peak_then_decays_linearly():
    cfg = OptimConfig(lr=1e-3, min_lr_ratio=0.0, warmup_steps=5, schedule="wsd", decay_fraction=0.2)
    lrs = curve(cfg, 100)
    assert decay_start(cfg, 100) == 80
    assert all(lr == 1e-3 for lr in lrs[5:80])
    decay = lrs[80:]
    steps = [a - b for a, b in itertools.pairwise(decay)]
    assert steps == pytest.approx([steps[0]] * len(steps))  # linear
    assert lrs[-1] == 0.0
    assert in_cooldown(80, cfg, 100) and not in_cooldown(79, cfg, 100)


def test_constant_schedule_after_warmup():
    assert curve(OptimConfig(lr=2e-4, warmup_steps=0, schedule="constant"), 10) == [2e-4] * 10


def test_weight_decay_only_on_matrices_including_the_tied_embedding():
    model = make_model(dtype=torch.float32)
    optimizer = build_optimizer(model, OptimConfig(**ADAMW, weight_decay=0.1))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert "embed.weight" in decayed  # also the output head (tied), counted once
    assert any(n.startswith("fusion.") for n in decayed)  # W_U, W_G
    assert not_decayed and all("norm" in n for n in not_decayed)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert optimizer.defaults["foreach"] is True  # CPU parameters: foreach kernel, not fused


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = make_model(dtype=torch.float32)
    cfg = OptimConfig(optimizer="muon", lr=1e-3, muon_lr=0.02, weight_decay=0.0, fusion_lr_mult=3.0)
    optimizer = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: {names[id(p)] for p in g["params"]} for g in optimizer.param_groups}
    muon = groups["muon"] | groups["muon_fusion"]
    assert all(n.startswith(("blocks.", "fusion.")) and "norm" not in n for n in muon)
    assert "blocks.0.attn.q_proj.weight" in groups["muon"] and "fusion.state_proj.weight" in groups["muon_fusion"]
    assert "embed.weight" in groups["decay"]  # the embedding / head stays with AdamW
    assert "blocks.0.attn_norm.weight" in groups["no_decay"] and "fusion.token_norm.weight" in groups["no_decay_fusion"]
    assert sum(map(len, groups.values())) == len(list(model.parameters()))
    set_lr(optimizer, 5e-4)  # half the peak: every group at half its own peak
    lr = {g["name"]: g["lr"] for g in optimizer.param_groups}
    assert lr["decay"] == pytest.approx(5e-4) and lr["no_decay_fusion"] == pytest.approx(1.5e-3)
    assert lr["muon"] == pytest.approx(0.01) and lr["muon_fusion"] == pytest.approx(0.03)


def test_muon_on_a_baseline_skips_the_missing_fusion():
    optimizer = build_optimizer(make_model(feedback=False), OptimConfig(optimizer="muon"))
    assert {g["name"] for g in optimizer.param_groups} == {"decay", "no_decay", "muon"}


def name_prefix_groups(model, fusion_lr_mult):
    """The optimiser groups as the name-prefix selection made them before parameter roles (``blocks.``/``fusion.``
    2-D weights to Muon, the fusion's LR by the ``fusion.`` prefix): group name -> parameter names, in order."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    muon = [n for n, p in named if n.startswith(("blocks.", "fusion.")) and p.dim() == 2]
    groups = {"muon": [n for n in muon if not n.startswith("fusion.")],
              "muon_fusion": [n for n in muon if n.startswith("fusion.")]}
    for n, p in named:
        if n not in muon:
            apart = fusion_lr_mult != 1.0 and n.startswith("fusion.")
            groups.setdefault(("decay" if p.dim() >= 2 else "no_decay") + ("_fusion" if apart else ""), []).append(n)
    return {k: v for k, v in groups.items() if v}


@pytest.mark.parametrize("overrides", [{}, {"feedback": False}, {"input_norm": "paper", "gate_norm": "shared"},
                                       {"input_norm": "all"}, {"tie_embeddings": False}])
@pytest.mark.parametrize("fusion_lr_mult", [1.0, 3.0])
def test_a_native_models_roles_give_the_groups_its_parameter_names_gave(overrides, fusion_lr_mult):
    # Muon's matrices come from the family's parameter roles now; for a native model they are the very tensors,
    # in the very order (the optimizer state of older checkpoints is indexed by it), that the names selected.
    model = make_model(dtype=torch.float32, **overrides)
    cfg = OptimConfig(optimizer="muon", fusion_lr_mult=fusion_lr_mult)
    names = {id(p): n for n, p in model.named_parameters()}
    built = {g["name"]: [names[id(p)] for p in g["params"]] for g in build_optimizer(model, cfg).param_groups}
    assert built == name_prefix_groups(model, fusion_lr_mult)
    assert [n for n, _ in muon_split(model, ("blocks", "fusion"))[0]] == built["muon"] + built.get("muon_fusion", [])


@pytest.mark.parametrize(("params", "message"), [
    (("norm",), r"'norm' names only 1 non-matrix tensor.*2-D matrices only"),
    (("blocks.0.attn_norm.weight",), r"non-matrix tensor.*leave 1-D gains to AdamW"),
    (("decoder",), r"'decoder' matches no parameter"),
])
def test_muon_refuses_non_matrices_and_unknown_modules(params, message):
    with pytest.raises(ConfigError, match=message):
        build_optimizer(make_model(), OptimConfig(optimizer="muon", muon_params=params))
