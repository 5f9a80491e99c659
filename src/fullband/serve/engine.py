"""The serving engine: continuous batching over :mod:`fullband.generation.decoding`, no HTTP.

One background thread owns every active sequence. Each loop iteration it

1. admits queued requests up to ``max_batch``: arrivals whose prefills are the same computation are prefilled
   together in one left-padded forward (standard and soft prompts, and the first token of a sequential exact
   prompt, in one plain pass; fused prompts by their pass count), and each samples its first token;
2. decodes every active sequence in one forward per lane; a sequential exact prompt feeds its remaining tokens
   here, one per step, as fused decoding with the prompt's tokens in place of sampled ones, which is the
   sequential exact prefill itself (the same forwards: bit-identical alone), so a long exact prompt never stalls
   the running streams. Rows still feeding a prompt form their own lane (batch), so a long prompt's cache never
   pads the streams' rows;
3. hands each sequence its token and retires the finished and the cancelled at once.

A sequence's decoding state is its KV cache rows plus its last carried state ``h`` (DESIGN.md §4). A batch
keeps the rows right-aligned in one cache (left padding, as batched decoding does), so a row at any length decodes
next to any other; whenever the membership changes the rows are copied into a fresh cache whose padded length is
the longest row's, which keeps it within the model context (the cache's own ``gather_rows``: the native KVCache and
a retrofitted model's cache alike). Each step is :func:`fullband.generation.decoding.decode_step` over the batch, or
with ``decode_step="static"`` / ``"compiled"`` ([decode].step) the static step of :mod:`fullband.generation.static`
(a native model): each batch then decodes in a preallocated cache of a fixed capacity, compiled and on CUDA replayed
as a CUDA graph.
Modes mix in one step: a row is fused (soft, fused, exact) or plain (standard, ``DecodeState.plain_rows``), with
its own carried state. Greedy tokens are those of the same request decoded alone (``tests/serve`` checks it).

A model whose cache rows cannot be gathered (a transformers cache with sliding-window layers) decodes each sequence
as its own batch of one, in the same loop.
"""

from __future__ import annotations

import collections
import itertools
import logging
import secrets
import threading
from collections.abc import Sequence

import torch

from fullband.generation.decoding import decode_step
from fullband.generation.sampling import is_greedy, sample_next
from fullband.generation.state import DecodeState
from fullband.generation.static import StaticPool, supports_static
from fullband.model import FeedbackLM
from fullband.modes import torch_seed
from fullband.serve.batching import gather_rows, release_free_memory
from fullband.serve.prefill import Admission, ChunkedPrefill, PrefillBatch, SequentialPrefill
from fullband.serve.requests import (
    MAX_TOP_LOGPROBS,
    Event,
    FinishEvent,
    GenerationRequest,
    Handle,
    Listener,
    QueueFull,
    RequestError,
    TokenEvent,
    validate_request,
)

log = logging.getLogger("fullband.serve")

__all__ = ["MAX_TOP_LOGPROBS", "Engine", "FinishEvent", "GenerationRequest", "Handle", "QueueFull", "RequestError",
           "TokenEvent"]



class Engine(Admission):
    """Continuous batching over one model. Thread-safe :meth:`submit`; events go to each request's listener
    (called on the engine thread: keep it short and non-blocking)."""

    def __init__(self, model: FeedbackLM, max_batch: int = 16, max_queue: int = 64, exact_chunk_size: int = 1,
                 interleave_prefill: bool = True, decode_step: str = "eager") -> None:
        self.model = model
        # The static / compiled decode step ([decode].step, generation.static) where the model has it, else eager.
        self._static = StaticPool(model, compiled=decode_step == "compiled") \
            if decode_step != "eager" and supports_static(model) else None
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.exact_chunk_size = exact_chunk_size
        self.interleave_prefill = interleave_prefill
        # Whether rows of this model's cache can be gathered into one batch cache (the cache's gather_rows); if not,
        # each sequence decodes as its own batch of one.
        self.regroups = model.new_cache(1, 1).can_gather_rows()
        self.device = model.embed.weight.device
        self.vocab_size = int(model.config.vocab_size)
        self.context = int(model.config.max_seq_len)
        self._pending: collections.deque[SequentialPrefill] = collections.deque()
        self._batches: list[PrefillBatch] = []
        self._admitting: list[SequentialPrefill] = []  # taken from the queue, not yet in a batch: they hold slots too
        self._chunked: list[ChunkedPrefill] = []  # exact prompts being prefilled chunk by chunk: they hold slots too
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        # Read by the metrics endpoint (plain ints: a racy read is fine for a gauge).
        self.steps = 0
        self.rows_stepped = 0
        self.tokens_generated = 0
        self.prompt_tokens = 0
        self.failed = 0
        self.prefills = 0  # prefill forwards (one per group of arrivals)
        self.batched_prefills = 0  # ... of which prefilled more than one request at once
        self.interleaved_prompt_tokens = 0  # exact-mode prompt tokens fed inside decoding steps
        self.prefill_chunks = 0  # exact Jacobi chunks prefilled one per engine iteration

    # ------------------------------------------------------------------ public

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        running = itertools.chain(self._admitting, (c.seq for c in list(self._chunked)),
                                  *(b.sequences for b in list(self._batches)))
        return sum(not s.done for s in running)

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="fullband-engine", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is queued or running (listeners get FinishEvent("cancelled")) and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def validate(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` as it runs (max_tokens cut at the context's end, fullband.context), or :class:`RequestError`
        naming the field for anything the model cannot run."""
        return validate_request(request, self.vocab_size, self.context)

    def submit(self, requests: Sequence[GenerationRequest], listeners: Sequence[Listener]) -> list[Handle]:
        """Queue ``requests`` together (all or none); raises RequestError, or QueueFull when there is no room."""
        requests = [self.validate(request) for request in requests]
        handles = [Handle(self._wake) for _ in requests]
        with self._cond:
            if self._closing:
                raise QueueFull("the server is shutting down")
            free_slots = max(self.max_batch - self.active, 0)
            if len(self._pending) + len(requests) > self.max_queue + free_slots:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting, {self.max_batch} decoding): retry later")
            for request, listener, handle in zip(requests, listeners, handles, strict=True):
                seed = request.decode.seed if request.decode.seed is not None else secrets.randbits(63)
                generator = torch.Generator(device=self.device).manual_seed(torch_seed(seed))
                self._pending.append(SequentialPrefill(request, listener, handle, generator))
            self._cond.notify_all()
        return handles

    # ------------------------------------------------------------------ the loop

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # grad mode is per thread
        while True:
            if not self._pending and not self._batches and not self._chunked:
                release_free_memory()  # idle: hand the batch caches' freed memory back to the OS
            with self._cond:
                while not self._closing and not self._pending and not self._batches and not self._chunked:
                    self._cond.wait()
                if self._closing:
                    break
                # A request cancelled while queued (its deadline passed, its client left) gives its place back now.
                dropped = [s for s in self._pending if s.handle.cancelled]
                if dropped:
                    self._pending = collections.deque(s for s in self._pending if not s.handle.cancelled)
                arrivals = []
                while self._pending and self.active + len(arrivals) < self.max_batch:
                    arrivals.append(self._pending.popleft())
                self._admitting = arrivals
            for seq in dropped:
                self._finish(seq, "cancelled")
            try:
                self._iteration(arrivals)
            except Exception as err:  # a bug, not a bad request (those are validated): fail what is running
                log.exception("engine step failed; failing the active sequences")
                for seq in itertools.chain(arrivals, self._running()):
                    if not seq.done:
                        self._finish(seq, "error", f"internal error: {err}")
                self._batches, self._chunked = [], []
        with self._cond:
            left = list(self._pending)
            self._pending.clear()
        for seq in itertools.chain(left, self._running()):
            if not seq.done:
                self._finish(seq, "cancelled")
        self._batches, self._chunked = [], []

    def _running(self) -> list[SequentialPrefill]:
        return [*(c.seq for c in self._chunked), *(s for b in self._batches for s in b.sequences)]

    def _iteration(self, arrivals: list[SequentialPrefill]) -> None:
        for seq in self._running():  # a cancelled sequence leaves before the next step, not after it
            if seq.handle.cancelled and not seq.done:
                self._finish(seq, "cancelled")
        joined = self._admit_all(arrivals) + self._advance_chunked()
        self._regroup(joined)
        self._admitting = []
        for batch in self._batches:
            self._step(batch)
        self._regroup([])

    def _step(self, batch: PrefillBatch) -> None:
        """Feed every row its last token: one forward for the whole batch."""
        live = [s for s in batch.sequences if not s.done]
        if not live:
            return
        B = len(batch.sequences)
        fed = [s.feed.pop(0) if s.feed and not s.done else None for s in batch.sequences]
        self.interleaved_prompt_tokens += sum(t is not None for t in fed)
        tokens = torch.tensor([t if t is not None else s.last_token if not s.done else 0
                               for s, t in zip(batch.sequences, fed, strict=True)], device=self.device)
        # Fused rows feed their carried state into every generated position; plain rows never do.
        fused = [s.fused for s in batch.sequences]
        plain_rows = None if all(fused) else torch.tensor([not f for f in fused], device=self.device)
        state = DecodeState(batch.cache, batch.carried if any(fused) else None, batch.logits, prompt_len=1,
                            plain_rows=plain_rows)
        if self._static is not None:  # its cache becomes the decoder's (rows copied in at a batch's first step)
            decoder = self._static.decoder_for(batch, B, batch.cache.max_len, self._batches)
            decoder.step(state, tokens)
            batch.cache = state.cache
        else:
            decode_step(self.model, state, tokens)  # the generation module's step, on the whole batch
        batch.logits = state.next_logits
        if state.carried is not None:
            batch.carried = state.carried
        self.steps += 1
        self.rows_stepped += B
        self._emit_tokens(batch)

    def _emit_tokens(self, batch: PrefillBatch) -> None:
        """Choose each live row's next token from ``batch.logits``, hand it over, and mark finished rows."""
        logits = batch.logits
        greedy = logits.argmax(dim=-1).tolist()
        logprobs = None
        for row, seq in enumerate(batch.sequences):
            if seq.done or seq.feed:  # a row still feeding its prompt has no token to choose yet
                continue
            if seq.handle.cancelled:
                self._finish(seq, "cancelled")
                continue
            s, d = seq.request, seq.request.decode
            if is_greedy(d.temperature):  # the sampler's rule: the tokens generate() gives
                token = greedy[row]
            else:  # the generation module's sampler, on this row alone, with the request's own generator
                try:
                    token = int(sample_next(logits[row : row + 1], d.temperature, d.top_k, d.top_p, seq.generator))
                except RuntimeError as err:  # this row's distribution alone is broken: fail it, not the batch
                    self._finish(seq, "error", f"sampling failed: {err}")
                    continue
            seq.generated += 1
            seq.last_token = token
            if token in d.stop_token_ids:
                self._finish(seq, "stop")
                continue
            event = TokenEvent(token)
            if s.logprobs is not None:
                if logprobs is None:
                    logprobs = torch.log_softmax(logits.double(), dim=-1)
                event.logprob = float(logprobs[row, token])
                if s.logprobs > 0:
                    top = torch.topk(logprobs[row], s.logprobs)
                    event.top_logprobs = list(zip(top.indices.tolist(), top.values.tolist(), strict=True))
            self.tokens_generated += 1
            self._send(seq, event)
            if seq.generated >= s.max_tokens:
                self._finish(seq, "length")

    def _finish(self, seq: SequentialPrefill, reason: str, error: str | None = None) -> None:
        seq.done = True
        if reason == "error":
            self.failed += 1
        self._send(seq, FinishEvent(reason, error))

    def _send(self, seq: SequentialPrefill, event: Event) -> None:
        try:
            seq.listener(event)
        except Exception:  # a listener whose client is gone must not stop the loop
            log.debug("listener failed", exc_info=True)
            seq.handle.cancelled = True

    # ------------------------------------------------------------------ batch membership

    def _regroup(self, joined: list[PrefillBatch]) -> None:
        """Drop finished rows and merge newly prefilled sequences into the running batches (a cache whose rows cannot
        be gathered keeps each sequence as its own batch).

        Rows go to two lanes, each one batch: rows still feeding an exact prompt, and the rest. A long prompt's
        cache then never pads the short streams' rows (their steps would attend over its length) and a stream that
        finishes or arrives copies only its own lane's cache; the feeding lane costs the others one small forward
        per step. A lane whose rows are unchanged keeps its batch as it is."""
        batches = [*self._batches, *joined]
        if not self.regroups:
            self._batches = [b for b in batches if not b.sequences[0].done]
            return
        lanes: dict[bool, list[tuple[PrefillBatch, int]]] = {False: [], True: []}
        for b in batches:
            for i, s in enumerate(b.sequences):
                if not s.done:
                    lanes[bool(s.feed)].append((b, i))
        self._batches = [rows[0][0] if self._unchanged(rows, joined) else self._repack(rows)
                         for rows in lanes.values() if rows]

    @staticmethod
    def _unchanged(rows: list[tuple[PrefillBatch, int]], joined: list[PrefillBatch]) -> bool:
        """Are ``rows`` every row of one running batch, in order? (A prefill's batch has room for its prompt
        alone, so a joined one is always repacked.)"""
        first = rows[0][0]
        return (len(rows) == len(first.sequences) and all(b is first for b, _ in rows)
                and all(b is not first for b in joined))

    def _repack(self, rows: list[tuple[PrefillBatch, int]]) -> PrefillBatch:
        """One batch of ``rows`` (source batch, row): each row's cached tokens right-aligned in a fresh cache."""
        L = max(int(b.cache.next_position[i]) for b, i in rows)
        # Rows advance together: the cache needs room for the row with the most feeds still to come.
        remaining = max(len(b.sequences[i].feed) + b.sequences[i].request.max_tokens - b.sequences[i].generated
                        for b, i in rows)
        cache = gather_rows(self.model, [(b.cache, i) for b, i in rows], min(self.context, L + remaining))
        sequences = [b.sequences[i] for b, i in rows]
        logits = torch.stack([b.logits[i] for b, i in rows])
        carried = None
        if any(s.fused for s in sequences):
            zeros = torch.zeros(self.model.config.d_model, dtype=self.model.embed.weight.dtype, device=self.device)
            carried = torch.stack([b.carried[i] if b.carried is not None else zeros for b, i in rows])
        return PrefillBatch(sequences, cache, carried, logits)
