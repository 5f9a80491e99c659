"""Where a training step's time goes, fullband against ``LlamaForCausalLM`` on the same weights (issue 14).

At ``fullband bench``'s training config (nanoGPT's CPU config; bare AdamW steps with clipping), with torch's
profiler:

1. the compiled fullband step's top operators by self time (10 steps);
2. eager fullband and Llama profiled in interleaved rounds of 3 steps (alternating order), every matmul and
   attention kernel grouped by input shape: the mean time per call of each shape in each model.

    python benchmarks/profile_vs_llama.py --threads 2 --rounds 6       # about a minute on 2 cores

Result (docs/LOG.md, 2026-12-03): matmuls 51-53% of the compiled step, attention 13-15%, AdamW 5-7%; both models
run the same kernels on the same shapes, at the same cost per call to within this machine's run-to-run noise
(2-6% for the most frequent shape, up to ±20% either way for rare ones).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from fullband.bench import steps

KERNELS = ("aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def step_fn(model: torch.nn.Module, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
    optimizer, params = steps.adamw(model), list(model.parameters())
    return lambda: steps.optimizer_step(loss, optimizer, params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokens = steps.train_model()
    llama = steps.llama_twin(model).train()
    compiled = copy.deepcopy(model)
    compiled.compile_blocks()
    cases = {"fullband": step_fn(model, steps.fullband_loss(model, tokens)),
             "llama": step_fn(llama, steps.transformers_loss(llama, tokens)),
             "compiled": step_fn(compiled, steps.fullband_loss(compiled, tokens))}
    for step in cases.values():  # warm up (and compile)
        for _ in range(5):
            step()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            cases["compiled"]()
    print(f"# {args.threads} threads; 1. the compiled fullband step, 10 steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

    per_shape: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        for name in ("fullband", "llama") if r % 2 == 0 else ("llama", "fullband"):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for _ in range(3):
                    cases[name]()
            for event in prof.key_averages(group_by_input_shape=True):
                if event.key in KERNELS:
                    total = per_shape.setdefault((event.key, str(event.input_shapes[:2]), name), [0.0, 0])
                    total[0] += event.self_cpu_time_total
                    total[1] += event.count
    print(f"# 2. eager fullband and Llama, {args.rounds} interleaved rounds of 3 steps: us per call by input shape")
    print(f"{'kernel':52s} {'shapes':40s} {'fullband':>9s} {'llama':>9s}")
    for kernel, shapes in sorted({(k, s) for k, s, _ in per_shape}):
        means = [per_shape[kernel, shapes, name][0] / per_shape[kernel, shapes, name][1]
                 if (kernel, shapes, name) in per_shape else float("nan") for name in ("fullband", "llama")]
        print(f"{kernel:52s} {shapes:40s} {means[0]:9.1f} {means[1]:9.1f}")


if __name__ == "__main__":
    main()
