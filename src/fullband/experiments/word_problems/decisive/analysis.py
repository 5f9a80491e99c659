"""The rule of ``fullband eval-decisive`` and what it reads off the runs (torch-free, so a report re-renders from
results.json alone). The rule is DESIGN.md §7's, written there and here before any run of the study:

- **Fair setting** (every arm): the grid point (the tuning seed's runs: variant x knob x learning rate x steps) with
  the highest mean validation accuracy over the trained lengths; accuracies within :data:`TIE` of the best count as
  tied, and ties go to the lower learning rate, then fewer steps, then the lower validation loss
  (:func:`fair_choice`).
- **Hindsight setting** (every control, never the full-bandwidth model): the grid point that kept >= :data:`KEEP`
  longest on the tuning seed's *test* problems at lengths up to ``hindsight_length``, then the highest mean test
  accuracy over the unseen ones among them, then the fair rule's order (:func:`hindsight_choice`): an upper bound on
  what the control's grid gives.
- Both settings train on the fresh seeds. A control's **better setting** is the one with the longer median longest n
  kept over the fresh seeds (then the higher mean unseen accuracy up to ``hindsight_length``, then the fair one).
- **Target** (per group, fresh seeds): the full-bandwidth model's median longest n kept is >= :data:`MIN_KEPT` and
  >= :data:`RATIO` x every transformer control's under its better setting; and at n* = the full-bandwidth model's
  median longest n kept (the lower median), its lead over each seed's best control (every control, both settings) is
  >= :data:`MARGIN_TARGET` with the paired t 95% interval above 0.
- **Second training range**: the :data:`strongest <fullband.experiments.word_problems.decisive.config>` controls
  by their better setting's (median longest n kept, mean unseen accuracy) train on the longer range with that setting,
  beside the full-bandwidth model with its fair one; no re-tuning.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from fullband.experiments.word_problems.analysis import FIT_TOLERANCE, longest_kept, t_interval

MODEL = "fullband"
REFERENCE = "rnn"
BASELINE = "baseline"
TIE = 0.002  # validation accuracies this close to the best count as tied
MIN_KEPT = 32  # the target's floor on the full-bandwidth model's median longest n kept
RATIO = 2  # ... and its multiple of every control's
MARGIN_TARGET = 0.3
SETTINGS = ("fair", "hindsight")
# The commit that wrote this rule into DESIGN.md §7 and this module, before any run of the study.
RULE_COMMIT = "5d6fd05"


def controls_of(arms: Sequence[str]) -> list[str]:
    """The arms the model under test must beat: every arm but itself and the reference."""
    return [a for a in arms if a not in (MODEL, REFERENCE)]


def setting_of(point: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a grid point: variant, knob, learning rate, steps."""
    return point.get("variant", ""), point["knob"], point["lr"], point["steps"]


def fair_choice(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The fair setting (module docstring) of an arm's grid points (``validation_accuracy``, ``validation_loss``)."""
    best = max(p["validation_accuracy"] for p in points)
    tied = [p for p in points if best - p["validation_accuracy"] <= TIE + 1e-12]  # 1e-12: float rounding of the mean
    return min(tied, key=lambda p: (p["lr"], p["steps"], p["validation_loss"]))


def unseen_mean(accuracy: Sequence[float], train_length: int, length: int) -> float:
    """Mean accuracy over the unseen lengths train_length+1..length."""
    return statistics.fmean(accuracy[train_length:length])


def hindsight_choice(points: list[dict[str, Any]], train_length: int, length: int) -> dict[str, Any]:
    """The hindsight setting (module docstring): points carry ``test``, accuracy at lengths 1..>= length."""
    return min(points, key=lambda p: (-longest_kept(p["test"][:length]), -unseen_mean(p["test"], train_length, length),
                                      p["lr"], p["steps"], p["validation_loss"]))


def kept_per_seed(cells: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Each seed's longest n kept at >= KEEP (every length 1..n) on its test list."""
    return {seed: longest_kept(cell["test"]) for seed, cell in cells.items()}


def strength(cells: dict[str, dict[str, Any]], train_length: int, length: int) -> tuple[float, float]:
    """How strong an arm's runs on the fresh seeds are: (median longest n kept, mean unseen accuracy up to length)."""
    return (statistics.median(kept_per_seed(cells).values()),
            statistics.fmean(unseen_mean(c["test"], train_length, length) for c in cells.values()))


def better_setting(fair: dict[str, Any], hindsight: dict[str, Any] | None, train_length: int, length: int) -> str:
    """"fair" or "hindsight": the control's better setting on the fresh seeds (ties: fair)."""
    if hindsight is None:
        return "fair"
    return "hindsight" if strength(hindsight, train_length, length) > strength(fair, train_length, length) else "fair"


def strongest_controls(better: dict[str, dict[str, dict[str, Any]]], count: int, train_length: int,
                       length: int) -> list[str]:
    """The ``count`` controls whose better setting is strongest (:func:`strength`), strongest first."""
    return sorted(better, key=lambda arm: strength(better[arm], train_length, length), reverse=True)[:count]


def failed_to_train(cells: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]],
                    train_length: int) -> list[str]:
    """Seeds on which an arm stays more than FIT_TOLERANCE below the baseline at a trained length (validation)."""
    return [seed for seed, cell in cells.items() if any(
        cell["validation"][n] < baseline[seed]["validation"][n] - FIT_TOLERANCE for n in range(train_length))]


def paired_margin(model: dict[str, dict[str, Any]], rivals: dict[str, dict[str, dict[str, Any]]],
                  n: int) -> dict[str, Any]:
    """The model minus each seed's best rival at length n (rivals: name -> seed -> cell), with a t 95% interval."""
    seeds = list(model)
    best = {s: max(rivals, key=lambda r, s=s: rivals[r][s]["test"][n - 1]) for s in seeds}
    margins = [model[s]["test"][n - 1] - rivals[best[s]][s]["test"][n - 1] for s in seeds]
    mean, low, high = t_interval(margins)
    return {"n": n, "per_seed": dict(zip(seeds, margins, strict=True)), "best_rival": best, "mean": mean,
            "low": low, "high": high}


def analyse_group(group: dict[str, Any], arms: Sequence[str], train_length: int, length: int) -> dict[str, Any]:
    """The verdict's numbers for one group: longest n kept per arm and setting, the better settings, the target."""
    fair, hindsight = group["cells"], group["hindsight_cells"]
    controls = [a for a in controls_of(arms) if a in fair]
    out: dict[str, Any] = {"kept": {}, "failed_to_train": {}, "better": {}}
    for setting, cells in (("fair", fair), ("hindsight", hindsight)):
        out["kept"][setting] = {arm: kept_per_seed(c) for arm, c in cells.items()}
        out["failed_to_train"][setting] = {arm: failed_to_train(c, fair[BASELINE], train_length)
                                           for arm, c in cells.items() if arm != BASELINE or setting != "fair"}
    for arm in controls:
        out["better"][arm] = better_setting(fair[arm], hindsight.get(arm), train_length, length)
    medians = {arm: statistics.median(out["kept"][out["better"].get(arm, "fair")][arm].values()) for arm in fair}
    out["median_kept"] = medians
    model_kept = sorted(out["kept"]["fair"][MODEL].values())
    n_star = statistics.median_low(model_kept)
    target: dict[str, Any] = {"model_median": medians[MODEL], "n": n_star,
                              "depth": medians[MODEL] >= MIN_KEPT and all(medians[MODEL] >= RATIO * medians[a]
                                                                          for a in controls)}
    if n_star >= 1:
        rivals = {f"{arm} ({setting})": cells[arm] for setting, cells in (("fair", fair), ("hindsight", hindsight))
                  for arm in controls if arm in cells}
        margin = paired_margin(fair[MODEL], rivals, n_star)
        target["margin"] = margin
        target["lead"] = margin["mean"] >= MARGIN_TARGET and margin["low"] > 0
        if REFERENCE in fair:
            target["reference_margin"] = paired_margin(fair[MODEL], {REFERENCE: fair[REFERENCE]}, n_star)
    else:
        target["lead"] = False
    target["met"] = target["depth"] and target["lead"]
    out["target"] = target
    return out


def analyse_range(part: dict[str, Any]) -> dict[str, Any]:
    """The second training range: longest n kept per arm and seed, and the model's margin at its median kept n."""
    cells = part["cells"]
    kept = {arm: kept_per_seed(c) for arm, c in cells.items()}
    n_star = statistics.median_low(sorted(kept[MODEL].values()))
    out: dict[str, Any] = {"kept": kept, "median_kept": {arm: statistics.median(k.values()) for arm, k in kept.items()},
                           "n": n_star}
    rivals = {arm: c for arm, c in cells.items() if arm != MODEL}
    if n_star >= 1 and rivals:
        out["margin"] = paired_margin(cells[MODEL], rivals, n_star)
    return out
