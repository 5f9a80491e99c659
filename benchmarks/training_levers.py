"""Two more levers for the CPU training step (issue 14): bf16 autocast, and data parallelism across the cores.

At ``fullband bench``'s training config (nanoGPT's CPU config: 4 layers, 4 heads, 128 wide, batch 12 x 64, byte
vocabulary; bare AdamW steps with clipping), against ``LlamaForCausalLM`` on the same weights:

- ``bf16``: fullband eager, fullband with compiled blocks and Llama, each in float32 and under
  ``torch.autocast("cpu", dtype=torch.bfloat16)``, in one process, interleaved rounds of 3 steps.
- ``ddp``: each model as one process with 2 threads on the whole batch, against 2 DDP processes (gloo) with one
  thread each on half the batch; a fresh pair of processes per case and round, 20 timed steps after 5 warm-up
  steps (the median step of rank 0).

Every figure is the median over rounds; speed = Llama float32 one-process time / the case's time.

    python benchmarks/training_levers.py --rounds 5        # about 5 minutes on 2 cores

Result (docs/LOG.md, 2026-12-03, 5 rounds on quiet cores): neither helps. Under bf16 autocast fullband with
compiled blocks runs at 1.10x Llama's float32 speed against 1.13x in float32, and Llama itself at 0.91x (the bf16
matmuls alone are 2-3x faster at these shapes; the casts around them eat it back). Two DDP processes x 1 thread
are slower than one process x 2 threads for the compiled and Llama steps (fullband compiled 0.96x against 1.10x,
Llama 0.81x against 1.00x).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fullband.bench import steps
from fullband.training.objective import MultiPassObjective

MODELS = ("fullband eager", "fullband compiled", "llama")


Loss = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


def build(name: str) -> tuple[torch.nn.Module, Loss, torch.Tensor]:
    """(model, loss of a batch through a module that wraps or is the model, the batch): the same weights and
    batch for every case (``fullband bench``'s training model, seed 0)."""
    torch.manual_seed(0)
    model, tokens = steps.train_model()
    if name == "llama":
        return steps.llama_twin(model).train(), lambda net, t: net(input_ids=t, labels=t).loss, tokens
    if name == "fullband compiled":
        model.compile_blocks()
    return model, lambda net, t: MultiPassObjective()(net, t, t).loss, tokens


def bf16_rounds(rounds: int) -> dict[str, list[float]]:
    torch.set_num_threads(2)
    cases = {}
    for name in MODELS:
        for precision in ("float32", "bf16"):
            model, loss, tokens = build(name)  # a fresh copy of the same weights per case
            bf16 = precision == "bf16"
            ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

            def forward(model=model, loss=loss, tokens=tokens, ctx=ctx) -> torch.Tensor:
                with ctx():
                    return loss(model, tokens)

            optimizer, params = steps.adamw(model), list(model.parameters())
            cases[f"{name}, {precision}"] = lambda f=forward, o=optimizer, p=params: steps.optimizer_step(f, o, p)
    for step in cases.values():  # warm up (and compile)
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, step in cases.items():
            start = time.perf_counter()
            for _ in range(3):
                step()
            times[name].append((time.perf_counter() - start) / 3)
    return times


def ddp_worker(rank: int, world: int, name: str, port: int, queue: mp.Queue) -> None:
    torch.set_num_threads(2 // world)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model, loss, tokens = build(name)
    rows = len(tokens) // world
    mine = tokens[rank * rows:(rank + 1) * rows]
    net = model
    if world > 1:  # the fusion's weights get no gradient in single-pass steps
        net = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=name != "llama")
    optimizer, params = steps.adamw(model), list(model.parameters())
    times = []
    for i in range(25):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        steps.optimizer_step(lambda: loss(net, mine), optimizer, params)
        if i >= 5:
            times.append(time.perf_counter() - start)
    if rank == 0:
        queue.put(statistics.median(times))
    if world > 1:
        del net
        dist.destroy_process_group()


def ddp_rounds(rounds: int) -> dict[str, list[float]]:
    spawn = mp.get_context("spawn")
    times: dict[str, list[float]] = {}
    port = 29600
    for _ in range(rounds):
        for name in MODELS:
            for world in (1, 2):
                queue, port = spawn.Queue(), port + 1
                procs = [spawn.Process(target=ddp_worker, args=(r, world, name, port, queue)) for r in range(world)]
                for p in procs:
                    p.start()
                seconds = queue.get()
                for p in procs:
                    p.join()
                label = f"{name}, 1 process x 2 threads" if world == 1 else f"{name}, 2 DDP processes x 1 thread"
                times.setdefault(label, []).append(seconds)
    return times


def report(title: str, times: dict[str, list[float]], reference: str) -> None:
    ref = statistics.median(times[reference])
    print(f"\n{title}\n{'case':48s} {'ms/step':>8s} {'speed vs ' + reference:>40s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:48s} {1000 * median:8.1f} {ref / median:40.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them")
    parser.add_argument("--only", choices=("bf16", "ddp"), help="run one of the two experiments")
    args = parser.parse_args()
    print(f"# training levers: torch {torch.__version__}, 2 threads in all, medians of {args.rounds} rounds")
    if args.only in (None, "bf16"):
        report("bf16 autocast (one process, interleaved)", bf16_rounds(args.rounds), "llama, float32")
    if args.only in (None, "ddp"):
        report("data parallel (fresh processes per case and round)", ddp_rounds(args.rounds),
               "llama, 1 process x 2 threads")


if __name__ == "__main__":
    main()
