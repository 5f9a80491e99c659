"""FeedbackLM: the one feedback forward, ``forward_exact``, the pass loop and the decoding hooks of every network.

A subclass supplies the network: ``embed`` (token embedding), ``lm_head``, ``blocks``, ``fuse`` (the fusion as
the loop calls it; None without feedback), ``run_lower`` (the blocks below the feedback target, once per position),
``run_stack`` (one pass through the blocks above it), ``depth_states`` (every depth of one pass), ``logits_of_top``
(logits from the top depth state), its cache (``_empty_cache``) and the attention mask its blocks read
(``_stack_mask``), and the model-family interface of :mod:`fullband.model.family` (its files, cache type and
parameter roles). :class:`~fullband.model.lm.FullBandwidthLM` is the native network; the families in
``fullband.integrations`` wrap pretrained transformers models.

The forward is the network's: tokens, padding (``attention_mask``), the cache, the carried state and the pass plan
(``passes``, which positions are fused: ``plain_prefix`` and ``fused``, ``tol``) in; logits and states out. The
training objective (labels, loss weights, jitter, truncated gradients) lives in ``fullband.training.objective`` and
drives this forward one pass at a time. One forward computes every execution mode of DESIGN.md §2 by running the
multi-pass loop of :mod:`fullband.model.recurrence` over a chunk of positions. Run enough passes and the chunk is
exact:

- a whole sequence with ``passes = |fused| + 1``          -> multi-pass (Jacobi) == sequential;
- chunks of a prompt on top of the KV cache               -> chunked prefill;
- chunks of one token, one pass each                      -> sequential reference == KV-cache decoding.

The blocks below the feedback target (DESIGN.md §1's span) run once per forward, before its passes: every mode
computes them once per position and writes their KV cache once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from fullband.config import EXACT_METHODS
from fullband.model.family import FamilyInterface
from fullband.model.kv_cache import CacheSlots
from fullband.model.linear import fsdp_managed, fuses, product
from fullband.model.recurrence import (
    LMOutput,
    Pass,
    PlainPrefix,
    auto_exact_method,
    exact_passes,
    fused_positions,
    pass_inputs,
    pass_loop,
    run_passes,
)


class FeedbackLM(FamilyInterface, nn.Module):
    config: Any  # vocab_size, d_model, n_layers, max_seq_len (the family's own config class)
    embed: nn.Embedding
    lm_head: nn.Module

    # ------------------------------------------------------------------ what a network supplies

    @property
    def fuse(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """(z_t, h_{t-1}) -> the fused input at the target, as the pass loop calls it; None without feedback."""
        raise NotImplementedError

    @property
    def plain_input(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """z_t -> the input of a plain position in passes >= 2, or None for the plain stream itself (every network
        but the paper's literal input form in training)."""
        return None

    def run_lower(
        self, inputs: torch.Tensor, positions: torch.Tensor, mask: Any = None, cache: CacheSlots | None = None
    ) -> torch.Tensor:
        """The blocks below the feedback target over token embeddings (B, T, D) -> the plain target stream (B, T, D)
        (the embeddings themselves at target 0); writes those blocks' cache."""
        raise NotImplementedError

    def run_stack(
        self, inputs: torch.Tensor, positions: torch.Tensor, mask: Any = None, cache: CacheSlots | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the blocks above the target over its inputs (B, T, D) -> (carried states h (B, T, D), head
        input (B, T, D))."""
        raise NotImplementedError

    def depth_states(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(L + 1, B, T, D): what the first block sees, then every depth, for one pass without cache or mask whose
        inputs at the target are ``inputs`` (:meth:`stack_inputs`), the blocks below it run on ``tokens``."""
        raise NotImplementedError

    def logits_of_top(self, state: torch.Tensor) -> torch.Tensor:
        """Logits from the last entry of :meth:`depth_states`."""
        raise NotImplementedError

    def _empty_cache(self, batch_size: int, max_len: int) -> CacheSlots:
        raise NotImplementedError

    def compile_blocks(self) -> None:
        """torch.compile each of ``self.blocks`` in place (a network whose own code calls its layers)."""
        for block in self.blocks:
            block.compile()

    def uncompile_blocks(self) -> None:
        for block in self.blocks:
            block._compiled_call_impl = None  # what nn.Module.compile set

    def checkpoint_activations(self, enabled: bool = True) -> None:
        """Recompute each block's activations in backward instead of storing them (``train.activation_checkpointing``):
        torch.utils.checkpoint, non-reentrant, only in forwards with gradients; the numbers do not change."""
        self.__dict__["_checkpoint_blocks"] = enabled  # outside the module state: checkpoints do not change

    def _stack_mask(self, key_valid: torch.Tensor, T: int) -> Any:
        """The attention mask the blocks read, from which keys are real tokens (B, S), S = cached + T."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared setup

    @property
    def feedback_shift(self) -> int:
        """1: pass k fuses h_{t-1} from pass k-1 into position t (the recurrence); 0: h_t (the looped control)."""
        return getattr(self.config, "feedback_shift", 1)  # networks whose config has no such field recur

    @property
    def feedback_target(self) -> int:
        """k: the carried state enters the stream after k blocks (0 = at the embedding; DESIGN.md §1's span)."""
        return getattr(self.config, "feedback_target", 0)

    def _refuse_looped(self, what: str) -> None:
        # With shift 0 no state moves along the sequence: there is no sequential recurrence to cache or carry.
        if self.feedback_shift == 0 and self.fuse is not None:
            raise ValueError(f"{what} needs the recurrence along positions, which a looped model (feedback_shift=0) "
                             "does not have: run whole-sequence passes without a cache or carried state instead")

    def num_parameters(self, include_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if include_embedding else n - self.embed.weight.numel()

    def new_cache(self, batch_size: int, max_len: int | None = None) -> CacheSlots:
        """An empty decoding cache for ``batch_size`` rows of at most ``max_len`` tokens."""
        max_len = max_len or self.config.max_seq_len
        if max_len > self.config.max_seq_len:
            raise ValueError(f"cache length {max_len} exceeds the model context max_seq_len={self.config.max_seq_len}")
        return self._empty_cache(batch_size, max_len)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T) token ids
        passes: int = 1,
        plain_prefix: PlainPrefix = 1,
        *,
        fused: torch.Tensor | None = None,  # (B, T) bool, or (passes, B, T): which positions receive feedback
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = real token, 0 = left padding
        cache: CacheSlots | None = None,
        carried_state: torch.Tensor | None = None,  # (B, D) state of the position before this chunk; or (B, T, D)
        target_stream: torch.Tensor | None = None,  # (B, T, D) an earlier forward's target stream of these tokens
        tol: float | None = None,
        logits_to_keep: int = 0,
    ) -> LMOutput:
        """Up to ``passes`` passes over ``tokens`` (see the module docstring) -> logits and carried states of the
        last pass.

        Which positions receive feedback (the plan, DESIGN.md §2): those at or past ``plain_prefix`` (absolute
        positions from the start of the sequence, cached ones included: an int, one per row (B,), or one per pass
        and row (K, B)) and, when ``fused`` is given, where it says (chunk positions). The sequence's first position
        is always plain. ``tol`` stops early once ``max|h^(k) - h^(k-1)| < tol``.

        ``carried_state`` (B, D): the state of the position before the chunk (decoding, chunked prefill). (B, T, D):
        the states the first pass fuses into each position (h_{t-1} at t; a position's own with ``feedback_shift``
        0), to continue a Jacobi iteration from them over a whole sequence (no cache): the training objective runs
        its passes one at a time this way. ``target_stream``: the ``target_stream`` of an earlier forward over the
        same tokens (and cache state), so the blocks below the target do not run again; with a cache they then do
        not write it either (give it only to a cache that is not decoded from later, as ``forward_exact``'s own).
        """
        B, T = self._check_tokens(tokens, cache)
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        fuse = self.fuse
        if fuse is None:
            passes, carried_state = 1, None  # the baseline ignores feedback entirely
        per_position = carried_state is not None and carried_state.dim() == 3
        if (carried_state is not None and not per_position) or (cache is not None and passes > 1):
            self._refuse_looped("a carried state or a multi-pass forward over a KV cache")
        self._check_carried(carried_state, B, T, cache)
        offset = cache.length if cache is not None else 0
        positions, mask = self._positions_and_mask(B, T, attention_mask, cache, tokens.device)
        plan = fused_positions(plain_prefix, B, T, offset, tokens.device, fused)  # (B, T) bool, or (K, B, T)
        stream = self._target_stream(tokens, target_stream, positions, mask, cache)
        out = run_passes(lambda inputs: self.run_stack(inputs, positions, mask, cache), self.lm_head, fuse, stream,
                         plan, passes, carried_state=carried_state, tol=tol, logits_to_keep=logits_to_keep,
                         plain_input=self.plain_input, shift=self.feedback_shift)
        if cache is not None:
            cache.commit(attention_mask.bool() if attention_mask is not None
                         else torch.ones(B, T, dtype=torch.bool, device=tokens.device))
        return out

    @torch.no_grad()
    def decode_token(self, tokens: torch.Tensor, cache: CacheSlots, carried_state: torch.Tensor | None) -> LMOutput:
        """One decoding step: ``self(tokens[:, None], plain_prefix=cache.length, cache=cache,
        carried_state=carried_state)`` for tokens (B,) of valid ids, every row fused when a state is carried in.
        The same numbers without the general forward's checks and plan, whose fixed cost is a large share of a
        step on a CPU (docs/benchmarks.md)."""
        B = tokens.shape[0]
        cache.check_room(1)
        fuse = self.fuse
        if carried_state is not None and fuse is not None:
            self._refuse_looped("a carried state")
        positions = cache.next_position[:, None]  # (B, 1): the new token's RoPE position (real tokens so far)
        here = torch.ones(B, 1, dtype=torch.bool, device=tokens.device)
        mask = self._decode_mask(cache, here)
        stream = self.run_lower(self.embed(tokens[:, None]), positions, mask, cache)
        inputs = stream if carried_state is None or fuse is None else fuse(stream[:, 0], carried_state)[:, None]
        hidden, head_input = self.run_stack(inputs, positions, mask, cache)
        out = LMOutput(logits=self._step_head(head_input), hidden=hidden, target_stream=stream)
        cache.commit(here)
        return out

    def _step_head(self, x: torch.Tensor) -> torch.Tensor:
        """The output head of a decoding step: the model's own bias-free ``nn.Linear`` head as the fused blocks run
        their projections (:func:`~fullband.model.linear.product`: packed for several rows), any other head (a
        retrofit's lives in the wrapped model) as called."""
        head = self.lm_head
        if fuses(x) and self._modules.get("lm_head") is head and isinstance(head, nn.Linear) and head.bias is None \
                and not fsdp_managed(self):
            return product(x, self, ("lm_head",))
        return head(x)

    def _decode_mask(self, cache: CacheSlots, here: torch.Tensor) -> Any:
        """The blocks' mask for one new token per row (``here`` (B, 1), all True) after the cached ones."""
        return self._stack_mask(torch.cat((cache.valid[:, : cache.length], here), 1), 1)

    def _target_stream(self, tokens: torch.Tensor, given: torch.Tensor | None, positions: torch.Tensor, mask: Any,
                       cache: CacheSlots | None) -> torch.Tensor:
        """(B, T, D): the plain stream at the target, ``given`` or computed here (once per forward, before its
        passes: the embedding, then the blocks below the target, which write their cache)."""
        if given is None:
            return self.run_lower(self.embed(tokens), positions, mask, cache)
        if given.shape != (*tokens.shape, self.config.d_model):
            raise ValueError(f"target_stream must have shape {(*tokens.shape, self.config.d_model)}, got "
                             f"{tuple(given.shape)}")
        return given

    def _check_carried(self, carried: torch.Tensor | None, B: int, T: int, cache: CacheSlots | None) -> None:
        if carried is None:
            return
        D = self.config.d_model
        if carried.dim() == 3:
            if cache is not None and not cache.per_position_states:
                raise ValueError("a carried state per position (B, T, D) continues a Jacobi iteration over a whole "
                                 "sequence: pass no cache with it (a chunk on a cache takes the state before it, "
                                 "(B, D))")
            if carried.shape != (B, T, D):
                raise ValueError(f"carried_state must have shape {(B, D)} or {(B, T, D)}, got {tuple(carried.shape)}")
        elif carried.shape != (B, D):
            raise ValueError(f"carried_state must have shape {(B, D)} or {(B, T, D)}, got {tuple(carried.shape)}")

    def iterate_passes(
        self,
        tokens: torch.Tensor,
        max_passes: int,
        plain_prefix: PlainPrefix = 1,
        *,
        fused: torch.Tensor | None = None,
        cache: CacheSlots | None = None,
        carried_state: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> Iterator[Pass]:
        """The forward's pass loop over tokens (B, T), yielding after every pass, so pass ``k`` is
        ``self(tokens, passes=k, plain_prefix=plain_prefix, ...)``'s. Without feedback only pass 1 comes.

        With a ``cache`` every pass writes the chunk's keys/values at the pending slots and nothing is committed:
        the caller commits the prefix it keeps (speculative verification keeps the exact, accepted positions).
        """
        B, T = self._check_tokens(tokens, cache)
        if carried_state is not None or (cache is not None and max_passes > 1):
            self._refuse_looped("a carried state or a multi-pass loop over a KV cache")
        self._check_carried(carried_state, B, T, cache)
        offset = cache.length if cache is not None else 0
        positions, mask = self._positions_and_mask(B, T, attention_mask, cache, tokens.device)
        plan = fused_positions(plain_prefix, B, T, offset, tokens.device, fused)  # (B, T) bool
        fuse = self.fuse
        stream = self._target_stream(tokens, None, positions, mask, cache)
        yield from pass_loop(lambda inputs: self.run_stack(inputs, positions, mask, cache), fuse, stream, plan,
                             max_passes if fuse is not None else 1,
                             carried_state=carried_state if fuse is not None else None, plain_input=self.plain_input,
                             shift=self.feedback_shift)

    def stack_inputs(self, tokens: torch.Tensor, previous: torch.Tensor | None, plain_prefix: int = 1, *,
                     fused: torch.Tensor | None = None) -> torch.Tensor:
        """The inputs (B, T, D) at the target of the loop's pass after one whose states were ``previous`` (None:
        pass 1)."""
        B, T = tokens.shape
        plan = fused_positions(plain_prefix, B, T, 0, tokens.device, fused)
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        stream = self.run_lower(self.embed(tokens), positions)
        plain = self.plain_input(stream) if previous is not None and self.plain_input is not None else None
        return pass_inputs(self.fuse, stream, plan, previous, None, plain=plain, shift=self.feedback_shift)

    # ------------------------------------------------------------------ exact evaluation

    @torch.no_grad()
    def forward_exact(
        self,
        tokens: torch.Tensor,
        plain_prefix: PlainPrefix = 1,
        *,
        fused: torch.Tensor | None = None,
        method: str = "auto",
        chunk_size: int = 64,
        tol: float | None = None,
        attention_mask: torch.Tensor | None = None,
        target_stream: torch.Tensor | None = None,
    ) -> LMOutput:
        """The fully recurrent states: ``sequential`` (one position at a time through the KV cache, the
        definition), ``jacobi`` (whole-sequence passes until exact, or until ``max|Δh| < tol``), ``chunked``
        (Jacobi per chunk of ``chunk_size`` on top of the cache of earlier chunks), or ``auto``: the fastest of
        them for this device and ``tol`` (:func:`~fullband.model.recurrence.auto_exact_method`). ``target_stream``
        (B, T, D): the target stream of these tokens from an earlier forward (the blocks below the target then do
        not run again)."""
        B, T = self._check_tokens(tokens, None)
        self._refuse_looped("forward_exact")
        if method == "auto":
            method = auto_exact_method(tokens.device, tol)
        if method == "jacobi":
            cap = exact_passes(fused_positions(plain_prefix, B, T, 0, tokens.device, fused), has_incoming=False)
            return self(tokens, passes=cap, plain_prefix=plain_prefix, fused=fused, tol=tol,
                        attention_mask=attention_mask, target_stream=target_stream)
        if method == "sequential":
            chunk_size = 1
        elif method != "chunked":
            raise ValueError(f"method must be one of {EXACT_METHODS}, got {method!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        cache = self.new_cache(B, T)
        return self._prefill(tokens, cache, plain_prefix, fused, chunk_size, None, tol, attention_mask, target_stream)

    def prefill(
        self,
        tokens: torch.Tensor,
        cache: CacheSlots,
        plain_prefix: PlainPrefix,
        *,
        fused: torch.Tensor | None = None,
        chunk_size: int,
        carried_state: torch.Tensor | None = None,
        tol: float | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> LMOutput:
        """Exact (chunked) prefill into ``cache``: each chunk runs until it is exact (or ``max|Δh| < tol``);
        ``fused`` (B, T) covers ``tokens``."""
        return self._prefill(tokens, cache, plain_prefix, fused, chunk_size, carried_state, tol, attention_mask, None)

    def _prefill(
        self, tokens: torch.Tensor, cache: CacheSlots, plain_prefix: PlainPrefix, fused: torch.Tensor | None,
        chunk_size: int, carried_state: torch.Tensor | None, tol: float | None, attention_mask: torch.Tensor | None,
        target_stream: torch.Tensor | None,
    ) -> LMOutput:
        self._refuse_looped("exact (sequential or chunked) prefill")
        B = tokens.shape[0]
        logits, hidden, passes = [], [], 0
        for start in range(0, tokens.shape[1], chunk_size):
            part = slice(start, start + chunk_size)
            chunk = tokens[:, part]
            chunk_mask = attention_mask[:, part] if attention_mask is not None else None
            chunk_fused = fused[..., part] if fused is not None else None
            plan = fused_positions(plain_prefix, B, chunk.shape[1], cache.length, tokens.device, chunk_fused)
            cap = exact_passes(plan, carried_state is not None)
            out = self(chunk, passes=cap, plain_prefix=plain_prefix, fused=chunk_fused, cache=cache,
                       carried_state=carried_state, tol=tol, attention_mask=chunk_mask,
                       target_stream=target_stream[:, part] if target_stream is not None else None)
            carried_state = out.hidden[:, -1] if self.fuse is not None else None
            logits.append(out.logits)
            hidden.append(out.hidden)
            passes += out.passes
        return LMOutput(logits=torch.cat(logits, 1), hidden=torch.cat(hidden, 1), passes=passes)

    # ------------------------------------------------------------------ helpers

    def _check_tokens(self, tokens: torch.Tensor, cache: CacheSlots | None) -> tuple[int, int]:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
            raise ValueError("tokens must be an integer tensor of shape (batch, seq_len)")
        B, T = tokens.shape
        if T == 0:
            raise ValueError("tokens is empty: need at least one position")
        # Not in a training forward on CUDA, where reading min/max would make the host wait for the GPU every step
        # (the Trainer checks each batch on the host; the embedding asserts on the device).
        checked = not (tokens.is_cuda and torch.is_grad_enabled())
        lo, hi = (int(tokens.min()), int(tokens.max())) if checked else (0, 0)
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range: the model's vocab_size is {self.config.vocab_size} "
                             f"(ids must be in 0..{self.config.vocab_size - 1})")
        total = T + (cache.length if cache is not None else 0)
        if total > self.config.max_seq_len:
            raise ValueError(f"sequence of {total} tokens is longer than the model context max_seq_len="
                             f"{self.config.max_seq_len}; shorten the input")
        if cache is not None:
            if cache.batch_size != B:
                raise ValueError(f"cache holds {cache.batch_size} rows but tokens has {B}")
            cache.check_room(T)
        return B, T

    def _positions_and_mask(
        self, B: int, T: int, attention_mask: torch.Tensor | None, cache: CacheSlots | None, device: torch.device
    ) -> tuple[torch.Tensor, Any]:
        """Positions (B, T) counting real tokens only (RoPE), and the blocks' attention mask (None = causal)."""
        if attention_mask is None and cache is None:
            return torch.arange(T, device=device).expand(B, T), None
        if attention_mask is not None and tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must have shape {(B, T)}, got {tuple(attention_mask.shape)}")
        chunk_valid = attention_mask.bool() if attention_mask is not None else torch.ones(B, T, dtype=torch.bool,
                                                                                           device=device)
        start = cache.next_position[:, None] if cache is not None else 0
        positions = (start + chunk_valid.long().cumsum(1) - 1).clamp(min=0)
        key_valid = chunk_valid if cache is None else torch.cat((cache.valid[:, : cache.length], chunk_valid), 1)
        return positions, self._stack_mask(key_valid, T)  # key_valid: (B, S)
