"""The FLOPs count (fullband.experiments.core.flops) and the Wilson intervals (fullband.experiments.core.stats)."""

import dataclasses
import random

import pytest

from fullband.config import ModelConfig
from fullband.experiments.core.flops import (
    Shape,
    batch_lengths,
    decode_flops,
    equal_flops_depth,
    forward_flops,
    looped_decode_flops,
    positions_flops,
    step_flops,
    training_flops,
)
from fullband.experiments.core.stats import pooled_wilson, wilson
from fullband.model import FullBandwidthLM
from fullband.modes import EXACT, SOFT, STANDARD, fused


def test_weights_match_the_model_and_the_forward_formula():
    cfg = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2)
    model = FullBandwidthLM(cfg)
    shape = Shape.of(cfg)
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "fusion" not in name)
    fusion = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "fusion" in name)
    assert shape.weights(False) == matrices and shape.weights(True) == matrices + fusion  # head tied to embed
    T, N = 10, shape.weights(False)
    assert forward_flops(shape, T, False) == 2 * N * T + 2 * 2 * 64 * T * (T + 1)


def test_step_flops_follow_the_objective():
    shape = Shape(64, 2, 32, 192, 320)
    plain, fused = forward_flops(shape, 20, False), forward_flops(shape, 20, True)
    assert step_flops(shape, 4, 20, 5, feedback=False) == 4 * 3 * plain  # the baseline runs one pass whatever
    assert step_flops(shape, 1, 20, 3, feedback=True) == 3 * plain + 2 * 3 * fused  # every pass with gradients
    # Truncated (m = 2): capped at the exact count 20; the fixed point sequentially (one forward) when it recurs,
    # the 16 middle passes one by one when it is looped.
    assert step_flops(shape, 1, 20, 32, feedback=True, grad_passes=2) == 3 * plain + fused + 2 * 3 * fused
    assert step_flops(shape, 1, 20, 32, feedback=True, grad_passes=2, shift=0) == 3 * plain + 17 * fused + 6 * fused
    assert step_flops(shape, 1, 40, 32, feedback=True, grad_passes=2) == pytest.approx(
        3 * forward_flops(shape, 40, False) + (29 + 6) * forward_flops(shape, 40, True))


def test_decode_flops_per_mode():
    shape = Shape(64, 2, 32, 192, 320)
    standard = decode_flops(shape, 10, 3, STANDARD)
    assert standard == forward_flops(shape, 12, False)
    assert standard < decode_flops(shape, 10, 3, EXACT) < decode_flops(shape, 10, 3, fused(2))
    assert looped_decode_flops(shape, 10, 3, 4) == pytest.approx(standard + 3 * forward_flops(shape, 12, True))
    # soft: one plain pass over the prompt carried into fused decoding, which fused(0) is too
    assert decode_flops(shape, 10, 3, SOFT) == decode_flops(shape, 10, 3, fused(0)) == pytest.approx(
        forward_flops(shape, 10, False) + positions_flops(shape, 11, 12, True))


def test_equal_flops_depth_solves_the_affine_cost():
    shape = Shape(64, 2, 32, 192, 320)

    def cost(s):
        return 100 * step_flops(s, 8, 20, 1, feedback=False)

    target = cost(dataclasses.replace(shape, n_layers=7))
    assert equal_flops_depth(shape, target, cost) == 7
    assert equal_flops_depth(shape, cost(shape) / 2, cost) == 2  # never shallower than the model itself


def test_training_flops_replays_the_runs_batches(tmp_path):
    from fullband.experiments.core.pair import StudyModel, sft_run_config
    from fullband.tasks.base import write_jsonl
    from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig, TrainModelConfig

    rng = random.Random(0)
    rows = [{"prompt": "x" * rng.randint(2, 9), "completion": "y" * rng.randint(1, 4)} for _ in range(50)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    spec = StudyModel(
        model=TrainModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=32),
        train=TrainConfig(max_steps=6, batch_size=4, seq_len=32, grad_passes=1, prefix_mixin=False, eval_every=0),
        optim=OptimConfig(lr=1e-3, warmup_steps=1, weight_decay=0.0, optimizer="adamw"),
        schedule=ScheduleConfig(feedback_start=0.0, pass_mix=(0.0, 1.0)))
    base, fb = (sft_run_config(spec, data, data, tmp_path / k, feedback) for k, feedback in (("b", False), ("f", True)))
    lengths = batch_lengths(base)
    assert len(lengths) == 6 and all(4 <= T <= 15 for T in lengths)
    shape = Shape.of(base.model.resolve(257))
    assert training_flops(base, lengths) == sum(step_flops(shape, 4, T, 1, feedback=False) for T in lengths)
    assert training_flops(fb) > training_flops(base, lengths)


def test_wilson_interval():
    low, high = wilson(100, 200)
    assert (round(low, 3), round(high, 3)) == (0.431, 0.569)
    assert wilson(0, 10)[0] == 0 and 0.25 < wilson(0, 10)[1] < 0.35 and wilson(10, 10)[1] == pytest.approx(1.0)
    assert wilson(0, 0) == (0.0, 1.0)
    assert pooled_wilson([0.5, 0.5], [100, 100]) == wilson(100, 200)
