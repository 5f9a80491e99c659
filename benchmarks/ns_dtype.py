"""Newton-Schulz orthogonalisation in bfloat16 vs float32 on Muon's matrices of the compare default's model.

Times one orthogonalisation of every matrix Muon updates (``optim.muon_params`` of ``fullband compare``'s default
model: 128 wide, 4 blocks, with the fusion), in each dtype, interleaved round by round, on the threads given. The
ratio says which dtype ``ns_dtype='auto'`` should take on this kind of CPU
(:data:`fullband.training.muon.BF16_CPU_NS_DTYPE`). Pin the cores as well, e.g.

    taskset -c 1 python benchmarks/ns_dtype.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics

import torch

from fullband.bench.config import BenchTrainConfig
from fullband.bench.steps import train_model
from fullband.bench.timing import interleaved
from fullband.devices import cpu_flags
from fullband.training.muon import CPU_BF16_FLAGS, newton_schulz
from fullband.training.optim import muon_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=3, help="orthogonalisations of every matrix per round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = train_model(BenchTrainConfig(batch_size=16, seq_len=128))  # compare's default dims
    named, _ = muon_split(model, ("blocks", "fusion"))
    grads = [torch.randn_like(p) for _, p in named]
    cases = {name: (lambda dtype=dtype: [newton_schulz(g, dtype=dtype) for g in grads])
             for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32))}
    times = interleaved(cases, args.rounds, torch.device("cpu"), reps=args.reps, warmup=2)
    ratio = statistics.median(b / f for b, f in zip(times["bfloat16"], times["float32"], strict=True))
    flags = cpu_flags()
    shapes = sorted({tuple(g.shape) for g in grads})
    print(f"{len(grads)} matrices {shapes}, {args.threads} thread(s), CPU bf16 flags: "
          f"{[f for f in CPU_BF16_FLAGS if f in flags] or 'none'}; medians of {args.rounds} interleaved rounds")
    for name in cases:
        print(f"  {name:9s} {1000 * statistics.median(times[name]):8.2f} ms per optimizer step's orthogonalisations")
    print(f"  bfloat16 / float32 time: {ratio:.2f} ({'bfloat16' if ratio < 1 else 'float32'} faster)")


if __name__ == "__main__":
    main()
