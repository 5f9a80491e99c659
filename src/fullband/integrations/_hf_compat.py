"""The differences between the transformers 5.x releases this package supports, in one place."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator

import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

TRANSFORMERS_VERSION = transformers.__version__

# transformers 5.24 renamed ``past_key_values`` to ``cache``, in forward arguments and in model outputs.
OUTPUT_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_argument(forward: Callable) -> str:
    """Name of the cache argument of an HF ``forward``: ``cache`` (5.24 on) or ``past_key_values`` (before)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def crop_cache(cache: transformers.Cache, length: int) -> None:
    """Cut ``cache`` back to its first ``length`` positions.

    A negative count means "remove that many" under every 5.x release (5.24 rejects positive ones, earlier
    releases read them as the length to keep), so this never passes a positive number.
    """
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own progress bars (loading and writing weights) off for the duration, then as they were.

    ``fullband train`` shows one progress bar of its own; transformers would add two more lines at every
    checkpoint, interleaved with it, and ahead of any one-line error.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
