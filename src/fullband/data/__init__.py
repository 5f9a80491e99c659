"""Data layer: corpora (Shakespeare by default), tokenizers, cached token arrays, batches, SFT data."""

from fullband.data.cache import cache_dir
from fullband.data.corpus import load_corpus
from fullband.data.errors import DataError
from fullband.data.sft import (
    IGNORE_INDEX,
    SFTBatches,
    SFTExample,
    collate_sft,
    encode_chat,
    encode_prompt_completion,
    load_sft,
)
from fullband.data.shakespeare import fetch as fetch_shakespeare
from fullband.data.shards import (
    TokenBatches,
    TokenSplit,
    bits_per_byte,
    encode_documents,
    eval_windows,
    load_tokens,
    rank_slice,
)
from fullband.data.splits import SPLITS, normalize_split, split_names, split_text
from fullband.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    TransformersTokenizer,
    load_tokenizer,
    train_bpe,
)

__all__ = [
    "IGNORE_INDEX",
    "SPLITS",
    "BPETokenizer",
    "ByteTokenizer",
    "DataError",
    "SFTBatches",
    "SFTExample",
    "TokenBatches",
    "TokenSplit",
    "Tokenizer",
    "TransformersTokenizer",
    "bits_per_byte",
    "cache_dir",
    "collate_sft",
    "encode_chat",
    "encode_documents",
    "encode_prompt_completion",
    "eval_windows",
    "fetch_shakespeare",
    "load_corpus",
    "load_sft",
    "load_tokenizer",
    "load_tokens",
    "normalize_split",
    "rank_slice",
    "split_names",
    "split_text",
    "train_bpe",
]
