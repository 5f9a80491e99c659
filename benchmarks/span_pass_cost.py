"""What a Jacobi pass costs at a recurrence span (issue 53): with the feedback target at block n_layers/2, a pass
after the first re-runs only the blocks above it, so it should cost about half a full pass (DESIGN.md §2: (L - k)/L
of the blocks, plus the head and the fusion, which both spans pay alike).

Two models with the same weights, the full-bandwidth span (target 0) and target L/2, are timed in interleaved rounds
(:func:`fullband.bench.timing.interleaved`: the cases alternate within a round, every other round reversed), each at
1 pass and at ``1 + extra`` passes: a pass's cost is (time of 1 + extra passes - time of 1 pass) / extra, and the
ratio is taken within each round, its median reported. Both an inference forward (no gradients) and a training step
of the multi-pass objective (forward + backward) are measured.

    python benchmarks/span_pass_cost.py [--layers 8] [--d_model 128] [--seq_len 256] [--batch 4] [--extra 4]
                                        [--rounds 7] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.bench.timing import interleaved
from fullband.training.objective import MultiPassObjective


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--extra", type=int, default=4, help="Passes after the first in the multi-pass case.")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="Also write the numbers here.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=256, d_model=args.d_model, n_layers=args.layers, n_heads=4,
                         max_seq_len=args.seq_len)
    full = FullBandwidthLM(config)
    half = FullBandwidthLM(dataclasses.replace(config, feedback_target=args.layers // 2))
    half.load_state_dict(full.state_dict())  # the same weights: only the span differs
    tokens = torch.randint(0, 256, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(1))
    device = torch.device("cpu")
    passes = 1 + args.extra
    objective = MultiPassObjective()

    def forward(model: FullBandwidthLM, k: int):
        def run() -> None:
            with torch.no_grad():
                model(tokens, passes=k, plain_prefix=1)
        return run

    def train(model: FullBandwidthLM, k: int):
        def run() -> None:
            objective(model, tokens, tokens, k, 1).loss.backward()
            model.zero_grad(set_to_none=True)
        return run

    rows = {}
    for what, case in (("inference forward", forward), ("training step", train)):
        cases = {f"{name} x{k}": case(model, k) for name, model in (("full", full), ("half", half))
                 for k in (1, passes)}
        times = interleaved(cases, args.rounds, device)
        per_round = [((times[f"half x{passes}"][r] - times["half x1"][r])
                      / (times[f"full x{passes}"][r] - times["full x1"][r])) for r in range(args.rounds)]
        rows[what] = {
            "full pass (ms)": 1000 * statistics.median(times[f"full x{passes}"][r] - times["full x1"][r]
                                                     for r in range(args.rounds)) / args.extra,
            "half pass (ms)": 1000 * statistics.median(times[f"half x{passes}"][r] - times["half x1"][r]
                                                     for r in range(args.rounds)) / args.extra,
            "ratio": statistics.median(per_round),
            "ratio range": (min(per_round), max(per_round)),
        }
    expected = (args.layers - args.layers // 2) / args.layers
    print(f"{args.layers} blocks, d_model {args.d_model}, {args.batch} x {args.seq_len} tokens, {args.extra} extra "
          f"passes, {args.rounds} interleaved rounds, {args.threads} thread(s); target {args.layers // 2} re-runs "
          f"{args.layers - args.layers // 2} of {args.layers} blocks (blocks' share {expected:.2f}; head and fusion "
          "paid by both)")
    print("| pass | target 0 (ms) | target L/2 (ms) | ratio (median over rounds) | range |")
    print("|---|---|---|---|---|")
    for what, row in rows.items():
        low, high = row["ratio range"]
        print(f"| {what} | {row['full pass (ms)']:.1f} | {row['half pass (ms)']:.1f} | {row['ratio']:.2f} | "
              f"{low:.2f}-{high:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "blocks_share": expected, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
