"""Every relative link in the README and under docs/ leads somewhere: the file exists, and a `#fragment` names a
heading of the file it points to (GitHub's anchors). Web links are not fetched (the tests run offline)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target); images are checked the same way below
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return LINK.findall(text) + IMAGE.findall(text)


def local_links() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), target) for path in DOCUMENTS for target in links(path)
            if not re.match(r"^[a-z]+:", target)]


def test_the_documents_link_to_each_other():
    assert len(local_links()) >= 30
    assert any(target.startswith("docs/") for path, target in local_links() if path == "README.md")


def test_the_anchor_rule_is_githubs():
    assert anchor("How long the two commands take") == "how-long-the-two-commands-take"
    assert anchor("The main job: `fullband compare`") == "the-main-job-fullband-compare"


@pytest.mark.parametrize(("document", "target"), local_links())
def test_every_local_link_resolves(document, target):
    file_part, _, fragment = target.partition("#")
    destination = (ROOT / document).parent / file_part if file_part else ROOT / document
    assert destination.exists(), f"{document}: {target} does not exist"
    if fragment and destination.suffix == ".md":
        assert fragment in anchors(destination), f"{document}: no heading #{fragment} in {destination.name}"
