"""FeedbackLM: the one feedback forward, ``forward_exact``, the pass loop and the decoding hooks of every network.

A subclass supplies the network: ``embed`` (token embedding), ``lm_head``, ``blocks``, ``fuse`` (the fusion as
the loop calls it; None without feedback), ``run_stack`` (one pass through the blocks), ``depth_states`` (every
depth of one pass), ``logits_of_top`` (logits from the top depth state), its cache (``_empty_cache``) and the
attention mask its blocks read (``_stack_mask``), and the model-family interface of :mod:`fullband.model.family`
(its files, cache type and parameter roles). :class:`~fullband.model.lm.FullBandwidthLM` is the native network;
the families in ``fullband.integrations`` wrap pretrained transformers models.

One forward computes every execution mode of DESIGN.md §2 by running the multi-pass loop of
:mod:`fullband.model.recurrence` over a chunk of positions. Run enough passes and the chunk is exact:

- a whole sequence with ``passes = T - p + 1``           -> multi-pass (Jacobi) == sequential;
- chunks of a prompt on top of the KV cache               -> chunked prefill;
- chunks of one token, one pass each                      -> sequential reference == KV-cache decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from fullband.config import EXACT_METHODS
from fullband.model.family import FamilyInterface
from fullband.model.kv_cache import CacheSlots
from fullband.model.recurrence import (
    LMOutput,
    LoopOptions,
    Pass,
    PlainPrefix,
    auto_exact_method,
    exact_pass_count,
    fused_positions,
    pass_inputs,
    pass_loop,
    run_passes,
    truncation,
)


class FeedbackLM(FamilyInterface, nn.Module):
    config: Any  # vocab_size, d_model, n_layers, max_seq_len (the family's own config class)
    embed: nn.Embedding
    lm_head: nn.Module

    # ------------------------------------------------------------------ what a network supplies

    @property
    def fuse(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """(e_t, h_{t-1}) -> the fused input x_t, as the pass loop calls it; None without feedback."""
        raise NotImplementedError

    @property
    def plain_input(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """e_t -> the input of a plain position in passes >= 2, or None for the raw embedding (every network but
        the paper's literal input form in training)."""
        return None

    def run_stack(
        self, inputs: torch.Tensor, positions: torch.Tensor, mask: Any = None, cache: CacheSlots | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the network over inputs (B, T, D) -> (carried states h (B, T, D), head input (B, T, D))."""
        raise NotImplementedError

    def depth_states(self, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(L + 1, B, T, D): what the first block sees, then every depth, for one pass without cache or mask."""
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
        labels: torch.Tensor | None = None,  # (B, T), aligned with tokens; shifted here; -100 = ignore
        *,
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = real token, 0 = left padding
        cache: CacheSlots | None = None,
        carried_state: torch.Tensor | None = None,  # (B, D) state of the position before this chunk
        tol: float | None = None,
        jitter: float = 0.0,
        detach_passes: bool = False,
        feedback_weight: float = 1.0,
        logits_to_keep: int = 0,
        grad_passes: int = 0,
        fixed_point: bool | None = None,
    ) -> LMOutput:
        """Multi-pass forward over ``tokens`` (see the module docstring).

        ``plain_prefix`` counts absolute positions from the start of the sequence (cached ones included);
        positions before it get plain embeddings. ``tol`` stops early once ``max|h^(k) - h^(k-1)| < tol``.
        ``jitter`` adds Uniform(-jitter, jitter) noise to the states before they are fused (training).

        ``grad_passes`` m > 0 (truncated gradients, training, DESIGN.md §3): only pass 1 and the last m passes run
        with gradients and are scored. ``fixed_point`` says whether those m passes start from the fixed point
        (computed sequentially without gradients) instead of the passes between. None: this batch decides, its
        passes capped at its exact count (:func:`~fullband.model.recurrence.truncation`); True or False: the caller
        decided on a larger batch (data-parallel training, on the step's global batch), and ``passes`` runs as
        given. A looped model (``feedback_shift`` 0) has no fixed point and always runs the passes.
        """
        B, T = self._check_tokens(tokens, cache)
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        fuse = self.fuse
        if fuse is None:
            passes, carried_state = 1, None  # the baseline ignores feedback entirely
        if carried_state is not None or (cache is not None and passes > 1):
            self._refuse_looped("a carried state or a multi-pass forward over a KV cache")
        offset = cache.length if cache is not None else 0
        positions, mask = self._positions_and_mask(B, T, attention_mask, cache, tokens.device)
        fused = fused_positions(plain_prefix, B, T, offset, tokens.device)  # (B, T) bool
        if carried_state is not None and carried_state.shape != (B, self.config.d_model):
            raise ValueError(
                f"carried_state must have shape {(B, self.config.d_model)}, got {tuple(carried_state.shape)}"
            )
        exact_states = None
        if grad_passes > 0 and passes > 1:
            passes, exact_states = self._truncation(tokens, plain_prefix, passes, grad_passes, fixed_point, cache,
                                                    carried_state, attention_mask)
        out = run_passes(
            lambda inputs: self.run_stack(inputs, positions, mask, cache), self.lm_head, fuse,
            lambda: self.embed(tokens), fused, passes, labels=labels, carried_state=carried_state,
            options=LoopOptions(tol, jitter, detach_passes, feedback_weight, logits_to_keep, self.feedback_shift,
                                grad_passes),
            plain_input=self.plain_input, fixed_point=exact_states,
        )
        if cache is not None:
            cache.commit(attention_mask.bool() if attention_mask is not None else torch.ones_like(fused))
        return out

    def _truncation(
        self, tokens: torch.Tensor, plain_prefix: PlainPrefix, passes: int, grad_passes: int, fixed_point: bool | None,
        cache: CacheSlots | None, carried_state: torch.Tensor | None, attention_mask: torch.Tensor | None,
    ) -> tuple[int, Callable[[], torch.Tensor] | None]:
        """The passes a forward with truncated gradients runs, and what computes its fixed point (None: the passes)."""
        if cache is not None or carried_state is not None:
            raise ValueError("grad_passes (truncated gradients) trains on whole sequences: pass no cache or "
                             "carried_state with it")
        if fixed_point is None:  # else the caller decided both on a larger batch: the passes run as given
            passes, fixed_point = truncation(plain_prefix, tokens.shape[1], passes, grad_passes)
        if not fixed_point or self.feedback_shift == 0:
            return passes, None
        prefixes = plain_prefix.unique() if isinstance(plain_prefix, torch.Tensor) else torch.tensor([plain_prefix])
        if prefixes.numel() != 1 or (isinstance(plain_prefix, torch.Tensor) and plain_prefix.dim() != 1):
            raise ValueError("fixed_point=True needs one plain prefix for every row (the sequential fixed point "
                             "takes one); pass fixed_point=None or False")
        prefix = int(prefixes.item())
        return passes, lambda: self.forward_exact(tokens, plain_prefix=prefix, method="sequential",
                                                  attention_mask=attention_mask).hidden

    def iterate_passes(
        self,
        tokens: torch.Tensor,
        max_passes: int,
        plain_prefix: PlainPrefix = 1,
        *,
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
        offset = cache.length if cache is not None else 0
        positions, mask = self._positions_and_mask(B, T, attention_mask, cache, tokens.device)
        fused = fused_positions(plain_prefix, B, T, offset, tokens.device)  # (B, T) bool
        fuse = self.fuse
        yield from pass_loop(lambda inputs: self.run_stack(inputs, positions, mask, cache), fuse,
                             lambda: self.embed(tokens), fused, max_passes if fuse is not None else 1,
                             carried_state=carried_state if fuse is not None else None, plain_input=self.plain_input,
                             shift=self.feedback_shift)

    def stack_inputs(self, tokens: torch.Tensor, previous: torch.Tensor | None, plain_prefix: int = 1) -> torch.Tensor:
        """The inputs (B, T, D) of the loop's pass after one whose states were ``previous`` (None: pass 1)."""
        B, T = tokens.shape
        fused = fused_positions(plain_prefix, B, T, 0, tokens.device)
        emb = self.embed(tokens)
        plain = self.plain_input(emb) if previous is not None and self.plain_input is not None else None
        return pass_inputs(self.fuse, emb, fused, previous, None, plain=plain, shift=self.feedback_shift)

    # ------------------------------------------------------------------ exact evaluation

    @torch.no_grad()
    def forward_exact(
        self,
        tokens: torch.Tensor,
        plain_prefix: PlainPrefix = 1,
        *,
        method: str = "auto",
        chunk_size: int = 64,
        tol: float | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> LMOutput:
        """The fully recurrent states: ``sequential`` (one position at a time through the KV cache, the
        definition), ``jacobi`` (whole-sequence passes until exact, or until ``max|Δh| < tol``), ``chunked``
        (Jacobi per chunk of ``chunk_size`` on top of the cache of earlier chunks), or ``auto``: the fastest of
        them for this device and ``tol`` (:func:`~fullband.model.recurrence.auto_exact_method`)."""
        B, T = self._check_tokens(tokens, None)
        self._refuse_looped("forward_exact")
        if method == "auto":
            method = auto_exact_method(tokens.device, tol)
        if method == "jacobi":
            cap = exact_pass_count(plain_prefix, T, offset=0, has_incoming=False)
            return self(tokens, passes=cap, plain_prefix=plain_prefix, tol=tol, attention_mask=attention_mask)
        if method == "sequential":
            chunk_size = 1
        elif method != "chunked":
            raise ValueError(f"method must be one of {EXACT_METHODS}, got {method!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        cache = self.new_cache(B, T)
        out = self.prefill(tokens, cache, plain_prefix, chunk_size=chunk_size, tol=tol, attention_mask=attention_mask)
        return out

    def prefill(
        self,
        tokens: torch.Tensor,
        cache: CacheSlots,
        plain_prefix: PlainPrefix,
        *,
        chunk_size: int,
        carried_state: torch.Tensor | None = None,
        tol: float | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> LMOutput:
        """Exact (chunked) prefill into ``cache``: each chunk runs until it is exact (or ``max|Δh| < tol``)."""
        self._refuse_looped("exact (sequential or chunked) prefill")
        logits, hidden, passes = [], [], 0
        for start in range(0, tokens.shape[1], chunk_size):
            chunk = tokens[:, start : start + chunk_size]
            chunk_mask = attention_mask[:, start : start + chunk_size] if attention_mask is not None else None
            cap = exact_pass_count(plain_prefix, chunk.shape[1], cache.length, carried_state is not None)
            out = self(chunk, passes=cap, plain_prefix=plain_prefix, cache=cache, carried_state=carried_state,
                       tol=tol, attention_mask=chunk_mask)
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
