"""A retrofitted model's directory as a transformers model: ``AutoModelForCausalLM`` (remote code) / ``generate``.

A retrofitted checkpoint (``base/`` + ``fusion.safetensors`` + ``retrofit.json``, fullband.integrations.retrofit.io)
also holds a transformers-form ``config.json`` (``model_type="fullband_retrofit"``, ``auto_map``) and the thin
remote-code modules (fullband.hub), so ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``
returns a :class:`FullBandwidthRetrofitForCausalLM`: the :class:`~fullband.integrations.retrofit.lm.RetrofittedLM`
loaded by fullband's own loader, behind the same ``forward`` / ``generate`` as the native model's wrapper
(decoding modes, ``score_mode``, fullband's decoding state carried between steps).

Importing this module registers the model type with the Auto classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel

from fullband import hub
from fullband.generation.decoding import DecodeState
from fullband.integrations.hf import FeedbackForwardMixin, check_decoding
from fullband.integrations.retrofit.config import RetrofitConfig
from fullband.integrations.retrofit.io import REMOTE_CODE
from fullband.integrations.retrofit.lm import RetrofittedLM

MODEL_TYPE = RetrofittedLM.family
_RETROFIT_FIELDS = tuple(RetrofitConfig.__dataclass_fields__)


class FullBandwidthRetrofitConfig(PretrainedConfig):
    """The :class:`~fullband.integrations.retrofit.config.RetrofitConfig` fields and the decoding defaults (as
    :class:`~fullband.integrations.hf.FullBandwidthConfig`)."""

    model_type = MODEL_TYPE
    attribute_map = {  # noqa: RUF012 (a transformers class attribute)
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "max_position_embeddings": "max_seq_len",
    }

    def __init__(self, **kwargs: Any) -> None:
        hub.read_decoding(kwargs)  # a config.json saved before fused:K carried its count
        for name in _RETROFIT_FIELDS:
            setattr(self, name, kwargs.pop(name, None))
        for name, default in hub.DECODING_DEFAULTS.items():
            setattr(self, name, kwargs.pop(name, default))
        kwargs.setdefault("auto_map", hub.auto_map(REMOTE_CODE))
        kwargs.pop("fullband_version", None)
        kwargs.setdefault("tie_word_embeddings", False)  # the base model ties its own weights
        super().__init__(**kwargs)
        check_decoding(self.decoding_mode, self.exact_chunk_size, self.score_mode)


class FullBandwidthRetrofitForCausalLM(FeedbackForwardMixin, PreTrainedModel, GenerationMixin):
    config_class = FullBandwidthRetrofitConfig
    base_model_prefix = "retrofitted"
    main_input_name = "input_ids"

    def __init__(self, config: FullBandwidthRetrofitConfig, retrofitted: RetrofittedLM | None = None) -> None:
        super().__init__(config)
        self.post_init()
        if retrofitted is None:
            raise ValueError("FullBandwidthRetrofitForCausalLM wraps a retrofitted checkpoint: load one with "
                             "from_pretrained(DIR), or wrap a model with from_retrofitted(model)")
        self.retrofitted = retrofitted

    @property
    def fullband_model(self) -> RetrofittedLM:
        return self.retrofitted

    def _prefill_cache_len(self, prompt_len: int) -> int:
        return self.retrofitted.config.max_seq_len  # a DynamicCache grows by itself; only its slot mask is sized

    def _make_room(self, state: DecodeState) -> None:
        pass

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.retrofitted.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.retrofitted.lm_head

    def tie_weights(self, *args: Any, **kwargs: Any) -> None:
        pass  # the base model tied its own weights when it was loaded

    @classmethod
    def from_retrofitted(cls, model: RetrofittedLM, **decoding: Any) -> FullBandwidthRetrofitForCausalLM:
        return cls(FullBandwidthRetrofitConfig(**model.config.to_dict(), **decoding), model)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *args: Any,
                        config: PretrainedConfig | None = None, **kwargs: Any) -> FullBandwidthRetrofitForCausalLM:
        """Load with fullband's retrofit loader; ``dtype`` and ``device_map`` (one device) are honoured, decoding
        defaults (``decoding_mode=...``) override the config's, other loading options are ignored."""
        directory = Path(pretrained_model_name_or_path)
        if not directory.is_dir():
            raise OSError(f"{directory} is not a local directory holding a retrofitted fullband checkpoint")
        if not isinstance(config, FullBandwidthRetrofitConfig):
            config = FullBandwidthRetrofitConfig.from_pretrained(directory)
        hub.refuse_retired_passes(kwargs)
        for name in hub.DECODING_DEFAULTS:
            if name in kwargs:
                setattr(config, name, kwargs[name])
        check_decoding(config.decoding_mode, config.exact_chunk_size, config.score_mode)
        dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
        base_kwargs = {"dtype": dtype} if dtype not in (None, "auto") else {}
        model = cls(config, RetrofittedLM.from_pretrained(directory, local_files_only=True, **base_kwargs))
        device = kwargs.get("device_map")
        if isinstance(device, (str, torch.device, int)) and str(device) != "auto":
            model.to(device)
        return model.eval()

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> None:
        decoding = {name: getattr(self.config, name) for name in hub.DECODING_DEFAULTS}
        self.retrofitted.save_pretrained(save_directory, **decoding)


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModelForCausalLM`` know ``model_type="fullband_retrofit"`` (idempotent)."""
    AutoConfig.register(MODEL_TYPE, FullBandwidthRetrofitConfig, exist_ok=True)
    AutoModelForCausalLM.register(FullBandwidthRetrofitConfig, FullBandwidthRetrofitForCausalLM, exist_ok=True)


register()
