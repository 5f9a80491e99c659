"""Retrofit latent feedback onto a pretrained transformers causal LM (Llama, Qwen2, GPT-2, ...).

``retrofit(model)`` adds a :class:`~fullband.model.fusion.LatentFusion` in front of the pretrained network: it
feeds ``inputs_embeds`` (plain token embeddings, or fused ones ``u_t = fuse(e_t, h_{t-1})``) and reads back the
state chosen by ``feedback_source``. The wrapper has FullBandwidthLM's API: its forward is the shared multi-pass
loop :func:`~fullband.model.recurrence.run_passes` (so training, SFT included, uses the very same objective),
``forward_exact`` / ``prefill`` are the native methods themselves, and ``generate`` / ``stream`` are
:mod:`fullband.generation`'s, decoding in every mode on a transformers DynamicCache.

With one pass (standard mode, or no fused position) the fusion is never called and the logits are the
pretrained model's own: the token embeddings go in as ``inputs_embeds`` and positions are 0..T-1.

Which state feeds back (``feedback_source``):

- ``"last_hidden"``: the backbone's last hidden state. For Llama, Qwen2 and GPT-2 it comes *after* the final
  norm (transformers' last ``hidden_states`` entry is the normed state, the head's input): the native
  ``feedback_source="normed"``.
- an int ``k`` in 1..L-1: ``hidden_states[k]``, the residual stream after block ``k`` (before any norm): the
  native ``"layer:k"``. The top block's pre-norm output is not among transformers' hidden states (their last
  entry is the normed one), so ``k = L`` is refused rather than silently meaning the normed state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

import fullband.generation  # noqa: F401 (binds generate / stream)
from fullband.integrations._hf_compat import cache_argument
from fullband.integrations.retrofit.cache import RetrofitCache
from fullband.integrations.retrofit.config import FeedbackSource, RetrofitConfig
from fullband.integrations.retrofit.io import load_retrofitted, save_retrofitted
from fullband.model import FullBandwidthLM, LatentFusion, LMOutput, run_passes
from fullband.model.recurrence import PlainPrefix, fused_positions


class RetrofittedLM(nn.Module):
    def __init__(
        self, base: PreTrainedModel, feedback_source: FeedbackSource = "last_hidden", *, init_std: float | None = None
    ) -> None:
        super().__init__()
        _check_supported(base)
        cfg = base.config
        self.base = base
        self.config = RetrofitConfig(
            base_architecture=type(base).__name__,
            feedback_source=feedback_source,
            vocab_size=base.get_input_embeddings().num_embeddings,
            d_model=cfg.hidden_size,
            n_layers=cfg.num_hidden_layers,
            max_seq_len=cfg.max_position_embeddings,
            norm_eps=_norm_eps(cfg),
            init_std=init_std if init_std is not None else (getattr(cfg, "initializer_range", None) or 0.02),
        )
        _check_feedback_source(feedback_source, self.config.n_layers)
        p = self.embed.weight
        # The pretrained network keeps its own plain inputs, so fused inputs start at its embeddings' scale.
        embed_rms = float(p.detach().float().pow(2).mean().sqrt())
        self.fusion = LatentFusion(d_model=self.config.d_model, norm_eps=self.config.norm_eps, out_gain=embed_rms)
        for proj in (self.fusion.gate_proj, self.fusion.state_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=self.config.init_std)
        self.fusion.to(device=p.device, dtype=p.dtype)
        self._cache_arg = cache_argument(base.base_model.forward)  # "cache" from transformers 5.24 on

    # ------------------------------------------------------------------ the pretrained network

    @property
    def fuse(self) -> LatentFusion:
        """The fusion as the pass loop calls it (its own gate norm and RMSNorm_in)."""
        return self.fusion

    @property
    def embed(self) -> nn.Embedding:
        return self.base.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.base.get_output_embeddings()

    @property
    def blocks(self) -> nn.ModuleList:
        """The decoder layers (what ``torch.compile`` of fullband's trainer compiles one by one)."""
        for name in ("layers", "h", "blocks"):
            layers = getattr(self.base.base_model, name, None)
            if isinstance(layers, nn.ModuleList):
                return layers
        raise AttributeError(f"cannot find the decoder layers of {self.config.base_architecture}")

    def num_parameters(self, include_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if include_embedding else n - self.embed.weight.numel()

    def new_cache(self, batch_size: int, max_len: int | None = None) -> RetrofitCache:
        """An empty decoding cache for ``batch_size`` rows of at most ``max_len`` tokens."""
        max_len = max_len or self.config.max_seq_len
        if max_len > self.config.max_seq_len:
            raise ValueError(f"cache length {max_len} exceeds the model context max_seq_len={self.config.max_seq_len}")
        return RetrofitCache(self.base.config, batch_size, max_len, self.embed.weight.device)

    def run_stack(
        self,
        inputs: torch.Tensor,  # (B, T, D) input vectors u_t
        positions: torch.Tensor,  # (B, T)
        mask: torch.Tensor | None = None,  # (B, S) 1 = real token, over cached + new positions; None = causal
        cache: RetrofitCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the pretrained network -> (carried states h (B, T, D), head input (B, T, D))."""
        cache_kwargs = {}
        if cache is not None:
            cache.rewind()
            cache_kwargs = {self._cache_arg: cache.kv}
        source = self.config.feedback_source
        out = self.base.base_model(inputs_embeds=inputs, attention_mask=mask, position_ids=positions,
                                   use_cache=cache is not None, output_hidden_states=source != "last_hidden",
                                   **cache_kwargs)
        top = out.last_hidden_state  # after the final norm (Llama, Qwen2, GPT-2): the head's input
        carried = top if source == "last_hidden" else out.hidden_states[source]
        return carried.to(inputs.device), top  # the fusion sits with the embedding (a model split over devices)

    # ------------------------------------------------------------------ forward (FullBandwidthLM's API)

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T) token ids
        passes: int = 1,
        plain_prefix: PlainPrefix = 1,
        labels: torch.Tensor | None = None,  # (B, T), aligned with tokens; shifted here; -100 = ignore
        *,
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = real token, 0 = left padding
        cache: RetrofitCache | None = None,
        carried_state: torch.Tensor | None = None,  # (B, D) state of the position before this chunk
        tol: float | None = None,
        jitter: float = 0.0,
        detach_passes: bool = False,
        feedback_weight: float = 1.0,
        logits_to_keep: int = 0,
    ) -> LMOutput:
        """Multi-pass forward over ``tokens``, exactly as :meth:`FullBandwidthLM.forward`."""
        B, T = self._check_tokens(tokens, cache)
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        offset = cache.length if cache is not None else 0
        positions, mask = self._positions_and_mask(B, T, attention_mask, cache, tokens.device)
        fused = fused_positions(plain_prefix, B, T, offset, tokens.device)  # (B, T) bool
        if carried_state is not None and carried_state.shape != (B, self.config.d_model):
            raise ValueError(
                f"carried_state must have shape {(B, self.config.d_model)}, got {tuple(carried_state.shape)}"
            )
        out = run_passes(
            lambda inputs: self.run_stack(inputs, positions, mask, cache), self.lm_head, self.fusion,
            self.embed(tokens), fused, passes, labels=labels, carried_state=carried_state, tol=tol, jitter=jitter,
            detach_passes=detach_passes, feedback_weight=feedback_weight, logits_to_keep=logits_to_keep,
        )
        if cache is not None:
            cache.commit(attention_mask.bool() if attention_mask is not None else torch.ones_like(fused))
        return out

    # The exact evaluation, the chunked exact prefill and the token checks use only what both models offer
    # (forward, new_cache, fusion, config.vocab_size/max_seq_len and the cache's length/check_room), so they
    # are the native methods themselves rather than copies.
    forward_exact = FullBandwidthLM.forward_exact
    prefill = FullBandwidthLM.prefill
    _check_tokens = FullBandwidthLM._check_tokens

    @staticmethod
    def _positions_and_mask(
        B: int, T: int, attention_mask: torch.Tensor | None, cache: RetrofitCache | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Positions (B, T) counting real tokens only, and the 2D mask transformers expects (None = causal)."""
        if attention_mask is None and cache is None:
            return torch.arange(T, device=device).expand(B, T), None
        if attention_mask is not None and tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must have shape {(B, T)}, got {tuple(attention_mask.shape)}")
        chunk_valid = attention_mask.bool() if attention_mask is not None else torch.ones(B, T, dtype=torch.bool,
                                                                                           device=device)
        start = cache.next_position[:, None] if cache is not None else 0
        positions = (start + chunk_valid.long().cumsum(1) - 1).clamp(min=0)
        key_valid = chunk_valid if cache is None else torch.cat((cache.valid[:, : cache.length], chunk_valid), 1)
        return positions, key_valid.long()  # (B, T), (B, S)

    # ------------------------------------------------------------------ decoding and checkpoints

    def generate(
        self, prompt_ids: torch.Tensor | list, max_new_tokens: int = 64, mode: str = "soft", **kwargs: Any
    ) -> torch.Tensor | list:
        """Decode in ``mode`` (standard | soft | fused | exact); see :func:`fullband.generation.generate`."""
        from fullband.generation import generate

        return generate(self, prompt_ids, max_new_tokens, mode, **kwargs)

    def stream(
        self, prompt_ids: torch.Tensor | list, max_new_tokens: int = 64, mode: str = "soft", **kwargs: Any
    ) -> Iterator[torch.Tensor]:
        """Yield each step's tokens (B,); see :func:`fullband.generation.stream`."""
        from fullband.generation import stream

        return stream(self, prompt_ids, max_new_tokens, mode, **kwargs)

    def save_pretrained(self, directory: str | Path, **decoding: Any) -> None:
        """Base model (its own save_pretrained, in ``base/``) + fusion weights + ``retrofit.json``, and what
        transformers needs to open it (config.json, remote code; ``decoding`` sets its decoding defaults)."""
        save_retrofitted(self, directory, **decoding)

    @classmethod
    def from_pretrained(cls, directory: str | Path, **base_kwargs: Any) -> RetrofittedLM:
        """Load what :meth:`save_pretrained` wrote; ``base_kwargs`` go to the base's from_pretrained (dtype, ...)."""
        return load_retrofitted(cls, directory, **base_kwargs)


def retrofit(model: PreTrainedModel, feedback_source: FeedbackSource = "last_hidden", **kwargs: Any) -> RetrofittedLM:
    """Wrap a transformers causal LM with latent feedback; see :mod:`fullband.integrations.retrofit.lm`."""
    return RetrofittedLM(model, feedback_source, **kwargs)


def _check_supported(base: PreTrainedModel) -> None:
    cfg = base.config
    if getattr(cfg, "is_encoder_decoder", False) or base.get_output_embeddings() is None:
        raise ValueError(f"retrofit needs a decoder-only causal LM with an LM head, got {type(base).__name__}")
    # The head is applied outside the model's forward, so a transform of the logits after it would be lost.
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(cfg, name, None) not in (None, 1.0):
            raise NotImplementedError(f"retrofit does not support {type(base).__name__}: it post-processes the "
                                      f"logits ({name}={getattr(cfg, name)!r})")


def _check_feedback_source(source: FeedbackSource, n_layers: int) -> None:
    if source == "last_hidden":
        return
    if isinstance(source, int) and not isinstance(source, bool) and 1 <= source < n_layers:
        return
    raise ValueError(
        f"feedback_source={source!r} is invalid: use 'last_hidden' (the state after the final norm) or a block "
        f"index 1..{n_layers - 1} (the residual stream after that block); transformers does not expose the top "
        "block's pre-norm output"
    )


def _norm_eps(cfg: Any) -> float:
    for name in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"):
        value = getattr(cfg, name, None)
        if isinstance(value, float):
            return value
    return 1e-5
