"""How much the cells of ``fullband eval-controls`` move on another CPU kind: retrain one seed's chosen runs with
PyTorch, MKL and oneDNN restricted to AVX2 (what a CPU without AVX-512 runs) and compare them with the study's.

    python -m fullband.experiments.word_problems.cpu_spread --out_dir runs/controls --seed 1 [--arms fullband,looped]

Why they move at all: the vector width decides the order in which floats are summed (matmul blocking, reductions),
so the last bits of every step differ between kernels, and thousands of steps of training amplify them; a run is
bit-identical only on the same kernels (the same CPU kind and thread count). The retrained runs go to
out_dir/cpu-spread/ (resumable like the study's) and the comparison to out_dir/cpu_spread.json, which the study's
report shows when it is there (rerun the study with ``--resume true`` to re-render it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fullband import rundir
from fullband.files import write_json

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
SPREAD_FILE = "cpu_spread.json"
SPREAD_DIR = "cpu-spread"
MODULE = "fullband.experiments.word_problems.cpu_spread"


def chosen_specs(results: dict[str, Any], seed: int, arms: list[str] | None = None) -> list[dict[str, Any]]:
    """The run of every arm and ablation (or those of ``arms``) of every group on ``seed`` at its chosen setting."""
    specs = []
    for group, data in results["groups"].items():
        for arm, cost in data["costs"].items():
            if arms and arm not in arms:
                continue
            specs.append({"group": group, "arm": arm, "knob": cost["knob"], "lr": cost["lr"], "seed": seed,
                          "stops": [cost["steps"]]})
    return specs


def weight_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two safetensors files' tensors (0.0: bit-identical)."""
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def compare(results: dict[str, Any], replicas: list[dict[str, Any]], seed: int, out_dir: Path) -> dict[str, Any]:
    """Per group and arm: the study's weights and test accuracy by length against the replica's (the largest weight
    difference; the largest and mean absolute accuracy difference over the lengths; the longest length kept at
    >= 0.9 in each)."""
    from fullband.experiments.word_problems.analysis import longest_kept
    from fullband.experiments.word_problems.train import RunSpec

    out: dict[str, Any] = {"seed": seed, "environment": AVX2_ONLY, "groups": {}}
    for replica in replicas:
        run = RunSpec(replica["group"], replica["arm"], replica["knob"], replica["lr"], seed, tuple(replica["stops"]))
        weights = f"model-{run.stops[-1]}.safetensors"
        group, arm = replica["group"], replica["arm"]
        native = results["groups"][group]["cells"][arm][str(seed)]["test"]
        other = replica["checkpoints"][str(replica["stops"][-1])]["test"]["accuracy"]
        diffs = [abs(a - b) for a, b in zip(native, other, strict=True)]
        out["groups"].setdefault(group, {})[arm] = {
            "max_weight_difference": weight_difference(run.directory(out_dir) / weights,
                                                       run.directory(out_dir / SPREAD_DIR) / weights),
            "max_abs_difference": max(diffs), "mean_abs_difference": sum(diffs) / len(diffs),
            "longest_kept": [longest_kept(native), longest_kept(other)], "identical": native == other}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", required=True, help="A finished eval-controls study.")
    parser.add_argument("--seed", type=int, default=1, help="The seed (>= 1: one trained at its chosen setting "
                        "alone) whose chosen runs are retrained.")
    parser.add_argument("--arms", default="", help="Comma-separated arms and ablations to retrain (default: all; "
                        "a subset keeps a sitting short, e.g. fullband,looped,rnn).")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    results = json.loads((out_dir / rundir.RESULTS).read_text())
    arms = [a for a in args.arms.split(",") if a]
    known = {arm for data in results["groups"].values() for arm in data["costs"]}
    if unknown := sorted(set(arms) - known):
        parser.error(f"--arms: {', '.join(unknown)} not in this study (its arms: {', '.join(sorted(known))})")
    specs = chosen_specs(results, args.seed, arms)
    if args.seed < 1:
        parser.error("--seed must be >= 1 (seed 0's chosen runs are tuning runs, scored at two step counts)")
    if args.child:  # in the AVX2-only environment: train the runs, each with the threads the study's run had
        import torch

        from fullband.config import explicit_keys
        from fullband.experiments.word_problems.config import ControlsConfig
        from fullband.experiments.word_problems.train import RunSpec, read_result, train_run

        with explicit_keys(results["config"]):
            cfg = ControlsConfig(**results["config"])
        for spec in specs:
            run = RunSpec(**{**spec, "stops": tuple(spec["stops"])})
            torch.set_num_threads(read_result(run.directory(out_dir))["threads"])
            train_run(cfg, run, str(out_dir / SPREAD_DIR))
        return 0
    env = os.environ | AVX2_ONLY
    subprocess.run([sys.executable, "-m", MODULE, "--out_dir", str(out_dir), "--seed", str(args.seed), "--arms",
                    args.arms, "--child"], env=env, check=True)
    from fullband.experiments.word_problems.train import RunSpec, read_result

    replicas = [read_result(RunSpec(**{**s, "stops": tuple(s["stops"])}).directory(out_dir / SPREAD_DIR))
                for s in specs]
    spread = compare(results, replicas, args.seed, out_dir)
    write_json(out_dir / SPREAD_FILE, spread)
    for group, arms in spread["groups"].items():
        for arm, d in arms.items():
            print(f"{group} {arm}: weights differ by {d['max_weight_difference']:.3g}, accuracy by "
                  f"{d['max_abs_difference']:.3f} (mean {d['mean_abs_difference']:.4f}), longest n kept "
                  f"{d['longest_kept'][0]} -> {d['longest_kept'][1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
