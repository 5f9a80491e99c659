import pytest

from fullband.data import DataError, load_corpus, normalize_split, split_names, split_text
from fullband.data import corpus as corpus_mod


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLBAND_CACHE_DIR", str(tmp_path / "cache"))


def _make_dir(root, n):
    for i in range(n):
        sub = root / ("a" if i % 2 else "b")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i:02d}.txt").write_text(f"document {i}\nline two of {i}\n")
    (root / "ignored.md").write_text("not a .txt file")


def test_split_names_rule():
    names = [f"n{i}" for i in range(37)]
    s = split_names(reversed(names))
    assert [len(s[k]) for k in ("train", "validation", "test")] == [33, 2, 2]
    assert sorted(s["train"] + s["validation"] + s["test"]) == sorted(names)
    assert s == split_names(names)  # order of input does not matter
    assert all(v == sorted(v) for v in s.values())
    assert [len(v) for v in split_names(["a", "b", "c"]).values()] == [1, 1, 1]
    with pytest.raises(DataError, match="at least 3 documents"):
        split_names(["a", "b"])


def test_split_text_contiguous_at_line_starts():
    text = "".join(f"line {i}\n" for i in range(100))
    parts = split_text(text)
    assert parts["train"] + parts["validation"] + parts["test"] == text
    assert all(p and p.endswith("\n") for p in parts.values())
    assert len(parts["train"]) > 8 * len(parts["validation"])


def test_directory_split_deterministic_and_disjoint(tmp_path):
    _make_dir(tmp_path, 40)
    splits = {s: load_corpus(tmp_path, s) for s in ("train", "validation", "test")}
    assert splits == {s: load_corpus(str(tmp_path), s) for s in splits}  # deterministic
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [36, 2, 2]
    all_docs = [d for docs in splits.values() for d in docs]
    assert len(set(all_docs)) == 40  # disjoint, complete, one document per file
    # split membership follows the relative path, so it survives adding unrelated files
    expected = split_names([f"{'a' if i % 2 else 'b'}/doc{i:02d}.txt" for i in range(40)])["test"]
    assert splits["test"] == [(tmp_path / p).read_text() for p in expected]
    assert load_corpus(tmp_path, "val") == splits["validation"]


def test_explicit_split_dirs(tmp_path):
    for split, n in (("train", 3), ("valid", 1)):
        (tmp_path / split / "x").mkdir(parents=True)
        for i in range(n):
            (tmp_path / split / "x" / f"{i}.txt").write_text(f"{split} {i}")
    assert load_corpus(tmp_path, "train") == ["train 0", "train 1", "train 2"]
    assert load_corpus(tmp_path, "validation") == ["valid 0"]
    with pytest.raises(DataError, match="has split directories but none for 'test'"):
        load_corpus(tmp_path, "test")


def test_single_file_and_small_dir(tmp_path):
    text = "".join(f"verse {i}\n" for i in range(200))
    f = tmp_path / "one.txt"
    f.write_text(text)
    assert "".join(load_corpus(f, s)[0] for s in ("train", "validation", "test")) == text
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.txt").write_text(text)
    (two / "b.txt").write_text(text.upper())
    assert len(load_corpus(two, "test")) == 2  # fewer than 3 files: each file is cut 90/5/5


def test_errors(tmp_path):
    with pytest.raises(DataError, match="corpus not found"):
        load_corpus(tmp_path / "nope")
    with pytest.raises(DataError, match="unknown split 'holdout'"):
        load_corpus(tmp_path, "holdout")
    with pytest.raises(DataError, match="unknown split"):
        normalize_split("training")
    with pytest.raises(DataError, match=r"contains no \.txt files"):
        load_corpus(tmp_path)
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n\n")
    with pytest.raises(DataError, match="has no text in its 'train' split"):
        load_corpus(blank)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    with pytest.raises(DataError, match="not valid UTF-8"):
        load_corpus(bad)


def test_hf_needs_datasets(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(DataError, match="pip install datasets"):
        load_corpus("hf:roneneldan/TinyStories")


def test_hf_spec_parsing():
    assert corpus_mod._parse_hf("user/name") == ("user/name", "text")
    assert corpus_mod._parse_hf("user/name:story") == ("user/name", "story")
    assert corpus_mod._parse_hf("/data/saved:content") == ("/data/saved", "content")
    assert corpus_mod._parse_hf(r"C:\data\saved") == (r"C:\data\saved", "text")
