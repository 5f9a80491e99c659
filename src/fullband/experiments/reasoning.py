"""Reasoning traces: does the full-bandwidth model reach the same accuracy with shorter traces?

``fullband eval-reasoning`` runs the whole study:

1. held-out test problems of every length (:mod:`fullband.tasks.reasoning`), then training data
   whose solutions mix every granularity (``strides``), test problems excluded;
2. the baseline (``feedback=False``) and the full-bandwidth model trained on the same batches;
3. greedy decoding of every test problem at every stride: the baseline in standard mode (its modes are all the
   same model), the full-bandwidth model in each of ``modes``;
4. accuracy (final answer checked by code), exact-trace rate and trace length (generated tokens, end-of-text
   not counted) per model, mode, stride and length; "equal accuracy": per length, the shortest trace with which
   each model/mode reaches the baseline's best accuracy (less ``TOLERANCE``).

    out_dir/
      data/train.jsonl, data/test.jsonl      the problems (prompt/completion JSONL)
      baseline/, fullband/                   the training runs (model/ inside each)
      results.json                           config, training summaries, every cell, equal-accuracy rows
      report.md, accuracy_vs_trace_length.png
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fullband.data import ByteTokenizer, Tokenizer
from fullband.experiments.config import ReasoningConfig
from fullband.experiments.plots import pyplot, save_figure
from fullband.experiments.study import PairStudy, line_style, markdown_table, summarize, training_table
from fullband.model import FullBandwidthLM
from fullband.model_io import load_any
from fullband.tasks.base import write_jsonl
from fullband.tasks.reasoning import (
    Problem,
    ReasoningTask,
    TracedProblem,
    prompt,
    random_problem,
    sample_problems,
    trace,
)

TOLERANCE = 0.05  # "equal accuracy" = within 5 points of the baseline's best
TEST_SHARE = 0.5  # at most half of the problems of a length are held out, the rest can be trained on
EXTRA_TOKENS = 8  # decoding budget beyond the reference trace
PLOT = "accuracy_vs_trace_length.png"


TASK_TEXT = {
    "swaps": "The shell game: a ball starts under one of the cups a, b, c; each of n named steps A, B, ... names "
             "the cup it leaves in place and swaps the other two; the answer is where the ball ends up (state "
             "tracking over the permutations of 3 cups, which has no parallel shortcut like a sum has).",
    "sum": "Running sums: n named steps each add a digit modulo {modulus}; the answer is the final total.",
}


def _example(cfg: dict[str, Any]) -> str:
    problem = random_problem(cfg["family"], 4, random.Random(1), cfg["modulus"])
    return "`, `".join(f"{prompt(problem, s)}{trace(problem, s)}" for s in cfg["strides"])


def stride_name(stride: int) -> str:
    return "answer only" if stride == 0 else f"stride {stride}"


def variant_name(kind: str, mode: str, fused_passes: int) -> str:
    if kind == "baseline":
        return "baseline"
    return f"fullband {mode}" + (f"({fused_passes})" if mode == "fused" else "")


# ---------------------------------------------------------------------------------------------- data


def task_of(cfg: ReasoningConfig) -> ReasoningTask:
    return ReasoningTask(cfg.family, tuple(range(cfg.min_length, cfg.max_length + 1)), cfg.strides, cfg.modulus)


def build_data(cfg: ReasoningConfig, data_dir: Path) -> tuple[list[Problem], Path, Path]:
    """Held-out test problems, ``train.jsonl`` (random lengths and strides, test problems excluded) and
    ``test.jsonl`` (every test problem at every stride)."""
    rng = random.Random(cfg.seed)
    task = task_of(cfg)
    test = sample_problems(cfg.family, range(cfg.min_length, cfg.max_length + 1), cfg.test_per_length, rng,
                           cfg.modulus, max_share=TEST_SHARE)
    held_out = frozenset(test)
    rows = []
    while len(rows) < cfg.train_examples:
        problem = task.problem(rng)
        if problem not in held_out:
            rows.append(task.row(TracedProblem(problem, rng.choice(cfg.strides))))
    train_path = write_jsonl(data_dir / "train.jsonl", rows)
    test_path = write_jsonl(data_dir / "test.jsonl", [task.row(TracedProblem(p, s)) for p in test for s in cfg.strides])
    return test, train_path, test_path


def context_length(cfg: ReasoningConfig) -> int:
    """Tokens of the longest example (prompt + finest trace + end-of-text) plus the decoding slack, rounded up to
    a multiple of 8."""
    longest = random_problem(cfg.family, cfg.max_length, random.Random(0), cfg.modulus)
    finest = min((s for s in cfg.strides if s > 0), default=0)
    n = len(prompt(longest, max(cfg.strides))) + len(trace(longest, finest)) + 1 + EXTRA_TOKENS
    return 8 * -(-n // 8)


# ---------------------------------------------------------------------------------------------- decoding


@torch.no_grad()
def decode_cell(
    model: FullBandwidthLM, tokenizer: Tokenizer, task: ReasoningTask, problems: list[Problem], stride: int,
    mode: str, fused_passes: int
) -> dict[str, Any]:
    """Greedy solutions of ``problems`` (all of one length) at ``stride`` -> accuracy and trace lengths."""
    examples = [TracedProblem(p, stride) for p in problems]
    prompts = [tokenizer.encode(task.prompt(e)) for e in examples]
    # Room for the reference trace and a few tokens more, so an overlong answer shows in the lengths.
    room = model.config.max_seq_len - max(len(ids) for ids in prompts)
    max_new_tokens = min(room, max(len(task.completion(e)) for e in examples) + 1 + EXTRA_TOKENS)
    outputs = model.generate(prompts, max_new_tokens=max_new_tokens, mode=mode, prefill_passes=fused_passes,
                             stop_token_ids=[tokenizer.eos_id])
    correct, exact, lengths = 0, 0, []
    for example, ids, out in zip(examples, prompts, outputs, strict=True):
        generated = [t for t in out[len(ids) :] if t != tokenizer.eos_id]
        text = tokenizer.decode(generated)
        correct += task.score(example, text)
        exact += text == task.completion(example)
        lengths.append(len(generated))
    stats = summarize(lengths)
    return {"n": len(problems), "accuracy": correct / len(problems), "exact_trace": exact / len(problems),
            "mean_len": stats["mean"], "median_len": stats["median"]}


def evaluate(cfg: ReasoningConfig, model_dirs: dict[str, str], test: list[Problem]) -> list[dict[str, Any]]:
    """Every (model, mode, stride, length) cell."""
    tokenizer, task = ByteTokenizer(), task_of(cfg)
    by_length: dict[int, list[Problem]] = {}
    for p in test:
        by_length.setdefault(p.n, []).append(p)
    variants = [("baseline", "standard")] + [("fullband", mode) for mode in cfg.modes]
    jobs = [(kind, mode, s, n) for kind, mode in variants for s in cfg.strides for n in sorted(by_length)]
    models = {kind: load_any(path, device=cfg.device) for kind, path in model_dirs.items()}  # native or retrofitted
    cells = []
    for kind, mode, stride, n in tqdm(jobs, desc="decoding", disable=not cfg.progress):
        cell = decode_cell(models[kind], tokenizer, task, by_length[n], stride, mode, cfg.fused_passes)
        cells.append({"model": kind, "mode": mode, "variant": variant_name(kind, mode, cfg.fused_passes),
                      "stride": stride, "length": n, **cell})
    return cells


# ---------------------------------------------------------------------------------------------- analysis


def pooled(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cells of every (variant, stride) pooled over lengths (means weighted by the number of problems)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["variant"], c["stride"]), []).append(c)
    out = []
    for (variant, stride), group in groups.items():
        total = sum(c["n"] for c in group)
        mean = {k: sum(c[k] * c["n"] for c in group) / total for k in ("accuracy", "exact_trace", "mean_len")}
        out.append({"variant": variant, "stride": stride, "length": "all", "n": total, **mean})
    return out


def equal_accuracy(cells: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    """Per length (and pooled): the baseline's best accuracy less TOLERANCE, and the shortest mean trace with
    which each variant reaches it (None: never)."""
    rows = []
    for length in sorted({c["length"] for c in cells}, key=lambda x: (isinstance(x, str), x)):
        here = [c for c in cells if c["length"] == length]
        target = max(0.0, max(c["accuracy"] for c in here if c["variant"] == "baseline") - TOLERANCE)
        row: dict[str, Any] = {"length": length, "target_accuracy": round(target, 4)}
        for variant in variants:
            reached = [c["mean_len"] for c in here if c["variant"] == variant and c["accuracy"] >= target]
            row[variant] = min(reached) if reached else None
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- output


def tables(results: dict[str, Any]) -> dict[str, str]:
    """The study's markdown tables: training, accuracy, trace length, equal accuracy."""
    cells, variants = results["cells"], results["variants"]
    lengths = [*sorted({c["length"] for c in cells if c["length"] != "all"}), "all"]
    strides = results["config"]["strides"]
    index = {(c["variant"], c["stride"], c["length"]): c for c in cells}

    def grid(key: str, fmt: str) -> str:
        rows = [[v, stride_name(s)] + [format(index[v, s, n][key], fmt) for n in lengths]
                for v in variants for s in strides]
        return markdown_table(["model / mode", "trace", *[f"n={n}" for n in lengths]], rows)

    median_rows = [[v, stride_name(s)] + [format(index[v, s, n]["median_len"], ".0f") for n in lengths[:-1]]
                   for v in variants for s in strides]
    equal = [[r["length"], f"{r['target_accuracy']:.2f}"] + ["—" if r[v] is None else f"{r[v]:.1f}" for v in variants]
             for r in results["equal_accuracy"]]
    return {
        "training": training_table(results["training"]),
        "accuracy": grid("accuracy", ".2f"),
        "exact_trace": grid("exact_trace", ".2f"),
        "mean_len": grid("mean_len", ".1f"),
        "median_len": markdown_table(["model / mode", "trace", *[f"n={n}" for n in lengths[:-1]]], median_rows),
        "equal_accuracy": markdown_table(["length", "target acc.", *[f"{v} len" for v in variants]], equal),
    }


def render_report(results: dict[str, Any], command: str, plots: bool = True) -> str:
    cfg, t = results["config"], tables(results)
    figure = f"![accuracy vs trace length]({PLOT})" if plots else "(No plot: matplotlib is not installed.)"
    return f"""# Reasoning traces: shorter traces at equal accuracy?

Generated by `{command}` (fullband.experiments.reasoning); every number below comes from `results.json` next to
this file.

**Task.** {TASK_TEXT[cfg['family']].format(**cfg)} The prompt ends with the trace granularity: stride s writes
the state after every s-th step, stride 0 the answer only (`{_example(cfg)}`). Training mixes strides
{list(cfg['strides'])} uniformly over lengths n = {cfg['min_length']}..{cfg['max_length']} ({cfg['train_examples']}
examples); {cfg['test_per_length']} held-out problems per length (at most half of all the
problems of a length) are solved greedily at every stride. Trace length = generated tokens (bytes) without
end-of-text. Both models: d_model={cfg['d_model']}, {cfg['n_layers']} layers, {cfg['n_heads']} heads,
{cfg['steps']} steps of batch {cfg['batch_size']} on the same batches; the full-bandwidth model trains
multi-pass (pass mix {list(cfg['pass_mix'])}) after {cfg['feedback_start']:.0%} of the steps. The baseline has no
feedback, so all its modes are one model (reported once, as "baseline").

## Training

{t['training']}

## Accuracy (final answer) per length n

{t['accuracy']}

## Exact-trace rate (every written value right) per length n

{t['exact_trace']}

## Mean trace length (tokens)

{t['mean_len']}

## Median trace length (tokens)

{t['median_len']}

## Equal accuracy: shortest mean trace reaching the baseline's best accuracy less {TOLERANCE:.2f}

{t['equal_accuracy']}

— = this model/mode never reaches the target at that length with any stride.

{figure}
"""


def plot(results: dict[str, Any], path: Path) -> None:
    """Accuracy vs mean trace length, one panel per length (and all pooled), one line per model/mode."""
    plt = pyplot()
    cells, variants = results["cells"], results["variants"]
    lengths = [*sorted({c["length"] for c in cells if c["length"] != "all"}), "all"]
    cols = min(4, len(lengths))
    rows = -(-len(lengths) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False, sharey=True)
    for ax, length in zip(axes.flat, lengths, strict=False):
        for variant in variants:
            points = sorted((c["mean_len"], c["accuracy"], c["stride"]) for c in cells
                            if c["variant"] == variant and c["length"] == length)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant,
                    **line_style(variant))
        ax.set_title(f"n = {length}" if length != "all" else "all lengths")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(lengths) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("mean trace length (tokens)")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("Accuracy vs mean trace length (one point per trace granularity)")
    save_figure(fig, path, dpi=110)


# ---------------------------------------------------------------------------------------------- the study


class ReasoningStudy(PairStudy):
    """``fullband eval-reasoning`` (see the module doc)."""

    command = "eval-reasoning"
    title = "reasoning traces"

    figure = PLOT
    draw = staticmethod(plot)
    report = staticmethod(render_report)

    def build_data(self, data_dir: Path) -> tuple[Path, Path]:
        self.test, train_path, test_path = build_data(self.cfg, data_dir)
        return train_path, test_path

    def context_length(self) -> int:
        return context_length(self.cfg)

    def evaluate(self, training: dict[str, dict[str, Any]]) -> dict[str, Any]:
        cells = evaluate(self.cfg, {k: v["model_dir"] for k, v in training.items()}, self.test)
        variants = list(dict.fromkeys(c["variant"] for c in cells))
        all_cells = cells + pooled(cells)
        return {"variants": variants, "cells": all_cells, "equal_accuracy": equal_accuracy(all_cells, variants)}


def run_reasoning(cfg: ReasoningConfig) -> dict[str, Any]:
    """The whole study (see the module docstring); returns what results.json holds."""
    return ReasoningStudy(cfg, cfg.progress).run()
