"""FullBandwidthLM: the native network under :class:`~fullband.model.feedback.FeedbackLM`'s one feedback forward.

A pre-norm decoder (RMSNorm, RoPE or no positional encoding, grouped-query attention, SwiGLU) whose top-layer
state is fed back into the next position's input through :class:`~fullband.model.fusion.LatentFusion`. This module
holds what is native: the layers, the input norm, the KV cache, the initialisation and the checkpoint files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fullband.config import ModelConfig
from fullband.model.feedback import FeedbackLM
from fullband.model.fusion import LatentFusion
from fullband.model.kv_cache import CacheSlots, KVCache
from fullband.model.layers import Block, RMSNorm, RopeTables, rope_angles, rope_inv_freq
from fullband.model.linear import Linear, cpu_inference
from fullband.model.serialization import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    load_config,
    load_state_dict_into,
    save_pretrained,
)


class FullBandwidthLM(FeedbackLM):
    family: ClassVar[str] = "fullband"
    cache_type: ClassVar[type[KVCache]] = KVCache
    shardable: ClassVar[bool] = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # RMSNorm_in here when plain embeddings meet it too ("paper", "all"); "fused" keeps it in the fusion.
        self.input_norm = RMSNorm(config.d_model, config.norm_eps, init=config.input_gain) \
            if config.input_norm in ("paper", "all") else None
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
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

    def _empty_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty preallocated KV cache for ``batch_size`` rows of at most ``max_len`` tokens."""
        p = self.embed.weight
        return KVCache(self.config.n_layers, batch_size, self.config.kv_heads, self.config.head_dim, max_len,
                       p.dtype, p.device)

    # ------------------------------------------------------------------ the stack

    def run_lower(
        self,
        inputs: torch.Tensor,  # (B, T, D) token embeddings
        positions: torch.Tensor,  # (B, T) RoPE positions
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Blocks 1..k (k = feedback_target) over the embeddings -> the plain target stream z^k (B, T, D); the
        embeddings themselves at target 0 (the stack's own input norm, if any, comes after the fusion)."""
        k = self.config.feedback_target
        if k == 0:
            return inputs
        rope = self._rope(positions, inputs.dtype)
        return list(self._through_blocks(inputs, rope, mask, cache, 0, k))[-1]

    def run_stack(
        self,
        inputs: torch.Tensor,  # (B, T, D) input vectors u_t at the target (the stream, fused where the plan says)
        positions: torch.Tensor,  # (B, T) RoPE positions (unused with position_encoding="none")
        mask: torch.Tensor | None = None,  # (B, 1, T, S) bool; None = plain causal without cache
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass through blocks k+1..L -> (carried states h (B, T, D), final-normed states (B, T, D)).

        ``inputs`` are embeddings or fused states at target 0 (with ``input_norm="all"`` the stack normalises them
        first), the target stream above it."""
        rope = self._rope(positions, inputs.dtype)
        k, source = self.config.feedback_target, self.config.feedback_layer
        if mask is not None and mask.dtype == torch.bool and cpu_inference(inputs):
            # The additive mask every block's attention would make of the boolean one, made once (what
            # scaled_dot_product_attention does with a boolean mask: 0 where it attends, -inf elsewhere).
            mask = torch.zeros(mask.shape, dtype=inputs.dtype, device=mask.device).masked_fill_(~mask, -math.inf)
        carried = None
        for depth, x in enumerate(self._through_blocks(inputs, rope, mask, cache, k, self.config.n_layers), k):
            if depth == source:
                carried = x
        normed = self.norm(x)
        if self.config.feedback_source == "normed":
            carried = normed
        return carried, normed

    def depth_states(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(L + 1, B, T, D): the inputs the first block sees (normed with ``input_norm="all"``), then every block's
        output, for a pass whose inputs at the target are ``inputs`` (no mask, no cache)."""
        k = self.config.feedback_target
        rope = self._rope(positions, inputs.dtype)
        lower = list(self._through_blocks(self.embed(tokens), rope, None, None, 0, k))[:-1] if k else []
        return torch.stack(lower + list(self._through_blocks(inputs, rope, None, None, k, self.config.n_layers)))

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...] | None:
        """RoPE's cos/sin for ``positions``; None without a positional encoding (NoPE: the blocks never see them)."""
        if self.config.position_encoding == "none":
            return None
        rope = rope_angles(positions, self.inv_freq, dtype)
        # Inference keeps the fused decoding step's tables beside them (made once per forward, for every block).
        return RopeTables(rope) if cpu_inference(positions) else rope

    def logits_of_top(self, state: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(state))  # the top block's output is before the final norm

    def _through_blocks(
        self, inputs: torch.Tensor, rope: tuple[torch.Tensor, ...] | None, mask: torch.Tensor | None,
        cache: KVCache | None, start: int = 0, stop: int | None = None,
    ) -> Iterator[torch.Tensor]:
        """Yield the input block ``start + 1`` sees (depth ``start``), then the outputs of blocks start+1..stop
        (depths start+1..stop; ``stop`` None = L). At depth 0 that input is normalised with ``input_norm="all"``."""
        x = self.input_norm(inputs) if self.config.input_norm == "all" and start == 0 else inputs
        yield x
        compiled = self.__dict__.get("_compiled_blocks")
        blocks = compiled if compiled and torch.is_grad_enabled() else self.blocks
        # Recomputing a block that writes the KV cache would write it twice: only cache-free forwards with gradients.
        recompute = self.__dict__.get("_checkpoint_blocks", False) and cache is None and torch.is_grad_enabled()
        for block in blocks[start:stop]:
            if recompute:
                x = checkpoint(block, x, rope, mask, None, use_reentrant=False)
            else:
                x = block(x, rope, mask, cache)
            yield x

    def compile_blocks(self) -> None:
        """torch.compile each block for the forwards that build a graph for backward (training).

        The compiled blocks sit outside the module tree (parameter names and checkpoints do not change) and
        share the blocks' weights; evaluation and decoding (no gradients) keep running the eager blocks, whose
        shapes change every step and would make the compiler recompile."""
        self.__dict__["_compiled_blocks"] = [torch.compile(block) for block in self.blocks]

    def uncompile_blocks(self) -> None:
        """Back to eager blocks everywhere (the trainer's fallback when compiling fails)."""
        self.__dict__.pop("_compiled_blocks", None)

    @property
    def fuse(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """(e_t, h_{t-1}) -> the fused input, as the pass loop calls it; None for the baseline.

        "fused": the fusion normalises its output itself; "all": the stack normalises every input; "paper": the
        fused input is normalised here, since the stack must leave pass 1's plain inputs raw."""
        if self.fusion is None:
            return None
        form, norm, fusion = self.config.input_norm, self.input_norm, self.fusion
        shared_gate = fusion.token_norm is None and form != "fused"  # gate_norm="shared": it reads RMSNorm_in(e_t)
        if form == "paper":
            if shared_gate:
                return lambda token_emb, prev_state: norm(fusion(norm(token_emb), prev_state))
            return lambda token_emb, prev_state: norm(fusion(token_emb, prev_state))
        if shared_gate:
            return lambda token_emb, prev_state: fusion(norm(token_emb), prev_state)
        return fusion

    @property
    def plain_input(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The paper's literal form normalises plain positions in training passes >= 2 (App. C: ``model(
        input_rmsnorm(prefix_mixin(x, e)))``); at inference, and in every other form, they stay raw."""
        return self.input_norm if self.config.input_norm == "paper" and self.training else None

    # ------------------------------------------------------------------ checkpoints

    def save_pretrained(self, directory: str | Path, **decoding: Any) -> None:
        """Write ``model.safetensors`` and ``config.json`` to ``directory`` (each file atomically); ``decoding``
        overrides the decoding defaults recorded in config.json."""
        save_pretrained(self, directory, **decoding)

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
             *, feedback: bool | None = None) -> FullBandwidthLM:
        return cls.from_pretrained(directory, device=device, dtype=dtype, feedback=feedback)

    @classmethod
    def saved_config(cls, directory: str | Path) -> ModelConfig:
        return load_config(directory)

    def load_weights(self, directory: str | Path) -> None:
        if (saved := load_config(directory)) != self.config:
            raise CheckpointError(f"{directory} holds a model with config {saved}, not {self.config}")
        load_state_dict_into(self, directory)

    @classmethod
    def checkpoint_problem(cls, files: Collection[str]) -> str | None:
        missing = [name for name in (WEIGHTS_NAME, CONFIG_NAME) if name not in files]
        return f"does not list {missing[0]}" if missing else None

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

    # ------------------------------------------------------------------ attention mask

    def _decode_mask(self, cache: CacheSlots, here: torch.Tensor) -> torch.Tensor | None:
        # On a CPU, where reading it back costs nothing: no mask when no cached slot is padding (one token per row
        # attends to every cached key, as the mask of all True would say).
        if cache.valid.device.type == "cpu" and bool(cache.valid[:, : cache.length].all()):
            return None
        return super()._decode_mask(cache, here)

    def _stack_mask(self, key_valid: torch.Tensor, T: int) -> torch.Tensor:
        """(B, 1, T, S) bool: causal over the cached and new positions, real keys only."""
        S = key_valid.shape[1]
        query_pos = torch.arange(S - T, S, device=key_valid.device)[:, None]  # (T, 1)
        key_pos = torch.arange(S, device=key_valid.device)[None, :]  # (1, S)
        causal = key_pos <= query_pos  # (T, S)
        # Pads attend to themselves only, so no softmax row is empty (which would give NaN).
        mask = causal & (key_valid[:, None, :] | (key_pos == query_pos))  # (B, T, S)
        return mask[:, None]
