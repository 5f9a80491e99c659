"""Data layer: corpora (Shakespeare by default), tokenizers, cached token arrays, prepared token shards, batches,
SFT data.

The names below load on first use, so ``fullband.data.config`` (torch-free: the command line checks ``fullband
prepare``'s options before importing torch) can be imported without the rest.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "cache_dir": "cache", "load_corpus": "corpus", "DataError": "errors",
    "IGNORE_INDEX": "sft", "SFTBatches": "sft", "SFTExample": "sft", "collate_sft": "sft", "encode_chat": "sft",
    "encode_prompt_completion": "sft", "load_sft": "sft", "fetch_shakespeare": "shakespeare",
    "TokenBatches": "shards", "TokenSplit": "shards", "bits_per_byte": "shards", "encode_documents": "shards",
    "eval_windows": "shards", "load_tokens": "shards", "rank_slice": "shards",
    "SPLITS": "splits", "normalize_split": "splits", "split_names": "splits", "split_text": "splits",
    "split_files": "splits",
    "BPETokenizer": "tokenizer", "ByteTokenizer": "tokenizer", "Tokenizer": "tokenizer",
    "TransformersTokenizer": "tokenizer", "load_pretrained_tokenizer": "tokenizer", "load_tokenizer": "tokenizer",
    "named_tokenizer": "tokenizer", "train_bpe": "tokenizer",
    "ShardSplit": "prepared", "is_prepared": "prepared", "load_prepared": "prepared",
    "prepared_tokenizer": "prepared", "prepare_shards": "prepare",
}
_RENAMED = {"fetch_shakespeare": "fetch"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fullband.data' has no attribute {name!r}")
    value = getattr(import_module(f"fullband.data.{_EXPORTS[name]}"), _RENAMED.get(name, name))
    globals()[name] = value  # later lookups skip __getattr__
    return value
