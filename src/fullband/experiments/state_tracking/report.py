"""The report of ``fullband eval-state``: tables, report.md and the probe plot, from results.json alone."""

from __future__ import annotations

from pathlib import Path

from fullband.experiments.core.pair import training_table
from fullband.experiments.core.plots import line_style, pyplot, save_figure
from fullband.experiments.core.report import Report, Table, markdown_table
from fullband.experiments.state_tracking.records import StateTrackingResults

PLOT = "probe_accuracy_vs_depth.png"


def tables(results: StateTrackingResults) -> dict[str, Table]:
    """The tables (headers, rows): training, probe accuracy per depth (one per task), answer accuracy."""
    cells = results["cells"]
    depths = len(cells[0]["probe_accuracy"])
    out = {"training": training_table(results["training"])}
    for task in dict.fromkeys(c["task"] for c in cells):
        rows = [[c["variant"], f"{c['chance']:.2f}", *(f"{a:.2f}" for a in c["probe_accuracy"])]
                for c in cells if c["task"] == task]
        out[f"probe_{task}"] = (["model / prefill", "chance", *[f"depth {d}" for d in range(depths)]], rows)
    answer_rows = [[v] + [next(f"{c['answer_accuracy']:.2f}" for c in cells if c["variant"] == v and c["task"] == t)
                          for t in dict.fromkeys(c["task"] for c in cells)] for v in results["variants"]]
    out["answer"] = (["model / prefill", *dict.fromkeys(c["task"] for c in cells)], answer_rows)
    return out


def report(results: StateTrackingResults, plots: bool = True) -> Report:
    """report.md: setup, training, probe accuracy per depth and task, the model's own answer accuracy."""
    cfg, t = results["config"], tables(results)
    rep = Report.of(results, "State tracking at the input layer (paper Figure 7)", results["command"],
                    compact_tables=True)
    rep.paragraph(f"""\
**Setup.** Tasks {', '.join(cfg['tasks'])} (see fullband.tasks.state_tracking), {cfg['seq_len']}
tokens each, all ending on the shared final token `?`; the model is trained to answer after it
({cfg['train_per_task']} sequences per task, prompt masked). Both models: d_model={cfg['d_model']},
{cfg['n_layers']} layers, {cfg['n_heads']} heads, {cfg['steps']} steps of batch {cfg['batch_size']} on the same
batches; the full-bandwidth model trains multi-pass (pass mix {list(cfg['pass_mix'])}) after
{cfg['feedback_start']:.0%} of the steps. Probes: closed-form ridge (penalty {cfg['ridge']} x N) on the
standardised residual stream at the final token, fit on {cfg['probe_train']} fresh sequences per task and scored
on {cfg['probe_test']} others; depth 0 = the input layer (embedding, or fused input), depth d = output of block d.
Prefills: standard = one plain pass; one-step = two passes, positions after the first fused; exact = the fully
recurrent states. The baseline has no feedback, so its prefills coincide (reported once). Chance = the test
accuracy of always answering the fit set's majority class (what a probe on a constant feature scores).""")
    rep.section("Training").table(*t["training"])
    rep.section("Probe accuracy at the final token, per depth")
    for task in cfg["tasks"]:
        rep.section(task, level=3).table(*t[f"probe_{task}"])
    rep.section("The model's own answer accuracy (next token at `?`)").table(*t["answer"])
    return rep.figure(PLOT, "probe accuracy vs depth", plots)


def summary(results: StateTrackingResults) -> str:
    """The terminal summary: every table."""
    return "\n".join(f"\n{name}:\n{markdown_table(*table)}" for name, table in tables(results).items())


def plot_probes(results: StateTrackingResults, path: Path) -> None:
    """Probe accuracy vs depth, one panel per task, one line per model/prefill, chance dashed."""
    plt = pyplot()
    cells = results["cells"]
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False, sharey=True)
    for ax, task in zip(axes[0], tasks, strict=True):
        here = [c for c in cells if c["task"] == task]
        for c in here:
            ax.plot(range(len(c["probe_accuracy"])), c["probe_accuracy"], marker="o", label=c["variant"],
                    **line_style(c["variant"]))
        ax.axhline(here[0]["chance"], color="gray", linestyle="--", linewidth=1, label="chance")
        ax.set_title(task)
        ax.set_xlabel("depth (0 = input layer)")
        ax.set_xticks(range(len(here[0]["probe_accuracy"])))
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("probe accuracy at the final token")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path, dpi=110)
