"""Retrofit latent feedback onto a pretrained transformers causal LM (Llama, Qwen2, GPT-2, ...).

``retrofit(model)`` adds a :class:`~fullband.model.fusion.LatentFusion` in front of the pretrained network: it
feeds ``inputs_embeds`` (plain token embeddings, or fused ones ``u_t = fuse(e_t, h_{t-1})``) and reads back the
state chosen by ``feedback_source``. :class:`RetrofittedLM` is a :class:`~fullband.model.feedback.FeedbackLM`
like the native model: it supplies the embedding, the blocks, the head and the cache of the pretrained network,
and inherits the one forward, ``forward_exact``, the pass loop and ``generate`` / ``stream`` (so training, SFT
included, uses the very same objective, and decoding runs in every mode on a transformers DynamicCache).

With one pass (standard mode, or no fused position) the fusion is never called and the logits are the
pretrained model's own: the token embeddings go in as ``inputs_embeds`` and positions are 0..T-1.

Which state feeds back (``feedback_source``):

- ``"last_hidden"``: the backbone's last hidden state. For Llama, Qwen2 and GPT-2 it comes *after* the final
  norm (transformers' last ``hidden_states`` entry is the normed state, the head's input): the native
  ``feedback_source="normed"``.
- an int ``k`` in 1..L-1: ``hidden_states[k]``, the residual stream after block ``k`` (before any norm): the
  native ``"layer:k"``. The top block's pre-norm output is not among transformers' hidden states (their last
  entry is the normed one), so ``k = L`` is refused rather than silently meaning the normed state.

Where it enters (``feedback_target``, DESIGN.md §1's span): 0 (the default) fuses it into the input embeddings and
runs the pretrained model's own forward; ``k`` in 1..source-1 fuses it into the residual stream after block ``k``,
and the decoder layers are then run by fullband (:mod:`.span`: the blocks below the target once per forward, the
ones above per pass), for Llama, Qwen2 and GPT-2 (others are refused at ``k > 0``).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel

from fullband.config import ConfigError
from fullband.integrations._hf_compat import cache_argument
from fullband.integrations.retrofit import io
from fullband.integrations.retrofit.cache import RetrofitCache
from fullband.integrations.retrofit.config import LAST_HIDDEN, FeedbackSource, RetrofitConfig, RetrofitOptions
from fullband.integrations.retrofit.span import DecoderSpan, span_problem
from fullband.model import LatentFusion
from fullband.model.feedback import FeedbackLM
from fullband.model.serialization import CheckpointError


class RetrofittedLM(FeedbackLM):
    family: ClassVar[str] = io.MODEL_TYPE
    cache_type: ClassVar[type[RetrofitCache]] = RetrofitCache
    train_dtype: ClassVar[torch.dtype | None] = torch.float32  # a pretrained network is often saved in half precision

    def __init__(
        self, base: PreTrainedModel, feedback_source: FeedbackSource = "last_hidden", *, init_std: float | None = None,
        feedback_target: int = 0,
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
            feedback_target=feedback_target,
        )
        _check_feedback_source(feedback_source, self.config.n_layers)
        _check_feedback_target(feedback_target, feedback_source, self.config.n_layers, base)
        self._span = DecoderSpan(base) if feedback_target > 0 else None
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

    def checkpoint_activations(self, enabled: bool = True) -> None:
        """transformers' own gradient checkpointing of the decoder layers (non-reentrant; training mode only)."""
        if hasattr(self.base, "activation_checkpointing_enable"):  # its name from transformers 5.x on
            if enabled:
                self.base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.base.activation_checkpointing_disable()
        elif enabled:
            self.base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.base.gradient_checkpointing_disable()

    def _empty_cache(self, batch_size: int, max_len: int) -> RetrofitCache:
        return RetrofitCache(self.base.config, batch_size, max_len, self.embed.weight.device)

    def run_lower(
        self,
        inputs: torch.Tensor,  # (B, T, D) token embeddings
        positions: torch.Tensor,  # (B, T)
        mask: torch.Tensor | None = None,  # (B, S) 1 = real token, over cached + new positions; None = causal
        cache: RetrofitCache | None = None,
    ) -> torch.Tensor:
        """The decoder layers below the feedback target, once per forward -> the plain target stream (B, T, D); the
        embeddings themselves at target 0 (the pretrained forward takes them as ``inputs_embeds``)."""
        if self._span is None:
            return inputs
        if cache is not None:
            cache.rewind()  # every layer back to the committed positions: this forward's chunk starts here
        first = self._span.embedded(inputs, positions)
        kv = cache.kv if cache is not None else None
        return list(self._span.run(first, positions, mask, kv, 0, self.config.feedback_target))[-1]

    def run_stack(
        self,
        inputs: torch.Tensor,  # (B, T, D) input vectors u_t at the target
        positions: torch.Tensor,  # (B, T)
        mask: torch.Tensor | None = None,  # (B, S) 1 = real token, over cached + new positions; None = causal
        cache: RetrofitCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the pretrained network above the target -> (carried states h (B, T, D), head input
        (B, T, D))."""
        if self._span is not None:
            return self._run_upper(inputs, positions, mask, cache)
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

    def _run_upper(self, inputs: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                   cache: RetrofitCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers target+1..L from the target's inputs (a pass; the layers below ran once in run_lower)."""
        k, source = self.config.feedback_target, self.config.feedback_source
        if cache is not None:
            cache.rewind(from_layer=k)  # an earlier pass over this chunk appended to these layers: this one replaces it
        carried, hidden = None, inputs
        for depth, hidden in enumerate(self._span.run(inputs, positions, mask, cache.kv if cache is not None else None,
                                                      k, self.config.n_layers), k + 1):
            if depth == source:
                carried = hidden
        top = self._span.final_norm(hidden)
        return (top if source == LAST_HIDDEN else carried).to(inputs.device), top

    def depth_states(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(L + 1, B, T, D): the pretrained network's own hidden states for a pass whose inputs at the target are
        ``inputs``; the last entry is after its final norm (Llama, Qwen2, GPT-2), the head's input."""
        if self._span is None:
            out = self.base.base_model(inputs_embeds=inputs, position_ids=positions, output_hidden_states=True)
            return torch.stack(out.hidden_states)
        k = self.config.feedback_target
        first = self._span.embedded(self.embed(tokens), positions)
        lower = [first, *self._span.run(first, positions, None, None, 0, k)][:k]
        upper = list(self._span.run(inputs, positions, None, None, k, self.config.n_layers))
        return torch.stack([*lower, inputs, *upper[:-1], self._span.final_norm(upper[-1])])

    def logits_of_top(self, state: torch.Tensor) -> torch.Tensor:
        return self.lm_head(state)  # transformers' last hidden state is already normed

    def _stack_mask(self, key_valid: torch.Tensor, T: int) -> torch.Tensor:
        """The 2D mask transformers expects: (B, S) 1 = real token, over cached + new positions."""
        return key_valid.long()

    # ------------------------------------------------------------------ the model-family interface

    def save_pretrained(self, directory: str | Path, **decoding: Any) -> None:
        """Base model (its own save_pretrained, in ``base/``) + fusion weights + ``retrofit.json``, and what
        transformers needs to open it (config.json, remote code; ``decoding`` sets its decoding defaults)."""
        io.save_retrofitted(self, directory, **decoding)

    @classmethod
    def from_pretrained(cls, directory: str | Path, **base_kwargs: Any) -> RetrofittedLM:
        """Load what :meth:`save_pretrained` wrote; ``base_kwargs`` go to the base's from_pretrained (dtype, ...)."""
        return io.load_retrofitted(cls, directory, **base_kwargs)

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
             *, feedback: bool | None = None) -> RetrofittedLM:
        if feedback is False:
            raise CheckpointError(f"feedback=False (model.feedback) is invalid for {directory}: a retrofitted "
                                  "model always has the fusion; train it single-pass with schedule.feedback_start=1")
        return io.load_quietly(cls, directory, dtype).to(device=device).eval()

    @classmethod
    def saved_config(cls, directory: str | Path) -> RetrofitConfig:
        return io.load_retrofit_config(directory)

    def load_weights(self, directory: str | Path) -> None:
        io.load_weights_into(self, directory)

    @classmethod
    def checkpoint_problem(cls, files: Collection[str]) -> str | None:
        return io.checkpoint_problem(files)

    @classmethod
    def from_source(cls, path: Path, options: RetrofitOptions | None = None, dtype: torch.dtype | None = None,
                    name: str = "") -> RetrofittedLM:
        """``retrofit(AutoModelForCausalLM.from_pretrained(path))`` from local files, fusion weights drawn from
        torch's global RNG. Loading problems raise CheckpointError whose message starts with ``name`` (default: the
        quoted path); a bad ``options.feedback_source`` or ``feedback_target`` a ConfigError naming it; an
        unsupported architecture (or a bad source without ``options``) retrofit's own ValueError /
        NotImplementedError."""
        base = io.load_base(path, dtype, name or repr(str(path)))
        try:
            if options is None:
                return cls(base, LAST_HIDDEN)
            return cls(base, options.resolve(), feedback_target=options.feedback_target)
        except ValueError as err:
            if options is not None and str(err).startswith(("feedback_source", "feedback_target")):
                raise ConfigError(f"retrofit.{str(err).splitlines()[0]}") from None
            raise


def retrofit(model: PreTrainedModel, feedback_source: FeedbackSource = "last_hidden", **kwargs: Any) -> RetrofittedLM:
    """Wrap a transformers causal LM with latent feedback; see :mod:`fullband.integrations.retrofit.lm`
    (``feedback_target=k`` fuses the state after block k, Llama, Qwen2 and GPT-2)."""
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


def _check_feedback_target(target: int, source: FeedbackSource, n_layers: int, base: PreTrainedModel) -> None:
    top = n_layers if source == LAST_HIDDEN else source
    if not (isinstance(target, int) and not isinstance(target, bool) and 0 <= target < top):
        raise ValueError(f"feedback_target={target!r} is invalid with feedback_source={source!r}: the target must lie "
                         f"below the source, 0..{top - 1} (0 = the input embeddings)")
    if target > 0 and (problem := span_problem(base)) is not None:
        raise ValueError(f"feedback_target={target} is invalid: {problem}; use feedback_target=0 (the embeddings)")


def _norm_eps(cfg: Any) -> float:
    for name in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"):
        value = getattr(cfg, name, None)
        if isinstance(value, float):
            return value
    return 1e-5
