"""``python -m trio_taskvisor demo``: one supervisor at work, watched live.

For ``--duration`` seconds (20 by default) one supervisor runs a small service, then
shuts down gracefully (a 1.5 s grace window):

* **Flaky pollers** (``TaskSpec.periodic``): each run polls an upstream feed that drops
  the connection now and then; a failure is retried with exponential backoff and equal
  jitter, a success resets the streak. ``poll-legacy-erp`` meets an outage, gives up
  after 3 retries (``FAILED``), and the demo's "operator" adds it again (same name,
  new ``TaskId``).
* **Tenant syncs** (``ControllerSpec.replace``, slot ``tenant:<name>``): webhooks
  announce new revisions, sometimes in bursts, faster than a sync runs. A newer
  revision stops the running sync (``CANCELLED``; the page being applied finishes first,
  in ``defer_cancel()``) or displaces a replacement still waiting for the slot
  (``REJECTED`` ``SUPERSEDED``): the newest revision always lands.
* **A single-flight cache refresh** (``run_in_slot(..., policy=JOIN)``): readers that
  find the cache stale join the refresh in progress instead of starting their own.
* **A periodic job** (``compact-db``) with a 1 s attempt timeout; every third run
  overruns it (``ATTEMPT_TIMED_OUT``) and is retried after a constant backoff.
* **A stubborn task** (``audit-writer``) that defers cancellation to flush its buffer,
  which takes longer than the grace window: the shutdown forces it (``FORCE_ABORTED``)
  and raises ``GraceExceededError``, which the demo expects, catches and reports.

The live view (``rich``, installed by the ``[demo]`` extra) shows tasks with their state
and note, slots with status and queue depth, counters and recent events; a summary ends
the run, and repeats the counters panel's rows under the same labels. From 140x32 up the
panels sit side by side; from 80x24 to there they are stacked, with fewer columns (task
names, states and event kinds are never shortened, notes are). ``--plain`` logs one line
per event instead (``LoggingSubscriber``); it is chosen automatically when stdout is not a
terminal, when the terminal is smaller than 80x24, or when ``rich`` is missing (with a hint
to install the ``demo`` extra). ``--live`` insists on the live view, whatever the
terminal's size; on a stdout that is no terminal (a pipe, a file), where ``rich`` would
draw only the last frame at the end, it too prints log lines, and says so on stderr
(``TTY_COMPATIBLE=1`` makes ``rich`` draw anyway).

Ctrl+C (or SIGTERM) ends the run early, with the same graceful shutdown: the supervisor
handles them (``open_supervisor(handle_signals=True)``). A second Ctrl+C forces the
shutdown at once: the supervisor forces every remaining task, whatever it is doing (the
page being applied, the audit flush, inside ``defer_cancel()``). Either way the demo
prints the summary and exits with status ``128 + signal`` (130 for Ctrl+C, 143 for
SIGTERM), as a service stopped by a signal should. Signals after the supervisor's block
get Python's default handling. While the live view runs, the terminal does not echo
what is typed (``^C`` would push the frame down a line and leave a stale copy of it).

A periodic task waiting for its next run is in ``TaskState.BACKOFF`` with an attempt
number that counts every run; the views show it as ``idle`` and count runs, and the
retries within a run, instead. Outcome counts come from the waiters (reliable); run
counters and recent events come from a subscriber (best-effort, like every event).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import random
import shutil
import sys
import textwrap
from collections.abc import Generator
from typing import TYPE_CHECKING, Final

import attrs
import trio

from .. import (
    AdmissionPolicy,
    BackoffPolicy,
    BackoffSource,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    GraceExceededError,
    Jitter,
    LoggingSubscriber,
    OutcomeKind,
    SlotStatus,
    SlotView,
    Supervisor,
    SupervisorConfig,
    TaskEvent,
    TaskInfo,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from .._logging import says, seconds
from . import StdoutLines, drop_stdout

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

logger = logging.getLogger("trio_taskvisor.demo")

GRACE: Final = 1.5
TENANTS: Final = ("acme", "globex", "initech")
POLLERS: Final = (("poll-orders", 0.08), ("poll-payments", 0.15), ("poll-legacy-erp", 0.05))
CACHE_SLOT: Final = "cache:prices"
CACHE_TTL: Final = 2.5
FRAME: Final = 0.2  # seconds between two frames of the live view

# Events too frequent or too routine for "recent events" (the task table shows them).
_QUIET: Final = frozenset(
    {
        EventKind.TASK_ADD_REQUESTED,
        EventKind.TASK_ADDED,
        EventKind.ATTEMPT_STARTING,
        EventKind.ATTEMPT_SUCCEEDED,
        EventKind.ATTEMPT_FAILED,  # a retry shows as BACKOFF_SCHEDULED, a last one as FINISHED
        EventKind.TASK_REMOVED,
        EventKind.CONTROLLER_SUBMITTED,
    }
)
_OUTCOME_STYLES: Final = {
    OutcomeKind.COMPLETED: "green",
    OutcomeKind.FAILED: "red",
    OutcomeKind.FATAL: "bold red",
    OutcomeKind.CANCELLED: "blue",
    OutcomeKind.FORCE_ABORTED: "bold red",
    OutcomeKind.PANICKED: "bold red",
    OutcomeKind.REJECTED: "magenta",
}
_KIND_STYLES: Final = {
    EventKind.BACKOFF_SCHEDULED: "yellow",
    EventKind.ATTEMPT_TIMED_OUT: "yellow",
    EventKind.ATTEMPT_CANCELLED: "blue",
    EventKind.TASK_REMOVE_REQUESTED: "blue",
    EventKind.CONTROLLER_REJECTED: "magenta",
    EventKind.CONTROLLER_SLOT_TRANSITION: "cyan",
    EventKind.SHUTDOWN_REQUESTED: "bold",
    EventKind.ALL_STOPPED_WITHIN_GRACE: "bold green",
    EventKind.GRACE_EXCEEDED: "bold red",
    EventKind.SUBSCRIBER_OVERFLOW: "red",
    EventKind.SUBSCRIBER_FAILED: "bold red",
}
_STATE_STYLES: Final = {
    TaskState.WAITING: "cyan",
    TaskState.RUNNING: "green",
    TaskState.BACKOFF: "yellow",
    TaskState.STOPPING: "bold red",
}
_SLOT_STYLES: Final = {
    SlotStatus.ADMITTING: "cyan",
    SlotStatus.RUNNING: "green",
    SlotStatus.TERMINATING: "bold red",
}


@attrs.frozen
class Recent:
    """One line of "recent events": an event, or something the demo itself did."""

    when: float
    label: str
    name: str
    text: str
    style: str


class Board:
    """What the views show: event tallies (a subscriber) and the scenario's own counts.

    Every field is written by code of this one trio run, between checkpoints.
    """

    name = "demo-board"

    def __init__(self, duration: float) -> None:
        self.duration = duration
        self.t0 = 0.0
        self.phase = "starting"
        self.stop_deadline = math.inf
        self.sup: Supervisor | None = None
        # The application's run: it may be ended before it starts (the live view's
        # first frame can find stdout's reader gone).
        self.scenario = trio.CancelScope()
        # From events (best-effort).
        self.attempts: collections.Counter[EventKind] = collections.Counter()
        self.replaced_running = 0
        self.replaced: set[str] = set()
        self.recent: collections.deque[Recent] = collections.deque(maxlen=20)
        self.notes: dict[str, str] = {}
        # Per task name: its runs (a first attempt, or one after a success), and whether
        # it waits for its next run (a periodic success) or retries a failure.
        self.runs: collections.Counter[str] = collections.Counter()
        self.tries: dict[str, int] = {}  # attempts of the current run, from 1
        self.retries = 0
        self.idle: set[str] = set()
        self.retrying: set[str] = set()
        # From the scenario.
        self.waiters: list[TaskWaiter[object]] = []
        self.polls: collections.Counter[str] = collections.Counter()
        self.gave_up: list[str] = []
        self.revisions: dict[str, int] = dict.fromkeys(TENANTS, 0)
        self.landed: dict[str, int] = dict.fromkeys(TENANTS, 0)
        self.cache_reads = 0
        self.cache_stale = 0
        self.cache_refreshes = 0
        self.cache_version = 0
        self.cache_at = -math.inf
        self.compactions = 0
        self.audit_buffered = 0
        self.interrupted = False  # a first Ctrl+C: the graceful shutdown
        self.forced = False  # a second one: the supervisor forced the shutdown at once
        self.ran = 0.0
        self.grace_error: GraceExceededError | None = None
        self.signal: int | None = None  # the first signal the supervisor received

    def elapsed(self) -> float:
        return trio.current_time() - self.t0

    def end_now(self) -> None:
        """End the application's run before ``duration`` (the shutdown follows), or as
        it starts."""
        self.scenario.cancel(reason="stdout's reader went away")

    def which(self, name: str) -> str:
        """Name task ``name``'s current attempt: ``run 4``, or ``run 4, retry 2``."""
        tries = self.tries.get(name, 1)
        return f"run {self.runs[name]}" + (f", retry {tries - 1}" if tries > 1 else "")

    def note(self, name: str, text: str) -> None:
        """Set the "note" column of task ``name``."""
        self.notes[name] = text

    def say(self, name: str, text: str) -> None:
        """Report something the demo itself did, in "recent events" and the log."""
        self.recent.append(Recent(self.elapsed(), "demo", name, text, "bold cyan"))
        logger.info("demo: %s %s", name, text)

    async def on_event(self, event: TaskEvent) -> None:
        """Tally ``event`` and keep a line for it (the subscriber protocol)."""
        kind = event.kind
        name = event.name or ""
        text = ""
        style = _KIND_STYLES.get(kind, "")
        if kind is EventKind.ATTEMPT_STARTING:
            self.attempts[kind] += 1  # the task's own note says what it is doing
            self.idle.discard(name)
            if name in self.retrying:
                self.retrying.discard(name)
                self.retries += 1
                self.tries[name] = self.tries.get(name, 1) + 1
            else:
                self.runs[name] += 1
                self.tries[name] = 1
        elif kind is EventKind.ATTEMPT_SUCCEEDED:
            self.attempts[kind] += 1
            took = f" in {event.duration:.2f} s" if event.duration is not None else ""
            self.note(name, f"ok{took}")
        elif kind is EventKind.ATTEMPT_FAILED:
            self.attempts[kind] += 1
            self.note(name, f"failed: {event.reason}")
        elif kind is EventKind.ATTEMPT_TIMED_OUT:
            self.attempts[kind] += 1
            text = f"{self.which(name)} overran its {event.timeout:g} s timeout"
            self.note(name, "timed out")
        elif kind is EventKind.ATTEMPT_CANCELLED:
            self.attempts[kind] += 1
            text = self.which(name)
        elif kind is EventKind.BACKOFF_SCHEDULED:
            delay = event.delay or 0.0
            if event.backoff_source is BackoffSource.SUCCESS:
                self.idle.add(name)
                self.note(name, f"next run in {delay:.1f} s")
                return
            self.retrying.add(name)
            text = f"retry in {delay:.2f} s after: {event.reason}"
            self.note(name, f"retry in {delay:.2f} s: {event.reason}")
        elif kind is EventKind.TASK_REMOVE_REQUESTED:
            replaced = name in self.replaced
            self.note(name, "replaced: finishing its page" if replaced else "stop requested")
        elif kind is EventKind.TASK_FINISHED and event.outcome is not None:
            self.idle.discard(name)
            self.retrying.discard(name)
            style = _OUTCOME_STYLES[event.outcome]
            reason = event.reason
            if says(reason, event.outcome.value):  # a reason that names its kind: once
                text = reason or ""
            else:
                text = event.outcome.value + (f": {reason}" if reason else "")
        elif kind is EventKind.CONTROLLER_REJECTED and event.rejection is not None:
            text = f"{event.rejection.value} in {event.slot}"
        elif kind is EventKind.CONTROLLER_SLOT_TRANSITION:
            if event.reason not in ("running->terminating", "admitting->terminating"):
                return
            if self.phase == "running":
                self.replaced_running += 1
            self.replaced.add(name)
            text = f"{event.slot} {event.reason}"
        elif kind is EventKind.SHUTDOWN_REQUESTED:
            self._shutdown_requested(event)
        elif kind is EventKind.GRACE_EXCEEDED:
            text = event.reason or ""
            if event.time < self.stop_deadline:
                # Before the grace ran out: only a signal during the shutdown forces so.
                self.forced = True
                self.say("Ctrl+C", "again: the supervisor forced the shutdown")
        elif kind is EventKind.FORCED_TASK_EXITED and event.duration is not None:
            text = f"{seconds(event.duration)} after the force"
        elif kind is EventKind.SUBSCRIBER_FAILED:
            text = event.reason or ""
        elif kind is EventKind.SUBSCRIBER_OVERFLOW:
            text = f"dropped {event.dropped}"
        if kind not in _QUIET:
            when = event.time - self.t0
            self.recent.append(Recent(when, kind.value, name, text, style))

    def _shutdown_requested(self, event: TaskEvent) -> None:
        if self.phase != "running":
            return  # the application's own end (the duration) already said so
        # A signal cancelled the application (the supervisor's body).
        self.ran = event.time - self.t0
        self.phase = "shutting down"
        self.stop_deadline = event.time + GRACE
        if self.sup is not None and self.sup.received_signal is not None:
            self.interrupted = True
            self.say("Ctrl+C", "graceful shutdown (Ctrl+C again: force it now)")


class Scenario:
    """The service the demo supervises: its task bodies and its drivers."""

    def __init__(self, sup: Supervisor, board: Board, rng: random.Random) -> None:
        self.sup = sup
        self.board = board
        self.rng = rng
        d = board.duration
        self.outage = (0.15 * d, 0.5 * d)  # the legacy ERP is down in this window

    # -- task bodies ----------------------------------------------------------------------

    async def poll(self, feed: str, failure_rate: float) -> int:
        """Poll one batch from ``feed``: a flaky network call."""
        self.board.note(feed, f"polling batch {self.board.polls[feed] + 1}")
        await trio.sleep(0.3)
        start, end = self.outage
        if feed == "poll-legacy-erp" and start <= self.board.elapsed() < end:
            raise ConnectionError("connection refused: upstream down")
        if self.rng.random() < failure_rate:
            raise ConnectionError("connection reset by peer")
        self.board.polls[feed] += 1
        return self.board.polls[feed]

    async def sync_tenant(self, tenant: str, revision: int) -> int:
        """Sync ``tenant`` to ``revision``, page by page; each page is applied atomically."""
        ctx = current_context()
        pages = self.rng.randint(3, 6)
        for page in range(1, pages + 1):
            self.board.note(ctx.name, f"page {page}/{pages}")
            with ctx.defer_cancel():  # a stop waits for the page being applied
                await trio.sleep(0.3)
            await trio.sleep(0.05)  # rate limit between pages: a stop lands here
        self.board.landed[tenant] = max(self.board.landed[tenant], revision)
        return revision

    async def refresh_prices(self) -> int:
        """Reload the price cache (slow: every stale reader would love to do it)."""
        board = self.board
        board.note(current_context().name, "reloading prices; stale readers join")
        await trio.sleep(0.8)
        board.cache_refreshes += 1
        board.cache_version += 1
        board.cache_at = trio.current_time()
        return board.cache_version

    async def compact(self) -> int:
        """Compact the database; every third run overruns the 1 s timeout."""
        self.board.compactions += 1
        run = self.board.compactions
        self.board.note("compact-db", f"compacting (run {run})")
        await trio.sleep(1.6 if run % 3 == 0 else 0.3)
        return run

    async def audit_writer(self) -> None:
        """Buffer audit records; on stop, flush them all, stop or no stop."""
        ctx = current_context()
        board = self.board
        with ctx.defer_cancel():
            while not ctx.cancel_requested:
                await trio.sleep(0.2)
                board.audit_buffered += 25
                board.note(ctx.name, f"buffered {board.audit_buffered:,} records")
            seconds = board.audit_buffered / 50
            board.note(ctx.name, f"flushing {board.audit_buffered:,} records (~{seconds:.0f} s)")
            # Longer than the grace window: forced at its end (or at once by a second
            # Ctrl+C), which cancels it even here.
            await trio.sleep(seconds)

    # -- drivers: the application around the supervisor -----------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        """Add the resident tasks and start the drivers in ``nursery``."""
        sup, board = self.sup, self.board
        backoff = BackoffPolicy.exponential(0.25, max=4.0, jitter=Jitter.EQUAL)
        for feed, failure_rate in POLLERS:
            retries = 3 if feed == "poll-legacy-erp" else None
            spec = TaskSpec.periodic(
                feed, 0.5, self.poll, feed, failure_rate, backoff=backoff, max_retries=retries
            )
            waiter = await sup.add(spec)
            board.waiters.append(waiter)
            if retries is not None:
                nursery.start_soon(self.operator, spec, waiter)
        compact = TaskSpec.periodic(
            "compact-db", 2.0, self.compact, timeout=1.0, backoff=BackoffPolicy.constant(0.5)
        )
        board.waiters.append(await sup.add(compact))
        board.waiters.append(await sup.add(TaskSpec.once("audit-writer", self.audit_writer)))
        for tenant in TENANTS:
            nursery.start_soon(self.webhooks, tenant)
        for _ in range(4):
            nursery.start_soon(self.reader)

    async def operator(self, spec: TaskSpec[int], waiter: TaskWaiter[int]) -> None:
        """Add ``spec`` again 2 s after it gives up, like an on-call engineer would."""
        while True:
            outcome = await waiter.wait()
            self.board.gave_up.append(outcome.reason or outcome.kind.value)
            self.board.say(waiter.name, "gave up; the operator adds it again in 2 s")
            await trio.sleep(2.0)
            waiter = await self.sup.add(spec)
            self.board.waiters.append(waiter)
            self.board.say(waiter.name, f"added again as {waiter.id}")

    async def webhooks(self, tenant: str) -> None:
        """Announce new revisions of ``tenant``: a sync per revision, newest wins."""
        board = self.board
        while True:
            await trio.sleep(self.rng.uniform(1.0, 3.0))
            burst = self.rng.choice((1, 1, 1, 2, 3))  # edits often come in flurries
            for i in range(burst):
                if i:
                    await trio.sleep(self.rng.uniform(0.05, 0.2))
                board.revisions[tenant] += 1
                revision = board.revisions[tenant]
                spec = TaskSpec.once(
                    f"sync-{tenant}-r{revision}", self.sync_tenant, tenant, revision
                )
                request = ControllerSpec.replace(spec, slot=f"tenant:{tenant}")
                board.waiters.append(await self.sup.submit(request))

    async def reader(self) -> None:
        """Serve reads; a stale cache is refreshed once, whoever asks (JOIN)."""
        board = self.board
        while True:
            await trio.sleep(self.rng.uniform(0.15, 0.6))
            board.cache_reads += 1
            if trio.current_time() - board.cache_at > CACHE_TTL:
                board.cache_stale += 1
                await self.sup.run_in_slot(
                    CACHE_SLOT, self.refresh_prices, policy=AdmissionPolicy.JOIN
                )


# -- running ----------------------------------------------------------------------------------


async def _supervise(board: Board, seed: int | None, plain: bool) -> None:
    rng = random.Random(seed)
    config = SupervisorConfig(
        grace=GRACE,
        controller=ControllerConfig(max_slot_queue=4),
        random=random.Random(rng.random()),
        # The live view shows every failure, and log records would scroll it away;
        # --plain logs them with its LoggingSubscriber.
        log_failures=False,
    )
    subscribers: list[Board | LoggingSubscriber] = [board]
    if plain:
        subscribers.append(LoggingSubscriber())
    board.t0 = trio.current_time()
    try:
        # Ctrl+C and SIGTERM: the first cancels this body and shuts down gracefully, a
        # second forces the shutdown (the supervisor handles both).
        async with open_supervisor(config, subscribers=subscribers, handle_signals=True) as sup:
            board.sup = sup
            board.phase = "running"
            scenario = Scenario(sup, board, rng)
            board.scenario.deadline = board.t0 + board.duration
            with board.scenario:
                async with trio.open_nursery() as app:
                    await scenario.start(app)
            board.ran = board.elapsed()
            # The application has stopped using the supervisor: leaving the block shuts
            # it down, and the stubborn audit writer holds out past the grace window.
            board.phase = "shutting down"
            board.stop_deadline = trio.current_time() + GRACE
    except GraceExceededError as exc:
        board.grace_error = exc
    if board.sup is not None and board.sup.received_signal is not None:
        board.interrupted = True  # reliable, whatever events were delivered
        board.signal = board.sup.received_signal
    board.phase = "stopped"


async def _plain_status(board: Board) -> None:
    every = max(1.0, min(5.0, board.duration / 4))
    while True:
        await trio.sleep(every)
        sup = board.sup
        if sup is None or board.phase != "running":
            continue
        states = collections.Counter(info.state for info in sup.list())
        snapshot = sup.controller_snapshot()
        logger.info(
            "status at %.1f s: %s; %s, %d queued; outcomes: %s",
            board.elapsed(),
            ", ".join(f"{n} {s.value}" for s, n in sorted(states.items(), key=_by_value)),
            _n(len(snapshot.slots), "live slot"),
            snapshot.total_queued,
            counter_rows(board)[0][1],
        )


def _by_value(item: tuple[TaskState, int]) -> str:
    return item[0].value


async def _run_plain(board: Board, seed: int | None) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_plain_status, board)
        await _supervise(board, seed, plain=True)
        nursery.cancel_scope.cancel(reason="the demo ended")


async def _run_live(board: Board, seed: int | None) -> None:
    from rich.console import Console
    from rich.live import Live

    class QuietConsole(Console):
        def on_broken_pipe(self) -> None:
            # stdout's reader went away (``| head``): end early and quietly, as --plain
            # does. rich's own handler raises SystemExit(1) from the write.
            self.quiet = True
            drop_stdout()
            board.end_now()

    console = QuietConsole(force_terminal=_tty_compatible())

    def frame() -> RenderableType:
        return _frame(board, console.size.width, console.size.height)

    with no_echo(), Live(frame(), console=console, auto_refresh=False) as live:
        async with trio.open_nursery() as nursery:

            async def refresh() -> None:
                while True:
                    live.update(frame(), refresh=True)
                    await trio.sleep(FRAME)

            nursery.start_soon(refresh)
            await _supervise(board, seed, plain=False)
            nursery.cancel_scope.cancel(reason="the demo ended")
        live.update(frame(), refresh=True)
    if not console.is_terminal:
        console.line()  # a non-terminal Live prints its last frame without a newline
    console.print(_summary_panel(board))


@contextlib.contextmanager
def no_echo() -> Generator[None]:
    """Keep the terminal from echoing what is typed while the live view draws.

    The live view redraws its frame by moving the cursor up as many lines as it drew.
    An echoed ``^C`` (or any key) at the end of a full last line wraps it: the terminal
    scrolls, the frame is redrawn a line lower, and the line above keeps a stale copy
    of the header. Ctrl+C still sends SIGINT (only the echo is off).
    """
    try:
        import termios
    except ImportError:  # not a POSIX terminal
        yield
        return
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)  # lflag
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


# -- the live view ----------------------------------------------------------------------------
#
# Two layouts, chosen per frame from the terminal's size (a resize takes effect at the next
# frame). From WIDE_MIN up: panels side by side, every column. Below it, down to LIVE_MIN:
# stacked sections under one-line rules, fewer columns (no id; the attempt is in the note
# when it is a retry), rows given out by priority. Names, states and event kinds are never
# shortened (their columns take the width they need); only notes and event texts are cut.
# Below LIVE_MIN, main() falls back to --plain.

LIVE_MIN: Final = (80, 24)
WIDE_MIN: Final = (140, 32)
_BODY_HEIGHT: Final = 19  # wide layout: the task panel; slots and counters beside it
# (taller when the counters' rows wrap to more lines than their panel has)
_SLOTS_HEIGHT: Final = 7


def _frame(board: Board, width: int, height: int) -> RenderableType:
    """One frame of the live view, fitted to a ``width`` x ``height`` terminal."""
    if width >= WIDE_MIN[0] and height >= WIDE_MIN[1]:
        return _wide_frame(board, width, height)
    return _compact_frame(board, width, height)


def _wide_frame(board: Board, width: int, height: int) -> RenderableType:
    from rich.console import Group
    from rich.table import Table

    body = Table.grid(expand=True, padding=(0, 1))
    body.add_column(ratio=1)
    body.add_column(ratio=1)
    counters_width = (width - 1) // 2 - 4  # the right column, less borders and padding
    counters = _wrapped_counters(board, counters_width)
    # Every counter row is shown: the body grows when they wrap, recent events give way.
    body_height = max(_BODY_HEIGHT, _SLOTS_HEIGHT + len(counters) + 2)
    body.add_row(
        _tasks_panel(board, body_height),
        Group(_slots_panel(board), _counters_panel(counters, body_height - _SLOTS_HEIGHT)),
    )
    recent = max(4, min(16, height - 1 - 3 - body_height))
    return Group(_header_panel(board), body, _recent_panel(board, recent))


def _compact_frame(board: Board, width: int, height: int) -> RenderableType:
    from rich.console import Group

    infos, forced = _task_rows(board)
    slots = board.sup.controller_snapshot().slots if board.sup is not None else ()
    counters = _wrapped_counters(board, width)
    # Fixed lines: header, four rules, the counters. The rest goes to rows (one line is
    # kept free below the frame, so the terminal never scrolls).
    rows = max(5, height - 1 - 1 - 4 - len(counters))
    recent = max(2, rows // 3)
    slot_rows = min(max(1, len(slots)), 3, max(1, (rows - recent) // 3))
    task_rows = max(2, rows - recent - slot_rows)
    recent += max(0, task_rows - max(1, len(infos) + len(forced)))  # unused task rows
    task_rows = min(task_rows, max(1, len(infos) + len(forced)))
    return Group(
        _header_line(board),
        _rule(f"tasks ({len(infos)} registered)"),
        _compact_tasks(board, infos, forced, task_rows),
        _rule(f"slots ({len(slots)} live)"),
        _compact_slots(slots, slot_rows),
        _rule("counters"),
        _counter_grid(counters),
        _rule("recent events"),
        _recent_table(board, recent),
    )


def _rule(title: str) -> RenderableType:
    from rich.rule import Rule

    return Rule(f"[bold]{title}[/]", align="left", style="dim")


def _progress(board: Board, width: int) -> tuple[Text, float]:
    from rich.text import Text

    elapsed = min(board.elapsed(), board.duration) if board.sup is not None else 0.0
    if board.phase != "running":
        elapsed = board.ran
    done = round(width * elapsed / board.duration)
    bar = Text()
    bar.append("█" * done, style="green")
    bar.append("░" * (width - done), style="dim")
    return bar, elapsed


def _phase(board: Board, *, short: bool) -> Text:
    from rich.text import Text

    line = Text()
    if board.phase == "running":
        line.append("running", style="bold green")
        line.append("  Ctrl+C: shut down" if short else "   Ctrl+C: shut down now", style="dim")
    elif board.phase == "shutting down" and short:
        # The compact header's 80 columns: every word of the hint, whatever the numbers.
        left = max(0.0, board.stop_deadline - trio.current_time())
        line.append("shutdown:", style="bold yellow")
        if board.forced:
            line.append(" forcing now", style="bold red")
        else:
            line.append(f" forced in {left:.1f} s", style="dim")
            line.append("  Ctrl+C: force now", style="dim")
    elif board.phase == "shutting down":
        left = max(0.0, board.stop_deadline - trio.current_time())
        line.append("shutting down", style="bold yellow")
        if board.forced:
            line.append("  forcing now", style="bold red")
        else:
            line.append(f"   grace {GRACE:g} s: stragglers are forced in {left:.1f} s")
            line.append("   Ctrl+C: force now", style="dim")
    else:
        line.append(board.phase, style="bold")
    return line


def _header_panel(board: Board) -> RenderableType:
    from rich.panel import Panel

    bar, elapsed = _progress(board, 30)
    line = bar + f"  {elapsed:5.1f} s / {board.duration:g} s   " + _phase(board, short=False)
    line.no_wrap = True
    line.overflow = "ellipsis"
    return Panel(line, title="[bold]trio_taskvisor demo[/]", title_align="left")


def _header_line(board: Board) -> RenderableType:
    from rich.text import Text

    # Under 80 columns (every hint in full): once the run is over, its length takes the
    # progress bar's place.
    bar, elapsed = _progress(board, 6)
    line = Text("trio_taskvisor demo ", style="bold")
    if board.phase == "running" or board.sup is None:
        line += bar + f" {elapsed:4.1f}/{board.duration:g} s  "
    else:
        line += f"ran {elapsed:.1f} s  "
    line += _phase(board, short=True)
    line.no_wrap = True
    line.overflow = "ellipsis"
    return line


def _state(board: Board, info: TaskInfo) -> Text:
    """The state column: a periodic task waiting for its next run is ``idle``.

    ``backoff`` is a retry's wait, once its ``BACKOFF_SCHEDULED`` event has arrived (the
    state is read live, events come through the bus a little later): until then the row's
    note is still the attempt's, so the wait shows as ``idle``, as a periodic one does.
    """
    from rich.text import Text

    if info.state is TaskState.BACKOFF and info.name not in board.retrying:
        return Text("idle", style="dim")
    return Text(info.state.value, style=_STATE_STYLES[info.state])


def _task_rows(board: Board) -> tuple[tuple[TaskInfo, ...], list[str]]:
    if board.sup is None:
        return (), []
    infos = board.sup.list()
    listed = {info.name for info in infos}
    # Force-aborted and still running: no longer listed, still alive.
    return infos, [n for n in board.sup.alive_snapshot() if n not in listed]


def _name_column(table: Table, names: list[str], header: str = "") -> None:
    # Key columns take the width their longest value needs: never "poll-legacy-…".
    table.add_column(header, no_wrap=True, min_width=max(map(len, names), default=4))


def _tasks_panel(board: Board, height: int = _BODY_HEIGHT) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    infos, forced = _task_rows(board)
    table = Table(expand=True, box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    table.add_column("id", justify="right", no_wrap=True)
    _name_column(table, [i.name for i in infos] + forced, "task")
    table.add_column("state", no_wrap=True, min_width=8)
    table.add_column("runs", justify="right", no_wrap=True)
    table.add_column("note", no_wrap=True, overflow="ellipsis", ratio=1)
    room = height - 3 - len(forced)  # borders and header
    shown = infos if len(infos) <= room else infos[: room - 1]
    for info in shown:
        table.add_row(
            str(info.id),
            info.name,
            _state(board, info),
            str(board.runs[info.name]),
            Text(board.notes.get(info.name, ""), style="dim"),
        )
    for name in forced:
        table.add_row("", name, Text("forced", style="bold red"), "", "still running")
    if len(shown) < len(infos):
        table.add_row("", Text(f"+{len(infos) - len(shown)} more", style="dim"), "", "", "")
    if not infos and not forced:
        table.add_row("", Text("no task registered", style="dim"), "", "", "")
    title = f"tasks ({len(infos)} registered)"
    return Panel(table, title=title, title_align="left", height=height)


def _compact_tasks(
    board: Board, infos: tuple[TaskInfo, ...], forced: list[str], rows: int
) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(expand=True, padding=(0, 1))
    _name_column(table, [i.name for i in infos] + forced)
    table.add_column(no_wrap=True, min_width=8)
    table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    # "+N more" and "no task registered" go where the names are, as in every table.
    lines: list[tuple[str | Text, Text, Text]] = []
    for info in infos:
        note = Text(board.notes.get(info.name, ""))
        lines.append((info.name, _state(board, info), note))
    lines += [(n, Text("forced", style="bold red"), Text("still running")) for n in forced]
    if not lines:
        lines.append((Text("no task registered", style="dim"), Text(""), Text("")))
    if len(lines) > rows:
        hidden = len(lines) - rows + 1
        lines = [*lines[: rows - 1], (Text(f"+{hidden} more", style="dim"), Text(""), Text(""))]
    for name, state, text in lines:
        text.stylize("dim")
        table.add_row(name, state, text)
    return table


def _slots_panel(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    slots = board.sup.controller_snapshot().slots if board.sup is not None else ()
    table = Table(expand=True, box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    _name_column(table, [view.slot for view in slots], "slot")
    table.add_column("status", no_wrap=True, min_width=11)
    table.add_column("owner", justify="right", no_wrap=True)
    table.add_column("queue", justify="right", no_wrap=True)
    table.add_column("for", justify="right", no_wrap=True)
    room = _SLOTS_HEIGHT - 3  # borders and header
    shown = slots if len(slots) <= room else slots[: room - 1]
    for view in shown:
        status = Text(view.status.value, style=_SLOT_STYLES[view.status])
        table.add_row(
            view.slot, status, str(view.owner_id), str(view.queue_depth), f"{view.status_for:.1f} s"
        )
    if len(shown) < len(slots):
        table.add_row(Text(f"+{len(slots) - len(shown)} more", style="dim"), "", "", "", "")
    if not slots:
        table.add_row(Text("no busy slot", style="dim"), "", "", "", "")
    title = f"slots ({len(slots)} live)"
    return Panel(table, title=title, title_align="left", height=_SLOTS_HEIGHT)


def _compact_slots(slots: tuple[SlotView, ...], rows: int) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 2))
    _name_column(table, [view.slot for view in slots])
    table.add_column(no_wrap=True, min_width=11)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, justify="right")
    shown = slots if len(slots) <= rows else slots[: rows - 1]
    for view in shown:
        status = Text(view.status.value, style=_SLOT_STYLES[view.status])
        table.add_row(view.slot, status, f"queue {view.queue_depth}", f"{view.status_for:.1f} s")
    if len(shown) < len(slots):
        table.add_row(Text(f"+{len(slots) - len(shown)} more", style="dim"), "", "", "")
    if not slots:
        table.add_row(Text("no busy slot", style="dim"), "", "", "")
    return table


_LABEL_WIDTH: Final = 10  # the longest counter label, "rejections"


def _wrapped_counters(board: Board, width: int) -> list[tuple[str, str]]:
    """``counter_rows`` wrapped to ``width`` (label included): one tuple per line."""
    value_width = max(20, width - _LABEL_WIDTH - 1)
    lines: list[tuple[str, str]] = []
    for label, text in counter_rows(board):
        for k, part in enumerate(textwrap.wrap(text, value_width) or [""]):
            lines.append((label if k == 0 else "", part))
    return lines


def _counter_grid(lines: list[tuple[str, str]]) -> RenderableType:
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True, min_width=_LABEL_WIDTH)
    grid.add_column(no_wrap=True)
    for label, text in lines:
        grid.add_row(label, text)
    return grid


def _counters_panel(lines: list[tuple[str, str]], height: int) -> RenderableType:
    from rich.panel import Panel

    return Panel(_counter_grid(lines), title="counters", title_align="left", height=height)


def _recent_table(board: Board, rows: int) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    items = list(board.recent)[-rows:] if rows > 0 else []
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(justify="right", style="dim", no_wrap=True)
    table.add_column(no_wrap=True, min_width=max((len(i.label) for i in items), default=4))
    _name_column(table, [item.name for item in items])
    table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for item in items:
        # A time since the start, with its unit spaced like the demo's durations.
        when = f"{item.when:.2f} s"
        table.add_row(when, Text(item.label, style=item.style), item.name, item.text)
    if not items:
        table.add_row("", Text("nothing yet", style="dim"), "", "")
    return table


def _recent_panel(board: Board, height: int) -> RenderableType:
    from rich.panel import Panel

    table = _recent_table(board, height - 2)
    return Panel(table, title="recent events", title_align="left", height=height)


def _summary_panel(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True, min_width=_LABEL_WIDTH)
    grid.add_column()
    for label, text in summary(board):
        grid.add_row(label, text)
    return Panel(grid, title="[bold]summary[/]", title_align="left")


# -- the counters and the summary -------------------------------------------------------------


def _n(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


def _by_count(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counter.most_common())


def counter_rows(board: Board) -> list[tuple[str, str]]:
    """What the counters panel shows and the summary repeats: (label, text) rows.

    ``outcomes`` and ``rejections`` (a row once there is one) come from the waiters
    (reliable: every waiter resolves); ``pending`` counts waiters not resolved yet.
    ``runs`` and ``events`` come from events (best-effort, like every event): a run is a
    task's first attempt or one after a success (a periodic task's next run), a retry
    one after a failure; ``ok`` to ``cancelled`` count how attempts of either ended;
    ``replaced`` counts running syncs a newer revision stopped. The other rows are the
    scenario's own counts.
    """
    outcomes: collections.Counter[str] = collections.Counter()
    rejections: collections.Counter[str] = collections.Counter()
    for waiter in board.waiters:
        try:
            outcome = waiter.outcome_nowait()
        except trio.WouldBlock:
            outcomes["pending"] += 1
            continue
        outcomes[outcome.kind.value] += 1
        if outcome.rejection is not None:
            rejections[outcome.rejection.value] += 1
    rows = [("outcomes", f"{_n(len(board.waiters), 'task')}: {_by_count(outcomes) or 'none'}")]
    if rejections:
        rows.append(("rejections", _by_count(rejections)))
    attempts = board.attempts
    runs = sum(board.runs.values())
    rows.append(
        (
            "runs",
            f"{_n(runs, 'run')} and {_n(board.retries, 'retry', 'retries')}: "
            f"{attempts[EventKind.ATTEMPT_SUCCEEDED]} ok, "
            f"{attempts[EventKind.ATTEMPT_FAILED]} failed, "
            f"{attempts[EventKind.ATTEMPT_TIMED_OUT]} timed out, "
            f"{attempts[EventKind.ATTEMPT_CANCELLED]} cancelled",
        )
    )
    polls = ", ".join(f"{feed} {board.polls[feed]}" for feed, _ in POLLERS)
    if board.gave_up:
        times = "once" if len(board.gave_up) == 1 else f"{len(board.gave_up)} times"
        polls += f" (gave up {times})"
    rows.append(("pollers", polls))
    landed = ", ".join(f"{t} {board.landed[t]}/{board.revisions[t]}" for t in TENANTS)
    rows.append(("tenants", f"{landed} landed; {board.replaced_running} replaced"))
    rows.append(
        (
            "cache",
            f"{_n(board.cache_reads, 'read')}, {board.cache_stale} stale, "
            f"{_n(board.cache_refreshes, 'refresh', 'refreshes')} (JOIN)",
        )
    )
    rows.append(
        (
            "periodic",
            f"compact-db {_n(board.compactions, 'run')}, "
            f"{attempts[EventKind.ATTEMPT_TIMED_OUT]} timed out",
        )
    )
    if board.sup is not None:
        stats = board.sup.statistics()
        published, dropped = stats.events_published, stats.events_dropped
        rows.append(("events", f"{published} published, {dropped} dropped"))
    return rows


def summary(board: Board) -> list[tuple[str, str]]:
    """What happened, as (label, text) rows: the run, the counters, the shutdown."""
    if board.forced:
        how = "stopped by Ctrl+C; a second Ctrl+C forced the shutdown"
    elif board.interrupted:
        how = "stopped early by Ctrl+C, then a graceful shutdown"
    else:
        how = "then a graceful shutdown"
    rows = [("run", f"{board.ran:.1f} s, {how} (grace {GRACE:g} s)"), *counter_rows(board)]
    if board.forced:
        rows.append(
            (
                "shutdown",
                "forced by the second Ctrl+C: every remaining task forced at once "
                "(pages, the flush)",
            )
        )
    elif board.grace_error is not None:
        stuck = ", ".join(board.grace_error.stuck)
        rows.append(
            (
                "shutdown",
                f"GraceExceededError, as expected: {stuck} ended force_aborted after the "
                f"{GRACE:g} s grace (its flush outlasts it); everything else stopped in time",
            )
        )
    else:
        rows.append(("shutdown", "every task stopped within the grace window"))
    return rows


def _not_routine(record: logging.LogRecord) -> bool:
    # LoggingSubscriber puts every event field in the record's extra, so a filter can
    # read them: drop "next run in 0.5 s" of every successful periodic run.
    source: object = getattr(record, "taskvisor_backoff_source", None)
    return source is not BackoffSource.SUCCESS


def _live_available() -> bool:
    try:
        import rich  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        return False
    return True


def _live_terminal() -> bool:
    """Whether ``rich`` takes stdout for a terminal, which the live view redraws; on
    anything else (a pipe, a file) ``Live`` shows only its last frame, at the end."""
    from rich.console import Console

    return Console(force_terminal=_tty_compatible()).is_terminal


def _tty_compatible() -> bool | None:
    """``True`` under ``TTY_COMPATIBLE=1``: stdout is drawn on as a terminal, whatever it
    is. ``rich`` reads the variable itself from 14.0; it is read here for the earlier
    versions the ``demo`` extra allows too."""
    return True if os.environ.get("TTY_COMPATIBLE") == "1" else None


def _too_small() -> str | None:
    """Why the terminal cannot hold the live view, or ``None`` when it can."""
    size = shutil.get_terminal_size(fallback=LIVE_MIN)
    if size.columns >= LIVE_MIN[0] and size.lines >= LIVE_MIN[1]:
        return None
    return (
        f"the terminal is {size.columns}x{size.lines}, the live view needs at least "
        f"{LIVE_MIN[0]}x{LIVE_MIN[1]}"
    )


async def demo(board: Board, *, plain: bool = False, seed: int | None = None) -> None:
    """Run the demo for ``board.duration`` seconds (it fills the board in)."""
    if plain:
        await _run_plain(board, seed)
    else:
        await _run_live(board, seed)


def main(*, duration: float = 20.0, plain: bool | None = None, seed: int | None = None) -> int:
    """Run the demo and return the exit status: 0, or ``128 + signal`` after a signal.

    130 after Ctrl+C (SIGINT), 143 after SIGTERM: a first one (the graceful shutdown)
    as well as a second (forced), as a service stopped by a signal exits.

    ``plain=None`` picks the live view when stdout is a terminal of at least 80x24 and
    ``rich`` is installed, else log lines; ``plain=False`` (``--live``) insists on the
    live view, whatever the terminal's size, but still needs ``rich`` and a stdout that
    ``rich`` takes for a terminal (a pipe or a file is not, unless ``TTY_COMPATIBLE=1``):
    on any other it would draw nothing for the whole run and then its last frame only,
    so log lines are printed instead, with a hint on stderr.
    """
    if plain is None:
        plain = not sys.stdout.isatty()
        reason = None if plain or not _live_available() else _too_small()
        if reason is not None:
            print(f"{reason}: showing log lines instead (--plain)", file=sys.stderr)
            plain = True
    if not plain and not _live_available():
        print(
            "rich is not installed: showing log lines instead of the live view; "
            "install the demo extra for it: pip install 'trio_taskvisor[demo]'",
            file=sys.stderr,
        )
        plain = True
    if not plain and not _live_terminal():
        print(
            "stdout is not a terminal, where the live view draws only its last frame: "
            "showing log lines instead (--plain); TTY_COMPATIBLE=1 draws it anyway",
            file=sys.stderr,
        )
        plain = True
    board = Board(duration)
    if plain:
        # Read through ``| head``: once the reader goes away, the demo ends early (its
        # shutdown as usual, unseen).
        lines = StdoutLines(gone=board.end_now)
        lines.addFilter(_not_routine)
        logging.basicConfig(
            handlers=[lines],
            level=logging.INFO,
            format="%(relativeCreated)7.0f ms  %(levelname)-7s %(message)s",
        )
    trio.run(lambda: demo(board, plain=plain, seed=seed))
    if plain:
        print("summary:")
        for label, text in summary(board):
            print(f"  {label:<{_LABEL_WIDTH}} {text}")
    return 0 if board.signal is None else 128 + board.signal
