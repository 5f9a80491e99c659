"""F.linear (MKL) against oneDNN's kernel for inference products of few rows, with weights cycled through memory.

Which kernel ``fullband.model.linear.Linear`` should take for a product of a given number of rows on this CPU
(:data:`fullband.model.linear.ONEDNN_MIN_ROWS`). Each case multiplies the same input by ~400 MB of distinct weights
of one shape, one after the other, as a decoding step reads a model's weights (one weight timed hot in cache
misleads); both kernels interleaved round by round. Pin the cores as well, e.g.

    taskset -c 0,1 python benchmarks/linear_kernels.py --threads 2
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from fullband.bench.timing import interleaved, ratio
from fullband.devices import cpu_name, cpu_vendor

SHAPES = ((768, 768), (768, 2048), (2048, 768), (768, 32000))  # GPT-2-small's projections and a 32k head (in, out)
ROWS = (1, 2, 4, 8, 64)


def onednn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mb", type=int, default=400, help="MB of distinct weights per shape")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    print(f"{cpu_name()} ({cpu_vendor() or 'unknown vendor'}), {args.threads} thread(s); F.linear / oneDNN time, "
          f"medians of {args.rounds} interleaved rounds (< 1: F.linear faster)")
    print("weight (in x out) | " + " | ".join(f"{r} row{'s' * (r > 1)}" for r in ROWS))
    for fan_in, fan_out in SHAPES:
        weights = [torch.randn(fan_out, fan_in) for _ in range(max(4, args.mb * 10**6 // (4 * fan_in * fan_out)))]
        row = []
        for rows in ROWS:
            x = torch.randn(rows, fan_in)
            cases = {"F.linear": lambda x=x, ws=weights: [F.linear(x, w) for w in ws],
                     "oneDNN": lambda x=x, ws=weights: [onednn(x, w) for w in ws]}
            times = interleaved(cases, args.rounds, torch.device("cpu"))
            row.append(f"{ratio(times, 'F.linear', 'oneDNN'):.2f}")
        print(f"{fan_in} x {fan_out} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
