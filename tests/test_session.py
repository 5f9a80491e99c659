"""The test session itself: its caches are throwaway directories, and the dev extras are installed.

Every optional dependency of the dev extra is imported at the top of the tests that use it, so a broken dev
install fails those tests rather than skipping them.
"""

import importlib
import os
from pathlib import Path

import conftest
import pytest
from conftest import users_cache_dir

from fullband.data import cache_dir, load_corpus
from fullband.data.shakespeare import corpus_dir

DEV_EXTRAS = ("transformers", "tokenizers", "lm_eval", "yaml", "platformdirs", "matplotlib", "tensorboard", "fastapi",
              "uvicorn", "prometheus_client", "openai", "httpx", "psutil", "xdist")


def test_caches_point_into_the_session_directory_not_the_users():
    session = conftest.SESSION_CACHE
    assert cache_dir() == session / "fullband" != users_cache_dir()
    for variable in ("HF_HOME", "MPLCONFIGDIR", "PIP_CACHE_DIR"):
        assert Path(os.environ[variable]).is_relative_to(session), variable


def test_the_default_corpus_is_served_from_the_session_cache():
    assert len(load_corpus("shakespeare", "validation")) == 2  # copied from the user's cache, or downloaded
    assert (corpus_dir() / "MANIFEST.json").is_file() and corpus_dir().is_relative_to(conftest.SESSION_CACHE)


@pytest.mark.parametrize("module", DEV_EXTRAS)
def test_the_dev_extras_are_installed(module):
    importlib.import_module(module)  # an ImportError fails here: `pip install -e .[dev]` is incomplete
