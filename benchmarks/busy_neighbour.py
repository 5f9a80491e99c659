"""How much a training run slows down beside one busy process, by torch thread count (issue 14's "Threads").

Each job is a fresh process that sets its threads the way every fullband command does
(``fullband.devices.apply_threads``: a count, or ``auto``) and then times training steps at nanoGPT's CPU config
(4 layers, 4 heads, 128 wide, batch 12 x 64, byte vocabulary; bare AdamW steps, as ``fullband bench`` times them).
The neighbour is another process multiplying matrices on one thread without pause. Every job runs once quiet and
once beside the neighbour, the two interleaved, ``--rounds`` times; the table gives median seconds and the ratio
busy / quiet, and, since a user compares against the fastest quiet setting, busy / best quiet.

    OMP_NUM_THREADS= python benchmarks/busy_neighbour.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

JOB = """
import sys, time, torch
from fullband.bench import steps
from fullband.devices import apply_threads
threads = apply_threads(sys.argv[1])
torch.manual_seed(0)
model, tokens = steps.train_model()
optimizer, params = steps.adamw(model), list(model.parameters())
step = lambda: steps.optimizer_step(steps.fullband_loss(model, tokens), optimizer, params)
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    step()
print(threads, time.perf_counter() - start)
"""

NEIGHBOUR = """
import torch
torch.set_num_threads(1)
a = torch.randn(512, 512)
while True:
    a = (a @ a).tanh()
"""


def run_job(threads: str, n_steps: int) -> tuple[int, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # let the job choose, as a user's would
    out = subprocess.run([sys.executable, "-c", JOB, threads, str(n_steps)], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="1,2,auto", help="thread settings to compare (comma-separated)")
    parser.add_argument("--steps", type=int, default=40, help="timed training steps per job")
    parser.add_argument("--rounds", type=int, default=3, help="quiet/busy pairs per setting")
    args = parser.parse_args()
    settings = args.settings.split(",")
    times: dict[tuple[str, str], list[float]] = {}
    chosen: dict[tuple[str, str], set[int]] = {}
    for r in range(args.rounds):
        for setting in settings:
            for state in ("quiet", "busy") if r % 2 == 0 else ("busy", "quiet"):
                neighbour = None
                if state == "busy":
                    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
                    time.sleep(1.0)  # running before the job starts, as a real neighbour would be
                try:
                    threads, seconds = run_job(setting, args.steps)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
                times.setdefault((setting, state), []).append(seconds)
                chosen.setdefault((setting, state), set()).add(threads)
    best_quiet = min(statistics.median(times[(s, "quiet")]) for s in settings)
    print(f"# busy neighbour: {os.cpu_count()} cores, {args.steps} training steps per job (nanoGPT CPU config), "
          f"median of {args.rounds} interleaved quiet/busy pairs; load average at end {os.getloadavg()}")
    print(f"{'threads':>8} {'used quiet':>10} {'used busy':>9} {'quiet s':>8} {'busy s':>8} {'busy/quiet':>10} "
          f"{'busy/best quiet':>15}")
    for setting in settings:
        quiet, busy = (statistics.median(times[(setting, state)]) for state in ("quiet", "busy"))
        used = {state: ",".join(map(str, sorted(chosen[(setting, state)]))) for state in ("quiet", "busy")}
        print(f"{setting:>8} {used['quiet']:>10} {used['busy']:>9} {quiet:8.2f} {busy:8.2f} {busy / quiet:10.2f} "
              f"{busy / best_quiet:15.2f}")


if __name__ == "__main__":
    main()
