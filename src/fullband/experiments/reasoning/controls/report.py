"""The report of the controls study (fullband.experiments.reasoning.controls): verdict per family, compute,
answer-only accuracy with 95% Wilson intervals and worst seeds, every seed's cells, the accuracy-vs-training-FLOPs plot.
Reads results.json alone (torch-free)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fullband.experiments.core.plots import pyplot, save_figure
from fullband.experiments.core.report import Report, Table
from fullband.experiments.core.stats import format_interval, pooled_wilson
from fullband.experiments.reasoning.records import Cell, ControlsResults, ReasoningResults
from fullband.tasks.reasoning import chance_level

FLOPS_PLOT = "accuracy_vs_training_flops.png"
TARGET_MARGIN = 0.3  # issue 29: full-bandwidth exact prefill this far above the best control at the first unseen n
MATCH = 0.05  # a control within this of the full-bandwidth model "matches" it
HEADLINE = "fullband exact"
ORDER = ("baseline", "looped", "equal-FLOPs baseline", "fullband standard", "fullband exact")
CONTROLS = ("baseline", "looped", "equal-FLOPs baseline")
FAMILY_NAMES = {"swaps": "3 cups (swaps)", "swaps5": "5 cups (swaps5)", "sum": "running sums (sum)"}


def seed_cells(family: ReasoningResults, variant: str, length: int) -> list[Cell]:
    """Every seed's answer-only cell of ``variant`` at ``length``."""
    return [c for c in family["seed_cells"] if c["variant"] == variant and c["length"] == length and c["stride"] == 0]


def accuracy(family: ReasoningResults, variant: str, length: int) -> dict[str, Any]:
    """Mean, worst seed, per-seed values and the pooled Wilson interval of an answer-only cell."""
    cells = seed_cells(family, variant, length)
    values = [c["accuracy"] for c in cells]
    return {"mean": statistics.fmean(values), "worst": min(values), "seeds": values,
            "interval": pooled_wilson(values, [c["n"] for c in cells]), "n": cells[0]["n"]}


def variants_of(family: ReasoningResults) -> list[str]:
    present = set(family["variants"])
    return [v for v in ORDER if v in present]


def lengths_of(family: ReasoningResults) -> tuple[list[int], list[int]]:
    """(trained lengths, unseen lengths) of a family's study."""
    cfg = family["config"]
    lengths = sorted({c["length"] for c in family["seed_cells"]})
    trained = [n for n in lengths if cfg["min_length"] <= n <= cfg["max_length"]]
    return trained, [n for n in lengths if n not in trained]


def headline_length(family: ReasoningResults) -> int:
    trained, unseen = lengths_of(family)
    return unseen[0] if unseen else trained[-1]


def _acc_text(a: dict[str, Any]) -> str:
    return f"{a['mean']:.2f} (worst seed {a['worst']:.2f}, 95% {format_interval(a['interval'])})"


def best_control(family: ReasoningResults, controls: list[str], n: int) -> tuple[str, dict[str, dict[str, Any]]]:
    """(the control with the highest mean accuracy at ``n``, every control's :func:`accuracy` there)."""
    scores = {v: accuracy(family, v, n) for v in controls}
    return max(controls, key=lambda v: scores[v]["mean"]), scores


def margin_at(family: ReasoningResults, controls: list[str], n: int) -> str:
    """Full-bandwidth exact prefill's mean accuracy at ``n`` less the best control's there, and which control."""
    best, scores = best_control(family, controls, n)
    return f"{accuracy(family, HEADLINE, n)['mean'] - scores[best]['mean']:+.2f} ({best})"


def seed_margins(family: ReasoningResults, controls: list[str], n: int) -> str:
    """Each seed's full-bandwidth exact prefill accuracy at ``n`` less that seed's best control (the mean margin
    can hide a seed whose control kept up)."""
    def by_seed(variant: str) -> dict[int, float]:
        return {c["seed"]: c["accuracy"] for c in seed_cells(family, variant, n)}

    full, rivals = by_seed(HEADLINE), {v: by_seed(v) for v in controls}
    return ", ".join(f"seed {seed} {acc - max(r[seed] for r in rivals.values()):+.2f}"
                     for seed, acc in sorted(full.items()))


def family_verdict(name: str, family: ReasoningResults) -> str:
    """One line: full-bandwidth exact prefill against the best control at the first unseen length."""
    n = headline_length(family)
    variants = variants_of(family)
    if HEADLINE not in variants:
        return f"- **{name}**: no `fullband exact` cells (add exact to --modes)."
    controls = [v for v in CONTROLS if v in variants]
    full = accuracy(family, HEADLINE, n)
    best, scores = best_control(family, controls, n)
    margin = full["mean"] - scores[best]["mean"]
    chance = chance_level(family["config"]["family"], family["config"]["modulus"])
    others = "; ".join(f"{v} {_acc_text(scores[v])}" for v in controls)
    detail = (f"full-bandwidth exact prefill {_acc_text(full)} at n = {n} against the best control, {best}, "
              f"{scores[best]['mean']:.2f}: {margin:+.2f} (target +{TARGET_MARGIN:.2f}; chance {chance:.2f}). "
              f"Seed by seed, over that seed's best control: {seed_margins(family, controls, n)}. "
              f"Controls: {others}.")
    if full["mean"] <= chance + MATCH:
        detail += " The full-bandwidth model itself is at chance here."
    unseen = lengths_of(family)[1]
    if len(unseen) > 1:  # a fixed-depth control may keep up for a few more steps and not for many
        detail += " Over the best control at each unseen length: " + ", ".join(
            f"n = {k} {margin_at(family, controls, k)}" for k in unseen) + "."
    if margin >= TARGET_MARGIN:
        return f"- **{name}: target met**: {detail}"
    matching = [v for v in controls if scores[v]["mean"] >= full["mean"] - MATCH]
    if matching:
        return (f"- **{name}: target not met; {' and '.join(matching)} match{'es' * (len(matching) == 1)} the "
                f"full-bandwidth model** (within {MATCH:.2f}), so here its accuracy is not evidence of state "
                f"carried along the sequence: {detail}")
    return f"- **{name}: target not met**, the full-bandwidth model leads every control by less than that: {detail}"


def verdict(results: ControlsResults) -> list[str]:
    lines = [family_verdict(FAMILY_NAMES.get(f, f), fam) for f, fam in results["families"].items()]
    for f, fam in results["families"].items():
        flops = training_flops(fam)
        if "baseline" in flops:
            ratios = ", ".join(f"{v} {flops[v] / flops['baseline']:.1f}x" for v in variants_of(fam)
                               if v in flops and v != "baseline")
            lines.append(f"- {FAMILY_NAMES.get(f, f)}: training FLOPs against the baseline's: {ratios}.")
    return lines


def _kind(variant: str) -> str:
    return {"looped": "looped", "equal-FLOPs baseline": "equal_flops"}.get(variant, variant.split()[0])


def training_flops(family: ReasoningResults) -> dict[str, float]:
    """Mean training FLOPs over the seeds per variant (the full-bandwidth modes share one model)."""
    out = {}
    for variant in variants_of(family):
        values = [t["training_flops"] for name, t in family["training"].items()
                  if name.split()[0] == _kind(variant) and "training_flops" in t]
        if values:
            out[variant] = statistics.fmean(values)
    return out


def compute_table(family: ReasoningResults) -> Table:
    n = headline_length(family)
    flops = training_flops(family)
    rows = []
    for variant in variants_of(family):
        runs = [t for name, t in family["training"].items() if name.split()[0] == _kind(variant)]
        cells = seed_cells(family, variant, n)
        if not runs or variant not in flops:
            continue
        layers = runs[0]["shape"]["n_layers"]
        rows.append([variant, layers, f"{runs[0]['weights']:,}", f"{flops[variant]:.3g}",
                     f"{flops[variant] / flops['baseline']:.1f}x",
                     f"{statistics.fmean(c['inference_flops'] for c in cells):.3g}",
                     f"{statistics.fmean(t['seconds'] for t in runs):.0f}"])
    return (["model / decoding", "blocks", "weights per token-pass N", "training FLOPs", "x baseline",
             f"inference FLOPs per problem (n = {n})", "training s (mean)"], rows)


def accuracy_table(family: ReasoningResults) -> Table:
    trained, unseen = lengths_of(family)
    lengths = trained + unseen
    rows = []
    for variant in variants_of(family):
        cells = [accuracy(family, variant, n) for n in lengths]
        rows.append([variant] + [f"{a['mean']:.2f} (≥{a['worst']:.2f}) {format_interval(a['interval'])}"
                                 for a in cells])
    head = [f"n={n}" + ("*" if n in unseen else "") for n in lengths]
    return ["model / decoding", *head], rows


def seed_table(family: ReasoningResults) -> Table:
    trained, unseen = lengths_of(family)
    lengths = trained + unseen
    rows = []
    for variant in variants_of(family):
        per_seed = {n: {c["seed"]: c["accuracy"] for c in seed_cells(family, variant, n)} for n in lengths}
        for seed in sorted(per_seed[lengths[0]]):
            rows.append([variant, seed] + [f"{per_seed[n][seed]:.2f}" for n in lengths])
    return ["model / decoding", "seed", *[f"n={n}" for n in lengths]], rows


def report(results: ControlsResults, plots: bool) -> Report:
    """report.md: verdict, setup, the accuracy-vs-FLOPs plot, then per family its compute, answer-only accuracy and
    every seed's cells."""
    cfg = results["config"]
    minutes = f" in {results['seconds'] / 60:.1f} min" if "seconds" in results else ""
    if minutes and results.get("resumed"):  # the earlier invocations' time is not in it
        minutes += " (the last invocation, which resumed an interrupted run: the time before is not counted)"
    rep = Report.of(results, "Reasoning without tokens: the full-bandwidth model against compute-matched controls",
                    results["command"], f"{minutes}, {cfg['seeds']} seeds", compact_tables=True)
    rep.section("Verdict").block(*(results.get("verdict") or verdict(results))).section("Setup")
    rep.paragraph(f"""\
Each family runs the recurrent recipe of `fullband eval-reasoning` (d_model={cfg['d_model']}, {cfg['n_layers']}
layers, {cfg['steps']} steps of batch {cfg['batch_size']}, {cfg['passes']} passes, gradients through pass 1 and
the last {cfg['grad_passes']}) for four models trained on the same batches of each seed:
- **baseline**: the same transformer without feedback, one pass;
- **looped**: the full-bandwidth model with `feedback_shift=0`: pass k feeds position t its own state from pass
  k-1, so it gets the same passes, gradient passes and weights, but no state moves along the sequence; decoded
  with min(passes, prompt tokens) passes over the whole sequence per token (the count its training ran on a
  sequence that long);
- **equal-FLOPs baseline**: a plain transformer of the same width made deeper until its training FLOPs equal the
  full-bandwidth model's (same steps and batches: more steps would mean other batches; depth, not width, because
  depth is what a fixed-depth transformer lacks for serial state tracking, so it is the strongest challenger);
- **full-bandwidth**: decoded standard (no feedback) and exact (the prompt fully recurrent).""")
    rep.paragraph("""\
All answer-only (stride 0). FLOPs (fullband.experiments.core.flops): 2·N per token and pass, N the weight matrices
a token meets (blocks, output head, the fusion's two D×D at fused positions), plus causal attention 4·L·D·t at
position t; passes with gradients 3x. Training replays each run's batch plan (its padded batches, pass counts and
gradient passes; the full-bandwidth model's fixed point computed sequentially counts as one forward). Inference per
problem: the prompt's prefill and one position per generated token (the looped model: its passes at every
position, as a per-pass KV cache would run it).""")
    rep.figure(FLOPS_PLOT, "accuracy vs training FLOPs", plots)
    for f, fam in results["families"].items():
        trained, unseen = lengths_of(fam)
        problems = ", ".join(f"{n}: {accuracy(fam, 'baseline', n)['n']}" for n in trained + unseen)
        rep.section(FAMILY_NAMES.get(f, f)).block(
            f"Full tables (every stride and mode, trace lengths, training losses): [{f}/report.md]({f}/report.md).",
            f"Test problems per length (n: count): {problems}.")
        rep.section("Compute", level=3).table(*compute_table(fam), note=(
            "Training seconds are wall time, summed over a resumed run's invocations, on cores the run may have "
            "shared with\nthe study's other runs: the FLOPs columns are the cost to compare."))
        rep.section("Answer-only accuracy: mean over seeds (≥ worst seed) [95% Wilson interval]", level=3)
        rep.table(*accuracy_table(fam), note=(
            "\\* never trained on. The interval pools every seed's answers (each a trial): it covers the sampling "
            "of the\nproblems; the worst seed shows the spread between seeds."))
        rep.section("Every seed", level=3).table(*seed_table(fam))
    return rep


def plot_flops(results: ControlsResults, path: Path) -> None:
    """Answer-only accuracy against training FLOPs: a column per family, a row per unseen length (a deep control
    may keep up at the first and not the last), a dot per seed, a marker per model's mean (each model in its colour
    of the family reports' plots); chance dotted."""
    from matplotlib.ticker import NullFormatter

    plt = pyplot()
    families = results["families"]
    lengths = {f: lengths_of(fam)[1] or [headline_length(fam)] for f, fam in families.items()}
    rows = max(len(each) for each in lengths.values())
    fig, axes = plt.subplots(rows, len(families), figsize=(max(4.2 * len(families), 6.5), 0.4 + 3 * rows),
                             squeeze=False, sharey=True)
    for column, (f, fam) in enumerate(families.items()):
        flops = training_flops(fam)
        seed_flops = {v: {name.split()[-1]: t["training_flops"] for name, t in fam["training"].items()
                          if name.split()[0] == _kind(v)} for v in variants_of(fam) if v in flops}
        for row, ax in enumerate(axes[:, column]):
            if row >= len(lengths[f]):
                ax.axis("off")
                continue
            n = lengths[f][row]
            for variant, seeds in seed_flops.items():
                cells = seed_cells(fam, variant, n)
                xs = [seeds.get(f"seed{c['seed']}", flops[variant]) for c in cells]
                color = f"C{fam['variants'].index(variant) % 10}"  # the colour cycle's order, as the family plots
                ax.scatter(xs, [c["accuracy"] for c in cells], s=12, alpha=0.5, color=color)
                ax.scatter([flops[variant]], [statistics.fmean(c["accuracy"] for c in cells)], s=70, marker="D",
                           color=color, label=variant, edgecolor="black")
            ax.axhline(chance_level(fam["config"]["family"], fam["config"]["modulus"]), color="black", lw=0.8,
                       ls=":")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap within a decade
            ax.set_title(f"{FAMILY_NAMES.get(f, f)}, n = {n}", fontsize=10)
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        axes[min(rows, len(lengths[f])) - 1, column].set_xlabel("training FLOPs")
    for ax in axes[:, 0]:
        ax.set_ylabel("answer-only accuracy")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Accuracy against training compute at the unseen lengths (dots: seeds; diamonds: means)")
    save_figure(fig, path, dpi=110)
