"""Load any model fullband can run: every command and study loads through :func:`load_any`.

    native:      model.safetensors + config.json              -> FullBandwidthLM
    retrofit:    retrofit.json + fusion.safetensors + base/    -> RetrofittedLM (fullband.integrations.retrofit)
    hf:PATH      a transformers causal LM saved in PATH        -> RetrofittedLM, freshly retrofitted (fusion weights
                                                                  initialised with seed 0; standard mode = the model)

Anything else (a missing path, a file, a directory with neither layout, a transformers model without ``hf:``)
raises a :class:`CheckpointError` whose one-line message says what to give instead.

Both are FeedbackLMs (one multi-pass forward, forward_exact, generate/stream in every mode, save_pretrained), so
commands that only decode or score (``fullband generate``, evaluation) load either through :func:`load_any`.
transformers (the ``hf`` extra) is imported only when a retrofit directory is seen.
"""

from __future__ import annotations

from pathlib import Path

import torch

import fullband.generation.decoding  # noqa: F401 (binds generate / stream: every loaded model decodes)
from fullband.config import HF_PREFIX
from fullband.integrations.retrofit.config import is_retrofit_checkpoint
from fullband.model import FeedbackLM, FullBandwidthLM
from fullband.model.serialization import CheckpointError

AnyLM = FeedbackLM  # a FullBandwidthLM or a RetrofittedLM (fullband.integrations.retrofit.lm)


def checkpoint_dir(spec: str | Path) -> Path:
    """The directory a model argument names: ``hf:PATH`` -> PATH, anything else itself (for its tokenizer)."""
    text = str(spec)
    return Path(text[len(HF_PREFIX):]).expanduser() if text.startswith(HF_PREFIX) else Path(text).expanduser()


def load_any(
    directory: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
    feedback: bool | None = None,
) -> AnyLM:
    """The model ``directory`` names (native, retrofitted, or ``hf:PATH``), in eval mode on ``device``.

    ``dtype=None`` keeps the saved dtype. ``feedback`` (native models) adds or drops the fusion weights, as
    :meth:`FullBandwidthLM.from_pretrained`. Problems (missing or corrupt files, transformers not installed)
    raise :class:`CheckpointError`.
    """
    if str(directory).startswith(HF_PREFIX):
        return _retrofit_transformers_model(str(directory), device, dtype)
    path = Path(directory).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(directory)!r} does not exist: give a model directory (fullband "
                              "train's out_dir/model, a save_pretrained directory) or hf:PATH")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(directory)!r} is a file: give the directory that holds the model's "
                              "config.json and weights")
    if not is_retrofit_checkpoint(directory):
        return FullBandwidthLM.from_pretrained(directory, device=device, dtype=dtype, feedback=feedback)
    try:
        from fullband.integrations._hf_compat import no_progress_bars
        from fullband.integrations.retrofit.lm import RetrofittedLM
    except ImportError as err:
        raise CheckpointError(f"{directory} holds a retrofitted transformers model; loading it needs transformers "
                              f"(pip install 'fullband[hf]'): {err}") from None
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        with no_progress_bars():  # as quiet as the native loader
            model = RetrofittedLM.from_pretrained(directory, local_files_only=True, **kwargs)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"cannot load the retrofitted model in {directory}: {_first_line(err)}") from None
    return model.to(device=device).eval()


def _retrofit_transformers_model(spec: str, device: torch.device | str | None, dtype: torch.dtype | None) -> AnyLM:
    path = checkpoint_dir(spec)
    if not path.is_dir():
        raise CheckpointError(f"{spec!r}: {str(path)!r} is not a directory; hf:PATH names the local directory a "
                              "transformers causal LM was saved to (save_pretrained)")
    with torch.random.fork_rng(devices=[]):  # the same fusion weights every time, the caller's RNG untouched
        torch.manual_seed(0)
        try:
            model = retrofit_transformers(path, dtype=dtype, name=repr(spec))
        except (ValueError, NotImplementedError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{spec!r} cannot be retrofitted: {_first_line(err)}") from None
    return model.to(device=device).eval()


def retrofit_transformers(
    path: str | Path, feedback_source: str | int = "last_hidden", dtype: torch.dtype | None = None, name: str = ""
) -> AnyLM:
    """``fullband.retrofit(AutoModelForCausalLM.from_pretrained(path))`` from local files, fusion weights drawn
    from torch's global RNG. Loading problems raise :class:`CheckpointError` whose message starts with ``name``
    (default: the quoted path); a bad ``feedback_source`` or an unsupported architecture raise retrofit's own
    ValueError / NotImplementedError."""
    name = name or repr(str(path))
    try:
        from transformers import AutoModelForCausalLM

        from fullband.integrations._hf_compat import no_progress_bars
        from fullband.integrations.retrofit.lm import retrofit
    except ImportError as err:
        raise CheckpointError(f"{name} needs transformers (pip install 'fullband[hf]'): {err}") from None
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        with no_progress_bars():
            base = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{name} is not a transformers causal LM that AutoModelForCausalLM can load: "
                              f"{_first_line(err)}") from None
    return retrofit(base, feedback_source=feedback_source)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
