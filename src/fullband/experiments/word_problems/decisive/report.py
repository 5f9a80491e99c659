"""report.md and the figure of ``fullband eval-decisive``, from results.json alone (torch-free)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fullband.experiments.core.plots import pyplot, save_figure
from fullband.experiments.core.report import Report
from fullband.experiments.word_problems.analysis import FIT_TOLERANCE, KEEP
from fullband.experiments.word_problems.decisive.analysis import (
    MARGIN_TARGET,
    MIN_KEPT,
    MODEL,
    RATIO,
    REFERENCE,
    RULE_COMMIT,
    TIE,
    controls_of,
    setting_of,
)
from fullband.experiments.word_problems.report import GROUP_TITLES

ACCURACY_PLOT = "accuracy_vs_length.png"
RANGE_PLOT = "accuracy_vs_length_second_range.png"
TITLES = {"baseline": "baseline", "equal_flops": "equal-FLOPs transformer", "looped": "looped",
          "growing_depth": "shift-0, depth grows with n", "rnn": "RNN (reference)", "fullband": "full-bandwidth exact"}


def title_of(arm: str) -> str:
    return TITLES.get(arm, arm)


def is_smoke(results: dict[str, Any]) -> bool:
    return results["config"]["preset"] == "smoke"


def _signed(value: float) -> str:
    return f"{value:+.2f}"


def _interval(m: dict[str, Any]) -> str:
    return f"{_signed(m['mean'])} [{_signed(m['low'])}, {_signed(m['high'])}]"


def _median(values: Any) -> str:
    return f"{statistics.median(list(values)):g}"


def verdict(results: dict[str, Any]) -> list[str]:
    """Per group: whether the target holds, with its numbers."""
    if is_smoke(results):
        return ["- The smoke preset checks the plumbing (every arm trains a few steps and is scored): it gives no "
                "verdict."]
    lines = []
    for group, data in results["groups"].items():
        a = data["analysis"]
        target, medians = a["target"], a["median_kept"]
        controls = [arm for arm in controls_of(list(data["cells"]))]
        best = max(controls, key=lambda arm: medians[arm]) if controls else None
        text = (f"- **{GROUP_TITLES.get(group, group)}: target {'met' if target['met'] else 'not met'}.** "
                f"Full-bandwidth exact keeps >= {KEEP} to a median n = {medians[MODEL]:g} over the fresh seeds "
                f"(target >= {MIN_KEPT} and >= {RATIO}x every control)")
        if best is not None:
            text += (f"; the strongest transformer control, {title_of(best)} ({a['better'][best]} setting), to "
                     f"{medians[best]:g}")
        text += "."
        if "margin" in target:
            m = target["margin"]
            text += (f" At n = {target['n']} its lead over each seed's best control (every control, both settings) "
                     f"is {_interval(m)} (paired over {len(m['per_seed'])} seeds, t 95%; target "
                     f"{_signed(MARGIN_TARGET)} with the interval above 0).")
            if "reference_margin" in target:
                text += f" Minus the RNN's fair setting there: {_interval(target['reference_margin'])}."
        lines.append(text)
        if "range" in data:
            r = data["range"]
            kept = ", ".join(f"{title_of(arm)} {r['analysis']['median_kept'][arm]:g}" for arm in r["cells"])
            lines.append(f"  Trained on n <= {r['train_length']} instead: median longest n kept {kept}.")
    return lines


def report(results: dict[str, Any], plots: bool) -> Report:
    cfg = results["config"]
    seeds = ", ".join(str(s) for s in cfg["fresh_seeds"])
    rep = Report.of(results, "Decisive controls: the full-bandwidth model against the controls that decide "
                    "transformer length generalisation, S5 and A5 word problems", results["command"],
                    f" (fresh seeds {seeds}; the runs' CPUs are in the cost tables)", compact_tables=True)
    rep.section("Verdict").block(*verdict(results))
    _rule(rep, cfg)
    _setup(rep, cfg)
    if plots:
        rep.figure(ACCURACY_PLOT, "accuracy vs length, fresh seeds")
    for group, data in results["groups"].items():
        _group(rep, group, data, cfg)
    if any("range" in data for data in results["groups"].values()):
        rep.section("The second training range")
        L = next(data["range"]["train_length"] for data in results["groups"].values() if "range" in data)
        rep.paragraph(f"The full-bandwidth model (its fair setting) and the {cfg['strongest']} strongest controls "
                      "(by their better setting's median longest n kept on the fresh seeds, then mean unseen "
                      f"accuracy) "
                      f"trained again with those settings, no re-tuning, on problems of {L} steps (trained lengths "
                      f"1..{L}), on the same fresh seeds, and tested on the same problems.")
        if plots:
            rep.figure(RANGE_PLOT, "accuracy vs length, second training range")
        for group, data in results["groups"].items():
            if "range" in data:
                _range(rep, group, data["range"], cfg)
    return rep


def _rule(rep: Report, cfg: dict[str, Any]) -> None:
    commit = f"commit {RULE_COMMIT}" if RULE_COMMIT else "the commit before the study's runs"
    rep.section("The rule, fixed before the runs").paragraph(
        f"Written into DESIGN.md §7 and `fullband.experiments.word_problems.decisive.analysis` in {commit}, before "
        "any run of this study. It was written after the earlier controls study "
        "(docs/results/reasoning-controls) showed lower learning rates extrapolating better, and its tie-break "
        "(lower learning rate first) follows from that; it applies to every arm alike, controls included. The tuning "
        "seed's numbers chose the settings; only the fresh seeds, which took part in no choice here or in an earlier "
        "study, confirm anything.")
    rep.block(
        f"- **Fair setting** (every arm): the tuning seed's grid point with the highest mean validation accuracy over "
        f"the trained lengths (held-out problems); accuracies within {TIE} of the best are tied, and ties go to the "
        "lower learning rate, then fewer steps, then lower validation loss.",
        f"- **Hindsight setting** (every control; never the full-bandwidth model): the grid point that kept >= {KEEP} "
        f"longest on the tuning seed's test problems at lengths up to {cfg['hindsight_length']}, then the highest "
        "mean test accuracy at the unseen ones among those, then the fair order: an upper bound on what the "
        "control's grid gives.",
        "- Both settings train on the fresh seeds. A control's **better setting** is the one with the longer median "
        f"longest n kept at >= {KEEP} over the fresh seeds (then the higher mean accuracy at unseen lengths up to "
        f"{cfg['hindsight_length']}; a tie goes to the fair one).",
        f"- **Target**, per group on the fresh seeds: the full-bandwidth model's median longest n kept is >= "
        f"{MIN_KEPT} and >= {RATIO}x every transformer control's under its better setting, and at n* = the "
        f"full-bandwidth model's median longest n kept (the lower median), its lead over each seed's best control "
        f"(every control, both settings) is >= {MARGIN_TARGET} with the paired t 95% interval above 0.",
        f"- **Second training range**: the full-bandwidth model (fair) and the {cfg['strongest']} strongest controls "
        "(better setting) trained on longer problems with those settings; no re-tuning.",
    )


def _setup(rep: Report, cfg: dict[str, Any]) -> None:
    L, steps = cfg["train_length"], cfg["steps"]
    cut, longest = max(cfg["test_lengths"]), max(cfg["long_test_lengths"] or cfg["test_lengths"])
    positions = " and ".join("NoPE" if p == "none" else "RoPE" for p in cfg["positions"])
    rep.section("Setup").block(
        "Ball-tracking word problems (`fullband.tasks.word_problems`): a ball under one of 5 cups, n steps that each "
        "move the cups by a generator of the group (S5: the 10 transpositions; A5: the 20 three-cycles), answer = the "
        "ball's cup. One token per step and no step names, so a longer problem differs from a shorter one in length "
        f"only: every test token occurs in training. Training problems have {L} steps with the cup after every step "
        f"as a label (trained lengths 1..{L}). Test problems: {cfg['test_problems']} of {cut} steps, every prefix "
        f"scored as a problem of its length, and on the fresh seeds also {cfg['long_test_problems']} long test "
        f"problems of {longest} steps, which give the accuracy at lengths {cut + 1}..{longest} (fewer problems: a "
        "looped model's cost grows with the square of the length). Chance is 0.20.")
    rep.block(
        f"Every arm's grid on seed {cfg['tuning_seed']}: its variants x its knob x learning rates "
        f"{', '.join(f'{lr:g}' for lr in cfg['learning_rates'])} x {{{steps}, {2 * steps}}} steps (AdamW, batch "
        f"{cfg['batch_size']}, warmup {cfg['warmup_fraction']:g}, WSD cool-down over the last "
        f"{cfg['cooldown_fraction']:g}; the {steps}-step model is a cool-down branched off the {2 * steps}-step run). "
        f"Every transformer arm, the full-bandwidth model included, has {positions} in its grid. Arms:",
    )
    rep.block(
        f"- **baseline**: a {cfg['n_layers']}-block transformer, d_model {cfg['d_model']}, one pass (knob: weight "
        "decay);",
        "- **equal-FLOPs transformer**: a plain transformer whose training FLOPs per step equal the full-bandwidth "
        "model's (knob: deeper at the same width, or wider at the same depth);",
        "- **looped**: the baseline's blocks applied k = c x n times at every position with the token embedding "
        "injected at every loop, the same rule in training and answering, gradients through every loop (knob: c; "
        "variants: the state fed back after the final RMSNorm, `normed`, the form of Yang et al. 2024's code that "
        "Fan et al. 2024 build on, or the raw residual stream, `raw`);",
        "- **shift-0, depth grows with n**: the full-bandwidth model's parameters and fusion with feedback_shift 0 "
        "(pass k fuses a position's own state from pass k-1), position t read after c x t passes by the looped rule "
        "in training and answering (knob: c): what it lacks beside the full-bandwidth model is only the state from "
        "the previous position;",
        "- **RNN (reference)**: a one-layer GRU or LSTM with the full-bandwidth model's parameter count, every cell "
        "and learning rate trained on the fresh seeds: the known ceiling on word problems, not a control to beat;",
        f"- **full-bandwidth exact**: trained on its exact recurrence (every pass up to the exact count, gradients "
        f"through pass 1 and the last {cfg['grad_passes']}, fusion LR x{cfg['fusion_lr_mult']:g}), answering with "
        "exact (fully recurrent) prefill; its standard-mode answers (no feedback) are shown beside (knob: lambda, "
        "the feedback passes' loss weight).",
    )
    rep.block(
        f"Statistics: the seed is the unit. A control more than {FIT_TOLERANCE} below the baseline (fair) at a "
        "trained length on a seed failed to train there and is listed so. Floors: the most common answer of each "
        f"length, the start cup, and tracking the first {L} steps only. FLOPs as `fullband.experiments.core.flops` "
        "counts them (2 per multiply-add, causal attention, 3x for a pass with gradients); seconds are one run's "
        "training time (scoring apart), on the CPU named beside them, one thread per run.")


def _lengths(cfg: dict[str, Any], L: int) -> tuple[list[int], list[str]]:
    lengths = [*range(1, L + 1), *(n for n in (*cfg["test_lengths"], *cfg["long_test_lengths"]) if n > L)]
    return lengths, [f"n={n}" + ("*" if n > L else "") for n in lengths]


def _group(rep: Report, group: str, data: dict[str, Any], cfg: dict[str, Any]) -> None:
    a, L = data["analysis"], cfg["train_length"]
    rep.section(GROUP_TITLES.get(group, group))
    _costs(rep, data, cfg)
    rep.section("Longest n kept at >= 0.9 on the fresh seeds", level=3)
    rows = []
    for arm in data["cells"]:
        row = [title_of(arm)]
        for setting in ("fair", "hindsight"):
            kept = a["kept"][setting].get(arm)
            row += [", ".join(str(v) for v in kept.values()), _median(kept.values())] if kept else ["-", "-"]
        failed = {s: a["failed_to_train"][s].get(arm, []) for s in ("fair", "hindsight")}
        row += [a["better"].get(arm, "fair"), "; ".join(f"{s}: {', '.join(v)}" for s, v in failed.items() if v)
                or "none"]
        rows.append(row)
    rep.table(["arm", "fair: per seed", "fair: median", "hindsight: per seed", "hindsight: median", "better",
               "failed to train (seeds)"], rows)
    target = a["target"]
    if "margin" in target:
        m = target["margin"]
        rep.section(f"The lead at n* = {target['n']}", level=3).paragraph(
            "Full-bandwidth exact minus each seed's best control (every control, both settings) at n*, the "
            "full-bandwidth model's median longest n kept.")
        rows = [[seed, _signed(value), m["best_rival"][seed]] for seed, value in m["per_seed"].items()]
        rep.table(["seed", "margin", "best control"], rows,
                  f"Mean {_interval(m)} (t 95%)." + (f" Minus the RNN (fair): {_interval(target['reference_margin'])}."
                                                     if "reference_margin" in target else ""))
    lengths, header = _lengths(cfg, L)
    rep.section("Accuracy by length: mean over the fresh seeds (worst seed)", level=3)
    rows = []
    for arm, cells in data["cells"].items():
        rows.append([f"{title_of(arm)} (fair)", *_mean_worst(cells, "test", lengths)])
        if "standard" in next(iter(cells.values())):
            rows.append([f"{title_of(arm)}, decoded standard", *_mean_worst(cells, "standard", lengths)])
        if arm in data["hindsight_cells"] and setting_of(data["hindsight"][arm]) != setting_of(data["chosen"][arm]):
            rows.append([f"{title_of(arm)} (hindsight)", *_mean_worst(data["hindsight_cells"][arm], "test", lengths)])
    for name, values in data["floors"].items():
        rows.append([f"floor: {name}", *[f"{values[n - 1]:.2f}" for n in lengths]])
    rep.table(["arm", *header], rows, "\\* never trained on.")
    if "rnn" in data:
        rep.section("The RNN at every cell and learning rate (the ceiling)", level=3)
        far = max(cfg["long_test_lengths"] or cfg["test_lengths"])
        rows = [[entry["knob"].upper(), f"{entry['lr']:g}", entry["steps"],
                 ", ".join(str(v) for v in _kept(entry["cells"]).values()), _median(_kept(entry["cells"]).values()),
                 *_mean_worst(entry["cells"], "test", [max(cfg["test_lengths"]), far])] for entry in data["rnn"]]
        rep.table(["cell", "lr", "steps", "longest n kept per seed", "median", f"n={max(cfg['test_lengths'])}",
                   f"n={far}"], rows)
    rep.section("Every seed", level=3)
    rows = [[title_of(arm), setting, seed, *[f"{cell['test'][n - 1]:.2f}" for n in lengths]]
            for setting, part in (("fair", data["cells"]), ("hindsight", data["hindsight_cells"]))
            for arm, cells in part.items() for seed, cell in cells.items()]
    rep.table(["arm", "setting", "seed", *header], rows)
    _grid(rep, data, cfg)


def _kept(cells: dict[str, Any]) -> dict[str, int]:
    from fullband.experiments.word_problems.analysis import longest_kept

    return {seed: longest_kept(cell["test"]) for seed, cell in cells.items()}


def _costs(rep: Report, data: dict[str, Any], cfg: dict[str, Any]) -> None:
    rep.section("Chosen settings and costs", level=3)
    far = max(cfg["long_test_lengths"] or cfg["test_lengths"])
    base = data["costs"]["fair"]["baseline"]["training_flops"]
    rows = []
    for setting in ("fair", "hindsight"):
        for arm, c in data["costs"][setting].items():
            rows.append([title_of(arm), setting, c["describe"], f"{c['parameters']:,}", f"{c['lr']:g}", c["steps"],
                         f"{c['training_flops']:.3g}", f"{c['training_flops'] / base:.1f}x",
                         f"{c['inference_flops'][str(max(cfg['test_lengths']))]:.3g}",
                         f"{c['inference_flops'][str(far)]:.3g}", f"{c['training_seconds']:.0f}",
                         "; ".join(c["processors"])])
    rep.table(["arm", "setting", "chosen model", "parameters", "lr", "steps", "training FLOPs", "x baseline",
               f"inference FLOPs (n = {max(cfg['test_lengths'])})", f"(n = {far})", "training s per run",
               "CPU"], rows)


def _grid(rep: Report, data: dict[str, Any], cfg: dict[str, Any]) -> None:
    tests = cfg["test_lengths"]
    rep.section(f"Tuning grid (seed {cfg['tuning_seed']})", level=3).paragraph(
        "F = the fair setting (validation on the trained lengths); H = the hindsight setting (the test columns). "
        "The full-bandwidth model has no hindsight setting.")
    rows = []
    for point in data["grid"]:
        arm = point["arm"]
        marks = [mark for mark, chosen in (("F", data["chosen"]), ("H", data["hindsight"]))
                 if arm in chosen and setting_of(point) == setting_of(chosen[arm])]
        rows.append([title_of(arm), point["describe"], f"{point['lr']:g}", point["steps"],
                     f"{point['validation_accuracy']:.3f}", f"{point['validation_loss']:.4f}",
                     *[f"{point['test'][n - 1]:.2f}" for n in tests], " ".join(marks)])
    rep.table(["arm", "setting", "lr", "steps", "validation accuracy", "validation loss",
               *[f"test n={n}" for n in tests], ""], rows)


def _range(rep: Report, group: str, part: dict[str, Any], cfg: dict[str, Any]) -> None:
    a, L = part["analysis"], part["train_length"]
    rep.section(f"{GROUP_TITLES.get(group, group)}, trained on n <= {L}", level=3)
    rows = []
    for arm, c in part["costs"].items():
        kept = a["kept"][arm]
        rows.append([title_of(arm), part["chosen"][arm]["setting"], c["describe"], f"{c['lr']:g}", c["steps"],
                     f"{c['training_flops']:.3g}", f"{c['training_seconds']:.0f}",
                     ", ".join(str(v) for v in kept.values()), _median(kept.values())])
    rep.table(["arm", "setting", "model", "lr", "steps", "training FLOPs", "training s per run",
               "longest n kept per seed", "median"], rows)
    if "margin" in a:
        rep.paragraph(f"At n = {a['n']} (the full-bandwidth model's median longest n kept) its lead over each seed's "
                      f"best control: {_interval(a['margin'])} (t 95%).")
    lengths, header = _lengths(cfg, L)
    rows = [[title_of(arm), *_mean_worst(cells, "test", lengths)] for arm, cells in part["cells"].items()]
    rep.table(["arm", *header], rows, "Mean over the fresh seeds (worst seed); \\* never trained on.")


def _mean_worst(cells: dict[str, Any], key: str, lengths: list[int]) -> list[str]:
    out = []
    for n in lengths:
        values = [cell[key][n - 1] for cell in cells.values()]
        out.append(f"{statistics.fmean(values):.2f} ({min(values):.2f})")
    return out


def plot_accuracy(results: dict[str, Any], out_dir: Path) -> None:
    """Accuracy against length (log axis) on the fresh seeds, mean with the seeds' range shaded, one panel per group:
    every arm at its better setting (the model and the RNN at their fair one); the second range in its own figure."""
    _plot(results, out_dir / ACCURACY_PLOT, lambda data: {
        arm: (data["hindsight_cells"][arm] if data["analysis"]["better"].get(arm) == "hindsight" else cells)
        for arm, cells in data["cells"].items()}, lambda data: results["config"]["train_length"])
    if any("range" in data for data in results["groups"].values()):
        _plot(results, out_dir / RANGE_PLOT, lambda data: data["range"]["cells"],
              lambda data: data["range"]["train_length"])


def _plot(results: dict[str, Any], path: Path, cells_of: Any, trained: Any) -> None:
    plt = pyplot()
    groups = results["groups"]
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (group, data) in zip(axes[0], groups.items(), strict=True):
        n = []
        for arm, seeds in cells_of(data).items():
            curves = [s["test"] for s in seeds.values()]
            n = list(range(1, len(curves[0]) + 1))
            mean = [statistics.fmean(c[i] for c in curves) for i in range(len(n))]
            line, = ax.plot(n, mean, label=title_of(arm), linewidth=2.5 if arm == MODEL else 1.5,
                            linestyle="--" if arm == REFERENCE else "-")
            ax.fill_between(n, [min(c[i] for c in curves) for i in range(len(n))],
                            [max(c[i] for c in curves) for i in range(len(n))], color=line.get_color(), alpha=0.15)
        ax.plot(n, data["floors"]["majority"][: len(n)], color="grey", linestyle=":", label="floor: most common answer")
        ax.axvline(trained(data), color="black", linewidth=0.8)
        ax.axhline(KEEP, color="black", linewidth=0.5, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("problem length n (steps; the vertical line is the longest trained)")
        ax.set_ylabel("answer accuracy (fresh seeds: mean, range shaded)")
        ax.set_title(GROUP_TITLES.get(group, group))
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    save_figure(fig, path)
