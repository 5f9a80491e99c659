"""The config of ``fullband generate`` (torch-free, so the command line checks it before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from fullband.config import (
    DEFAULT_MODE,
    _require,
    doc,
    threads_field,
    validate_device_name,
    validate_speculative_options,
    validate_threads,
)
from fullband.modes import validate_decoding_options


@dataclass
class GenerateConfig:
    """Options of ``fullband generate``."""

    checkpoint: str = doc("", "Model directory written by save_pretrained / fullband train (required).")
    prompt: str = doc("", "Prompt text (or space/comma-separated token ids when no tokenizer is saved).")
    mode: str = doc(DEFAULT_MODE, "Decoding mode: standard | soft | fused | fused:K | exact (DESIGN.md section 4; "
                    "fused = fused:prefill_passes).")
    max_new_tokens: int = doc(64, "Tokens to generate.")
    prefill_passes: int = doc(1, "fused mode: extra fused (Jacobi) passes over the prompt.")
    exact_chunk_size: int = doc(1, "exact mode: prompt chunk per exact Jacobi solve (1 = sequential).")
    temperature: float = doc(0.0, "Sampling temperature; 0 = greedy.")
    top_k: int = doc(0, "Keep the k most likely tokens (0 = off).")
    top_p: float = doc(1.0, "Nucleus sampling mass (1 = off).")
    seed: int | None = doc(None, "Sampling seed for reproducible draws.")
    stop_at_eos: bool = doc(True, "Stop at the tokenizer's end-of-sequence token.")
    device: str = doc("auto", "Torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps.")
    threads: str = threads_field()
    drafter: str = doc(
        "", "Speculative decoding (same output, see DESIGN.md section 4): '' = off; standard = the model itself "
        "without feedback; early_exit[:N] = its first N blocks; or a checkpoint directory of a model with the "
        "same tokenizer.",
    )
    gamma: int = doc(4, "Speculative decoding: tokens drafted per verification (the start value with adaptive_gamma).")
    adaptive_gamma: bool = doc(False, "Speculative decoding: +1 draft token after a fully accepted block, -1 after a "
                               "rejection.")

    def __post_init__(self) -> None:
        _require(bool(self.checkpoint), "checkpoint", self.checkpoint, "give the model directory (--checkpoint DIR)")
        validate_device_name(self.device)
        self.threads = validate_threads(self.threads)
        validate_decoding_options(self.mode, self.prefill_passes, self.temperature, self.top_k, self.top_p,
                                  self.max_new_tokens, self.exact_chunk_size)
        validate_speculative_options(self.drafter or "standard", self.gamma, max(16, self.gamma))
