"""save_pretrained / from_pretrained: ``model.safetensors`` + ``config.json`` in a directory.

``config.json`` is in transformers' form (the ModelConfig fields plus ``model_type``, ``auto_map``, ...) and the
remote-code modules and a model card are written beside it (:mod:`fullband.hub`), so the directory also
opens with ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``. Older checkpoints, whose
config.json holds the ModelConfig fields alone, still load.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fullband import hub, rundir
from fullband.config import HF_PREFIX, ConfigError, ModelConfig
from fullband.files import write_json, write_through

WEIGHTS_NAME = rundir.MODEL_WEIGHTS
CONFIG_NAME = rundir.MODEL_CONFIG


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or does not match its config."""


def save_pretrained(model: torch.nn.Module, directory: str | Path, **decoding) -> None:
    """Weights, transformers-form config.json (``decoding`` overrides hub.DECODING_DEFAULTS), remote code, card."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"cannot create checkpoint directory {directory}: {err}") from None
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")  # shared with embed.weight; safetensors stores each tensor once
    write_through(directory / WEIGHTS_NAME, lambda p: save_file(state, str(p), metadata={"format": "pt"}))
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    config = hub.hf_config_dict(model.config.to_dict(), dtype=dtype, tie_word_embeddings=model.config.tie_embeddings,
                                **decoding)
    hub.write_remote_code(directory)
    hub.write_model_card(directory, config, architecture=hub.native_architecture(config))
    write_json(directory / CONFIG_NAME, config)  # last: marks a complete save


def load_config(directory: str | Path) -> ModelConfig:
    path = Path(directory) / CONFIG_NAME
    if not Path(directory).is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {CONFIG_NAME}: not a fullband checkpoint")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); the checkpoint is damaged: save it again") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    rundir.check_format(data, path)  # files from before format_version read as version 1
    model_type = data.get("model_type")
    if model_type is not None and model_type != hub.MODEL_TYPE and "fullband_version" in data:
        raise CheckpointError(f"{directory} holds a fullband {model_type!r} model, not a native one; load it with "
                              "fullband.families.load_any")
    if model_type is not None and model_type != hub.MODEL_TYPE:
        raise CheckpointError(f"{directory} holds a transformers {model_type!r} model, not a native fullband one; "
                              f"give {HF_PREFIX}{directory} to load it with latent feedback added")
    try:
        if model_type is None:  # an older checkpoint: the ModelConfig fields alone, read as they always were
            return ModelConfig.load(path)
        # transformers' form: the ModelConfig fields, beside what HF tools read
        fields = hub.model_config_fields(data, {f.name for f in dataclasses.fields(ModelConfig)})
        fields.setdefault("input_norm", False)  # written before the input norm existed: decode as trained
        return ModelConfig.from_dict(fields)
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from None


def load_state_dict_into(model: torch.nn.Module, directory: str | Path, skip_prefix: str | None = None) -> None:
    """Load ``model.safetensors`` into ``model``, failing with the names of missing/extra/misshapen tensors.

    Tensors whose names start with ``skip_prefix`` may be absent from either side (they keep their init).
    """
    path = Path(directory) / WEIGHTS_NAME
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {WEIGHTS_NAME}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} is corrupted or truncated: {err}") from None
    expected = dict(model.state_dict())
    if model.config.tie_embeddings:
        expected.pop("lm_head.weight")
    if skip_prefix:
        state = {k: v for k, v in state.items() if not k.startswith(skip_prefix)}
        expected = {k: v for k, v in expected.items() if not k.startswith(skip_prefix)}
    not_float = [f"{k}: {v.dtype}" for k, v in state.items() if not v.is_floating_point()]
    if not_float:
        raise CheckpointError(f"{path} holds non-floating-point weights ({', '.join(not_float[:3])}); it is not a "
                              "model saved by fullband: save the model again with save_pretrained")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshapen = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
                 for k in sorted(set(state) & set(expected)) if state[k].shape != expected[k].shape]
    problems = []
    if missing:
        problems.append(f"missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    if misshapen:
        problems.append(f"shape mismatches {misshapen[:8]}")
    if problems:
        raise CheckpointError(f"{path} does not match {Path(directory) / CONFIG_NAME}: " + "; ".join(problems))
    model.load_state_dict(state, strict=False)  # strict would demand the tied lm_head.weight key
