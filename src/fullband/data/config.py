"""The config of ``fullband prepare`` (torch-free, so the command line checks it before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from fullband import rundir
from fullband.config import HF_PREFIX, doc, is_int, is_number, require, threads_field, validate_threads
from fullband.data.splits import HELD_OUT

SHARD_DTYPES = ("auto", "uint16", "uint32")
# The layout fullband prepare writes and training reads (data/prepare.py, data/prepared.py).
INDEX_FILE = rundir.DATA_INDEX
PROGRESS_FILE = rundir.DATA_PROGRESS
TOKENIZER_DIR = rundir.TOKENIZER_DIR
SHARDS_FORMAT = "fullband-token-shards"


@dataclass
class PrepareConfig:
    """Options of ``fullband prepare``: tokenize a corpus once into memory-mapped token shards for training."""

    input: str = doc(
        "", "What to tokenize (required): a text file, a JSONL file (one JSON object per line, text in --field), a "
        f"directory (every *.txt and *.jsonl below it, sorted by path), or {HF_PREFIX}PATH_OR_NAME: a Hugging Face "
        "dataset (a save_to_disk directory, a local data directory, or a hub name, streamed as "
        "datasets.load_dataset does; HF_DATASETS_OFFLINE=1 keeps it to the local cache).")
    out_dir: str = doc("", "Directory for the shards and index.json (required); rerunning the same command there "
                       "resumes an interrupted prepare.")
    tokenizer: str = doc("byte", f"byte (UTF-8 bytes), {HF_PREFIX}PATH (a tokenizer.json file or a local transformers "
                         "tokenizer directory), or a directory a fullband tokenizer was saved to (runs/x/tokenizer).")
    field: str = doc("text", "JSONL and datasets: the field (column) that holds the text.")
    hf_config: str | None = doc(None, f"{HF_PREFIX} datasets: the dataset configuration (subset) name.")
    split: str = doc("train", f"{HF_PREFIX} datasets: the split to read.")
    val_fraction: float = doc(
        HELD_OUT[0], "Share of the input held out for validation, in [0, 0.5]: the first documents holding it (by "
        "bytes for files, a text file cut at a line end; by rows for datasets); 0 = none. The same default as "
        "fullband train's --data.val_fraction; prepared data has no test split.")
    shard_tokens: int = doc(100_000_000, "Tokens per shard file (a shard ends at the first chunk end past this).")
    chunk_bytes: int = doc(1 << 20, "Text per work unit in bytes; a large text file is tokenized in pieces of about "
                           "this size cut at line ends.")
    dtype: str = doc("auto", "Token dtype on disk: auto (uint16 when the vocabulary fits, else uint32), uint16, "
                     "uint32.")
    workers: int = doc(0, "Tokenizing processes; 0 = one per core this process may use.")
    progress: bool = doc(True, "Show a progress bar (on stderr).")
    threads: str = threads_field()

    def __post_init__(self) -> None:
        require(bool(self.input), "input", self.input, f"give what to tokenize (--input FILE, DIR or {HF_PREFIX}NAME)")
        require(bool(self.out_dir), "out_dir", self.out_dir, "give the directory for the shards (--out_dir DIR)")
        require(bool(self.tokenizer) and self.tokenizer != HF_PREFIX, "tokenizer", self.tokenizer,
                f"give byte, {HF_PREFIX}PATH or a tokenizer directory")
        require(bool(self.field), "field", self.field, "name the text field, e.g. --field text")
        require(is_number(self.val_fraction) and 0 <= self.val_fraction <= 0.5, "val_fraction", self.val_fraction,
                "must be in [0, 0.5]")
        require(is_int(self.shard_tokens) and self.shard_tokens >= 1, "shard_tokens", self.shard_tokens,
                "must be an integer >= 1")
        require(is_int(self.chunk_bytes) and self.chunk_bytes >= 1, "chunk_bytes", self.chunk_bytes,
                "must be an integer >= 1")
        require(self.dtype in SHARD_DTYPES, "dtype", self.dtype, f"must be one of {SHARD_DTYPES}")
        require(is_int(self.workers) and self.workers >= 0, "workers", self.workers,
                "must be an integer >= 0 (0 = one per core)")
        self.threads = validate_threads(self.threads)
