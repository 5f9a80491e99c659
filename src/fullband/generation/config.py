"""The config of ``fullband generate`` (torch-free, so the command line checks it before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fullband.config import (
    device_field,
    doc,
    is_int,
    require,
    threads_field,
    validate_device_name,
    validate_speculative_options,
    validate_threads,
)
from fullband.modes import DecodeOptions, retired_to_decode


@dataclass
class GenerateConfig:
    """Options of ``fullband generate``."""

    # the flat options that moved into [decode]: refused with a line naming the new flag (configio)
    ALIASES: ClassVar[dict[str, str]] = retired_to_decode("mode", "prefill_passes", "exact_chunk_size", "temperature",
                                                          "top_k", "top_p", "seed")

    checkpoint: str = doc("", "Model directory written by save_pretrained / fullband train (required).")
    prompt: str = doc("", "Prompt text (or space/comma-separated token ids when no tokenizer is saved).")
    max_new_tokens: int = doc(64, "Tokens to generate.")
    stop_at_eos: bool = doc(True, "Stop at the tokenizer's end-of-sequence token.")
    device: str = device_field()
    threads: str = threads_field()
    drafter: str = doc(
        "", "Speculative decoding (same output, see DESIGN.md section 4): '' = off; standard = the model itself "
        "without feedback; early_exit[:N] = its first N blocks; or a checkpoint directory of a model with the "
        "same tokenizer.",
    )
    gamma: int = doc(4, "Speculative decoding: tokens drafted per verification (the start value with adaptive_gamma).")
    adaptive_gamma: bool = doc(False, "Speculative decoding: +1 draft token after a fully accepted block, -1 after a "
                               "rejection.")
    decode: DecodeOptions = field(default_factory=DecodeOptions)

    def __post_init__(self) -> None:
        require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        validate_device_name(self.device)
        self.threads = validate_threads(self.threads)
        require(is_int(self.max_new_tokens) and self.max_new_tokens >= 0, "max_new_tokens", self.max_new_tokens,
                "must be an integer >= 0")
        validate_speculative_options(self.drafter or "standard", self.gamma, max(16, self.gamma))
