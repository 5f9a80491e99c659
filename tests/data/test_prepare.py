"""``fullband prepare``: token shards round-trip to the tokenizer's own encoding, dtype choice, resume after a crash
equals an uninterrupted run, several workers equal one, clear errors, local Hugging Face datasets."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from fullband.cli import main
from fullband.data import ByteTokenizer, DataError, encode_documents, is_prepared, load_prepared, train_bpe
from fullband.data import prepare as prepare_mod
from fullband.data.config import PrepareConfig
from fullband.data.prepare import prepare_shards, shard_dtype

DOCS = [f"Document {i}: the quick brown fox, ünïcode {i * 7}.\nSecond line {i}.\n" * (3 + i) for i in range(6)]
DOCS[1] += "Text that spells <|endoftext|> is text, in every worker.\n"


def write_corpus(root, docs=DOCS):
    """Text files (one document each) and one JSONL file whose rows come after them in path order."""
    root.mkdir()
    for i, doc in enumerate(docs[:4]):
        (root / f"a{i}.txt").write_text(doc)
    (root / "z.jsonl").write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs[4:])))
    return root


def prep(inp, out, **options):
    options = {"val_fraction": 0.0, "workers": 1, "progress": False, **options}
    return prepare_shards(PrepareConfig(input=str(inp), out_dir=str(out), **options))


def split_tokens(out, split):
    return np.concatenate([np.asarray(p) for p in load_prepared(out, split).tokens])


def shard_files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_shards_round_trip_to_the_tokenizers_encoding(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    bpe = train_bpe(DOCS, vocab_size=300)
    bpe.save(tmp_path / "tok")
    index = prep(corpus, tmp_path / "out", tokenizer=str(tmp_path / "tok"), shard_tokens=60)
    assert index["dtype"] == "uint16" and index["vocab_size"] == bpe.vocab_size
    train = index["splits"]["train"]
    assert len(train["shards"]) > 2 and index["splits"]["validation"]["tokens"] == 0
    assert np.array_equal(split_tokens(tmp_path / "out", "train"), encode_documents(DOCS, bpe))
    assert train["bytes"] == sum(len(d.encode()) for d in DOCS) and train["docs"] == len(DOCS)
    for shard in train["shards"]:  # flat files, no header: np.memmap reads them as nanoGPT does
        raw = np.memmap(tmp_path / "out" / shard["file"], dtype=np.uint16, mode="r")
        assert raw.shape == (shard["tokens"],)
    # Several processes write exactly the same files.
    prep(corpus, tmp_path / "out2", tokenizer=str(tmp_path / "tok"), shard_tokens=60, workers=2)
    assert shard_files(tmp_path / "out2") == shard_files(tmp_path / "out")


def test_validation_split_is_the_leading_fraction_and_counts_bytes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index = prep(corpus, tmp_path / "out", val_fraction=0.2, chunk_bytes=64)
    val, train = (split_tokens(tmp_path / "out", s) for s in ("validation", "train"))
    stream = encode_documents(DOCS, ByteTokenizer())  # byte tokens: pieces tokenize exactly as the whole
    total = sum((corpus / f).stat().st_size for f in ("a0.txt", "a1.txt", "a2.txt", "a3.txt", "z.jsonl"))
    assert 0.2 * total <= index["splits"]["validation"]["bytes"] < 0.2 * total + 200  # cut at the next line end
    assert val.tolist() == stream[: len(val)].tolist()
    rest = stream[len(val) :]
    rest = rest[1:] if rest[0] == ByteTokenizer.eos_id else rest  # a split never starts with eos
    assert train.tolist() == rest.tolist()
    assert index["splits"]["validation"]["bytes"] + index["splits"]["train"]["bytes"] == sum(
        len(d.encode()) for d in DOCS)


def test_dtype_follows_the_vocabulary(tmp_path):
    assert shard_dtype("auto", 65536) == np.uint16 and shard_dtype("auto", 65537) == np.uint32
    with pytest.raises(DataError, match="uint32"):
        shard_dtype("uint16", 70000)
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["<|endoftext|>"] = 70000
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in.txt").write_text("w69999 w1 w65536\n")
    index = prep(tmp_path / "in.txt", tmp_path / "out", tokenizer=f"hf:{tmp_path / 'tokenizer.json'}")
    assert index["dtype"] == "uint32" and index["vocab_size"] == 70001 and index["eos_id"] == 70000
    assert split_tokens(tmp_path / "out", "train").tolist() == [69999, 1, 65536]
    assert main(["prepare", "--input", str(tmp_path / "in.txt"), "--out_dir", str(tmp_path / "o16"), "--dtype",
                 "uint16", "--tokenizer", f"hf:{tmp_path / 'tokenizer.json'}", "--progress", "false"]) == 2


@pytest.mark.parametrize(("content", "message"), [
    ('{"content": "x"}\n', r"has no field 'text' \(its fields: content\); name the text field with --field"),
    ('{"text": 3}\n', "field 'text' is a int, not a string"),
    ("not json\n", "is not valid JSON"),
])
def test_bad_jsonl_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n' + content)
    assert main(["prepare", "--input", str(tmp_path / "rows.jsonl"), "--out_dir", str(tmp_path / "out"),
                 "--progress", "false", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rows.jsonl (the line at byte 17)" in err
    assert re.search(message, err)


def test_unreadable_inputs_and_foreign_output_are_clear_errors(tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt is not valid UTF-8 .* at byte 3"):
        prep(tmp_path / "latin1.txt", tmp_path / "o1")
    with pytest.raises(DataError, match="input not found"):
        prep(tmp_path / "missing", tmp_path / "o2")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.md").write_text("mine")
    (tmp_path / "ok.txt").write_text("some text\n")
    with pytest.raises(DataError, match="is not empty"):
        prep(tmp_path / "ok.txt", tmp_path / "busy")
    prep(tmp_path / "ok.txt", tmp_path / "o3")
    with pytest.raises(DataError, match="other input or options"):
        prep(tmp_path / "ok.txt", tmp_path / "o3", shard_tokens=5)
    assert prep(tmp_path / "ok.txt", tmp_path / "o3")["already_done"]


KILL_AT_CHUNK = """
import os, signal, sys
from fullband.data import prepare as prepare_mod
from fullband.data.config import PrepareConfig

real = prepare_mod.encode_chunk

def encode_or_die(chunk, *args):
    if chunk.index == 12:  # kill -9 while a shard is half written: no cleanup of any kind runs
        os.kill(os.getpid(), signal.SIGKILL)
    return real(chunk, *args)

prepare_mod.encode_chunk = encode_or_die
prepare_mod.prepare_shards(PrepareConfig(input=sys.argv[1], out_dir=sys.argv[2], workers=1, progress=False,
                                         val_fraction=0.1, chunk_bytes=100, shard_tokens=300))
"""


def test_a_prepare_killed_midway_resumes_to_the_same_files(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    options = {"val_fraction": 0.1, "chunk_bytes": 100, "shard_tokens": 300}
    prep(corpus, tmp_path / "straight", **options)
    expected = shard_files(tmp_path / "straight")

    killed = subprocess.run([sys.executable, "-c", KILL_AT_CHUNK, str(corpus), str(tmp_path / "resumed")],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert progress["shards"] and 0 < progress["next_chunk"] <= 12
    assert list((tmp_path / "resumed").glob(".*.tmp"))  # the half-written shard's temp file is left behind
    with pytest.raises(DataError, match="unfinished fullband prepare"):
        is_prepared(tmp_path / "resumed")  # training refuses the unfinished directory
    real, calls = prepare_mod.encode_chunk, []
    monkeypatch.setattr(prepare_mod, "encode_chunk", lambda chunk, *a: calls.append(chunk.index) or real(chunk, *a))
    prep(corpus, tmp_path / "resumed", **options)
    assert min(calls) == progress["next_chunk"]  # the finished shards' chunks were not tokenized again
    assert shard_files(tmp_path / "resumed") == expected


def test_local_hf_dataset_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [f"row {i} text é" for i in range(8)]
    datasets.Dataset.from_dict({"text": rows, "n": list(range(8))}).save_to_disk(str(tmp_path / "ds"))
    index = prep(f"hf:{tmp_path / 'ds'}", tmp_path / "out", val_fraction=0.25)
    tok = ByteTokenizer()
    assert split_tokens(tmp_path / "out", "validation").tolist() == encode_documents(rows[:2], tok).tolist()
    assert split_tokens(tmp_path / "out", "train").tolist() == encode_documents(rows[2:], tok).tolist()
    assert index["splits"]["train"]["docs"] == 6
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": rows}),
                                   "test": datasets.Dataset.from_dict({"body": rows[:3]})})
    splits.save_to_disk(str(tmp_path / "dd"))
    prep(f"hf:{tmp_path / 'dd'}", tmp_path / "out2", split="test", field="body")
    assert split_tokens(tmp_path / "out2", "train").tolist() == encode_documents(rows[:3], tok).tolist()
    with pytest.raises(DataError, match=r"no column 'text' \(columns: body\)"):
        prep(f"hf:{tmp_path / 'dd'}", tmp_path / "out3")
    with pytest.raises(DataError, match="no split 'validation'"):
        prep(f"hf:{tmp_path / 'dd'}", tmp_path / "out4", split="validation", field="body")
