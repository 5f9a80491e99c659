"""Tokenizers: a small common interface, a byte tokenizer, a byte-level BPE (HF ``tokenizers``) and a
pretrained model's own transformers tokenizer.

On disk a tokenizer is a directory with fullband's ``tokenizer_config.json`` (``{"type": "byte" | "bpe" | "hf",
...}``) and

- for BPE, the ``tokenizers`` library's ``tokenizer.json`` beside it;
- for ``hf`` (:class:`TransformersTokenizer`, the tokenizer of a retrofitted transformers model), the
  tokenizer's own ``save_pretrained`` in the same directory, fullband's keys (``{"type": "hf", "path": "."}``)
  added to transformers' ``tokenizer_config.json`` (older saves: in the sub-directory ``path`` names).

The byte and BPE tokenizers also write what transformers' ``AutoTokenizer`` reads from the same directory: a
``tokenizer.json`` (for the byte tokenizer, a byte-level model whose ids are the bytes) and transformers' keys in
``tokenizer_config.json`` (``tokenizer_class``, ``eos_token``, ``split_special_tokens``), which fullband ignores,
so a checkpoint's tokenizer opens in HF tools (lm-eval's ``--model hf``) and encodes to the same ids.

``load_tokenizer(dir)`` reads each back. Two foreign layouts load too: a bare ``tokenizer.json`` if it has a
recognisable end-of-text token, and a directory written by a transformers tokenizer's ``save_pretrained`` (its
``tokenizer_config.json`` has no ``type`` but transformers' keys), read with ``AutoTokenizer``.

Special ids are only ever produced by id (``eos_id``), never by encoding text: a corpus that happens to
contain the string ``<|endoftext|>`` encodes it as ordinary text. ``decode`` drops special and
out-of-range ids (a model's embedding table may be larger than the tokenizer's vocabulary).
"""

from __future__ import annotations

import json
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fullband.config import HF_PREFIX, install_hint
from fullband.data.cache import sha256_bytes
from fullband.data.errors import DataError
from fullband.files import write_bytes, write_json

CONFIG_FILE = "tokenizer_config.json"
BPE_FILE = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
HF_TOKENIZER_DIR = "hf_tokenizer"  # where TransformersTokenizer.save puts the transformers files
# Keys of a transformers tokenizer_config.json (one without fullband's "type").
_TRANSFORMERS_KEYS = ("tokenizer_class", "added_tokens_decoder", "model_max_length")
_KNOWN_EOS = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")


class Tokenizer(ABC):
    """What the rest of fullband needs from a tokenizer."""

    vocab_size: int
    eos_id: int
    bos_id: int | None = None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special and unknown ids are dropped."""

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Write the tokenizer files into ``directory`` (created if needed)."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """The JSON written as ``tokenizer_config.json``."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @property
    def fingerprint(self) -> str:
        """Hex digest that changes whenever the text -> ids mapping could change (used as a cache key)."""
        return sha256_bytes(json.dumps(self.config(), sort_keys=True).encode())


def _hf_keys(eos_token: str) -> dict[str, Any]:
    """transformers' keys of a tokenizer_config.json that describe fullband's own encoding rules."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos_token,
        "split_special_tokens": True,  # as in fullband: text spelling a special token encodes as text
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of a ``ByteLevel`` pre-tokenizer."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _byte_tokenizer_json(eos_id: int) -> dict[str, Any]:
    """A ``tokenizers`` definition whose ids are the UTF-8 bytes (no merges) plus the end-of-text token."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos_id, "content": EOS_TOKEN, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {char: b for b, char in _bytes_to_unicode().items()}, "merges": []},
    }


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, then ``<|endoftext|>`` = 256: vocabulary 257, nothing to train."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def config(self) -> dict[str, Any]:
        return {"type": "byte", "vocab_size": self.vocab_size, "eos_id": self.eos_id, "bos_id": None}

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        write_json(directory / BPE_FILE, _byte_tokenizer_json(self.eos_id), sort_keys=True)  # for AutoTokenizer
        write_json(directory / CONFIG_FILE, {**_hf_keys(EOS_TOKEN), **self.config()}, sort_keys=True)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class BPETokenizer(Tokenizer):
    """A wrapped ``tokenizers.Tokenizer`` (normally byte-level BPE from ``train_bpe``)."""

    def __init__(self, tk: Any, eos_token: str = EOS_TOKEN) -> None:
        eos_id = tk.token_to_id(eos_token)
        if eos_id is None:
            raise DataError(f"tokenizer has no end-of-text token {eos_token!r}")
        self._tk = tk
        self._tk.encode_special_tokens = True  # text never turns into special ids (see module doc)
        self.eos_token = eos_token
        self.eos_id = eos_id
        self.bos_id = None
        self.vocab_size = tk.get_vocab_size(with_added_tokens=True)
        self._json = tk.to_str()

    def __reduce__(self) -> tuple[Any, ...]:
        # tokenizers' own pickling drops encode_special_tokens: rebuild from the definition (prepare's workers)
        return _bpe_from_json, (self._json, self.eos_token)

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # The Rust side parallelises across texts; encode_batch_fast (tokenizers >= 0.21) skips the offsets.
        encode = getattr(self._tk, "encode_batch_fast", self._tk.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tk.decode([i for i in ids if 0 <= i < self.vocab_size], skip_special_tokens=True)

    def config(self) -> dict[str, Any]:
        return {
            "type": "bpe",
            "vocab_size": self.vocab_size,
            "eos_token": self.eos_token,
            "eos_id": self.eos_id,
            "bos_id": None,
            "tokenizer_sha256": sha256_bytes(self._json.encode()),
        }

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        write_bytes(directory / BPE_FILE, self._json.encode("utf-8"))
        # written last: marks a complete save
        write_json(directory / CONFIG_FILE, {**_hf_keys(self.eos_token), **self.config()}, sort_keys=True)

    @classmethod
    def from_file(cls, path: str | Path, eos_token: str | None = None) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            tk = HFTokenizer.from_file(str(path))
        except Exception as err:  # the tokenizers library raises a bare Exception for a damaged file
            raise DataError(f"{path} is not a valid tokenizers file ({err}); save the tokenizer again") from None
        if eos_token is None:
            vocab = tk.get_vocab(with_added_tokens=True)
            eos_token = next((t for t in _KNOWN_EOS if t in vocab), None)
            if eos_token is None:
                raise DataError(
                    f"{path}: cannot tell which token is end-of-text (looked for {', '.join(_KNOWN_EOS)}); "
                    f"add a {CONFIG_FILE} with an eos_token"
                )
        return cls(tk, eos_token)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _bpe_from_json(definition: str, eos_token: str) -> BPETokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    return BPETokenizer(HFTokenizer.from_str(definition), eos_token)


def train_bpe(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2) -> BPETokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenisation, exact round trip) with ``<|endoftext|>`` as eos.

    The vocabulary always contains all 256 byte symbols, so any text encodes; ``vocab_size`` is an upper
    bound (a small corpus may run out of merges first).
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise DataError(f"BPE vocab_size must be at least 257 (256 bytes + eos), got {vocab_size}")
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tk)


class TransformersTokenizer(Tokenizer):
    """A transformers tokenizer (``AutoTokenizer``) behind fullband's interface: a pretrained model's own.

    As everywhere in fullband, special tokens are never added while encoding and text that spells one (say
    ``<|endoftext|>``) encodes as ordinary text (``split_special_tokens``); the end-of-text id is the
    tokenizer's ``eos_token`` (or, when that is unset, the first of the usual end-of-text tokens in its
    vocabulary). ``vocab_size`` counts added tokens (``len(tokenizer)``).

    Saved with the tokenizer's own ``save_pretrained`` into the directory itself, so ``AutoTokenizer`` reads it
    there, and fullband's keys (``{"type": "hf", "path": ".", ...}``) then added to its ``tokenizer_config.json``
    (transformers keeps unknown keys as init arguments and ignores them). Older saves, with the files in
    ``hf_tokenizer/`` and the marker alone in ``tokenizer_config.json``, still load.
    """

    def __init__(self, tk: Any, source: str = "") -> None:
        eos_id = tk.eos_token_id
        if eos_id is None:
            vocab = tk.get_vocab()
            eos_id = next((vocab[t] for t in _KNOWN_EOS if t in vocab), None)
        if eos_id is None:
            raise DataError(f"the tokenizer {source or type(tk).__name__} has no end-of-text token (eos_token is "
                            f"unset and none of {', '.join(_KNOWN_EOS)} is in its vocabulary); set its eos_token "
                            "and save it again")
        self._tk = tk
        self.eos_id = int(eos_id)
        self.bos_id = tk.bos_token_id
        self.vocab_size = len(tk)
        self._sha256 = sha256_bytes(self._identity().encode())

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> TransformersTokenizer:
        """``AutoTokenizer.from_pretrained(directory)`` (local files only), wrapped."""
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise DataError(f"{directory} holds a transformers tokenizer; loading it needs transformers "
                            f"({install_hint('hf')})") from None
        # (Beside a fullband checkpoint's config.json, which names remote code, fullband.families registers the
        # families' model types first, so AutoTokenizer reads that config locally: the model family's concern.)
        try:
            tk = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise DataError(f"cannot load a transformers tokenizer from {directory}: {first}") from None
        return cls(tk, str(directory))

    @property
    def hf_tokenizer(self) -> Any:
        """The wrapped transformers tokenizer."""
        return self._tk

    def _identity(self) -> str:
        # What decides text -> ids: the backend's full definition when it has one (fast tokenizers), else the
        # vocabulary; the class and the special tokens in both cases.
        backend = getattr(self._tk, "backend_tokenizer", None)
        definition = backend.to_str() if backend is not None else json.dumps(self._tk.get_vocab(), sort_keys=True)
        special = json.dumps(self._tk.special_tokens_map, sort_keys=True, default=str)
        return "\n".join((type(self._tk).__name__, special, definition))

    def _call(self, texts: str | list[str]) -> Any:
        return self._tk(texts, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]

    def encode(self, text: str) -> list[int]:
        return list(self._call(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in self._call(list(texts))] if texts else []

    def decode(self, ids: Sequence[int]) -> str:
        return self._tk.decode([i for i in ids if 0 <= i < self.vocab_size], skip_special_tokens=True)

    def config(self) -> dict[str, Any]:
        return {
            "type": "hf",
            "path": ".",
            "tokenizer_class": type(self._tk).__name__,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "tokenizer_sha256": self._sha256,
        }

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        shutil.rmtree(directory / HF_TOKENIZER_DIR, ignore_errors=True)  # an older layout's copy
        self._tk.save_pretrained(str(directory))
        saved = json.loads((directory / CONFIG_FILE).read_text())
        # fullband's keys, last: they mark a complete save. Not those transformers reads itself (the class, and
        # vocab_size, which it would take as an argument).
        ours = {k: v for k, v in self.config().items() if k not in ("tokenizer_class", "vocab_size")}
        # split_special_tokens: HF tools then encode text as fullband trained on it (special tokens only by id).
        write_json(directory / CONFIG_FILE, {**saved, "split_special_tokens": True, **ours}, sort_keys=True)

    def __repr__(self) -> str:
        return f"TransformersTokenizer({type(self._tk).__name__}, vocab_size={self.vocab_size})"


def named_tokenizer(spec: str) -> Tokenizer | None:
    """The tokenizer a ``data.tokenizer`` value names without training one: ``byte``, or a pretrained tokenizer's
    local files (``hf:PATH``, :func:`load_pretrained_tokenizer`); None for anything else (``bpe``, a directory)."""
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith(HF_PREFIX):
        return load_pretrained_tokenizer(spec[len(HF_PREFIX):])
    return None


def load_pretrained_tokenizer(path: str | Path) -> Tokenizer:
    """A pretrained tokenizer from local files (``--data.tokenizer hf:PATH``): a ``tokenizer.json`` file (read with
    ``tokenizers``; end-of-text is the first of the usual end-of-text tokens it has), or a directory with one, a
    transformers tokenizer saved with ``save_pretrained`` (read with ``AutoTokenizer``; its ``eos_token``) or a
    tokenizer fullband saved. Vocabulary size and special ids come from the tokenizer; nothing is downloaded."""
    path = Path(path).expanduser()
    if path.is_file():
        return BPETokenizer.from_file(path)
    if not path.is_dir():
        raise DataError(f"tokenizer not found: {str(path)!r} is neither a tokenizer.json file nor a directory")
    tokenizer = load_tokenizer(path)
    if tokenizer is None:
        raise DataError(f"{path} holds no tokenizer (no {BPE_FILE} or {CONFIG_FILE}); give a tokenizer.json file or "
                        "a directory a tokenizer was saved to (save_pretrained)")
    return tokenizer


def load_tokenizer(directory: str | Path) -> Tokenizer | None:
    """The tokenizer saved in ``directory``, or None if it holds no tokenizer files (or does not exist)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise DataError(f"load_tokenizer expects a directory, got file {directory}")
    cfg_path, bpe_path = directory / CONFIG_FILE, directory / BPE_FILE
    if not cfg_path.is_file():
        return BPETokenizer.from_file(bpe_path) if bpe_path.is_file() else None
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{cfg_path}: invalid JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise DataError(f"{cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    kind = cfg.get("type")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        if not bpe_path.is_file():
            raise DataError(f"{cfg_path} says type 'bpe' but {bpe_path} is missing")
        return BPETokenizer.from_file(bpe_path, cfg.get("eos_token", EOS_TOKEN))
    if kind == "hf":
        sub = cfg.get("path", HF_TOKENIZER_DIR)
        if not isinstance(sub, str) or not sub or Path(sub).is_absolute() or ".." in Path(sub).parts:
            raise DataError(f"{cfg_path}: 'path' must name a sub-directory of {directory}, got {sub!r}")
        if not (directory / sub).is_dir():
            raise DataError(f"{cfg_path} says type 'hf' but {directory / sub} is missing")
        return TransformersTokenizer.from_pretrained(directory / sub)
    if kind is None and any(key in cfg for key in _TRANSFORMERS_KEYS):  # a transformers save_pretrained
        return TransformersTokenizer.from_pretrained(directory)
    raise DataError(f"{cfg_path}: unknown tokenizer type {kind!r} (expected 'byte', 'bpe' or 'hf')")
