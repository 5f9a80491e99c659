"""The configs of ``fullband train`` (torch-free, so the command line checks them before importing torch): the
run ([model], [data], [train], [optim], [schedule] sections, and the options sections the model families declare
in ``fullband.families``) and the checks of each section. The [train], [optim] and [schedule]
sections live in ``fullband.training.sections`` and are importable from here too."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

from fullband.config import (
    HF_PREFIX,
    ConfigError,
    ModelConfig,
    apply_preset,
    device_field,
    doc,
    is_int,
    is_number,
    require,
    threads_field,
    validate_device_name,
    validate_resume,
    validate_threads,
)
from fullband.data.splits import HELD_OUT
from fullband.families import FamilyOptions, source_family, source_help
from fullband.training.recipes import TRAIN_PRESETS
from fullband.training.sections import (  # noqa: F401  (the sections' public home stays this module)
    AUTOCAST,
    COMPILE,
    COMPILE_MIN_CPU_STEPS,
    COMPILE_MIN_CPU_WORK,
    LR_SCHEDULES,
    NS_DTYPES,
    OPTIMIZERS,
    PARALLEL,
    Z_LOSS_WHEN,
    OptimConfig,
    ScheduleConfig,
    TrainConfig,
    validate_optim_config,
    validate_schedule_config,
    validate_train_config,
)

# ---------------------------------------------------------------------------------------------- fullband train

TOKENIZERS = ("byte", "bpe")
DATA_FORMATS = ("text", "sft")


@dataclass
class TrainModelConfig(ModelConfig):
    """Architecture ([model]); vocab_size 0 takes the tokenizer's vocabulary."""

    vocab_size: int = doc(0, "Number of token ids; 0 = the tokenizer's vocabulary rounded up to a multiple of 64.")

    def __post_init__(self) -> None:
        require(is_int(self.vocab_size) and self.vocab_size >= 0, "vocab_size", self.vocab_size,
                "must be an integer >= 0 (0 = from the tokenizer)")
        self.read_boolean_input_norm()
        self.resolve(max(self.vocab_size, 1))  # validates every other field

    def resolve(self, tokenizer_vocab: int) -> ModelConfig:
        """The ModelConfig to build, with vocab_size filled in (and checked) against the tokenizer."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        if self.vocab_size == 0:
            fields["vocab_size"] = 64 * math.ceil(tokenizer_vocab / 64)
        elif self.vocab_size < tokenizer_vocab:
            raise ConfigError(f"model.vocab_size={self.vocab_size} is invalid: the tokenizer has {tokenizer_vocab} "
                              "tokens; set model.vocab_size >= that, or 0 to take it from the tokenizer")
        return ModelConfig(**fields)


@dataclass
class DataConfig:
    """Training data ([data])."""

    source: str = doc("shakespeare", "Corpus: 'shakespeare' (embedded default), a directory written by fullband "
                      "prepare (token shards + index.json, read through memory maps, its own tokenizer), a text file "
                      f"or directory, '{HF_PREFIX}NAME[:field]' (Hugging Face datasets), or with format=sft a JSONL "
                      "file.")
    format: str = doc("text", "text = language modelling on the corpus; sft = prompt/completion or chat JSONL "
                      "with the prompt masked out of the loss.")
    validation_source: str | None = doc(None, "sft: JSONL for validation (text sources bring their own split).")
    tokenizer: str = doc("byte", "byte (UTF-8 bytes, no training), bpe (trained on the train split), or "
                         f"{HF_PREFIX}PATH: a pretrained tokenizer, a tokenizer.json file or a local transformers "
                         "tokenizer directory (vocabulary and end-of-text token from it). A prepared source brings its "
                         "own tokenizer.")
    bpe_vocab_size: int = doc(2048, "Vocabulary size of a trained BPE tokenizer.")
    curriculum: float = doc(
        0.0, "sft: over the first this fraction of the steps, batches come from a prefix of the file that grows "
        "linearly to all of it (so the file's order is the difficulty order); 0 = uniform throughout, in [0, 1].")
    val_fraction: float = doc(
        HELD_OUT[0], "Share of a text source held out for validation, in (0, 0.5]: a text file is cut at line starts "
        "into train, then validation, then test; a directory's files (in path order) give validation the first this "
        "share of their bytes and test the next test_fraction, cut at line ends, as fullband prepare does; a dataset "
        "of one split and the embedded corpus hold out that share of their documents (ranked by a fixed hash). "
        "Sources with their own splits (split directories, dataset splits, prepared shards: fullband prepare "
        "--val_fraction) keep them.")
    test_fraction: float = doc(
        HELD_OUT[1], "Share of a text source held out for testing (fullband compare scores it), in [0, 0.5], cut "
        "as val_fraction's.")

    def __post_init__(self) -> None:
        require(isinstance(self.source, str) and bool(self.source), "data.source", self.source,
                f"give a corpus name, a path or {HF_PREFIX}NAME")
        require(self.format in DATA_FORMATS, "data.format", self.format, f"must be one of {DATA_FORMATS}")
        require(self.tokenizer in TOKENIZERS or (self.tokenizer.startswith(HF_PREFIX) and self.tokenizer != HF_PREFIX),
                "data.tokenizer", self.tokenizer, f"must be one of {TOKENIZERS} or {HF_PREFIX}PATH")
        require(is_int(self.bpe_vocab_size) and 260 <= self.bpe_vocab_size <= 1_000_000, "data.bpe_vocab_size",
                self.bpe_vocab_size, "must be an integer in 260..1000000")
        require(is_number(self.curriculum) and 0 <= self.curriculum <= 1, "data.curriculum", self.curriculum,
                "must be in [0, 1] (0 = no curriculum)")
        require(is_number(self.val_fraction) and 0 < self.val_fraction <= 0.5, "data.val_fraction",
                self.val_fraction, "must be in (0, 0.5]")
        require(is_number(self.test_fraction) and 0 <= self.test_fraction <= 0.5, "data.test_fraction",
                self.test_fraction, "must be in [0, 0.5]")

    def held_out(self) -> tuple[float, float]:
        """(validation, test) shares of a text source split here (fullband.data.splits)."""
        return float(self.val_fraction), float(self.test_fraction)


@dataclass
class TrainSections:
    """The sections of a run that every model family reads."""

    preset: str = doc(
        "recipe", f"Settings to start from: one of {tuple(TRAIN_PRESETS)}. recipe = the best recipe our recipe "
        "study measured, the one fullband compare trains with (NorMuon, fusion LR x3, feedback from the first step); "
        "paper = the paper's published recipe (NorMuon at its 1B-run rates, 200 warmup steps, a 25% cool-down to "
        "zero, single-pass until 75% of the steps). Values from a config file or the command line override it.")
    model: TrainModelConfig = field(default_factory=TrainModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(eval_every=250))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig())
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig())


@dataclass
class TrainRunConfig(FamilyOptions, TrainSections):
    """``fullband train``: all sections of one run (the families' options sections after [schedule])."""

    DEVICE_PER_PROCESS: ClassVar[bool] = True  # "auto" resolved by each torchrun process (its LOCAL_RANK's GPU)
    # What ``fullband train --help`` shows first (``--help-all``: every option), as litgpt and Hugging Face list the
    # options most runs set before the rest.
    COMMON_OPTIONS: ClassVar[tuple[str, ...]] = (
        "--config", "--out_dir", "--resume", "--preset", "--data.source", "--data.tokenizer", "--init_from",
        "--model.d_model", "--model.n_layers", "--model.n_heads", "--model.feedback", "--train.max_steps",
        "--train.batch_size", "--train.seq_len", "--train.eval_every", "--train.checkpoint_every", "--optim.lr",
        "--device", "--threads",
    )

    out_dir: str = doc("runs/train", "Run directory: checkpoints/, metrics.jsonl, config.toml, model/ at the end.")
    resume: str = doc(
        "false", "Continue from the latest complete checkpoint in out_dir: true = continue, an error when there is "
        "none; auto = continue if there is one, else start from scratch; false = start, an error when out_dir holds "
        "checkpoints.")
    init_from: str | None = doc(
        None, "Start from this model directory (a native model's architecture replaces [model] and model.feedback "
        "decides whether fusion weights are added; another family's model continues as saved), or from "
        + source_help(),
    )
    device: str = device_field("to train on")
    threads: str = threads_field()
    eval_passes: tuple[int, ...] = doc(
        (1, 2, 3), "Pass counts validated: 1 = standard, k = fused prefill with k-1 extra passes.",
    )

    def __post_init__(self) -> None:
        apply_preset(self, TRAIN_PRESETS)
        self.resume = validate_resume(self.resume)
        validate_device_name(self.device)
        self.threads = validate_threads(self.threads)
        require(bool(self.eval_passes) and all(is_int(k) and k >= 1 for k in self.eval_passes), "eval_passes",
                self.eval_passes, "must be a non-empty list of integers >= 1")
        require(isinstance(self.out_dir, str) and bool(self.out_dir), "out_dir", self.out_dir, "give a directory")
        if (family := source_family(self.init_from)) is not None:  # a source the model is built from: PREFIX:PATH
            require(bool(str(self.init_from)[len(family.source_prefix or ""):].strip()), "init_from", self.init_from,
                    f"give the directory after {family.source_prefix} (init_from='{family.source_prefix}PATH')")
        self.check_family_options(self.init_from, self.model.feedback)
