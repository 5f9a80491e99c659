"""GPU check of issue 14 (speed): ``fullband bench`` on one NVIDIA GPU, then bf16 and torch.compile training steps.

Not run yet (written on a CPU-only machine); it needs one CUDA GPU and takes well under 10 minutes. Without CUDA it
says so in one line and exits with status 2. What it prints:

1. the GPU, torch and CUDA versions;
2. the ``fullband bench`` table on the GPU (float32): train step vs LlamaForCausalLM / GPT2LMHeadModel, trainer
   overhead, 2-/3-pass cost, greedy decoding vs ``generate`` with identical tokens, soft vs standard, and the exact-
   likelihood methods, which test the hypothesis behind ``forward_exact(method="auto")`` choosing ``chunked`` on CUDA
   when a tolerance is given (``fullband.model.recurrence.auto_exact_method``);
3. training steps at GPT-2-small size in bf16 autocast: eager vs ``torch.compile`` of each block (the Trainer's
   ``train.compile``), fullband vs LlamaForCausalLM on the same weights, interleaved; and the compiled step's loss
   against the eager one (they must agree within bf16 tolerance).

    python benchmarks/gpu_check.py --out gpu-check        # writes bench.json and compile.json there
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.bench import steps
from fullband.bench.config import BenchConfig
from fullband.bench.run import run_bench, table
from fullband.bench.timing import interleaved, ratio


def bf16(loss_fn):
    def run() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return loss_fn()
    return run


def compile_check(device: torch.device, rounds: int) -> dict:
    """bf16 training steps at GPT-2-small size: eager and compiled fullband, eager LlamaForCausalLM."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, max_seq_len=512, feedback=True)
    eager = FullBandwidthLM(config).to(device).train()
    compiled = copy.deepcopy(eager)
    compiled.compile_blocks()  # as the Trainer does (train.compile): used by forwards with gradients
    llama = steps.llama_twin(eager).train()
    tokens = torch.randint(0, config.vocab_size, (16, 512), device=device)
    # With gradients on (the compiled blocks serve only those forwards); nothing is stepped.
    losses = {name: float(bf16(steps.fullband_loss(m, tokens))().detach()) for name, m in (("eager", eager),
                                                                                             ("compiled", compiled))}
    cases = {}
    for name, net, loss_fn in (("fullband eager", eager, steps.fullband_loss(eager, tokens)),
                               ("fullband compiled", compiled, steps.fullband_loss(compiled, tokens)),
                               ("fullband compiled, 2 passes", compiled, steps.fullband_loss(compiled, tokens, 2)),
                               ("llama eager", llama, steps.transformers_loss(llama, tokens))):
        optimizer, params, autocast_loss = steps.adamw(net), list(net.parameters()), bf16(loss_fn)
        cases[name] = lambda f=autocast_loss, o=optimizer, p=params: steps.optimizer_step(f, o, p)
    start = time.perf_counter()
    times = interleaved(cases, rounds, device, reps=3, warmup=2)  # warm-up includes compilation
    return {"losses": losses, "loss_difference": abs(losses["eager"] - losses["compiled"]),
            "median_step_s": {k: statistics.median(v) for k, v in times.items()},
            "speed_compiled_over_eager": ratio(times, "fullband eager", "fullband compiled"),
            "speed_compiled_over_llama": ratio(times, "llama eager", "fullband compiled"),
            "two_pass_over_one_pass": ratio(times, "fullband compiled, 2 passes", "fullband compiled"),
            "seconds": time.perf_counter() - start, "times_s": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check", help="directory for bench.json and compile.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA GPU is visible (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda or 'none'}); run it on a machine with one NVIDIA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# gpu_check: {torch.cuda.get_device_name(device)}, capability {torch.cuda.get_device_capability(device)}, "
          f"bf16 {torch.cuda.is_bf16_supported()}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    results = run_bench(BenchConfig(device="cuda", rounds=args.rounds, limit_mib=1024, json=str(out / "bench.json")),
                        progress=lambda message: print(message, file=sys.stderr, flush=True))
    print(table(results), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        check = compile_check(device, args.rounds)
        (out / "compile.json").write_text(json.dumps(check, indent=2))
        print("\n# bf16 autocast train steps, GPT-2-small dims (12 x 768, vocab 32000), batch 16 x 512")
        for name, seconds in check["median_step_s"].items():
            print(f"{name:<30} {1000 * seconds:9.1f} ms")
        print(f"speed compiled / eager           {check['speed_compiled_over_eager']:.2f}")
        print(f"speed compiled / LlamaForCausalLM {check['speed_compiled_over_llama']:.2f}   (target >= 1.3)")
        print(f"2-pass / 1-pass time (compiled)  {check['two_pass_over_one_pass']:.2f}   (target <= 2.1)")
        same = check["loss_difference"] < 2e-2
        print(f"compiled vs eager loss: {check['losses']} -> {'same within bf16 tolerance' if same else 'DIFFER'}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
