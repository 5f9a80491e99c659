import json

import pytest

from fullband.data import BPETokenizer, ByteTokenizer, DataError, load_tokenizer, train_bpe

SAMPLE = "Héllo, wörld! 日本語 😀 <|endoftext|>\r\n\ttabs  and   spaces"


def _corpus() -> list[str]:
    words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"]
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(200)) for i in range(20)]


def test_byte_round_trip_non_ascii():
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE)
    assert ids == list(SAMPLE.encode("utf-8"))
    assert max(ids) < 256 and tok.eos_id == 256 and tok.vocab_size == 257 and tok.bos_id is None
    assert tok.decode(ids) == SAMPLE
    # special / out-of-range ids are dropped, broken UTF-8 is replaced rather than raising
    assert tok.decode([*ids, tok.eos_id, 999]) == SAMPLE
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"


def test_byte_save_load(tmp_path):
    ByteTokenizer().save(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["type"] == "byte"
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, ByteTokenizer)
    assert tok.fingerprint == ByteTokenizer().fingerprint


def test_bpe_train_save_load_round_trip(tmp_path):
    tok = train_bpe(_corpus(), vocab_size=300, min_frequency=1)
    assert isinstance(tok, BPETokenizer)
    assert 257 <= tok.vocab_size <= 300
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE  # byte-level: exact for any text
    assert tok.eos_id not in ids  # the literal string is text, not the special token
    assert len(tok.encode("thou art more lovely")) < len("thou art more lovely")  # merges learned

    tok.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["type"] == "bpe" and (tmp_path / "tokenizer.json").is_file()
    back = load_tokenizer(tmp_path)
    assert isinstance(back, BPETokenizer)
    assert back.encode(SAMPLE) == ids and back.eos_id == tok.eos_id and back.vocab_size == tok.vocab_size
    assert back.fingerprint == tok.fingerprint
    assert back.decode([*ids, tok.eos_id, 10**6]) == SAMPLE
    assert back.encode_batch(["thou", "art"]) == [back.encode("thou"), back.encode("art")]


def test_fingerprints_differ():
    a = train_bpe(_corpus(), vocab_size=280, min_frequency=1)
    b = train_bpe(_corpus(), vocab_size=320, min_frequency=1)
    assert len({a.fingerprint, b.fingerprint, ByteTokenizer().fingerprint}) == 3


def test_load_tokenizer_none_and_errors(tmp_path):
    assert load_tokenizer(tmp_path) is None
    assert load_tokenizer(tmp_path / "missing") is None
    (tmp_path / "tokenizer_config.json").write_text('{"type": "sentencepiece"}')
    with pytest.raises(DataError, match="unknown tokenizer type 'sentencepiece'"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"type": "bpe"}')
    with pytest.raises(DataError, match=r"tokenizer\.json is missing"):
        load_tokenizer(tmp_path)
    with pytest.raises(DataError, match="at least 257"):
        train_bpe(["abc"], vocab_size=100)
