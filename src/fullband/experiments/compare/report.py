"""Write a compare run down: results.json, report.md (tables, multipliers, stability, times, machine, commands)
and the plots; print the short summary. Everything here is computed from the results dict, so a report can be
regenerated from results.json alone."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fullband.config import duration, plural
from fullband.experiments.compare import plots as plotting
from fullband.experiments.compare import trend
from fullband.experiments.compare.records import CompareResults
from fullband.experiments.compare.results import modes_of, run_names, runs_named
from fullband.experiments.core.lm.multiplier import BETTER_THAN_LARGEST, INTERPOLATED, WORSE_THAN_SMALLEST, against_one
from fullband.experiments.core.lm.records import RunRecord
from fullband.experiments.core.report import REPORT, Report, input_text, is_smoke, mode_label
from fullband.experiments.core.stats import mean_sd
from fullband.experiments.core.study import write_study

LOSS_PLOT = "loss_vs_tokens.png"
STABILITY_PLOT = "stability.png"
GAP_PLOT = "gaps_vs_tokens.png"
TITLE = "fullband compare: does latent feedback buy training tokens?"


def write_report(results: CompareResults, out_dir: Path) -> None:
    """results.json, then the plots (skipped, with a warning, without matplotlib), then report.md."""
    write_study(out_dir, results, lambda r: plot_compare(r, out_dir), report)


def plot_compare(results: CompareResults, out_dir: Path) -> None:
    plotting.plot_loss_vs_tokens(results, out_dir / LOSS_PLOT)
    if has_gap_series(results):
        plotting.plot_gaps_vs_tokens(results, out_dir / GAP_PLOT)
    if results["stability"]:
        plotting.plot_stability(results, out_dir / STABILITY_PLOT)


def fmt(values: Iterable[float | None], digits: int | str = 4, suffix: str = "") -> str:
    """``mean`` or ``mean ± sd`` (sample sd over seeds); '—' when there is nothing. ``digits``: decimals, or a
    format spec such as ".3g" for values spanning many orders of magnitude."""
    mean, sd = mean_sd(values)
    if mean is None:
        return "—"
    if not math.isfinite(mean):
        return str(mean)
    spec = f".{digits}f" if isinstance(digits, int) else digits
    return f"{mean:{spec}}{suffix}" + (f" ± {sd:{spec}}" if sd is not None else "")


def fmt_int(values: Iterable[float]) -> str:
    mean, _ = mean_sd(values)
    return "—" if mean is None else f"{mean:,.0f}"


def checkpoints(n: int) -> list[int]:
    """Pass counts shown in the stability table: 1..5, then about three per decade, and n."""
    marks = [k for k in (1, 2, 3, 4, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000) if k <= n]
    return marks if marks[-1] == n else [*marks, n]


# ---------------------------------------------------------------------------------------------- report.md

def report(results: CompareResults, plots: bool = True) -> Report:
    """report.md: verdict, setup, test loss and bits per byte, multipliers, the gap trend, stability, wall times,
    machine, commands."""
    cfg = results["config"]
    names, modes = run_names(results), modes_of(results)
    t, m = cfg["train"], cfg["model"]
    runs = results["runs"]
    windows = runs[0]["test_windows"]
    unit = t["token_budget"]
    rep = Report.of(results, TITLE, results["commands"]["command"],
                    f" (preset `{cfg['preset']}`, {cfg['seeds']} seed{'s' if cfg['seeds'] > 1 else ''}; total wall "
                    f"time {duration(results['seconds'])})")
    rep.section("Verdict").block(*verdict(results)).section("Setup").block(
        f"- Model: d_model {m['d_model']}, {plural(m['n_layers'], 'layer')}, {plural(m['n_heads'], 'head')}, "
        f"{_params(results)}; tokenizer `{cfg['data']['tokenizer']}`, corpus `{cfg['data']['source']}`.",
        f"- Training: batch {t['batch_size']} x {t['seq_len']} tokens, {optimizer_text(cfg['optim'])} "
        f"({cfg['optim']['schedule']}, warmup {cfg['optim']['warmup_steps']}), {_seeds(cfg)}; the same data order, "
        f"initialisation and optimizer for every run of a seed. Unit budget 1x = {unit:,} tokens. Inputs: "
        f"{input_text(m)}.",
        f"- Baselines (`model.feedback=false`): {', '.join(f'{b:g}x' for b in cfg['budgets'])}.",
        f"- `feedback`: the full-bandwidth model at 1x with feedback_start {cfg['schedule']['feedback_start']:g} and "
        f"pass_mix {list(cfg['schedule']['pass_mix'])} for 2, 3, ... passes ({_split(cfg['schedule'])} of all "
        "batches single/two/three... pass).",
        *(["- `feedback-2pass` (stability ablation): the same with pass_mix [1.0], i.e. only 1- and 2-pass "
           "batches."] if cfg["stability_ablation"] else []),
        f"- {runs[0].get('scored_split', 'test').capitalize()} split: {windows} windows of {t['seq_len']} tokens "
        "spread evenly over it; each window's first token is context only. Loss = mean next-token cross-entropy "
        "(nats/token) over the other positions; bits/byte = that x tokens/byte of the split / ln 2.",
        "- Modes (the window is the prompt, plain_prefix = 1): **standard** = one plain pass (an ordinary "
        "transformer); **fused(k)** = `model(x, passes=k+1, plain_prefix=1)`: the plain pass plus k extra fused "
        "Jacobi passes, each position scored with its predecessor's state after k passes; **exact** = the fully "
        f"recurrent states, {_exact_text(cfg, runs)}.")
    rep.section("Test loss (nats/token)")
    score_table(rep, results, names, modes, "loss")
    rep.section("Test bits per byte")
    score_table(rep, results, names, modes, "bits_per_byte")
    rep.figure(LOSS_PLOT, "loss vs tokens", plots)
    rep.section("Effective token multiplier").paragraph(
        "The baseline's test loss at its budgets, as piecewise-linear in log(tokens) (straight segments on a log-x "
        "plot), is inverted at each mode's loss: **token multiplier** = tokens the baseline needs for that loss / "
        "tokens the feedback model saw (> 1: feedback is worth more than its tokens). **Compute multiplier** = the "
        "same baseline tokens / the feedback model's token-equivalent training compute (tokens x passes), i.e. "
        "what the trade costs in training FLOPs. **Inference passes** = stack evaluations per window in that mode "
        "(the baseline always needs 1). Outside the measured range the nearest segment is extended and the row is "
        "flagged *extrapolated*.")
    multiplier_table(rep, results)
    if hint := _extrapolation_hint(results):
        rep.block(*hint)
    trend.section(rep, results, GAP_PLOT if plots and has_gap_series(results) else None)
    stability_section(rep, results, plots)
    timing_section(rep, results)
    rep.section("Machine").block(*[f"- {k}: {v}" for k, v in results["machine"].items()])
    cmds = results["commands"]
    rep.section("Commands").block("```", cmds["command"], f"# rerun exactly: {cmds['reproduce']}",
                                  f"# one training run on its own: {cmds['one_run']}", "```")
    return rep


def optimizer_text(optim: dict[str, Any]) -> str:
    if optim["optimizer"] in ("muon", "normuon"):
        name = "NorMuon" if optim["optimizer"] == "normuon" else "Muon"
        return (f"{name} lr {optim['muon_lr']:g} (wd {optim['muon_weight_decay']:g}) on the hidden matrices and AdamW "
                f"lr {optim['lr']:g} (wd {optim['weight_decay']:g}) on the rest")
    return f"AdamW lr {optim['lr']:g} (wd {optim['weight_decay']:g})"


def score_table(rep: Report, results: CompareResults, names: Sequence[str], modes: Sequence[str], key: str) -> None:
    rows = []
    for name in names:
        runs = runs_named(results, name)
        cells = [f"`{name}`", fmt_int(r["tokens"] for r in runs), fmt_int(r["token_equiv_compute"] for r in runs)]
        cells += [fmt(r["test"][mode][key] for r in runs) if mode in runs[0]["test"] else "" for mode in modes]
        rows.append(cells)
    rep.table(["run", "tokens", "token-equiv. compute", *map(mode_label, modes)], rows)


def multiplier_table(rep: Report, results: CompareResults) -> None:
    head = ["model", "mode", "test loss", "baseline tokens to match", "token multiplier", "compute multiplier",
            "inference passes", "fit"]
    rows = []
    for name, by_mode in results["multipliers"].items():
        runs = runs_named(results, name)
        for mode, per_seed in by_mode.items():
            fits = sorted({s["fit"] for s in per_seed})
            rows.append([
                f"`{name}`", mode_label(mode), fmt(s["loss"] for s in per_seed),
                fmt_int(s["baseline_tokens"] for s in per_seed if s["baseline_tokens"] is not None),
                fmt((s["token_multiplier"] for s in per_seed), 2, "x"),
                fmt((s["compute_multiplier"] for s in per_seed), 2, "x"),
                _passes_text(results, runs, mode),
                "; ".join(f if f == INTERPOLATED else f"*{f}*" for f in fits),
            ])
    rep.table(head, rows)


def stability_section(rep: Report, results: CompareResults, plots: bool = True) -> None:
    curves = results["stability"]
    if not curves:
        return
    n = len(curves[0]["passes"])
    marks = checkpoints(n)
    T = curves[0]["window_len"]
    rep.section("Stability (the paper's Figure 3)").paragraph(
             f"Fused prefill passes 1..{n} over {curves[0]['windows']} validation windows of {T} tokens, one loop "
             "of passes recording after each: validation loss of pass k's logits, and the per-position change of "
             "the carried state ‖h_t^(k) − h_t^(k−1)‖₂ (mean and max over positions t ≥ 2) next to the mean "
             "‖h_t^(k)‖₂ for scale.")
    if n > T:
        rep.paragraph(f"Note: a window of {T} tokens is exact after {T} passes, so from pass {T + 1} on the "
                      "iteration repeats itself (change exactly 0); raise stability_seq_len to see more passes of "
                      "real iteration.")
    rep.paragraph("In float32 a change of about 1e-6 x ‖h‖ is round-off, the floor of a converged iteration.")
    rows = []
    for name in dict.fromkeys(c["name"] for c in curves):
        mine = [c for c in curves if c["name"] == name]
        for key, label, digits in (("loss", "val loss", 4), ("delta_mean", "mean ‖Δh‖", ".3g"),
                                   ("delta_max", "max ‖Δh‖", ".3g"), ("state_norm", "mean ‖h‖", 2)):
            rows.append([f"`{name}`", label, *[fmt((c[key][k - 1] for c in mine), digits) for k in marks]])
    rep.table(["model", "quantity", *[f"k={k}" for k in marks]], rows).figure(STABILITY_PLOT, "stability", plots)


def timing_section(rep: Report, results: CompareResults) -> None:
    rows = [[str(r["seed"]), f"`{r['name']}`", str(r["steps"]), f"{r['train_seconds']:.0f}", f"{r['eval_seconds']:.0f}",
             f"{r['stability_seconds']:.0f}" if "stability_seconds" in r else ""] for r in results["runs"]]
    rep.section("Wall times").table(["seed", "run", "steps", "train s", "test eval s", "stability s"], rows)
    rep.paragraph(f"Total: {results['seconds']:.0f} s ({results['seconds'] / 60:.1f} min), report writing excluded.")
    checks = [(r["name"], r["seed"], r["exact_check"]) for r in results["runs"] if "exact_check" in r]
    if checks:
        rep.paragraph("Exact mode against the sequential definition (largest difference of a window's mean loss / of a "
                 "logit): " + "; ".join(f"`{n}` seed {s}: {c['max_loss_diff']:.2e} / {c['max_logit_diff']:.2e} on "
                                          f"{c['windows']} windows" for n, s, c in checks))


def verdict(results: CompareResults) -> list[str]:
    """Plain statements computed from the numbers (no judgement beyond comparing them); none for a smoke run."""
    if is_smoke(results):
        return ["None: a smoke run checks the plumbing."]
    out = []
    for name, by_mode in results["multipliers"].items():
        parts = []
        for mode, per_seed in by_mode.items():
            mult, _ = mean_sd(s["token_multiplier"] for s in per_seed)
            comp, _ = mean_sd(s["compute_multiplier"] for s in per_seed)
            if mult is None:
                parts.append(f"{mode_label(mode)}: no match on the baseline curve")
                continue
            extrap = any(s["fit"] != INTERPOLATED for s in per_seed)
            note = " (extrapolated)" if extrap else ""
            parts.append(f"{mode_label(mode)} {mult:.2f}x tokens ({comp:.2f}x compute){note}")
        best = max(by_mode, key=lambda md: mean_sd(s["token_multiplier"] for s in by_mode[md])[0] or -math.inf)
        best_mult, best_sd = mean_sd(s["token_multiplier"] for s in by_mode[best])
        # With several seeds, a multiplier within one sample sd of 1.00x is a tie, not a gain or a loss.
        spread = best_sd or 0.0
        standing = against_one(best_mult, spread) if best_mult is not None else None
        if best_mult is None:
            outcome = "no mode could be matched on the baseline curve."
        elif standing == "above":
            outcome = (f"its best mode, {mode_label(best)}, matches a baseline trained on {best_mult:.2f}x its "
                       "tokens: at this scale feedback buys training tokens.")
        elif standing == "tie":
            outcome = (f"its best mode, {mode_label(best)}, is worth {best_mult:.2f}x ± {spread:.2f} its tokens, "
                       "within the seed spread of 1.00x: at this scale feedback neither buys nor costs training "
                       "tokens measurably.")
        else:
            outcome = (f"even its best mode, {mode_label(best)}, is only worth {best_mult:.2f}x its tokens: at this "
                       "scale feedback does not buy training tokens.")
        out.append(f"- `{name}`: {outcome} By mode: " + "; ".join(parts) + ".")
    for name in dict.fromkeys(c["name"] for c in results["stability"]):
        mine = [c for c in results["stability"] if c["name"] == name]
        n = len(mine[0]["loss"])
        first, last = mean_sd(c["loss"][0] for c in mine)[0], mean_sd(c["loss"][-1] for c in mine)[0]
        best_k = min(range(n), key=lambda i: mean_sd(c["loss"][i] for c in mine)[0])
        best = mean_sd(c["loss"][best_k] for c in mine)[0]
        out.append(f"- Stability, `{name}`: validation loss {first:.4f} after 1 pass, best {best:.4f} after "
                   f"{best_k + 1}, {last:.4f} after {n}; {_convergence(mine)}")
    return out + _stability_contrast(results) + trend.verdict_lines(results)


def has_gap_series(results: CompareResults) -> bool:
    """Whether a feedback run validated during training (more than the one validation at the end)."""
    return any(r.get("validation_history") for r in results["runs"] if r["kind"] != "baseline")


def _stability_contrast(results: CompareResults) -> list[str]:
    """The paper's Figure 3/10 contrast: with only 1-/2-pass batches the iteration diverges, with ~3% 3-pass
    batches it contracts. Says whether this run shows it."""
    pair = ("feedback", "feedback-2pass")
    if not set(pair) <= {c["name"] for c in results["stability"]}:
        return []
    converges = {n: _converges([c for c in results["stability"] if c["name"] == n]) for n in pair}
    tokens = next(r["tokens"] for r in results["runs"] if r["name"] == "feedback")
    shown = converges["feedback"] and not converges["feedback-2pass"]
    states = ", ".join(f"`{n}` {'converges' if converges[n] else 'does not converge'}" for n in pair)
    return [f"- The paper's divergent-schedule contrast (Figure 3/10: 2-pass-only training diverges past its depth, "
            f"a few 3-pass batches make a contraction) {'appears' if shown else 'does not appear'} at {tokens:,} "
            f"training tokens: {states}."]


def _converges(curves: list[dict[str, Any]]) -> bool:
    """The criterion of :func:`_convergence`: the mean state change fell below 1e-3 of its pass-2 value."""
    if len(curves[0]["delta_mean"]) < 3:
        return False
    start, end = mean_sd(c["delta_mean"][1] for c in curves)[0], mean_sd(c["delta_mean"][-1] for c in curves)[0]
    return start is not None and end is not None and math.isfinite(end) and end < 1e-3 * start


def _extrapolation_hint(results: CompareResults) -> list[str]:
    fits = {s["fit"] for by_mode in results["multipliers"].values() for per in by_mode.values() for s in per}
    budgets = results["config"]["budgets"]
    lines = []
    if any(f.startswith(WORSE_THAN_SMALLEST) for f in fits):
        lines.append(f"Rows worse than the smallest baseline ({budgets[0]:g}x) extend its first segment; the "
                     "baseline curve usually bends (convex in log tokens), so this understates the tokens such a "
                     f"mode is worth. Measure them with smaller budgets, e.g. --budgets {budgets[0] / 8:g},"
                     f"{budgets[0] / 4:g},{budgets[0] / 2:g},{','.join(f'{b:g}' for b in budgets)}.")
    if any(f.startswith(BETTER_THAN_LARGEST) for f in fits):
        lines.append(f"Rows better than the largest baseline ({budgets[-1]:g}x) extend its last segment; measure "
                     "them with larger budgets.")
    return lines


def _convergence(curves: list[dict[str, Any]]) -> str:
    """Whether the per-pass state change shrank (a contraction) or grew over the recorded passes."""
    n = len(curves[0]["delta_mean"])
    if n < 3:
        return "too few passes to tell whether the iteration converges."
    start, end = mean_sd(c["delta_mean"][1] for c in curves)[0], mean_sd(c["delta_mean"][-1] for c in curves)[0]
    if end is None or start is None or not math.isfinite(end):
        return "the state change is not finite: the iteration diverged."
    trend = ("shrinks" if end < start else "grows") + f" from {start:.3g} at pass 2 to {end:.3g} at pass {n}"
    if end < 1e-3 * start:
        return f"the mean state change {trend}: the iteration converges (a contraction)."
    if end > start:
        return f"the mean state change {trend}: the iteration does not converge."
    return f"the mean state change {trend}: it has not converged by pass {n}."


def _passes_text(results: CompareResults, runs: list[RunRecord], mode: str) -> str:
    passes = fmt((r["test"][mode]["passes"] for r in runs), 1)
    if mode == "exact" and _exact_method(results["config"], runs) == "sequential":
        return f"{passes} one-token steps (~1 pass of FLOPs, sequential)"
    return passes


def _params(results: CompareResults) -> str:
    counts = {r["name"]: r.get("parameters") for r in results["runs"]}
    base = next((v for k, v in counts.items() if k.startswith("baseline") and v), None)
    fb = next((v for k, v in counts.items() if not k.startswith("baseline") and v), None)
    if base is None:
        return "parameters not recorded"
    return f"{base:,} parameters" + (f" ({fb:,} with the fusion)" if fb else "")


def _seeds(cfg: dict[str, Any]) -> str:
    first, n = cfg["train"]["seed"], cfg["seeds"]
    return f"seed {first}" if n == 1 else f"seeds {first}..{first + n - 1} (tables: mean ± sample sd over seeds)"


def _split(schedule: dict[str, Any]) -> str:
    start = schedule["feedback_start"]
    shares = [start] + [(1 - start) * p for p in schedule["pass_mix"]]
    return "/".join(f"{100 * s:.0f}%" for s in shares)


def _exact_method(cfg: dict[str, Any], runs: list[RunRecord]) -> str:
    """The exact method the runs used: the configured one, or what ``auto`` chose (recorded per run)."""
    return next((r["exact_method"] for r in runs if "exact_method" in r), cfg["exact_method"])


def _exact_text(cfg: dict[str, Any], runs: list[RunRecord]) -> str:
    method = _exact_method(cfg, runs)
    if method == "sequential":
        return "computed sequentially (one position at a time through the KV cache: the definition)"
    tol = cfg["exact_tol"]
    stop = f"until max|Δh| < {tol:g}" if tol else "until exact"
    chunk = f" in chunks of {cfg['exact_chunk_size']}" if method == "chunked" else ""
    return f"computed by Jacobi passes{chunk} {stop}, on the same windows"


# ---------------------------------------------------------------------------------------------- terminal

def summary(results: CompareResults) -> str:
    """The terminal summary: test loss per run and mode, the token multipliers, the stability curves."""
    names, modes = run_names(results), modes_of(results)
    runs = results["runs"]
    lines = ["", f"fullband compare: test loss (nats/token) on {runs[0]['test_windows']} windows; "
          f"{duration(results['seconds'])}"]
    head = f"{'run':<16}{'tokens':>12}{'compute':>12}" + "".join(f"{mode_label(m):>18}" for m in modes)
    lines.append(head)
    for name in names:
        mine = runs_named(results, name)
        cells = [fmt(r["test"][m]["loss"] for r in mine) if m in mine[0]["test"] else "" for m in modes]
        lines.append(f"{name:<16}{fmt_int(r['tokens'] for r in mine):>12}"
                     f"{fmt_int(r['token_equiv_compute'] for r in mine):>12}" + "".join(f"{c:>18}" for c in cells))
    for name, by_mode in results["multipliers"].items():
        parts = []
        for mode, per_seed in by_mode.items():
            star = "*" if any(s["fit"] != INTERPOLATED for s in per_seed) else ""
            parts.append(f"{mode_label(mode)} {fmt((s['token_multiplier'] for s in per_seed), 2, 'x')}{star}")
        lines.append(f"token multiplier {name}: " + ", ".join(parts))
    if any(s["fit"] != INTERPOLATED for v in results["multipliers"].values() for p in v.values() for s in p):
        lines.append("  * extrapolated beyond the measured baselines (see report.md)")
    for name in dict.fromkeys(c["name"] for c in results["stability"]):
        mine = [c for c in results["stability"] if c["name"] == name]
        marks = checkpoints(len(mine[0]["loss"]))
        lines.append(f"stability {name} (val loss at pass {'/'.join(map(str, marks))}): "
                     + " ".join(fmt((c["loss"][k - 1] for c in mine), 3) for k in marks))
    lines.append(f"report: {Path(results['config']['out_dir']) / REPORT}")
    return "\n".join(lines)
