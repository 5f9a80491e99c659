"""Training step time of every arm of the word-problem studies, interleaved, as a ratio to the 1-pass transformer's:
what a study's runs will cost before they are started (docs/LOG.md plans from it).

One step = an arm's training loss on the study's batch of that step, backward and an AdamW update. The arms take turns
(round-robin, ``--rounds`` times, in each round every arm on the same steps' batches, whose sizes vary) so drift in
machine speed hits all alike; times are the median per arm.

With ``--compiled`` every arm whose model has transformer blocks also runs a twin with the blocks under
torch.compile (``FullBandwidthLM.compile_blocks``, what the trainer does), from the same initial weights, in the same
rounds: whether compiling would pay for a study's training.

    python benchmarks/word_problem_step_cost.py --study recall
    python benchmarks/word_problem_step_cost.py --study decisive --rounds 5 --json out.json
    python benchmarks/word_problem_step_cost.py --study recall --compiled

Result (docs/LOG.md, 2026-12-07, tenth session, recall, 5 rounds): eager / compiled is 0.81 for the 1-pass
transformer, 1.20 looped, 1.27 hybrid, 0.92 full-bandwidth exact, 1.02 paper schedule: the studies train eager.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from fullband.devices import cpu_flags, cpu_name
from fullband.experiments.word_problems.arms import make_arm
from fullband.experiments.word_problems.train import training_batch
from fullband.model import FullBandwidthLM

ARMS = {  # (arm, knob, variant) at the studies' default sizes
    "decisive": [("baseline", 0.0, "position=rope"), ("equal_flops", "deep", "position=rope"),
                 ("looped", 2, "position=rope,injection=normed"), ("growing_depth", 2, "position=rope"),
                 ("rnn", "lstm", ""), ("fullband", 0.3, "position=rope")],
    "recall": [("baseline", 0.0, "position=rope"), ("looped", 2, "position=rope,injection=normed"),
               ("rnn", "lstm", ""), ("wide_lstm", "lstm", ""), ("hybrid", 2, "position=rope"),
               ("fullband", 1.0, "position=rope"), ("fullband_paper", 1.0, "position=rope")],
}


def config(study: str):
    if study == "recall":
        from fullband.experiments.word_problems.recall.config import RecallConfig

        return RecallConfig(), "s5/full"
    from fullband.experiments.word_problems.decisive.config import DecisiveConfig

    return DecisiveConfig(), "s5"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=sorted(ARMS), default="recall")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per arm per round (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compiled", action="store_true", help="also each arm with torch.compile'd blocks")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg, group = config(args.study)
    problems = cfg.problems(group)
    arms = []
    for name, knob, variant in ARMS[args.study]:
        arm = make_arm(name, cfg, problems, variant)
        torch.manual_seed(0)
        model = arm.build(knob)
        arms.append((name, knob, arm, model, torch.optim.AdamW(model.parameters(), lr=1e-3)))
        nets = [m for m in model.modules() if isinstance(m, FullBandwidthLM)]
        if args.compiled and nets:
            torch.manual_seed(0)
            twin = arm.build(knob)
            for net in (m for m in twin.modules() if isinstance(m, FullBandwidthLM)):
                net.compile_blocks()
            arms.append((f"{name} compiled", knob, arm, twin, torch.optim.AdamW(twin.parameters(), lr=1e-3)))
    times: dict[str, list[float]] = {name: [] for name, *_ in arms}
    for round_ in range(args.rounds):
        for name, knob, arm, model, optimizer in arms:
            for i in range(args.steps + 1):  # the first is a warm-up (and compiles in the first round)
                step = round_ * (args.steps + 1) + i  # every arm gets the same batches (their sizes vary by step)
                start = time.perf_counter()
                loss = arm.loss(model, training_batch(cfg, problems, 0, step), knob, step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if i:
                    times[name].append(time.perf_counter() - start)
    base = statistics.median(times[arms[0][0]])
    rows = [{"arm": name, "ms_per_step": 1000 * statistics.median(times[name]),
             "ratio": statistics.median(times[name]) / base,
             "minutes_per_4500_steps": 4500 * statistics.median(times[name]) / 60,
             "eager_over_compiled": statistics.median(times[name.removesuffix(" compiled")]) / statistics.median(
                 times[name]) if name.endswith(" compiled") else None} for name, *_ in arms]
    machine = {"cpu": cpu_name(), "avx512_bf16": "avx512_bf16" in cpu_flags(), "threads": args.threads,
               "torch": torch.__version__, "python": platform.python_version()}
    print(f"{args.study}: {machine['cpu']}{' (avx512_bf16)' if machine['avx512_bf16'] else ''}, "
          f"{args.threads} thread(s), median of {args.rounds} x {args.steps} steps")
    print("| arm | ms per step | x transformer | minutes per 4500 steps | eager / compiled |\n|---|---|---|---|---|")
    for row in rows:
        speedup = f"{row['eager_over_compiled']:.2f}" if row["eager_over_compiled"] else ""
        print(f"| {row['arm']} | {row['ms_per_step']:.0f} | {row['ratio']:.2f} | {row['minutes_per_4500_steps']:.0f} "
              f"| {speedup} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
