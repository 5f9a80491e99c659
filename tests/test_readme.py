"""The README's code map names every package of src/fullband and nothing that is not one, so a newcomer's first map
of the code is the code's."""

import re
from pathlib import Path

import fullband

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(fullband.__file__).parent


def _code_map() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("```\nsrc/fullband/\n")
    return text[start:text.index("\ntests/ ", start)]


def test_the_code_map_lists_every_package():
    listed = set(re.findall(r"^  (\w+)/ ", _code_map(), flags=re.M))
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert listed == packages, f"README's code map lacks {sorted(packages - listed)}, has {sorted(listed - packages)}"


def test_the_code_map_names_every_top_level_module():
    text = _code_map()
    modules = {p.stem for p in SRC.glob("*.py") if p.stem not in ("__init__", "version")}
    missing = sorted(m for m in modules if not re.search(rf"\b{m}\b", text))
    assert missing == [], f"README code map does not name {missing}"
