"""What fullband writes into a directory, named once: a ``fullband train`` run, a study's run directory, a model
directory (``save_pretrained``), a prepared-data directory, and the one format version they all carry.

Every command and study names these files through here (nanochat's checkpoint manager, torchtitan's
CheckpointManager: one owner of the layout); the modules that write a part of a directory (training/checkpoint_layout
for ``checkpoints/``, data/prepare for shards) take their names from here. Torch-free.

Format version: every index-like file fullband writes (a model's config.json, a training checkpoint's manifest and
state, a retrofit's meta, a prepared-data index, a study run's result.json) records ``format_version`` =
:data:`FORMAT_VERSION`. A reader calls :func:`check_format`: files from before the version existed read as version 1
(their layout is version 1's); a newer version than this fullband knows is refused in one line that says to upgrade.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1  # the layout of every file below; raise it when one changes incompatibly, and read the older ones
FORMAT_KEY = "format_version"

# A run or study directory
SETTINGS = "config.toml"  # the resolved settings it runs with (rerun with --config; resume reads it back)
METRICS = "metrics.jsonl"  # fullband train: one record per logged step and per validation
RESULTS = "results.json"  # a study's (or fullband eval's) numbers; the report is rendered from them alone
REPORT = "report.md"
MODEL_DIR = "model"  # fullband train: the final model, save_pretrained's files
TOKENIZER_DIR = "tokenizer"  # the tokenizer a run or a prepared directory was made with
CHECKPOINTS_DIR = "checkpoints"  # fullband train: step-*/ (training/checkpoint_layout owns what is inside)
RUN_RESULT = "result.json"  # one training run of a study (word problems): written last, so it marks a finished run
RUN_PROGRESS = "progress.pt"  # such a run unfinished: its state at a validation step, to go on from (then removed)

# A model directory (save_pretrained)
MODEL_WEIGHTS = "model.safetensors"
MODEL_CONFIG = "config.json"

# A prepared-data directory (fullband prepare)
DATA_INDEX = "index.json"
DATA_PROGRESS = "progress.json"  # an unfinished prepare: what is done so far


class FormatError(ValueError):
    """A file written by a newer fullband than this one (its format_version is unknown here)."""


def stamped(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with this fullband's format version first."""
    return {FORMAT_KEY: FORMAT_VERSION, **record}


def check_format(record: Mapping[str, Any], where: str | Path, legacy_key: str | None = None) -> int:
    """The format version ``record`` (read from ``where``) was written with; a version this fullband does not know
    raises :class:`FormatError` naming the file and what to do. ``legacy_key``: where files written before
    ``format_version`` kept their version number (absent: version 1)."""
    version = record.get(FORMAT_KEY, record.get(legacy_key, 1) if legacy_key else 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        from fullband.version import __version__

        raise FormatError(f"{where} has format_version {version!r}, which fullband {__version__} cannot read (it "
                          f"reads up to {FORMAT_VERSION}): it was written by a newer fullband; upgrade with "
                          "pip install -U fullband")
    return version
