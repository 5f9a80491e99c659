"""Long fuzzing run of ``fullband serve`` from its own OpenAPI schema (schemathesis, the ``dev`` extra).

Every documented operation gets ``--examples`` requests that fit its schema and, where it takes a body,
``--examples`` that do not, sent in process over ASGI to the real app over a tiny random model (with the byte
tokenizer, so text prompts and chat run too; ``--no_tokenizer`` serves token ids only), every response through every
schemathesis check (``st run --checks all``). Prints the counts by operation, mode and status and the checks' failures
by code; exits 1 on any 5xx (an engine error inside a stream counts as one), on an undocumented status or content
type or a schema-valid request refused (ST103, ST105, ST202), on fewer than ``--min_requests`` requests, or when
/health does not answer 200 afterwards.

    OMP_NUM_THREADS=1 python benchmarks/serve_fuzz.py                 # >= 500 requests, 0 5xx required
    OMP_NUM_THREADS=1 python benchmarks/serve_fuzz.py --examples 500 --seed 1 --json fuzz.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.data import ByteTokenizer
from fullband.experiments.core.report import table_lines
from fullband.serve.app import Defaults, Limits, create_app
from fullband.serve.engine import Engine
from fullband.serve.fuzz import fuzz_app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=130, help="requests per operation and mode")
    parser.add_argument("--min_requests", type=int, default=500, help="fail when fewer requests were sent")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (the run is reproducible from it)")
    parser.add_argument("--max_seq_len", type=int, default=1024, help="the model's context (a text prompt longer "
                        "than it gets 400, which the schema cannot foresee)")
    parser.add_argument("--no_tokenizer", action="store_true", help="serve token ids only")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = FullBandwidthLM(ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                        max_seq_len=args.max_seq_len))
    tokenizer = None if args.no_tokenizer else ByteTokenizer()
    app = create_app(Engine(model, max_batch=8, max_queue=16), tokenizer, "tiny", Defaults(max_tokens=8),
                     limits=Limits(max_tokens=8))
    began = time.perf_counter()
    report = fuzz_app(app, args.examples, args.seed)
    seconds = time.perf_counter() - began

    print(f"{report.requests} generated requests in {seconds:.0f} s (seed {args.seed}, {args.examples} per operation "
          f"and mode, tokenizer: {'none' if tokenizer is None else 'bytes'})\n")
    print("\n".join(table_lines(["operation", "mode", "status", "requests"],
                                 [[*key, n] for key, n in sorted(report.counts.items())], compact=True)))
    statuses = report.by_status()
    fivexx = sum(n for status, n in statuses.items() if status >= 500)
    print(f"\nby status: {statuses}; 5xx: {fivexx} (target 0); /health afterwards: {report.health_after}")
    print(f"schemathesis check failures by code: {dict(report.check_failures) or 'none'}")
    for code, example in report.check_examples.items():
        print(f"  {code}: {example}")
    for operation, body, status, text in report.failures[:10]:
        print(f"\nFAIL {operation} -> {status}: {json.dumps(body, default=str)[:400]}\n  {text[:400]}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "seed": args.seed, "examples": args.examples, "requests": report.requests, "seconds": seconds,
            "by_status": {str(k): v for k, v in statuses.items()},
            "counts": [{"operation": o, "mode": m, "status": s, "requests": n}
                       for (o, m, s), n in sorted(report.counts.items())],
            "failures": [{"operation": o, "body": json.dumps(b, default=str), "status": s, "text": t}
                         for o, b, s, t in report.failures],
            "health_after": report.health_after, "check_failures": dict(report.check_failures),
        }, indent=2))
    undocumented = sum(report.check_failures[code] for code in ("ST103", "ST105", "ST202"))
    ok = fivexx == 0 and not undocumented and report.requests >= args.min_requests and report.health_after == 200
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
