"""``open_supervisor``, ``run`` and the ``Supervisor`` they hand out.

Nursery tree of one supervisor::

    open_supervisor's nursery          (the body runs here)
     └── background, shielded          (cancelled only by its own end)
          ├── registry loop            (+ its actor nursery)
          ├── event fan-out            (+ one lane per subscriber)
          └── shutdown workflow        (once started)

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
* ``run(handle_signals=True)`` turns the first SIGINT or SIGTERM into the graceful
  shutdown; a second signal gets trio's default handling.
* A target that is neither a ``str`` nor an ``int`` raises ``TypeError``.
"""

from __future__ import annotations

import builtins
import logging
import random
import signal
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from ._actor import TaskRecord
from ._bus import EventBus, Subscriber, check_capacity
from ._controller import (
    Controller,
    ControllerConfig,
    ControllerSnapshot,
    ControllerSpec,
    PreparedSubmission,
)
from ._events import TaskEvent
from ._exceptions import ConfigError, NoControllerError, SupervisorClosedError
from ._outcome import TaskId, TaskWaiter
from ._registry import AddCommand, Registry, Reply, StopCommand, TaskInfo
from ._shutdown import Shutdown
from ._slots import AdmissionPolicy
from ._spec import Resolver, TaskDefaults, TaskSpec, check_duration

logger = logging.getLogger("trio_taskvisor")
T = TypeVar("T")


def _check_limit(what: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or None, got {value!r}")
    if value < 1:
        raise ConfigError(f"{what} must be >= 1 or None, got {value!r}")


def _check_instance(what: str, value: object, cls: type, *, optional: bool = False) -> None:
    if not isinstance(value, cls) and not (optional and value is None):
        raise TypeError(f"{what} must be a {cls.__name__}, got {value!r}")


@attrs.frozen
class SupervisorConfig:
    """Settings of one supervisor; invalid values raise ``ConfigError``.

    ``grace`` may be ``math.inf`` (never force); capacities must be ``>= 1``.
    """

    grace: float = 60.0
    subscriber_shutdown_timeout: float = 5.0
    max_concurrent: int | None = None
    max_registered_tasks: int | None = 1024
    command_capacity: int = 1024
    bus_capacity: int = 1024
    task_defaults: TaskDefaults = attrs.field(factory=TaskDefaults)
    controller: ControllerConfig | None = None
    random: random.Random = attrs.field(factory=random.Random, eq=False)

    def __attrs_post_init__(self) -> None:
        check_duration("grace", self.grace)
        check_duration("subscriber_shutdown_timeout", self.subscriber_shutdown_timeout)
        _check_limit("max_concurrent", self.max_concurrent)
        _check_limit("max_registered_tasks", self.max_registered_tasks)
        check_capacity("command_capacity", self.command_capacity)
        check_capacity("bus_capacity", self.bus_capacity)
        _check_instance("task_defaults", self.task_defaults, TaskDefaults)
        _check_instance("controller", self.controller, ControllerConfig, optional=True)
        _check_instance("random", self.random, random.Random)


@attrs.frozen
class SupervisorStatistics:
    """Counters of one supervisor at one instant."""

    registered: int
    running_attempts: int
    alive: int
    waiting_for_permit: int
    events_published: int
    events_dropped: int
    subscriber_dropped: Mapping[str, int]


def _check_iterable(what: str, value: object, items: str) -> None:
    # A single item (or a str) where a collection is expected fails here, clearly.
    if isinstance(value, TaskSpec | str) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be an iterable of {items}, got {value!r}")


def _check_target(target: object) -> None:
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise TypeError(f"target must be a TaskId or a task name, got {target!r}")


class Supervisor:
    """A running supervisor; get one from ``open_supervisor``.

    Every ``async`` method is a checkpoint; ``*_nowait`` methods never block.
    """

    def __init__(self, config: SupervisorConfig, subscribers: tuple[Subscriber, ...]) -> None:
        self._config = config
        self._bus = EventBus(config.bus_capacity, subscribers)
        self._resolve = Resolver(config.task_defaults)
        self._registry = Registry(self, self._bus)
        self._registry.on_crash = self._on_crash
        self._bus.on_crash = self._on_crash
        self._controller = (
            None
            if config.controller is None
            else Controller(
                config.controller,
                self._registry,
                self._bus,
                self._resolve,
                lambda: self._shutdown.started,
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
        self._calls = 0  # run_in_slot names

    def __repr__(self) -> str:
        state = "closed" if self._shutdown.started else "open"
        return f"<Supervisor {state} registered={self._registry.registered}>"

    @property
    def config(self) -> SupervisorConfig:
        """The configuration this supervisor runs with."""
        return self._config

    # -- the background -------------------------------------------------------------------

    async def _run_background(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:
                    self._background = nursery
                    await nursery.start(self._bus.run)
                    await nursery.start(self._registry.run)
                    if self._controller is not None:
                        await nursery.start(self._controller.run)
                    task_status.started()
        finally:
            self._shutdown.done.set()

    def _start_shutdown(self, *, explicit: bool) -> None:
        assert self._background is not None
        self._shutdown.start(self._background, explicit=explicit)

    def _on_crash(self, exc: BaseException) -> None:
        if self._crash is None:
            self._crash = exc
        elif exc is not self._crash:
            # Only the first one propagates; never drop a later one silently.
            logger.error(
                "%s raised during the shutdown after %s; only the first is re-raised",
                type(exc).__name__,
                type(self._crash).__name__,
                exc_info=exc,
            )
        self._start_shutdown(explicit=True)
        if self._body_scope is not None:
            self._body_scope.cancel(reason=f"a task raised {type(exc).__name__}")

    # -- intake ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._shutdown.started:
            raise SupervisorClosedError("the supervisor is shutting down; intake is closed")

    def _record(self, spec: TaskSpec) -> TaskRecord:
        if not isinstance(spec, TaskSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"expected a TaskSpec, got {spec!r}")
        return TaskRecord.for_spec(spec, self._resolve(spec))

    async def _send(self, command: AddCommand, count: int) -> None:
        work = self._registry.work
        work.add(count)
        try:
            await self._registry.send.send(command)
        except trio.BrokenResourceError:
            work.sub(count)
            raise SupervisorClosedError("the supervisor has shut down") from None
        except BaseException:
            work.sub(count)
            raise

    async def add(self, spec: TaskSpec) -> TaskWaiter:
        """Register a task and return its waiter.

        Waits for command capacity and for the registry's decision. Raises
        ``TaskNameInUseError``, ``ResourceLimitError`` or ``SupervisorClosedError``.
        On return the task is registered; its first attempt may not have started.
        Cancelled after the command was accepted, the add still happens.
        """
        self._check_open()
        rec = self._record(spec)
        registry = self._registry
        if registry.idle():
            # Fast path: nothing is queued before this add, so admit it here and now,
            # after the checkpoint every async method owes (cancellable: no trace).
            await trio.lowlevel.checkpoint()
            self._check_open()
            if registry.idle():
                error = registry.admit_direct(rec)
                if error is not None:
                    raise error
                return rec.waiter
        reply = Reply()
        await self._send(AddCommand((rec,), reply), 1)
        await reply.wait()
        return rec.waiter

    def add_nowait(self, spec: TaskSpec) -> TaskWaiter:
        """Enqueue an add without blocking; a rejection resolves the waiter ``REJECTED``.

        Raises ``trio.WouldBlock`` when the command channel is full.
        """
        self._check_open()
        rec = self._record(spec)
        work = self._registry.work
        work.add()
        try:
            self._registry.send.send_nowait(AddCommand((rec,), None))
        except trio.BrokenResourceError:
            work.sub()
            raise SupervisorClosedError("the supervisor has shut down") from None
        except BaseException:
            work.sub()
            raise
        return rec.waiter

    async def add_batch(self, specs: Iterable[TaskSpec]) -> builtins.list[TaskWaiter]:
        """Register every spec, or none: any conflict or the limit rejects them all.

        Raises ``TaskNameInUseError`` (the first conflicting name) or
        ``ResourceLimitError``; every item then resolves ``REJECTED``. Bodies of an
        accepted batch start only after every item is registered.
        """
        self._check_open()
        _check_iterable("specs", specs, "TaskSpec")
        recs = [self._record(spec) for spec in specs]
        if not recs:
            await trio.lowlevel.checkpoint()
            return []
        reply = Reply()
        await self._send(AddCommand(recs, reply, batch=True), len(recs))
        await reply.wait()
        return [rec.waiter for rec in recs]

    # -- stops -----------------------------------------------------------------------------

    async def _stop(self, target: TaskId | str) -> tuple[bool, TaskRecord | None]:
        _check_target(target)
        if self._controller is not None and not isinstance(target, str):
            routed = await self._controller.stop(TaskId(target))
            if routed is not None:
                return routed
        reply = Reply()
        try:
            await self._registry.send.send(StopCommand(target, reply))
        except trio.BrokenResourceError:
            # The registry has ended: every task is gone.
            await trio.lowlevel.checkpoint()
            return False, None
        await reply.wait()
        return reply.value  # type: ignore[return-value]

    async def remove(self, target: TaskId | str) -> bool:
        """Request a stop and return without waiting for it.

        ``True`` only to the caller that claimed the stop; ``False`` for unknown,
        finished or already-stopping targets. Works during and after shutdown.
        """
        claimed, _ = await self._stop(target)
        return claimed

    async def cancel(self, target: TaskId | str) -> bool:
        """Claim or join the stop of ``target`` and wait until its outcome is committed.

        ``True`` only to the claimer. Bound the wait with ``trio.move_on_after``: the
        stop continues when the caller leaves.
        """
        claimed, rec = await self._stop(target)
        if rec is not None:
            await rec.waiter.wait()
        return claimed

    # -- the controller ------------------------------------------------------------------

    def _require_controller(self, operation: str) -> Controller:
        if self._controller is None:
            raise NoControllerError(operation)
        return self._controller

    async def submit(self, request: ControllerSpec) -> TaskWaiter:
        """Hand ``request`` to the controller; return means intake only.

        Waits for controller command capacity. Raises ``NoControllerError`` without a
        controller and ``SupervisorClosedError`` after shutdown began.
        """
        controller = self._require_controller("submit")
        controller.check_open()
        return await controller.submit(controller.prepare(request))

    def submit_nowait(self, request: ControllerSpec) -> TaskWaiter:
        """Hand ``request`` to the controller without blocking.

        Raises ``trio.WouldBlock`` when the controller's command channel is full.
        """
        controller = self._require_controller("submit_nowait")
        controller.check_open()
        return controller.send_nowait(controller.prepare(request))

    def prepare_submission(self, request: ControllerSpec) -> PreparedSubmission:
        """Allocate the ``TaskId`` of ``request`` now; reserve and publish nothing."""
        controller = self._require_controller("prepare_submission")
        return PreparedSubmission(controller, controller.prepare(request))

    def controller_snapshot(self) -> ControllerSnapshot:
        """The controller's slots now (atomic)."""
        return self._require_controller("controller_snapshot").snapshot()

    async def run_in_slot(
        self,
        slot: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        policy: AdmissionPolicy = AdmissionPolicy.QUEUE,
        **task_opts: Any,
    ) -> T:
        """Run ``fn(*args)`` once in ``slot`` and return its value (a keyed call).

        Submits ``once`` work under an automatic name (with ``wait=True`` for QUEUE
        and REPLACE), waits for it and returns ``outcome.unwrap()``: raises
        ``OutcomeError`` when it did not complete. Cancelling the caller withdraws
        queued or held work (it never runs) or stops running work, waiting for that
        stop (shielded, at most the grace window) before ``Cancelled`` propagates.
        """
        controller = self._require_controller("run_in_slot")
        controller.check_open()
        if not isinstance(slot, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"slot must be a str, got {slot!r}")
        self._calls += 1
        spec = TaskSpec.once(f"{slot}/call-{self._calls}", fn, *args, **task_opts)
        wait = policy is AdmissionPolicy.QUEUE or policy is AdmissionPolicy.REPLACE
        entry = controller.prepare(ControllerSpec(spec, policy, slot, wait))
        entry.payload.reserved = False  # an automatic name: a label, never a collision
        waiter = await controller.submit(entry)
        try:
            outcome = await waiter.wait()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.cancel(waiter.id)
            raise
        return outcome.unwrap()  # type: ignore[no-any-return]

    # -- observing --------------------------------------------------------------------------

    def list(self) -> tuple[TaskInfo, ...]:
        """Registered and stopping tasks, sorted by id."""
        return self._registry.infos()

    def alive_snapshot(self) -> tuple[str, ...]:
        """Names with an attempt physically in progress (force-aborted ones too), sorted."""
        return self._registry.alive()

    def is_alive(self, name: str) -> bool:
        """Whether ``name`` has an attempt physically in progress."""
        return self._registry.is_alive(name)

    def statistics(self) -> SupervisorStatistics:
        """Counters of this supervisor now."""
        registry = self._registry
        return SupervisorStatistics(
            registered=registry.registered,
            running_attempts=registry.running_attempts,
            alive=len(registry.alive()),
            waiting_for_permit=registry.waiting_for_permit,
            events_published=self._bus.published,
            events_dropped=self._bus.dropped,
            subscriber_dropped=self._bus.subscriber_dropped(),
        )

    async def wait_idle(self) -> None:
        """Wait until no task is registered or alive and no add is in flight."""
        await self._registry.work.idle.wait_value(True)  # pyright: ignore[reportUnknownMemberType]

    def events(
        self, capacity: int = 1024
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[TaskEvent]]:
        """Open a stream of later events; a full stream drops, like a subscriber."""
        check_capacity("capacity", capacity)
        return self._bus.stream(capacity)

    # -- shutdown ------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Start or join the one shared shutdown and wait for its result.

        Raises ``GraceExceededError`` if any task had to be forced; every caller gets
        the same result. Cancelling a caller does not stop the shutdown.
        """
        self._start_shutdown(explicit=True)
        await self._shutdown.wait()


@asynccontextmanager
async def open_supervisor(
    config: SupervisorConfig | None = None, *, subscribers: Iterable[Subscriber] = ()
) -> AsyncGenerator[Supervisor]:
    """Run a supervisor for the duration of the block; leaving it shuts down.

    A body exception propagates unchanged after the shutdown; otherwise
    ``GraceExceededError`` propagates if the shutdown had to force tasks. When the
    enclosing scope is cancelled the shutdown still runs, shielded and bounded by the
    grace window and the subscriber drain.
    """
    if config is None:
        config = SupervisorConfig()
    elif not isinstance(config, SupervisorConfig):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"config must be a SupervisorConfig, got {config!r}")
    _check_iterable("subscribers", subscribers, "subscribers")
    sup = Supervisor(config, tuple(subscribers))
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(sup._run_background)  # pyright: ignore[reportPrivateUsage]
        sup._body_scope = nursery.cancel_scope  # pyright: ignore[reportPrivateUsage]
        try:
            yield sup
        except BaseException as exc:
            body_error = exc
        sup._start_shutdown(explicit=True)  # pyright: ignore[reportPrivateUsage]
        with trio.CancelScope(shield=True):
            await sup._shutdown.done.wait()  # pyright: ignore[reportPrivateUsage]
    crash = sup._crash  # pyright: ignore[reportPrivateUsage]
    if crash is not None:
        raise crash from None if body_error is None else body_error
    shutdown_error = sup._shutdown.error()  # pyright: ignore[reportPrivateUsage]
    if body_error is not None:
        if shutdown_error is not None:
            logger.error("shutdown after a failed body: %s", shutdown_error)
        raise body_error
    if shutdown_error is not None:
        raise shutdown_error


async def _shutdown_on_signal(sup: Supervisor) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            sup._start_shutdown(explicit=True)  # pyright: ignore[reportPrivateUsage]
            return


async def run(
    specs: Iterable[TaskSpec],
    config: SupervisorConfig | None = None,
    *,
    subscribers: Iterable[Subscriber] = (),
    handle_signals: bool = False,
) -> None:
    """Run ``specs`` as one all-or-nothing batch until every task has ended.

    With ``handle_signals``, SIGINT or SIGTERM starts the graceful shutdown. Raises
    what ``add_batch`` or the shutdown raise.
    """
    async with open_supervisor(config, subscribers=subscribers) as sup:
        waiters = await sup.add_batch(specs)
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_shutdown_on_signal, sup)
            for waiter in waiters:
                await waiter.wait()
            nursery.cancel_scope.cancel(reason="every task ended")
        sup._start_shutdown(explicit=False)  # pyright: ignore[reportPrivateUsage]
