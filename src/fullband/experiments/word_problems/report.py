"""report.md and the figures of ``fullband eval-controls``, from results.json alone (torch-free)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fullband.experiments.core.plots import pyplot, save_figure
from fullband.experiments.core.report import Report
from fullband.experiments.word_problems.analysis import (
    BASELINE,
    FIT_TOLERANCE,
    KEEP,
    MARGIN_TARGET,
    MODEL,
    REFERENCE,
    same_setting,
    selection_key,
)

ACCURACY_PLOT = "accuracy_vs_length.png"
EXTRAPOLATION_PLOT = "accuracy_vs_length_second_selection.png"
CURVES_PLOT = "training_curves.png"
GROUP_TITLES = {"s5": "S5 (transpositions of 5 cups)", "a5": "A5 (three-cycles of 5 cups)"}


def arm_title(arm: str) -> str:
    return {"baseline": "baseline", "equal_flops": "equal-FLOPs transformer", "looped": "looped (input injection)",
            "rnn": "RNN (reference)", "fullband": "full-bandwidth exact", "shift0": "shift-0 ablation"}.get(arm, arm)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def _signed(value: float) -> str:
    return f"{value:+.2f}"


def is_smoke(results: dict[str, Any]) -> bool:
    return results["config"]["preset"] == "smoke"


def has_second_selection(results: dict[str, Any]) -> bool:
    """Whether the study ran the second selection (it adds its part to every group)."""
    return all("extrapolation" in data for data in results["groups"].values())


def verdict(results: dict[str, Any]) -> list[str]:
    """Per group: the target (margin at the longest n the model keeps >= 0.9), the longest n kept and the
    failed-to-train seeds; then the same for the second selection where the study has one."""
    if is_smoke(results):
        return ["- The smoke preset checks the plumbing (every arm trains a few steps and is scored): it gives no "
                "verdict."]
    lines = []
    for group, data in results["groups"].items():
        lines += _verdict_lines(GROUP_TITLES.get(group, group), data)
    for group, data in results["groups"].items():
        if "extrapolation" in data:
            lines += _verdict_lines(f"{GROUP_TITLES.get(group, group)}, second selection (on unseen lengths, "
                                    "seeds it did not see)", data["extrapolation"])
    return lines


def _verdict_lines(title: str, data: dict[str, Any]) -> list[str]:
    a, cells = data["analysis"], data["cells"]
    seeds = len(cells[MODEL])
    target = a["target"]
    lines = []
    if target["n"] is None:
        lines.append(f"- **{title}: target not met**: full-bandwidth exact reaches {KEEP} at no tested unseen length.")
    else:
        n = target["n"]
        margin = a["margins"][str(n)]
        best = sorted({arm_title(b) for b in margin["best_control"].values()})
        lines.append(
            f"- **{title}: target {'met' if target['met'] else 'not met'}**: at n = {n}, the longest tested "
            f"unseen length where full-bandwidth exact averages >= {KEEP} ({target['model_accuracy']:.2f}), it "
            f"leads each seed's best control ({', '.join(best)}) by {_signed(margin['mean'])} "
            f"[{_signed(margin['low'])}, {_signed(margin['high'])}] (paired over {seeds} seeds, t 95%; target "
            f"{_signed(MARGIN_TARGET)} with the interval above 0).")
    kept = {arm: a["arms"][arm]["longest_kept"] for arm in cells}
    lines.append("  Longest n kept at >= 0.9 (median over seeds): " + ", ".join(
        f"{arm_title(arm)} {statistics.median(kept[arm].values()):g}" for arm in cells) + ".")
    failed = {arm: a["arms"][arm]["failed_to_train"] for arm in cells if a["arms"][arm]["failed_to_train"]}
    if failed:
        lines.append("  Failed to train (below the baseline at a trained length, on seeds): " + "; ".join(
            f"{arm_title(arm)} {', '.join(seeds)}" for arm, seeds in failed.items()) + ".")
    return lines


def report(results: dict[str, Any], plots: bool) -> Report:
    """report.md: verdict, setup, per group its settings, accuracy, margins, seeds and tuning grid; the CPU spread;
    the training curves."""
    cfg = results["config"]
    rep = Report.of(results, "Controls trained to win: the full-bandwidth model on S5 and A5 word problems",
                    results["command"], f" in {results.get('seconds', 0) / 60:.0f} min (this invocation; a resumed "
                    f"study reads its finished runs back) on {results['machine']['processor']}, torch "
                    f"{results['machine']['torch']}, {cfg['seeds']} seeds", compact_tables=True)
    rep.section("Verdict").block(*verdict(results)).section("Setup")
    _setup(rep, cfg)
    if plots:
        rep.figure(ACCURACY_PLOT, "accuracy vs length")
    for group, data in results["groups"].items():
        _group_section(rep, group, data, cfg)
    if has_second_selection(results):
        _second_selection(rep, results, plots)
    if "cpu_spread" in results:
        _cpu_spread(rep, results["cpu_spread"])
    if plots:
        rep.section("Training curves").paragraph("Validation accuracy (mean over the trained lengths) of every "
                                                 "seed's run at its chosen setting.")
        rep.figure(CURVES_PLOT, "training curves")
    return rep


def _setup(rep: Report, cfg: dict[str, Any]) -> None:
    L, steps = cfg["train_length"], cfg["steps"]
    rep.block(
        "Ball-tracking word problems (`fullband.tasks.word_problems`): a ball under one of 5 cups, n steps that each "
        "move the cups by a generator of the group (S5: the 10 transpositions; A5: the 20 three-cycles), answer = the "
        "ball's cup. One token per step and no step names, so a longer problem differs from a shorter one in length "
        f"only: every test token occurs in training. Training problems have {L} steps with the cup after every step "
        f"as a label, so the trained lengths are 1..{L}; the test problems ({cfg['test_problems']} per group, the "
        f"same for every arm and seed) have {max(cfg['test_lengths'])} steps and every prefix is scored as a problem "
        "of its length (argmax over the cups). Answer-only: no model writes intermediate states.",
    )
    rep.block(
        "Every arm gets the same selection budget on seed 0: its knob x learning rates "
        f"{', '.join(f'{lr:g}' for lr in cfg['learning_rates'])} x {{{steps}, {2 * steps}}} steps (AdamW, batch "
        f"{cfg['batch_size']}, warmup {cfg['warmup_fraction']:g}, WSD cool-down over the last "
        f"{cfg['cooldown_fraction']:g}; the {steps}-step model is a cool-down branched off the {2 * steps}-step run), "
        f"chosen by mean validation accuracy on {cfg['validation_problems']} held-out problems of the trained "
        "lengths (then validation loss, then fewer steps). The chosen setting then trains on seeds "
        f"1..{cfg['seeds'] - 1} (training data and initial weights both seeded). Arms:",
    )
    rep.block(
        f"- **baseline**: a {cfg['n_layers']}-block transformer, d_model {cfg['d_model']}, one pass (knob: weight "
        "decay);",
        "- **equal-FLOPs transformer**: a plain transformer whose training FLOPs per step equal the full-bandwidth "
        "model's (knob: deeper at the same width, or wider at the same depth);",
        "- **looped (input injection)**: the baseline's blocks applied k = c x n times at every position, the token "
        "embedding added to the state at every loop (Fan et al. 2024), the same rule in training and answering, "
        "gradients through every loop (knob: c);",
        "- **RNN (reference)**: a one-layer GRU or LSTM with the full-bandwidth model's parameter count (knob: the "
        "cell): the known ceiling on word problems, reported apart, not a control to beat;",
        f"- **full-bandwidth exact**: the full-bandwidth model trained on its exact recurrence (every pass up to the "
        f"exact count, gradients through pass 1 and the last {cfg['grad_passes']}, fusion LR "
        f"x{cfg['fusion_lr_mult']:g}), answering with exact (fully recurrent) prefill; its standard-mode answers "
        "(no feedback) are shown beside "
        "(knob: lambda, the feedback passes' loss weight);",
        "- **shift-0 ablation** (not a control, not tuned): the same pass loop with feedback_shift 0 (pass k fuses a "
        "position's own state), the full-bandwidth model's chosen setting, its training's pass count at every "
        "length.",
    )
    rep.block(
        f"Statistics: the seed is the unit. A control that stays more than {FIT_TOLERANCE} below the baseline at a "
        f"trained length on a seed failed to train there and is listed so. Solved = >= {KEEP} at every trained "
        f"length. The margin at length n is full-bandwidth exact minus that seed's best control (baseline, "
        "equal-FLOPs, looped), paired over seeds with a Student t 95% interval. Floors: the most common answer of "
        f"each length in the test set, the start cup, and tracking the first {L} steps only. FLOPs as "
        "`fullband.experiments.core.flops` counts them (2 per multiply-add, causal attention, 3x for a pass with "
        "gradients).",
    )


def _group_section(rep: Report, group: str, data: dict[str, Any], cfg: dict[str, Any]) -> None:
    rep.section(GROUP_TITLES.get(group, group))
    _chosen_tables(rep, data, data["floors"], cfg)
    tests, cells = cfg["test_lengths"], data["cells"]
    second = data.get("extrapolation")
    rep.section("Tuning grid (seed 0)", level=3).paragraph(
        "Chosen by validation on the trained lengths only; the test columns are shown for transparency and played "
        "no part in the choice. ✓ = chosen." + (" 2 = chosen by the second selection, on its `unseen (selection)` "
                                                "score." if second else ""))
    rows = []
    knob_names = data["knob_names"]
    for point in sorted(data["grid"], key=lambda p: (list(cells).index(p["arm"]), selection_key(p))):
        marks = [mark for mark, chosen in (("✓", data["chosen"]), ("2", second and second["chosen"]))
                 if chosen and same_setting(point, chosen[point["arm"]])]
        unseen = [f"{point['extrapolation']:.2f}"] if second else []
        rows.append([arm_title(point["arm"]), f"{knob_names[point['arm']]} {point['knob']}", f"{point['lr']:g}",
                     point["steps"], f"{point['validation_accuracy']:.3f}", f"{point['validation_loss']:.4f}",
                     *unseen, *[f"{point['test'][str(n)]:.2f}" for n in tests], " ".join(marks)])
    rep.table(["arm", "knob", "lr", "steps", "validation accuracy", "validation loss",
               *([f"unseen (selection), n={cfg['train_length'] + 1}..{second['length']}"] if second else []),
               *[f"test n={n}" for n in tests], ""], rows)
    rep.section("Best of the grid with hindsight (seed 0)", level=3).paragraph(
        "Each arm's highest test accuracy over its whole grid at each unseen length, the setting picked on the test "
        "problems themselves: not a fair selection but an upper bound on what the arm's grid gave on seed 0, so a "
        "reader can see whether a control would have matched with other settings.")
    rows = []
    for arm in cells:
        points = [point for point in data["grid"] if point["arm"] == arm]
        if points:
            rows.append([arm_title(arm), *[f"{max(point['test'][str(n)] for point in points):.2f}" for n in tests]])
    rep.table(["arm", *[f"n={n}" for n in tests]], rows)


def _header(cfg: dict[str, Any]) -> tuple[list[int], list[str]]:
    """The lengths of the accuracy tables (every trained one, then the unseen test lengths) and their headers."""
    L, tests = cfg["train_length"], cfg["test_lengths"]
    lengths = [*range(1, L + 1), *tests]
    return lengths, [f"n={n}" + ("*" if n > L else "") for n in lengths]


def _chosen_tables(rep: Report, data: dict[str, Any], floors: dict[str, list[float]], cfg: dict[str, Any]) -> None:
    """The tables of one selection's chosen settings: costs, accuracy by length, longest n kept, paired margins,
    every seed's cells."""
    tests = cfg["test_lengths"]
    lengths, header = _header(cfg)
    cells, a, costs = data["cells"], data["analysis"], data["costs"]
    base_flops = costs[BASELINE]["training_flops"]
    rep.section("Chosen settings and costs", level=3)
    rows = []
    for arm, c in costs.items():
        seconds = [curve["seconds"] for curve in data["curves"][arm].values()]
        rows.append([arm_title(arm), c["describe"], f"{c['parameters']:,}", f"{c['lr']:g}", c["steps"],
                     f"{c['training_flops']:.3g}", f"{c['training_flops'] / base_flops:.1f}x",
                     f"{c['inference_flops'][str(max(tests))]:.3g}", f"{_mean(seconds):.0f}"])
    rep.table(["arm", "chosen model", "parameters", "lr", "steps", "training FLOPs", "x baseline",
               f"inference FLOPs (n = {max(tests)})", "training s (mean)"], rows)
    rep.section("Accuracy by length: mean over seeds (worst seed)", level=3)
    rows = []
    for arm, seeds in cells.items():
        rows.append([arm_title(arm), *[_mean_worst([s["test"][n - 1] for s in seeds.values()]) for n in lengths]])
        if "standard" in next(iter(seeds.values())):
            rows.append([f"{arm_title(arm)}, decoded standard", *[
                _mean_worst([s["standard"][n - 1] for s in seeds.values()]) for n in lengths]])
    for name, values in floors.items():
        rows.append([f"floor: {name}", *[f"{values[n - 1]:.2f}" for n in lengths]])
    rep.table(["arm", *header], rows,
              f"\\* never trained on. Uniform chance is 0.20. Test problems: {cfg['test_problems']} per length.")
    rep.section("Longest length kept at >= 0.9, solved seeds, failed-to-train seeds", level=3)
    rows = []
    for arm in cells:
        info = a["arms"][arm]
        kept = info["longest_kept"]
        rows.append([arm_title(arm), ", ".join(str(v) for v in kept.values()), f"{statistics.median(kept.values()):g}",
                     f"{len(info['solved'])}/{len(kept)}", ", ".join(info["failed_to_train"]) or "none"])
    rep.table(["arm", "longest n per seed", "median", "solved the trained lengths", "failed to train (seeds)"], rows)
    rep.section("Paired margins per seed", level=3).paragraph(
        "Full-bandwidth exact minus each seed's best control (baseline, equal-FLOPs, looped), and minus the RNN.")
    rows = []
    for n in tests:
        m, r = a["margins"][str(n)], a["reference_margins"].get(str(n))
        rows.append([n, " ".join(_signed(v) for v in m["per_seed"].values()),
                     f"{_signed(m['mean'])} [{_signed(m['low'])}, {_signed(m['high'])}]",
                     ", ".join(arm_title(b) for b in m["best_control"].values()),
                     f"{_signed(r['mean'])} [{_signed(r['low'])}, {_signed(r['high'])}]" if r else "-"])
    rep.table(["n", "margin per seed", "mean [t 95%]", "best control per seed", "minus the RNN: mean [t 95%]"], rows)
    rep.section("Every seed", level=3)
    rows = [[arm_title(arm), seed, *[f"{cell['test'][n - 1]:.2f}" for n in lengths]]
            for arm, seeds in cells.items() for seed, cell in seeds.items()]
    rep.table(["arm", "seed", *header], rows)


def _second_selection(rep: Report, results: dict[str, Any], plots: bool) -> None:
    cfg = results["config"]
    length = cfg["extrapolation_length"]
    which = (f"Lengths up to {length} took part in the choice (on other problems); the longer ones did not."
             if max(cfg["test_lengths"]) > length
             else "Every test length took part in the choice (on other problems, with seed 0's models).")
    rep.section("Second selection: on unseen lengths (a follow-up)").paragraph(
        "Added after the committed study's seed-0 grid showed that validation on the trained lengths cannot tell the "
        "settings that extrapolate from those that do not: nearly every setting of the recurrent arms is at 1.000 "
        "there, and the tie-break picks the hotter runs. Here every arm, controls included, keeps the grid point "
        f"(seed 0) with the highest mean accuracy at the unseen lengths {cfg['train_length'] + 1}..{length} on "
        f"{cfg['validation_problems']} selection problems of their own (not the test problems; the grid tables "
        "show this score as `unseen (selection)`), the most favourable rule for an arm that can extrapolate at all. "
        f"That setting then trains on seeds 1..{cfg['seeds']}, none of which took part in the choice; seed 0, whose "
        f"models were chosen this way, is left out of these tables. {which}")
    if plots:
        rep.figure(EXTRAPOLATION_PLOT, "accuracy vs length, second selection")
    for group, data in results["groups"].items():
        if "extrapolation" in data:
            rep.section(f"{GROUP_TITLES.get(group, group)}, second selection", level=2)
            _chosen_tables(rep, data["extrapolation"], data["floors"], cfg)


def _cpu_spread(rep: Report, spread: dict[str, Any]) -> None:
    env = " ".join(f"{k}={v}" for k, v in spread["environment"].items())
    rep.section("Across CPU kinds").paragraph(
        f"Seed {spread['seed']}'s runs at the first selection's chosen settings trained again on the same machine with "
        f"`{env}` (the kernels of a CPU without AVX-512; `python -m fullband.experiments.word_problems.cpu_spread`). "
        "The vector width can change the order of float sums, which training can amplify: the spread to expect "
        "between CPU kinds. Cells identical = the same accuracy at every length.")
    rows = [[group, arm_title(arm), f"{d['max_weight_difference']:.2g}", "yes" if d["identical"] else "no",
             f"{d['max_abs_difference']:.3f}",
             f"{d['mean_abs_difference']:.4f}", f"{d['longest_kept'][0]} / {d['longest_kept'][1]}"]
            for group, arms in spread["groups"].items() for arm, d in arms.items()]
    rep.table(["group", "arm", "largest weight difference", "cells identical",
               "max abs. accuracy difference (any length)", "mean abs. difference", "longest n kept, native / AVX2"],
              rows)


def _mean_worst(values: list[float]) -> str:
    return f"{_mean(values):.2f} ({min(values):.2f})"


def plot_accuracy(results: dict[str, Any], out_dir: Path, second: bool = False) -> None:
    """Accuracy against length (log axis), mean over seeds with the seeds' range shaded, one panel per group (of the
    second selection's runs with ``second``)."""
    plt = pyplot()
    groups = results["groups"]
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (group, data) in zip(axes[0], groups.items(), strict=True):
        for arm, seeds in (data["extrapolation"] if second else data)["cells"].items():
            curves = [s["test"] for s in seeds.values()]
            n = list(range(1, len(curves[0]) + 1))
            mean = [statistics.fmean(c[i] for c in curves) for i in range(len(n))]
            line, = ax.plot(n, mean, label=arm_title(arm), linewidth=2.5 if arm == MODEL else 1.5,
                            linestyle="--" if arm in (REFERENCE, "shift0") else "-")
            ax.fill_between(n, [min(c[i] for c in curves) for i in range(len(n))],
                            [max(c[i] for c in curves) for i in range(len(n))], color=line.get_color(), alpha=0.15)
        ax.plot(n, data["floors"]["majority"], color="grey", linestyle=":", label="floor: most common answer")
        ax.axvline(results["config"]["train_length"], color="black", linewidth=0.8)
        ax.axhline(KEEP, color="black", linewidth=0.5, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("problem length n (steps; the vertical line is the longest trained)")
        ax.set_ylabel("answer accuracy (mean over seeds, range shaded)")
        ax.set_title(GROUP_TITLES.get(group, group) + (", second selection" if second else ""))
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    save_figure(fig, out_dir / (EXTRAPOLATION_PLOT if second else ACCURACY_PLOT))


def plot_curves(results: dict[str, Any], out_dir: Path) -> None:
    """Validation accuracy against steps of every seed's chosen run, one panel per group and arm."""
    plt = pyplot()
    groups = results["groups"]
    arms = list(next(iter(groups.values()))["curves"])
    fig, axes = plt.subplots(len(groups), len(arms), figsize=(2.6 * len(arms), 2.4 * len(groups)), squeeze=False,
                             sharey=True)
    for row, (group, data) in zip(axes, groups.items(), strict=True):
        for ax, arm in zip(row, arms, strict=True):
            for seed, curve in data["curves"][arm].items():
                ax.plot(curve["step"], curve["validation_accuracy"], linewidth=1, label=f"seed {seed}")
            ax.set_title(f"{group}: {arm_title(arm)}", fontsize=8)
            ax.set_ylim(0, 1.02)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    save_figure(fig, out_dir / CURVES_PLOT)
