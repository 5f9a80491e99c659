"""Options of ``fullband bench`` (torch-free, so the command line checks them before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fullband.config import (
    apply_preset,
    device_field,
    doc,
    is_int,
    is_number,
    require,
    threads_field,
    validate_device_name,
    validate_threads,
)

SECTIONS = ("limits", "train", "optim", "passes", "decode", "exact")
NS_DTYPES = ("auto", "float32", "bfloat16")  # as optim.ns_dtype of fullband train


@dataclass
class BenchTrainConfig:
    """Training and multi-pass step sections ([train]): nanoGPT's README CPU config, byte vocabulary.

    320 = the byte tokenizer's 257 ids rounded up to a multiple of 64, as ``fullband train`` builds it."""

    d_model: int = doc(128, "Model width.")
    n_layers: int = doc(4, "Transformer blocks.")
    n_heads: int = doc(4, "Attention heads.")
    batch_size: int = doc(12, "Rows per step.")
    seq_len: int = doc(64, "Tokens per row.")
    steps_per_round: int = doc(3, "Steps timed back to back per case and round (their mean is the round's time).")

    def __post_init__(self) -> None:
        _require_counts(self, ("d_model", "n_layers", "n_heads", "batch_size", "steps_per_round"))
        require(is_int(self.seq_len) and self.seq_len >= 2, "train.seq_len", self.seq_len, "must be an integer >= 2")
        require(self.d_model % self.n_heads == 0, "train.n_heads", self.n_heads, "must divide train.d_model")


@dataclass
class BenchOptimConfig:
    """Optimizer section ([optim]): the whole training step (forward, backward, clipping, optimizer) with AdamW, Muon
    and NorMuon as ``fullband compare``'s default trains (its model, batch and optimizer settings, its blocks compiled
    where its runs compile them, one pass: the baselines' step and the feedback models' cheapest); beside them the
    step's weight products alone, a matmul peak in the same rounds, and, where the blocks compile, the AdamW step with
    eager blocks; on a CPU also the AdamW and NorMuon steps as compare runs them, its workers side by side
    (``fullband.bench.workers``)."""

    d_model: int = doc(128, "Model width (compare's default).")
    n_layers: int = doc(4, "Transformer blocks.")
    n_heads: int = doc(4, "Attention heads.")
    batch_size: int = doc(16, "Rows per step.")
    seq_len: int = doc(128, "Tokens per row.")
    passes: int = doc(1, "Passes of every step (the compare default's feedback models mostly train with 2).")
    steps_per_round: int = doc(2, "Steps timed back to back per case and round.")
    ns_dtype: str = doc("auto", f"Newton-Schulz dtype of the Muon and NorMuon rows, one of {NS_DTYPES}: auto = what "
                        "fullband train chooses on this device.")
    emulated_bf16: bool = doc(
        True, "CPU: also time Muon with bfloat16 orthogonalisation and oneDNN off in its step, torch's own bf16 "
        "matmul: the emulated path of CPUs without bf16 instructions (torch.optim.Muon's cost there), on any CPU.")

    def __post_init__(self) -> None:
        _require_counts(self, ("d_model", "n_layers", "n_heads", "batch_size", "passes", "steps_per_round"))
        require(is_int(self.seq_len) and self.seq_len >= 2, "optim.seq_len", self.seq_len, "must be an integer >= 2")
        require(self.d_model % self.n_heads == 0, "optim.n_heads", self.n_heads, "must divide optim.d_model")
        require(self.ns_dtype in NS_DTYPES, "optim.ns_dtype", self.ns_dtype, f"must be one of {NS_DTYPES}")
        require(isinstance(self.emulated_bf16, bool), "optim.emulated_bf16", self.emulated_bf16,
                "must be true or false")


@dataclass
class BenchDecodeConfig:
    """Decoding section ([decode]): GPT-2-small dimensions by default."""

    d_model: int = doc(768, "Model width.")
    n_layers: int = doc(12, "Transformer blocks.")
    n_heads: int = doc(12, "Attention heads.")
    vocab_size: int = doc(32000, "Vocabulary.")
    prompt_len: int = doc(16, "Prompt tokens (random ids, the same for every case).")
    new_tokens: int = doc(32, "Greedy tokens generated per call.")
    batch_sizes: tuple[int, ...] = doc((1, 8), "Batch sizes to decode at.")
    steps: tuple[str, ...] = doc(("compiled",), "Also decode with these decode steps (DecodeOptions.step: static, "
                                 "compiled) in the same rounds, each against the eager step; compiled by default (the "
                                 "fastest batch-1 step on a CPU; it compiles in the warm-up, 10-30 s on a CPU).")

    def __post_init__(self) -> None:
        _require_counts(self, ("d_model", "n_layers", "n_heads", "vocab_size", "prompt_len", "new_tokens"))
        self.batch_sizes = tuple(self.batch_sizes)
        require(len(self.batch_sizes) > 0 and all(is_int(b) and b >= 1 for b in self.batch_sizes),
                "decode.batch_sizes", self.batch_sizes, "must be one or more integers >= 1")
        require(self.d_model % self.n_heads == 0, "decode.n_heads", self.n_heads, "must divide decode.d_model")
        self.steps = tuple(self.steps)
        require(all(s in ("static", "compiled") for s in self.steps) and len(set(self.steps)) == len(self.steps),
                "decode.steps", self.steps, "must name each of static, compiled at most once")


@dataclass
class BenchExactConfig:
    """Exact-likelihood section ([exact]): ``forward_exact`` by each method on the same windows."""

    checkpoint: str | None = doc(
        None, "Model directory to score (a trained model: Jacobi's pass count depends on training); none = random "
        "weights at the [train] dimensions.")
    batch_size: int = doc(4, "Windows scored together.")
    seq_len: int = doc(256, "Tokens per window.")
    chunk_size: int = doc(32, "chunked: positions per chunk.")
    tol: float = doc(1e-4, "Tolerance of the rows that stop early (max|h^(k) - h^(k-1)| < tol).")

    def __post_init__(self) -> None:
        _require_counts(self, ("batch_size", "chunk_size"))
        require(is_int(self.seq_len) and self.seq_len >= 2, "exact.seq_len", self.seq_len, "must be an integer >= 2")
        require(is_number(self.tol) and self.tol > 0, "exact.tol", self.tol, "must be > 0")


BENCH_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # the sections' defaults: about 3.5 minutes on 2 CPU cores
    "quick": {  # seconds: the tests
        "rounds": 2, "limit_mib": 16,
        "train": {"d_model": 32, "n_layers": 2, "n_heads": 2, "batch_size": 2, "seq_len": 16, "steps_per_round": 1},
        "optim": {"d_model": 32, "n_layers": 2, "n_heads": 2, "batch_size": 2, "seq_len": 16, "steps_per_round": 1},
        "decode": {"d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 256, "prompt_len": 4, "new_tokens": 6,
                   "steps": []},
        "exact": {"batch_size": 1, "seq_len": 16, "chunk_size": 4},
    },
}


@dataclass
class BenchConfig:
    """``fullband bench``: train step, the optimizers' training steps, multi-pass steps, decoding and exact
    likelihood against the peers, with the machine's limits measured in the same run; one table (and ``--json
    FILE``)."""

    preset: str = doc("default", f"One of {tuple(BENCH_PRESETS)}: default = about 3.5 minutes on 2 CPU cores; quick = "
                      "seconds (tests).")
    sections: tuple[str, ...] = doc(SECTIONS, f"Sections to run, from {SECTIONS}.")
    rounds: int = doc(5, "Interleaved rounds per comparison; every ratio is the median over rounds.")
    limit_mib: int = doc(256, "Size of the tensor copied to measure memory bandwidth (MiB).")
    train: BenchTrainConfig = field(default_factory=BenchTrainConfig)
    optim: BenchOptimConfig = field(default_factory=BenchOptimConfig)
    decode: BenchDecodeConfig = field(default_factory=BenchDecodeConfig)
    exact: BenchExactConfig = field(default_factory=BenchExactConfig)
    seed: int = doc(0, "Seed of the weights and tokens.")
    json: str | None = doc(None, "Also write every figure, the machine and its load to this JSON file.")
    device: str = device_field("to time on")
    threads: str = threads_field()

    def __post_init__(self) -> None:
        validate_device_name(self.device)
        self.threads = validate_threads(self.threads)
        apply_preset(self, BENCH_PRESETS)
        self.sections = tuple(self.sections)
        require(len(self.sections) > 0 and all(s in SECTIONS for s in self.sections), "sections", self.sections,
                f"must be one or more of {SECTIONS}")
        _require_counts(self, ("rounds", "limit_mib"))
        require(is_int(self.seed) and self.seed >= 0, "seed", self.seed, "must be an integer >= 0")


def _require_counts(config: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        require(is_int(value) and value >= 1, name, value, "must be an integer >= 1")
