"""The tutorial's blocks pass when pasted into trio's REPL, as the tutorial says.

``python -m trio`` runs in a subprocess, on the real clock, with the tutorial's blocks
on its standard input, in order, each followed by a blank line: what a reader pasting
them one after the other types. The REPL keeps going after an error (it prints the
traceback and the next prompt), so the check is on what it printed: no error, and the
line the last statement prints. The failures the tutorial provokes are logged by the
supervisor (``log_failures``, with their tracebacks): a line pasted before the blocks
sends log records to standard output, so standard error holds only what the REPL itself
printed. ``tests/test_docs.py`` runs the same blocks on the virtual clock, with
tracebacks that point at the page's lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from test_docs import extract_blocks

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
DONE = "tutorial: every block ran"
LOGS_TO_STDOUT = "import logging, sys; logging.basicConfig(stream=sys.stdout)\n\n"


def test_tutorial_passes_in_the_trio_repl(tmp_path: Path) -> None:
    """Every block of docs/tutorial.md runs in ``python -m trio`` without an error."""
    blocks = [block for block in extract_blocks(TUTORIAL) if block.skip is None]
    assert len(blocks) >= 10
    pasted = LOGS_TO_STDOUT + "".join(block.code + "\n" for block in blocks)
    pasted += f"print({DONE!r})\n"
    pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    result = subprocess.run(
        [sys.executable, "-m", "trio"],
        input=pasted,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "Error" not in result.stderr, result.stderr  # SyntaxError has no traceback
    assert DONE in result.stdout, result.stdout + result.stderr


def test_tutorial_asserts_no_exact_time() -> None:
    """A real clock runs late: the tutorial bounds elapsed time from below, never exactly."""
    for block in extract_blocks(TUTORIAL):
        for number, line in enumerate(block.code.splitlines(), start=block.line):
            assert not re.search(r"current_time\(\).*==|elapsed ==", line), (
                f"docs/tutorial.md:{number}: an exact-time assert: {line.strip()}"
            )
