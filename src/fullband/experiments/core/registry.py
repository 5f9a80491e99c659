"""The registry of studies: each study package declares its commands once, in its ``__init__.py``, as
``COMMANDS = (StudyCommand(...), ...)``; the command line, the tests and the report re-renderer find them here.
Adding a study is adding a package under ``fullband/experiments/`` (torchtitan registers its specs the same way:
the code that looks them up names none).

Torch-free: a declaration holds import paths (``"module:attribute"``), so building the command line imports only the
studies' configs.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any

CORE = "core"


@dataclass(frozen=True)
class StudyCommand:
    """One ``fullband`` subcommand that runs a study.

    ``config``: its config class (torch-free module); ``study``: what builds the study from that config (a
    :class:`~fullband.experiments.core.study.Study` subclass, or a function choosing one); ``reports``: for each
    ``results["study"]`` name of the results.json it writes, the function that renders them into a
    :class:`~fullband.experiments.core.report.Report` (a report is re-rendered by the command that wrote it).
    """

    name: str
    help: str
    config: str
    study: str
    reports: dict[str, str]

    def config_class(self) -> type:
        return load(self.config)

    def build_study(self, cfg: Any) -> Any:
        return load(self.study)(cfg)


def load(path: str) -> Any:
    """The object a ``"package.module:attribute"`` path names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def study_commands() -> list[StudyCommand]:
    """Every study package's commands, in the order of the packages' names."""
    import fullband.experiments as experiments

    commands: list[StudyCommand] = []
    for package in sorted(pkgutil.iter_modules(experiments.__path__), key=lambda p: p.name):
        if package.ispkg and package.name != CORE:
            module = importlib.import_module(f"{experiments.__name__}.{package.name}")
            commands += getattr(module, "COMMANDS", ())
    return commands


def study_of(results: dict[str, Any]) -> str:
    """The ``study`` a results.json names; the results of compare and recipe written before they named themselves
    are told apart by recipe's ``compare_config``."""
    if "study" in results:
        return results["study"]
    return "recipe" if "compare_config" in results else "compare"


def report_of(results: dict[str, Any]) -> Any:
    """The report function of the study that wrote ``results``: ``(results, plots) -> Report``."""
    name = study_of(results)
    found = [c.reports[name] for c in study_commands() if name in c.reports]
    if len(found) != 1:
        raise LookupError(f"{len(found)} study commands write results of study {name!r}")
    return load(found[0])
