"""Options of ``fullband serve`` (torch- and FastAPI-free, so ``fullband serve --help`` answers at once)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from fullband.config import (
    HF_PREFIX,
    device_field,
    doc,
    is_int,
    require,
    threads_field,
    validate_device_name,
    validate_threads,
)
from fullband.modes import DecodeOptions, retired_to_decode

API_KEY_ENV = "FULLBAND_API_KEY"
SERVE_DTYPES = ("float32", "bfloat16")


@dataclass
class ServeConfig:
    """Options of ``fullband serve``. A request's own fields (mode, temperature, top_p, top_k, seed)
    win over [decode]; exact_chunk_size is the server's; [decode]'s stop ids end every request besides end-of-text."""

    # the flat options that moved into [decode]: refused with a line naming the new flag (configio)
    ALIASES: ClassVar[dict[str, str]] = retired_to_decode("mode", "prefill_passes", "exact_chunk_size", "temperature")

    checkpoint: str = doc("", f"Model directory (of any model family) or {HF_PREFIX}PATH (required).")
    host: str = doc("127.0.0.1", "Address to listen on (0.0.0.0 for every interface).")
    port: int = doc(8000, "TCP port to listen on (0 = any free port).")
    max_batch: int = doc(16, "Most sequences decoded together in one engine step.")
    max_queue: int = doc(64, "Most requests waiting for a batch slot; beyond it requests get HTTP 429.")
    interleave_prefill: bool = doc(True, "Exact-mode prompts prefill between decoding steps: one token per step "
                                   "(exact_chunk_size 1) or one exact chunk per engine iteration, bit-identical to "
                                   "prefilling the whole prompt first, which false does (a long exact prompt then "
                                   "stalls the running streams).")
    max_tokens: int = doc(16, "Default max_tokens of a request that gives none (the OpenAI default).")
    model_name: str = doc("", "The served model's name: /v1/models and the responses report it, and a request whose "
                          "`model` names another gets 404 (as vLLM's --served-model-name); default: the checkpoint "
                          "directory's name.")
    graceful_timeout: float = doc(10.0, "Shutdown grace: after Ctrl-C / SIGTERM new connections are refused and "
                                  "in-flight requests get this many seconds to finish; the rest are cut off (never "
                                  "marked complete); SIGTERM then exits 0.")
    log_level: str = doc("info", "uvicorn log level: critical | error | warning | info | debug.")
    access_log: bool = doc(False, "Log one line per request (client, method, path, status) on stderr, whatever "
                           "log_level says.")
    device: str = device_field()
    dtype: str = doc("float32", f"Model and KV-cache dtype: one of {SERVE_DTYPES} (bfloat16 halves the memory; fast on "
                     "CUDA and on CPUs with avx512_bf16 or AMX, emulated and slow on other CPUs).")
    threads: str = threads_field()
    max_tokens_limit: int = doc(0, "Largest max_tokens one request may ask for (HTTP 400 beyond it); 0 = only the "
                                "model's context limits it.")
    max_body_bytes: int = doc(1 << 20, "Largest request body in bytes (HTTP 413 beyond it).")
    request_timeout: float = doc(600.0, "Seconds a request may take from arrival to its last token, queueing "
                                 "included; past it the request is cancelled (its slot freed) and answered with HTTP "
                                 "504 (a stream ends with an error event, never a finish_reason). 0 = no deadline.")
    api_key: str = doc("", f"Require `Authorization: Bearer <key>` on every endpoint but /health (HTTP 401 without "
                       f"it); empty = the {API_KEY_ENV} environment variable, and without that no authentication "
                       "(a warning when listening beyond localhost).")
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions(temperature=1.0))  # OpenAI's temperature

    def resolved_api_key(self, environ: Mapping[str, str]) -> str:
        """The key requests must carry: ``api_key``, else ``environ``'s FULLBAND_API_KEY; "" = none."""
        return self.api_key or environ.get(API_KEY_ENV, "")

    def __post_init__(self) -> None:
        require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        require(is_int(self.port) and 0 <= self.port <= 65535, "port", self.port, "must be in 0..65535")
        require(is_int(self.max_batch) and self.max_batch >= 1, "max_batch", self.max_batch, "must be >= 1")
        require(is_int(self.max_queue) and self.max_queue >= 0, "max_queue", self.max_queue, "must be >= 0")
        require(is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be >= 1")
        require(is_int(self.max_tokens_limit) and self.max_tokens_limit >= 0, "max_tokens_limit",
                self.max_tokens_limit, "must be >= 0 (0 = no limit but the model's context)")
        require(self.max_tokens_limit == 0 or self.max_tokens <= self.max_tokens_limit, "max_tokens", self.max_tokens,
                f"the default must not exceed max_tokens_limit={self.max_tokens_limit}")
        require(is_int(self.max_body_bytes) and self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes,
                "must be >= 1024")
        require(isinstance(self.request_timeout, (int, float)) and not isinstance(self.request_timeout, bool)
                and self.request_timeout >= 0, "request_timeout", self.request_timeout,
                "must be >= 0 seconds (0 = no deadline)")
        require(isinstance(self.interleave_prefill, bool), "interleave_prefill", self.interleave_prefill,
                "must be true or false")
        require(isinstance(self.graceful_timeout, (int, float)) and self.graceful_timeout >= 0, "graceful_timeout",
                self.graceful_timeout, "must be >= 0 seconds")
        require(self.log_level in LOG_LEVELS, "log_level", self.log_level, f"must be one of {LOG_LEVELS}")
        require(isinstance(self.access_log, bool), "access_log", self.access_log, "must be true or false")
        require(isinstance(self.api_key, str) and self.api_key == self.api_key.strip(), "api_key", "<hidden>",
                "must be a string without surrounding spaces")
        validate_device_name(self.device)
        require(self.dtype in SERVE_DTYPES, "dtype", self.dtype, f"must be one of {SERVE_DTYPES}")
        self.threads = validate_threads(self.threads)


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
