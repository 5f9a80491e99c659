"""A study added by one package and nothing else runs end to end through the command line (tests/README.md "Adding a
study"): the registry finds its declaration, the CLI builds its options from its config and runs it, and its
results are re-rendered by the report function it declared."""

import json
import sys
import textwrap

import pytest

import fullband.experiments
from fullband.cli import build_parser, main

TOY = {
    "__init__.py": '''
        from fullband.experiments.core.registry import StudyCommand

        COMMANDS = (StudyCommand(
            "toy-study", "A toy study: squares a number.",
            config="fullband.experiments.toystudy.config:ToyConfig",
            study="fullband.experiments.toystudy.study:ToyStudy",
            reports={"toy": "fullband.experiments.toystudy.report:report"}),)
    ''',
    "config.py": '''
        from dataclasses import dataclass

        from fullband.config import device_field, doc, resume_field, threads_field
        from fullband.experiments.core.config import StudyConfig


        @dataclass
        class ToyConfig(StudyConfig):
            """The toy study's options."""

            PRESETS = {"default": {}}

            number: int = doc(3, "The number to square.")
            out_dir: str = doc("runs/toy", "Run directory.")
            device: str = device_field()
            threads: str = threads_field()
            resume: str = resume_field("nothing to continue")
    ''',
    "study.py": '''
        from fullband.experiments.core.study import Study
        from fullband.experiments.toystudy.report import report


        class ToyStudy(Study):
            command = "toy-study"

            def collect(self):
                return {"study": "toy", "config": {"number": self.cfg.number}, "square": self.cfg.number ** 2}

            def report(self, results, plots):
                return report(results, plots)

            def summary(self, results):
                return f"square {results['square']}"
    ''',
    "report.py": '''
        from fullband.experiments.core.report import Report


        def report(results, plots):
            rep = Report.of(results, "Toy", results["command"])
            return rep.table(["number", "square"], [[results["config"]["number"], results["square"]]])
    ''',
}


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    package = tmp_path / "packages" / "toystudy"
    package.mkdir(parents=True)
    for name, text in TOY.items():
        (package / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.setattr(fullband.experiments, "__path__", [*fullband.experiments.__path__, str(package.parent)])
    yield package
    for name in [m for m in sys.modules if m.startswith("fullband.experiments.toystudy")]:
        del sys.modules[name]


def test_a_study_added_as_one_package_runs_through_the_cli(toy_package, tmp_path, capsys):
    from fullband.experiments.core.registry import report_of

    assert "toy-study" in build_parser().format_help()
    out = tmp_path / "toy"
    assert main(["toy-study", "--number", "7", "--out_dir", str(out)]) == 0
    assert "square 49" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["square"] == 49 and results["command"].startswith("fullband toy-study --number 7")
    assert "| 7 | 49 |" in (out / "report.md").read_text()
    assert report_of(results)(results, False).render() == (out / "report.md").read_text()
    # The conventions every study gets from the base: --resume true with nothing there is one line.
    assert main(["toy-study", "--out_dir", str(tmp_path / "empty"), "--resume", "true"]) == 2
    assert "holds no toy-study study to resume" in capsys.readouterr().err
