"""experiments/ is a small core and one package per study (DESIGN.md, tests/README.md "Adding a study"): every
study is a package with its config, its study and its report; no module sits loose beside them; the core names no
study, neither in a file name nor in an import (string-named modules counted, as the import-graph test counts
them), so a study is added or removed without touching the core; no study package imports another; every package
declares its commands in the registry, and the command line names no study."""

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


def _study_of(module: str, importer: Path) -> str | None:
    """The study package an import names (absolute, or relative to ``importer``), or None."""
    if module.startswith("fullband.experiments."):
        return module.split(".")[2]
    if module.startswith("."):
        level = len(module) - len(module.lstrip("."))
        base = importer.relative_to(EXPERIMENTS).parts[:-1]  # the importer's package, below experiments/
        if level > len(base) + 1:  # above experiments/
            return None
        parts = [*base[: len(base) - level + 1], *module.lstrip(".").split(".")]
        return parts[0] if parts and parts[0] else None
    return None


def test_no_study_imports_another_study():
    studies = set(_studies())
    for study in studies:
        for path in sorted((EXPERIMENTS / study).rglob("*.py")):
            named = {_study_of(module, path) for module in _imported(path)} & studies
            assert named <= {study}, f"experiments/{path.relative_to(EXPERIMENTS)} imports the study {named - {study}}"


def test_outside_experiments_nothing_but_the_command_line_registry_reaches_a_study():
    studies = set(_studies())
    src = EXPERIMENTS.parent
    for path in sorted(src.rglob("*.py")):
        if EXPERIMENTS in path.parents:
            continue
        named = {_study_of(m, path) for m in _imported(path) if m.startswith("fullband.experiments.")} & studies
        assert not named, f"{path.relative_to(src)} names the study {named}: go through the registry"


def test_every_study_package_declares_its_commands_and_they_load():
    from fullband.experiments.core.registry import load, study_commands

    commands = study_commands()
    declared = {c.config.split(".")[2] for c in commands}
    assert declared == set(_studies())
    assert len({c.name for c in commands}) == len(commands)  # one declaration per command
    for command in commands:
        assert command.config_class().__name__.endswith("Config")
        assert callable(load(command.study)) and all(callable(load(r)) for r in command.reports.values())


def test_the_layout_test_sees_a_relative_import_of_another_study():
    path = EXPERIMENTS / "recipe" / "study.py"
    assert _study_of("..compare.study", path) == "compare" and _study_of(".config", path) == "recipe"
