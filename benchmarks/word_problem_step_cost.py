"""Training step time of every arm of the word-problem studies, interleaved, as a ratio to the 1-pass transformer's:
what a study's runs will cost before they are started (docs/LOG.md plans from it).

One step = an arm's training loss on the study's batch of that step, backward and an AdamW update. The arms take turns
(round-robin, ``--rounds`` times) so drift in machine speed hits all alike; times are the median per arm.

    python benchmarks/word_problem_step_cost.py --study recall
    python benchmarks/word_problem_step_cost.py --study decisive --rounds 5 --json out.json
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
    times: dict[str, list[float]] = {name: [] for name, *_ in arms}
    step = 0
    for _ in range(args.rounds):
        for name, knob, arm, model, optimizer in arms:
            for i in range(args.steps + 1):  # the first is a warm-up
                start = time.perf_counter()
                loss = arm.loss(model, training_batch(cfg, problems, 0, step), knob, step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                if i:
                    times[name].append(time.perf_counter() - start)
    base = statistics.median(times[arms[0][0]])
    rows = [{"arm": name, "ms_per_step": 1000 * statistics.median(times[name]),
             "ratio": statistics.median(times[name]) / base,
             "minutes_per_4500_steps": 4500 * statistics.median(times[name]) / 60} for name, *_ in arms]
    machine = {"cpu": cpu_name(), "avx512_bf16": "avx512_bf16" in cpu_flags(), "threads": args.threads,
               "torch": torch.__version__, "python": platform.python_version()}
    print(f"{args.study}: {machine['cpu']}{' (avx512_bf16)' if machine['avx512_bf16'] else ''}, "
          f"{args.threads} thread(s), median of {args.rounds} x {args.steps} steps")
    print("| arm | ms per step | x transformer | minutes per 4500 steps |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['arm']} | {row['ms_per_step']:.0f} | {row['ratio']:.2f} | {row['minutes_per_4500_steps']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
