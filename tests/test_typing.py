"""Types that flow, checked by the type checkers themselves.

``tests/typing_fixture.py`` is never run: mypy --strict and pyright (strict) check it.
Each of its ``reveal_type`` lines says what it must reveal (``# revealed: <type>``, with
module paths left out, as pyright prints types), each ``# error`` line must be an error,
and no other line may be one. Both tools come with the ``dev`` extra; without one, its
test is skipped and says why.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT

FIXTURE = ROOT / "tests" / "typing_fixture.py"
_REVEALED = re.compile(r"#\s*revealed:\s*(?P<type>.+?)\s*$")
_ERROR = re.compile(r"#\s*error\s*$")
_QUALIFIER = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")  # trio_taskvisor._spec., builtins.


def expectations() -> tuple[dict[int, str], set[int]]:
    """The fixture's expected reveals ({line: type}) and error lines (1-based)."""
    revealed: dict[int, str] = {}
    errors: set[int] = set()
    for number, line in enumerate(FIXTURE.read_text(encoding="utf-8").splitlines(), start=1):
        if "reveal_type(" in line and (match := _REVEALED.search(line)) is not None:
            revealed[number] = match.group("type")
        elif _ERROR.search(line):
            errors.add(number)
    return revealed, errors


def plain(type_text: str) -> str:
    """A type as pyright prints it: no module paths."""
    return _QUALIFIER.sub("", type_text)


def require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")


def test_the_fixture_has_expectations() -> None:
    """The fixture checks reveals and errors, so a silent tool cannot pass it."""
    revealed, errors = expectations()
    assert len(revealed) >= 15
    assert len(errors) >= 5


def test_mypy_strict_sees_the_types_flow() -> None:
    """mypy --strict: every reveal as expected, errors exactly on the ``# error`` lines."""
    require("mypy")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(FIXTURE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    revealed: dict[int, str] = {}
    errors: set[int] = set()
    for line in result.stdout.splitlines():
        match = re.match(r"^[^:]+:(?P<line>\d+): (?P<level>\w+): (?P<message>.*)$", line)
        if match is None:
            continue
        number = int(match.group("line"))
        message = match.group("message")
        if match.group("level") == "error":
            errors.add(number)
        elif (found := re.match(r'Revealed type is "(?P<type>.*)"$', message)) is not None:
            revealed[number] = plain(found.group("type"))
    expected_reveals, expected_errors = expectations()
    assert revealed == expected_reveals, result.stdout + result.stderr
    assert errors == expected_errors, result.stdout + result.stderr


def test_pyright_strict_sees_the_types_flow() -> None:
    """pyright (strict): every reveal as expected, errors exactly on the ``# error`` lines."""
    require("pyright")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyright",
            "--outputjson",
            "--pythonpath",
            sys.executable,
            str(FIXTURE),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright gave no report:\n{result.stdout}\n{result.stderr}")
    revealed: dict[int, str] = {}
    errors: set[int] = set()
    for diagnostic in report["generalDiagnostics"]:
        number = diagnostic["range"]["start"]["line"] + 1
        if diagnostic["severity"] == "error":
            errors.add(number)
        elif found := re.match(r'Type of ".*" is "(?P<type>.*)"$', diagnostic["message"]):
            revealed[number] = found.group("type")
    expected_reveals, expected_errors = expectations()
    assert revealed == expected_reveals, result.stdout
    assert errors == expected_errors, result.stdout
