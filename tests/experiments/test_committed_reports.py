"""Every committed report (docs/results/*/report.md) is what its results.json renders to: rendered again through
the one report writer, it matches byte for byte except the writer's header paragraph (the command and date line,
worded by the writer). So a report is produced by code, and a change to a study's report code that would change a
committed number or sentence shows up here."""

import importlib.util
import json
from pathlib import Path

import pytest

from fullband.experiments.core.registry import report_of
from fullband.experiments.core.report import HEADER_START, without_header
from fullband.experiments.core.study import rerender

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
COMMITTED = sorted(path.parent for path in RESULTS.glob("*/report.md"))


def _rendered(out_dir: Path) -> str:
    results = json.loads((out_dir / "results.json").read_text())
    if set(results) == {"meta", "rows"}:  # benchmarks/speculative.py
        spec = importlib.util.spec_from_file_location("speculative", ROOT / "benchmarks" / "speculative.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.saved_report(out_dir).render()
    return rerender(out_dir, report_of(results))  # the report of the study command that wrote them


def test_every_results_dir_with_a_report_is_checked():
    assert len(COMMITTED) >= 20 and RESULTS / "speculative" in COMMITTED


@pytest.mark.parametrize("out_dir", COMMITTED, ids=[d.name for d in COMMITTED])
def test_committed_report_rerenders_from_its_results(out_dir):
    text = _rendered(out_dir)
    assert HEADER_START in text  # the writer's header, which alone may differ
    committed = (out_dir / "report.md").read_text()
    assert without_header(text) == without_header(committed)
