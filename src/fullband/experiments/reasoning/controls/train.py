"""The controls of DESIGN.md §7 in ``fullband eval-reasoning`` (issue 29): would a model that spends the same
passes or the same FLOPs without carrying state along the sequence solve the problems too?

- ``looped``: the full-bandwidth model's architecture, objective, passes and gradient passes with
  ``feedback_shift=0`` (pass k fuses position t's own state h_t from pass k-1 instead of h_{t-1}); decoded with
  as many passes over the whole sequence as its training ran on a sequence of the prompt's length
  (``min(passes, T)``), no KV-cache recurrence (fullband.generation.looped).
- ``equal_flops``: a plain transformer (feedback off) of the same width, as many blocks deeper as make its training
  FLOPs equal the full-bandwidth model's (fullband.experiments.core.flops), on the same batches and steps. Why deeper,
  not wider or longer: more steps would need more batches (not the same batches); depth is what a fixed-depth
  transformer lacks for serial state tracking (its answer-only reach grows with the layers), so a deeper model is
  the strongest equal-FLOPs challenger, where width adds capacity per step but no serial steps.

Every model's training FLOPs (its batch plan replayed) and inference FLOPs per answer-only problem go into the
training summaries and the cells. :class:`ControlsStudy` runs the study once per family (``--families``) and writes
one report over them (fullband.experiments.reasoning.controls.report).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fullband.data import ByteTokenizer
from fullband.experiments.core.flops import (
    Shape,
    batch_lengths,
    decode_flops,
    equal_flops_depth,
    looped_decode_flops,
    step_flops,
    training_flops,
)
from fullband.experiments.core.pair import StudyModel, sft_run_config, train_run
from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.experiments.reasoning.evaluation import evaluate
from fullband.experiments.reasoning.records import Cell
from fullband.modes import DecodingMode
from fullband.tasks.reasoning import Problem, prompt, trace

CONTROL_VARIANTS = {"looped": "looped", "equal_flops": "equal-FLOPs baseline"}
Control = tuple[str, str, str, dict[int, int]]  # (kind, decoding mode, variant, extra passes per length)


def trained_passes(cfg: ReasoningConfig) -> int:
    """The most passes a multi-pass training batch ran (``passes``, or the pass mix's deepest)."""
    return cfg.passes or len(cfg.schedule.pass_mix) + 1


def prompt_lengths(test: list[Problem]) -> dict[int, int]:
    """Tokens of the longest answer-only prompt of each problem length."""
    tokenizer, out = ByteTokenizer(), {}
    for p in test:
        out[p.n] = max(out.get(p.n, 0), len(tokenizer.encode(prompt(p, 0))))
    return out


def looped_passes(cfg: ReasoningConfig, test: list[Problem]) -> dict[int, int]:
    """Passes the looped model runs per problem length: what its training ran on a sequence that long (capped at
    the exact count, T with plain prefix 1, and at ``passes``)."""
    return {n: min(trained_passes(cfg), length) for n, length in prompt_lengths(test).items()}


def train_controls(cfg: ReasoningConfig, spec: StudyModel, train_path: Path, test_path: Path, run_dir: Path,
                   test: list[Problem], runs: dict[str, dict[str, Any]], progress: bool,
                   ) -> tuple[dict[str, dict[str, Any]], list[Cell]]:
    """Train the controls of ``cfg.controls`` beside the two models of ``runs`` (one seed, same batches), each
    decoded answer-only as soon as it is trained, and add every model's training FLOPs and shape to its summary
    -> (runs, the controls' cells)."""
    base = sft_run_config(spec, train_path, test_path, run_dir / "baseline", False)
    full = sft_run_config(spec, train_path, test_path, run_dir / "fullband", True)
    lengths = batch_lengths(base)  # every model of the seed trains on these batches
    target = training_flops(full, lengths)
    vocab = ByteTokenizer().vocab_size

    def plain_cost(shape: Shape) -> float:
        return sum(step_flops(shape, spec.batch_size, T, 1, feedback=False) for T in lengths)

    configs = {"baseline": base, "fullband": full}
    if "looped" in cfg.controls:
        configs["looped"] = dataclasses.replace(full, model=dataclasses.replace(full.model, feedback_shift=0),
                                                out_dir=str(run_dir / "looped"))
    if "equal_flops" in cfg.controls:
        depth = equal_flops_depth(Shape.of(base.model.resolve(vocab)), target, plain_cost)
        deeper = dataclasses.replace(spec, model=dataclasses.replace(spec.model, n_layers=depth))
        configs["equal_flops"] = sft_run_config(deeper, train_path, test_path, run_dir / "equal_flops", False)
    passes = looped_passes(cfg, test)
    cells: list[Cell] = []
    for kind in cfg.controls:
        runs[kind] = train_run(kind, configs[kind], progress, cfg.reuse_models or cfg.resume, cfg.resume)
        control: Control = (kind, "fused" if kind == "looped" else "standard", CONTROL_VARIANTS[kind],
                            {n: k - 1 for n, k in passes.items()} if kind == "looped" else {})
        cells += evaluate(cfg, {kind: runs[kind]["model_dir"]}, test, (control,), run_dir, progress)
    for kind, run_cfg in configs.items():
        shape = Shape.of(run_cfg.model.resolve(vocab))
        runs[kind] |= {"training_flops": target if kind == "fullband" else training_flops(run_cfg, lengths),
                       "shape": dataclasses.asdict(shape), "weights": shape.weights(False)}
    return runs, cells


def inference_flops(cell: Cell, shape: Shape, prompt_len: int, generated: int, looped: int) -> float:
    """FLOPs of one answer-only decode of a cell's problems (fullband.experiments.core.flops.decode_flops)."""
    mode, variant = cell["mode"], cell["variant"]
    if cell["model"] == "looped":
        return looped_decode_flops(shape, prompt_len, generated, looped)
    # A fused cell's pass count is in its variant ("fullband fused(2)").
    decoding = DecodingMode.from_label(variant.split()[-1]) if mode == "fused" else DecodingMode.parse(mode)
    return decode_flops(shape, prompt_len, generated, decoding)


def annotate_flops(cfg: ReasoningConfig, runs: dict[str, dict[str, Any]], cells: list[Cell],
                   test: list[Problem]) -> None:
    """Add ``inference_flops`` (per problem, answer-only, the reference answer's length) to every answer-only
    cell."""
    lengths, passes = prompt_lengths(test), looped_passes(cfg, test)
    generated = {p.n: len(trace(p, 0)) + 1 for p in test}  # "=a" and end-of-text
    for cell in cells:
        if cell["stride"] == 0:
            n = cell["length"]
            cell["inference_flops"] = inference_flops(cell, Shape(**runs[cell["model"]]["shape"]), lengths[n],
                                                      generated[n], passes[n])
