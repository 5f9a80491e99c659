"""Decoding and scoring of ``fullband eval-reasoning``: greedy solutions of every test problem per model, mode,
stride and length (a *cell*), the cells pooled over lengths and over seeds, and the equal-accuracy rows."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fullband.data import ByteTokenizer, Tokenizer
from fullband.experiments.core.pair import cells_cache, summarize
from fullband.experiments.reasoning.config import ReasoningConfig
from fullband.experiments.reasoning.data import EXTRA_TOKENS, task_of
from fullband.experiments.reasoning.records import Cell, DecodedCell
from fullband.families import load_any
from fullband.files import write_json
from fullband.generation.decoding import generate
from fullband.model import FullBandwidthLM
from fullband.modes import DecodingMode
from fullband.tasks.reasoning import Problem, ReasoningTask, TracedProblem

TOLERANCE = 0.05  # "equal accuracy" = within 5 points of the baseline's best
METRICS = ("accuracy", "exact_trace", "mean_len", "median_len", "ms_per_problem")


def variant_name(kind: str, mode: str, fused_passes: int) -> str:
    if kind == "baseline":
        return "baseline"
    return f"fullband {DecodingMode.parse(mode, fused_passes).label}"  # e.g. "fullband fused(2)"


@torch.no_grad()
def decode_cell(
    model: FullBandwidthLM, tokenizer: Tokenizer, task: ReasoningTask, problems: list[Problem], stride: int,
    mode: str, fused_passes: int
) -> DecodedCell:
    """Greedy solutions of ``problems`` (all of one length) at ``stride`` -> accuracy and trace lengths."""
    examples = [TracedProblem(p, stride) for p in problems]
    prompts = [tokenizer.encode(task.prompt(e)) for e in examples]
    # Room for the reference trace and a few tokens more, so an overlong answer shows in the lengths.
    room = model.config.max_seq_len - max(len(ids) for ids in prompts)
    max_new_tokens = min(room, max(len(task.completion(e)) for e in examples) + 1 + EXTRA_TOKENS)
    start = time.perf_counter()
    decoding = DecodingMode.parse(f"fused:{fused_passes}") if mode == "fused" else mode  # the study's count apart
    outputs = generate(model, prompts, max_new_tokens=max_new_tokens, mode=decoding, stop_token_ids=[tokenizer.eos_id])
    seconds = time.perf_counter() - start
    correct, exact, lengths = 0, 0, []
    for example, ids, out in zip(examples, prompts, outputs, strict=True):
        generated = [t for t in out[len(ids) :] if t != tokenizer.eos_id]
        text = tokenizer.decode(generated)
        correct += task.score(example, text)
        exact += text == task.completion(example)
        lengths.append(len(generated))
    stats = summarize(lengths)
    return {"n": len(problems), "accuracy": correct / len(problems), "exact_trace": exact / len(problems),
            "mean_len": stats["mean"], "median_len": stats["median"], "ms_per_problem": 1000 * seconds / len(problems)}


def evaluate(cfg: ReasoningConfig, model_dirs: dict[str, str], test: list[Problem],
             controls: tuple[tuple[str, str, str, dict[int, int]], ...] = (), cache_dir: Path | None = None,
             progress: bool = True) -> list[Cell]:
    """Every (model, mode, stride, length) cell of the models in ``model_dirs`` (baseline, fullband and the
    controls, or some of them). ``controls``: (kind, mode, variant, extra passes per length) of the control models,
    decoded answer-only. ``cache_dir``: each model's cells are written to cells-<kind>.json there, and read back
    instead of decoding again when ``cfg.resume`` (an interrupted study continues). ``progress``: a bar per model
    (with ``cfg.progress``; a worker process shows none)."""
    tokenizer, task = ByteTokenizer(), task_of(cfg)
    by_length: dict[int, list[Problem]] = {}
    for p in test:
        by_length.setdefault(p.n, []).append(p)
    # fused mode once per number of prefill passes: accuracy against the depth of the iteration
    variants = [("baseline", "standard", 0)] + [("fullband", mode, k) for mode in cfg.modes
                                                 for k in (cfg.fused_passes if mode == "fused" else (0,))]
    jobs = [(kind, mode, variant_name(kind, mode, k), s, n, k) for kind, mode, k in variants for s in cfg.strides
            for n in sorted(by_length)]
    jobs += [(kind, mode, name, 0, n, passes.get(n, 0)) for kind, mode, name, passes in controls
             for n in sorted(by_length)]
    cells: list[Cell] = []
    for kind in dict.fromkeys(job[0] for job in jobs if job[0] in model_dirs):
        cache = cells_cache(cache_dir, kind) if cache_dir is not None else None
        if cache is not None and cfg.resume and cache.is_file():
            cells += json.loads(cache.read_text())
            continue
        model = load_any(model_dirs[kind], device=cfg.device)  # any model family
        mine: list[Cell] = []
        for _, mode, name, stride, n, k in tqdm([j for j in jobs if j[0] == kind], desc=f"decoding {kind}",
                                                disable=not (cfg.progress and progress)):
            cell = decode_cell(model, tokenizer, task, by_length[n], stride, mode, k)
            mine.append({"model": kind, "mode": mode, "variant": name, "stride": stride, "length": n, **cell})
        if cache is not None:
            write_json(cache, mine)
        cells += mine
    return cells


def pooled(cells: list[Cell]) -> list[Cell]:
    """Cells of every (variant, stride, seed) pooled over lengths (means weighted by the number of problems)."""
    groups: dict[tuple[str, int, Any], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c["variant"], c["stride"], c.get("seed")), []).append(c)
    out: list[Cell] = []
    for (variant, stride, seed), group in groups.items():
        total = sum(c["n"] for c in group)
        keys = [k for k in ("accuracy", "exact_trace", "mean_len", "ms_per_problem") if k in group[0]]
        mean = {k: sum(c[k] * c["n"] for c in group) / total for k in keys}
        out.append({"variant": variant, "stride": stride, "length": "all", "n": total, **mean}
                   | ({} if seed is None else {"seed": seed}))
    return out


def over_seeds(cells: list[Cell]) -> list[Cell]:
    """One cell per (variant, stride, length): each metric's mean over the seeds, and its sd as ``<metric>_sd``
    (0 with one seed)."""
    groups: dict[tuple[str, int, Any], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c["variant"], c["stride"], c["length"]), []).append(c)
    out: list[Cell] = []
    for group in groups.values():
        row = {k: v for k, v in group[0].items() if k != "seed"}
        for key in METRICS:
            if key in row:
                values = [c[key] for c in group]
                row[key] = statistics.fmean(values)
                row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(row | {"seeds": len(group)})
    return out


def equal_accuracy(cells: list[Cell], variants: list[str]) -> list[dict[str, Any]]:
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
