"""FLOPs and an estimated run time of a ``fullband compare`` preset, counted, not measured.

For each run of the preset: parameters, training tokens and steps, training FLOPs (fullband.experiments.core.flops:
the run's batch plan replayed, every pass the objective runs, attention included) next to 6·N·D; then the
evaluation's FLOPs (the test windows in standard and fused modes, one loop of 1 + max(fused_passes) passes; exact
mode bounded above by T passes, Jacobi's worst case; the stability diagnostic). The time estimate divides them by
an assumed share of a GPU's peak: training at the bf16 peak (the Trainer's autocast on CUDA), evaluation at the
float32 peak (it runs without autocast). Small models and the Python loop over passes rarely get near that share,
so the estimate is a floor; it is no measurement.

    python benchmarks/compare_flops.py --preset gpu                  # H100 SXM peaks, 40% MFU
    python benchmarks/compare_flops.py --preset gpu --mfu 0.2 --bf16_tflops 989 --fp32_tflops 67
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fullband import FullBandwidthLM
from fullband.data import ByteTokenizer
from fullband.experiments.core.flops import Shape, batch_lengths, forward_flops, training_flops
from fullband.experiments.core.lm.runs import plan_runs, preset_config, train_config


def parameters(model_cfg) -> int:
    with torch.device("meta"):  # the count without allocating the weights
        return sum(p.numel() for p in FullBandwidthLM(model_cfg).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpu")
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed share of the peak")
    parser.add_argument("--bf16_tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM: 989)")
    parser.add_argument("--fp32_tflops", type=float, default=67.0, help="float32 peak without TF32 (H100 SXM: 67)")
    args = parser.parse_args()
    cfg = preset_config(args.preset)
    if cfg.data.tokenizer != "byte":  # fullband.experiments.core.flops.training_flops counts the byte vocabulary
        raise SystemExit(f"compare_flops: counts byte-tokenizer presets only, not data.tokenizer={cfg.data.tokenizer}")
    vocab = ByteTokenizer().vocab_size
    print(f"# fullband compare --preset {args.preset}: d_model {cfg.model.d_model}, {cfg.model.n_layers} layers, "
          f"seq_len {cfg.train.seq_len}, batch {cfg.train.batch_size}, 1x = {cfg.train.token_budget:,} tokens, "
          f"budgets {cfg.budgets}, {cfg.seeds} seed(s)")
    print(f"{'run':<22}{'params':>12}{'steps':>7}{'tokens':>12}{'train FLOPs':>13}{'6ND':>11}")
    train_total = eval_total = exact_bound = 0.0
    for spec in plan_runs(cfg):
        run = train_config(cfg, spec, Path("unused"))
        model = run.model.resolve(vocab)
        lengths = batch_lengths(run)
        tokens = sum(lengths) * run.train.batch_size
        flops, n = training_flops(run, lengths), parameters(model)
        train_total += flops
        print(f"{spec.name + ' s' + str(spec.seed):<22}{n:>12,}{len(lengths):>7}{tokens:>12,}{flops:>13.3e}"
              f"{6 * n * tokens:>11.3e}")
        # Evaluation: eval_windows test windows of seq_len tokens (fewer if the split is short; counted as many).
        shape, T = Shape.of(model), cfg.train.seq_len
        plain, fused = forward_flops(shape, T, False), forward_flops(shape, T, True)
        if model.feedback:
            eval_total += cfg.eval_windows * (plain + max(cfg.fused_passes) * fused)
            exact_bound += cfg.eval_windows * (plain + (T - 1) * fused)  # Jacobi to exactness: T passes
            stab_T = cfg.stability_seq_len or T
            eval_total += cfg.stability_windows * (forward_flops(shape, stab_T, False)
                                                   + (cfg.stability_passes - 1) * forward_flops(shape, stab_T, True))
        else:
            eval_total += cfg.eval_windows * plain
    train_s = train_total / (args.mfu * args.bf16_tflops * 1e12)
    eval_s = eval_total / (args.mfu * args.fp32_tflops * 1e12)
    exact_s = exact_bound / (args.mfu * args.fp32_tflops * 1e12)
    print(f"\ntraining {train_total:.3e} FLOPs; evaluation {eval_total:.3e} + exact mode <= {exact_bound:.3e}")
    print(f"estimate at {args.mfu:.0%} of {args.bf16_tflops:g} (bf16) / {args.fp32_tflops:g} (fp32) TFLOP/s: "
          f"training {train_s:.0f} s, evaluation {eval_s:.0f} s + exact mode <= {exact_s:.0f} s (not measured)")


if __name__ == "__main__":
    main()
