import pytest

from fullband.data import DataError, load_corpus, normalize_split, split_files, split_names, split_text
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


def test_directory_split_by_bytes_as_prepare_holds_out(tmp_path):
    _make_dir(tmp_path, 40)
    splits = {s: load_corpus(tmp_path, s) for s in ("validation", "test", "train")}
    assert splits == {s: load_corpus(str(tmp_path), s) for s in splits}  # deterministic
    # The files in relative-path order, validation first, then test, then train: together the whole text in order.
    ordered = sorted(tmp_path.rglob("*.txt"), key=lambda p: p.relative_to(tmp_path).as_posix())
    text = "".join(p.read_text() for p in ordered)
    assert "".join(d for s in ("validation", "test", "train") for d in splits[s]) == text
    # Each held-out split is 5% of the bytes, up to the next line end (a line here is at most 16 bytes).
    val, test = ("".join(splits[s]) for s in ("validation", "test"))
    assert 0.05 * len(text) <= len(val) < 0.05 * len(text) + 16
    assert 0.10 * len(text) <= len(val) + len(test) < 0.10 * len(text) + 16
    assert all(d.endswith("\n") for d in splits["validation"] + splits["test"])  # cut at line ends
    assert load_corpus(tmp_path, "val") == splits["validation"]


def test_split_files_cuts_where_prepare_cuts():
    files = [b"ab\ncd\n", b"efgh\n", b"ij\nkl\nmn\n"]  # 6 + 5 + 9 = 20 bytes
    # validation: ceil(0.25 * 20) = 5, inside the first file -> its line end at 6; test: ceil(0.5 * 20) = 10, inside
    # the second file -> its end (11); a cut on a file boundary stays there.
    assert split_files(files, (0.25, 0.25)) == {"validation": [b"ab\ncd\n"], "test": [b"efgh\n"],
                                                "train": [b"ij\nkl\nmn\n"]}
    assert split_files(files, (0.3, 0.0)) == {"validation": [b"ab\ncd\n"], "test": [], "train": [b"efgh\n",
                                                                                          b"ij\nkl\nmn\n"]}
    assert split_files(files, (0.6, 0.2)) == {"validation": [b"ab\ncd\n", b"efgh\n", b"ij\n"],
                                              "test": [b"kl\n"], "train": [b"mn\n"]}


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
    # Two files hold out 5% and 5% of their bytes too (the first file's first lines), not one file each.
    held_out = [load_corpus(two, s) for s in ("validation", "test")]
    assert all(len(docs) == 1 and 0.05 * 2 * len(text) <= len(docs[0]) < 0.05 * 2 * len(text) + 10
               for docs in held_out)
    assert "".join(held_out[0] + held_out[1] + load_corpus(two, "train")) == text + text.upper()


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
