"""FullBandwidthLM: a pre-norm decoder whose top-layer state is fed back into the next position's input.

One forward computes every execution mode of DESIGN.md §2 by running the multi-pass iteration of
:mod:`fullband.model.recurrence` over a chunk of positions. Run enough passes and the chunk is exact:

- a whole sequence with ``passes = T - p + 1``           -> multi-pass (Jacobi) == sequential;
- chunks of a prompt on top of the KV cache               -> chunked prefill;
- chunks of one token, one pass each                      -> sequential reference == KV-cache decoding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fullband.config import ModelConfig
from fullband.model.fusion import LatentFusion
from fullband.model.kv_cache import KVCache
from fullband.model.layers import Block, RMSNorm, rope_angles, rope_inv_freq
from fullband.model.recurrence import LMOutput, PlainPrefix, exact_pass_count, fused_positions, run_passes
from fullband.model.serialization import load_config, load_state_dict_into, save_pretrained


class FullBandwidthLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # RMSNorm_in on every input of the stack, plain or fused (the paper's `model(input_rmsnorm(x))`).
        self.input_norm = RMSNorm(config.d_model, config.norm_eps, init=config.input_norm_init) \
            if config.input_norm else None
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # The baseline has no fusion parameters at all, so its checkpoints are plain transformers.
        self.fusion = LatentFusion(config) if config.feedback else None
        self.register_buffer("inv_freq", rope_inv_freq(config.head_dim, config.rope_theta), persistent=False)
        self.reset_parameters()

    # ------------------------------------------------------------------ setup

    def reset_parameters(self) -> None:
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)  # keeps ||h|| O(1) with depth (GPT-2 scaling)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_residual_out = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if is_residual_out else std)
            elif isinstance(module, RMSNorm):
                nn.init.constant_(module.weight, module.init)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """An empty preallocated KV cache for ``batch_size`` rows of at most ``max_len`` tokens."""
        max_len = max_len or self.config.max_seq_len
        if max_len > self.config.max_seq_len:
            raise ValueError(f"cache length {max_len} exceeds the model context max_seq_len={self.config.max_seq_len}")
        p = self.embed.weight
        return KVCache(self.config.n_layers, batch_size, self.config.kv_heads, self.config.head_dim, max_len,
                       p.dtype, p.device)

    def num_parameters(self, include_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if include_embedding else n - self.embed.weight.numel()

    # ------------------------------------------------------------------ the stack

    def run_stack(
        self,
        inputs: torch.Tensor,  # (B, T, D) input vectors u_t
        positions: torch.Tensor,  # (B, T) RoPE positions
        mask: torch.Tensor | None = None,  # (B, 1, T, S) bool; None = plain causal without cache
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass through all blocks -> (carried states h (B, T, D), final-normed states (B, T, D)).

        ``inputs`` are embeddings or fused states; with ``input_norm`` the stack normalises them first.
        """
        rope = rope_angles(positions, self.inv_freq, inputs.dtype)
        x = self.input_norm(inputs) if self.input_norm is not None else inputs
        carried = None
        for i, block in enumerate(self.blocks, start=1):
            x = block(x, rope, mask, cache)
            if i == self.config.feedback_layer:
                carried = x
        normed = self.norm(x)
        if self.config.feedback_source == "normed":
            carried = normed
        return carried, normed

    @property
    def fuse(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """(e_t, h_{t-1}) -> the fused input x_t (the stack normalises it), as the pass loop calls it; None for
        the baseline."""
        if self.fusion is None:
            return None
        if self.fusion.token_norm is None:  # gate_norm="shared": the gate reads RMSNorm_in(e_t)
            return lambda token_emb, prev_state: self.fusion(self.input_norm(token_emb), prev_state)
        return self.fusion

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T) token ids
        passes: int = 1,
        plain_prefix: PlainPrefix = 1,
        labels: torch.Tensor | None = None,  # (B, T), aligned with tokens; shifted here; -100 = ignore
        *,
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = real token, 0 = left padding
        cache: KVCache | None = None,
        carried_state: torch.Tensor | None = None,  # (B, D) state of the position before this chunk
        tol: float | None = None,
        jitter: float = 0.0,
        detach_passes: bool = False,
        feedback_weight: float = 1.0,
        logits_to_keep: int = 0,
    ) -> LMOutput:
        """Multi-pass forward over ``tokens`` (see the module docstring).

        ``plain_prefix`` counts absolute positions from the start of the sequence (cached ones included);
        positions before it get plain embeddings. ``tol`` stops early once ``max|h^(k) - h^(k-1)| < tol``.
        ``jitter`` adds Uniform(-jitter, jitter) noise to the states before they are fused (training).
        """
        B, T = self._check_tokens(tokens, cache)
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        if self.fusion is None:
            passes, carried_state = 1, None  # the baseline ignores feedback entirely
        offset = cache.length if cache is not None else 0
        positions, mask = self._positions_and_mask(B, T, attention_mask, cache, tokens.device)
        fused = fused_positions(plain_prefix, B, T, offset, tokens.device)  # (B, T) bool
        if carried_state is not None and carried_state.shape != (B, self.config.d_model):
            raise ValueError(
                f"carried_state must have shape {(B, self.config.d_model)}, got {tuple(carried_state.shape)}"
            )
        out = run_passes(
            lambda inputs: self.run_stack(inputs, positions, mask, cache), self.lm_head, self.fuse,
            self.embed(tokens), fused, passes, labels=labels, carried_state=carried_state, tol=tol, jitter=jitter,
            detach_passes=detach_passes, feedback_weight=feedback_weight, logits_to_keep=logits_to_keep,
        )
        if cache is not None:
            cache.commit(attention_mask.bool() if attention_mask is not None else torch.ones_like(fused))
        return out

    # ------------------------------------------------------------------ exact evaluation

    @torch.no_grad()
    def forward_exact(
        self,
        tokens: torch.Tensor,
        plain_prefix: PlainPrefix = 1,
        *,
        method: str = "sequential",
        chunk_size: int = 64,
        tol: float | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> LMOutput:
        """The fully recurrent states: ``sequential`` (one position at a time through the KV cache, the
        definition), ``jacobi`` (whole-sequence passes until exact, or until ``max|Δh| < tol``), or
        ``chunked`` (Jacobi per chunk of ``chunk_size`` on top of the cache of earlier chunks)."""
        B, T = self._check_tokens(tokens, None)
        if method == "jacobi":
            cap = exact_pass_count(plain_prefix, T, offset=0, has_incoming=False)
            return self(tokens, passes=cap, plain_prefix=plain_prefix, tol=tol, attention_mask=attention_mask)
        if method == "sequential":
            chunk_size = 1
        elif method != "chunked":
            raise ValueError(f"method must be 'sequential', 'jacobi' or 'chunked', got {method!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        cache = self.new_cache(B, T)
        out = self.prefill(tokens, cache, plain_prefix, chunk_size=chunk_size, tol=tol, attention_mask=attention_mask)
        return out

    def prefill(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        plain_prefix: PlainPrefix,
        *,
        chunk_size: int,
        carried_state: torch.Tensor | None = None,
        tol: float | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> LMOutput:
        """Exact (chunked) prefill into ``cache``: each chunk runs until it is exact (or ``max|Δh| < tol``)."""
        logits, hidden, passes = [], [], 0
        for start in range(0, tokens.shape[1], chunk_size):
            chunk = tokens[:, start : start + chunk_size]
            chunk_mask = attention_mask[:, start : start + chunk_size] if attention_mask is not None else None
            cap = exact_pass_count(plain_prefix, chunk.shape[1], cache.length, carried_state is not None)
            out = self(chunk, passes=cap, plain_prefix=plain_prefix, cache=cache, carried_state=carried_state,
                       tol=tol, attention_mask=chunk_mask)
            carried_state = out.hidden[:, -1] if self.fusion is not None else None
            logits.append(out.logits)
            hidden.append(out.hidden)
            passes += out.passes
        return LMOutput(logits=torch.cat(logits, 1), hidden=torch.cat(hidden, 1), passes=passes)

    # ------------------------------------------------------------------ checkpoints

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``model.safetensors`` and ``config.json`` to ``directory`` (each file atomically)."""
        save_pretrained(self, directory)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        feedback: bool | None = None,
    ) -> FullBandwidthLM:
        """Load a directory written by :meth:`save_pretrained`; mismatched tensors raise CheckpointError.

        ``feedback=True`` on a checkpoint trained without feedback adds freshly initialised fusion weights (the
        paper's late introduction of feedback); the standard path's outputs are unchanged. ``feedback=False``
        drops a checkpoint's fusion weights.
        """
        config = load_config(directory)
        changed = feedback is not None and feedback != config.feedback
        if changed:
            config = dataclasses.replace(config, feedback=feedback)
        model = cls(config)
        load_state_dict_into(model, directory, skip_prefix="fusion." if changed else None)
        return model.to(device=device, dtype=dtype).eval()

    # ------------------------------------------------------------------ decoding

    # Decoding lives in fullband.generation, which binds its functions here when it is imported (the model
    # package imports nothing from it). ``import fullband`` users get it with the model classes.
    _decoding: ClassVar[dict[str, Callable[..., Any]]] = {}

    @classmethod
    def bind_decoding(cls, generate: Callable[..., Any], stream: Callable[..., Any]) -> None:
        """Called by :mod:`fullband.generation` on import: what :meth:`generate` and :meth:`stream` run."""
        FullBandwidthLM._decoding.update(generate=generate, stream=stream)

    def _decoder(self, name: str) -> Callable[..., Any]:
        if name not in FullBandwidthLM._decoding:
            raise RuntimeError(f"{type(self).__name__}.{name} needs fullband.generation: import fullband.generation "
                               "(or take the model from `import fullband`, which does)")
        return FullBandwidthLM._decoding[name]

    def generate(
        self, prompt_ids: torch.Tensor | list, max_new_tokens: int = 64, mode: str = "soft", **kwargs: Any
    ) -> torch.Tensor | list:
        """Decode in ``mode`` (standard | soft | fused | exact); see :func:`fullband.generation.generate`."""
        return self._decoder("generate")(self, prompt_ids, max_new_tokens, mode, **kwargs)

    def stream(
        self, prompt_ids: torch.Tensor | list, max_new_tokens: int = 64, mode: str = "soft", **kwargs: Any
    ) -> Iterator[torch.Tensor]:
        """Yield each step's tokens (B,); see :func:`fullband.generation.stream`."""
        return self._decoder("stream")(self, prompt_ids, max_new_tokens, mode, **kwargs)

    # ------------------------------------------------------------------ helpers

    def _check_tokens(self, tokens: torch.Tensor, cache: KVCache | None) -> tuple[int, int]:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
            raise ValueError("tokens must be an integer tensor of shape (batch, seq_len)")
        B, T = tokens.shape
        if T == 0:
            raise ValueError("tokens is empty: need at least one position")
        lo, hi = int(tokens.min()), int(tokens.max())
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

    @staticmethod
    def _positions_and_mask(
        B: int, T: int, attention_mask: torch.Tensor | None, cache: KVCache | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """RoPE positions (B, T) counting real tokens only, and the attention mask (None = plain causal)."""
        if attention_mask is None and cache is None:
            return torch.arange(T, device=device).expand(B, T), None
        chunk_valid = (attention_mask if attention_mask is not None else torch.ones(B, T, device=device)).bool()
        if attention_mask is not None and tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must have shape {(B, T)}, got {tuple(attention_mask.shape)}")
        offset = cache.length if cache is not None else 0
        start = cache.next_position[:, None] if cache is not None else 0
        positions = (start + chunk_valid.long().cumsum(1) - 1).clamp(min=0)
        key_valid = chunk_valid if cache is None else torch.cat((cache.valid[:, :offset], chunk_valid), 1)  # (B, S)
        query_pos = torch.arange(offset, offset + T, device=device)[:, None]  # (T, 1)
        key_pos = torch.arange(offset + T, device=device)[None, :]  # (1, S)
        causal = key_pos <= query_pos  # (T, S)
        # Pads attend to themselves only, so no softmax row is empty (which would give NaN).
        mask = causal & (key_valid[:, None, :] | (key_pos == query_pos))  # (B, T, S)
        return positions, mask[:, None]
