"""The native model as a transformers model: ``AutoConfig`` / ``AutoModelForCausalLM`` / ``generate``.

``FullBandwidthForCausalLM`` *is* a :class:`~fullband.FullBandwidthLM`: it adopts the native module's registries
(submodules and buffers), so its parameter names, and so its safetensors files, are the native ones, and every
forward runs the native code. ``generate`` (GenerationMixin) keeps the native decoding state — KV cache plus
each row's carried state, :class:`fullband.generation.DecodeState` — in the slot transformers keeps for the cache
(``cache`` from transformers 5.24, ``past_key_values`` before), so the latent state travels between steps.

Importing this module registers the model type ``"fullband"`` with the Auto classes (no trust_remote_code).
Without that import, ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` finds these classes
through ``auto_map`` and the thin remote-code modules that every fullband checkpoint holds
(:mod:`fullband.hub`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from fullband import hub
from fullband.config import ModelConfig
from fullband.generation.decoding import DecodeState, decode_step, prefill
from fullband.integrations._hf_compat import OUTPUT_CACHE_FIELD
from fullband.model import FullBandwidthLM
from fullband.model.layers import RMSNorm, rope_inv_freq
from fullband.modes import DEFAULT_SCORE_MODE, DecodeOptions, DecodingMode

try:  # transformers >= 5: init functions that skip tensors already loaded from a checkpoint
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    from torch.nn import init

MODEL_TYPE = hub.MODEL_TYPE
DECODING_DEFAULTS: dict[str, Any] = hub.DECODING_DEFAULTS
CACHE_GROWTH = 256  # positions added to the decoding KV cache whenever it fills up

_MODEL_FIELDS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


class FullBandwidthConfig(PretrainedConfig):
    """Every :class:`~fullband.ModelConfig` field under its own name, plus the default decoding of ``generate``:
    ``decoding_mode`` (a registered mode's spelling: standard | soft | fused:K | exact) and ``exact_chunk_size``
    (exact), and ``score_mode``, the mode of a forward without a decoding state (see
    ``fullband.hub.DECODING_DEFAULTS``). A config.json saved before fused:K carried its count
    (``decoding_mode="fused"`` beside ``prefill_passes=k``) reads as ``fused:k`` (``hub.read_decoding``).
    """

    model_type = MODEL_TYPE
    # Standard HF names, read by generic tools (lm-eval, DynamicCache, pipelines).
    attribute_map = {  # noqa: RUF012 (a transformers class attribute)
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "max_position_embeddings": "max_seq_len",
    }

    def __init__(self, **kwargs: Any) -> None:
        hub.read_decoding(kwargs)
        for name, default in {**_MODEL_FIELDS, **DECODING_DEFAULTS}.items():
            setattr(self, name, kwargs.pop(name, default))
        kwargs["tie_word_embeddings"] = self.tie_embeddings  # transformers ties lm_head to the embedding by this
        kwargs.setdefault("auto_map", hub.auto_map())  # remote code: tools that never import fullband open it
        kwargs.pop("fullband_version", None)
        super().__init__(**kwargs)
        self.to_model_config()  # reject bad values now, with ModelConfig's messages
        check_decoding(self.decoding_mode, self.exact_chunk_size, self.score_mode)

    def to_model_config(self) -> ModelConfig:
        return ModelConfig(**{name: getattr(self, name) for name in _MODEL_FIELDS})

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs: Any) -> FullBandwidthConfig:
        return cls(**config.to_dict(), **kwargs)


class FeedbackForwardMixin:
    """The transformers ``forward`` of a fullband model (native or retrofitted): scoring, and ``generate``'s
    prefill and steps on fullband's own decoding state. A class using it provides ``fullband_model`` and the
    decoding cache's sizing (``_prefill_cache_len``, ``_make_room``)."""

    fullband_model: Any
    config: Any

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the decoding state is fullband's own (DecodeState), created by the first forward

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: DecodeState | None = None,
        past_key_values: DecodeState | None = None,  # the name of ``cache`` before transformers 5.24
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        passes: int | None = None,
        plain_prefix: int | torch.Tensor = 1,
        decoding_mode: str | None = None,
        prefill_passes: int | None = None,  # retired: refused naming decoding_mode="fused:K" (else kwargs hid it)
        exact_chunk_size: int | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,  # generate's extras (position_ids, output_attentions, ...): positions come from the mask
    ) -> CausalLMOutputWithPast | tuple:
        """Three uses, told apart by the decoding state:

        - no state and ``use_cache`` not True: the native multi-pass forward (scoring): ``passes``, ``plain_prefix``
          as in FullBandwidthLM; ``labels`` give transformers' loss, the next-token loss of the last pass (the
          multi-pass training objective is ``fullband.training.objective.MultiPassObjective``).
          Without ``passes``, ``config.score_mode`` decides: standard = one plain pass; soft, fused, exact = the
          exact recurrence after a plain prefix of ``plain_prefix`` (1: what the mode's decoding gives after a
          one-token prompt; lm-eval's ``--model hf`` scores this way, for it gives no prompt boundary);
        - ``use_cache=True`` and no state (generate's prefill): prefill the prompt in ``decoding_mode`` (default
          ``config.decoding_mode``) and return the next-token logits (B, 1, V) with the new state;
        - a state (generate's later steps): feed ``input_ids[:, -1]`` and advance it (KV cache + carried state).
        """
        lm = self.fullband_model
        if input_ids is None:
            raise ValueError(f"{type(self).__name__} needs input_ids: the fusion gates on the token embeddings, "
                             "so inputs_embeds cannot replace them")
        state = cache if cache is not None else past_key_values
        if state is not None and not isinstance(state, DecodeState):
            if state.get_seq_length() > 0:
                raise TypeError(f"{type(self).__name__} decodes with its own state (DecodeState), not a "
                                f"transformers {type(state).__name__}; do not pass one to generate()")
            state = None  # an empty cache made by a caller: ignore it
        loss = None
        if isinstance(state, DecodeState):
            self._make_room(state)
            decode_step(lm, state, input_ids[:, -1])
            logits = state.next_logits[:, None]
        elif use_cache:
            hub.refuse_retired_passes({"prefill_passes": prefill_passes})
            mode = decoding_mode or self.config.decoding_mode
            chunk = exact_chunk_size or self.config.exact_chunk_size
            decoding = check_decoding(mode, chunk)
            mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            max_len = self._prefill_cache_len(input_ids.shape[1])
            state = prefill(lm, input_ids, mask.long(), decoding, max_len, exact_chunk_size=chunk)
            logits = state.next_logits[:, None]
        else:
            if decoding_mode is not None:
                raise ValueError("decoding_mode needs a decoding state: generate with use_cache=True (the default)")
            score_mode = DecodingMode.parse(self.config.score_mode, name="score_mode")
            if passes is None and score_mode.feeds_back and lm.config.feedback:
                chunk = self.config.exact_chunk_size
                out = lm.forward_exact(input_ids, plain_prefix=plain_prefix, attention_mask=attention_mask,
                                                 method="sequential" if chunk == 1 else "chunked", chunk_size=chunk)
                logits = out.logits[:, -logits_to_keep:] if logits_to_keep else out.logits
                loss = None if labels is None else _next_token_loss(out.logits, labels)
            else:
                out = lm(input_ids, passes=passes or 1, plain_prefix=plain_prefix, attention_mask=attention_mask,
                         logits_to_keep=0 if labels is not None else logits_to_keep)
                logits = out.logits[:, -logits_to_keep:] if logits_to_keep else out.logits
                loss = None if labels is None else _next_token_loss(out.logits, labels)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, **{OUTPUT_CACHE_FIELD: state})
        return output if return_dict is not False else output.to_tuple()



class FullBandwidthForCausalLM(FeedbackForwardMixin, PreTrainedModel, GenerationMixin):
    config_class = FullBandwidthConfig
    base_model_prefix = ""  # no backbone/head split: the parameter names are the native ones
    main_input_name = "input_ids"
    _tied_weights_keys = {"lm_head.weight": "embed.weight"}  # noqa: RUF012 (applied only if tie_word_embeddings)
    _no_split_modules = ["Block"]  # noqa: RUF012

    def __init__(self, config: FullBandwidthConfig) -> None:
        super().__init__(config)
        native = FullBandwidthLM(config.to_model_config())
        # One set of modules: this module shares the native one's registries, so state-dict names are native,
        # and .to()/.half()/from_pretrained's loading reach exactly the tensors the native forward reads.
        self._modules = native._modules
        self._parameters = native._parameters
        self._buffers = native._buffers
        self._non_persistent_buffers_set = native._non_persistent_buffers_set
        object.__setattr__(self, "_native", native)  # not a child module: its children are already ours
        residual_out = (m for name, m in native.named_modules() if name.endswith(("o_proj", "down_proj")))
        object.__setattr__(self, "_residual_out", set(residual_out))
        self.post_init()

    @property
    def native(self) -> FullBandwidthLM:
        """The native model sharing this model's weights (for fullband's own training, evaluation, decoding)."""
        return self._native

    @classmethod
    def from_native(cls, model: FullBandwidthLM, **decoding: Any) -> FullBandwidthForCausalLM:
        """A copy of ``model`` as a transformers model; ``decoding`` sets the config's decoding defaults."""
        hf = cls(FullBandwidthConfig.from_model_config(model.config, **decoding))
        hf.native.load_state_dict(model.state_dict())
        p = model.embed.weight
        return hf.to(device=p.device, dtype=p.dtype).train(model.training)

    def save_pretrained(self, save_directory: str, *args: Any, **kwargs: Any) -> None:
        """transformers' save_pretrained, plus the remote-code modules and the model card (fullband.hub)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        hub.write_remote_code(save_directory)
        config = self.config.to_dict()
        hub.write_model_card(save_directory, config, architecture=hub.native_architecture(config))

    def train(self, mode: bool = True) -> FullBandwidthForCausalLM:
        self._native.training = mode  # the native module is not a child, so nn.Module.train() does not reach it
        return super().train(mode)

    def get_input_embeddings(self) -> nn.Embedding:
        return self._native.embed

    def get_output_embeddings(self) -> nn.Linear:
        return self._native.lm_head

    def _init_weights(self, module: nn.Module) -> None:
        # The native init (normal, GPT-2 residual scaling, unit norms), here for modules a checkpoint did not fill.
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            scale = 1 / math.sqrt(2 * self.config.n_layers) if module in self._residual_out else 1.0
            init.normal_(module.weight, mean=0.0, std=std * scale)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif module is self:
            # inv_freq is not saved (a non-persistent buffer), so a model built on the meta device recomputes it.
            inv_freq = rope_inv_freq(self.config.d_model // self.config.n_heads, self.config.rope_theta)
            init.copy_(self._native.inv_freq, inv_freq.to(self._native.inv_freq.device))

    @property
    def fullband_model(self) -> FullBandwidthLM:
        return self._native

    def _prefill_cache_len(self, prompt_len: int) -> int:
        return min(self.config.max_seq_len, prompt_len + CACHE_GROWTH)  # grown by _make_room as generate goes on

    def _make_room(self, state: DecodeState) -> None:
        _ensure_room(self._native, state)


def check_decoding(mode: str, exact_chunk_size: int, score_mode: str = DEFAULT_SCORE_MODE) -> DecodingMode:
    # The sampling options are generate's own (GenerationConfig); only the mode's options are checked here.
    DecodingMode.parse(score_mode, name="score_mode")
    return DecodeOptions(mode=mode, exact_chunk_size=exact_chunk_size).decoding_mode


def _next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` (B, T, V) against ``labels`` (B, T) shifted by one; -100 = ignore."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                             ignore_index=-100)


@torch.no_grad()
def _ensure_room(model: FullBandwidthLM, state: DecodeState) -> None:
    """Grow the decoding KV cache when it is full: generate does not tell a forward how far it will go."""
    old = state.cache
    if old.length < old.max_len or old.max_len >= model.config.max_seq_len:
        return  # room left, or at the context limit, where the forward raises its own clear error
    new = model.new_cache(old.batch_size, min(old.max_len + CACHE_GROWTH, model.config.max_seq_len))
    n = old.length
    new.keys[..., :n, :] = old.keys[..., :n, :]  # (L, B, Hkv, S, hd)
    new.values[..., :n, :] = old.values[..., :n, :]
    new.valid[:, :n] = old.valid[:, :n]
    new.next_position.copy_(old.next_position)
    new.length = n
    state.cache = new


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModelForCausalLM`` know ``model_type="fullband"`` (idempotent)."""
    AutoConfig.register(MODEL_TYPE, FullBandwidthConfig, exist_ok=True)
    AutoModelForCausalLM.register(FullBandwidthConfig, FullBandwidthForCausalLM, exist_ok=True)


register()
