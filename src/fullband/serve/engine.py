"""The serving engine: continuous batching over :mod:`fullband.generation.decoding`, no HTTP.

One background thread owns every active sequence. Each loop iteration it

1. admits queued requests up to ``max_batch``: arrivals whose prefills are the same computation are prefilled
   together in one left-padded forward (standard and soft prompts, and the first token of a sequential exact
   prompt, in one plain pass; fused prompts by their pass count), and each samples its first token;
2. decodes every active sequence together in one forward; a sequential exact
   prompt feeds its remaining tokens here, one per step, as fused decoding with the prompt's tokens in place of
   sampled ones, which is the sequential exact prefill itself (the same forwards: bit-identical alone), so a long
   exact prompt never stalls the running streams;
3. hands each sequence its token and retires the finished and the cancelled at once.

A sequence's decoding state is its KV cache rows plus its last carried state ``h`` (DESIGN.md §4). The batch
keeps the rows right-aligned in one cache (left padding, as batched decoding does), so a row at any length decodes
next to any other; whenever the membership changes the rows are copied into a fresh cache whose padded length is
the longest row's, which keeps it within the model context (:mod:`~fullband.serve.batching`: the native KVCache and
a retrofitted model's transformers cache alike). Modes mix in one step:
a row is fused (soft, fused, exact) or plain (standard) through a per-row ``plain_prefix``, and its own carried
state. Greedy tokens are those of the same request decoded alone (``tests/serve`` checks it).

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
from dataclasses import dataclass, field

import torch

from fullband.generation.decoding import left_pad, prefill
from fullband.generation.sampling import sample_next
from fullband.model import FeedbackLM
from fullband.model.kv_cache import CacheSlots
from fullband.serve.batching import gather_rows, regroupable, release_free_memory
from fullband.serve.requests import (
    MAX_TOP_LOGPROBS,
    MIN_TEMPERATURE,
    Event,
    FinishEvent,
    GenerationRequest,
    Handle,
    Listener,
    QueueFull,
    RequestError,
    SamplingParams,
    TokenEvent,
    useful_passes,
    validate_request,
)

log = logging.getLogger("fullband.serve")

__all__ = ["MAX_TOP_LOGPROBS", "Engine", "FinishEvent", "GenerationRequest", "Handle", "QueueFull", "RequestError",
           "SamplingParams", "TokenEvent"]



@dataclass
class _Sequence:
    request: GenerationRequest
    listener: Listener
    handle: Handle
    generator: torch.Generator
    generated: int = 0
    last_token: int = -1
    fused: bool = False
    done: bool = False
    feed: list[int] = field(default_factory=list)  # exact-mode prompt tokens still to feed, one per decoding step


@dataclass
class _Batch:
    """Sequences decoded in lockstep: one cache row, one carried state row and one logits row each."""

    sequences: list[_Sequence]
    cache: CacheSlots  # one row per sequence
    carried: torch.Tensor | None  # (B, D); rows of plain sequences are unused
    logits: torch.Tensor = field(default=None)  # type: ignore[assignment]  # (B, V) next-token logits


class Engine:
    """Continuous batching over one model. Thread-safe :meth:`submit`; events go to each request's listener
    (called on the engine thread: keep it short and non-blocking)."""

    def __init__(self, model: FeedbackLM, max_batch: int = 16, max_queue: int = 64, exact_chunk_size: int = 1,
                 interleave_prefill: bool = True) -> None:
        self.model = model
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.exact_chunk_size = exact_chunk_size
        self.interleave_prefill = interleave_prefill
        # Whether rows of this model's cache can be gathered into one batch cache (serve.batching); if not, each
        # sequence decodes as its own batch of one.
        self.regroups = regroupable(model.new_cache(1, 1))
        self.device = model.embed.weight.device
        self.vocab_size = int(model.config.vocab_size)
        self.context = int(model.config.max_seq_len)
        self._pending: collections.deque[_Sequence] = collections.deque()
        self._batches: list[_Batch] = []
        self._admitting: list[_Sequence] = []  # taken from the queue, not yet in a batch: they hold slots too
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

    # ------------------------------------------------------------------ public

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        running = itertools.chain(self._admitting, *(b.sequences for b in list(self._batches)))
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

    def validate(self, request: GenerationRequest) -> None:
        """Raise :class:`RequestError` naming the field for anything the model cannot run."""
        validate_request(request, self.vocab_size, self.context)

    def submit(self, requests: Sequence[GenerationRequest], listeners: Sequence[Listener]) -> list[Handle]:
        """Queue ``requests`` together (all or none); raises RequestError, or QueueFull when there is no room."""
        for request in requests:
            self.validate(request)
        handles = [Handle(self._wake) for _ in requests]
        with self._cond:
            if self._closing:
                raise QueueFull("the server is shutting down")
            free_slots = max(self.max_batch - self.active, 0)
            if len(self._pending) + len(requests) > self.max_queue + free_slots:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting, {self.max_batch} decoding): retry later")
            for request, listener, handle in zip(requests, listeners, handles, strict=True):
                seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(63)
                generator = torch.Generator(device=self.device).manual_seed(seed)
                self._pending.append(_Sequence(request, listener, handle, generator))
            self._cond.notify_all()
        return handles

    # ------------------------------------------------------------------ the loop

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # grad mode is per thread
        while True:
            if not self._pending and not self._batches:
                release_free_memory()  # idle: hand the batch caches' freed memory back to the OS
            with self._cond:
                while not self._closing and not self._pending and not self._batches:
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
                for seq in itertools.chain(arrivals, *(b.sequences for b in self._batches)):
                    if not seq.done:
                        self._finish(seq, "error", f"internal error: {err}")
                self._batches = []
        with self._cond:
            left = list(self._pending)
            self._pending.clear()
        for seq in itertools.chain(left, *(b.sequences for b in self._batches)):
            if not seq.done:
                self._finish(seq, "cancelled")
        self._batches = []

    def _iteration(self, arrivals: list[_Sequence]) -> None:
        for batch in self._batches:  # a cancelled sequence leaves before the next step, not after it
            for seq in batch.sequences:
                if seq.handle.cancelled and not seq.done:
                    self._finish(seq, "cancelled")
        joined = self._admit_all(arrivals)
        self._regroup(joined)
        self._admitting = []
        for batch in self._batches:
            self._step(batch)
        self._regroup([])

    def _admit_all(self, arrivals: list[_Sequence]) -> list[_Batch]:
        """Prefill the arrivals, those whose prefills are the same computation together (left-padded, one forward
        per group); each one's first token comes from its prefill's logits."""
        live = []
        for seq in arrivals:
            if seq.handle.cancelled:
                self._finish(seq, "cancelled")
            else:
                live.append(seq)
        if not self.regroups:  # a cache that is not regrouped: each sequence its own batch of one
            groups = [[seq] for seq in live]
        else:
            by_kind: dict[tuple[str, int], list[_Sequence]] = {}
            for seq in live:
                by_kind.setdefault(self._prefill_kind(seq), []).append(seq)
            groups = list(by_kind.values())
        return [batch for group in groups if (batch := self._prefill(group)) is not None]

    def _prefill_kind(self, seq: _Sequence) -> tuple[str, int]:
        """Which prefill computation a sequence needs: arrivals of one kind share a forward."""
        request = seq.request
        if request.mode == "fused":
            return "fused", useful_passes(request.prefill_passes, len(request.prompt_ids))
        if request.mode == "exact" and not self._interleaves(seq):
            return "exact", 0
        # standard and soft prompts, and an interleaved exact prompt's first token (always plain): one plain pass
        return "plain", 0

    def _interleaves(self, seq: _Sequence) -> bool:
        """Does this exact-mode prompt feed its tokens after the first inside decoding steps? Sequential exact
        prefill (chunks of one) is fused decoding with the prompt's tokens in place of sampled ones, so it runs
        as one more row of the batch and a long prompt never stalls the running streams."""
        return (self.interleave_prefill and self.regroups and seq.request.mode == "exact" and self.exact_chunk_size == 1
                and self.model.fuse is not None)

    def _prefill(self, group: list[_Sequence]) -> _Batch | None:
        kind, passes = self._prefill_kind(group[0])
        prompts = [list(s.request.prompt_ids) for s in group]
        for seq, prompt in zip(group, prompts, strict=True):
            if kind == "plain" and seq.request.mode == "exact":
                seq.feed = prompt[1:]
                del prompt[1:]
        ids, mask = left_pad(prompts)
        ids, mask = ids.to(self.device), mask.to(self.device)
        # A regrouped cache is gathered into the batch cache at once, so it needs room for the prompt alone; a batch
        # of one decodes on in its prefill cache.
        first = group[0].request
        room = ids.shape[1] if self.regroups else len(first.prompt_ids) + first.sampling.max_tokens
        mode = {"plain": "soft" if any(s.request.mode != "standard" for s in group) else "standard"}.get(kind, kind)
        try:
            state = prefill(self.model, ids, mask, mode, room, passes, self.exact_chunk_size)
        except Exception as err:  # these requests alone fail
            log.exception("prefill failed")
            for seq in group:
                self._finish(seq, "error", f"prefill failed: {err}")
            return None
        self.prefills += 1
        self.batched_prefills += len(group) > 1
        self.prompt_tokens += sum(len(s.request.prompt_ids) for s in group)
        for seq in group:
            seq.fused = state.carried is not None and seq.request.mode != "standard"
        batch = _Batch(group, state.cache, state.carried, state.next_logits)
        self._emit_tokens(batch)
        return batch if any(not s.done for s in group) else None

    def _step(self, batch: _Batch) -> None:
        """Feed every row its last token: one forward for the whole batch."""
        live = [s for s in batch.sequences if not s.done]
        if not live:
            return
        B = len(batch.sequences)
        fed = [s.feed.pop(0) if s.feed and not s.done else None for s in batch.sequences]
        self.interleaved_prompt_tokens += sum(t is not None for t in fed)
        tokens = torch.tensor([[t if t is not None else s.last_token if not s.done else 0]
                               for s, t in zip(batch.sequences, fed, strict=True)], device=self.device)
        # Fused rows feed their carried state into every generated position; plain rows never do.
        never = self.context + 1
        plain_prefix = torch.tensor([1 if s.fused else never for s in batch.sequences], device=self.device)
        carried = batch.carried if any(s.fused for s in batch.sequences) else None
        out = self.model(tokens, plain_prefix=plain_prefix, cache=batch.cache, carried_state=carried,
                         attention_mask=torch.ones_like(tokens))
        batch.logits = out.logits[:, -1]
        if carried is not None:
            batch.carried = out.hidden[:, -1]
        self.steps += 1
        self.rows_stepped += B
        self._emit_tokens(batch)

    def _emit_tokens(self, batch: _Batch) -> None:
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
            s = seq.request.sampling
            if s.temperature < MIN_TEMPERATURE:
                token = greedy[row]
            else:  # the generation module's sampler, on this row alone, with the request's own generator
                try:
                    token = int(sample_next(logits[row : row + 1], s.temperature, s.top_k, s.top_p, seq.generator))
                except RuntimeError as err:  # this row's distribution alone is broken: fail it, not the batch
                    self._finish(seq, "error", f"sampling failed: {err}")
                    continue
            seq.generated += 1
            seq.last_token = token
            if token in s.stop_token_ids:
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

    def _finish(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        seq.done = True
        if reason == "error":
            self.failed += 1
        self._send(seq, FinishEvent(reason, error))

    def _send(self, seq: _Sequence, event: Event) -> None:
        try:
            seq.listener(event)
        except Exception:  # a listener whose client is gone must not stop the loop
            log.debug("listener failed", exc_info=True)
            seq.handle.cancelled = True

    # ------------------------------------------------------------------ batch membership

    def _regroup(self, joined: list[_Batch]) -> None:
        """Drop finished rows and merge newly prefilled sequences into the running batch (a cache whose rows cannot
        be gathered keeps each sequence as its own batch)."""
        batches = [*self._batches, *joined]
        changed = bool(joined) or any(s.done for b in batches for s in b.sequences)
        if not changed:
            return
        if not self.regroups:
            self._batches = [b for b in batches if not b.sequences[0].done]
            return
        rows = [(b, i) for b in batches for i, s in enumerate(b.sequences) if not s.done]
        self._batches = [self._repack(rows)] if rows else []

    def _repack(self, rows: list[tuple[_Batch, int]]) -> _Batch:
        """One batch of ``rows`` (source batch, row): each row's cached tokens right-aligned in a fresh cache."""
        L = max(int(b.cache.next_position[i]) for b, i in rows)
        # Rows advance together: the cache needs room for the row with the most feeds still to come.
        remaining = max(len(b.sequences[i].feed) + b.sequences[i].request.sampling.max_tokens - b.sequences[i].generated
                        for b, i in rows)
        cache = gather_rows(self.model, [(b.cache, i) for b, i in rows], min(self.context, L + remaining))
        sequences = [b.sequences[i] for b, i in rows]
        logits = torch.stack([b.logits[i] for b, i in rows])
        carried = None
        if any(s.fused for s in sequences):
            zeros = torch.zeros(self.model.config.d_model, dtype=self.model.embed.weight.dtype, device=self.device)
            carried = torch.stack([b.carried[i] if b.carried is not None else zeros for b, i in rows])
        return _Batch(sequences, cache, carried, logits)
