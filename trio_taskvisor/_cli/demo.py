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
and attempt, slots with status and queue depth, outcome counters and recent events; a
summary ends the run. ``--plain`` logs one line per event instead (``LoggingSubscriber``)
and is chosen automatically when stdout is not a terminal or ``rich`` is missing.
Ctrl+C ends the run early, with the same graceful shutdown.

Outcome counts in the summary come from the waiters (reliable); attempt counters and
recent events come from a subscriber (best-effort, like every event).
"""

from __future__ import annotations

import collections
import logging
import math
import random
import signal
import sys
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
    RejectionKind,
    SlotStatus,
    Supervisor,
    SupervisorConfig,
    TaskEvent,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
)

if TYPE_CHECKING:
    from rich.console import RenderableType

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
        # From events (best-effort).
        self.attempts: collections.Counter[EventKind] = collections.Counter()
        self.finished: collections.Counter[OutcomeKind] = collections.Counter()
        self.rejected: collections.Counter[RejectionKind] = collections.Counter()
        self.replaced_running = 0
        self.replaced: set[str] = set()
        self.recent: collections.deque[Recent] = collections.deque(maxlen=20)
        self.notes: dict[str, str] = {}
        # From the scenario.
        self.waiters: list[TaskWaiter] = []
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
        self.interrupted = False
        self.ran = 0.0
        self.grace_error: GraceExceededError | None = None

    def elapsed(self) -> float:
        return trio.current_time() - self.t0

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
        elif kind is EventKind.ATTEMPT_SUCCEEDED:
            self.attempts[kind] += 1
            took = f" in {event.duration:.2f} s" if event.duration is not None else ""
            self.note(name, f"ok{took}")
        elif kind is EventKind.ATTEMPT_FAILED:
            self.attempts[kind] += 1
            self.note(name, f"failed: {event.reason}")
        elif kind is EventKind.ATTEMPT_TIMED_OUT:
            self.attempts[kind] += 1
            text = f"attempt {event.attempt} overran its {event.timeout:g} s timeout"
            self.note(name, "timed out")
        elif kind is EventKind.ATTEMPT_CANCELLED:
            self.attempts[kind] += 1
            text = f"attempt {event.attempt}"
        elif kind is EventKind.BACKOFF_SCHEDULED:
            delay = event.delay or 0.0
            if event.backoff_source is BackoffSource.SUCCESS:
                self.note(name, f"next run in {delay:.1f} s")
                return
            text = f"retry in {delay:.2f} s after: {event.reason}"
            self.note(name, f"retry in {delay:.2f} s: {event.reason}")
        elif kind is EventKind.TASK_REMOVE_REQUESTED:
            replaced = name in self.replaced
            self.note(name, "replaced: finishing its page" if replaced else "stop requested")
        elif kind is EventKind.TASK_FINISHED and event.outcome is not None:
            self.finished[event.outcome] += 1
            style = _OUTCOME_STYLES[event.outcome]
            text = event.outcome.value + (f": {event.reason}" if event.reason else "")
        elif kind is EventKind.CONTROLLER_REJECTED and event.rejection is not None:
            self.rejected[event.rejection] += 1
            text = f"{event.rejection.value} in {event.slot}"
        elif kind is EventKind.CONTROLLER_SLOT_TRANSITION:
            if event.reason not in ("running->terminating", "admitting->terminating"):
                return
            if self.phase == "running":
                self.replaced_running += 1
            self.replaced.add(name)
            text = f"{event.slot} {event.reason}"
        elif kind in (EventKind.GRACE_EXCEEDED, EventKind.SUBSCRIBER_FAILED):
            text = event.reason or ""
        elif kind is EventKind.SUBSCRIBER_OVERFLOW:
            text = f"dropped {event.dropped}"
        if kind not in _QUIET:
            when = event.time - self.t0
            self.recent.append(Recent(when, kind.value, name, text, style))


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
            await trio.sleep(seconds)  # longer than the grace window: forced at its end

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

    async def operator(self, spec: TaskSpec, waiter: TaskWaiter) -> None:
        """Add ``spec`` again 2 s after it gives up, like an on-call engineer would."""
        while True:
            outcome = await waiter.wait()
            self.board.gave_up.append(outcome.reason or outcome.kind.value)
            self.board.say(spec.name, "gave up; the operator adds it again in 2 s")
            await trio.sleep(2.0)
            waiter = await self.sup.add(spec)
            self.board.waiters.append(waiter)
            self.board.say(spec.name, f"added again as {waiter.id}")

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


async def _wait_for_ctrl_c(board: Board, run_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            board.interrupted = True
            run_scope.cancel(reason="Ctrl+C")
            return


async def _supervise(board: Board, seed: int | None, plain: bool) -> None:
    rng = random.Random(seed)
    config = SupervisorConfig(
        grace=GRACE,
        controller=ControllerConfig(max_slot_queue=4),
        random=random.Random(rng.random()),
    )
    subscribers: list[Board | LoggingSubscriber] = [board]
    if plain:
        subscribers.append(LoggingSubscriber())
    board.t0 = trio.current_time()
    try:
        async with open_supervisor(config, subscribers=subscribers) as sup:
            board.sup = sup
            board.phase = "running"
            scenario = Scenario(sup, board, rng)
            async with trio.open_nursery() as app:
                app.cancel_scope.deadline = board.t0 + board.duration
                app.start_soon(_wait_for_ctrl_c, board, app.cancel_scope)
                await scenario.start(app)
            board.ran = board.elapsed()
            # The application has stopped using the supervisor: leaving the block shuts
            # it down, and the stubborn audit writer holds out past the grace window.
            board.phase = "shutting down"
            board.stop_deadline = trio.current_time() + GRACE
    except GraceExceededError as exc:
        board.grace_error = exc
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
            _counts(board.finished) or "none yet",
        )


def _by_value(item: tuple[TaskState, int]) -> str:
    return item[0].value


def _counts(counter: collections.Counter[OutcomeKind] | collections.Counter[RejectionKind]) -> str:
    return ", ".join(f"{kind.value} {n}" for kind, n in counter.most_common())


async def _run_plain(board: Board, seed: int | None) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_plain_status, board)
        await _supervise(board, seed, plain=True)
        nursery.cancel_scope.cancel(reason="the demo ended")


async def _run_live(board: Board, seed: int | None) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console()

    def frame() -> RenderableType:
        return _frame(board, console.size.height)

    with Live(frame(), console=console, auto_refresh=False) as live:
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


# -- the live view ----------------------------------------------------------------------------


def _frame(board: Board, height: int) -> RenderableType:
    """One frame of the live view, fitted to a terminal ``height`` lines high."""
    from rich.console import Group
    from rich.table import Table

    body = Table.grid(expand=True, padding=(0, 1))
    body.add_column(ratio=5)
    body.add_column(ratio=4)
    body.add_row(_tasks_panel(board), Group(_slots_panel(board), _counters_panel(board)))
    recent = max(4, min(16, height - 3 - _BODY_HEIGHT - 2))
    return Group(_header(board), body, _recent_panel(board, recent))


_BODY_HEIGHT: Final = 19  # the task panel; slots (8) and counters (11) beside it


def _header(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.text import Text

    elapsed = min(board.elapsed(), board.duration) if board.sup is not None else 0.0
    if board.phase != "running":
        elapsed = board.ran
    width = 30
    done = round(width * elapsed / board.duration)
    line = Text()
    line.append("█" * done, style="green")
    line.append("░" * (width - done), style="dim")
    line.append(f"  {elapsed:5.1f} s / {board.duration:g} s   ")
    if board.phase == "running":
        line.append("running", style="bold green")
        line.append("   Ctrl+C: shut down now", style="dim")
    elif board.phase == "shutting down":
        left = max(0.0, board.stop_deadline - trio.current_time())
        line.append("shutting down", style="bold yellow")
        line.append(f"   grace {GRACE:g} s: stragglers are forced in {left:.1f} s")
    else:
        line.append(board.phase, style="bold")
    return Panel(line, title="[bold]trio_taskvisor demo[/]", title_align="left")


def _tasks_panel(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(expand=True, box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("task", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("note", no_wrap=True, overflow="ellipsis", ratio=1)
    infos = board.sup.list() if board.sup is not None else ()
    listed = {info.name for info in infos}
    forced = [n for n in board.sup.alive_snapshot() if n not in listed] if board.sup else []
    room = _BODY_HEIGHT - 3 - len(forced)  # borders and header
    shown = infos if len(infos) <= room else infos[: room - 1]
    for info in shown:
        table.add_row(
            str(info.id),
            info.name,
            Text(info.state.value, style=_STATE_STYLES[info.state]),
            str(info.attempt),
            Text(board.notes.get(info.name, ""), style="dim"),
        )
    for name in forced:  # force-aborted and still running: not listed, still alive
        table.add_row("", name, Text("forced", style="bold red"), "", "still running")
    if len(shown) < len(infos):
        table.add_row("", Text(f"+{len(infos) - len(shown)} more", style="dim"), "", "", "")
    if not infos and not forced:
        table.add_row("", Text("no task registered", style="dim"), "", "", "")
    title = f"tasks ({len(infos)} registered)"
    return Panel(table, title=title, title_align="left", height=_BODY_HEIGHT)


def _slots_panel(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(expand=True, box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    table.add_column("slot", no_wrap=True, overflow="ellipsis", ratio=1)
    table.add_column("status", no_wrap=True)
    table.add_column("owner", justify="right", no_wrap=True)
    table.add_column("queue", justify="right", no_wrap=True)
    table.add_column("for", justify="right", no_wrap=True)
    slots = board.sup.controller_snapshot().slots if board.sup is not None else ()
    for view in slots:
        status = Text(view.status.value, style=_SLOT_STYLES[view.status])
        table.add_row(
            view.slot, status, str(view.owner_id), str(view.queue_depth), f"{view.status_for:.1f}s"
        )
    if not slots:
        table.add_row(Text("no busy slot", style="dim"), "", "", "", "")
    return Panel(table, title=f"slots ({len(slots)} live)", title_align="left", height=8)


def _counters_panel(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    none_yet = Text("none yet", style="dim")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    attempts = board.attempts
    grid.add_row(
        "attempts",
        f"{attempts[EventKind.ATTEMPT_STARTING]} started · "
        f"{attempts[EventKind.ATTEMPT_SUCCEEDED]} ok · "
        f"{attempts[EventKind.ATTEMPT_FAILED]} failed",
    )
    grid.add_row("timed out", str(attempts[EventKind.ATTEMPT_TIMED_OUT]))
    outcomes = Text()
    for kind, n in board.finished.most_common():
        if outcomes:
            outcomes.append(" · ")
        outcomes.append(f"{kind.value} {n}", style=_OUTCOME_STYLES[kind])
    grid.add_row("finished", outcomes or none_yet)
    rejected = " · ".join(f"{kind.value} {n}" for kind, n in board.rejected.most_common())
    grid.add_row("rejected", Text(rejected, style="magenta") if rejected else none_yet)
    grid.add_row(
        "revisions", " · ".join(f"{t} {board.landed[t]}/{board.revisions[t]}" for t in TENANTS)
    )
    grid.add_row("", Text(f"landed/announced; {board.replaced_running} replaced", style="dim"))
    grid.add_row(
        "cache",
        f"{board.cache_reads} reads · {board.cache_stale} stale · "
        f"{board.cache_refreshes} refreshed",
    )
    if board.sup is not None:
        stats = board.sup.statistics()
        grid.add_row(
            "events", f"{stats.events_published} published · {stats.events_dropped} dropped"
        )
    return Panel(grid, title="counters", title_align="left", height=_BODY_HEIGHT - 8)


def _recent_panel(board: Board, height: int) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(justify="right", style="dim", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for item in list(board.recent)[-(height - 2) :]:
        table.add_row(f"{item.when:.2f}s", Text(item.label, style=item.style), item.name, item.text)
    return Panel(table, title="recent events", title_align="left", height=height)


def _summary_panel(board: Board) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, text in summary(board):
        grid.add_row(label, text)
    return Panel(grid, title="[bold]summary[/]", title_align="left")


# -- the summary ------------------------------------------------------------------------------


def _n(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


def summary(board: Board) -> list[tuple[str, str]]:
    """What happened, as (label, text) rows; outcomes come from the waiters."""
    outcomes: collections.Counter[OutcomeKind] = collections.Counter()
    rejections: collections.Counter[RejectionKind] = collections.Counter()
    for waiter in board.waiters:
        try:
            outcome = waiter.outcome_nowait()
        except trio.WouldBlock:  # pragma: no cover - every waiter resolves by shutdown
            continue
        outcomes[outcome.kind] += 1
        if outcome.rejection is not None:
            rejections[outcome.rejection] += 1
    how = "stopped early by Ctrl+C" if board.interrupted else "then a graceful shutdown"
    rows = [("run", f"{board.ran:.1f} s, {how} (grace {GRACE:g} s)")]
    rows.append(("outcomes", f"{_n(len(board.waiters), 'task')}: {_counts(outcomes)}"))
    if rejections:
        rows.append(("rejections", _counts(rejections)))
    attempts = board.attempts
    rows.append(
        (
            "attempts",
            f"{attempts[EventKind.ATTEMPT_STARTING]} started, "
            f"{attempts[EventKind.ATTEMPT_SUCCEEDED]} succeeded, "
            f"{attempts[EventKind.ATTEMPT_FAILED]} failed, "
            f"{attempts[EventKind.ATTEMPT_TIMED_OUT]} timed out, "
            f"{attempts[EventKind.ATTEMPT_CANCELLED]} cancelled",
        )
    )
    polls = ", ".join(f"{feed} {board.polls[feed]}" for feed, _ in POLLERS)
    if board.gave_up:
        times = "once" if len(board.gave_up) == 1 else f"{len(board.gave_up)} times"
        polls += f"; poll-legacy-erp gave up {times} ({board.gave_up[0]}) and was added again"
    rows.append(("pollers", f"batches polled: {polls}"))
    tenants = ", ".join(f"{t} r{board.landed[t]} of r{board.revisions[t]}" for t in TENANTS)
    rows.append(
        (
            "tenants",
            f"newest revision landed: {tenants}; "
            f"{_n(board.replaced_running, 'running sync')} replaced, "
            f"{rejections[RejectionKind.SUPERSEDED]} superseded while waiting for the slot",
        )
    )
    rows.append(
        (
            "cache",
            f"{_n(board.cache_reads, 'read')}; {_n(board.cache_stale, 'stale read')} shared "
            f"{_n(board.cache_refreshes, 'completed refresh', 'completed refreshes')} "
            "(single-flight JOIN)",
        )
    )
    rows.append(
        (
            "periodic",
            f"compact-db: {_n(board.compactions, 'run')}, "
            f"{attempts[EventKind.ATTEMPT_TIMED_OUT]} overran the 1 s timeout and ran again",
        )
    )
    if board.grace_error is not None:
        stuck = ", ".join(board.grace_error.stuck)
        rows.append(
            (
                "shutdown",
                f"GraceExceededError, as expected: {stuck} force-aborted after the "
                f"{GRACE:g} s grace (its flush outlasts it); everything else stopped in time",
            )
        )
    else:
        rows.append(("shutdown", "every task stopped within the grace window"))
    if board.sup is not None:
        stats = board.sup.statistics()
        rows.append(
            ("events", f"{stats.events_published} published, {stats.events_dropped} dropped")
        )
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


async def demo(*, duration: float = 20.0, plain: bool = False, seed: int | None = None) -> Board:
    """Run the demo for ``duration`` seconds and return its board (for the summary)."""
    board = Board(duration)
    if plain:
        await _run_plain(board, seed)
    else:
        await _run_live(board, seed)
    return board


def main(*, duration: float = 20.0, plain: bool | None = None, seed: int | None = None) -> int:
    """Run the demo; ``plain=None`` picks the live view on a terminal. The exit status."""
    if plain is None:
        plain = not sys.stdout.isatty()
    if not plain and not _live_available():
        print(
            "rich is not installed: showing log lines instead of the live view "
            "(pip install 'trio_taskvisor[demo]')",
            file=sys.stderr,
        )
        plain = True
    if plain:
        logging.basicConfig(
            stream=sys.stdout,
            level=logging.INFO,
            format="%(relativeCreated)7.0f ms  %(levelname)-7s %(message)s",
        )
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_routine)
    board = trio.run(lambda: demo(duration=duration, plain=plain, seed=seed))
    if plain:
        print("summary:")
        for label, text in summary(board):
            print(f"  {label:<10} {text}")
    return 0
