"""The README's main command, ``python -m trio_taskvisor demo``, as a person sees it.

The live view runs in real terminals: tmux panes of 80x24 and 160x48 (and one too small
for it, 70x20), on a tmux server of this test's own (``-L``), all started together, and
two more, 80x24 and 120x40, that get a Ctrl+C (``send-keys C-c``) once the view has shown
a periodic task waiting for its next run. A pane is read with
``tmux capture-pane -p -J`` (wrapped lines joined, so a line longer than the pane would
show) until its command has printed its exit status. The checks are on what the screen
shows, never on timing: the key panels are there, no line is wider than the pane and no
frame taller, names and hints are never cut short, one header after a Ctrl+C, a
periodic task between runs is ``idle``, the summary repeats the counters' labels, and a
Ctrl+C ends the run with status 130. Single and double signals also run as plain
subprocesses (``tests/test_examples.py`` runs the plain view, and the live one without
``rich``), and so does a reader of the plain view (and of the tour) that goes away, as
``| head`` does; the board's counting and the header's width are checked directly.

tmux is part of the project's machines (``/usr/bin/tmux``); without it the test fails
and says so, rather than passing without having looked.
"""

from __future__ import annotations

import io
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from tmux import EXIT, tmux_server

from trio_taskvisor import (
    BackoffSource,
    ControllerSnapshot,
    EventKind,
    SlotStatus,
    SlotView,
    TaskEvent,
    TaskId,
    TaskInfo,
    TaskState,
)
from trio_taskvisor._cli.demo import Board, _header_line, _state, counter_rows

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0  # seconds for every pane to finish, from the moment they were started
# The rows of the counters panel, which the summary repeats ("rejections" appears only
# once something was rejected).
COUNTER_LABELS = ("outcomes", "runs", "pollers", "tenants", "cache", "periodic", "events")
# Key values that must never be shortened ("poll-legacy-…", "nex…").
NAMES = ("poll-orders", "poll-payments", "poll-legacy-erp")
CUT_NAME = re.compile(r"\b(?:poll|sync|compact|audit|tenant|cache)[\w:/-]*…")
# A periodic task between two runs, in the task rows: "compact-db  idle  next run in 2.0 s".
IDLE = re.compile(r"^(?:poll-\S+|compact-db) +idle +next run in", re.MULTILINE)


@attrs.define
class Pane:
    """One tmux pane running the demo: the screens it showed, then its exit status."""

    name: str
    width: int
    height: int
    args: tuple[str, ...]
    interrupt: bool = False  # send one Ctrl+C once a periodic task shows as idle
    running: str = ""  # the last screen captured while the header said "running"
    screens: list[str] = attrs.Factory(list)  # every screen captured while running
    stopping: str = ""  # a screen captured after the Ctrl+C, while shutting down
    final: str = ""  # the screen once the command had exited
    history: str = ""  # everything the pane printed, scrolled-off lines included
    status: int | None = None


@pytest.fixture(scope="module")
def panes() -> Iterator[dict[str, Pane]]:
    demo = (sys.executable, "-m", "trio_taskvisor", "demo")
    run = ("--duration", "3", "--seed", "7")
    wanted = [
        Pane("narrow", 80, 24, (*demo, *run)),
        Pane("wide", 160, 48, (*demo, *run)),
        Pane("small", 70, 20, (*demo, "--duration", "1", "--seed", "7")),
        Pane("narrow-ctrl-c", 80, 24, (*demo, "--duration", "60", "--seed", "7"), True),
        Pane("mid-ctrl-c", 120, 40, (*demo, "--duration", "60", "--seed", "7"), True),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tmux_server("the demo in tmux panes") as tmux:
        for pane in wanted:
            tmux.start(pane.name, pane.width, pane.height, pane.args, env=env, cwd=ROOT)
        deadline = time.monotonic() + TIMEOUT
        while any(p.status is None for p in wanted) and time.monotonic() < deadline:
            for pane in wanted:
                if pane.status is not None:
                    continue
                screen = tmux.screen(pane.name)
                exited = EXIT.search(screen)
                if exited is not None:
                    pane.final, pane.status = screen, int(exited.group(1))
                    pane.history = tmux.screen(pane.name, history=True)
                elif re.search(r"\brunning\b", "".join(_lines(screen)[:3])):
                    pane.running = screen  # the header (first line, or in a panel) says so
                    pane.screens.append(screen)
                    if pane.interrupt and not pane.stopping and IDLE.search(screen):
                        tmux.send(pane.name, "C-c")
                        pane.stopping = "sent"
                elif pane.stopping == "sent" and "shutdown:" in _lines(screen)[0]:
                    pane.stopping = screen
            time.sleep(0.1)
        yield {pane.name: pane for pane in wanted}


def _row(label: str, screen: str) -> bool:
    """Whether ``screen`` has a row labelled ``label``: the label, spaces, a value."""
    return re.search(rf"(?<![\w-]){label} +[\w(]", screen) is not None


def _lines(screen: str) -> list[str]:
    return screen.rstrip("\n").split("\n")


@pytest.mark.parametrize("size", ["narrow", "wide"])
def test_live_view_shows_every_panel(panes: dict[str, Pane], size: str) -> None:
    """Header, tasks, slots, counters and recent events are all on screen."""
    pane = panes[size]
    assert pane.status == 0, f"{size}: exit status {pane.status}\n{pane.final}"
    screen = pane.running
    assert screen, f"{size}: never saw the running view\n{pane.final}"
    for title in ("trio_taskvisor demo", "tasks (", "slots (", "counters", "recent events"):
        assert title in screen, f"{size}: no {title!r} on screen\n{screen}"
    for label in COUNTER_LABELS:
        assert _row(label, screen), f"{size}: no {label} row\n{screen}"
    recent = screen[screen.index("recent events") :]
    assert re.search(r"\d\.\d\d s \w+", recent), f"{size}: no recent event\n{screen}"


@pytest.mark.parametrize("size", ["narrow", "wide"])
def test_live_view_fits_the_terminal(panes: dict[str, Pane], size: str) -> None:
    """No line is wider than the pane, no frame taller; names are never cut short."""
    pane = panes[size]
    for screen in (pane.running, pane.final):
        lines = _lines(screen)
        assert len(lines) <= pane.height, f"{size}: {len(lines)} lines\n{screen}"
        for line in lines:
            assert len(line) <= pane.width, f"{size}: {len(line)} columns: {line!r}"
        assert CUT_NAME.search(screen) is None, f"{size}: a name is cut short\n{screen}"
    for name in NAMES:
        assert name in pane.running, f"{size}: {name} is not shown in full\n{pane.running}"


@pytest.mark.parametrize("size", ["narrow", "wide"])
def test_summary_repeats_the_counters(panes: dict[str, Pane], size: str) -> None:
    """The summary ends the run and has a row for each label of the counters panel."""
    final = panes[size].final
    assert "summary" in final, final
    summary = final[final.index("summary") :]
    for label in ("run", *COUNTER_LABELS, "shutdown"):
        assert _row(label, summary), f"no {label} row\n{final}"
    assert "GraceExceededError, as expected: audit-writer" in summary


def test_small_terminal_falls_back_to_plain(panes: dict[str, Pane]) -> None:
    """Below 80x24 the demo says why and prints log lines instead of the live view."""
    pane = panes["small"]
    assert pane.status == 0, pane.final
    assert "the terminal is 70x20, the live view needs at least 80x24" in pane.history
    assert "showing log lines instead (--plain)" in pane.history
    assert "summary:" in pane.history


@pytest.mark.parametrize("size", ["narrow-ctrl-c", "mid-ctrl-c"])
def test_ctrl_c_in_the_live_view(panes: dict[str, Pane], size: str) -> None:
    """After a Ctrl+C: one header, its hint in full, the summary, exit status 130."""
    pane = panes[size]
    screen = pane.stopping
    assert screen not in ("", "sent"), f"{size}: never saw the shutdown\n{pane.final}"
    lines = _lines(screen)
    assert len(lines) <= pane.height, f"{size}: {len(lines)} lines\n{screen}"
    assert screen.count("trio_taskvisor demo") == 1, f"{size}: a stale header\n{screen}"
    assert "^C" not in screen, f"{size}: the terminal echoed Ctrl+C\n{screen}"
    assert re.search(r"shutdown: forced in \d+\.\d s +Ctrl\+C: force now$", lines[0]), (
        f"{size}: the hint is cut\n{screen}"
    )
    assert "…" not in lines[0], f"{size}: the header is cut\n{screen}"
    for line in lines:
        assert len(line) <= pane.width, f"{size}: {len(line)} columns: {line!r}"
    assert pane.status == 130, f"{size}: exit status {pane.status}\n{pane.final}"
    assert "stopped early by Ctrl+C" in pane.final, pane.final


@pytest.mark.parametrize("size", ["narrow", "narrow-ctrl-c", "mid-ctrl-c"])
def test_periodic_task_between_runs_is_idle(panes: dict[str, Pane], size: str) -> None:
    """A periodic task waiting for its next run shows as idle; backoff is a retry's wait."""
    pane = panes[size]
    screens = "\n".join(pane.screens)
    assert IDLE.search(screens), f"{size}: no idle periodic task\n{pane.running}"
    for line in screens.splitlines():
        if re.match(r"\S+ +backoff ", line):
            assert re.search(r"backoff +retry in \d", line), f"{size}: {line!r}"


class Output:
    """The merged stdout and stderr of a process, read by a thread as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.text = ""
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                with self._changed:
                    self.text += line
                    self._changed.notify_all()

    def close(self) -> None:
        self._thread.join(timeout=10)

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        with self._changed:
            found = self._changed.wait_for(lambda: text in self.text, timeout)
        assert found, f"no {text!r} in the output:\n{self.text}"


def _demo(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trio_taskvisor", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_second_ctrl_c_forces_the_shutdown() -> None:
    """Ctrl+C starts the graceful shutdown; a second forces it, prints the summary, 130."""
    status, text = _stop_with(signal.SIGINT, 2)
    assert status == 130, text
    assert "a second Ctrl+C forced the shutdown" in text
    assert "Traceback" not in text


def _stop_with(sig: signal.Signals, times: int) -> tuple[int, str]:
    process = _demo("--plain", "--duration", "8", "--seed", "7")
    output = Output(process)
    try:
        # At the first status line (2 s in, of 8): the audit writer has buffered records
        # that take longer than the grace window to flush, so a second signal comes while
        # the shutdown still runs (at once, with nothing to flush, the shutdown could end
        # before it: the signal too late, on a loaded machine).
        output.wait_for("status at ")
        process.send_signal(sig)
        if times == 2:
            output.wait_for("shutdown_requested")
            process.send_signal(sig)
        status = process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()
        output.close()
    output.wait_for("summary:")
    return status, output.text


def test_one_ctrl_c_exits_130() -> None:
    """A first Ctrl+C shuts down gracefully and still exits 128 + SIGINT, as services do."""
    status, text = _stop_with(signal.SIGINT, 1)
    assert status == 130, text
    assert "stopped early by Ctrl+C, then a graceful shutdown" in text
    assert "Traceback" not in text


def test_sigterm_exits_143() -> None:
    """SIGTERM: the same graceful shutdown, exit status 128 + SIGTERM."""
    status, text = _stop_with(signal.SIGTERM, 1)
    assert status == 143, text
    assert "Traceback" not in text


# A stdout the live view takes for a terminal: it draws a frame every 0.2 s.
TERMINAL = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120", "LINES": "40"}


def reader_leaves(
    command: list[str], env: dict[str, str], lines: int, tmp_path: Path, *, clean: bool = False
) -> tuple[int, str]:
    """Run ``python -m trio_taskvisor *command`` with stdout a pipe whose reader reads
    ``lines`` lines and closes it; the exit status and what went to stderr. ``clean``:
    without this process's ``TTY_COMPATIBLE``, ``TTY_INTERACTIVE`` and ``FORCE_COLOR``."""
    errors = tmp_path / "stderr"
    base = _no_forced_terminal() if clean else os.environ
    with errors.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "trio_taskvisor", *command],
            cwd=ROOT,
            env={**base, "PYTHONPATH": str(ROOT), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert process.stdout is not None
            for _ in range(lines):
                assert process.stdout.readline()
            process.stdout.close()
            status = process.wait(timeout=30)
        finally:
            process.kill()
            process.wait()
    return status, errors.read_text()


@pytest.mark.parametrize(
    ("command", "env"),
    [
        pytest.param(["demo", "--plain", "--duration", "60"], {}, id="demo-plain"),
        pytest.param(["demo", "--live", "--duration", "60"], TERMINAL, id="demo-live"),
        pytest.param(["tour"], {}, id="tour"),
    ],
)
def test_a_reader_that_goes_away_ends_the_run_quietly(
    command: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    """``python -m trio_taskvisor demo | head -2``: once the reader closes the pipe, the
    program writes nothing on stderr (no "--- Logging error ---" per log line, no
    ``BrokenPipeError`` traceback) and exits 0; the demo, plain or live, ends its 60 s
    run early (a liveness bound of half of it). Before, both printed a traceback per
    line on and exited 1, the demo after its whole run; the live view exited 1 at once,
    with the traceback of rich's ``SystemExit``."""

    assert reader_leaves(command, env, 2, tmp_path) == (0, "")


NOT_A_TERMINAL = (
    "stdout is not a terminal, where the live view draws only its last frame: showing log "
    "lines instead (--plain); TTY_COMPATIBLE=1 draws it anyway\n"
)


def _no_forced_terminal() -> dict[str, str]:
    """This process's environment without what makes rich take any stdout for a terminal."""
    drop = {"TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_live_into_a_pipe_prints_log_lines_and_says_why() -> None:
    """``demo --live > file`` (or ``| cat``): rich redraws only a terminal, so the live
    view would show nothing for the whole run and then its last frame (every task gone,
    "0 registered"). It prints the log lines and the summary instead, as ``--plain``
    does, says why on stderr, and never writes an escape code. Before, the pipe got
    nothing until the end, then the last frame and the summary in boxes."""
    result = subprocess.run(
        [sys.executable, "-m", "trio_taskvisor", "demo", "--live", "--duration", "1"],
        cwd=ROOT,
        env={**_no_forced_terminal(), "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, NOT_A_TERMINAL)
    assert "task_added 'poll-orders'" in result.stdout
    assert "\nsummary:\n" in result.stdout
    assert "\x1b" not in result.stdout
    assert "tasks (" not in result.stdout  # no frame


def test_a_live_view_whose_reader_is_gone_exits_0(tmp_path: Path) -> None:
    """``demo --live | true``: the log lines instead of the live view (a pipe is no
    terminal); a reader gone from the start leaves only that hint on stderr and exit
    status 0. Before, rich exited with status 1."""
    command = ["demo", "--live", "--duration", "1"]
    assert reader_leaves(command, {}, 0, tmp_path, clean=True) == (0, NOT_A_TERMINAL)


# -- the board and the header, directly -------------------------------------------------------


def _event(kind: EventKind, name: str, **fields: Any) -> TaskEvent:
    return TaskEvent(seq=0, time=0.0, wall_time=0.0, kind=kind, name=name, **fields)


async def test_periodic_runs_count_as_runs_not_attempts() -> None:
    """Three runs of a periodic task, one retried once: 3 runs, 1 retry, the 4th attempt."""
    board = Board(20.0)
    periodic = BackoffSource.SUCCESS
    for kind, fields in [
        (EventKind.ATTEMPT_STARTING, {"attempt": 1}),
        (EventKind.ATTEMPT_SUCCEEDED, {"attempt": 1}),
        (EventKind.BACKOFF_SCHEDULED, {"backoff_source": periodic, "delay": 0.5}),
        (EventKind.ATTEMPT_STARTING, {"attempt": 2}),
        (EventKind.ATTEMPT_FAILED, {"attempt": 2, "reason": "reset"}),
        (EventKind.BACKOFF_SCHEDULED, {"backoff_source": BackoffSource.FAILURE, "delay": 0.2}),
        (EventKind.ATTEMPT_STARTING, {"attempt": 3}),
        (EventKind.ATTEMPT_SUCCEEDED, {"attempt": 3}),
        (EventKind.BACKOFF_SCHEDULED, {"backoff_source": periodic, "delay": 0.5}),
    ]:
        await board.on_event(_event(kind, "poll", **fields))
    assert "poll" in board.idle
    await board.on_event(_event(EventKind.ATTEMPT_STARTING, "poll", attempt=4))
    assert "poll" not in board.idle
    assert board.runs["poll"] == 3
    assert board.retries == 1
    assert board.which("poll") == "run 3"
    rows = dict(counter_rows(board))
    assert rows["runs"].startswith("3 runs and 1 retry: 2 ok, 1 failed,")
    assert "attempts" not in rows


def test_idle_state_is_shown_for_a_periodic_wait() -> None:
    """``TaskState.BACKOFF`` after a periodic success shows as idle, after a failure not.

    Until the wait's ``BACKOFF_SCHEDULED`` event has arrived (the state is read live,
    events come later), the wait shows as idle: its note is still the attempt's."""
    pytest.importorskip("rich", reason="needs the demo extra")
    board = Board(20.0)
    board.idle.add("poll")
    board.retrying.add("other")
    info = TaskInfo(id=TaskId(1), name="poll", slot=None, state=TaskState.BACKOFF, attempt=7)
    assert _state(board, info).plain == "idle"
    retry = attrs.evolve(info, name="other")
    assert _state(board, retry).plain == "backoff"
    not_yet_told = attrs.evolve(info, name="unseen")
    assert _state(board, not_yet_told).plain == "idle"


@pytest.mark.parametrize("elapsed", [3.0, 19.9, 999.9])
def test_shutdown_header_fits_80_columns(elapsed: float) -> None:
    """The compact header keeps its whole hint at 80 columns while shutting down."""
    pytest.importorskip("rich", reason="needs the demo extra")
    from rich.console import Console

    board = Board(1000.0)
    board.sup = object()  # type: ignore[assignment]  # only "is not None" is read
    board.phase = "shutting down"
    board.ran = elapsed
    board.stop_deadline = math.inf
    console = Console(width=80, record=True, file=io.StringIO())

    async def render() -> None:
        board.stop_deadline = trio.current_time() + 1.5
        console.print(_header_line(board))

    trio.run(render)
    (line,) = console.export_text().splitlines()
    assert line.endswith("forced in 1.5 s  Ctrl+C: force now"), line
    assert len(line) < 80


# -- rows that do not fit ---------------------------------------------------------------------


@attrs.frozen
class _Busy:
    """A supervisor with more tasks and slots than a frame has rows for."""

    infos: tuple[TaskInfo, ...]
    slots: tuple[SlotView, ...]

    def list(self) -> tuple[TaskInfo, ...]:
        return self.infos

    def alive_snapshot(self) -> list[str]:
        return [info.name for info in self.infos]

    def controller_snapshot(self) -> ControllerSnapshot:
        return ControllerSnapshot(self.slots, len(self.slots), 0)


def _rendered(renderable: Any, width: int) -> list[str]:
    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text().splitlines()


def test_more_rows_line_up_with_the_names_in_every_table() -> None:
    """The "+N more" line that counts the rows left out starts where the names of its
    table start, in the wide panels and the compact sections alike. Before, the compact
    task section put it (and "no task registered") in the state column, after the
    longest name, where the wide panel and the slot tables put it under the names."""
    from trio_taskvisor._cli.demo import _compact_slots, _compact_tasks, _slots_panel, _tasks_panel

    infos = tuple(
        TaskInfo(TaskId(n), f"sync-tenant-{n}", None, TaskState.RUNNING, 1) for n in range(30)
    )
    slots = tuple(
        SlotView(f"tenant:{n}", SlotStatus.RUNNING, TaskId(n), 0, 0, 1.0) for n in range(30)
    )
    board = Board(20.0)
    board.sup = _Busy(infos, slots)  # type: ignore[assignment]
    tables = [
        (_tasks_panel(board), "sync-tenant-"),
        (_compact_tasks(board, infos, [], 5), "sync-tenant-"),
        (_slots_panel(board), "tenant:"),
        (_compact_slots(slots, 3), "tenant:"),
    ]
    for renderable, name in tables:
        lines = _rendered(renderable, 80)
        names = {line.index(name) for line in lines if name in line}
        (more,) = [line for line in lines if re.search(r"\+\d+ more", line)]
        assert {more.index("+")} == names, lines
    empty = _rendered(_compact_tasks(board, (), [], 5), 80)
    assert empty[0].startswith("no task registered"), empty


def test_both_slot_tables_show_a_status_s_time_alike() -> None:
    """How long a slot has had its status reads "1.5 s" in the wide panel as in the
    compact section (and every other duration of the view). Before, the panel said "1.5s"."""
    from trio_taskvisor._cli.demo import _compact_slots, _slots_panel

    slots = (SlotView("tenant:acme", SlotStatus.RUNNING, TaskId(1), 0, 0, 1.5),)
    board = Board(20.0)
    board.sup = _Busy((), slots)  # type: ignore[assignment]
    for renderable in (_slots_panel(board), _compact_slots(slots, 3)):
        (row,) = [line for line in _rendered(renderable, 80) if "tenant:acme" in line]
        assert row.strip("│ ").split()[-2:] == ["1.5", "s"], row


async def test_the_tours_outcomes_show_no_none(
    autojump_clock: trio.abc.Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tour's outcome lines show a completed task's value and another's reason; a
    cancelled task, which has neither, shows nothing after its kind. Before, it showed
    "None" (the value it does not have)."""
    from trio_taskvisor._cli.tour import tour

    await tour()
    outcomes = capsys.readouterr().out.split("outcomes:\n")[1].splitlines()
    assert [line.split(None, 2) for line in outcomes] == [
        ["fetch", "completed", "200"],
        ["heartbeat", "cancelled"],
        ["migrate", "fatal", "schema version 7 is not supported"],
        ["stubborn", "force_aborted", "did not stop within the grace window"],
    ]


async def test_the_wide_view_shows_every_counter_row_when_they_wrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Late in a run the counters' rows are long enough to wrap in the wide layout's
    half-width panel (from 140 columns up): the body grows so that every row shows, and
    the frame still fits the terminal. Before, the panel kept its height and cut the
    last rows ("periodic", "events") without a sign."""
    from trio_taskvisor._cli import demo

    rows = [
        ("outcomes", "38 tasks: 20 cancelled, 8 completed, 8 rejected, 1 failed, 1 force_aborted"),
        ("rejections", "8 superseded, 1 shutting_down"),
        ("runs", "73 runs and 9 retries: 52 ok, 9 failed, 2 timed out, 18 cancelled"),
        ("pollers", "poll-orders 13, poll-payments 14, poll-legacy-erp 9 (gave up once)"),
        ("tenants", "acme 5/9, globex 5/10, initech 4/13 landed; 13 replaced"),
        ("cache", "97 reads, 16 stale, 4 refreshes (JOIN)"),
        ("periodic", "compact-db 6 runs, 2 timed out"),
        ("events", "483 published, 0 dropped"),
    ]
    monkeypatch.setattr(demo, "counter_rows", lambda board: rows)
    board = Board(20.0)
    board.sup = _Busy((), ())  # type: ignore[assignment]
    for width, height in [(140, 32), (160, 40), (200, 50)]:
        lines = _rendered(demo._frame(board, width, height), width)
        assert len(lines) < height, (width, height)
        labels = [label for label, _ in rows]
        shown = [label for label in labels if any(f"│ {label} " in line for line in lines)]
        assert shown == labels, (width, height, "\n".join(lines))
