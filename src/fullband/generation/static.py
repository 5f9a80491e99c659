"""Decoding with a static KV cache and a compilable decode step (gpt-fast style), in every mode.

The eager step (:func:`fullband.generation.decoding.decode_step`) runs the model's one forward over a token: the
keys it attends to are the cache's first ``length + 1`` slots, so every step has new shapes and Python decides the
slot, the mask and the positions. On a GPU such a step is bound by kernel launches (docs/LOG.md, 2026-12-04: greedy
decoding at ~75 tokens/s per sequence, 0.89x HF ``generate``). Here a step has one shape for the whole decode:

- the KV cache is preallocated at a fixed capacity and the step writes its keys/values in place at ``slot`` (a
  0-d device tensor, not a Python int), then attends over every slot with a mask of the real, earlier ones;
- the carried state ``h`` (B, D) is one more static buffer: fused rows fuse it into the token, the step writes the
  new one over it;
- the cache's ``valid``, ``next_position`` and ``slot`` advance inside the step.

So the step can be ``torch.compile``d (``DecodeOptions.step = "compiled"``), on CUDA with ``mode="reduce-overhead"``:
the compiled step is replayed as a CUDA graph; on a CPU inductor compiles it, with the step's products written so
that one row streams its weight in one fused kernel (:func:`fullband.model.linear.traced_decoding`: 0.62-0.66 of the
eager step's time at batch 1, docs/benchmarks.md). Prefill stays the model's eager forward, written into the same
cache.
The step's arithmetic is the eager step's (the same embedding, fusion, blocks and head); attention sums over the
whole capacity with the unused slots masked out, so the logits agree with the eager path's to rounding and greedy
tokens are identical (``tests/generation/test_static.py``).

Only the native network's :class:`~fullband.model.kv_cache.KVCache` has a static twin; other families (a retrofitted
transformers model) and the looped control decode eagerly.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch import nn

from fullband.generation.state import DecodeState
from fullband.model import FeedbackLM
from fullband.model.kv_cache import KVCache
from fullband.modes import DECODE_STEPS

STEPS = DECODE_STEPS  # DecodeOptions.step: eager, static, compiled
MAX_COMPILED_SHAPES = 64  # the compiled step's graphs (rows x capacity x fused or plain) before falling back
MIN_CAPACITY = 64  # the smallest cache: capacities are powers of two from here, so few shapes get compiled
COMPILE_FAILED = "the compiled decode step failed"  # how the warning of a step that fell back to uncompiled begins


def supports_static(model: FeedbackLM) -> bool:
    """Whether ``model`` decodes with the static step: a native KV cache and the recurrence along positions."""
    return model.cache_type is KVCache and getattr(model.config, "feedback_shift", 1) == 1


def capacity_for(model: FeedbackLM, length: int) -> int:
    """The cache capacity a decode of ``length`` tokens uses: the next power of two from :data:`MIN_CAPACITY`, at
    most the model's context. Why a bucket: every capacity is a shape compiled (and a CUDA graph captured) once, and
    attention over the unused slots costs a few percent of a step where the weights' reads dominate."""
    capacity = MIN_CAPACITY
    while capacity < length:
        capacity *= 2
    return min(capacity, int(model.config.max_seq_len))


class _StaticStep(nn.Module):
    """The step's static buffers (registered, so CUDA graphs treat their addresses as fixed) and the step itself.

    The keys and values of each layer, ``valid`` and ``next_position`` are the :class:`KVCache`'s own tensors (shared,
    not copied): an eager forward (the prefill) and the step read and write one cache."""

    def __init__(self, model: FeedbackLM, cache: KVCache) -> None:
        super().__init__()
        self.model = model
        B, D = cache.batch_size, int(model.config.d_model)
        device = cache.keys.device
        # One buffer per layer, (B, Hkv, S, hd) each: a view of the cache's stacked tensor. A write into a view of
        # one (L, ...) buffer compiles to copies of the whole cache every step; into a buffer of its own, to an
        # in-place write of the slot (as gpt-fast's per-layer caches).
        for layer in range(cache.keys.shape[0]):
            self.register_buffer(f"keys{layer}", cache.keys[layer], persistent=False)
            self.register_buffer(f"values{layer}", cache.values[layer], persistent=False)
        self.register_buffer("valid", cache.valid, persistent=False)  # (B, S) bool
        self.register_buffer("next_position", cache.next_position, persistent=False)  # (B,)
        self.register_buffer("slot", torch.zeros(1, dtype=torch.long, device=device), persistent=False)
        self.register_buffer("carried", torch.zeros(B, D, dtype=cache.keys.dtype, device=device), persistent=False)
        self.register_buffer("fuse_rows", torch.ones(B, dtype=torch.bool, device=device), persistent=False)
        self.register_buffer("key_pos", torch.arange(cache.max_len, device=device), persistent=False)
        if device.type == "cuda":  # a CUDA graph reads and writes them in place: their addresses never change
            for buffer in self.buffers():
                torch._dynamo.mark_static_address(buffer)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache interface the attention calls: store the token's k, v (B, Hkv, 1, hd) at ``slot`` and return
        every slot (B, Hkv, S, hd); the mask hides the unused ones."""
        keys, values = getattr(self, f"keys{layer}"), getattr(self, f"values{layer}")
        keys.index_copy_(2, self.slot, k)
        values.index_copy_(2, self.slot, v)
        return keys, values

    def forward(self, tokens: torch.Tensor, feeds_back: bool) -> torch.Tensor:
        """Decode one token per row, tokens (B,) -> next logits (B, V); ``feeds_back``: fuse the carried state."""
        model = self.model
        positions = self.next_position[:, None]  # (B, 1): real tokens so far = this token's RoPE position
        # Causal over the slots written so far and this one; real tokens only (left padding stays masked).
        here = self.key_pos == self.slot  # (S,)
        mask = (self.key_pos <= self.slot) & (self.valid | here)  # (B, S)
        # The blocks below the feedback target (none at target 0): the token's plain target stream (B, 1, D)
        stream = model.run_lower(model.embed(tokens[:, None]), positions, mask[:, None, None, :], self)
        if feeds_back:  # the eager pass-1 input of a chunk with a carried-in state (recurrence.pass_inputs)
            fused = model.fuse(stream[:, 0], self.carried)  # (B, D)
            inputs = torch.where(self.fuse_rows[:, None, None], fused[:, None], stream)
        else:
            inputs = stream
        carried, head_input = model.run_stack(inputs, positions, mask[:, None, None, :], self)
        logits = model.lm_head(head_input[:, -1])  # (B, V)
        if feeds_back:
            self.carried.copy_(carried[:, -1])
        self.valid.index_fill_(1, self.slot, True)
        self.next_position.add_(1)
        self.slot.add_(1)
        return logits


class StaticDecoder:
    """Static decode steps over one preallocated cache of ``batch_size`` rows and ``capacity`` slots.

    :meth:`fresh_cache` hands the cache to a prefill; :meth:`step` then advances a :class:`DecodeState` whose cache
    is this one (a state over another cache is copied in first: the server's batches). ``compiled``: the step runs
    through ``torch.compile`` (``reduce-overhead``, CUDA graphs, on CUDA; inductor elsewhere)."""

    def __init__(self, model: FeedbackLM, batch_size: int, capacity: int, compiled: bool = False) -> None:
        if not supports_static(model):
            raise ValueError(f"the static decode step needs the native KV cache; a {type(model).__name__} decodes "
                             "with step='eager'")
        cache = model.new_cache(batch_size, capacity)
        assert isinstance(cache, KVCache)
        self.model, self.cache, self.compiled = model, cache, compiled
        self.module = _StaticStep(model, cache)
        self._slot_at = 0  # the cache length the slot buffer holds (kept in step, so no write per step)
        self._fuse_all = True  # whether fuse_rows is all True
        self._steps: dict[bool, Any] = {}

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    def fresh_cache(self) -> KVCache:
        """The cache emptied (no slot valid, every position 0), for a prefill to write into."""
        self.cache.valid.zero_()
        self.cache.next_position.zero_()
        self.cache.length = 0
        return self.cache

    def adopt(self, cache: KVCache) -> None:
        """Copy ``cache``'s committed slots, validity and positions into this decoder's cache (same rows)."""
        if cache is self.cache:
            return
        if cache.batch_size != self.batch_size:
            raise ValueError(f"a static decoder of {self.batch_size} rows cannot take a cache of {cache.batch_size}")
        L = cache.length
        self.fresh_cache().check_room(L)
        self.cache.keys[:, :, :, :L] = cache.keys[:, :, :, :L]
        self.cache.values[:, :, :, :L] = cache.values[:, :, :, :L]
        self.cache.valid[:, :L] = cache.valid[:, :L]
        self.cache.next_position.copy_(cache.next_position)
        self.cache.length = L

    def step(self, state: DecodeState, tokens: torch.Tensor) -> None:
        """:func:`~fullband.generation.decoding.decode_step` on the static buffers: feed tokens (B,), advance
        ``state`` by one position (its cache becomes this decoder's)."""
        self.adopt(state.cache)  # type: ignore[arg-type]
        state.cache = cache = self.cache
        cache.check_room(1)
        buffers = self.module
        if self._slot_at != cache.length:  # a prefill or another owner moved the cache: point the slot at its end
            buffers.slot.fill_(cache.length)
        feeds_back = state.carried is not None
        if feeds_back:
            if state.carried is not buffers.carried:
                buffers.carried.copy_(state.carried)
            if state.plain_rows is not None:
                torch.logical_not(state.plain_rows, out=buffers.fuse_rows)
            elif not self._fuse_all:  # (a write per step would be one more launch per token)
                buffers.fuse_rows.fill_(True)
            self._fuse_all = state.plain_rows is None
        if self.compiled and tokens.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read: a new one may start
        tokens = tokens.to(cache.keys.device, torch.long)
        try:
            logits = self._step_fn(feeds_back)(tokens, feeds_back)
        except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit) as error:
            # compiling failed, or too many shapes compiled (before the step ran): the static step, uncompiled
            if not self.compiled:
                raise
            warnings.warn(f"{COMPILE_FAILED} ({type(error).__name__}: "
                          f"{str(error).strip().splitlines()[0][:200] if str(error).strip() else ''}); decoding "
                          "with the static step uncompiled", stacklevel=2)
            self.compiled, self._steps = False, {}
            logits = self._step_fn(feeds_back)(tokens, feeds_back)
        cache.length += 1
        self._slot_at = cache.length
        # A CUDA graph's outputs are overwritten by its next replay (another batch's, in the server): keep a copy.
        state.next_logits = logits.clone() if self.compiled else logits
        if feeds_back:
            state.carried = buffers.carried

    def _step_fn(self, feeds_back: bool) -> Any:
        fn = self._steps.get(feeds_back)
        if fn is None:
            fn = self.module
            if self.compiled:
                # One graph per (rows, capacity, mode): a server's batch sizes come and go, so allow more graphs than
                # dynamo's default 8 before it gives up (then this step runs uncompiled: see step). Process-wide, and
                # only ever raised.
                limit = torch._dynamo.config.recompile_limit
                torch._dynamo.config.recompile_limit = max(limit, MAX_COMPILED_SHAPES)
                cuda = self.cache.keys.device.type == "cuda"
                fn = torch.compile(self.module, mode="reduce-overhead" if cuda else None, fullgraph=True,
                                   dynamic=False)
            self._steps[feeds_back] = fn
        return fn


# Each model's decoders, by (rows, capacity, compiled): one cache and one compiled step reused by every generate call
# of that shape (a CUDA graph is captured once). Weak: a model that is dropped takes its decoders along.
_DECODERS: weakref.WeakKeyDictionary[FeedbackLM, dict[tuple, StaticDecoder]] = weakref.WeakKeyDictionary()


def release_static_decoders(model: FeedbackLM) -> None:
    """Free ``model``'s static caches (and compiled steps): they are kept for the next decode of their shape."""
    _DECODERS.pop(model, None)


def static_decoder(model: FeedbackLM, batch_size: int, length: int, compiled: bool) -> StaticDecoder:
    """The model's static decoder for ``batch_size`` rows and a decode of ``length`` tokens (prompt + new)."""
    p = model.embed.weight
    key = (batch_size, capacity_for(model, length), compiled, p.dtype, p.device)
    decoders = _DECODERS.setdefault(model, {})
    if key not in decoders:
        decoders[key] = StaticDecoder(model, batch_size, key[1], compiled)
    return decoders[key]


class StaticPool:
    """Static decoders for a server's batches, whose membership (and so row count) changes as requests come and go.

    A batch keeps the decoder it stepped with while it lives (its cache *is* that decoder's); a batch that is gone
    frees its decoder for the next batch of the same shape, which copies its rows in once. At most ``size`` decoders
    are kept (least recently used freed first), so the caches of many batch sizes do not pile up."""

    def __init__(self, model: FeedbackLM, compiled: bool, size: int = 8) -> None:
        self.model, self.compiled, self.size = model, compiled, size
        self._decoders: list[tuple[StaticDecoder, object]] = []  # (decoder, owner), most recently used last

    def decoder_for(self, owner: object, batch_size: int, length: int, live: list) -> StaticDecoder:
        """The decoder of ``owner`` (a batch of ``batch_size`` rows, up to ``length`` tokens); ``live``: the batches
        still running (a decoder owned by none of them is free)."""
        capacity = capacity_for(self.model, length)
        live_ids = {id(b) for b in live} | {id(owner)}
        pick = None
        for i, (decoder, held_by) in enumerate(self._decoders):
            fits = decoder.batch_size == batch_size and decoder.cache.max_len == capacity
            if held_by is owner and fits:
                pick = i
                break
            if pick is None and fits and id(held_by) not in live_ids:
                pick = i
        if pick is not None:
            decoder = self._decoders.pop(pick)[0]
        else:
            decoder = StaticDecoder(self.model, batch_size, capacity, self.compiled)
            free = [i for i, (_, held_by) in enumerate(self._decoders) if id(held_by) not in live_ids]
            while len(self._decoders) >= self.size and free:
                self._decoders.pop(free.pop(0))
                free = [i - 1 for i in free]
        self._decoders.append((decoder, owner))
        return decoder
