"""The product cites nothing outside its repository.

The package's sources and the documentation it ships name no document the repository
does not hold (the contract the project grew from lives in ``docs/design.md`` and the
guides, and a module's docstring gives its reasons itself), nor that document's
numbered sections.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import ROOT

SOURCES = sorted((ROOT / "trio_taskvisor").rglob("*.py"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"\bDESIGN\b|\.\./shared|\bshared/")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_cites_nothing_outside(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert OUTSIDE.findall(text) == []
    assert re.findall(r"\bsections? \d+", text) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_cites_nothing_outside(path: Path) -> None:
    assert OUTSIDE.findall(path.read_text(encoding="utf-8")) == []
