"""experiments/ is a small core and one package per study (DESIGN.md, tests/README.md "Adding a study"): every
study is a package with its config, its study and its report; no module sits loose beside them; the core names no
study, neither in a file name nor in an import (string-named modules counted, as the import-graph test counts
them), so a study is added or removed without touching the core."""

import ast
import re
from pathlib import Path

import fullband.experiments

EXPERIMENTS = Path(fullband.experiments.__file__).parent
CORE = EXPERIMENTS / "core"
PER_STUDY = ("config.py", "study.py", "report.py")  # what each study package holds at least
MODULE_STRING = re.compile(r"fullband\.experiments\.(\w+)")


def _packages() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.iterdir() if p.is_dir() and p.name != "__pycache__")


def _studies() -> list[str]:
    return [p.name for p in _packages() if p != CORE]


def test_experiments_holds_the_core_and_one_package_per_study():
    loose = sorted(p.name for p in EXPERIMENTS.iterdir() if p.is_file() and p.name != "__init__.py")
    assert loose == [], f"modules beside the study packages: {loose}; put each in core/ or its study's package"
    assert CORE in _packages()
    assert len(_studies()) >= 5, _studies()  # compare, recipe, reasoning, state tracking, eval-controls
    for package in _packages():
        assert (package / "__init__.py").is_file(), package
    for study in _studies():
        missing = [name for name in PER_STUDY if not (EXPERIMENTS / study / name).is_file()]
        assert not missing, f"experiments/{study} lacks {missing}"


def _imported(path: Path) -> set[str]:
    """Every fullband module ``path`` imports or names in a string."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = "." * node.level + node.module
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom):  # from . import x
            names |= {"." * node.level + alias.name for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= {m.group(0) for m in MODULE_STRING.finditer(node.value)}
    return names


def test_the_core_names_no_study():
    studies = _studies()
    words = {word for study in studies for word in study.split("_")} | set(studies)
    for path in sorted(CORE.rglob("*.py")):
        named = [w for w in words if w in path.stem]
        assert not named, f"core/{path.name} is named after a study: {named}"
        for module in _imported(path):
            parts = module.lstrip(".").split(".")
            relative_up = module.startswith("..")  # from ..compare import x
            targets = parts[2:3] if module.startswith("fullband.experiments.") else parts[:1] if relative_up else []
            assert not set(targets) & set(studies), f"core/{path.name} imports {module}"


def test_the_layout_test_sees_a_study_import_from_the_core(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("from fullband.experiments.compare.report import x\nNAME = 'fullband.experiments.recipe'\n")
    assert {"fullband.experiments.compare.report", "fullband.experiments.recipe"} <= _imported(source)
