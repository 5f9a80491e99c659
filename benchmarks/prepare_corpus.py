"""A large corpus end to end: generate ``--gb`` GB of text, ``fullband prepare`` it into token shards (timed, MB/s),
then train 200 steps on the shards and, separately, 200 steps on the embedded Shakespeare corpus, recording each
training process's peak RSS: reading shards through memory maps should cost about what the small corpus does.

The corpus is Shakespeare's speeches resampled with a fixed seed (file ``i`` draws its speeches from
``random.Random(seed * 1_000_003 + i)``), so the same ``--gb`` and ``--seed`` give the same bytes on any machine.
Both training runs use the same model and the same BPE tokenizer (trained on the train split of Shakespeare, saved
in the work directory), so the model's memory is equal and the difference in peak RSS is the data path's.
Peak RSS is the kernel's high-water mark of the process (``getrusage(RUSAGE_CHILDREN)`` read by a wrapper process
around each run), not a sample.

    python benchmarks/prepare_corpus.py                     # 1 GB, 2 prepare workers, 200 steps each
    python benchmarks/prepare_corpus.py --gb 0.02 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
FILE_BYTES = 64 << 20  # generated corpus files of at most this size
# Same model for both runs: small enough that 200 steps take minutes on a CPU, large enough to be a real model.
MODEL = ["--model.d_model", "128", "--model.n_layers", "4", "--model.n_heads", "4", "--train.batch_size", "8",
         "--train.seq_len", "256", "--train.eval_batches", "4", "--train.compile", "false"]

# getrusage(RUSAGE_CHILDREN).ru_maxrss is the peak of the largest waited-for child: run the command as the only
# child of a fresh wrapper, so the figure is that command's (in KiB on Linux).
_WRAPPER = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)")


def run_measured(argv: list[str], log: Path) -> tuple[float, int]:
    """Run ``argv`` (output to ``log``); (wall seconds, peak RSS in bytes). Raises with the log's tail on failure."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-c", _WRAPPER, sys.executable, *argv], stdout=out,
                              stderr=subprocess.PIPE, env=env, text=True)
    seconds = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed:\n" + "\n".join(lines[-15:]))
    return seconds, int(lines[-1]) * 1024


def speeches() -> list[str]:
    sys.path.insert(0, str(SRC))
    from fullband.data import load_corpus

    pieces = [p.strip("\n") + "\n\n" for play in load_corpus("shakespeare", "train") for p in play.split("\n\n")]
    return [p for p in pieces if p.strip()]


def generate_corpus(directory: Path, total_bytes: int, seed: int) -> int:
    """Write about ``total_bytes`` of resampled speeches into ``directory`` (part_NNNN.txt); returns the bytes."""
    directory.mkdir(parents=True)
    pool = speeches()
    written = 0
    for i in range(math.ceil(total_bytes / FILE_BYTES)):
        rng = random.Random(seed * 1_000_003 + i)
        target, parts, size = min(FILE_BYTES, total_bytes - written), [], 0
        while size < target:
            batch = rng.choices(pool, k=1024)
            parts.extend(batch)
            size += sum(len(p) for p in batch)  # the speeches are ASCII: characters are bytes
        data = "".join(parts)[:target]
        (directory / f"part_{i:04d}.txt").write_text(data[: data.rfind("\n") + 1] or data)
        written += (directory / f"part_{i:04d}.txt").stat().st_size
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="corpus size in GB (1e9 bytes)")
    parser.add_argument("--workers", type=int, default=2, help="fullband prepare --workers")
    parser.add_argument("--steps", type=int, default=200, help="training steps of each run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", default="auto", help="--threads of the training runs")
    parser.add_argument("--work_dir", default=None, help="where corpus, shards and runs go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fullband-prepare-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        corpus_bytes = generate_corpus(work / "corpus", int(args.gb * 1e9), args.seed)
        print(f"corpus: {corpus_bytes / 1e6:,.1f} MB in {len(list((work / 'corpus').iterdir()))} files, generated in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        sys.path.insert(0, str(SRC))
        from fullband.data import load_corpus, train_bpe

        train_bpe(load_corpus("shakespeare", "train"), vocab_size=4096).save(work / "tokenizer")
        tokenizer = ["--data.tokenizer", f"hf:{work / 'tokenizer'}"]

        prep_s, prep_rss = run_measured(
            ["-m", "fullband.cli", "prepare", "--input", str(work / "corpus"), "--out_dir", str(work / "shards"),
             "--tokenizer", f"hf:{work / 'tokenizer'}", "--workers", str(args.workers), "--progress", "false"],
            work / "prepare.log")
        index = json.loads((work / "shards" / "index.json").read_text())
        rate = corpus_bytes / 1e6 / prep_s
        print(f"prepare: {prep_s:.1f} s, {rate:.2f} MB/s with {args.workers} workers (process start included), "
              f"{index['splits']['train']['tokens']:,} train tokens in {len(index['splits']['train']['shards'])} "
              f"shard(s), {index['dtype']}", flush=True)

        runs = {}
        for name, source in (("shards", str(work / "shards")), ("shakespeare", "shakespeare")):
            argv = ["-m", "fullband.cli", "train", "--data.source", source, "--out_dir", str(work / f"run-{name}"),
                    "--train.max_steps", str(args.steps), "--threads", args.threads, *MODEL]
            if name == "shakespeare":
                argv += tokenizer
            seconds, rss = run_measured(argv, work / f"train-{name}.log")
            runs[name] = {"seconds": seconds, "peak_rss_bytes": rss}
            print(f"train on {name}: {seconds:.1f} s, peak RSS {rss / 2**20:,.0f} MiB", flush=True)

        mib = {name: run["peak_rss_bytes"] / 2**20 for name, run in runs.items()}
        diff = runs["shards"]["peak_rss_bytes"] - runs["shakespeare"]["peak_rss_bytes"]
        rows = [("corpus", f"{corpus_bytes / 1e9:.3f} GB"),
                ("prepare throughput", f"{rate:.2f} MB/s ({args.workers} workers, {prep_s:.1f} s)"),
                ("prepare peak RSS", f"{prep_rss / 2**20:,.0f} MiB (the largest of its processes)"),
                (f"train {args.steps} steps on shards", f"peak RSS {mib['shards']:,.0f} MiB"),
                (f"train {args.steps} steps on shakespeare", f"peak RSS {mib['shakespeare']:,.0f} MiB"),
                ("shards - shakespeare", f"{diff / 2**20:+,.0f} MiB (target: within 1.5 GB)")]
        width = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"{k:<{width}}  {v}" for k, v in rows))
        if args.json:
            Path(args.json).write_text(json.dumps({
                "gb": args.gb, "corpus_bytes": corpus_bytes, "workers": args.workers, "steps": args.steps,
                "prepare_seconds": prep_s, "prepare_mb_per_s": rate, "prepare_peak_rss_bytes": prep_rss,
                "train_tokens": index["splits"]["train"]["tokens"], "runs": runs, "rss_difference_bytes": diff,
                "cpu_count": os.cpu_count()}, indent=2) + "\n")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
