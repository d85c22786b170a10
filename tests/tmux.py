"""Real terminals for tests: panes of a tmux server of the test's own (``-L``).

tmux is part of the project's machines (``/usr/bin/tmux``); without it a test that
needs it fails with the command that installs it, rather than skipping.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

EXIT = re.compile(r"^EXIT=(\d+)$", re.MULTILINE)
"""What a pane prints once its command has exited (`Tmux.start` appends it)."""


class Tmux:
    """One tmux server: start commands in named panes, read and type into them."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def _run(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return result.stdout

    def start(
        self,
        name: str,
        width: int,
        height: int,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
    ) -> None:
        """Run ``args`` in a new ``width`` x ``height`` pane; once it exits the pane
        shows ``EXIT=<status>`` and stays open (two minutes) to be read."""
        command = f"{shlex.join(args)}; echo EXIT=$?; sleep 120"
        size = ("-x", str(width), "-y", str(height), "-s", name)
        subprocess.run(
            ("tmux", "-L", self.socket, "-f", os.devnull, "new-session", "-d", *size, command),
            check=True,
            env=env,
            cwd=cwd,
            timeout=10,
        )

    def screen(self, name: str, *, history: bool = False) -> str:
        """What the pane shows (wrapped lines joined); with ``history``, everything it
        printed, scrolled-off lines included."""
        return self._run("capture-pane", "-p", "-J", *(("-S", "-") if history else ()), "-t", name)

    def send(self, name: str, *keys: str) -> None:
        """Type ``keys`` into the pane (tmux key names: ``"C-c"``)."""
        self._run("send-keys", "-t", name, *keys)


@contextmanager
def tmux_server(purpose: str) -> Iterator[Tmux]:
    """A tmux server of this test's own, killed on exit; ``purpose`` completes the
    failure message when tmux is missing ("this test runs <purpose>")."""
    if shutil.which("tmux") is None:
        pytest.fail(f"tmux is not installed: this test runs {purpose} (apt-get install tmux)")
    server = Tmux(f"taskvisor-test-{uuid.uuid4().hex[:8]}")
    try:
        yield server
    finally:
        subprocess.run(["tmux", "-L", server.socket, "kill-server"], capture_output=True)
