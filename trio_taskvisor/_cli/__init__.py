"""The command line's programs: the demo (``demo.py``), the tour (``tour.py``), and
``slots`` (``slots.py``), which shows what a slot store holds.

They use the public API only, as any application would; ``__main__`` dispatches to them.

Decision: when the reader of stdout goes away (as ``| head`` does), a program stops
writing quietly and exits as it would have: the rest of its output goes to /dev/null
(``drop_stdout``), its log lines too (``StdoutLines``, which tells the demo to end
early), the demo's live view too (its console ends the demo early as well, where rich
would exit with status 1), and no traceback or "--- Logging error ---" is printed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TextIO


def drop_stdout() -> None:
    """Send the rest of stdout to /dev/null: its reader went away. Later writes, and the
    interpreter's final flush, then succeed instead of raising ``BrokenPipeError``."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class StdoutLines(logging.StreamHandler[TextIO]):
    """Log records as lines on stdout. The first one that its reader no longer takes
    calls ``drop_stdout`` and then ``gone``, once; other errors are logging's as usual."""

    def __init__(self, gone: Callable[[], None] = lambda: None) -> None:
        super().__init__(sys.stdout)
        self.gone = gone

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], BrokenPipeError):
            super().handleError(record)
            return
        drop_stdout()
        gone, self.gone = self.gone, lambda: None
        gone()
