"""What the HTTP layer's parts share (:class:`ServerState`): the engine, the tokenizer, the served model's name, what a
request that leaves a field out gets (:class:`Defaults`), what one request may ask for (:class:`Limits`) and the
Prometheus metrics. Each route group (fullband.serve.routes) takes it as its one argument, instead of closing over
``create_app``'s locals."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fullband.data.tokenizer import Tokenizer
from fullband.modes import DecodeOptions
from fullband.serve.engine import Engine
from fullband.serve.schema import APIError


@dataclass
class Defaults:
    """What a request that leaves a field out gets (``fullband serve``'s options)."""

    # mode, sampling settings (OpenAI's default temperature), stop ids besides end-of-text
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions(temperature=1.0))
    max_tokens: int = 16


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (``fullband serve``'s options): beyond them it gets a 400 or a 413."""

    max_tokens: int = 0  # largest max_tokens a request may ask for; 0 = only the model's context limits it
    max_body_bytes: int = 1 << 20  # largest request body (by its Content-Length)
    request_timeout: float = 600.0  # seconds from arrival to the last token (queueing included); 0 = no deadline


class Metrics:
    """The server's Prometheus metrics: requests by endpoint and status, latency, and the engine's gauges."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("fullband_requests", "HTTP requests by endpoint and status.", ["endpoint", "status"],
                                registry=self.registry)
        self.latency = Histogram("fullband_request_latency_seconds", "Time from request to last token.",
                                 ["endpoint"], registry=self.registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.registry.register(_EngineCollector(engine))

    def answered(self, endpoint: str, status: int | str) -> None:
        self.requests.labels(endpoint, str(status)).inc()


@dataclass
class ServerState:
    """Everything the routes read; made once by ``create_app``."""

    engine: Engine
    tokenizer: Tokenizer | None
    model_name: str
    defaults: Defaults
    limits: Limits
    metrics: Metrics
    api_key: str | None = None  # every path but /health needs `Authorization: Bearer <api_key>`; None = open
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_tokens_allowed(self) -> int:
        """The most tokens a request may ask for: the server's cap, else what the context leaves after a one-token
        prompt (fullband.context)."""
        return self.limits.max_tokens or self.engine.context - 1

    def error_response(self, request: Request, err: APIError) -> JSONResponse:
        """``err`` in OpenAI's error body, counted in the metrics."""
        self.metrics.answered(request.url.path, err.status)
        # A full queue drains within a few decoding steps: tell clients to retry soon rather than give up.
        headers = {"Retry-After": "1"} if err.status == 429 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)


class _EngineCollector:
    """Engine gauges and counters, read at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Any:
        e = self.engine
        yield GaugeMetricFamily("fullband_queue_depth", "Requests waiting for a batch slot.", value=e.queue_depth)
        yield GaugeMetricFamily("fullband_batch_size", "Sequences decoding now (the current batch).", value=e.active)
        yield CounterMetricFamily("fullband_engine_steps", "Batched decoding steps.", value=e.steps)
        yield CounterMetricFamily("fullband_engine_rows", "Rows over all steps (mean batch = rows / steps).",
                                  value=e.rows_stepped)
        yield CounterMetricFamily("fullband_generated_tokens", "Tokens generated.", value=e.tokens_generated)
        yield CounterMetricFamily("fullband_prompt_tokens", "Prompt tokens prefilled.", value=e.prompt_tokens)
        yield CounterMetricFamily("fullband_failed_sequences", "Sequences ended by an engine error.", value=e.failed)
        yield CounterMetricFamily("fullband_prefills", "Prefill forwards (one per group of arrivals).",
                                  value=e.prefills)
        yield CounterMetricFamily("fullband_batched_prefills", "Prefill forwards that took several requests at once.",
                                  value=e.batched_prefills)
        yield CounterMetricFamily("fullband_interleaved_prompt_tokens",
                                  "Exact-mode prompt tokens fed inside decoding steps (sequential exact prefill "
                                  "interleaved with the running streams).", value=e.interleaved_prompt_tokens)
        yield CounterMetricFamily("fullband_prefill_chunks", "Exact Jacobi prompt chunks prefilled one per engine "
                                  "iteration, between decoding steps (exact_chunk_size > 1).", value=e.prefill_chunks)
