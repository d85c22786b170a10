"""Shared helpers of the test suite: supervisors, task bodies, specs, event queries.

Test modules import what they need with ``from helpers import ...``: pytest's default
(``prepend``) import mode puts ``tests/`` on ``sys.path`` when it imports a test module
from it, so this works from the repository root and for a single file alike.

Every access to private parts of ``trio_taskvisor`` (private modules and attributes)
lives in the last section of this module, so a change of the core is adapted here, once;
no test module imports ``trio_taskvisor._*`` or touches a private attribute itself.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    EventKind,
    GraceExceededError,
    RejectionKind,
    Subscriber,
    Supervisor,
    SupervisorConfig,
    TaskFailure,
    TaskOutcome,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

__all__ = [
    "ATTEMPT_END_KINDS",
    "ATTEMPT_KINDS",
    "ONE_ATTEMPT_SUCCESS",
    "ROOT",
    "SLOT_TRANSITION",
    "Attempts",
    "Body",
    "Occupancy",
    "Service",
    "SpecRun",
    "async_fn",
    "before_registry_reply",
    "controller_state",
    "deferring",
    "drop",
    "failing",
    "flaky",
    "forever",
    "job",
    "join",
    "kinds_of",
    "nothing",
    "once",
    "otel_backoff_notes",
    "panic_actors",
    "queue",
    "recorder_waiters",
    "rejected",
    "replace",
    "returns_done",
    "run_spec",
    "settle",
    "stall_registry",
    "starts",
    "stubborn",
    "submitted_reasons",
    "supervisor",
    "supervisor_config",
    "sync_fn",
    "trail",
    "winding_down",
    # the slot machine's own names, for test_slots.py (see the last section)
    "ADMIT",
    "DETACH",
    "JOIN",
    "QUEUE_FULL",
    "QUEUE_TIMEOUT",
    "REJECT",
    "REMOVED_FROM_QUEUE",
    "RESOURCE_LIMIT",
    "SHUTTING_DOWN",
    "SLOT_BUSY",
    "STOP",
    "SUBMITTED",
    "SUPERSEDED",
    "TRANSITION",
    "Entry",
    "SlotMachine",
    "Submitted",
    "triples",
    # the pure section 12 rules, for test_policies.py
    "RestartWindow",
    "retry_budget_spent",
    # the pure wait-for graph, for test_waitfor.py
    "Wait",
    "WaitFor",
]

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root directory."""


# -- supervisors ---------------------------------------------------------------------------

_CONTROLLER_FIELDS = frozenset(inspect.signature(ControllerConfig).parameters)


def supervisor_config(**fields: Any) -> SupervisorConfig:
    """A ``SupervisorConfig`` of ``fields``, with ``grace=5`` unless given.

    ``fields`` are ``SupervisorConfig`` fields and, as a shorthand for
    ``controller=ControllerConfig(...)``, ``ControllerConfig`` fields (the controller's
    budgets): ``supervisor_config(max_slot_queue=0)`` has a controller with that budget.
    Without either there is no controller.
    """
    fields.setdefault("grace", 5.0)
    budgets = {name: fields.pop(name) for name in list(fields) if name in _CONTROLLER_FIELDS}
    if budgets:
        if fields.get("controller") is not None:
            raise TypeError("give either controller= or controller budget keywords, not both")
        fields["controller"] = ControllerConfig(**budgets)
    return SupervisorConfig(**fields)


@asynccontextmanager
async def supervisor(
    recorder: EventRecorder | None = None,
    *,
    subscribers: Iterable[Subscriber] = (),
    stuck: tuple[str, ...] = (),
    **fields: Any,
) -> AsyncIterator[Supervisor]:
    """Open a supervisor of ``supervisor_config(**fields)`` (``grace=5`` unless given).

    Its subscribers are ``subscribers`` in order, then ``recorder`` if given.

    ``stuck``: the forced tasks still running when the shutdown's grace passes, which
    leaving the block must report in ``GraceExceededError`` (exactly these names).
    """
    config = supervisor_config(**fields)
    lanes = [*subscribers, *(() if recorder is None else (recorder,))]
    if not stuck:
        async with open_supervisor(config, subscribers=lanes) as sup:
            yield sup
        return
    with pytest.raises(GraceExceededError) as info:
        async with open_supervisor(config, subscribers=lanes) as sup:
            yield sup
    assert info.value.stuck == stuck


class SpecRun(NamedTuple):
    """How one task run by ``run_spec`` ended, how long it took, and its events."""

    outcome: TaskOutcome
    elapsed: float
    recorder: EventRecorder

    def kinds(self) -> list[EventKind]:
        """The kinds of the task's own events (those that name a task), in order."""
        return [e.kind for e in self.recorder.events if e.name is not None]


async def run_spec(spec: TaskSpec, config: SupervisorConfig | None = None) -> SpecRun:
    """Run ``spec`` to its end in a fresh supervisor of ``config`` that records events.

    ``config`` is used as given (``None``: ``SupervisorConfig()``'s defaults). Events are
    read after the block: its shutdown drained the recorder, so every event is in.
    """
    recorder = EventRecorder()
    async with open_supervisor(config, subscribers=[recorder]) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(spec)
        outcome = await waiter.wait()
        elapsed = trio.current_time() - t0
    return SpecRun(outcome, elapsed, recorder)


async def invoke(call: Callable[[Supervisor], Any], sup: Supervisor) -> None:
    """Make the call; await it, or enter it, if that is what it returns."""
    result = call(sup)
    if hasattr(result, "__aenter__"):
        async with result:
            pass
    elif hasattr(result, "__await__"):
        await result


async def settle() -> None:
    """Let every task run until all are blocked (``wait_all_tasks_blocked``)."""
    await trio.testing.wait_all_tasks_blocked()


# -- task bodies ---------------------------------------------------------------------------


async def forever() -> None:
    """Sleep until stopped."""
    await trio.sleep_forever()


async def nothing() -> None:
    """Return at once (``None``)."""


async def returns_done() -> str:
    """Return ``"done"`` at once."""
    return "done"


async def job(seconds: float, value: object = None, log: list[str] | None = None) -> object:
    """Sleep ``seconds`` and return ``value``, logging ``value`` on start if asked."""
    if log is not None:
        log.append(str(value))
    await trio.sleep(seconds)
    return value


async def failing() -> None:
    """Raise ``ValueError("boom")`` at once."""
    raise ValueError("boom")


async def flaky() -> str:
    """Sleep 1 s; fail attempts 1 and 2 with exit code 3, return ``"ok"`` on attempt 3."""
    await trio.sleep(1.0)
    if current_context().attempt < 3:
        raise TaskFailure("not yet", exit_code=3)
    return "ok"


async def deferring(seconds: float) -> str:
    """Run ``seconds`` inside a ``defer_cancel()`` block, then return ``"done"``."""
    with current_context().defer_cancel():
        await trio.sleep(seconds)
    return "done"


async def winding_down(seconds: float) -> None:
    """Finish ``seconds`` of work a stop may not interrupt, then stop at a checkpoint."""
    with current_context().defer_cancel():
        await trio.sleep(seconds)
    await trio.sleep_forever()


async def stubborn(seconds: float) -> None:
    """Ignore every cancellation for ``seconds`` (a shield of its own)."""
    with trio.CancelScope(shield=True):
        await trio.sleep(seconds)


class Body:
    """Sleep ``seconds``, then return ``value``; counts starts and completions."""

    def __init__(self, seconds: float = 1.0, value: object = "ok") -> None:
        self.seconds = seconds
        self.value = value
        self.started = 0
        self.finished = 0

    async def __call__(self) -> object:
        self.started += 1
        await trio.sleep(self.seconds)
        self.finished += 1
        return self.value


class Attempts:
    """Attempt ``n`` sleeps ``plan[n][0]`` seconds, then raises ``plan[n][1]`` if it is an
    exception and returns it otherwise; the last step repeats. Records start times."""

    def __init__(self, *plan: tuple[float, object]) -> None:
        self.plan = plan
        self.starts: list[float] = []

    async def __call__(self) -> object:
        self.starts.append(trio.current_time())
        seconds, step = self.plan[min(len(self.starts), len(self.plan)) - 1]
        await trio.sleep(seconds)
        if isinstance(step, BaseException):
            raise step
        return step


class Occupancy:
    """Counts the bodies running in each slot at once, and the peaks."""

    def __init__(self) -> None:
        self.active: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.total_peak = 0

    async def run(self, seconds: float) -> None:
        slot = current_context().slot
        assert slot is not None
        self.active[slot] += 1
        self.total += 1
        self.peak[slot] = max(self.peak[slot], self.active[slot])
        self.total_peak = max(self.total_peak, self.total)
        try:
            await trio.sleep(seconds)
        finally:
            self.active[slot] -= 1
            self.total -= 1


# Task functions of every shape, for the tests of what a task function may be.


async def async_fn(*args: Any) -> tuple[Any, ...]:
    """Return the arguments it was called with."""
    return args


def sync_fn() -> None:
    """A plain synchronous function: not a task function."""


class Service:
    def sync_method(self) -> None:
        """A synchronous method: not a task function."""

    async def async_method(self, *args: Any) -> tuple[Any, ...]:
        """An async method: a task function; returns its arguments."""
        return args


# -- specs -----------------------------------------------------------------------------------
#
# One signature throughout: the task's name, its function (``forever`` unless given) and
# the function's arguments; controller specs go to slot "k" unless given.


def once(name: str, fn: Callable[..., Any] = forever, *args: Any, **options: Any) -> TaskSpec:
    """``TaskSpec.once(name, fn, *args, **options)``."""
    return TaskSpec.once(name, fn, *args, **options)


def queue(
    name: str,
    fn: Callable[..., Any] = forever,
    *args: Any,
    slot: str = "k",
    wait: bool = False,
    queue_timeout: float | None = None,
) -> ControllerSpec:
    """QUEUE ``once(name, fn, *args)`` in ``slot``."""
    return ControllerSpec.queue(
        once(name, fn, *args), slot=slot, wait=wait, queue_timeout=queue_timeout
    )


def replace(
    name: str,
    fn: Callable[..., Any] = forever,
    *args: Any,
    slot: str = "k",
    wait: bool = False,
    queue_timeout: float | None = None,
) -> ControllerSpec:
    """REPLACE with ``once(name, fn, *args)`` in ``slot``."""
    return ControllerSpec.replace(
        once(name, fn, *args), slot=slot, wait=wait, queue_timeout=queue_timeout
    )


def drop(
    name: str, fn: Callable[..., Any] = forever, *args: Any, slot: str = "k"
) -> ControllerSpec:
    """DROP_IF_RUNNING ``once(name, fn, *args)`` in ``slot``."""
    return ControllerSpec.drop_if_running(once(name, fn, *args), slot=slot)


def join(
    name: str, fn: Callable[..., Any] = forever, *args: Any, slot: str = "k"
) -> ControllerSpec:
    """JOIN ``slot``, with ``once(name, fn, *args)`` as the work to run if it is idle."""
    return ControllerSpec.join(once(name, fn, *args), slot=slot)


# -- events ------------------------------------------------------------------------------------

SLOT_TRANSITION = EventKind.CONTROLLER_SLOT_TRANSITION

ATTEMPT_END_KINDS = (
    EventKind.ATTEMPT_SUCCEEDED,
    EventKind.ATTEMPT_FAILED,
    EventKind.ATTEMPT_TIMED_OUT,
    EventKind.ATTEMPT_CANCELLED,
)
ATTEMPT_KINDS = (EventKind.ATTEMPT_STARTING, *ATTEMPT_END_KINDS)

ONE_ATTEMPT_SUCCESS = [
    EventKind.TASK_ADD_REQUESTED,
    EventKind.TASK_ADDED,
    EventKind.ATTEMPT_STARTING,
    EventKind.ATTEMPT_SUCCEEDED,
    EventKind.TASK_FINISHED,
    EventKind.TASK_REMOVED,
]
"""The events of a task that succeeds in its first attempt, in order."""


def kinds_of(recorder: EventRecorder, name: str) -> list[EventKind]:
    """The kinds of the events naming task ``name``, in order."""
    return [e.kind for e in recorder.events if e.name == name]


def trail(recorder: EventRecorder, waiter: TaskWaiter, *, attempts: bool = True) -> list[str]:
    """One task's events in order: kind names, and slot transitions by their reason."""
    return [
        str(e.reason) if e.kind is SLOT_TRANSITION else e.kind.name
        for e in recorder.events
        if e.task_id == waiter.id and (attempts or e.kind not in ATTEMPT_KINDS)
    ]


def starts(recorder: EventRecorder, task: TaskWaiter | str) -> list[float]:
    """Times of the ``ATTEMPT_STARTING`` events of one task (its waiter, or its name)."""
    if isinstance(task, str):
        return [e.time for e in recorder.of(EventKind.ATTEMPT_STARTING, name=task)]
    return [e.time for e in recorder.of(EventKind.ATTEMPT_STARTING, task_id=task.id)]


def submitted_reasons(recorder: EventRecorder, waiter: TaskWaiter) -> list[str | None]:
    """The reasons of one submission's ``CONTROLLER_SUBMITTED`` events, in order."""
    return [e.reason for e in recorder.of(EventKind.CONTROLLER_SUBMITTED, task_id=waiter.id)]


# -- internals ---------------------------------------------------------------------------------
#
# Everything below reaches into private parts of trio_taskvisor. Keep it here.

from trio_taskvisor import _inbox  # noqa: E402
from trio_taskvisor._outcome import rejected_outcome  # noqa: E402

# The pure restart-intensity window and budget rule, tested directly by test_policies.py.
from trio_taskvisor._policies import RestartWindow, retry_budget_spent  # noqa: E402

# The pure slot machine, tested directly (and only) by test_slots.py.
from trio_taskvisor._slots import (  # noqa: E402
    Admit,
    Detach,
    Effect,
    Entry,
    Join,
    Reject,
    SlotMachine,
    Stop,
    Submitted,
    Transition,
)

# The machine's effects as (tag, entry, argument) triples, which test_slots.py compares.
ADMIT = "admit"
STOP = "stop"
REJECT = "reject"
JOIN = "join"
DETACH = "detach"
SUBMITTED = "submitted"
TRANSITION = "transition"
SLOT_BUSY = RejectionKind.SLOT_BUSY
QUEUE_FULL = RejectionKind.QUEUE_FULL
SUPERSEDED = RejectionKind.SUPERSEDED
REMOVED_FROM_QUEUE = RejectionKind.REMOVED_FROM_QUEUE
SHUTTING_DOWN = RejectionKind.SHUTTING_DOWN
RESOURCE_LIMIT = RejectionKind.RESOURCE_LIMIT
QUEUE_TIMEOUT = RejectionKind.QUEUE_TIMEOUT


# The pure wait-for cycle search, tested directly (and only) by test_waitfor.py.
from trio_taskvisor._waitfor import Wait, WaitFor  # noqa: E402


def triples(effects: list[Effect[Any]]) -> list[tuple[str, Entry[Any], Any]]:
    """The machine's typed effects as (tag, entry, argument) triples."""
    out: list[tuple[str, Entry[Any], Any]] = []
    for effect in effects:
        match effect:
            case Admit(entry):
                out.append((ADMIT, entry, None))
            case Stop(entry):
                out.append((STOP, entry, None))
            case Reject(entry, kind):
                out.append((REJECT, entry, kind))
            case Detach(entry, kind):
                out.append((DETACH, entry, kind))
            case Join(entry, target):
                out.append((JOIN, entry, target))
            case Submitted(entry, reason):
                out.append((SUBMITTED, entry, reason))
            case Transition(entry, reason):
                out.append((TRANSITION, entry, reason))
    return out


def rejected(kind: RejectionKind) -> TaskOutcome:
    """The outcome of work rejected with ``kind``, reason text included.

    The reason texts are not public, so this is built by the library's own function.
    """
    return rejected_outcome(kind)


def stall_registry(sup: Supervisor) -> None:
    """Keep controller admissions ADMITTING until the registry's loop takes them.

    When the registry is idle, the controller admits an owner directly (nothing is
    queued before it) and the owner is RUNNING at once. Reporting the registry as busy
    makes the controller queue every admission behind the registry's channel, as it
    does under load, so the owner stays ADMITTING while the controller takes the next
    buffered submission in.
    """
    registry = sup._registry  # pyright: ignore[reportPrivateUsage]

    class Stalled:
        """The registry's inbox, reporting itself busy."""

        def __init__(self, inbox: Any) -> None:
            self._inbox = inbox

        def idle(self) -> bool:
            return False

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inbox, name)

    registry._inbox = Stalled(registry._inbox)  # pyright: ignore[reportPrivateUsage]


def controller_state(sup: Supervisor) -> Any:
    """The controller's slot machine: its ``slots``, ``queued``, ``held``, ``joiners``
    and ``pending`` are the whole of the controller's per-slot state."""
    controller = sup._controller  # pyright: ignore[reportPrivateUsage]
    assert controller is not None
    return controller.machine


def panic_actors(sup: Supervisor) -> None:
    """Cancel the registry's actor nursery: the internal fault that ends tasks PANICKED.

    The registry's loop runs in that nursery too, so the supervisor then fails as a
    whole when it shuts down (an internal fault is never swallowed).
    """
    nursery = sup._registry._nursery  # pyright: ignore[reportPrivateUsage]
    assert nursery is not None
    nursery.cancel_scope.cancel(reason="a test's internal fault")


def otel_backoff_notes() -> Sequence[object]:
    """The ``BACKOFF_SCHEDULED`` notes ``TracingSubscriber`` keeps, by ``TaskId``."""
    from trio_taskvisor.contrib import otel  # needs the otel extra: imported on use

    return list(otel._backoffs)  # pyright: ignore[reportPrivateUsage]


def recorder_waiters(recorder: EventRecorder) -> Sequence[object]:
    """The ``wait_for`` calls an ``EventRecorder`` has pending."""
    return recorder._waiters  # pyright: ignore[reportPrivateUsage]


def before_registry_reply(monkeypatch: pytest.MonkeyPatch, hook: Callable[[], object]) -> None:
    """Call ``hook()`` each time a caller starts waiting for the registry's reply.

    The caller's command is on the registry's channel by then, and the registry has not
    answered yet. ``monkeypatch.undo()`` ends it.
    """
    original = _inbox.Reply.wait

    async def wait(self: _inbox.Reply[Any]) -> object:
        hook()
        return await original(self)

    monkeypatch.setattr(_inbox.Reply, "wait", wait)
