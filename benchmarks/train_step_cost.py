"""Cost of multi-pass training steps: step time and activation memory of 2- and 3-pass steps vs a 1-pass step.

One training step = the scheduled multi-pass objective's forward (all passes, a loss per pass), backward and an
AdamW update, on the same weights and batch. Pass counts are interleaved (1, 2, 3, 1, 2, 3, ...) so drift in
machine speed hits all alike; times are the best of the repeats.

Memory: on CUDA the peak allocated memory of the step (``torch.cuda.max_memory_allocated``). On the CPU, where
PyTorch keeps no such counter, the bytes of the tensors autograd saves for the backward pass (counted with
``saved_tensors_hooks``, each storage once) -- the activation memory that grows with the pass count; weights and
optimizer state are the same for every pass count.

    python benchmarks/train_step_cost.py
    python benchmarks/train_step_cost.py --d-model 768 --layers 12 --heads 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.bench.steps import SavedTensorBytes, fullband_loss, optimizer_step


def train_step(model: FullBandwidthLM, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, passes: int,
               device: torch.device) -> tuple[float, int]:
    """(seconds, memory bytes) of one optimizer step with ``passes`` passes (fullband bench's bare step)."""
    counter = SavedTensorBytes()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    optimizer_step(fullband_loss(model, tokens, passes), optimizer, list(model.parameters()), math.inf, counter)
    if device.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated()
    return time.perf_counter() - start, counter.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--passes", default="1,2,3")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0 = torch's default); 1 is steadiest on a machine with other load")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                      max_seq_len=args.seq_len)
    model = FullBandwidthLM(cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len), device=device)
    pass_counts = [int(p) for p in args.passes.split(",")]
    for passes in pass_counts:  # warm-up: allocator, optimizer state
        train_step(model, optimizer, tokens, passes, device)
    times: dict[int, list[float]] = {p: [] for p in pass_counts}
    memory: dict[int, int] = {}
    for _ in range(args.repeats):
        for passes in pass_counts:
            seconds, used = train_step(model, optimizer, tokens, passes, device)
            times[passes].append(seconds)
            memory[passes] = used

    memory_kind = "peak allocated" if device.type == "cuda" else "saved activations"
    print(f"# train step cost: torch {torch.__version__}, {device}, threads={torch.get_num_threads()}, "
          f"{platform.machine()}; L={args.layers} D={args.d_model} batch {args.batch} x {args.seq_len} tokens, "
          f"{model.num_parameters():,} params; best of {args.repeats} interleaved repeats")
    print(f"{'passes':>6} {'step s':>9} {'time ratio':>11} {memory_kind + ' MiB':>24} {'memory ratio':>13}")
    base = pass_counts[0]
    rows = []
    for passes in pass_counts:
        best = min(times[passes])
        row = dict(passes=passes, step_s=best, time_ratio=best / min(times[base]), memory_bytes=memory[passes],
                   memory_ratio=memory[passes] / memory[base], all_step_s=times[passes])
        rows.append(row)
        print(f"{passes:>6} {best:>9.4f} {row['time_ratio']:>11.2f} {memory[passes] / 2**20:>24.1f} "
              f"{row['memory_ratio']:>13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(device), memory_kind=memory_kind, config=vars(args), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
