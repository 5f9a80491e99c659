"""Load any model directory fullband writes: a native model or a retrofitted transformers model.

    native:      model.safetensors + config.json              -> FullBandwidthLM
    retrofit:    retrofit.json + fusion.safetensors + base/    -> RetrofittedLM (fullband.integrations.retrofit)

Both have the same API (multi-pass forward, forward_exact, generate/stream in every mode, save_pretrained), so
commands that only decode or score (``fullband generate``, evaluation) load either through :func:`load_any`.
transformers (the ``hf`` extra) is imported only when a retrofit directory is seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch

from fullband.model import FullBandwidthLM
from fullband.model.serialization import CheckpointError

if TYPE_CHECKING:
    from fullband.integrations.retrofit import RetrofittedLM

# The layout of a retrofitted model's directory (written by fullband.integrations.retrofit_io).
RETROFIT_CONFIG = "retrofit.json"  # its marker: format, base architecture, feedback source, fusion settings
RETROFIT_FUSION = "fusion.safetensors"  # the LatentFusion weights
RETROFIT_BASE = "base"  # the wrapped model's own save_pretrained

AnyLM = Union[FullBandwidthLM, "RetrofittedLM"]


def is_retrofit_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a retrofitted model (rather than a native fullband or plain HF one)."""
    return (Path(directory) / RETROFIT_CONFIG).is_file()


def load_any(
    directory: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> AnyLM:
    """The model saved in ``directory`` (native or retrofitted), in eval mode on ``device``.

    ``dtype=None`` keeps the saved dtype. Problems (missing or corrupt files, transformers not installed)
    raise :class:`CheckpointError`.
    """
    if not is_retrofit_checkpoint(directory):
        return FullBandwidthLM.from_pretrained(directory, device=device, dtype=dtype)
    try:
        from fullband.integrations._hf_compat import no_progress_bars
        from fullband.integrations.retrofit import RetrofittedLM
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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
