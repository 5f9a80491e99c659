"""A first look at recurrence spans on the S5 word problems (issue 53): the full-bandwidth arm of ``fullband
eval-controls`` trained once per span at one seed, short, through the study's own training loop
(:func:`fullband.experiments.word_problems.train.train_run`), and scored at the trained lengths and beyond. Not a
claim: one seed, a few hundred steps.

Spans (4 blocks): full bandwidth (top -> embedding), T2MLR-style (block 3 -> the stream after block 1), LRT-style (a
middle block -> the embedding), each with the FLOPs of one Jacobi pass relative to the full-bandwidth model's
(:mod:`fullband.experiments.core.flops`: a pass re-runs only the blocks above the target).

    python benchmarks/span_sweep_s5.py --out_dir /tmp/span-s5 [--steps 300] [--seed 0] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fullband.config import ModelConfig
from fullband.experiments.core.flops import Shape, forward_flops
from fullband.experiments.word_problems.config import ControlsConfig
from fullband.experiments.word_problems.train import RunSpec, train_run

SPANS = {"full bandwidth (top -> 0)": ("residual", 0), "T2MLR-style (layer:3 -> 1)": ("layer:3", 1),
         "LRT-style (layer:2 -> 0)": ("layer:2", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, (source, target) in SPANS.items():
        cfg = ControlsConfig(groups=("s5",), train_length=6, test_lengths=(12, 24), steps=args.steps, batch_size=32,
                             d_model=32, n_layers=4, n_heads=2, grad_passes=8, feedback_weights=(0.3,),
                             validation_problems=200, test_problems=200, eval_every=args.steps, seeds=1,
                             extrapolation_length=0, learning_rates=(args.lr,), feedback_source=source,
                             feedback_target=target, device="cpu", progress=False, out_dir=args.out_dir)
        spec = RunSpec("s5", "fullband", 0.3, args.lr, args.seed, (args.steps,))
        start = time.perf_counter()
        result = train_run(cfg, spec, str(Path(args.out_dir) / f"{source}-{target}"))
        seconds = time.perf_counter() - start
        scored = result["checkpoints"][str(args.steps)]
        test = scored["test"]["accuracy"]  # per length 1..24
        shape = Shape.of(ModelConfig(vocab_size=8, d_model=32, n_layers=4, n_heads=2, feedback_source=source,
                                     feedback_target=target))
        full = Shape.of(ModelConfig(vocab_size=8, d_model=32, n_layers=4, n_heads=2))
        pass_cost = forward_flops(shape, 8, True, upper=True) / forward_flops(full, 8, True, upper=True)
        rows.append({"span": name, "validation (n<=6)": sum(scored["validation"]["accuracy"]) / 6,
                     "n=7..12": sum(test[6:12]) / 6, "n=13..24": sum(test[12:24]) / 12,
                     "standard n<=6": sum(scored["validation"]["standard_accuracy"]) / 6,
                     "pass cost": pass_cost, "seconds": seconds})
    print(f"S5 word problems, full-bandwidth arm, 4 blocks x d_model 32, {args.steps} steps, seed {args.seed}, "
          f"lr {args.lr:g}, lambda 0.3, answering with exact prefill")
    print("| span | accuracy n<=6 | n=7..12 | n=13..24 | n<=6 without feedback | Jacobi pass FLOPs vs full | seconds |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['span']} | {r['validation (n<=6)']:.3f} | {r['n=7..12']:.3f} | {r['n=13..24']:.3f} | "
              f"{r['standard n<=6']:.3f} | {r['pass cost']:.2f} | {r['seconds']:.0f} |")
    (Path(args.out_dir) / "span_sweep_s5.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
