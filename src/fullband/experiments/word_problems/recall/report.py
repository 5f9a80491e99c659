"""report.md and the figure of ``fullband eval-recall``, from results.json alone (torch-free)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fullband.experiments.core.plots import pyplot, save_figure
from fullband.experiments.core.report import Report
from fullband.experiments.word_problems.analysis import FIT_TOLERANCE, KEEP
from fullband.experiments.word_problems.decisive.analysis import MARGIN_TARGET, RULE_COMMIT, TIE
from fullband.experiments.word_problems.recall.analysis import FALSIFIERS, PREDICTIONS, TARGET_K
from fullband.experiments.word_problems.report import GROUP_TITLES

ACCURACY_PLOT = "accuracy_vs_length.png"
TITLES = {"baseline": "transformer (1 pass)", "looped": "looped", "rnn": "LSTM (parameters)",
          "wide_lstm": "LSTM (training FLOPs)", "hybrid": "attention then LSTM", "fullband": "full-bandwidth exact",
          "fullband_paper": "full-bandwidth, paper schedule"}


def title_of(arm: str) -> str:
    return TITLES.get(arm, arm)


def _signed(value: float) -> str:
    return f"{value:+.2f}"


def verdict(results: dict[str, Any]) -> list[str]:
    if results["config"]["preset"] == "smoke":
        return ["- The smoke preset checks the plumbing (every arm trains a few steps and is scored): it gives no "
                "verdict."]
    lines = []
    for group, data in results["groups"].items():
        target = data["analysis"]["target"]
        text = f"- **{GROUP_TITLES.get(group, group)}: target {'met' if target['met'] else 'not met'}.**"
        if "margin" in target:
            m = target["margin"]
            text += (f" At K = {target['K']} the {title_of(target['model'])} arm keeps a mean >= {KEEP} to n = "
                     f"{target['n']}, where it leads each seed's best other arm by {_signed(m['mean'])} "
                     f"[{_signed(m['low'])}, {_signed(m['high'])}] (target {_signed(MARGIN_TARGET)}, interval "
                     "above 0).")
        else:
            text += f" No full-bandwidth arm keeps a mean >= {KEEP} at any tested unseen length at K = {target['K']}."
        if "paper_keeps_half" in target:
            text += (" The paper-schedule arm keeps at least half the exact-trained arm's median longest n: "
                     f"{'yes' if target['paper_keeps_half'] else 'no'}.")
        lines.append(text)
    return lines


def report(results: dict[str, Any], plots: bool) -> Report:
    cfg = results["config"]
    rep = Report.of(results, "Lookup then compose: attention and full-depth recurrence together, S5 and A5",
                    results["command"], f" (fresh seeds {', '.join(map(str, cfg['fresh_seeds']))})",
                    compact_tables=True)
    rep.section("Verdict").block(*verdict(results))
    rep.section("Predictions, written before the runs").block(*[f"- {p}" for p in PREDICTIONS])
    rep.paragraph("What would falsify the full-bandwidth claim: " + " ".join(FALSIFIERS))
    _setup(rep, cfg)
    if plots:
        rep.figure(ACCURACY_PLOT, "accuracy vs length at K = 32")
    for group, data in results["groups"].items():
        _group(rep, group, data, cfg)
    return rep


def _setup(rep: Report, cfg: dict[str, Any]) -> None:
    L = cfg["train_length"]
    rep.section("Setup").block(
        "Lookup-then-compose word problems (`fullband.tasks.lookup_problems`): a table of K bindings `name move`, "
        "fresh per problem (names from a pool of 64, unique within a problem; moves: the group's generators), a "
        "separator, the start cup, then n names from the table; the label after each name is the ball's cup after "
        "that name's move. Every test token occurs in training. A uniform guess scores 0.20; the floors (answers "
        "that need no model: the most common answer, the start cup, a tracker of the first trained-length steps) are "
        "in the tables, and the start cup scores more than a guess where a move often leaves the ball's cup alone "
        "(lookup-only, and the full task at n = 1). Training: K uniform in "
        f"1..{cfg['train_tables']} per batch, n = {L} (every prefix a problem: trained lengths 1..{L}). Tests: "
        f"{cfg['test_problems']} problems of {max(cfg['test_lengths'])} steps at each K of "
        f"{', '.join(map(str, cfg['test_tables']))}. Diagnostics with the full task's chosen settings: compose-only "
        "(no table, one global binding) and lookup-only (the label is the start cup moved by that step's move alone).")
    rep.block(
        f"Rule (DESIGN.md §7, committed in {RULE_COMMIT or 'the decisive study'} before its runs, applied as there): "
        f"each arm's fair setting is its tuning-seed grid point with the best mean validation accuracy on the trained "
        f"lengths (validation tables {', '.join(map(str, cfg['validation_tables']))}), ties within {TIE} to the lower "
        "learning rate, then fewer steps, then lower validation loss; each control (every arm but the two "
        f"full-bandwidth ones) also gets its hindsight setting, the longest n kept on the tuning seed's test problems "
        f"at K = {TARGET_K}. The full-bandwidth arms keep the table and the start cup plain (feedback on the steps "
        "only), so their pass count is set by n, not K; both answer with exact prefill.")


def _kept_text(kept: dict[str, Any] | None) -> str:
    return f"{statistics.median(kept.values()):g} ({', '.join(str(v) for v in kept.values())})" if kept else "-"


def _group(rep: Report, group: str, data: dict[str, Any], cfg: dict[str, Any]) -> None:
    a = data["analysis"]
    tables = [str(K) for K in cfg["test_tables"]]
    rep.section(GROUP_TITLES.get(group, group))
    rep.section("Chosen settings and costs", level=3)
    base = data["costs"]["fair"].get("baseline", next(iter(data["costs"]["fair"].values())))["training_flops"]
    K_cost = str(TARGET_K) if TARGET_K in cfg["test_tables"] else tables[-1]
    longest = max(cfg["test_lengths"])
    rows = [[title_of(arm), setting, c["describe"], f"{c['parameters']:,}", f"{c['lr']:g}", c["steps"],
             f"{c['training_flops']:.3g}", f"{c['training_flops'] / base:.1f}x",
             f"{c['inference_flops'][f'K{K_cost} n{longest}']:.3g}", f"{c['training_seconds']:.0f}",
             f"{c['scoring_seconds']:.0f}", "; ".join(c["processors"])]
            for setting in ("fair", "hindsight") for arm, c in data["costs"][setting].items()]
    rep.table(["arm", "setting", "model", "parameters", "lr", "steps", "training FLOPs", "x transformer",
               f"inference FLOPs (K = {K_cost}, n = {longest})", "training s per run", "scoring s per run", "CPU"],
              rows)
    rep.section(f"Longest n kept at >= {KEEP} by table size: median (per seed)", level=3)
    rows = []
    for setting in ("fair", "hindsight"):
        kept = a["kept"][setting]
        for arm in data["chosen"] if setting == "fair" else data["hindsight"]:
            failed = a.get("failed_to_train", {}).get(setting, {}).get(arm, [])
            rows.append([title_of(arm), setting, *[_kept_text(kept.get(K, {}).get(arm)) for K in tables],
                         ", ".join(failed) or "none"])
    rows += _floor_rows(data["floors"], tables, extra=("",))
    rep.table(["arm", "setting", *[f"K = {K}" for K in tables], "failed to train (seeds)"], rows,
              f"Failed to train: more than {FIT_TOLERANCE} below the 1-pass transformer at a trained length "
              f"(validation, K = {', '.join(map(str, cfg['validation_tables']))}), on the fresh seeds.")
    target = a["target"]
    if "margin" in target:
        m = target["margin"]
        rows = [[seed, _signed(v), m["best_rival"][seed]] for seed, v in m["per_seed"].items()]
        rep.section(f"The lead at K = {target['K']}, n = {target['n']}", level=3)
        rep.table(["seed", "margin", "best other arm"], rows,
                  f"Mean {_signed(m['mean'])} [{_signed(m['low'])}, {_signed(m['high'])}] (t 95%).")
    for variant, part in data.get("variants", {}).items():
        rep.section(f"Diagnostic: {variant}-only, longest n kept (median, per seed)", level=3)
        rows = [[title_of(arm), *[_kept_text(_kept_of(part["cells"].get(K, {}).get(arm))) for K in tables]]
                for arm in data["chosen"]]
        rows += [row[:1] + row[2:] for row in _floor_rows(part["floors"], tables)]
        note = ("Compose-only problems have no table: each K column is its own test set (seeded by K) drawn from one "
                "distribution, so the columns are replicates." if variant == "compose" else "")
        rep.table(["arm", *[f"K = {K}" for K in tables]], rows, note)
    lengths = [*range(1, cfg["train_length"] + 1), *cfg["test_lengths"]]
    rep.section(f"Accuracy by length at K = {TARGET_K}: mean over the fresh seeds (worst seed)", level=3)
    rows = []
    for arm, cells in data["cells"].get(str(TARGET_K), {}).items():
        rows.append([title_of(arm), *[f"{statistics.fmean(c['test'][n - 1] for c in cells.values()):.2f} "
                                      f"({min(c['test'][n - 1] for c in cells.values()):.2f})" for n in lengths]])
    for name, values in data["floors"].get(str(TARGET_K), {}).items():
        rows.append([f"floor: {name}", *[f"{values[n - 1]:.2f}" for n in lengths]])
    rep.table(["arm", *[f"n={n}" + ("*" if n > cfg["train_length"] else "") for n in lengths]], rows,
              "\\* never trained on.")
    rep.section(f"Tuning grid (seed {cfg['tuning_seed']})", level=3).paragraph(
        "F = fair setting; H = hindsight setting. Test columns: accuracy at n = 12 for each K.")
    rows = []
    for p in data["grid"]:
        marks = [mark for mark, chosen in (("F", data["chosen"]), ("H", data["hindsight"]))
                 if p["arm"] in chosen and all(p[k] == chosen[p["arm"]][k] for k in ("variant", "knob", "lr", "steps"))]
        n = min(12, max(cfg["test_lengths"]))
        rows.append([title_of(p["arm"]), p["describe"], f"{p['lr']:g}", p["steps"], f"{p['validation_accuracy']:.3f}",
                     f"{p['validation_loss']:.4f}", *[f"{p['tests'][f'test_K{K}'][n - 1]:.2f}" for K in tables],
                     " ".join(marks)])
    rep.table(["arm", "setting", "lr", "steps", "validation accuracy", "validation loss",
               *[f"K={K}" for K in tables], ""], rows)


def _floor_rows(floors: dict[str, dict[str, list[float]]], tables: list[str],
                extra: tuple[str, ...] = ()) -> list[list[str]]:
    """The floors' longest n kept by table size, as rows beside the arms' (arm, setting, K columns, *extra)."""
    from fullband.experiments.word_problems.analysis import longest_kept

    names = next(iter(floors.values()), {})
    return [[f"floor: {name}", "", *[str(longest_kept(floors[K][name])) if K in floors else "-" for K in tables],
             *extra] for name in names]


def _kept_of(cells: dict[str, Any] | None) -> dict[str, int] | None:
    from fullband.experiments.word_problems.analysis import longest_kept

    return {seed: longest_kept(c["test"]) for seed, c in cells.items()} if cells else None


def plot_accuracy(results: dict[str, Any], out_dir: Path) -> None:
    """Accuracy against length at K = 32 on the fresh seeds (mean, the seeds' range shaded), one panel per group."""
    plt = pyplot()
    groups = results["groups"]
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (group, data) in zip(axes[0], groups.items(), strict=True):
        K = str(TARGET_K) if str(TARGET_K) in data["cells"] else max(data["cells"], key=int)
        for arm, seeds in data["cells"][K].items():
            curves = [s["test"] for s in seeds.values()]
            n = list(range(1, len(curves[0]) + 1))
            mean = [statistics.fmean(c[i] for c in curves) for i in range(len(n))]
            line, = ax.plot(n, mean, label=title_of(arm), linewidth=2.5 if arm.startswith("fullband") else 1.5)
            ax.fill_between(n, [min(c[i] for c in curves) for i in range(len(n))],
                            [max(c[i] for c in curves) for i in range(len(n))], color=line.get_color(), alpha=0.15)
        ax.axvline(results["config"]["train_length"], color="black", linewidth=0.8)
        ax.axhline(KEEP, color="black", linewidth=0.5, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("steps n (the vertical line is the longest trained)")
        ax.set_ylabel(f"accuracy at K = {K} (fresh seeds: mean, range shaded)")
        ax.set_title(GROUP_TITLES.get(group, group))
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    save_figure(fig, out_dir / ACCURACY_PLOT)
