"""The compare plots: loss against tokens, the stability curves, the gaps against tokens (drawn with
:func:`fullband.experiments.core.plots.pyplot`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fullband.experiments.compare.records import CompareResults
from fullband.experiments.compare.results import run_names, runs_named
from fullband.experiments.core.lm.multiplier import baseline_loss_at
from fullband.experiments.core.plots import pyplot, save_figure
from fullband.experiments.core.report import mode_label
from fullband.experiments.core.stats import mean_sd

MARKERS = {"standard": "o", "fused1": "s", "fused2": "D", "fused3": "v", "fused4": "^", "exact": "*"}


def _plain_log_ticks(axis: Any, fmt: Any) -> None:
    """Label a log axis with plain numbers (1, 2, 5, 10 / 512k, 1M), not 2 x 10^0."""
    from matplotlib import ticker

    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt(v)))
    axis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: fmt(v) if f"{v:.1g}"[0] in "25" else ""))


def _tokens_axes(ax: Any, ylabel: str, title: str) -> None:
    """The axes of a plot against training tokens: log x with plain labels (512k, 1M), a grid, the labels."""
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis, _tokens_text)
    ax.set_xlabel("training tokens")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def _tokens_text(v: float) -> str:
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1e3 else f"{v:g}"


def plot_loss_vs_tokens(results: CompareResults, path: Path) -> None:
    """Baseline test loss against training tokens (points, ± sd over seeds, and the fitted piecewise-linear
    curve), with every mode of each feedback model at the tokens it saw."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    names = run_names(results)
    base = [(mean_sd(r["tokens"] for r in runs_named(results, n))[0],
             *mean_sd(r["test"]["standard"]["loss"] for r in runs_named(results, n)))
            for n in names if n.startswith("baseline")]
    xs = [b[0] for b in base]
    ys = [b[1] for b in base]
    ax.errorbar(xs, ys, yerr=[b[2] or 0 for b in base], fmt="o", color="black", capsize=3, label="baseline",
                zorder=3)
    targets = [s["loss"] for by_mode in results["multipliers"].values() for per in by_mode.values() for s in per
               if s["baseline_tokens"] is not None]
    needed = [s["baseline_tokens"] for by_mode in results["multipliers"].values() for per in by_mode.values()
              for s in per if s["baseline_tokens"] is not None]
    lo, hi = min([*xs, *needed]) / 1.05, max([*xs, *needed]) * 1.05
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    inside = [x for x in grid if xs[0] <= x <= xs[-1]]
    ax.plot(inside, [baseline_loss_at(xs, ys, x) for x in inside], "-", color="gray", lw=1,
            label="baseline fit (piecewise linear in log tokens)")
    if targets:  # the extensions used for extrapolated matches
        for part in ([x for x in grid if x <= xs[0]], [x for x in grid if x >= xs[-1]]):
            if len(part) > 1:
                ax.plot(part, [baseline_loss_at(xs, ys, x) for x in part], "--", color="gray", lw=1)
    colors = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    for i, name in enumerate(n for n in names if not n.startswith("baseline")):
        runs = runs_named(results, name)
        tokens = mean_sd(r["tokens"] for r in runs)[0]
        for mode in runs[0]["test"]:
            loss, sd = mean_sd(r["test"][mode]["loss"] for r in runs)
            if loss is None or not math.isfinite(loss):
                continue
            ax.errorbar([tokens * (1 + 0.03 * i)], [loss], yerr=[sd or 0], fmt=MARKERS.get(mode, "P"),
                        color=colors[i % len(colors)], alpha=0.5 + 0.5 * (mode != "standard"), capsize=2,
                        label=f"{name} {mode_label(mode)}")
    _tokens_axes(ax, "test loss (nats/token)", "Test loss against training tokens")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def plot_stability(results: CompareResults, path: Path) -> None:
    """Validation loss and state change against the number of fused prefill passes, one line per model."""
    plt = pyplot()
    fig, (ax_loss, ax_delta) = plt.subplots(1, 2, figsize=(11, 4.5))
    curves = results["stability"]
    colors = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    for i, name in enumerate(dict.fromkeys(c["name"] for c in curves)):
        mine = [c for c in curves if c["name"] == name]
        passes = mine[0]["passes"]
        loss = [mean_sd(c["loss"][k] for c in mine)[0] for k in range(len(passes))]
        color = colors[i % len(colors)]
        ax_loss.plot(passes, loss, color=color, label=name)
        for key, style in (("delta_mean", "-"), ("delta_max", ":")):
            values = [mean_sd(c[key][k] for c in mine)[0] for k in range(len(passes))]
            # Exact zeros (the iteration has converged, or the window is exact) cannot go on a log axis.
            pts = [(p, v) for p, v in zip(passes, values, strict=True) if v is not None and v > 0]
            if pts:
                ax_delta.plot(*zip(*pts, strict=True), style, color=color,
                              label=f"{name} {'mean' if key == 'delta_mean' else 'max'}")
    T = curves[0]["window_len"]
    for ax in (ax_loss, ax_delta):
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis, lambda v: f"{v:g}")
        ax.set_xlabel("fused prefill passes k")
        ax.grid(True, which="both", alpha=0.3)
        if len(curves[0]["passes"]) > T:
            ax.axvline(T, color="gray", ls="--", lw=0.8)
    ax_loss.set_ylabel("validation loss (nats/token)")
    ax_loss.set_title("Loss after k passes")
    ax_delta.set_yscale("log")
    ax_delta.set_ylabel("‖h^(k) − h^(k−1)‖₂ per position")
    ax_delta.set_title("State change per pass")
    ax_loss.legend(fontsize=8)
    ax_delta.legend(fontsize=7)
    save_figure(fig, path)


def plot_gaps_vs_tokens(results: CompareResults, path: Path) -> None:
    """The fused-vs-plain gap of each feedback model and the feedback-vs-baseline gap of ``feedback`` against
    training tokens (validation split; thin lines per seed, thick the mean), with the fitted trend of the best
    mode's gap to the baseline (:mod:`fullband.experiments.compare.trend`)."""
    from fullband.experiments.compare.trend import FEEDBACK, gap_trend

    trend = results.get("gap_trend") or gap_trend(results)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    colors = iter(["tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:red", "tab:brown", "tab:olive"])
    lines = [(name, "vs_plain", "fused1", "− standard") for name in trend["series"]]
    lines += [(FEEDBACK, "vs_baseline", mode, "− baseline 1x") for mode in ("standard", "fused1", "fused2")]
    for name, key, mode, what in lines:
        seeds = [[(p["tokens"], p[key][mode]) for p in pts if mode in p[key]]
                 for pts in trend["series"].get(name, {}).values()]
        seeds = [s for s in seeds if s]
        if not seeds:
            continue
        color = next(colors)
        for s in seeds:
            ax.plot(*zip(*s, strict=True), "-", color=color, lw=0.7, alpha=0.4)
        by_tokens: dict[int, list[float]] = {}
        for t, g in (pt for s in seeds for pt in s):
            by_tokens.setdefault(t, []).append(g)
        xs = sorted(by_tokens)
        ax.plot(xs, [mean_sd(by_tokens[x])[0] for x in xs], "-o" if key == "vs_plain" else "-s", color=color,
                lw=1.8, ms=3, label=f"{name} {mode_label(mode)} {what}")
    if "fit" in trend:
        pooled, last = trend["fit"]["pooled"], trend["last_tokens"]
        t = pooled["crossing_tokens"]
        end = last * 4 if t is None or not math.isfinite(t) or t <= last else min(t * 1.2, last * 20)
        grid = [trend["fit_from"] * last * (end / (trend["fit_from"] * last)) ** (i / 100) for i in range(101)]
        ax.plot(grid, [pooled["intercept"] + pooled["slope"] * math.log(x) for x in grid], ":", color="black",
                lw=1.2, label=f"fit: {mode_label(trend['mode'])} − baseline, linear in log tokens")
        ax.axvline(last, color="gray", lw=0.6, ls="--")
    ax.axhline(0, color="black", lw=0.8)
    _tokens_axes(ax, "validation loss gap (nats/token; < 0: first term better)",
                 "Gaps against training tokens (0 against the baseline = 1.0x tokens)")
    ax.legend(fontsize=7)
    save_figure(fig, path)
