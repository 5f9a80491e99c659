"""Write a ``fullband recipe`` study down: results.json, plots and report.md, all computed from the results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fullband.experiments.core.lm.multiplier import against_one
from fullband.experiments.core.plots import pyplot, save_figure
from fullband.experiments.core.report import REPORT, Report, input_text, is_smoke, mode_label
from fullband.experiments.core.stats import mean_sd

GAPS_PLOT = "gap_by_variant.png"
WIDTH_PLOT = "gap_vs_width.png"
STEPS_PLOT = "gap_vs_steps.png"


def plot_recipe(results: dict[str, Any], out_dir: Path) -> None:
    plot_gaps(results, out_dir / GAPS_PLOT)
    plot_widths(results, out_dir / WIDTH_PLOT)
    if results["steps"]:
        plot_steps(results, out_dir / STEPS_PLOT)


def _f(pair: tuple[float | None, float | None] | list, digits: int = 4, signed: bool = False) -> str:
    mean, sd = pair
    if mean is None or not math.isfinite(mean):
        return "–"
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text + (f" ± {sd:.{digits}f}" if sd else "")


def _modes(results: dict[str, Any]) -> list[str]:
    first = next(iter(results["variants"].values()))
    return list(first["modes"])


def verdict(results: dict[str, Any]) -> list[str]:
    """The answer in plain words, computed from the numbers; none for a smoke run."""
    if is_smoke(results):
        return ["None: a smoke run checks the plumbing."]
    lines = []
    best = results["variants"].get("best")
    if best is not None:
        per_mode = {m: mean_sd(s["token_multiplier"] for s in per) for m, per in best["multipliers"].items()}
        mults = {m: ms for m, ms in per_mode.items() if ms[0] is not None}
        top = max(mults, key=lambda m: mults[m][0]) if mults else None
        if top is not None:
            mult, spread = mults[top][0], mults[top][1] or 0.0
            word = {"above": "beats", "below": "does not beat",
                    "tie": "ties (within the seed spread)"}[against_one(mult, spread)]
            lines.append(f"- The compare default's best mode, {mode_label(top)}, is worth {mult:.2f}x ± {spread:.2f} "
                         f"its training tokens (mean ± sd over seeds): feedback {word} the 1x baseline at this scale.")
        fused = {m: g["gap_to_own_standard"][0] for m, g in best["modes"].items() if m != "standard"}
        if fused:
            m = min(fused, key=fused.get)
            relation = "no worse than" if fused[m] <= 0 else "worse than"
            lines.append(f"- Its best feedback mode, {mode_label(m)}, is {relation} the same model's standard mode "
                         f"({fused[m]:+.4f} nats/token).")
    lines += _own_baseline_lines(results)
    ranked = sorted(((name, v["modes"]["standard"]["gap_to_baseline"][0], v) for name, v in
                     results["variants"].items() if name != "best"), key=lambda x: x[1] if x[1] is not None else 0)
    if best is not None and ranked:
        ref = {m: g["gap_to_own_standard"][0] for m, g in best["modes"].items()}
        moves = []
        for name, _, v in ranked:
            fused = v["modes"].get("fused1", {}).get("gap_to_own_standard", (None,))[0]
            if fused is not None and ref.get("fused1") is not None:
                moves.append((fused - ref["fused1"], name))
        moves.sort(reverse=True)
        if moves:
            lines.append("- Toggling one ingredient away from the compare default moves the fused(1)-vs-standard gap "
                         "by: "
                         + ", ".join(f"`{n}` {d:+.4f}" for d, n in moves) + " nats/token (positive = the ingredient "
                         "helps).")
    stable = [(name, v["loss_after_passes"]) for name, v in results["variants"].items()
              if name in ("best", "2-pass-only") and v["loss_after_passes"]]
    for name, after in stable:
        first, last = after["first_pass_loss"][0], after["loss"][0]
        d0, d1 = after.get("delta_first", (None,))[0], after.get("delta_last", (None,))[0]
        trend = ("the state change shrinks (a contraction)" if d0 is not None and d1 is not None and d1 < d0
                 else "the state change does not shrink")
        lines.append(f"- Stability, `{name}`: validation loss {first:.4f} after 1 pass, {last:.4f} after "
                     f"{after['passes']} fused passes; {trend}"
                     + (f" (mean ‖Δh‖ {d0:.3g} after pass 2, {d1:.3g} after pass {after['passes']})."
                        if d0 is not None and d1 is not None else "."))
    widths = results["widths"]
    if len(widths) > 1:
        parts = [f"d{w}: {_f(v['modes']['standard']['gap_to_baseline'], signed=True)} standard, "
                 f"{_f(v['modes'].get('fused1', {}).get('gap_to_baseline', (None, None)), signed=True)} fused(1)"
                 for w, v in widths.items()]
        lines.append("- Gap to the baseline by width: " + "; ".join(parts) + ".")
    if results["steps"]:
        first, last = results["steps"][0], results["steps"][-1]
        lines.append(f"- Fused(1)-vs-plain validation gap during the compare default's training: "
                     f"{first['loss_2pass'] - first['loss_1pass']:+.4f} at step {first['step']}, "
                     f"{last['loss_2pass'] - last['loss_1pass']:+.4f} at step {last['step']}.")
    return lines


def _own_baseline_lines(results: dict[str, Any]) -> list[str]:
    """Which variant has the lowest loss, and which ones beat a baseline trained the same way."""
    variants = results["variants"]
    lowest = {}
    for name, v in variants.items():
        mode = min(v["modes"], key=lambda md: v["modes"][md]["loss"][0])
        lowest[name] = (v["modes"][mode]["loss"][0], mode)
    name = min(lowest, key=lambda n: lowest[n][0])
    loss, mode = lowest[name]
    mult = _mean(s["token_multiplier"] for s in variants[name]["multipliers"].get(mode, []))
    lines = [f"- The lowest test loss of any variant: `{name}` in {mode_label(mode)} mode, {loss:.4f}"
             + (f" ({mult:.2f}x tokens on the compare default's baseline curve)" if mult is not None else "") + "."]
    beat = []
    for n, v in variants.items():
        gaps = {md: g["gap_to_baseline"][0] for md, g in v["modes"].items() if g["gap_to_baseline"][0] is not None}
        wins = [md for md, g in gaps.items() if g < 0]
        if wins:
            beat.append(f"`{n}` in {', '.join(mode_label(md) for md in wins)} (against `{v['reference']}`; "
                        f"standard {gaps['standard']:+.4f})")
    lines.append("- Feedback models below a baseline trained the same way: " + ("; ".join(beat) if beat else "none")
                 + ".")
    return lines


def _run_minutes(results: dict[str, Any]) -> float:
    return sum(r["train_seconds"] + r.get("eval_seconds", 0) + r.get("stability_seconds", 0)
               for r in results["runs"]) / 60


def _mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def report(results: dict[str, Any], plots: bool) -> Report:
    """report.md: verdict, setup, each ingredient toggled, other widths, the gap against steps, machine."""
    cfg, cc = results["config"], results["compare_config"]
    modes = _modes(results)
    m, t, o, sch = cc["model"], cc["train"], cc["optim"], cc["schedule"]
    rep = Report.of(results, "fullband recipe: which ingredient makes latent feedback pay?", results["command"],
                    f": {len(results['runs'])} training runs, {cfg['seeds']} seeds each, {cfg['workers']} at a time; "
                    f"{_run_minutes(results):.0f} min of training and evaluation summed over the runs, "
                    f"{results['seconds'] / 60:.1f} min wall time of the last invocation (a resumed study counts "
                    "only its own)")
    rep.section("Verdict").block(*verdict(results)).section("Setup").block(
        f"- Every run is a `fullband compare --preset {cfg['compare_preset']}` run: d_model {m['d_model']}, "
        f"{m['n_layers']} layers, batch {t['batch_size']} x {t['seq_len']}, 1x = {t['token_budget']:,} tokens, "
        f"optimizer {o['optimizer']} (AdamW lr {o['lr']:g}" + (f", Muon lr {o['muon_lr']:g}" if o['optimizer'] !=
                                                                "adamw" else "") +
        f"), {input_text(m)}, feedback from "
        f"{sch['feedback_start']:g} of the run, pass_mix {list(sch['pass_mix'])} (2-pass only until "
        f"{sch['two_pass_until']:g}).",
        f"- Baseline curve (token multipliers): {', '.join(f'{b:g}x' for b in cc['budgets'])}.",
        "- Gap = test loss minus the reference baseline's standard-mode test loss, per seed, then mean ± sd "
        "(negative = better than the baseline). Variants that change the baseline too have their own 1x baseline "
        "as reference.")
    rep.section("Each ingredient toggled from the compare default (`best`)").paragraph(
        "Test loss (nats/token), mean ± sd over seeds, and the loss after N fused passes (validation split):")
    rows = []
    for name, v in results["variants"].items():
        after = v["loss_after_passes"]
        rows.append([f"`{name}`", v["description"], f"`{v['reference']}`",
                     *[_f(v["modes"][md]["loss"]) for md in modes],
                     f"{_f(after['loss'])} (N={after['passes']})" if after else "–", f"{v['train_seconds']:.0f}"])
    rep.table(["variant", "what changes", "reference", *[mode_label(md) for md in modes], "after N passes",
               "train s"], rows)
    rep.paragraph("Gap to the reference baseline (nats/token; negative = better than the baseline), and the token "
                  "multiplier on the baseline curve (> 1 = worth more than its tokens):")
    rows = []
    for name, v in results["variants"].items():
        mult = [_f((_mean(s["token_multiplier"] for s in v["multipliers"].get(md, [])), None), 2) for md in modes]
        rows.append([f"`{name}`", *[_f(v["modes"][md]["gap_to_baseline"], signed=True) for md in modes], *mult])
    rep.table(["variant", *[f"{mode_label(md)} gap" for md in modes], *[f"{mode_label(md)} x" for md in modes]], rows)
    rep.figure(GAPS_PLOT, "gap by variant", plots).section("The compare default at other widths")
    rep.table(["d_model", "parameters", *[f"{mode_label(md)} gap" for md in modes]],
              [[width, f"{v['parameters']:,}", *[_f(v["modes"][md]["gap_to_baseline"], signed=True) for md in modes]]
               for width, v in results["widths"].items()])
    rep.figure(WIDTH_PLOT, "gap vs width", plots)
    if results["steps"]:
        rep.section("The gap against training steps (compare default, validation split)")
        rep.table(["step", "1 pass", "2 passes", "3 passes", "2 - 1", "3 - 1"],
                  [[str(s["step"]), f"{s['loss_1pass']:.4f}", f"{s['loss_2pass']:.4f}", f"{s['loss_3pass']:.4f}",
                    f"{s['loss_2pass'] - s['loss_1pass']:+.4f}", f"{s['loss_3pass'] - s['loss_1pass']:+.4f}"]
                   for s in results["steps"]])
        rep.figure(STEPS_PLOT, "gap vs steps", plots)
    return rep.section("Machine").block(*[f"- {k}: {v}" for k, v in results["machine"].items()])


def summary(results: dict[str, Any]) -> str:
    """The terminal summary: the verdict and where the report is."""
    return "\n".join(["", *results["verdict_lines"], f"report: {Path(results['config']['out_dir']) / REPORT}"])


# ---------------------------------------------------------------------------------------------- plots

def plot_gaps(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    modes = _modes(results)
    names = list(results["variants"])
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(names)), 4.5))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        values = [results["variants"][n]["modes"][mode]["gap_to_baseline"] for n in names]
        ax.bar([j + i * width for j in range(len(names))], [v[0] or 0 for v in values], width,
               yerr=[v[1] or 0 for v in values], capsize=2, label=mode_label(mode))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=30, ha="right")
    _finish(fig, ax, path, "test loss - baseline (nats/token)",
            "Gap to the baseline, one ingredient toggled (below 0 = feedback helps)")


def plot_widths(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    widths = results["widths"]
    xs = [int(w) for w in widths]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for mode in _modes(results):
        ys = [widths[w]["modes"][mode]["gap_to_baseline"][0] for w in widths]
        ax.plot(xs, ys, "o-", label=mode_label(mode))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("d_model")
    _finish(fig, ax, path, "test loss - baseline (nats/token)",
            "Gap to the baseline against width (compare default)")


def plot_steps(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    steps = results["steps"]
    xs = [s["step"] for s in steps]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for k in (2, 3):
        ax.plot(xs, [s[f"loss_{k}pass"] - s["loss_1pass"] for s in steps], "o-", label=f"{k} passes - 1 pass")
    ax.set_xlabel("training step")
    _finish(fig, ax, path, "validation loss difference (nats/token)",
            "Fused passes against the plain pass during training")


def _finish(fig: Any, ax: Any, path: Path, ylabel: str, title: str) -> None:
    """A zero line, labels, legend and grid; save and close."""
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)
