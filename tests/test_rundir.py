"""One owner of the run directory (fullband.rundir): the file names fullband writes are spelled there alone, and
every index-like file carries the one format version, which readers check: older files without it read as version
1, a newer version is refused in one line that says to upgrade."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch

import fullband
from fullband import rundir
from fullband.config import ModelConfig
from fullband.model import FullBandwidthLM

SRC = Path(fullband.__file__).parent
NAMES = (rundir.SETTINGS, rundir.METRICS, rundir.RESULTS, rundir.REPORT, rundir.RUN_RESULT, rundir.MODEL_WEIGHTS,
         rundir.MODEL_CONFIG, rundir.DATA_INDEX, rundir.DATA_PROGRESS)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the string constants of ``path`` that are code, not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_run_directory_file_names_are_spelled_in_one_module():
    pattern = re.compile(r"(^|/)(" + "|".join(re.escape(n) for n in NAMES) + r")$")
    found = [f"{path.relative_to(SRC)}:{line}: {text!r}" for path in sorted(SRC.rglob("*.py"))
             if path.name != "rundir.py" for line, text in _code_strings(path) if pattern.search(text)]
    assert found == [], "spell these through fullband.rundir:\n" + "\n".join(found)


def test_the_check_reads_old_files_as_version_1_and_refuses_newer_ones(tmp_path):
    assert rundir.check_format({}, "x") == 1
    assert rundir.check_format({"format": 1}, "x", legacy_key="format") == 1
    assert rundir.check_format(rundir.stamped({"a": 1}), "x") == rundir.FORMAT_VERSION
    for bad in (rundir.FORMAT_VERSION + 1, "1", 0, True):
        with pytest.raises(rundir.FormatError, match=r"x has format_version .*newer fullband; upgrade"):
            rundir.check_format({rundir.FORMAT_KEY: bad}, "x")


def _bump(path: Path, key: str = rundir.FORMAT_KEY) -> None:
    data = json.loads(path.read_text())
    assert data[key] == rundir.FORMAT_VERSION  # written with the version
    data[key] = rundir.FORMAT_VERSION + 1
    path.write_text(json.dumps(data))


def test_a_model_directory_carries_the_version_and_a_newer_one_is_refused(tmp_path):
    from fullband.model.serialization import load_config

    FullBandwidthLM(ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2)).save_pretrained(tmp_path)
    assert load_config(tmp_path).d_model == 16
    _bump(tmp_path / rundir.MODEL_CONFIG)
    with pytest.raises(rundir.FormatError, match=r"config\.json has format_version 2"):
        load_config(tmp_path)


def test_a_training_checkpoint_and_a_word_problem_run_carry_the_version(tmp_path):
    from fullband.experiments.word_problems.config import ControlsConfig
    from fullband.experiments.word_problems.train import RunSpec, read_result, train_run
    from fullband.training.checkpoint import save_checkpoint
    from fullband.training.checkpoint_layout import MANIFEST, STATE, TrainingState, load_training_state

    model = FullBandwidthLM(ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2))
    optimizer = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(tmp_path / "run", model, optimizer, TrainingState(step=3))
    assert load_training_state(path).step == 3
    for name in (STATE, MANIFEST):
        data = json.loads((path / name).read_text())
        assert data[rundir.FORMAT_KEY] == rundir.FORMAT_VERSION
    _bump(path / STATE)
    with pytest.raises(rundir.FormatError, match=r"trainer_state\.json"):
        load_training_state(path)
    spec = RunSpec("s5", "rnn", "gru", 1e-3, 0, (4,))
    cfg = ControlsConfig(preset="smoke", progress=False, steps=4)
    train_run(cfg, spec, str(tmp_path / "wp"))
    assert read_result(spec.directory(tmp_path / "wp"))[rundir.FORMAT_KEY] == rundir.FORMAT_VERSION
    _bump(spec.directory(tmp_path / "wp") / rundir.RUN_RESULT)
    with pytest.raises(rundir.FormatError, match=r"result\.json"):
        train_run(cfg, spec, str(tmp_path / "wp"))
