"""State tracking at the input layer (the paper's Figure 7): where in depth is the state linearly decodable?

``fullband eval-state`` runs the whole study:

1. sequences of every task of :mod:`fullband.tasks.state_tracking` (all ending on ``?``), trained on
   as prompt -> label (SFT, prompt masked) by the baseline and the full-bandwidth model on the same batches;
2. fresh probe sets; for each model and prefill (``standard`` = one plain pass, ``one-step`` = two passes with
   positions after the first fused, ``exact`` = full recurrence) the residual stream at the final token at every
   depth, 0 (the input layer) to n_layers (:mod:`fullband.experiments.state_tracking.probes`);
3. a closed-form ridge probe per (task, model, prefill, depth), fit on one set and scored on the other, and the
   model's own answer accuracy (its next token at ``?``) under each prefill.

The final token is shared by every sequence, so at depth 0 a plain position holds only its embedding: a probe
there is at chance, and beats chance only where the input carries state, i.e. at a fused position. The baseline
has no feedback: its prefills are all the same model, reported once as "baseline".

    out_dir/
      data/train.jsonl, data/test.jsonl     the training and validation sequences (prompt/completion JSONL)
      baseline/, fullband/                  the training runs (model/ inside each)
      results.json, report.md, probe_accuracy_vs_depth.png

The report (tables, report.md, the plot) is :mod:`.report`'s.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fullband.data import ByteTokenizer
from fullband.experiments.core.pair import PairStudy, cells_cache
from fullband.experiments.core.report import Report
from fullband.experiments.state_tracking.config import StateTrackingConfig
from fullband.experiments.state_tracking.probes import PREFILLS, final_token_states, fit_ridge_probe
from fullband.experiments.state_tracking.records import ProbeCell, ProbeScore, StateTrackingResults
from fullband.experiments.state_tracking.report import PLOT, plot_probes, report, summary
from fullband.families import load_any
from fullband.files import write_json
from fullband.model import FullBandwidthLM
from fullband.tasks.base import write_jsonl
from fullband.tasks.state_tracking import Example, StateTask, make_examples, num_classes


def variant_name(kind: str, prefill: str) -> str:
    return "baseline" if kind == "baseline" else f"fullband {prefill}"


def build_data(cfg: StateTrackingConfig, data_dir: Path) -> tuple[Path, Path]:
    """train.jsonl (``train_per_task`` per task, shuffled) and a small test.jsonl for the validation loss."""
    rng = random.Random(cfg.seed)
    train = make_examples(cfg.tasks, cfg.train_per_task, cfg.seq_len, rng)
    rng.shuffle(train)
    test = make_examples(cfg.tasks, max(1, cfg.probe_test // 4), cfg.seq_len, rng)
    tasks = {name: StateTask(name, cfg.seq_len) for name in cfg.tasks}
    return tuple(write_jsonl(data_dir / f"{name}.jsonl", [tasks[e.task].row(e) for e in examples])
                 for name, examples in (("train", train), ("test", test)))


def probe_sets(cfg: StateTrackingConfig) -> dict[str, tuple[list[Example], list[Example]]]:
    """Fresh (probe-fit, probe-test) examples per task, from a seed the training data does not use."""
    rng = random.Random(cfg.seed + 1_000_003)
    return {task: (make_examples((task,), cfg.probe_train, cfg.seq_len, rng),
                   make_examples((task,), cfg.probe_test, cfg.seq_len, rng)) for task in cfg.tasks}


def probe_model(
    model: FullBandwidthLM, prefill: str, sets: tuple[list[Example], list[Example]], task: str, ridge: float
) -> ProbeScore:
    """Probe accuracy at every depth and the model's answer accuracy, for one task under one prefill."""
    tokenizer = ByteTokenizer()
    device = model.embed.weight.device
    encoded = []
    for examples in sets:
        tokens = torch.tensor([tokenizer.encode(e.text) for e in examples], device=device)  # all of one length
        states, logits = final_token_states(model, tokens, PREFILLS[prefill])
        labels = torch.tensor([e.target for e in examples])
        answers = torch.tensor([tokenizer.encode(e.label)[0] for e in examples], device=device)  # one byte each
        encoded.append((states.cpu(), labels, (logits.argmax(-1) == answers).double().mean().item()))
    (fit_states, fit_labels, _), (test_states, test_labels, answer_accuracy) = encoded
    classes = num_classes(task)
    depths = [fit_ridge_probe(fit_states[d], fit_labels, classes, ridge).accuracy(test_states[d], test_labels)
              for d in range(fit_states.shape[0])]
    # Chance = what a probe on a constant feature scores: the fit set's majority class, measured on the test set.
    majority = int(torch.bincount(fit_labels, minlength=classes).argmax())
    chance = float((test_labels == majority).double().mean())
    return {"probe_accuracy": depths, "answer_accuracy": answer_accuracy, "chance": chance}


# ---------------------------------------------------------------------------------------------- the study


class StateTrackingStudy(PairStudy):
    """``fullband eval-state`` (see the module doc)."""

    command = "eval-state"
    title = "state tracking at the input layer"
    command_skip = ("reuse_models", "resume")

    def plot(self, results: StateTrackingResults) -> None:
        plot_probes(results, self.out_dir / PLOT)

    def report(self, results: StateTrackingResults, plots: bool) -> Report:
        return report(results, plots)

    def summary(self, results: StateTrackingResults) -> str:
        return f"{summary(results)}\n\n{super().summary(results)}"

    def build_data(self, data_dir: Path) -> tuple[Path, Path]:
        return build_data(self.cfg, data_dir)

    def context_length(self) -> int:
        return self.cfg.seq_len + 2

    def evaluate(self, training: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Every (task, model, prefill) cell. Each model's cells are written to cells-<model>.json in out_dir and,
        with ``resume``, read back instead of probing again (an interrupted study continues)."""
        cfg = self.cfg
        sets = probe_sets(cfg)
        variants = [("baseline", "standard")] + [("fullband", p) for p in cfg.prefills]
        by_kind: dict[str, list[ProbeCell]] = {}
        for kind in dict.fromkeys(kind for kind, _ in variants):
            cache = cells_cache(self.out_dir, kind)
            if cfg.resume and cache.is_file():
                by_kind[kind] = json.loads(cache.read_text())
                continue
            model = load_any(training[kind]["model_dir"], device=cfg.device)
            jobs = [(task, prefill) for task in cfg.tasks for k, prefill in variants if k == kind]
            by_kind[kind] = [{"task": task, "model": kind, "prefill": prefill,
                              "variant": variant_name(kind, prefill),
                              **probe_model(model, prefill, sets[task], task, cfg.ridge)}
                             for task, prefill in tqdm(jobs, desc=f"probing {kind}", disable=not cfg.progress)]
            write_json(cache, by_kind[kind])
        # The cells in the order of the study before caching: task, then variant.
        order = {variant_name(k, p): i for i, (k, p) in enumerate(variants)}
        cells = sorted((c for kind_cells in by_kind.values() for c in kind_cells),
                       key=lambda c: (cfg.tasks.index(c["task"]), order[c["variant"]]))
        return {"variants": [variant_name(k, p) for k, p in variants], "cells": cells}


def run_state_tracking(cfg: StateTrackingConfig) -> dict[str, Any]:
    """The whole study (see the module docstring); returns what results.json holds."""
    return StateTrackingStudy(cfg, cfg.progress).run()
