"""Where a truncated-gradient training step of the reasoning studies spends its time: the sequential fixed point
against the passes with gradients (issue 42: "the full-bandwidth model's sequential fixed point dominates the wall
time; profile it").

The step is the one ``fullband eval-reasoning --preset controls`` trained (d_model 64, 2 blocks, batch 64, 32 passes
capped at the exact count, gradients through pass 1 and the last 8, plain prefix 1, loss on the last tokens, AdamW).
Three things are timed in interleaved rounds on the same weights and batch: the fixed point alone
(``forward_exact``, sequential, no gradients), the whole step, and the same step without the fixed point (pass 1 and
8 passes with gradients: what the step does besides it). Medians over the rounds.

    python benchmarks/fixed_point_share.py [--lengths 16 30] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.training.objective import MultiPassObjective


def time_step_parts(model: FullBandwidthLM, optimizer: torch.optim.Optimizer, T: int, rounds: int,
                    grad_passes: int) -> dict[str, float]:
    """Median milliseconds of the fixed point, the whole step and the step without the fixed point."""
    tokens = torch.randint(0, 256, (64, T))
    labels = tokens.clone()
    labels[:, : T - 3] = -100  # the answer's tokens only, as answer-only training scores them

    def fixed_point() -> None:
        model.forward_exact(tokens, plain_prefix=1, method="sequential")

    def step(passes: int, grads: int) -> None:
        out = MultiPassObjective(feedback_weight=0.3, grad_passes=grads)(model, tokens, labels, passes, 1)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()

    cases = {"fixed point": fixed_point, "step": lambda: step(32, grad_passes),
             "without": lambda: step(grad_passes + 1, 0)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for f in cases.values():  # warm up
        f()
    for _ in range(rounds):
        for name, f in cases.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 30], help="Tokens per training sequence.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--grad_passes", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = FullBandwidthLM(ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, max_seq_len=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    print("| tokens | fixed point (ms) | whole step (ms) | step without it (ms) | fixed point / step |")
    print("|---|---|---|---|---|")
    for T in args.lengths:
        ms = time_step_parts(model, optimizer, T, args.rounds, args.grad_passes)
        print(f"| {T} | {ms['fixed point']:.0f} | {ms['step']:.0f} | {ms['without']:.0f} | "
              f"{ms['fixed point'] / ms['step']:.0%} |")


if __name__ == "__main__":
    main()
