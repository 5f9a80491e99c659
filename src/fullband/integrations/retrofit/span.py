"""A pretrained decoder's layers run from block ``start`` to ``stop`` by fullband itself: what a retrofit at a span
with a feedback target k > 0 needs (DESIGN.md §1), since a transformers model's forward only runs all its layers.

The blocks below the target run once per forward (they write their cache once), a Jacobi pass re-runs the blocks
above it, so the layers are called here the way the model's own forward calls them: the embedding side (GPT-2 adds
its learned positions), rotary embeddings (Llama, Qwen2), the causal mask transformers builds for the layers' cache
(:func:`transformers.masking_utils.create_causal_mask`, measured at the first layer of the range, whose cache holds
the committed positions only), the cache, and the final norm. Kept to the three families the retrofit supports
(:data:`SPAN_FAMILIES`) and to full attention everywhere; anything else is refused in one line
(:func:`span_problem`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.masking_utils import create_causal_mask

SPAN_FAMILIES = ("llama", "qwen2", "gpt2")  # model_type of the families whose layers run here


def span_problem(base: PreTrainedModel) -> str | None:
    """Why ``base``'s layers cannot be run from a middle block here, or None."""
    cfg = base.config
    kind = getattr(cfg, "model_type", None)
    if kind not in SPAN_FAMILIES:
        return f"{type(base).__name__} (model_type {kind!r}) is not one of the families run from a middle block " \
               f"({', '.join(SPAN_FAMILIES)})"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(cfg, "use_sliding_window", False):
        return f"{type(base).__name__} has sliding-window layers, whose cache cannot be cut back per layer here"
    if "layer_idx" not in inspect.signature(create_causal_mask).parameters:
        return "this transformers release's create_causal_mask takes no layer_idx (needs transformers >= 5.25)"
    return None


class DecoderSpan:
    """Runs layers ``start..stop-1`` (0-based) of ``base``'s decoder on a hidden stream (B, T, D)."""

    def __init__(self, base: PreTrainedModel) -> None:
        self.base = base
        self.model = base.base_model
        self.kind = base.config.model_type
        self.cache_name = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.h if self.kind == "gpt2" else self.model.layers

    @property
    def final_norm(self) -> nn.Module:
        return self.model.ln_f if self.kind == "gpt2" else self.model.norm

    def embedded(self, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """What the first layer sees for input embeddings (B, T, D): GPT-2 adds its learned positions (and dropout),
        as its forward does to ``inputs_embeds``; Llama and Qwen2 take them as they are."""
        if self.kind == "gpt2":
            return self.model.drop(inputs + self.model.wpe(positions).to(inputs.device))
        return inputs

    def run(self, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: Any,
            start: int, stop: int) -> Iterator[torch.Tensor]:
        """Yield the output of each layer ``start..stop-1``; ``mask``: (B, S) 1 = real token over the cached and new
        positions (None: causal, no padding); ``cache``: a transformers Cache whose layers from ``start`` on hold the
        committed positions only (the caller cut them back), or None."""
        if start >= stop:
            return
        causal = create_causal_mask(config=self.base.config, inputs_embeds=hidden, attention_mask=mask,
                                    position_ids=positions, layer_idx=start, **{self.cache_name: cache})
        use_cache = cache is not None
        if self.kind == "gpt2":
            checkpointing = self.model.gradient_checkpointing and self.model.training
            for layer in self.layers[start:stop]:
                hidden = layer(hidden, cache if not checkpointing else None, causal, None, use_cache=use_cache,
                               position_ids=positions)
                yield hidden
            return
        rotary = self.model.rotary_emb(hidden, position_ids=positions)
        for layer in self.layers[start:stop]:
            hidden = layer(hidden, attention_mask=causal, position_embeddings=rotary, position_ids=positions,
                           use_cache=use_cache, **{self.cache_name: cache})
            yield hidden
