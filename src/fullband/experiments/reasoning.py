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
      data/train.jsonl, data/test.jsonl      the problems (prompt/completion JSONL; test_unseen.jsonl: the
                                             test_lengths outside the trained range)
      baseline/, fullband/                   the training runs (model/ inside each)
      results.json                           config, training summaries, every cell, equal-accuracy rows
      report.md, accuracy_vs_trace_length.png
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fullband.data import ByteTokenizer, Tokenizer
from fullband.experiments.config import ReasoningConfig
from fullband.experiments.parallel import map_jobs
from fullband.experiments.plots import pyplot, save_figure
from fullband.experiments.report import input_text
from fullband.experiments.results import write_json
from fullband.experiments.study import (
    PairStudy,
    StudyModel,
    line_style,
    markdown_table,
    summarize,
    train_both,
    training_table,
)
from fullband.model import FullBandwidthLM
from fullband.model_io import load_any
from fullband.tasks.base import write_jsonl
from fullband.tasks.reasoning import (
    Problem,
    ReasoningTask,
    TracedProblem,
    chance_level,
    prompt,
    random_problem,
    sample_problems,
    trace,
)

TOLERANCE = 0.05  # "equal accuracy" = within 5 points of the baseline's best
TEST_SHARE = 0.5  # at most half of the problems of a length are held out, the rest can be trained on
EXTRA_TOKENS = 8  # decoding budget beyond the reference trace
PLOT = "accuracy_vs_trace_length.png"
LENGTH_PLOT = "accuracy_vs_length.png"


TASK_TEXT = {
    "swaps": "The shell game: a ball starts under one of the cups a, b, c; each of n named steps A, B, ... names "
             "the cup it leaves in place and swaps the other two; the answer is where the ball ends up (state "
             "tracking over the permutations of 3 cups, which has no parallel shortcut like a sum has).",
    "swaps5": "The shell game with 5 cups a..e: each of n named steps A, B, ... names the two cups it swaps (`Bce` "
              "swaps c and e); the answer is where the ball ends up (the 10 transpositions generate S5, which is "
              "not solvable: its word problem is NC1-complete, so no fixed-depth transformer should solve it "
              "answer-only as n grows).",
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


def unseen_lengths(cfg: ReasoningConfig) -> list[int]:
    """The test lengths outside the trained range (length generalisation)."""
    return sorted(n for n in set(cfg.test_lengths) if not cfg.min_length <= n <= cfg.max_length)


def pass_mix_of(passes: int) -> tuple[float, ...]:
    """The schedule's pass mix (probabilities of 2, 3, ... passes) that always runs ``passes``."""
    return (0.0,) * (passes - 2) + (1.0,)


def objective_text(cfg: dict[str, Any]) -> str:
    """How the full-bandwidth model's multi-pass batches run, in words (results.json's config)."""
    if cfg.get("passes"):
        depth = f"{cfg['passes']} passes each, at most the batch's length (where every position is exact)"
    else:
        depth = f"pass mix {list(cfg['pass_mix'])} of 2, 3, ... passes"
    parts = [f"{depth}, from {cfg['feedback_start']:.0%} of the steps"]
    if cfg.get("grad_passes"):
        parts.append(f"gradients through pass 1 and the last {cfg['grad_passes']} pass"
                     f"{'es' * (cfg['grad_passes'] > 1)} only")
    parts.append("a random plain prefix per row" if cfg.get("prefix_mixin", True)
                 else "every position after the first fused (no prefix mixin)")
    if cfg.get("feedback_weight", 1.0) != 1.0:
        parts.append(f"λ = {cfg['feedback_weight']:g}")
    return "; ".join(parts)


def train_stride(cfg: ReasoningConfig, rng: random.Random) -> int:
    """A training example's stride: uniform over ``strides``, or answer-only with probability ``answer_share``."""
    if cfg.answer_share is None:
        return rng.choice(cfg.strides)
    return 0 if rng.random() < cfg.answer_share else rng.choice([s for s in cfg.strides if s != 0])


def build_data(cfg: ReasoningConfig, data_dir: Path) -> tuple[list[Problem], Path, Path]:
    """Held-out test problems (trained lengths, then the unseen ``test_lengths``), ``train.jsonl`` (random
    lengths and strides, test problems excluded; shortest problems first under a curriculum) and ``test.jsonl``
    (every test problem of a trained length at every stride; ``test_unseen.jsonl`` the rest)."""
    rng = random.Random(cfg.seed)
    task = task_of(cfg)
    test = sample_problems(cfg.family, range(cfg.min_length, cfg.max_length + 1), cfg.test_per_length, rng,
                           cfg.modulus, max_share=TEST_SHARE)
    held_out = frozenset(test)
    for n in unseen_lengths(cfg):  # never trained on, so nothing to hold out
        test += sample_problems(cfg.family, range(n, n + 1), cfg.test_per_length, rng, cfg.modulus)
    examples = []
    while len(examples) < cfg.train_examples:
        problem = task.problem(rng)
        if problem not in held_out:
            examples.append(TracedProblem(problem, train_stride(cfg, rng)))
    if cfg.curriculum > 0:  # the training file's order is the curriculum's (fullband train --data.curriculum)
        examples.sort(key=lambda e: e.problem.n)
    train_path = write_jsonl(data_dir / "train.jsonl", [task.row(e) for e in examples])
    # test.jsonl (the held-out loss of training) has the trained lengths only: unseen lengths reach positions
    # never trained on, whose loss would swamp it; they go to test_unseen.jsonl.
    def rows(problems: list[Problem]) -> list[dict[str, str]]:
        return [task.row(TracedProblem(p, s)) for p in problems for s in cfg.strides]

    test_path = write_jsonl(data_dir / "test.jsonl", rows([p for p in test if p in held_out]))
    if unseen := [p for p in test if p not in held_out]:
        write_jsonl(data_dir / "test_unseen.jsonl", rows(unseen))
    return test, train_path, test_path


def context_length(cfg: ReasoningConfig) -> int:
    """Tokens of the longest example (prompt + finest trace + end-of-text) plus the decoding slack, rounded up to
    a multiple of 8."""
    longest = random_problem(cfg.family, max((cfg.max_length, *cfg.test_lengths)), random.Random(0), cfg.modulus)
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
    start = time.perf_counter()
    outputs = model.generate(prompts, max_new_tokens=max_new_tokens, mode=mode, prefill_passes=fused_passes,
                             stop_token_ids=[tokenizer.eos_id])
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
             ) -> list[dict[str, Any]]:
    """Every (model, mode, stride, length) cell. ``controls``: (kind, mode, variant, extra passes per length) of the
    control models, decoded answer-only. ``cache_dir``: each model's cells are written to cells-<kind>.json there,
    and read back instead of decoding again when ``cfg.resume`` (an interrupted study continues)."""
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
    cells = []
    for kind in dict.fromkeys(job[0] for job in jobs):
        cache = cache_dir / f"cells-{kind}.json" if cache_dir is not None else None
        if cache is not None and cfg.resume and cache.is_file():
            cells += json.loads(cache.read_text())
            continue
        model = load_any(model_dirs[kind], device=cfg.device)  # any model family
        mine = []
        for _, mode, name, stride, n, k in tqdm([j for j in jobs if j[0] == kind], desc=f"decoding {kind}",
                                                disable=not cfg.progress):
            cell = decode_cell(model, tokenizer, task, by_length[n], stride, mode, k)
            mine.append({"model": kind, "mode": mode, "variant": name, "stride": stride, "length": n, **cell})
        if cache is not None:
            write_json(cache, mine)
        cells += mine
    return cells


# ---------------------------------------------------------------------------------------------- analysis


def pooled(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cells of every (variant, stride, seed) pooled over lengths (means weighted by the number of problems)."""
    groups: dict[tuple[str, int, Any], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["variant"], c["stride"], c.get("seed")), []).append(c)
    out = []
    for (variant, stride, seed), group in groups.items():
        total = sum(c["n"] for c in group)
        keys = [k for k in ("accuracy", "exact_trace", "mean_len", "ms_per_problem") if k in group[0]]
        mean = {k: sum(c[k] * c["n"] for c in group) / total for k in keys}
        out.append({"variant": variant, "stride": stride, "length": "all", "n": total, **mean}
                   | ({} if seed is None else {"seed": seed}))
    return out


METRICS = ("accuracy", "exact_trace", "mean_len", "median_len", "ms_per_problem")


def over_seeds(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (variant, stride, length): each metric's mean over the seeds, and its sd as ``<metric>_sd``
    (0 with one seed)."""
    groups: dict[tuple[str, int, Any], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["variant"], c["stride"], c["length"]), []).append(c)
    out = []
    for group in groups.values():
        row = {k: v for k, v in group[0].items() if k != "seed"}
        for key in METRICS:
            if key in row:
                values = [c[key] for c in group]
                row[key] = statistics.fmean(values)
                row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(row | {"seeds": len(group)})
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


def _value(cell: dict[str, Any], key: str, fmt: str) -> str:
    sd = cell.get(f"{key}_sd", 0.0)
    return format(cell[key], fmt) + (f" ± {format(sd, fmt)}" if cell.get("seeds", 1) > 1 else "")


def _lengths(cells: list[dict[str, Any]]) -> list[int]:
    return sorted({c["length"] for c in cells if c["length"] != "all"})


def tables(results: dict[str, Any]) -> dict[str, str]:
    """The study's markdown tables: training, accuracy, trace length, decoding time, equal accuracy."""
    cells, variants = results["cells"], results["variants"]
    lengths = [*_lengths(cells), "all"]
    strides = results["config"]["strides"]
    index = {(c["variant"], c["stride"], c["length"]): c for c in cells}

    def grid(key: str, fmt: str, columns: list[Any] = lengths) -> str:
        rows = [[v, stride_name(s)] + [_value(index[v, s, n], key, fmt) if (v, s, n) in index else "—"
                                        for n in columns]
                for v in variants for s in strides if (v, s, "all") in index]  # controls: answer-only only
        return markdown_table(["model / mode", "trace", *[f"n={n}" for n in columns]], rows)

    equal = [[r["length"], f"{r['target_accuracy']:.2f}"] + ["—" if r[v] is None else f"{r[v]:.1f}" for v in variants]
             for r in results["equal_accuracy"]]
    return {
        "training": training_table(results["training"]),
        "accuracy": grid("accuracy", ".2f"),
        "exact_trace": grid("exact_trace", ".2f"),
        "mean_len": grid("mean_len", ".1f"),
        "median_len": grid("median_len", ".0f", lengths[:-1]),
        "ms_per_problem": grid("ms_per_problem", ".1f", ["all"]),
        "equal_accuracy": markdown_table(["length", "target acc.", *[f"{v} len" for v in variants]], equal),
    }


def chance(cfg: dict[str, Any]) -> float:
    """Accuracy of a uniform guess at the answer."""
    return chance_level(cfg["family"], cfg["modulus"])


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def verdict(results: dict[str, Any]) -> list[str]:
    """The report's first lines: does answer-only accuracy with recurrent (exact) prefill beat the baseline, by
    how much, and at what cost (training compute and time, decoding time)."""
    cfg, cells = results["config"], results["cells"]
    if 0 not in cfg["strides"]:
        return ["No answer-only stride (0) was evaluated, so the study cannot say whether recurrent prefill "
                "solves without a trace: add 0 to --strides."]
    index = {(c["variant"], c["length"]): c for c in cells if c["stride"] == 0}
    fullband = [v for v in results["variants"] if v.startswith("fullband")]  # not the controls
    mode = "fullband exact" if "fullband exact" in fullband else max(
        fullband, key=lambda v: index[v, "all"]["accuracy"])
    trained = [n for n in _lengths(cells) if cfg["min_length"] <= n <= cfg["max_length"]]
    unseen = [n for n in _lengths(cells) if n not in trained]

    def acc(variant: str, ns: list[int]) -> float:
        return _mean([index[variant, n]["accuracy"] for n in ns])

    def per_n(ns: list[int]) -> str:
        return ", ".join(f"n={n} {_value(index[mode, n], 'accuracy', '.2f')} vs "
                         f"{_value(index['baseline', n], 'accuracy', '.2f')}" for n in ns)

    def compared(ns: list[int]) -> tuple[str, float]:
        gain = acc(mode, ns) - acc("baseline", ns)
        if gain > TOLERANCE and acc(mode, ns) <= chance(cfg) + TOLERANCE:  # both no better than a guess
            return "is at chance, like", gain
        return "beats" if gain > TOLERANCE else "does not beat" if gain < -TOLERANCE else "ties (within 0.05)", gain

    word, gain = compared(trained)
    seeds = cfg.get("seeds", 1)
    past = ""
    if unseen:
        word_unseen, gain_unseen = compared(unseen)
        past = (f" **Past the trained lengths it {word_unseen} the baseline**: {acc(mode, unseen):.2f} against "
                f"{acc('baseline', unseen):.2f} (mean over n = {', '.join(map(str, unseen))}, never trained on, "
                f"difference {gain_unseen:+.2f}; chance {chance(cfg):.2f}).")
    lines = [f"**Answer-only accuracy with {mode.removeprefix('fullband ')} prefill {word} the baseline**: "
             f"{acc(mode, trained):.2f} against {acc('baseline', trained):.2f} (mean over the trained lengths "
             f"n = {trained[0]}..{trained[-1]}, difference {gain:+.2f}; {seeds} seed{'s' * (seeds > 1)}; chance "
             f"{chance(cfg):.2f}).{past}", "",
             f"- Per length ({mode} vs baseline): {per_n(trained)}."]
    if unseen:
        lines.append(f"- Unseen lengths (never trained on): {per_n(unseen)}.")
    best = max(fullband, key=lambda v: acc(v, trained))
    lines.append(f"- Best full-bandwidth mode answer-only: {best} ({acc(best, trained):.2f} over the trained lengths"
                 + (f", {acc(best, unseen):.2f} over the unseen ones" if unseen else "") + ").")
    # Issue 17's target: >= 0.9 at the longest trained length, and 0.4 above the baseline's best stride-0
    # accuracy at the first unseen length.
    top = trained[-1]
    target = f"- Target (>= 0.90 at n = {top}"
    met = index[mode, top]["accuracy"] >= 0.9
    if unseen:
        margin = index[mode, unseen[0]]["accuracy"] - index["baseline", unseen[0]]["accuracy"]
        target += f", and >= baseline + 0.40 at n = {unseen[0]}"
        met = met and margin >= 0.4
    lines.append(f"{target}): {'met' if met else 'not met'} ({mode} at n = {top}: "
                 f"{index[mode, top]['accuracy']:.2f}" + (f"; margin at n = {unseen[0]}: {margin:+.2f}" if unseen
                                                          else "") + ").")
    training = results["training"]

    def total(kind: str, key: str) -> float:
        return sum(t[key] for name, t in training.items() if name.split()[0] == kind)

    ms = {v: index[v, "all"]["ms_per_problem"] for v in ("baseline", mode)}
    compute = total("fullband", "token_equiv_compute") / total("baseline", "tokens")
    lines.append(f"- Cost: training the full-bandwidth model took {compute:.1f}x "
                 f"the baseline's forward compute (passes run, with or without gradients: {objective_text(cfg)}) "
                 f"and {total('fullband', 'seconds'):.0f} s against "
                 f"{total('baseline', 'seconds'):.0f} s; answer-only decoding with {mode.removeprefix('fullband ')} "
                 f"prefill (one position at a time over the prompt) {ms[mode]:.1f} ms per problem against "
                 f"the baseline's {ms['baseline']:.1f} ms ({ms[mode] / ms['baseline']:.1f}x).")
    if "seconds" in results:
        workers = min(cfg.get("workers", 1), seeds)
        how = f"side by side in {workers} processes" if workers > 1 else "one after the other"
        reused = " (evaluating models an earlier run trained)" if cfg.get("reuse_models") else ""
        lines.append(f"- Wall time of this command{reused}: {results['seconds'] / 60:.1f} min, the seeds {how} "
                     f"(threads {cfg.get('threads', '1')}{', shared out' if workers > 1 else ''}).")
    return lines


def render_report(results: dict[str, Any], command: str, plots: bool = True) -> str:
    cfg, t = results["config"], tables(results)
    figures = (f"![accuracy vs trace length]({PLOT})\n\n![accuracy vs problem length]({LENGTH_PLOT})" if plots
               else "(No plots: matplotlib is not installed.)")
    unseen = [n for n in cfg.get("test_lengths", ()) if not cfg["min_length"] <= n <= cfg["max_length"]]
    seeds = cfg.get("seeds", 1)
    curriculum = (f" A length curriculum draws the shortest problems first over the first {cfg['curriculum']:.0%} of "
                  "the steps." if cfg.get("curriculum") else "")
    answer = ("" if cfg.get("answer_share") is None else
              f" {cfg['answer_share']:.0%} of the training examples are answer-only, the rest split over the other "
              "strides.")
    verdict_lines = "\n".join(verdict(results))
    return f"""# Reasoning traces: shorter traces at equal accuracy?

Generated by `{command}` (fullband.experiments.reasoning); every number below comes from `results.json` next to
this file{f', mean ± sd over {seeds} seeds' if seeds > 1 else ''}.

## Verdict

{verdict_lines}

## Setup

**Task.** {TASK_TEXT[cfg['family']].format(**cfg)} The prompt ends with the trace granularity: stride s writes
the state after every s-th step, stride 0 the answer only (`{_example(cfg)}`). Training mixes strides
{list(cfg['strides'])} over lengths n = {cfg['min_length']}..{cfg['max_length']} ({cfg['train_examples']}
examples).{answer}{curriculum} {cfg['test_per_length']} held-out problems per length (at most half of all the
problems of a length){f', plus unseen lengths {unseen} never trained on,' if unseen else ''} are solved greedily at
every stride. Trace length = generated tokens (bytes) without end-of-text. Both models: d_model={cfg['d_model']},
{cfg['n_layers']} layers, {cfg['n_heads']} heads, {cfg['steps']} steps of batch {cfg['batch_size']} on the same
batches, optimizer {cfg.get('optimizer', 'adamw')}, {input_text({'input_norm': cfg.get('input_norm', True)})};
the full-bandwidth model trains multi-pass ({objective_text(cfg)}). The baseline has no feedback, so all
its modes are one model (reported once, as "baseline"). Modes of the full-bandwidth model: standard (no
feedback), soft (feedback while decoding only), fused(k) (k extra fused passes over the prompt), exact (the
prompt fully recurrent, one position at a time).

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

## Decoding time (ms per problem, batched greedy decoding, all lengths)

{t['ms_per_problem']}

## Equal accuracy: shortest mean trace reaching the baseline's best accuracy less {TOLERANCE:.2f}

{t['equal_accuracy']}

— = this model/mode never reaches the target at that length with any stride.

{figures}
"""


def plot(results: dict[str, Any], path: Path) -> None:
    """Accuracy vs mean trace length, one panel per length (and all pooled), one line per model/mode."""
    plt = pyplot()
    cells, variants = results["cells"], results["variants"]
    lengths = [*_lengths(cells), "all"]
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


def plot_lengths(results: dict[str, Any], path: Path) -> None:
    """Length generalisation: accuracy vs problem length n, one panel per stride, one line per model/mode (error
    bars: sd over seeds); lengths past the trained range are shaded, chance dotted."""
    plt = pyplot()
    cfg, cells, variants = results["config"], results["cells"], results["variants"]
    strides = cfg["strides"]
    fig, axes = plt.subplots(1, len(strides), figsize=(3.8 * len(strides), 3.2), squeeze=False, sharey=True)
    for ax, stride in zip(axes[0], strides, strict=True):
        for variant in variants:
            points = sorted((c["length"], c["accuracy"], c.get("accuracy_sd", 0.0)) for c in cells
                            if c["variant"] == variant and c["stride"] == stride and c["length"] != "all")
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                        label=variant, capsize=2, **line_style(variant))
        ax.axhline(chance(cfg), color="black", lw=0.8, ls=":")
        ax.axvspan(cfg["max_length"] + 0.5, max(c["length"] for c in cells if c["length"] != "all") + 0.5,
                   color="grey", alpha=0.12, lw=0)
        ax.set_title(stride_name(stride))
        ax.set_xlabel("problem length n (shaded: never trained on)")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("accuracy")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Accuracy vs problem length, per trace granularity")
    save_figure(fig, path, dpi=110)


def draw(results: dict[str, Any], path: Path) -> None:
    plot(results, path)
    plot_lengths(results, path.with_name(LENGTH_PLOT))


# ---------------------------------------------------------------------------------------------- the study


class ReasoningStudy(PairStudy):
    """``fullband eval-reasoning`` (see the module doc)."""

    command = "eval-reasoning"
    title = "reasoning traces"
    command_skip = ("reuse_models", "resume")
    timed = True  # the report states the command's wall time (its cost, with the seeds run side by side or not)

    figure = PLOT
    draw = staticmethod(draw)
    report = staticmethod(render_report)

    def build_data(self, data_dir: Path) -> tuple[Path, Path]:
        self.test, train_path, test_path = build_data(self.cfg, data_dir)
        return train_path, test_path

    def context_length(self) -> int:
        return context_length(self.cfg)

    def recipe(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"optimizer": cfg.optimizer, "muon_lr": cfg.muon_lr, "fusion_lr_mult": cfg.fusion_lr_mult,
                "input_norm": cfg.input_norm, "curriculum": cfg.curriculum, "grad_passes": cfg.grad_passes,
                "prefix_mixin": cfg.prefix_mixin, "feedback_weight": cfg.feedback_weight}

    def model_spec(self, seed: int) -> StudyModel:
        spec = super().model_spec(seed)
        if self.cfg.passes:  # every multi-pass batch runs `passes` passes (0: the pass mix)
            spec = dataclasses.replace(spec, pass_mix=pass_mix_of(self.cfg.passes))
        return spec

    def collect(self) -> dict[str, Any]:
        """Both models per seed (one seed: in out_dir itself; more: out_dir/seed<k>/), every cell per seed, then
        the cells' means and sds over the seeds."""
        cfg = self.cfg
        train_path, test_path = self.build_data(self.out_dir / "data")
        seeds = range(cfg.seed, cfg.seed + cfg.seeds)
        side_by_side = min(cfg.workers, cfg.seeds) > 1  # else map_jobs runs them here, where bars can show
        jobs = [(cfg, self.model_spec(seed), train_path, test_path,
                 self.out_dir if cfg.seeds == 1 else self.out_dir / f"seed{seed}", self.test,
                 cfg.progress and not side_by_side) for seed in seeds]
        if side_by_side and cfg.progress:
            print(f"training and evaluating {cfg.seeds} seeds, {min(cfg.workers, cfg.seeds)} at a time", flush=True)
        training: dict[str, dict[str, Any]] = {}
        seed_cells: list[dict[str, Any]] = []
        for seed, (runs, cells) in zip(seeds, map_jobs(train_and_evaluate, jobs, cfg.workers), strict=True):
            training.update({kind if cfg.seeds == 1 else f"{kind} seed{seed}": t for kind, t in runs.items()})
            seed_cells += [c | {"seed": seed} for c in cells]
        variants = list(dict.fromkeys(c["variant"] for c in seed_cells))
        all_cells = over_seeds(seed_cells + pooled(seed_cells))
        return {"study": self.title, "config": dataclasses.asdict(cfg), "training": training, "variants": variants,
                "cells": all_cells, "seed_cells": seed_cells, "equal_accuracy": equal_accuracy(all_cells, variants)}


def train_and_evaluate(cfg: ReasoningConfig, spec: StudyModel, train_path: Path, test_path: Path, run_dir: Path,
                       test: list[Problem], progress: bool) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """One seed: both models trained into ``run_dir`` (or reused), then every cell evaluated -> (training
    summaries, cells). Module-level, so that seeds can run in worker processes (``cfg.workers``)."""
    runs = train_both(spec, train_path, test_path, run_dir, progress, reuse=cfg.reuse_models, resume=cfg.resume)
    controls: tuple = ()
    if cfg.controls:  # the looped and equal-FLOPs models, and every model's FLOPs (fullband.experiments.controls)
        from fullband.experiments.controls import annotate_flops, train_controls

        runs, controls = train_controls(cfg, spec, train_path, test_path, run_dir, test, runs, progress)
    cells = evaluate(cfg, {kind: t["model_dir"] for kind, t in runs.items()}, test, controls, run_dir)
    if cfg.controls:
        annotate_flops(cfg, runs, cells, test)
    return runs, cells


def run_reasoning(cfg: ReasoningConfig) -> dict[str, Any]:
    """The study of one family (see the module docstring); returns what results.json holds. Several families with
    their controls: :func:`fullband.experiments.controls_study.run_families`."""
    return ReasoningStudy(cfg, cfg.progress).run()
