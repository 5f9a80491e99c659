"""Does one concatenated q/k/v matmul (and one gate/up matmul) per block speed up a training step?

A/B at ``fullband bench``'s training config (nanoGPT's CPU config: 4 layers, 4 heads, 128 wide, batch 12 x 64,
byte vocabulary; bare AdamW steps), eager and with compiled blocks. The concatenated variant builds the weight
``cat(W_q, W_k, W_v)`` in the forward, so parameters and checkpoints stay as they are. Cases run in interleaved
rounds of 10 steps (alternating order); the table gives median ms per step and the separate / concatenated time.

    python benchmarks/projection_concat.py --threads 2 --rounds 9      # about a minute on 2 cores

Result (docs/LOG.md, 2026-12-03): 0.999 eager and 1.005 compiled on 2 threads: no gain, not adopted.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from fullband import FullBandwidthLM
from fullband.bench import steps
from fullband.model import layers
from fullband.training.objective import MultiPassObjective


def attention_concatenated(self: layers.Attention, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                           mask: torch.Tensor | None, cache: object) -> torch.Tensor:
    # Training's plain causal path only (no mask, no cache), which is all this benchmark runs.
    B, T, _ = x.shape
    weight = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
    sizes = (self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features)
    q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in F.linear(x, weight).split(sizes, -1))
    q, k = layers.apply_rope(q, *rope), layers.apply_rope(k, *rope)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
    return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def swiglu_concatenated(self: layers.SwiGLU, x: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, torch.cat((self.gate_proj.weight, self.up_proj.weight))).chunk(2, -1)
    return self.down_proj(F.silu(gate) * up)


def train_step(model: FullBandwidthLM, tokens: torch.Tensor, concatenated: bool,
               compiled: bool) -> Callable[[], None]:
    model = copy.deepcopy(model)
    if concatenated:  # bound per instance, so both variants live in one process
        for block in model.blocks:
            block.attn.forward = attention_concatenated.__get__(block.attn)
            block.mlp.forward = swiglu_concatenated.__get__(block.mlp)
    if compiled:
        model.compile_blocks()
    optimizer, params = steps.adamw(model), list(model.parameters())
    return lambda: steps.optimizer_step(lambda: MultiPassObjective()(model, tokens, tokens).loss, optimizer, params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokens = steps.train_model()
    cases = {f"{'concatenated' if cat else 'separate'} {'compiled' if comp else 'eager'}": train_step(
        model, tokens, cat, comp) for cat in (False, True) for comp in (False, True)}
    for step in cases.values():  # warm up (and compile)
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(args.rounds):
        for name, step in (list(cases.items()) if r % 2 == 0 else list(cases.items())[::-1]):
            start = time.perf_counter()
            for _ in range(10):
                step()
            times[name].append((time.perf_counter() - start) * 100)  # ms per step
    print(f"# {args.threads} threads, medians of {args.rounds} interleaved rounds of 10 steps")
    for name, values in times.items():
        print(f"{name:24s} {statistics.median(values):7.2f} ms/step")
    for how in ("eager", "compiled"):
        ratios = [a / b for a, b in zip(times[f"separate {how}"], times[f"concatenated {how}"], strict=True)]
        print(f"separate / concatenated time, {how}: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
