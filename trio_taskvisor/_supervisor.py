"""``open_supervisor``, ``run`` and the ``Supervisor`` they hand out: the composition root.

The ``Supervisor`` builds and wires everything below it (bus, registry, controller,
shutdown) and is the only module that knows them all; each call goes one way down:
the facade checks intake and builds the record, then the controller (controller work)
or the registry takes it, each through its own non-blocking core.

Nursery tree of one supervisor::

    open_supervisor's nursery          (the body runs here)
     └── background, shielded          (cancelled only by its own end)
          ├── registry loop            (+ its actor nursery)
          ├── controller loop          (with a ControllerConfig)
          ├── event fan-out            (+ one lane per subscriber)
          └── shutdown workflow        (once started)

Every waiter gets the supervisor's ``WaitChecker`` (``_waits``) as its wait guard: waits
made inside attempts raise ``DeadlockError`` when they close a wait-for cycle.

The background runs shielded so that, when the scope around ``open_supervisor`` is
cancelled, the graceful shutdown still gets its grace window; it ends by itself once
the shutdown has seen every actor exit and the subscribers drained.

Decisions the design leaves open:

* A task that raises a non-task ``BaseException`` (``KeyboardInterrupt``) starts the
  shutdown (publishing ``SHUTDOWN_REQUESTED``) and cancels the body; after the
  shutdown the exception propagates bare from ``open_supervisor`` / ``run``, with the
  body's own exception, if any, as its context. Only the first such exception
  propagates; one raised later (during that shutdown) is logged at ERROR with its
  traceback. A subscriber's ``on_event`` raising one is treated the same way.
* ``handle_signals=True`` (``open_supervisor`` and ``run``): one
  signal receiver for SIGINT and SIGTERM lives from the start of the block until its
  shutdown is done, watched by a task of its own, shielded. The first signal starts the
  graceful shutdown and cancels the body; a body that then ends only by that
  cancellation counts as a normal exit. A signal while a shutdown is running forces
  every remaining task at once (``Registry.force_all``); once no task is left, one
  while the slot store's last round trip is awaited (up to ``connect_timeout``, for
  the owners' releases) ends that wait (before, Ctrl+C on a store that does not
  answer waited it out): what was not given back expires by its lease, as after a
  crash, with a WARNING. A signal that forces tasks does not cut it: their releases,
  sent as they exit, hand their slots over at once on a server that answers. In the
  same way a signal during the subscribers' drain ends it, dropping what they have
  left, as its deadline does (before, it changed nothing: the shutdown waited for
  ``subscriber_shutdown_timeout``); one before the drain does not shorten it, so the
  subscribers still get the forced tasks' last events. Signals
  that arrive once the shutdown is done (before the block is left) are dropped; after
  the block, the process's previous handlers are back. (Before, trio raised such a
  signal again as its receiver closed: SIGTERM ended a process that was leaving
  cleanly, SIGINT raised ``KeyboardInterrupt``. Its receiver now lies over handlers
  that drop them, put back once what it had queued is delivered.) Every signal counts:
  two that come before the watcher reads the first (a second Ctrl+C while the loop was
  busy, or two in one instant) are two, the second forcing the shutdown the first
  began. (trio's receiver merges a signal that comes again before it was read: the
  second was lost, and the shutdown waited out its grace.)
* ``handle_signals=True`` enters trio's signal receiver before the background starts,
  so that outside the main thread trio's ``RuntimeError`` comes at once (entered
  later, it left a started background waiting for a shutdown nothing began).
* One supervisor of a trio run handles signals at a time: a second
  ``handle_signals=True`` while one is open, nested or beside it, raises
  ``ConfigError`` before anything starts. Python keeps one handler per signal, so
  only the receiver opened last would get SIGTERM: before, the other supervisor (the
  outer one of two nested) went on running through the SIGTERM meant to stop the
  process, and one closing first put the process's default handler back under the
  other.
* A signal while the background starts: reaching the slot store
  (up to ``connect_timeout``) is cut short at once, no block runs, and the signal is
  raised again once the previous handlers are back (``signal.raise_signal``), as if
  the supervisor had never had it: SIGTERM's default ends the process, trio's SIGINT
  handler raises ``KeyboardInterrupt``; after a handler that returns,
  ``SlotStoreUnavailableError`` names the signal. A signal that comes once the store
  answered, before the block, starts the shutdown as in the block: the body is
  cancelled at its first checkpoint. (Before, the signal waited in the receiver until
  the store answered or ``connect_timeout`` passed; a store that failed then had the
  signal redelivered by trio, with the error never shown.)
* A cancellation of ``open_supervisor``'s caller while the background starts cuts
  reaching the slot store short, as a signal does: nothing runs, and
  the caller's ``Cancelled`` propagates. The background is shielded (for the
  shutdown), so before, the start went on for up to ``connect_timeout``. Without a
  slot store (or once the store answered) the start is instant: it completes, the body
  is entered, and the cancellation reaches it at its first checkpoint, as a nursery's
  body does; then the shutdown runs as for any cancelled body. Before, such a start
  waited for ever (Ctrl+C and SIGTERM too): trio ignores ``started()`` under a
  cancelled ``start``, and leaves the task, shielded, in the start's own nursery.
* Critical tasks: only the first critical failure escalates (a later one, during the
  shutdown it began, is logged as any failure). A crash (a task's non-task
  ``BaseException``) still wins over ``CriticalTaskError``. ``CriticalTaskError`` raised
  after a body exception of a later instant has that exception as its ``__cause__``.
  The "shutting down" record is written whatever ``log_failures`` says: it explains
  why the service stops.
* ``start()`` / ``start_in_slot()``: cancelling the caller while it waits for readiness
  (or while its add waits for the registry) stops the task, shielded, for at most the
  grace window (``cancel``), then ``Cancelled`` propagates; a rejection (duplicate name,
  limit, closed) raises as ``add`` does and stops nothing. ``start_in_slot`` with
  ``JOIN`` is a ``TypeError``: a joiner starts no work of its own to wait for.
* ``log_failures`` is off when any subscriber is a ``LoggingSubscriber`` (or subclass):
  that subscriber already logs every failure.
* Automatic names (a spec with ``name=None``, every keyed call): ``f"{qualname}{id}"``,
  reserving no name (see ``_spec``).
* A target that is neither a ``str`` nor an ``int`` raises ``TypeError``.
* A slot store in a ``trio.run`` whose ``MockClock`` does not run at real speed (rate
  other than 1, or autojump) is a ``ConfigError`` at ``open_supervisor``, before
  anything starts (not only in the cluster tests, which use the real clock): its
  server expires leases in real time, which the keeper counts on this run's clock.
* ``wait_idle()`` inside an attempt of the same supervisor (or a task spawned in one)
  raises ``DeadlockError`` at once (it is not among the waits on other work that the
  cycle rule covers, docs/concepts.md): the caller's own task is alive until the call
  returns, so it could never return. Before, it waited for ever.
* ``shutdown()`` in a subscriber's ``on_event`` (or a task spawned there) starts the
  shutdown and raises ``DeadlockError`` at once: the shutdown's
  drain waits for that ``on_event`` to return. Before, it waited until the drain
  deadline (``subscriber_shutdown_timeout``) cancelled it, and the subscriber lost
  every later event. The shutdown begins, as the caller asked; only the wait is
  refused.
* ``shutdown()`` inside an attempt of the same supervisor (or a task spawned in one)
  begins the shutdown and waits until it asks the caller's task to stop: the stop's
  ``Cancelled`` ends the call as before, and a shielded scope, which the stop cannot
  reach (a ``defer_cancel()`` block too), gets ``DeadlockError`` then (the task ends
  ``CANCELLED``, being stopped). The call can never return: the shutdown ends only once
  the task has. Before, a shielded caller and the shutdown waited for each other for
  ever, and one in a ``defer_cancel()`` block until the grace deadline forced it.
* ``cancel()`` of the caller's own task (inside an attempt of it, or a task spawned in
  one) requests the stop and, as ``shutdown()`` does, raises ``DeadlockError`` in a
  shielded scope (a ``defer_cancel()`` block too) instead of waiting: the outcome it
  would wait for comes once the task has ended. Outside one, the stop's ``Cancelled``
  ends the call. Both share ``WaitChecker.refuse_self_wait``. Before, a shielded call
  waited until the grace deadline forced the task (returning ``True``, the task
  ``FORCE_ABORTED`` and still running), and one in a ``defer_cancel()`` block was
  cancelled by that force. ``remove()`` waits for nothing and returns as for any task;
  ``cancel_slot()`` of the caller's own slot raises ``DeadlockError`` before it stops
  anything, as documented. A REPLACE of the caller's own slot awaited by the caller is
  a self-wait of the wait guard (``_waits``): ``run_in_slot`` withdraws its work on that
  ``DeadlockError`` (or the stop's ``Cancelled``), as on any failure of its wait.
* A ``limited()`` block of a task outside the supervisor (another nursery) that still
  holds cluster units when the shutdown ends, its keeper stopped, has them lost:
  ``LeaseLostError`` is raised into it, its reason ending "(the supervisor's shutdown
  ended during the block)". Nothing renews the units from then on, so another process
  takes them once their lease expires; before, the block ran on meanwhile, and a pool
  of capacity 1 was held twice. The units are not released (the block may still be
  running until its next checkpoint): they expire, as a forced owner's lease does.
  Without a slot store such a block runs on (the pools die with the supervisor).
* Every method that reads or changes the supervisor's state belongs to the thread of
  its trio run (not only the intake of work): intake, ``prepare_submission``,
  the waits, and the reads (``list``, ``alive_snapshot``, ``is_alive``,
  ``statistics``, ``controller_snapshot``, ``limit_snapshot``) raise ``RuntimeError``
  in another thread, naming the call and its way through ``trio.from_thread``. A read
  there saw the state while this thread changed it (``statistics()`` now and then
  raised "dictionary changed size during iteration").
* With a slot store, slots, limit names and limit keys that the server cannot be sent
  (a ``str`` that does not encode as UTF-8) raise ``ConfigError`` at the call that
  brings them (``_config.check_sendable``), not in the keeper's round trip, which every
  caller shares.
"""

from __future__ import annotations

import builtins
import logging
import math
import signal
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, TypeVarTuple, cast, final

import attrs
import trio

from ._bus import EventBus, Subscriber
from ._config import RedisSlotStore, SupervisorConfig, check_capacity, check_sendable
from ._controller import Controller, ControllerSnapshot, LeaseKeeperSeam
from ._events import TaskEvent
from ._exceptions import (
    ConfigError,
    CriticalTaskError,
    DeadlockError,
    LeaseLostError,
    NoControllerError,
    SlotStoreUnavailableError,
    split_cancelled,
)
from ._limits import (
    ClusterLimitInfo,
    LimitView,
    Pool,
    PoolId,
    RateLimit,
    check_limits,
    is_concurrency,
    pool_label,
    pool_parts,
)
from ._logging import LoggingSubscriber, log
from ._outcome import OutcomeError, OutcomeKind, TaskId, TaskOutcome, allocate_id
from ._record import TaskRecord, current_task_context
from ._registry import Registry, TaskInfo
from ._shutdown import Shutdown
from ._slots import Entry
from ._slotstore import ClusterSlotInfo, ReportSink, new_instance_id
from ._spec import (
    AdmissionPolicy,
    ControllerSpec,
    Resolver,
    TaskSpec,
    auto_name,
    not_a,
    one_attempt,
)
from ._waiter import TaskWaiter
from ._waits import WaitChecker

if TYPE_CHECKING:
    from ._keeper import LeaseKeeper

# The concurrency pools held by the enclosing ``limited`` blocks of a task, each with its
# supervisor (pools are a supervisor's own), and that task: a context is copied into the
# tasks it spawns (a nursery's children, supervised work added in a block), which hold
# none of them.
_held_pools: ContextVar[tuple[trio.lowlevel.Task | None, frozenset[tuple[object, PoolId]]]] = (
    ContextVar("_held_pools", default=(None, frozenset()))
)
# Whether a supervisor's block of this run handles signals (``handle_signals=True``).
_signals_handled: trio.lowlevel.RunVar[bool] = trio.lowlevel.RunVar(
    "taskvisor_signals", default=False
)
T = TypeVar("T")
_Exit = TypeVar("_Exit", bound=bool | None)  # what a context manager's __aexit__ returns
T_co = TypeVar("T_co", covariant=True)
Ts = TypeVarTuple("Ts")
_CRITICAL_KINDS = (OutcomeKind.FAILED, OutcomeKind.FATAL, OutcomeKind.PANICKED)


class _StartCancelled(Exception):
    """The background's start was cut short by its caller's cancellation (the relay):
    raised by ``_run_background`` to ``_lifetime``, which delivers that cancellation."""


@attrs.frozen
class SupervisorStatistics:
    """Counters of one supervisor at one instant."""

    registered: int
    """Registered and stopping tasks whose outcome is not yet committed (``list()``)."""
    running_attempts: int
    """Attempts in progress, force-aborted ones that have not exited included."""
    alive: int
    """Tasks with an attempt physically in progress (``alive_snapshot()``)."""
    waiting_for_permit: int
    """Tasks waiting for a ``max_concurrent`` permit."""
    events_published: int
    """Events published since the start; none are built without a subscriber or stream."""
    events_dropped: int
    """Events lost: on a full bus, subscriber queue or stream."""
    subscriber_dropped: Mapping[str, int]
    """Events each subscriber lost to its full queue, by subscriber name."""
    forced_alive: int
    """Force-aborted tasks still physically running (their names stay reserved)."""


def _check_iterable(what: str, value: object, items: str) -> None:
    # A single item (or a str) where a collection is expected fails here, clearly.
    if isinstance(value, TaskSpec | str) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be an iterable of {items}, got {value!r}")


def _check_real_clock() -> None:
    """A slot store's server expires leases in real time, which the keeper counts on
    this run's clock: a ``MockClock`` that does not run at real speed would report a
    silent server at once under autojump, and renew nothing while it stands still (the
    server then hands the slot to another owner while this one runs). ``rate=1.0``
    without autojump runs at real speed; its ``jump()`` is a pause of the process."""
    if "trio.testing" not in sys.modules:
        return  # no MockClock can exist
    from trio.testing import MockClock

    clock = trio.lowlevel.current_clock()
    if isinstance(clock, MockClock) and (clock.rate != 1.0 or clock.autojump_threshold < math.inf):
        raise ConfigError(
            "a slot store needs a clock that runs in real time (its server expires"
            f" leases in real time), and this trio.run has MockClock(rate={clock.rate!r},"
            f" autojump_threshold={clock.autojump_threshold!r}): run the tests that use a"
            " slot store without autojump_clock (or with MockClock(rate=1.0))"
        )


def _check_slot(slot: object) -> None:
    if not isinstance(slot, str):
        raise TypeError(f"slot must be a str, got {slot!r}")


def _check_sendable_pool(pool: Pool) -> None:
    limit, key = pool_parts(pool)
    check_sendable("limit name", limit.name)
    if key is not None:
        check_sendable("limit key", key)


def _check_target(target: object) -> None:
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise TypeError(f"target must be a TaskId or a task name, got {target!r}")


class Supervisor:
    """A running supervisor; get one from ``open_supervisor``.

    Every ``async`` method is a checkpoint; ``*_nowait`` methods never block.
    """

    def __init__(self, config: SupervisorConfig, subscribers: tuple[Subscriber, ...]) -> None:
        self._config = config
        self._bus = EventBus(config.bus_capacity, subscribers, self._on_crash)
        log_failures = config.log_failures and not any(
            isinstance(subscriber, LoggingSubscriber) for subscriber in subscribers
        )
        self._registry = Registry(
            config,
            self._bus,
            self._on_crash,
            log_failures=log_failures,
            on_critical=self._on_critical,
        )
        self._resolve = Resolver(config.task_defaults, self._pool_ids)
        self._instance_id = new_instance_id()
        self._waits = WaitChecker(self._registry, self)
        self._keeper: LeaseKeeper | None = None
        controller = config.controller
        self._controller = (
            None
            if controller is None
            else Controller(
                controller,
                self._registry,
                self._bus,
                self._new_record,
                self._waits,
                None if controller.slot_store is None else self._lease_keeper,
            )
        )
        self._shutdown = Shutdown(
            self._registry,
            self._bus,
            self._controller,
            grace=config.grace,
            drain_timeout=config.subscriber_shutdown_timeout,
        )
        self._background: trio.Nursery | None = None
        self._body_scope: trio.CancelScope | None = None
        self._crash: BaseException | None = None
        # The first critical task's failure, and when it came (the supervisor's clock).
        self._critical: CriticalTaskError | None = None
        self._critical_at = math.inf
        self._received_signal: int | None = None
        self._signal_scope: trio.CancelScope | None = None
        # Around reaching the slot store at the start: a signal meanwhile cancels it.
        self._reaching = trio.CancelScope()

    def __repr__(self) -> str:
        state = "closed" if self._shutdown.started else "open"
        return f"<Supervisor {state} registered={self._registry.registered}>"

    @property
    def instance_id(self) -> str:
        """This supervisor's identity in a cluster: ``"<host>:<pid>:<random hex>"``.

        Unique per ``open_supervisor``; it exists with or without a slot store.
        """
        return self._instance_id

    @property
    def config(self) -> SupervisorConfig:
        """The configuration this supervisor runs with."""
        return self._config

    @property
    def received_signal(self) -> int | None:
        """The first SIGINT or SIGTERM received with ``handle_signals=True``, or ``None``.

        For an exit status of ``128 + signal``, as shells expect.
        """
        return self._received_signal

    @property
    def closing(self) -> bool:
        """Whether the shutdown has begun, whatever began it; it stays ``True``.

        The end of the ``open_supervisor`` block, ``shutdown()``, a signal, a critical
        task's failure or a crash begin it. Work outside the supervisor (a readiness
        endpoint served by the application's own nursery) reads it to answer "not
        ready" while the supervisor drains.
        """
        return self._shutdown.started

    async def wait_closing(self) -> None:
        """Wait until the shutdown has begun (``closing``); at once if it has.

        Always a checkpoint.
        """
        self._registry.check_thread("sup.wait_closing")
        await self._shutdown.begun.wait()

    # -- the background -------------------------------------------------------------------

    def _lease_keeper(self, reports: ReportSink) -> LeaseKeeperSeam:
        """The lease keeper of the controller's slot store (the ``redis`` extra)."""
        from ._keeper import LeaseKeeper
        from ._redis_client import RedisClient  # imports coredis: only with a slot store

        controller = self._config.controller
        assert controller is not None
        assert isinstance(controller.slot_store, RedisSlotStore)
        store = controller.slot_store
        keeper = LeaseKeeper(
            store, self._instance_id, reports, RedisClient(store, self._instance_id)
        )
        # Limit pools are the cluster's: the registry's units ask the keeper for them.
        keeper.limit_sink = self._registry.use_cluster_pools(keeper)
        self._keeper = keeper
        return keeper

    async def _run_background(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        unavailable: SlotStoreUnavailableError | None = None
        keeper = None if self._controller is None else self._controller.keeper
        try:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:
                    self._background = nursery
                    if keeper is not None:
                        # First: nothing starts when the store cannot be reached.
                        with self._reaching:
                            try:
                                await nursery.start(keeper.run)
                            except SlotStoreUnavailableError as exc:
                                unavailable = exc
                        if self._reaching.cancelled_caught:
                            # Cut short by a signal or the caller's cancellation; a keeper
                            # that started in that instant stops too (nothing else will).
                            nursery.cancel_scope.cancel(reason="the start was cut short")
                            if self._received_signal is not None:
                                assert self._keeper is not None
                                name = signal.Signals(self._received_signal).name
                                unavailable = SlotStoreUnavailableError(
                                    f"slot store {self._keeper.store.safe_url} was not reached"
                                    f" yet when {name} came"
                                )
                    if unavailable is None and not self._reaching.cancelled_caught:
                        await nursery.start(self._bus.run)
                        await nursery.start(self._registry.run)
                        if self._controller is not None:
                            await nursery.start(self._controller.run)
                        task_status.started()
        finally:
            self._shutdown.done.set()
        if unavailable is not None:
            raise unavailable
        if self._reaching.cancelled_caught:
            # The caller was cancelled while the store was reached (``_lifetime``'s
            # relay): not started; its start delivers the cancellation.
            raise _StartCancelled

    def _start_shutdown(self, *, explicit: bool) -> None:
        assert self._background is not None
        self._shutdown.start(self._background, explicit=explicit)

    def _on_crash(self, exc: BaseException) -> None:
        if self._crash is None:
            self._crash = exc
        elif exc is not self._crash:
            # Only the first one propagates; never drop a later one silently.
            log(
                logging.ERROR,
                "%s raised during the shutdown after %s; only the first is re-raised",
                type(exc).__name__,
                type(self._crash).__name__,
                exc_info=exc,
            )
        self._start_shutdown(explicit=True)
        if self._body_scope is not None:
            self._body_scope.cancel(reason=f"a task raised {type(exc).__name__}")

    def _on_critical(self, rec: TaskRecord, outcome: TaskOutcome[Any]) -> None:
        """A critical task ended FAILED, FATAL or PANICKED: shut down, cancel the body."""
        if outcome.kind not in _CRITICAL_KINDS or self._critical is not None:
            return  # only the first one escalates; a later one is logged as any failure
        self._critical = CriticalTaskError(outcome, rec.id, rec.name)
        self._critical_at = trio.current_time()
        log(
            logging.ERROR,
            "critical task %r (%s) ended %s: %s: shutting down",
            rec.name,
            rec.id,
            outcome.kind.value,
            outcome.reason,
            extra={
                "taskvisor_name": rec.name,
                "taskvisor_task_id": rec.id,
                "taskvisor_outcome": outcome.kind,
                "taskvisor_reason": outcome.reason,
            },
        )
        self._start_shutdown(explicit=True)
        if self._body_scope is not None:
            self._body_scope.cancel(reason=f"critical task {rec.name!r} ended {outcome.kind.value}")

    # -- intake ---------------------------------------------------------------------------

    def _new_record(self, spec: TaskSpec[Any], slot: str | None = None) -> TaskRecord:
        """The record of ``spec``: allocates its ``TaskId``, captures the caller's context.

        A spec without a name gets its automatic name here; it reserves that name as
        any name does (a keyed call's caller marks its record unreserved).
        """
        if not isinstance(spec, TaskSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise not_a(TaskSpec, spec)
        task_id = allocate_id()
        name = spec.name
        if name is None:
            name = auto_name(spec.fn, task_id)
        return TaskRecord(
            task_id, name, spec.fn, spec.args, self._resolve(spec), self, self._waits, slot
        )

    async def add(self, spec: TaskSpec[T]) -> TaskWaiter[T]:
        """Register a task and return its waiter.

        Waits for command capacity and for the registry's decision. Raises
        ``TaskNameInUseError``, ``ResourceLimitError`` or ``SupervisorClosedError``.
        On return the task is registered; its first attempt may not have started.
        Cancelled after the command was accepted, the add still happens.
        """
        self._registry.check_intake("sup.add, spec")
        rec = self._new_record(spec)
        await self._registry.add(rec)
        return rec

    def add_nowait(self, spec: TaskSpec[T]) -> TaskWaiter[T]:
        """Enqueue an add without blocking; a rejection resolves the waiter ``REJECTED``.

        Raises ``trio.WouldBlock`` when the command channel is full.
        """
        self._registry.check_intake("sup.add_nowait, spec", sync=True)
        rec = self._new_record(spec)
        self._registry.add_nowait(rec)
        return rec

    async def add_batch(self, specs: Iterable[TaskSpec[T]]) -> builtins.list[TaskWaiter[T]]:
        """Register every spec, or none: any conflict or the limit rejects them all.

        Raises ``TaskNameInUseError`` (the first conflicting name) or
        ``ResourceLimitError``; every item then resolves ``REJECTED``. Bodies of an
        accepted batch start only after every item is registered.
        """
        self._registry.check_intake("sup.add_batch, specs")
        _check_iterable("specs", specs, "TaskSpec")
        recs = [self._new_record(spec) for spec in specs]
        if not recs:
            await trio.lowlevel.checkpoint()
            return []
        await self._registry.add_batch(recs)
        return list(recs)

    # -- stops -----------------------------------------------------------------------------

    async def _stop(self, target: TaskId | str) -> tuple[bool, TaskRecord | None]:
        _check_target(target)
        if self._controller is not None and not isinstance(target, str):
            # Through the controller: ordered after the submission it targets.
            routed = await self._controller.remove(TaskId(target))
            if routed is not None:
                return routed
        return await self._registry.stop(target)

    async def remove(self, target: TaskId | str) -> bool:
        """Request a stop and return without waiting for it.

        ``True`` only to the caller that claimed the stop; ``False`` for unknown,
        finished or already-stopping targets. Works during and after shutdown.
        """
        self._registry.check_thread("sup.remove, target")
        claimed, _ = await self._stop(target)
        return claimed

    async def cancel(self, target: TaskId | str) -> bool:
        """Claim or join the stop of ``target`` and wait until its outcome is committed.

        ``True`` only to the claimer. Bound the wait with ``trio.move_on_after``: the
        stop continues when the caller leaves. Inside an attempt of ``target`` itself
        the stop's ``Cancelled`` ends the call, and in a shielded scope, which the stop
        cannot reach, ``DeadlockError`` does (the outcome comes once the task has ended).
        """
        self._registry.check_thread("sup.cancel, target")
        claimed, rec = await self._stop(target)
        if rec is not None:
            caller = self._waits.caller()
            if rec is caller:
                # The outcome comes once this task has ended: the call would wait for it.
                await self._waits.refuse_self_wait(
                    rec,
                    f"sup.cancel() in task {rec.name!r} ({rec.id}) cannot wait for the "
                    "outcome of its own task, which comes once the task has ended: its stop "
                    "has been requested",
                )
            await rec.wait()
        return claimed

    # -- the controller ------------------------------------------------------------------

    def _require_controller(self, operation: str) -> Controller:
        if self._controller is None:
            raise NoControllerError(operation)
        return self._controller

    async def submit(self, request: ControllerSpec[T]) -> TaskWaiter[T]:
        """Hand ``request`` to the controller; return means intake only.

        Waits for controller command capacity. Raises ``NoControllerError`` without a
        controller and ``SupervisorClosedError`` after shutdown began.
        """
        controller = self._require_controller("submit")
        self._registry.check_intake("sup.submit, request")
        entry = controller.prepare(request)
        await controller.submit(entry)
        return entry.payload

    def submit_nowait(self, request: ControllerSpec[T]) -> TaskWaiter[T]:
        """Hand ``request`` to the controller without blocking.

        Raises ``trio.WouldBlock`` when the controller's command channel is full.
        """
        controller = self._require_controller("submit_nowait")
        self._registry.check_intake("sup.submit_nowait, request", sync=True)
        entry = controller.prepare(request)
        controller.submit_nowait(entry)
        return entry.payload

    def prepare_submission(self, request: ControllerSpec[T]) -> PreparedSubmission[T]:
        """Allocate the ``TaskId`` of ``request`` now; reserve and publish nothing."""
        self._registry.check_thread("sup.prepare_submission, request", sync=True)
        controller = self._require_controller("prepare_submission")
        return PreparedSubmission(self._registry, controller, controller.prepare(request), request)

    def controller_snapshot(self) -> ControllerSnapshot:
        """The controller's slots now (atomic; local, even for cluster slots)."""
        self._registry.check_thread("sup.controller_snapshot", sync=True)
        return self._require_controller("controller_snapshot").snapshot()

    async def cluster_slot(self, slot: str) -> ClusterSlotInfo | None:
        """Ask the slot store about ``slot``, cluster-wide. A checkpoint.

        ``None`` when no process holds its lease and its cluster queue has no live entry.
        Raises ``NoControllerError`` without a controller, ``ConfigError`` without a slot
        store, ``SlotStoreUnavailableError`` when the server does not answer within
        ``connect_timeout``.
        """
        self._registry.check_thread("sup.cluster_slot, slot")
        controller = self._require_controller("cluster_slot")
        if not isinstance(slot, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"slot must be a str, got {slot!r}")
        return await controller.cluster_slot(slot)

    async def run_in_slot(
        self,
        slot: str,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        policy: AdmissionPolicy = AdmissionPolicy.QUEUE,
        queue_timeout: float | None = None,
        **task_opts: Any,
    ) -> T:
        """Run ``fn(*args)`` once in ``slot`` and return its value (a keyed call).

        Submits ``once`` work under an automatic name (``f"{qualname}{id}"``, reserving
        nothing; with ``wait=True`` for QUEUE and REPLACE), waits for it and returns
        ``outcome.unwrap()``: raises ``OutcomeError`` when it did not complete
        (``REJECTED(QUEUE_TIMEOUT)`` when ``queue_timeout`` passed while it was queued or
        held). Cancelling the caller withdraws queued or held work (it never runs) or
        stops running work, waiting for that stop (shielded, at most the grace window)
        before ``Cancelled`` propagates. Inside an attempt, raises ``DeadlockError`` when
        the call closes a wait-for cycle. A ``REPLACE`` of the caller's own slot stops the
        caller: its ``Cancelled``, or in a shielded scope ``DeadlockError``, ends the
        call, whose work is then withdrawn. With ``JOIN``, ``T`` is the caller's promise
        that the followed work returns the same type.
        """
        controller = self._require_controller("run_in_slot")
        self._registry.check_intake("sup.run_in_slot, slot, fn, *args")
        if not isinstance(slot, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"slot must be a str, got {slot!r}")
        spec = (
            one_attempt("run_in_slot", None, fn, args, task_opts)
            if task_opts
            else TaskSpec.once(None, fn, *args)
        )
        request: ControllerSpec[T]
        if policy is AdmissionPolicy.QUEUE:  # the constructors' fast path (row 5)
            request = ControllerSpec.queue(spec, slot=slot, wait=True, queue_timeout=queue_timeout)
        elif policy is AdmissionPolicy.REPLACE:
            request = ControllerSpec.replace(
                spec, slot=slot, wait=True, queue_timeout=queue_timeout
            )
        else:
            request = ControllerSpec(spec, policy, slot, queue_timeout=queue_timeout)
        entry = controller.prepare(request)
        waiter = entry.payload
        # A keyed call's name is a label: a user task named like it never makes it fail.
        waiter.reserved = False
        await controller.submit(entry)
        try:
            outcome = await waiter.wait()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.cancel(waiter.id)
            raise
        return cast("T", outcome.unwrap())

    # -- readiness ------------------------------------------------------------------------

    async def start(self, spec: TaskSpec[T]) -> TaskWaiter[T]:
        """Register a task like ``add``, then wait until it reports that it is ready.

        The task's function is called with a ``task_status`` keyword argument on every
        attempt, as ``nursery.start`` does; the first ``task_status.started(value)`` of
        any attempt makes this return, with ``value`` as ``waiter.started_value``.
        Raises ``OutcomeError(outcome)`` when the task reaches its final outcome before
        any attempt called ``started()`` (a ``COMPLETED`` one included), and what ``add``
        raises. Cancelling the caller stops the task and waits for that stop, shielded,
        at most the grace window. Inside an attempt, raises ``DeadlockError`` when the
        wait closes a wait-for cycle (the task needs a permit the caller holds); the task
        is then stopped the same way.
        """
        self._registry.check_intake("sup.start, spec")
        rec = self._new_record(spec)
        rec.expect_readiness()
        try:
            await self._registry.add(rec)
        except BaseException as exc:
            # Rejected (or closed): nothing runs. Cancelled: the add may still be queued,
            # so a stop by id, queued behind it, ends it.
            if not isinstance(exc, Exception):
                await self._stop_unready(rec)
            raise
        await self._wait_ready(rec)
        return rec

    async def start_in_slot(self, request: ControllerSpec[T]) -> TaskWaiter[T]:
        """Submit ``request`` like ``submit``, then wait until the work reports readiness.

        The rules of ``start`` apply once the work is admitted: the wait covers its
        time in the slot's queue, and a rejection or any other final outcome before
        ``started()`` raises ``OutcomeError``. Cancelling the caller withdraws queued or
        held work, or stops running work (shielded, at most the grace window), and so
        does a ``DeadlockError`` (the wait closed a wait-for cycle, as ``wait()`` would).
        ``JOIN`` starts no work of its own and raises ``TypeError``.
        """
        controller = self._require_controller("start_in_slot")
        self._registry.check_intake("sup.start_in_slot, request")
        if not isinstance(request, ControllerSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise not_a(ControllerSpec, request)
        if request.policy is AdmissionPolicy.JOIN:
            raise TypeError("start_in_slot cannot JOIN: a joiner starts no work to wait for")
        entry = controller.prepare(request)
        rec = entry.payload
        rec.expect_readiness()
        await controller.submit(entry)
        await self._wait_ready(rec)
        return rec

    async def _wait_ready(self, rec: TaskRecord) -> None:
        """Wait for ``rec``'s readiness; raise ``OutcomeError`` if it ended unready."""
        try:
            reached = await rec.wait_ready()
        except BaseException:
            await self._stop_unready(rec)
            raise
        if not reached:
            outcome = rec.outcome_nowait()
            raise OutcomeError(outcome) from outcome.error

    async def _stop_unready(self, rec: TaskRecord) -> None:
        with trio.CancelScope(shield=True):
            await self.cancel(rec.id)

    # -- slot-wide operations -------------------------------------------

    async def cancel_slot(self, slot: str) -> int:
        """Withdraw every queued and held submission of ``slot`` and stop its owner.

        Withdrawn work ends ``REJECTED(REMOVED_FROM_QUEUE)`` (held work is withdrawn
        while held: placement ``REJECTED``), and so do its joiners; the owner is
        soft-stopped (grace, then force, as ``cancel``). Returns once the owner's outcome
        is committed (for a forced owner: at the grace deadline; the slot stays reserved
        until its body exits), with the number of submissions withdrawn plus 1 if the
        slot had an owner. Work submitted after the call was taken in is not affected.
        An idle or unknown slot gives ``0``. Always a checkpoint.

        In a cluster slot (a slot store) it withdraws this process's entries (other
        processes' queued work stays) and, when the owner runs in another process, asks
        that process to stop it (as a REPLACE would) and returns once its lease is
        released; the owner counts 1 wherever it runs.

        Raises ``NoControllerError`` without a controller, and ``DeadlockError`` when
        called from inside an attempt that owns ``slot`` (or when waiting for the owner
        closes a wait-for cycle). In a cluster slot, raises ``SlotStoreUnavailableError``
        when the server does not answer within ``connect_timeout`` (the local work is
        withdrawn all the same, and the stop request is sent once the server answers).
        Cancelling the caller does not stop the cancel.
        """
        self._registry.check_thread("sup.cancel_slot, slot")
        controller = self._require_controller("cancel_slot")
        _check_slot(slot)
        controller.check_not_owner(slot, "cancel_slot")
        count, owner = await controller.cancel_slot(slot)
        if owner is not None:
            await owner.wait()
        return count

    async def wait_slot_idle(self, slot: str) -> None:
        """Wait until ``slot`` has no owner, queued or held work, and none in intake.

        A forced owner still physically running keeps the slot busy. Returns at once if
        the slot is idle; always a checkpoint. In a cluster slot (a slot store) it waits
        until the slot is idle cluster-wide too: no lease and no live queue entry on the
        server (asked every 50 ms once the slot is idle here). Raises
        ``NoControllerError`` without a controller, and ``DeadlockError`` when called from
        inside an attempt that owns ``slot`` (or when the wait closes a wait-for cycle);
        in a cluster slot, ``SlotStoreUnavailableError`` when the server does not answer
        within ``connect_timeout``.
        """
        self._registry.check_thread("sup.wait_slot_idle, slot")
        controller = self._require_controller("wait_slot_idle")
        _check_slot(slot)
        controller.check_not_owner(slot, "wait_slot_idle")
        await controller.wait_slot_idle(slot)

    # -- observing --------------------------------------------------------------------------

    def list(self) -> tuple[TaskInfo, ...]:
        """Registered and stopping tasks, sorted by id."""
        self._registry.check_thread("sup.list", sync=True)
        return self._registry.infos()

    def alive_snapshot(self) -> tuple[str, ...]:
        """Names with an attempt physically in progress (force-aborted ones too), sorted."""
        self._registry.check_thread("sup.alive_snapshot", sync=True)
        return self._registry.alive()

    def is_alive(self, name: str) -> bool:
        """Whether ``name`` has an attempt physically in progress."""
        self._registry.check_thread("sup.is_alive, name", sync=True)
        if not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"name must be a task name (a str), got {name!r}")
        return self._registry.is_alive(name)

    def statistics(self) -> SupervisorStatistics:
        """Counters of this supervisor now."""
        self._registry.check_thread("sup.statistics", sync=True)
        registry = self._registry
        return SupervisorStatistics(
            registered=registry.registered,
            running_attempts=registry.running_attempts,
            alive=len(registry.alive()),
            waiting_for_permit=registry.waiting_for_permit,
            events_published=self._bus.published,
            events_dropped=self._bus.dropped,
            subscriber_dropped=self._bus.subscriber_dropped(),
            forced_alive=registry.forced_alive,
        )

    # -- limits ------------------------------------------------------------------------------

    def limited(self, *pools: Pool) -> AbstractAsyncContextManager[None]:
        """Run a block of code holding one unit of every pool in ``pools``, all at once.

        Waits until every pool has room (oldest waiter first, as attempts do), then
        enters the block: a concurrency unit is held until the block exits, a rate
        pool's start is spent on entry. It is a checkpoint; cancelled while it waits, it
        holds nothing. Works inside and outside supervised work.

        Raises ``DeadlockError`` at once when it asks for a concurrency pool that the
        current attempt (or an enclosing ``limited`` block of the same trio task) of
        this supervisor already holds (work added and tasks spawned in a block hold
        none of its units; tasks an attempt spawns are part of it), ``ConfigError`` for
        a limit whose name this supervisor knows with other settings or a pool named
        twice, and ``SupervisorClosedError`` once the shutdown has begun (a block still
        waiting then raises it at once; one waiting in, or entered by, a supervised
        attempt the shutdown's stop is still to reach is cancelled by that stop
        instead, with its attempt).
        """
        return _Once(self._limited(*pools), "sup.limited(...)")

    @asynccontextmanager
    async def _limited(self, *pools: Pool) -> AsyncGenerator[None]:
        rec = current_task_context.get(None)
        if rec is not None and rec.supervisor is not self:
            rec = None  # an attempt of another supervisor: a task of its own to this one
        await self._registry.check_block_intake(
            rec,
            "sup.limited",
            "from another thread, enter it in an async function of that run "
            "(trio.from_thread.run(fn))",
        )
        if not pools:
            raise TypeError("limited() takes at least one pool")
        idents = self._pool_ids(check_limits(pools))
        units = self._registry.units()
        task = trio.lowlevel.current_task()
        holder, blocks = _held_pools.get()
        if holder is not task:
            blocks = frozenset[tuple[object, PoolId]]()  # those of the task that spawned it
        concurrency = frozenset(
            ident for ident, pool in zip(idents, pools, strict=True) if is_concurrency(pool)
        )
        held: list[tuple[str, Iterable[PoolId]]] = [
            ("this task", [ident for sup, ident in blocks if sup is self])
        ]
        if rec is not None:
            # the attempt's units cover the tasks it spawns: held until it exits
            held.insert(0, (f"the current attempt of task {rec.name!r}", rec.policy.limits))
        for whose, idents_held in held:
            again = sorted(pool_label(ident) for ident in concurrency.intersection(idents_held))
            if again:
                raise DeadlockError(
                    f"limited() asks for {', '.join(again)}, which {whose} already holds: "
                    "it would wait for itself"
                )
        limits = tuple(pool_parts(pool)[0] for pool in pools)
        request = await units.hold(idents, limits)
        token = _held_pools.set((task, blocks | {(self, ident) for ident in concurrency}))
        try:
            with trio.CancelScope() as scope:
                units.guard(request, scope)
                yield
        finally:
            _held_pools.reset(token)
            units.unhold(request)
        lost = units.lost(request)
        if lost is not None:
            raise LeaseLostError(lost)

    def _pool_ids(self, pools: tuple[Pool, ...]) -> tuple[PoolId, ...]:
        """Learn ``pools``' settings (``ConfigError`` for other settings of a known name).

        With a slot store the server checks the settings again at each acquisition, and
        the names and keys must be strings it can be sent (``ConfigError``)."""
        if self._keeper is not None:
            for pool in pools:
                _check_sendable_pool(pool)
        return self._registry.pool_ids(pools)

    async def cluster_limit(self, pool: Pool) -> ClusterLimitInfo:
        """Ask the slot store's server about one limit pool, cluster-wide. A checkpoint.

        Counts the units held and the waiters of every process (a pool nobody uses:
        all zero). Raises ``ConfigError`` without a slot store, or when the cluster
        uses the pool with other settings (kind, capacity, rate, per or burst: the
        answer would be about that pool), ``TypeError`` for anything but a limit or a
        ``LimitKey``, and ``SlotStoreUnavailableError`` when the server does not answer
        within ``connect_timeout``.
        """
        self._registry.check_thread("sup.cluster_limit, pool")
        limit, key = pool_parts(pool)
        keeper = self._keeper
        if keeper is None:
            await trio.lowlevel.checkpoint()
            raise ConfigError(
                "cluster_limit needs a slot store: "
                "ControllerConfig(slot_store=...); limit_snapshot() shows this process"
            )
        _check_sendable_pool(pool)
        reply = await keeper.limit_query((limit.name, key), limit)
        rate = isinstance(limit, RateLimit)
        next_start = reply.next_start if rate else None
        if rate and next_start is None:
            next_start = 0.0
        holders = {} if rate else reply.holders
        return ClusterLimitInfo(
            held=sum(holders.values()),
            holders=holders,
            waiting=reply.waiting,
            next_start_in=next_start,
        )

    def limit_snapshot(self) -> tuple[LimitView, ...]:
        """The limit pools with holders or waiters in this process, sorted by name and key."""
        self._registry.check_thread("sup.limit_snapshot", sync=True)
        return self._registry.limit_views()

    async def wait_idle(self) -> None:
        """Wait until no task is registered or alive and no add or submission is in flight.

        Inside an attempt of this supervisor it raises ``DeadlockError`` at once: the
        caller's own task is alive until the call returns.
        """
        self._registry.check_thread("sup.wait_idle")
        caller = self._waits.caller()
        if caller is not None:
            raise DeadlockError(
                f"task {caller.name!r} ({caller.id}) is alive: wait_idle() from inside it "
                "would wait for the task itself"
            )
        registry = self._registry.idle
        controller = None if self._controller is None else self._controller.idle
        await trio.lowlevel.checkpoint()
        # Work moves from the controller to the registry, counted there first: both idle
        # at one instant, checked with no checkpoint between, means none is left.
        while True:
            if not registry.value:  # pyright: ignore[reportUnknownMemberType]
                await registry.wait_value(True)  # pyright: ignore[reportUnknownMemberType]
            elif controller is not None and not controller.value:  # pyright: ignore[reportUnknownMemberType]
                await controller.wait_value(True)  # pyright: ignore[reportUnknownMemberType]
            else:
                return

    def events(
        self, capacity: int = 1024
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[TaskEvent]]:
        """Open a stream of later events; a full stream drops, like a subscriber."""
        check_capacity("capacity", capacity)
        self._registry.check_thread(
            "sup.events", "read the stream in a task of that run (or give it a subscriber)"
        )
        return _Once(self._bus.stream(capacity), "sup.events()")

    # -- shutdown ------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Start or join the one shared shutdown and wait for its result.

        Raises ``GraceExceededError`` if any task had to be forced; every caller gets
        the same result. Cancelling a caller does not stop the shutdown.

        In a subscriber's ``on_event`` (of this supervisor) it starts the shutdown and
        raises ``DeadlockError`` at once: the shutdown ends by draining the subscribers,
        so it waits for that ``on_event`` to return. Inside an attempt of this
        supervisor it starts the shutdown and waits until the shutdown stops the
        caller's task: the stop's ``Cancelled`` ends the call, and in a shielded scope,
        which the stop cannot reach, ``DeadlockError`` does (the shutdown waits for the
        task to end).
        """
        self._registry.check_thread("sup.shutdown")
        self._start_shutdown(explicit=True)
        subscriber = self._bus.lane_of_caller()
        if subscriber is not None:
            raise DeadlockError(
                f"sup.shutdown() in the on_event of subscriber {subscriber!r} cannot wait "
                "for the shutdown, which ends by draining the subscribers, this one "
                "included: it has begun, and ends once on_event returns"
            )
        caller = self._waits.caller()
        if caller is not None:
            # The shutdown ends only once this task has: it can never return here.
            await self._waits.refuse_self_wait(
                caller,
                f"sup.shutdown() in task {caller.name!r} ({caller.id}) cannot wait for the "
                "shutdown, which waits for this task to end: it has begun, and has asked "
                "this task to stop",
            )
        await self._shutdown.wait()

    # -- the lifetime ----------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def _lifetime(
        cls,
        config: SupervisorConfig | None,
        subscribers: Iterable[Subscriber],
        handle_signals: bool,
        natural_end: bool,
        failures: builtins.list[tuple[TaskRecord, builtins.list[TaskRecord]]] | None,
    ) -> AsyncGenerator[Supervisor]:
        """Run a supervisor for the duration of the block (``open_supervisor``), as a
        nursery's manager owns its nursery.

        ``natural_end``: a body that returns (``run``'s batch) begins the shutdown
        without publishing ``SHUTDOWN_REQUESTED``. ``failures``: keep the failed records
        there (the pytest plugin's check).
        """
        if config is None:
            config = SupervisorConfig()
        elif not isinstance(config, SupervisorConfig):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"config must be a SupervisorConfig, got {config!r}")
        _check_iterable("subscribers", subscribers, "subscribers")
        if not isinstance(handle_signals, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"handle_signals must be a bool, got {handle_signals!r}")
        if config.controller is not None and config.controller.slot_store is not None:
            _check_real_clock()
        sup = cls(config, tuple(subscribers))
        if failures is not None:
            sup._registry.failures = failures
        body_error: BaseException | None = None
        body_failed_at = math.inf
        unavailable: SlotStoreUnavailableError | None = None
        async with AsyncExitStack() as stack:
            # First, before anything starts: outside the main thread trio raises its
            # RuntimeError here (once the background runs, it would wait for a shutdown
            # that nothing starts). The watcher runs from then on: a signal while the
            # background starts cuts reaching the slot store short (``_on_signal``).
            signals = (
                await stack.enter_async_context(_signal_receiver()) if handle_signals else None
            )
            if signals is not None:
                if _signals_handled.get():
                    raise ConfigError(
                        "another supervisor of this trio run handles signals already "
                        "(handle_signals=True): a signal reaches only the receiver opened "
                        "last, so one of the two would never see it; handle them in the "
                        "outermost supervisor only, whose shutdown ends the others' blocks"
                    )
                _signals_handled.set(True)
                stack.callback(_signals_handled.set, False)
            async with trio.open_nursery() as nursery:
                # Both starts are shielded: the tasks shield themselves before they say
                # they started, and trio ignores that under a cancelled start (it leaves
                # them in the start's own nursery and waits for them to end: for ever).
                # The caller's cancellation reaches the store's start through ``relay``,
                # and anything else at the body's first checkpoint.
                if signals is not None:
                    with trio.CancelScope(shield=True):
                        await nursery.start(sup._watch_signals, signals)
                relay = trio.CancelScope()
                if sup._keeper is not None:  # reaching the store: up to connect_timeout
                    nursery.start_soon(sup._relay_cancellation, relay)
                try:
                    with trio.CancelScope(shield=True):
                        await nursery.start(sup._run_background)
                except BaseException as exc:
                    relay.cancel(reason="nothing was started")
                    if sup._signal_scope is not None:
                        sup._signal_scope.cancel(reason="nothing was started")
                    if isinstance(exc, _StartCancelled):
                        await trio.lowlevel.checkpoint()  # the caller's cancellation
                    if not isinstance(exc, SlotStoreUnavailableError):
                        raise
                    unavailable = exc  # raised bare below: nothing was started
                else:
                    relay.cancel(reason="the background started")
                    sup._body_scope = nursery.cancel_scope
                    if sup._received_signal is not None:
                        # It came while the background started, once the store answered.
                        sup._on_signal(sup._received_signal)
                    try:
                        yield sup
                    except BaseException as exc:
                        body_error = exc
                        body_failed_at = trio.current_time()
                        if sup._received_signal is not None or sup._critical is not None:
                            # Cancelled by the shutdown of a signal or a critical failure:
                            # the body scope's own cancellation is no error (only it: a
                            # normal exit), and leaves no group raised. An outer
                            # cancellation, if any, is delivered again at the caller's next
                            # checkpoint.
                            body_error = split_cancelled(exc)[1]
                    # A run()'s batch that ended is no request: no SHUTDOWN_REQUESTED.
                    sup._start_shutdown(explicit=not natural_end or body_error is not None)
                    with trio.CancelScope(shield=True):
                        await sup._shutdown.done.wait()
                    if sup._signal_scope is not None:
                        sup._signal_scope.cancel(reason="the shutdown is done")
        if unavailable is not None:
            if sup._received_signal is not None:
                # Nothing handles it now (the previous handlers are back): its default
                # action, as if the supervisor had never received it (SIGTERM ends the
                # process; SIGINT raises KeyboardInterrupt).
                signal.raise_signal(sup._received_signal)
            raise unavailable
        crash = sup._crash
        if crash is not None:
            raise crash from None if body_error is None else body_error
        shutdown_error = sup._shutdown.error()
        critical = sup._critical
        # The body's own exception wins when it came first or in the same instant (trio does
        # not order tasks within one); one it raised later, once cancelled, gives way.
        if critical is not None and (body_error is None or body_failed_at > sup._critical_at):
            if shutdown_error is not None:
                log(logging.ERROR, "shutdown after a critical task's failure: %s", shutdown_error)
            raise critical from body_error
        if body_error is not None:
            if shutdown_error is not None:
                log(logging.ERROR, "shutdown after a failed body: %s", shutdown_error)
            raise body_error
        if shutdown_error is not None:
            raise shutdown_error

    # -- signals ------------------------------------------------------------------------------

    async def _relay_cancellation(self, relay: trio.CancelScope) -> None:
        """While the background starts (shielded): a cancellation of the caller of
        ``open_supervisor`` cuts reaching the slot store short, as a signal does."""
        with relay:
            try:
                await trio.sleep_forever()
            finally:
                if not relay.cancel_called:
                    self._reaching.cancel(reason="open_supervisor was cancelled")

    async def _watch_signals(
        self,
        signals: AsyncIterator[int],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """``handle_signals``: the first signal shuts down, one during a shutdown forces."""
        with trio.CancelScope(shield=True) as self._signal_scope:
            task_status.started()
            async for signum in signals:
                self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        if self._received_signal is None:
            self._received_signal = signum
        reason = f"received {signal.Signals(signum).name}"
        if self._body_scope is None:
            # The background is starting: cut reaching the store short (``_lifetime``
            # handles a signal that came once it had answered).
            self._reaching.cancel(reason=reason)
        elif self._shutdown.started:
            self._registry.force_all()
            if self._keeper is not None:
                self._keeper.cut_drain()  # nor wait for the store's last round trip
            self._shutdown.cut_drain()  # nor for the subscribers to drain
        else:
            self._start_shutdown(explicit=True)
            self._body_scope.cancel(reason=reason)


def _drop_signal(signum: int, frame: FrameType | None) -> None:
    """Under trio's signal receiver: what it restores, and raises a signal again with,
    when it closes (a signal that came once the shutdown was done)."""


@asynccontextmanager
async def _signal_receiver() -> AsyncGenerator[AsyncIterator[int]]:
    """SIGINT and SIGTERM, each one delivered (trio's receiver merges a signal that comes
    again before the first was read), over handlers that drop them: a signal that comes
    once the watcher has stopped is dropped, where trio would raise it again for the
    previous handlers as its receiver closes."""
    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, _drop_signal)
    except ValueError:
        pass  # not the main thread: trio's receiver says so, next
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM):
            # trio's receiver delivers a signal that comes again before the first was
            # read once (a second Ctrl+C while the loop was busy would be lost): a
            # handler of our own queues every one. trio's still checks the thread and
            # puts the dropping handlers back.
            token = trio.lowlevel.current_trio_token()
            send, receive = trio.open_memory_channel[int](math.inf)
            watching = True

            def deliver(signum: int) -> None:
                if watching:  # once the watcher has stopped: dropped
                    send.send_nowait(signum)

            def handler(signum: int, frame: FrameType | None) -> None:
                token.run_sync_soon(deliver, signum)

            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, handler)
            try:
                yield receive
            finally:
                watching = False
    finally:
        if previous:
            # A signal whose delivery to the receiver is still queued is raised again
            # when it runs: let it run against the dropping handlers first (trio runs
            # what is queued in order).
            delivered = trio.Event()
            trio.lowlevel.current_trio_token().run_sync_soon(delivered.set, idempotent=True)
            with trio.CancelScope(shield=True):
                await delivered.wait()
            for number, handler in previous.items():
                signal.signal(number, handler)


class PreparedSubmission(Generic[T_co]):
    """A submission whose ``TaskId`` is allocated; submit it once."""

    __slots__ = ("_controller", "_entry", "_registry", "_used", "id", "request")

    def __init__(
        self,
        registry: Registry,
        controller: Controller,
        entry: Entry[TaskRecord],
        request: ControllerSpec[T_co],
    ) -> None:
        self._registry = registry  # for its intake check
        self._controller = controller
        self._entry = entry
        self._used = False
        self.id: TaskId = entry.payload.id
        """The ``TaskId`` of the work, allocated now; its waiter will have it."""
        self.request: ControllerSpec[T_co] = request
        """The ``ControllerSpec`` it will submit."""

    def __repr__(self) -> str:
        return f"<PreparedSubmission {self.id} slot={self._entry.key!r}>"

    def _claim(self) -> None:
        if self._used:
            raise RuntimeError(f"prepared submission {self.id} was already submitted")
        self._used = True

    async def submit(self) -> TaskWaiter[T_co]:
        """Submit; waits for controller command capacity (intake only)."""
        self._registry.check_intake("prepared.submit")
        self._claim()
        try:
            await self._controller.submit(self._entry)
        except BaseException:
            # Not taken (cancelled or closed before intake): leave the submission unused.
            self._used = False
            raise
        return self._entry.payload

    def submit_nowait(self) -> TaskWaiter[T_co]:
        """Submit without blocking; raises ``trio.WouldBlock`` when the channel is full."""
        self._registry.check_intake("prepared.submit_nowait", sync=True)
        if self._used:
            self._claim()  # raises: a second use must not send the entry again
        self._controller.submit_nowait(self._entry)
        self._claim()  # only now: a WouldBlock leaves the submission unused
        return self._entry.payload


def open_supervisor(
    config: SupervisorConfig | None = None,
    *,
    subscribers: Iterable[Subscriber] = (),
    handle_signals: bool = False,
) -> AbstractAsyncContextManager[Supervisor, bool]:
    """Run a supervisor for the duration of the block; leaving it shuts down.

    A body exception propagates unchanged after the shutdown; otherwise
    ``GraceExceededError`` propagates if the shutdown had to force tasks. When the
    enclosing scope is cancelled the shutdown still runs, shielded and bounded by the
    grace window and the subscriber drain.

    With ``handle_signals=True`` (main thread only), the first SIGINT or SIGTERM cancels
    the body and runs the graceful shutdown; leaving the block then returns normally,
    unless the shutdown raises ``GraceExceededError``. A signal while any shutdown runs
    forces every remaining task at once (they are listed in ``stuck``).
    ``Supervisor.received_signal`` tells which signal came first. A signal while the
    slot store is still being reached cuts that short: no block runs, and the signal
    goes to the handler from before (by default SIGTERM ends the process and SIGINT
    raises ``KeyboardInterrupt``; after one that returns, ``SlotStoreUnavailableError``
    names the signal). Outside the main thread, ``handle_signals=True`` raises trio's
    ``RuntimeError`` at once, before anything starts; while another supervisor of the
    run handles signals, ``ConfigError`` (one handles them: the outermost).

    With a slot store, the run's clock must run in real time: a ``MockClock`` other
    than ``MockClock(rate=1.0)`` (``autojump_clock``) raises ``ConfigError``.

    A task marked ``critical`` that ends ``FAILED``, ``FATAL`` or ``PANICKED`` begins the
    shutdown and cancels the body, as a failed child cancels a nursery's body; leaving
    the block then raises ``CriticalTaskError``, unless the body raised first or in the
    same instant (its exception wins). ``CriticalTaskError`` wins over
    ``GraceExceededError``, which is then only logged.

    Typed as a context manager that may swallow the body's exception (its ``__aexit__``
    returns ``bool``): after a signal it does swallow the body's cancellation, so type
    checkers see the code after the block as reachable even when the body never ends by
    itself (``await trio.sleep_forever()``).
    """
    return _Once(_lifetime(config, subscribers, handle_signals), "open_supervisor(...)")


@final
class _Once(Generic[T, _Exit]):
    """An async context manager made by a generator, for one ``async with`` block: the
    second of the same object raises ``RuntimeError``, as trio's ``CancelScope`` does,
    saying to call again (contextlib's own is an ``AttributeError`` about ``args``). A
    plain ``with`` is told to use ``async with`` (Python's own error names this class).
    """

    __slots__ = ("_entered", "_manager", "_what")

    def __init__(self, manager: AbstractAsyncContextManager[T, _Exit], what: str) -> None:
        self._manager = manager
        self._what = what
        self._entered = False

    async def __aenter__(self) -> T:
        if self._entered:
            raise RuntimeError(
                f"{self._what} makes one 'async with' block, and this one was entered "
                "already: call it again for another"
            )
        self._entered = True
        return await self._manager.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> _Exit:
        return await self._manager.__aexit__(exc_type, exc, tb)

    def __enter__(self) -> NoReturn:
        raise TypeError(f"{self._what} is an async context manager: use 'async with'")

    def __exit__(self, *exc_info: object) -> None:
        """Never called: ``__enter__`` raises (both make ``with`` call ``__enter__``)."""


def _lifetime(
    config: SupervisorConfig | None,
    subscribers: Iterable[Subscriber],
    handle_signals: bool,
    *,
    natural_end: bool = False,
    failures: builtins.list[tuple[TaskRecord, builtins.list[TaskRecord]]] | None = None,
) -> AbstractAsyncContextManager[Supervisor, bool]:
    """``Supervisor.lifetime``, which ``open_supervisor``, ``run`` and the pytest plugin
    share (``natural_end``, ``failures``: see there)."""
    return cast(
        "AbstractAsyncContextManager[Supervisor, bool]",
        Supervisor._lifetime(  # pyright: ignore[reportPrivateUsage]
            config, subscribers, handle_signals, natural_end, failures
        ),
    )


def open_keeping_failures(
    config: SupervisorConfig | None,
    subscribers: Iterable[Subscriber],
    failures: builtins.list[tuple[TaskRecord, builtins.list[TaskRecord]]],
) -> AbstractAsyncContextManager[Supervisor, bool]:
    """``open_supervisor`` for the pytest plugin's unobserved-failure check: the records
    of FAILED, FATAL and PANICKED outcomes go to ``failures``, each with the joiners that
    followed it (their waiters observe its outcome too).

    Only for a test's supervisor, which is short lived: a service's would keep every
    failure for ever.
    """
    return _lifetime(config, subscribers, False, failures=failures)


async def run(
    specs: Iterable[TaskSpec[Any]],
    config: SupervisorConfig | None = None,
    *,
    subscribers: Iterable[Subscriber] = (),
    handle_signals: bool = False,
) -> None:
    """Run ``specs`` as one all-or-nothing batch until every task has ended.

    With ``handle_signals``, SIGINT or SIGTERM starts the graceful shutdown and a
    second signal during it forces every remaining task, as for ``open_supervisor``.
    Raises what ``add_batch`` or the shutdown raise, and ``CriticalTaskError`` when a
    task marked ``critical`` ended ``FAILED``, ``FATAL`` or ``PANICKED``.
    """
    async with _lifetime(config, subscribers, handle_signals, natural_end=True) as sup:
        waiters = await sup.add_batch(specs)
        for waiter in waiters:
            await waiter.wait()
