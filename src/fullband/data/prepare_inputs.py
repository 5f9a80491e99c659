"""What ``fullband prepare`` reads, cut into chunks (work units) in a fixed order, and how one chunk is tokenized.

A chunk is a byte range of a text or JSONL file, cut at line ends (so neither a UTF-8 character nor a ``\\r\\n`` nor
a JSONL row is ever split), or a list of dataset rows. Chunks never straddle the validation/train boundary: the
validation split is the first ``val_fraction`` of the input (by bytes for files, by rows for datasets). The order of
chunks depends only on the input and the settings, so a resumed prepare sees the same chunks as the first run.

Documents: a text file is one document (a large one is tokenized in chunk-sized pieces), a JSONL row or a dataset
row is one document; empty or whitespace-only documents are dropped. In the token stream of a split, the tokenizer's
``eos_id`` separates documents.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fullband.config import HF_PREFIX, install_hint
from fullband.data.errors import DataError
from fullband.data.tokenizer import Tokenizer

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl",)


@dataclass
class Chunk:
    """One work unit. ``index`` counts chunks of the whole input from 0 (the resume position)."""

    index: int
    split: str  # "validation" | "train"
    kind: str  # "text" | "jsonl" | "rows"
    path: str = ""
    start: int = 0
    end: int = 0
    rows: list[str] = field(default_factory=list)
    field_name: str = "text"

    @property
    def size(self) -> int:
        """Progress units: bytes of a file range, or rows."""
        return self.end - self.start if self.kind != "rows" else len(self.rows)


@dataclass
class Encoded:
    """A tokenized chunk: ``tokens`` has ``eos_id`` before every document start (the writer drops it before the
    first document of a split); ``n_bytes`` counts the UTF-8 bytes of the text (eos not counted)."""

    index: int
    split: str
    tokens: np.ndarray
    n_bytes: int
    n_docs: int
    leads_with_eos: bool
    size: int


def input_files(path: Path) -> list[Path]:
    """The files a file or directory input stands for (a directory: *.txt and *.jsonl below it, by relative path)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(f"input not found: {str(path)!r} is not a file or directory (Hugging Face datasets: "
                        f"--input {HF_PREFIX}PATH_OR_NAME)")
    suffixes = TEXT_SUFFIXES + JSONL_SUFFIXES
    files = sorted((p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes),
                   key=lambda p: p.relative_to(path).as_posix())
    if not files:
        raise DataError(f"{path} contains no .txt or .jsonl files")
    for f in files:
        if not os.access(f, os.R_OK):
            raise DataError(f"cannot read {f}: permission denied")
    return files


def file_kind(path: Path) -> str:
    return "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "text"


def _line_end(f: Any, pos: int, size: int) -> int:
    """The smallest position >= pos that is the file's end or just after a newline."""
    if pos >= size:
        return size
    f.seek(pos - 1 if pos > 0 else 0)
    if pos > 0 and f.read(1) == b"\n":
        return pos
    f.seek(pos)
    while pos < size:
        block = f.read(1 << 16)
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)
    return size


def file_chunks(files: list[Path], chunk_bytes: int, val_fraction: float, field_name: str) -> Iterator[Chunk]:
    """Byte-range chunks of ``files`` in order; the first ``val_fraction`` of all bytes is the validation split."""
    sizes = [f.stat().st_size for f in files]
    val_end = math.ceil(val_fraction * sum(sizes))  # input-stream position where training data starts
    index, offset = 0, 0
    for path, size in zip(files, sizes, strict=True):
        try:
            with open(path, "rb") as f:
                pos = 0
                while pos < size:
                    target = pos + chunk_bytes
                    if offset + pos < val_end < offset + target:  # cut at the validation boundary
                        target = val_end - offset
                    end = _line_end(f, min(target, size), size)
                    split = "validation" if offset + pos < val_end else "train"
                    yield Chunk(index, split, file_kind(path), str(path), pos, end, field_name=field_name)
                    index, pos = index + 1, end
        except OSError as err:
            raise DataError(f"cannot read {path}: {err.strerror}") from None
        offset += size


def _read_range(chunk: Chunk) -> str:
    try:
        with open(chunk.path, "rb") as f:
            f.seek(chunk.start)
            data = f.read(chunk.end - chunk.start)
    except OSError as err:
        raise DataError(f"cannot read {chunk.path}: {err.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{chunk.path} is not valid UTF-8 ({e.reason} at byte {chunk.start + e.start}); convert it "
                        "first") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as Path.read_text


def _jsonl_texts(chunk: Chunk, text: str) -> list[str]:
    texts, at = [], chunk.start
    for line in text.split("\n"):
        where = f"{chunk.path} (the line at byte {at})"
        at += len(line.encode("utf-8")) + 1
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} is not valid JSON ({e.msg}); one JSON object per line expected") from None
        if not isinstance(row, dict):
            raise DataError(f"{where} is a JSON {type(row).__name__}, not an object with a {chunk.field_name!r} "
                            "field")
        if chunk.field_name not in row:
            raise DataError(f"{where} has no field {chunk.field_name!r} (its fields: {', '.join(row) or 'none'}); "
                            "name the text field with --field")
        value = row[chunk.field_name]
        if not isinstance(value, str):
            raise DataError(f"{where}: field {chunk.field_name!r} is a {type(value).__name__}, not a string")
        texts.append(value)
    return texts


def encode_chunk(chunk: Chunk, tokenizer: Tokenizer, dtype: np.dtype) -> Encoded:
    """Read and tokenize one chunk (runs in a worker process)."""
    starts_doc = True
    if chunk.kind == "text":
        text = _read_range(chunk)
        whole = chunk.start == 0 and chunk.end == os.path.getsize(chunk.path)
        texts = [text] if text.strip() or (text and not whole) else []
        starts_doc = chunk.start == 0
    elif chunk.kind == "jsonl":
        texts = _jsonl_texts(chunk, _read_range(chunk))
    else:
        texts = chunk.rows
    texts = [t for t in texts if t.strip()] if chunk.kind != "text" else texts
    limit = np.iinfo(dtype).max
    parts: list[np.ndarray] = []
    for ids in tokenizer.encode_batch(texts) if texts else []:
        if starts_doc:
            parts.append(np.array([tokenizer.eos_id], dtype=dtype))
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.max() > limit or arr.min() < 0):
            raise DataError(f"the tokenizer produced id {int(arr.max())}, which does not fit {dtype.name}; use "
                            "--dtype uint32 (or auto)")
        parts.append(arr.astype(dtype))
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return Encoded(chunk.index, chunk.split, tokens, sum(len(t.encode("utf-8")) for t in texts),
                   len(texts) if starts_doc else 0, starts_doc and bool(texts), chunk.size)


@dataclass
class DatasetInput:
    """An opened Hugging Face dataset split: its rows' texts (streamed) and its row count (None when unknown)."""

    rows: Any
    n_rows: int | None
    description: str


def open_dataset(target: str, config: str | None, split: str, field_name: str, val_fraction: float) -> DatasetInput:
    """A ``save_to_disk`` directory (memory-mapped), else ``load_dataset`` streamed from local files or the local
    cache; loaded memory-mapped instead when a validation split is asked for and the streamed size is unknown."""
    try:
        import datasets  # optional and heavy: imported only for Hugging Face dataset inputs
    except ImportError:
        raise DataError(f"{HF_PREFIX} inputs need the Hugging Face datasets library: "
                        f"{install_hint('data')}"
                        ) from None
    name = target + (f" ({config})" if config else "") + f", split {split!r}"
    local = Path(target).expanduser()
    try:
        if local.is_dir() and any((local / f).is_file() for f in ("dataset_dict.json", "state.json")):
            ds: Any = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"dataset {target!r} has no split {split!r} (it has: {', '.join(ds)}); choose one "
                                    "with --split")
                ds = ds[split]
            n_rows: int | None = len(ds)
        else:
            ds = datasets.load_dataset(target, config, split=split, streaming=True)
            info = (ds.info.splits or {}).get(split) if ds.info is not None else None
            n_rows = info.num_examples if info is not None and info.num_examples else None
            if n_rows is None and val_fraction > 0:
                ds = datasets.load_dataset(target, config, split=split)
                n_rows = len(ds)
    except DataError:
        raise
    except Exception as err:  # datasets raises many types (FileNotFoundError, ValueError, its own) for a bad name
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(f"cannot open dataset {name}: {first}") from None
    columns = ds.column_names or list(ds.features or {})
    if field_name not in columns:
        raise DataError(f"dataset {name} has no column {field_name!r} (columns: {', '.join(columns)}); name the text "
                        "column with --field")
    return DatasetInput(ds.select_columns([field_name]), n_rows, name)


def dataset_chunks(data: DatasetInput, chunk_bytes: int, val_fraction: float, field_name: str) -> Iterator[Chunk]:
    """Row chunks of about ``chunk_bytes`` characters; the first ``ceil(val_fraction * rows)`` rows are validation."""
    n_val = math.ceil(val_fraction * data.n_rows) if data.n_rows is not None and val_fraction > 0 else 0
    index, row, rows, size, split = 0, 0, [], 0, "validation" if n_val else "train"
    for batch in data.rows.iter(batch_size=1000):
        for text in batch[field_name]:
            row_split = "validation" if row < n_val else "train"
            if rows and (row_split != split or size >= chunk_bytes):
                yield Chunk(index, split, "rows", rows=rows)
                index, rows, size = index + 1, [], 0
            split = row_split
            if isinstance(text, str):
                rows.append(text)
                size += len(text)
            row += 1
    if rows:
        yield Chunk(index, split, "rows", rows=rows)
