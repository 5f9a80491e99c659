"""Checkpoints of retrofitted models: the base in its own format, the fusion beside it, and what ties them (the
layout: :mod:`fullband.integrations.retrofit.config`).

Beside them, a transformers-form ``config.json``, the remote-code modules and a model card (fullband.hub) let
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` open the whole retrofitted model
(fullband.integrations.hf_retrofit). The base stays a plain transformers checkpoint:
``AutoModelForCausalLM.from_pretrained(dir / "base")`` loads the pretrained network alone, fine-tuned weights
included.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from fullband import hub, rundir
from fullband.files import write_json, write_through
from fullband.integrations._hf_compat import no_progress_bars
from fullband.integrations.retrofit.config import (
    RETROFIT_BASE,
    RETROFIT_CONFIG,
    RETROFIT_FAMILY,
    RETROFIT_FUSION,
    RetrofitConfig,
    is_retrofit_checkpoint,
)
from fullband.model.serialization import CONFIG_NAME, CheckpointError

MODEL_TYPE = RETROFIT_FAMILY
REMOTE_CODE = hub.RemoteCode("FullBandwidthRetrofitConfig", "FullBandwidthRetrofitForCausalLM",
                             "fullband.integrations.hf_retrofit")

Retrofitted = TypeVar("Retrofitted", bound=nn.Module)

FORMAT = "fullband-retrofit"
FUSION_WEIGHTS = RETROFIT_FUSION
BASE_DIR = RETROFIT_BASE


def save_retrofitted(model: nn.Module, directory: str | Path, **decoding: Any) -> None:
    """Write ``model``; ``decoding`` overrides the decoding defaults recorded in config.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():  # as quiet as the native save (fullband train shows one progress bar of its own)
        model.base.save_pretrained(directory / BASE_DIR)
    fusion = {k: v.detach().contiguous().cpu() for k, v in model.fusion.state_dict().items()}
    write_through(directory / FUSION_WEIGHTS, lambda p: save_file(fusion, str(p), metadata={"format": "pt"}))
    meta = {"format": FORMAT, **rundir.stamped({"base_dir": BASE_DIR, **model.config.to_dict()})}
    write_json(directory / RETROFIT_CONFIG, meta)
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")
    config = hub.hf_config_dict(model.config.to_dict(), dtype=dtype, tie_word_embeddings=False,
                                model_type=MODEL_TYPE, remote=REMOTE_CODE, **decoding)
    hub.write_remote_code(directory, REMOTE_CODE)
    hub.write_model_card(directory, config, architecture=(
        f"a pretrained `{config.get('base_architecture')}` ({config.get('n_layers')} layers, width "
        f"{config.get('d_model')}) retrofitted with latent feedback: the fed-back state is "
        f"`{config.get('feedback_source')}`{_target_words(config)}; the base model is in `base/`, the fusion in "
        "`fusion.safetensors`"))
    write_json(directory / CONFIG_NAME, config)


def _target_words(config: dict[str, Any]) -> str:
    """The card's words for a span's target (none at the default, the input embeddings)."""
    target = config.get("feedback_target") or 0
    return f", fused into the residual stream after block {target}" if target else ""


def load_retrofit_config(directory: str | Path) -> RetrofitConfig:
    """The config a checkpoint's model was built with (what a trainer compares with ``model.config``)."""
    meta = _read_meta(Path(directory))
    # A field a checkpoint predates (feedback_target) keeps its default: the span it was built with.
    return RetrofitConfig(**{f.name: meta[f.name] for f in fields(RetrofitConfig) if f.name in meta})


def load_weights_into(model: nn.Module, directory: str | Path) -> None:
    """Load a checkpoint's weights into ``model`` in place (resume: the optimizer holds these parameters)."""
    saved = load_retrofitted(type(model), directory)
    if saved.config != model.config:
        raise CheckpointError(f"{directory} holds a model with config {saved.config}, not {model.config}")
    source = saved.state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(source[name])


def load_retrofitted(cls: type[Retrofitted], directory: str | Path, **base_kwargs: Any) -> Retrofitted:
    """A ``cls`` (RetrofittedLM, which imports this module) built on the checkpoint's base, with its fusion weights."""
    directory = Path(directory)
    meta = _read_meta(directory)
    with no_progress_bars():
        base = AutoModelForCausalLM.from_pretrained(directory / meta["base_dir"], **base_kwargs)
    if type(base).__name__ != meta["base_architecture"]:
        raise CheckpointError(f"{directory}: base loads as {type(base).__name__}, but {RETROFIT_CONFIG} says "
                              f"{meta['base_architecture']}")
    model = cls(base, meta["feedback_source"], init_std=meta["init_std"],
                feedback_target=meta.get("feedback_target", 0))
    try:
        fusion = load_file(str(directory / FUSION_WEIGHTS))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{directory / FUSION_WEIGHTS} is missing or corrupted: {err}") from None
    p = model.embed.weight
    model.fusion.load_state_dict({k: v.to(device=p.device, dtype=p.dtype) for k, v in fusion.items()}, strict=True)
    return model.eval()


def checkpoint_problem(files: Collection[str]) -> str | None:
    """What a training checkpoint's manifest (``files``) lacks of a retrofitted model's files, or None."""
    for required in (RETROFIT_CONFIG, RETROFIT_FUSION, f"{BASE_DIR}/{rundir.MODEL_CONFIG}"):
        if required not in files:
            return f"does not list {required}"
    if not any(f"{BASE_DIR}/{name}" in files for name in (rundir.MODEL_WEIGHTS, f"{rundir.MODEL_WEIGHTS}.index.json")):
        return f"lists no weights of the base model under {BASE_DIR}/"
    return None


def load_quietly(cls: type[Retrofitted], directory: str | Path, dtype: torch.dtype | None) -> Retrofitted:
    """:func:`load_retrofitted` from local files, problems as CheckpointError."""
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        return load_retrofitted(cls, directory, local_files_only=True, **kwargs)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"cannot load the retrofitted model in {directory}: {_first_line(err)}") from None


def load_base(path: str | Path, dtype: torch.dtype | None, name: str) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained(path)`` from local files; problems as CheckpointError naming ``name``."""
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        with no_progress_bars():
            return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{name} is not a transformers causal LM that AutoModelForCausalLM can load: "
                              f"{_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _read_meta(directory: Path) -> dict[str, Any]:
    if not is_retrofit_checkpoint(directory):
        raise CheckpointError(f"{directory} has no {RETROFIT_CONFIG}: not a retrofitted fullband checkpoint")
    meta = json.loads((directory / RETROFIT_CONFIG).read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{directory / RETROFIT_CONFIG}: unknown format {meta.get('format')!r}")
    rundir.check_format(meta, directory / RETROFIT_CONFIG)
    return meta
