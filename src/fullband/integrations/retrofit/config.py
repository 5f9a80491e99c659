"""What a retrofitted model is (:class:`RetrofitConfig`) and the layout of its directory; imports neither torch nor
transformers, so the loaders recognise a retrofitted checkpoint without the ``hf`` extra.

    base/                 the wrapped model's save_pretrained (config.json, model.safetensors, ...)
    fusion.safetensors    the LatentFusion weights
    retrofit.json         format marker, base architecture, which hidden state feeds back, fusion settings
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FeedbackSource = str | int  # "last_hidden" or a block index 1..L-1

RETROFIT_CONFIG = "retrofit.json"  # its marker: format, base architecture, feedback source, fusion settings
RETROFIT_FUSION = "fusion.safetensors"  # the LatentFusion weights
RETROFIT_BASE = "base"  # the wrapped model's own save_pretrained


@dataclass
class RetrofitConfig:
    """What a retrofitted model is, in the fields fullband's training and decoding read from ``model.config``."""

    base_architecture: str  # class of the wrapped model, e.g. "LlamaForCausalLM"
    feedback_source: FeedbackSource
    vocab_size: int
    d_model: int
    n_layers: int
    max_seq_len: int
    norm_eps: float  # of the fusion's RMSNorms (the base model's norm epsilon)
    init_std: float  # of the fusion's projections (the base model's initializer_range)
    feedback: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_retrofit_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a retrofitted model (rather than a native fullband or plain HF one)."""
    return (Path(directory) / RETROFIT_CONFIG).is_file()
