"""Load test of ``fullband serve``: a real server (the CLI, in its own process, on a free port) under concurrent
clients, against the same requests sent one at a time, and soft vs standard per-token cost through the server.

The model is a random native FullBandwidthLM with feedback (size printed; prompts are token ids, so no tokenizer
and no end-of-sequence: every request generates exactly ``--max_tokens``). Clients are async httpx in this
process, so they share the machine's cores with the server, as a co-located load generator does.

Phases, in order, each timed by wall clock around the whole phase:

1. warm-up (``--clients`` concurrent clients x 2 requests), then the server's RSS;
2. ``--sequential`` requests one at a time -> the one-at-a-time tokens/s;
3. ``--scale_clients`` concurrent clients x ``--requests`` requests -> tokens/s (target: >= 6x phase 2);
4. ``--clients`` concurrent clients x ``--requests`` requests -> errors (target 0), RSS after the run against
   after warm-up (target: within 10%), peak RSS over the whole run;
5. soft vs standard: ``--scale_clients`` concurrent clients x ``--mode_requests`` requests in each mode, in
   ``--mode_rounds`` interleaved rounds (standard, soft, standard, ...). Per-token cost = phase wall-clock
   seconds / generated tokens, and the server process's CPU seconds / generated tokens (which other jobs on a
   shared machine disturb far less). Reported: the best of the rounds per mode, the ratio of the medians, and
   the median of the per-round ratios (each round's soft phase follows its standard phase, so the pair shares
   the machine's load); target: soft <= 1.05x standard;
6. inter-token latency: ``--itl_clients`` streaming clients x ``--itl_requests`` short requests (``--itl_tokens``
   each), alone and then while one exact-mode request with a ``--long_prompt``-token prompt prefills; the gaps
   between a stream's tokens are pooled, those of the second run only while the long request is in flight ->
   p99 with it / p99 without it (target: <= 2x).

    OMP_NUM_THREADS=1 python benchmarks/serve_load.py                # 64 x 20, 16 x 20, 8 streams + 1000 tokens
    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --clients 4 --requests 2 --scale_clients 2 --sequential 4 \
        --mode_rounds 1 --mode_requests 1 --itl_clients 2 --itl_requests 2 --long_prompt 100   # a smoke run
    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.experiments.core.report import table_lines
from fullband.files import write_json

SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RSSMonitor:
    """Samples the server's resident set size every 20 ms; ``peak`` over the run, ``now()`` on demand."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        rss = self.process.memory_info().rss
        self.peak = max(self.peak, rss)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.now()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def one_request(client: httpx.AsyncClient, body: dict) -> tuple[float, int, bool]:
    """(latency s, completion tokens, ok)."""
    start = time.perf_counter()
    try:
        response = await client.post("/v1/completions", json=body)
        ok = response.status_code == 200
        tokens = response.json()["usage"]["completion_tokens"] if ok else 0
    except httpx.HTTPError:
        ok, tokens = False, 0
    return time.perf_counter() - start, tokens, ok


async def load(url: str, clients: int, requests: int, body: dict) -> dict:
    """``clients`` concurrent clients, each sending ``requests`` requests back to back."""
    results: list[tuple[float, int, bool]] = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def worker(w: int) -> None:
            for r in range(requests):
                prompt = [(7 * w + 13 * r + k) % body["vocab"] for k in range(body["prompt_len"])]
                payload = {"prompt": prompt, "max_tokens": body["max_tokens"], "temperature": 0,
                           "mode": body["mode"]}
                results.append(await one_request(client, payload))

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        seconds = time.perf_counter() - start
    latencies = sorted(lat for lat, _, ok in results if ok)
    tokens = sum(t for _, t, _ in results)
    return {
        "clients": clients, "requests": len(results), "seconds": seconds, "errors": sum(not ok for *_, ok in results),
        "requests_per_s": len(results) / seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
        "p50_latency_s": percentile(latencies, 50), "p99_latency_s": percentile(latencies, 99),
    }


async def stream_gaps(client: httpx.AsyncClient, payload: dict) -> tuple[list[tuple[float, float]], bool]:
    """((time of a token, gap since the previous token) for every token after the first, ok) of one stream."""
    gaps, last, ok = [], None, False
    try:
        async with client.stream("POST", "/v1/completions", json={**payload, "stream": True}) as response:
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    ok = response.status_code == 200
                elif line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append((now, now - last))
                    last = now
    except httpx.HTTPError:
        ok = False
    return gaps, ok


async def latency_phase(url: str, args: argparse.Namespace, body: dict, long_prompt: bool) -> dict:
    """Inter-token gaps of ``--itl_clients`` short streams, alone or while one long exact-mode prompt prefills
    (then only the gaps while that request is in flight count)."""
    limits = httpx.Limits(max_connections=args.itl_clients + 4, max_keepalive_connections=args.itl_clients + 4)
    window = [0.0, float("inf")]
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def streams(w: int) -> tuple[list[tuple[float, float]], int]:
            gaps, errors, r = [], 0, 0
            # Beside the long request the streams keep coming until it is done, so every step of its prefill counts.
            while r < args.itl_requests or (long_prompt and window[1] == float("inf")):
                r += 1
                prompt = [(11 * w + 3 * r + k) % body["vocab"] for k in range(body["prompt_len"])]
                got, ok = await stream_gaps(client, {"prompt": prompt, "max_tokens": args.itl_tokens,
                                                     "temperature": 0, "mode": body["mode"]})
                gaps += got
                errors += not ok
            return gaps, errors

        async def long_request() -> bool:
            await asyncio.sleep(0.05 * args.itl_tokens / 64)  # once the streams are flowing
            prompt = [(5 * k + 1) % body["vocab"] for k in range(args.long_prompt)]
            window[0] = time.perf_counter()
            _, _, ok = await one_request(client, {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                                  "mode": "exact"})
            window[1] = time.perf_counter()
            return ok

        jobs = [streams(w) for w in range(args.itl_clients)] + ([long_request()] if long_prompt else [])
        done = await asyncio.gather(*jobs)
    per_stream = done[: args.itl_clients]
    gaps = sorted(gap * 1e3 for stream, _ in per_stream for at, gap in stream if window[0] <= at <= window[1])
    result = {"gaps": len(gaps), "p50_ms": percentile(gaps, 50), "p99_ms": percentile(gaps, 99),
              "errors": sum(e for _, e in per_stream)}
    if long_prompt:
        result.update(long_request_s=window[1] - window[0], long_request_ok=bool(done[-1]))
    return result


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))  # nearest rank
    return sorted_values[index]


def server_cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of the server process and its threads so far (other processes' load aside)."""
    times = process.cpu_times()
    return times.user + times.system


def mode_ratios(per_token: dict[str, list[float]]) -> dict:
    """soft / standard per-token cost: best of the rounds, the medians, and the median of the per-round ratios
    (each round's soft phase runs right after its standard phase, so the pair shares the machine's load)."""
    paired = [soft / std for std, soft in zip(per_token["standard"], per_token["soft"], strict=True)]
    return {
        "standard_best_ms": min(per_token["standard"]) * 1e3, "soft_best_ms": min(per_token["soft"]) * 1e3,
        "best": min(per_token["soft"]) / min(per_token["standard"]),
        "median": statistics.median(per_token["soft"]) / statistics.median(per_token["standard"]),
        "paired_median": statistics.median(paired), "paired": paired,
    }


def start_server(checkpoint: Path, port: int, max_batch: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "fullband.cli", "serve", "--checkpoint", str(checkpoint), "--port", str(port),
           "--max_batch", str(max_batch), "--max_queue", "1024", "--log_level", "warning"]
    process = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--scale_clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    parser.add_argument("--sequential", type=int, default=40, help="requests sent one at a time (the baseline)")
    parser.add_argument("--max_tokens", type=int, default=32)
    parser.add_argument("--prompt_len", type=int, default=16)
    parser.add_argument("--max_batch", type=int, default=32)
    parser.add_argument("--mode", default="soft")
    parser.add_argument("--mode_rounds", type=int, default=10, help="interleaved rounds of the soft/standard phase")
    parser.add_argument("--mode_requests", type=int, default=3, help="requests per client in each of those rounds")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--n_layers", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--itl_clients", type=int, default=8, help="streaming clients of the latency phase")
    parser.add_argument("--itl_requests", type=int, default=4, help="short streaming requests per such client")
    parser.add_argument("--itl_tokens", type=int, default=64, help="max_tokens of each short streaming request")
    parser.add_argument("--long_prompt", type=int, default=1000, help="prompt tokens of the exact-mode request")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                        help="torch threads of the server")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    config = ModelConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.n_layers,
                         n_heads=max(args.d_model // 64, 1), max_seq_len=max(256, args.long_prompt + 64),
                         feedback=True)
    torch.manual_seed(0)
    model = FullBandwidthLM(config)
    params = model.num_parameters()
    body = {"vocab": args.vocab_size, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "mode": args.mode}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(Path(tmp) / "model")
        del model
        port = free_port()
        server = start_server(Path(tmp) / "model", port, args.max_batch, args.threads)
        url = f"http://127.0.0.1:{port}"
        monitor = RSSMonitor(server.pid)
        try:
            warmup = asyncio.run(load(url, args.clients, 2, body))  # the full run's shape, so its caches exist
            rss_warm = monitor.now()
            sequential = asyncio.run(load(url, 1, args.sequential, body))
            scaled = asyncio.run(load(url, args.scale_clients, args.requests, body))
            full = asyncio.run(load(url, args.clients, args.requests, body))
            time.sleep(0.5)  # let the last responses' buffers go
            rss_after = monitor.now()
            per_token: dict[str, list[float]] = {"standard": [], "soft": []}
            cpu_per_token: dict[str, list[float]] = {"standard": [], "soft": []}
            for _ in range(args.mode_rounds):
                for mode in ("standard", "soft"):
                    cpu_before = server_cpu_seconds(monitor.process)
                    run = asyncio.run(load(url, args.scale_clients, args.mode_requests, {**body, "mode": mode}))
                    per_token[mode].append(run["seconds"] / run["tokens"])
                    cpu_per_token[mode].append((server_cpu_seconds(monitor.process) - cpu_before) / run["tokens"])
            itl = {"alone": asyncio.run(latency_phase(url, args, body, long_prompt=False)),
                   "beside_exact_prefill": asyncio.run(latency_phase(url, args, body, long_prompt=True))}
            time.sleep(0.5)
            rss_end = monitor.now()  # after every phase: a leak would keep growing here
        finally:
            monitor.stop()
            server.terminate()
            server.wait(60)

    soft_cost = {"wall": mode_ratios(per_token), "server_cpu": mode_ratios(cpu_per_token)}
    results = {
        "model": {"params": params, "d_model": args.d_model, "n_layers": args.n_layers, "vocab_size": args.vocab_size,
                  "max_seq_len": config.max_seq_len},
        "settings": {k: getattr(args, k) for k in ("clients", "scale_clients", "requests", "sequential", "max_tokens",
                                                   "prompt_len", "max_batch", "mode", "threads", "mode_rounds",
                                                   "mode_requests", "itl_clients", "itl_requests", "itl_tokens",
                                                   "long_prompt")},
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
        "warmup": warmup, "sequential": sequential, "scaled": scaled, "full": full,
        "rss_mb": {"after_warmup": rss_warm / 2**20, "after_run": rss_after / 2**20, "at_end": rss_end / 2**20,
                   "peak": monitor.peak / 2**20},
        "per_token_ms": {"wall": {m: [x * 1e3 for x in v] for m, v in per_token.items()},
                         "server_cpu": {m: [x * 1e3 for x in v] for m, v in cpu_per_token.items()}},
        "soft_over_standard": soft_cost,
        "inter_token_latency": itl,
    }
    results["itl_p99_ratio"] = itl["beside_exact_prefill"]["p99_ms"] / itl["alone"]["p99_ms"]
    results["speedup_scaled_vs_sequential"] = scaled["tokens_per_s"] / sequential["tokens_per_s"]
    results["rss_growth"] = rss_after / rss_warm - 1
    print_table(results)
    if args.json:
        write_json(Path(args.json), results)


def print_table(r: dict) -> None:
    m, s = r["model"], r["settings"]
    print(f"model: native FullBandwidthLM with feedback, {m['params'] / 1e6:.1f}M parameters (d_model {m['d_model']}, "
          f"{m['n_layers']} layers, vocab {m['vocab_size']}); server torch threads {s['threads']}, "
          f"max_batch {s['max_batch']}; prompt {s['prompt_len']} tokens, max_tokens {s['max_tokens']}, "
          f"mode {s['mode']}, greedy")
    print()
    rows = [[name, f"{x['clients']} x {x['requests'] // x['clients']}", f"{x['requests_per_s']:.2f}",
             f"{x['tokens_per_s']:.0f}", f"{x['p50_latency_s']:.3f}", f"{x['p99_latency_s']:.3f}", x["errors"]]
            for name, x in ((name, r[name]) for name in ("sequential", "scaled", "full"))]
    print("\n".join(table_lines(["run", "clients x requests", "requests/s", "tokens/s", "p50 latency s",
                                 "p99 latency s", "errors"], rows, compact=True)))
    print()
    rss = r["rss_mb"]
    print(f"tokens/s at {r['scaled']['clients']} clients / one at a time: {r['speedup_scaled_vs_sequential']:.2f}x "
          "(target >= 6x)")
    print(f"server RSS: after warm-up {rss['after_warmup']:.0f} MB, after the {r['full']['clients']}-client run "
          f"{rss['after_run']:.0f} MB ({100 * r['rss_growth']:+.1f}%, target within 10%), after every phase "
          f"{rss['at_end']:.0f} MB, peak {rss['peak']:.0f} MB")
    clients = r["scaled"]["clients"]
    for kind, label in (("wall", "wall clock"), ("server_cpu", "server CPU time")):
        x = r["soft_over_standard"][kind]
        print(f"per-token cost through the server, {label} ({clients} clients, {len(x['paired'])} rounds): standard "
              f"{x['standard_best_ms']:.3f} ms, soft {x['soft_best_ms']:.3f} ms (best) -> soft/standard "
              f"{x['best']:.3f}x; ratio of the medians {x['median']:.3f}x; median per-round ratio "
              f"{x['paired_median']:.3f}x (target <= 1.05x)")
    alone, beside = r["inter_token_latency"]["alone"], r["inter_token_latency"]["beside_exact_prefill"]
    print(f"inter-token latency of {s['itl_clients']} streams ({s['itl_tokens']} tokens each): p50/p99 "
          f"{alone['p50_ms']:.2f}/{alone['p99_ms']:.2f} ms alone ({alone['gaps']} gaps), "
          f"{beside['p50_ms']:.2f}/{beside['p99_ms']:.2f} ms while a {s['long_prompt']}-token exact prompt prefills "
          f"({beside['gaps']} gaps, the long request took {beside['long_request_s']:.2f} s) -> p99 ratio "
          f"{r['itl_p99_ratio']:.2f}x (target <= 2x); stream errors {alone['errors'] + beside['errors']}, long "
          f"request {'ok' if beside['long_request_ok'] else 'FAILED'}")

if __name__ == "__main__":
    main()
