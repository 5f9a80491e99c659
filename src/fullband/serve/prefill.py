"""Admission of new requests into the engine's batch: batched prefill, and exact-mode prompts prefilled between
decoding steps (fed one token per step, or one exact Jacobi chunk per iteration). A part of
:class:`~fullband.serve.engine.Engine` (its base class), kept apart to keep each module short."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from fullband.generation.decoding import left_pad, prefill
from fullband.model import FeedbackLM
from fullband.model.kv_cache import CacheSlots
from fullband.modes import Prefill, prefill_of
from fullband.serve.requests import GenerationRequest, Handle, Listener, useful_passes

log = logging.getLogger("fullband.serve")


@dataclass
class SequentialPrefill:
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
class ChunkedPrefill:
    """An exact-mode prompt prefilled one exact Jacobi chunk per engine iteration (``exact_chunk_size`` > 1)."""

    seq: SequentialPrefill
    ids: torch.Tensor  # (1, T) the prompt
    cache: CacheSlots
    carried: torch.Tensor | None = None  # (1, D) the state after the chunks so far
    done_tokens: int = 0


@dataclass
class PrefillBatch:
    """Sequences decoded in lockstep: one cache row, one carried state row and one logits row each."""

    sequences: list[SequentialPrefill]
    cache: CacheSlots  # one row per sequence
    carried: torch.Tensor | None  # (B, D); rows of plain sequences are unused
    logits: torch.Tensor = field(default=None)  # type: ignore[assignment]  # (B, V) next-token logits


class Admission:
    """The engine's prefill methods; the engine supplies the model, its settings, counters and ``_finish`` /
    ``_emit_tokens``."""

    model: FeedbackLM
    device: torch.device
    exact_chunk_size: int
    interleave_prefill: bool
    regroups: bool
    prefills: int
    batched_prefills: int
    prefill_chunks: int
    prompt_tokens: int
    _chunked: list[ChunkedPrefill]

    def _finish(self, seq: SequentialPrefill, reason: str, error: str | None = None) -> None:
        raise NotImplementedError

    def _emit_tokens(self, batch: PrefillBatch) -> None:
        raise NotImplementedError

    def _admit_all(self, arrivals: list[SequentialPrefill]) -> list[PrefillBatch]:
        """Prefill the arrivals, those whose prefills are the same computation together (left-padded, one forward
        per group); each one's first token comes from its prefill's logits."""
        live = []
        for seq in arrivals:
            if seq.handle.cancelled:
                self._finish(seq, "cancelled")
            elif self._chunks(seq):
                ids = torch.tensor([seq.request.prompt_ids], dtype=torch.long, device=self.device)
                room = ids.shape[1] if self.regroups else ids.shape[1] + seq.request.max_tokens
                self._chunked.append(ChunkedPrefill(seq, ids, self.model.new_cache(1, room)))
                self.prompt_tokens += ids.shape[1]
            else:
                live.append(seq)
        if not self.regroups:  # a cache that is not regrouped: each sequence its own batch of one
            groups = [[seq] for seq in live]
        else:
            by_passes: dict[int | None, list[SequentialPrefill]] = {}
            for seq in live:
                by_passes.setdefault(self._prefill_passes(seq), []).append(seq)
            groups = list(by_passes.values())
        return [batch for group in groups if (batch := self._prefill(group)) is not None]

    def _prefill_passes(self, seq: SequentialPrefill) -> int | None:
        """Which prefill computation a sequence needs, as :class:`~fullband.modes.Prefill` counts it: whole-prompt
        passes (1 = one plain pass), or None for the exact prompt. Arrivals that need the same share a forward."""
        plan = prefill_of(seq.request.decoding)
        if plan.exact:
            # an interleaved exact prompt's first token (always plain) is prefilled by one plain pass
            return 1 if self._interleaves(seq) else None
        return useful_passes(plan.passes, len(seq.request.prompt_ids))  # one plain pass: 1

    def _interleaves(self, seq: SequentialPrefill) -> bool:
        """Does this exact-mode prompt feed its tokens after the first inside decoding steps? Sequential exact
        prefill (chunks of one) is fused decoding with the prompt's tokens in place of sampled ones, so it runs
        as one more row of the batch and a long prompt never stalls the running streams."""
        return (self.interleave_prefill and self.regroups and prefill_of(seq.request.decoding).exact
                and self.exact_chunk_size == 1 and self.model.fuse is not None)

    def _chunks(self, seq: SequentialPrefill) -> bool:
        """Is this exact prompt prefilled one Jacobi chunk per iteration, between decoding steps? The chunks and
        their order are those of the whole prefill (``FeedbackLM.prefill``), so the logits are the same."""
        return (self.interleave_prefill and prefill_of(seq.request.decoding).exact and self.exact_chunk_size > 1
                and self.model.fuse is not None and len(seq.request.prompt_ids) > self.exact_chunk_size)

    def _advance_chunked(self) -> list[PrefillBatch]:
        """One exact chunk of every chunked prefill; those whose prompt is in join the batch."""
        joined, still = [], []
        for job in self._chunked:
            if job.seq.done:
                continue
            start, end = job.done_tokens, job.done_tokens + self.exact_chunk_size
            chunk = job.ids[:, start:end]
            try:
                out = self.model.prefill(chunk, job.cache, torch.ones(1, dtype=torch.long, device=self.device),
                                         chunk_size=self.exact_chunk_size, carried_state=job.carried,
                                         attention_mask=torch.ones_like(chunk))
            except Exception as err:  # this request alone fails
                log.exception("prefill failed")
                self._finish(job.seq, "error", f"prefill failed: {err}")
                continue
            self.prefill_chunks += 1
            job.carried, job.done_tokens = out.hidden[:, -1], start + chunk.shape[1]
            if job.done_tokens < job.ids.shape[1]:
                still.append(job)
                continue
            self.prefills += 1
            job.seq.fused = True
            batch = PrefillBatch([job.seq], job.cache, job.carried, out.logits[:, -1])
            self._emit_tokens(batch)
            if not job.seq.done:
                joined.append(batch)
        self._chunked = still
        return joined

    def _prefill(self, group: list[SequentialPrefill]) -> PrefillBatch | None:
        passes = self._prefill_passes(group[0])
        prompts = [list(s.request.prompt_ids) for s in group]
        for seq, prompt in zip(group, prompts, strict=True):
            if passes == 1 and prefill_of(seq.request.decoding).exact:
                seq.feed = prompt[1:]
                del prompt[1:]
        ids, mask = left_pad(prompts)
        ids, mask = ids.to(self.device), mask.to(self.device)
        # A regrouped cache is gathered into the batch cache at once, so it needs room for the prompt alone; a batch
        # of one decodes on in its prefill cache.
        first = group[0].request
        room = ids.shape[1] if self.regroups else len(first.prompt_ids) + first.max_tokens
        # The group's shared prefill, whatever modes asked for it; a row that carries no state drops it below.
        plan = Prefill(passes, carries=any(prefill_of(s.request.decoding).carries for s in group))
        try:
            state = prefill(self.model, ids, mask, plan, room, exact_chunk_size=self.exact_chunk_size)
        except Exception as err:  # these requests alone fail
            log.exception("prefill failed")
            for seq in group:
                self._finish(seq, "error", f"prefill failed: {err}")
            return None
        self.prefills += 1
        self.batched_prefills += len(group) > 1
        self.prompt_tokens += sum(len(s.request.prompt_ids) for s in group)
        for seq in group:
            seq.fused = state.carried is not None and prefill_of(seq.request.decoding).carries
        batch = PrefillBatch(group, state.cache, state.carried, state.next_logits)
        self._emit_tokens(batch)
        return batch if any(not s.done for s in group) else None
