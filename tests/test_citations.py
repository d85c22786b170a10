"""The product cites nothing outside its repository.

The package's sources and the documentation it ships name no document the repository
does not hold (the contract the project grew from lives in ``docs/design.md`` and the
guides, and a module's docstring gives its reasons itself), nor that document's
numbered sections.
"""

from __future__ import annotations

import fnmatch
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


# Test files a page tells the reader to write, not ones the repository holds.
WRITTEN_BY_THE_READER = {"test_flaky.py"}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_cited_test_file_exists(path: Path) -> None:
    """A test file a page names (``test_keyed.py``, ``test_policy_*.py``) is in tests/."""
    held = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    for name in set(re.findall(r"\btest_[\w*]+\.py\b", path.read_text(encoding="utf-8"))):
        if name in WRITTEN_BY_THE_READER:
            continue
        assert any(fnmatch.fnmatch(h, name) for h in held), name
