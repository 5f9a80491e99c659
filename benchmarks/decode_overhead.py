"""Per-token decoding cost of latent feedback: the same weights decoded in ``standard`` vs ``soft`` mode.

Standard mode never touches the fusion; soft mode adds, per generated token, the fusion's two D x D products
(W_U h and W_G e) plus two RMSNorms and a sigmoid. Runs are interleaved (standard, soft, standard, ...) so
drift in machine speed hits both sides alike. The table reports the best of the repeats (the usual timeit
practice: other load on the machine only ever adds time) and, as a noise check, the ratio of the medians.

    python benchmarks/decode_overhead.py                 # tiny and GPT-2-small dims, batch 1 and 8
    python benchmarks/decode_overhead.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.generation import generate

SHAPES = {
    "tiny": dict(vocab_size=256, d_model=256, n_layers=4, n_heads=4),
    "gpt2-small": dict(vocab_size=50257, d_model=768, n_layers=12, n_heads=12),
}


def time_generate(model: FullBandwidthLM, prompts: torch.Tensor, new_tokens: int, mode: str, device: str) -> float:
    """Seconds for one greedy generate() of ``new_tokens`` tokens (prefill included; it is 16 tokens)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    generate(model, prompts, max_new_tokens=new_tokens, mode=mode)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def flops_per_token(cfg: ModelConfig, context: int, with_fusion: bool) -> float:
    """Forward FLOPs of one decoded token: 2 x matmul params, + attention over the context, + fusion."""
    d, f, hd = cfg.d_model, cfg.ffn_dim, cfg.head_dim
    per_layer = 2 * (d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + cfg.n_heads * hd * d + 3 * d * f)
    attention = 2 * 2 * cfg.n_heads * hd * context
    fusion = 2 * 2 * d * d if with_fusion else 0
    return cfg.n_layers * (per_layer + attention) + 2 * d * cfg.vocab_size + fusion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated keys of SHAPES")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0 = torch's default); 1 is steadiest on a machine with other load")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    dtype = getattr(torch, args.dtype)
    print(f"# decode overhead: torch {torch.__version__}, {args.device}, {args.dtype}, threads="
          f"{torch.get_num_threads()}, {platform.processor() or platform.machine()}")
    print(f"# {args.new_tokens} new tokens after a {args.prompt_len}-token prompt, greedy, best of "
          f"{args.repeats} interleaved repeats")
    header = f"{'model':<26} {'batch':>5} {'standard tok/s':>15} {'soft tok/s':>11} {'soft/std time':>14} " \
             f"{'(medians)':>10} {'FLOP ratio':>11}"
    print(header)
    print("-" * len(header))
    rows = []
    for shape in args.shapes.split(","):
        torch.manual_seed(0)
        cfg = ModelConfig(**SHAPES[shape], max_seq_len=args.prompt_len + args.new_tokens, feedback=True)
        label = f"{shape} (L={cfg.n_layers}, D={cfg.d_model})"
        model = FullBandwidthLM(cfg).to(device=args.device, dtype=dtype).eval()
        context = args.prompt_len + args.new_tokens // 2
        flop_ratio = flops_per_token(cfg, context, True) / flops_per_token(cfg, context, False)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            prompts = torch.randint(0, cfg.vocab_size, (batch, args.prompt_len))
            time_generate(model, prompts, 8, "soft", args.device)  # warm-up (allocator, kernels)
            times: dict[str, list[float]] = {"standard": [], "soft": []}
            for _ in range(args.repeats):
                for mode in times:
                    times[mode].append(time_generate(model, prompts, args.new_tokens, mode, args.device))
            std, soft = (min(times[m]) for m in ("standard", "soft"))
            median_ratio = statistics.median(times["soft"]) / statistics.median(times["standard"])
            row = dict(model=shape, batch=batch, standard_tok_s=batch * args.new_tokens / std,
                       soft_tok_s=batch * args.new_tokens / soft, time_ratio=soft / std, median_ratio=median_ratio,
                       flop_ratio=flop_ratio, standard_s=times["standard"], soft_s=times["soft"])
            rows.append(row)
            print(f"{label:<26} {batch:>5} {row['standard_tok_s']:>15.1f} {row['soft_tok_s']:>11.1f} "
                  f"{row['time_ratio']:>14.3f} {median_ratio:>10.3f} {flop_ratio:>11.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=args.device, dtype=args.dtype, torch=torch.__version__, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
