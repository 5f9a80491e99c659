"""``fullband check``: verify on this machine that the recurrence's execution modes agree.

Builds a small random model in float64 and prints, for each way of computing the exact recurrence, the
largest difference from the sequential reference, how many stack passes it used and its wall time, then
which positions k Jacobi passes make exact, then greedy continuations in the four decoding modes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from fullband.config import ConfigError, ModelConfig
from fullband.generation.decoding import generate
from fullband.model import FullBandwidthLM, LMOutput
from fullband.modes import REGISTRY


def _timed(fn: Callable[[], LMOutput]) -> tuple[LMOutput, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


@torch.no_grad()
def run_check(seq_len: int = 48, plain_prefix: int = 8, seed: int = 0, device: str | torch.device = "cpu") -> bool:
    device = torch.device(device)
    if device.type == "mps":
        raise ConfigError("device='mps' is invalid for fullband check: it runs in float64, which MPS lacks; use "
                          "--device cpu")
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=128, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=seq_len + 16)
    model = FullBandwidthLM(cfg).double().eval().to(device)
    tokens = torch.randint(0, cfg.vocab_size, (2, seq_len)).to(device)
    T, p = seq_len, plain_prefix
    print(f"model: {model.num_parameters():,} parameters, float64 on {device}; sequence {T} tokens, "
          f"plain_prefix={p}\n")
    model.forward_exact(tokens[:, :4], 1)  # warm-up: first calls pay for kernel/allocator set-up
    reference, ref_s = _timed(lambda: model.forward_exact(tokens, p))
    runs = {
        f"multi-pass, {T - p + 1} passes": lambda: model(tokens, passes=T - p + 1, plain_prefix=p),
        "jacobi to tol=1e-10": lambda: model.forward_exact(tokens, p, method="jacobi", tol=1e-10),
        "chunked, chunk 8": lambda: model.forward_exact(tokens, p, method="chunked", chunk_size=8),
        "chunked, chunk 16": lambda: model.forward_exact(tokens, p, method="chunked", chunk_size=16),
    }
    print(f"{'computation':<28} {'max |h - h_seq|':>16} {'passes':>7} {'seconds':>8}")
    print(f"{'sequential (KV cache)':<28} {0.0:>16.1e} {reference.passes:>7} {ref_s:>8.3f}")
    ok = True
    for name, fn in runs.items():
        out, seconds = _timed(fn)
        err = (out.hidden - reference.hidden).abs().max().item()
        ok &= err <= 1e-9
        print(f"{name:<28} {err:>16.1e} {out.passes:>7} {seconds:>8.3f}")

    print("\nk Jacobi passes make positions <= p + k - 1 exact:")
    for k in (1, 2, 4, 8):
        err = (model(tokens, passes=k, plain_prefix=p).hidden - reference.hidden).abs().amax(dim=(0, 2))
        exact = int((err <= 1e-9).long().cumprod(0).sum())
        ok &= exact == min(T, p + k - 1)
        print(f"  k={k}: first {exact} positions exact (rule: {min(T, p + k - 1)})")

    print("\ngreedy continuations of the same prompt (12 new tokens):")
    prompt = tokens[0, :10].tolist()
    for spec in REGISTRY.values():  # every registered mode; one that takes a pass count with 2
        mode = f"{spec.name}:2" if spec.takes_passes else spec.name
        out = generate(model, prompt, max_new_tokens=12, mode=mode)
        print(f"  {mode:<9} {out[len(prompt):]}")
    print("\nall modes agree" if ok else "\nMISMATCH: the execution modes disagree on this machine")
    return ok
