"""What a retrofitted model is (:class:`RetrofitConfig`), its ``fullband train`` options (:class:`RetrofitOptions`,
the [retrofit] section) and the layout of its directory; imports neither torch nor transformers, so the loaders
recognise a retrofitted checkpoint, and the command line checks [retrofit], without the ``hf`` extra.

    base/                 the wrapped model's save_pretrained (config.json, model.safetensors, ...)
    fusion.safetensors    the LatentFusion weights
    retrofit.json         format marker, base architecture, which hidden state feeds back, fusion settings
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fullband.config import HF_PREFIX, doc, require

FeedbackSource = str | int  # "last_hidden" or a block index 1..L-1
LAST_HIDDEN = "last_hidden"

RETROFIT_FAMILY = "fullband_retrofit"  # the family's name: config.json's model_type
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
    feedback_target: int = 0  # the state enters after this many blocks (0 = the input embeddings; DESIGN.md §1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_retrofit_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a retrofitted model (rather than a native fullband or plain HF one)."""
    return (Path(directory) / RETROFIT_CONFIG).is_file()


@dataclass
class RetrofitOptions:
    """Retrofitting a transformers causal LM ([retrofit]; read only with init_from='hf:PATH')."""

    feedback_source: str = doc(
        LAST_HIDDEN,
        "Hidden state of the pretrained model that feeds back: 'last_hidden' = its last hidden state (after the "
        "final norm for Llama, Qwen2, GPT-2), or N = the residual stream after block N, 1..n_layers-1 (quoted in a "
        'config file: feedback_source = "2").',
    )

    feedback_target: int = doc(
        0,
        "Where the state enters (DESIGN.md section 1's span): 0 = the input embeddings; k = the residual stream after "
        "block k, below the source (1..N-1 with feedback_source N, 1..n_layers-1 with last_hidden), the blocks below "
        "it run once per position. k > 0 for Llama, Qwen2 and GPT-2.",
    )

    def __post_init__(self) -> None:
        require(isinstance(self.feedback_target, int) and not isinstance(self.feedback_target, bool)
                and self.feedback_target >= 0, "feedback_target", self.feedback_target,
                "must be an integer >= 0 (below the source; 0 = the input embeddings)")
        source = self.feedback_source
        ok = isinstance(source, str) and (source == LAST_HIDDEN or (source.isdigit() and int(source) >= 1))
        require(ok, "feedback_source", source, "must be 'last_hidden' or a block index N >= 1 (at most the "
                "pretrained model's n_layers - 1)")
        if source != LAST_HIDDEN:
            self.feedback_source = str(int(source))

    def resolve(self) -> FeedbackSource:
        """The ``feedback_source`` argument of :func:`fullband.retrofit`: 'last_hidden' or an int."""
        return LAST_HIDDEN if self.feedback_source == LAST_HIDDEN else int(self.feedback_source)

    def check(self, init_from: str | None, feedback: bool) -> None:
        """The run's init_from and model.feedback against this section (ConfigError naming the field)."""
        hf = isinstance(init_from, str) and init_from.startswith(HF_PREFIX)
        if hf:
            require(feedback, "model.feedback", feedback, "a retrofitted model always has the fusion; use "
                    "schedule.feedback_start=1 to train it single-pass")
        require(hf or self.feedback_source == LAST_HIDDEN, "retrofit.feedback_source", self.feedback_source,
                "applies only to init_from='hf:PATH' (a retrofitted model's directory keeps the source it was "
                "built with)")
        require(hf or self.feedback_target == 0, "retrofit.feedback_target", self.feedback_target,
                "applies only to init_from='hf:PATH' (a retrofitted model's directory keeps the span it was built "
                "with)")
