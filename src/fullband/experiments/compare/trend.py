"""The gaps of a compare run against training tokens, and where their trend says feedback reaches the baseline.

From the validations during training (``train_eval_points``; without them, the one validation at the end):

- the *fused-vs-plain* gap of each feedback model: validation loss after 2 (3) passes minus after 1 pass;
- the *feedback-vs-baseline* gap: the feedback model's validation loss in each validated mode minus the 1x
  baseline's at the same step. Both runs follow one learning-rate schedule to the same step count, so at every
  step they are at the same point of it, and a gap of 0 is a token multiplier of 1.0x there.

The trend of the best mode's gap is fitted linear in log(tokens) per seed and pooled over seeds, over the points
from ``FIT_FROM`` of the run on (the first validations are the initial transient), with a bootstrap over seeds and
points for its uncertainty; where the line reaches 0 is where it says the best mode crosses 1.0x. Torch-free, a
function of results.json alone.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from fullband.experiments.compare.records import CompareResults
from fullband.experiments.core.lm.records import RunRecord
from fullband.experiments.core.report import Report, mode_label

FEEDBACK = "feedback"  # the run the verdict is about (compare.FEEDBACK; not imported: compare imports torch)
VALIDATED_MODES = {1: "standard", 2: "fused1", 3: "fused2"}  # val_loss_{k}pass = the last of k passes
FIT_FROM = 0.25  # fit the points past this share of the run's tokens
BOOTSTRAP = 2000  # resamples; a fixed seed, so a report re-rendered from results.json says the same
POOR_FIT_R2 = 0.5  # below this the verdict says the line does not describe the points
FAR = 10.0  # a crossing beyond FAR x the last validated tokens is called an extrapolation far out


def gap_series(results: CompareResults) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """{feedback run name: {seed: [point]}}, one point per validation, oldest first. A point holds ``tokens``,
    ``vs_plain`` {mode: gap to 1 pass} and ``vs_baseline`` {mode: gap to the 1x baseline at that step} (empty
    when the 1x baseline did not validate at that step)."""
    runs = results.get("runs", [])
    baselines = {r["seed"]: _points(r) for r in runs if r["kind"] == "baseline" and r["budget"] == 1.0
                 and r["name"] == "baseline-1x"}
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for run in runs:
        if run["kind"] == "baseline":
            continue
        reference = {p["step"]: p["losses"][1] for p in baselines.get(run["seed"], []) if 1 in p["losses"]}
        series = []
        for p in _points(run):
            losses = p["losses"]
            if 1 not in losses:
                continue
            series.append({
                "step": p["step"], "tokens": p["tokens"],
                "vs_plain": {VALIDATED_MODES[k]: v - losses[1] for k, v in losses.items() if k in (2, 3)},
                "vs_baseline": ({VALIDATED_MODES[k]: v - reference[p["step"]] for k, v in losses.items()
                                 if k in VALIDATED_MODES} if p["step"] in reference else {}),
            })
        out.setdefault(run["name"], {})[run["seed"]] = series
    return out


def _points(run: RunRecord) -> list[dict[str, Any]]:
    """(step, tokens, {passes: loss}) of every validation of a run; the end-of-run one when none was logged."""
    per_step = run["tokens"] / run["steps"]
    history = run.get("validation_history") or [{"step": run["steps"] - 1, **run.get("validation", {})}]
    out = []
    for rec in history:
        losses = {k: rec[f"val_loss_{k}pass"] for k in VALIDATED_MODES if rec.get(f"val_loss_{k}pass") is not None}
        if losses:
            out.append({"step": rec["step"], "tokens": round((rec["step"] + 1) * per_step), "losses": losses})
    return out


def fit_line(xs: list[float], ys: list[float]) -> dict[str, float] | None:
    """Least squares y = a + b x -> intercept, slope, r2; None with fewer than 3 points or one x."""
    if len(xs) < 3 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"intercept": a, "slope": b, "r2": 1 - res / ss if ss > 0 else 1.0}


def crossing(line: dict[str, float]) -> float | None:
    """Tokens where the fitted gap a + b ln(t) is 0; None for a flat line."""
    if line["slope"] == 0:
        return None
    log_t = -line["intercept"] / line["slope"]
    return math.exp(log_t) if log_t < 700 else math.inf


def gap_trend(results: CompareResults) -> dict[str, Any]:
    """The series, and for the ``feedback`` run the best validated mode's fitted gap to the baseline: per seed,
    pooled, and bootstrapped (see the module doc)."""
    series = gap_series(results)
    out: dict[str, Any] = {"series": {name: {str(s): pts for s, pts in by_seed.items()}
                                      for name, by_seed in series.items()}, "fit_from": FIT_FROM}
    mine = {s: [p for p in pts if p["vs_baseline"]] for s, pts in series.get(FEEDBACK, {}).items()}
    mine = {s: pts for s, pts in mine.items() if pts}
    if not mine:
        return out
    modes = [m for m in VALIDATED_MODES.values() if all(m in pts[-1]["vs_baseline"] for pts in mine.values())]
    best = min(modes, key=lambda m: statistics.fmean(pts[-1]["vs_baseline"][m] for pts in mine.values()))
    last = max(pts[-1]["tokens"] for pts in mine.values())
    used = {s: [(math.log(p["tokens"]), p["vs_baseline"][best]) for p in pts if p["tokens"] >= FIT_FROM * last]
            for s, pts in mine.items()}
    out.update({"mode": best, "last_tokens": last,
                "last_gap": {str(s): pts[-1]["vs_baseline"][best] for s, pts in mine.items()},
                "points_per_seed": {str(s): len(v) for s, v in used.items()}})
    per_seed = {s: fit_line([x for x, _ in v], [y for _, y in v]) for s, v in used.items()}
    if any(line is None for line in per_seed.values()):
        return out  # too few validations for a trend
    pooled = fit_line([x for v in used.values() for x, _ in v], [y for v in used.values() for _, y in v])
    out["fit"] = {"per_seed": {str(s): {**line, "crossing_tokens": crossing(line)} for s, line in per_seed.items()},
                  "pooled": {**pooled, "crossing_tokens": crossing(pooled)},
                  "bootstrap": _bootstrap(list(used.values()), last)}
    return out


def _bootstrap(seeds: list[list[tuple[float, float]]], last: float) -> dict[str, Any]:
    """Resample the seeds, and each drawn seed's points, with replacement; refit pooled. -> the 5/50/95%
    percentiles of the slope and of the crossing (inf where a resample's line never reaches 0 ahead of ``last``
    coming from above, i.e. the gap does not shrink)."""
    rng = random.Random(0)
    slopes, crossings = [], []
    for _ in range(BOOTSTRAP):
        pts = [p for seed in (rng.choice(seeds) for _ in seeds) for p in (rng.choice(seed) for _ in seed)]
        line = fit_line([x for x, _ in pts], [y for _, y in pts])
        if line is None:
            continue
        slopes.append(line["slope"])
        gap_now = line["intercept"] + line["slope"] * math.log(last)
        ahead = gap_now > 0 and line["slope"] >= 0  # still behind and not closing: never crosses
        crossings.append(math.inf if ahead else crossing(line) or math.inf)
    return {"resamples": len(slopes), "slope": _percentiles(slopes), "crossing_tokens": _percentiles(crossings),
            "never_share": sum(c == math.inf for c in crossings) / max(1, len(crossings))}


def _percentiles(values: list[float]) -> list[float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.05, 0.5, 0.95)]


# ---------------------------------------------------------------------------------------------- report text

def tokens_text(t: float | None) -> str:
    if t is None or not math.isfinite(t):
        return "never"
    if t < 1e3:
        return f"{t:.0f}"
    if t >= 1e12:  # a line's crossing far beyond any run: scientific, not "1.42e+08B"
        return f"{t:.2g}"
    return f"{t / 1e9:.3g}B" if t >= 1e9 else f"{t / 1e6:.3g}M" if t >= 1e6 else f"{t / 1e3:.3g}k"


def verdict_lines(results: CompareResults) -> list[str]:
    """The verdict's lines on the gaps against tokens (see the module doc)."""
    trend = results.get("gap_trend") or gap_trend(results)
    if not trend["series"]:  # no feedback run validated
        return []
    lines = []
    for name, by_seed in trend["series"].items():
        first, last = _ends(by_seed, "vs_plain", "fused1")
        if first is None:
            continue
        text = f"{last[1]:+.4f} at {tokens_text(last[0])} tokens, the end of training"
        if first[0] != last[0]:
            text = f"{first[1]:+.4f} at {tokens_text(first[0])} tokens, {last[1]:+.4f} at {tokens_text(last[0])}"
        lines.append(f"- Fused(1)-vs-plain validation gap of `{name}`: {text} (mean over seeds).")
    if "mode" not in trend:
        return [*lines, "- Trend against tokens: no feedback-vs-baseline gap during training was recorded (the 1x "
                "baseline validates only with train_eval_points > 0), so no crossing of 1.0x can be fitted."]
    mode, fit = mode_label(trend["mode"]), trend.get("fit")
    gaps = ", ".join(f"{g:+.4f}" for g in trend["last_gap"].values())
    head = (f"- Trend of the best validated mode, {mode}, against the 1x baseline (validation split, same step): "
            f"gap {gaps} (per seed) at {tokens_text(trend['last_tokens'])} tokens")
    if fit is None:
        return [*lines, head + "; too few validations for a trend (train_eval_points >= 4 fits one)."]
    pooled, boot = fit["pooled"], fit["bootstrap"]
    per_doubling = [f"{line['slope'] * math.log(2):+.4f}" for line in fit["per_seed"].values()]
    slope_ci = ", ".join(f"{s * math.log(2):+.4f}" for s in (boot["slope"][0], boot["slope"][2]))
    head += (f". Fitted linear in log tokens over the last {1 - trend['fit_from']:.0%} of training: "
             f"{pooled['slope'] * math.log(2):+.4f} nats per doubling of tokens pooled (per seed "
             f"{', '.join(per_doubling)}; 90% bootstrap {slope_ci}), R² {pooled['r2']:.2f}.")
    lines.append(head + " " + _crossing_text(trend, pooled, boot, results))
    if pooled["r2"] < POOR_FIT_R2:
        lines.append(f"- The fit is poor (R² {pooled['r2']:.2f} < {POOR_FIT_R2}): the gap does not follow a straight "
                     "line in log tokens over these points, so the crossing above is not a reliable estimate; the "
                     "per-point gaps in the table are the evidence.")
    return lines


def _crossing_text(trend: dict[str, Any], pooled: dict[str, Any], boot: dict[str, Any],
                   results: dict[str, Any]) -> str:
    last, slope, t = trend["last_tokens"], pooled["slope"], pooled["crossing_tokens"]
    gap_now = pooled["intercept"] + slope * math.log(last)
    seeds = ", ".join(tokens_text(line["crossing_tokens"]) for line in trend["fit"]["per_seed"].values())
    lo, _, hi = boot["crossing_tokens"]
    interval = (f"90% bootstrap interval {tokens_text(lo)} to {tokens_text(hi)}, {boot['never_share']:.0%} of the "
                f"resamples never; per seed {seeds}")
    slope_lo, _, slope_hi = boot["slope"]
    if slope_lo < 0 < slope_hi:  # the resampled seeds disagree on the sign: any crossing is the noise's
        where = "ahead of" if gap_now <= 0 else "behind"
        return (f"The slope's 90% bootstrap interval includes 0: over the fitted range the gap neither closes nor "
                f"opens measurably with tokens, so no crossing of 1.0x can be placed; the fitted line ends "
                f"{abs(gap_now):.4f} nats {where} the baseline ({interval}).")
    if gap_now > 0 and slope >= 0:
        return f"The gap does not shrink with tokens: the trend never reaches 1.0x ({interval})."
    if gap_now <= 0 and slope < 0:
        return (f"The best mode is ahead of the baseline; by the fit it crossed 1.0x at about {tokens_text(t)} "
                f"tokens ({interval}).")
    if gap_now <= 0:
        return (f"The best mode is ahead of the baseline, but by the fit its lead shrinks and is gone at "
                f"{tokens_text(t)} tokens ({interval}).")
    params = _parameters(results)
    per_param = f", {t / params:.1f} tokens/parameter" if params and math.isfinite(t) else ""
    out = (f"Extrapolated, the line reaches 0 (token multiplier 1.0x) at {tokens_text(t)} tokens ({t / last:.3g}x "
           f"the last validated{per_param}; {interval}).")
    if t > FAR * last:
        out += f" That is more than {FAR:g}x beyond the measured range: an extrapolation, not a measurement."
    return out


def _ends(by_seed: dict[str, list[dict[str, Any]]], key: str,
          mode: str) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(tokens, mean gap) at the first and last validation, over the seeds that have ``mode``."""
    pts = [p for p in by_seed.values() if p and mode in p[0][key] and mode in p[-1][key]]
    if not pts:
        return None, None
    return ((statistics.fmean(p[0]["tokens"] for p in pts), statistics.fmean(p[0][key][mode] for p in pts)),
            (statistics.fmean(p[-1]["tokens"] for p in pts), statistics.fmean(p[-1][key][mode] for p in pts)))


def _parameters(results: CompareResults) -> int | None:
    return next((r.get("parameters") for r in results["runs"] if r["name"] == FEEDBACK and r.get("parameters")), None)


def section(rep: Report, results: CompareResults, plot_file: str | None) -> None:
    """The report's section: the per-validation gaps (mean over seeds) and the plot."""
    trend = results.get("gap_trend") or gap_trend(results)
    text = ("Validation loss during training (the same validation batches every time): **fused(k) − standard** "
             "inside each feedback model, and each validated mode of `feedback` **− the 1x baseline** at the same "
             "step (both runs are then at the same point of one learning-rate schedule, so a gap of 0 is a token "
             "multiplier of 1.0x there; these are mid-schedule models, not models trained to that budget). Mean "
             "over seeds; negative = the first term is better.")
    fb = trend["series"].get(FEEDBACK, {})
    rows: dict[int, dict[str, list[float]]] = {}
    for name, by_seed in trend["series"].items():
        for pts in by_seed.values():
            for p in pts:
                row = rows.setdefault(p["tokens"], {})
                for mode, g in p["vs_plain"].items():
                    row.setdefault(f"`{name}` {mode_label(mode)} − standard", []).append(g)
                if name == FEEDBACK:
                    for mode, g in p["vs_baseline"].items():
                        row.setdefault(f"`{name}` {mode_label(mode)} − baseline", []).append(g)
    if not rows or not fb:
        return
    columns = list(dict.fromkeys(c for row in rows.values() for c in row))
    table = [[f"{tokens:,}", *(f"{statistics.fmean(rows[tokens][c]):+.4f}" if c in rows[tokens] else ""
                               for c in columns)] for tokens in sorted(rows)]
    rep.section("The gaps against training tokens (validation split)").paragraph(text)
    rep.table(["tokens", *columns], table, compact=True)
    if plot_file:
        rep.figure(plot_file, "gaps vs tokens")
