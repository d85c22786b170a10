"""The keyed controller: one owner per slot, with queue / replace / drop / join policies.

The controller loop receives submissions and id-based removes on its own bounded
channel and drives the pure ``SlotMachine`` (``_slots``). When the loop is idle (its
channel empty), ``submit`` takes the submission in itself, in the caller's task: nothing
is ordered before it, and the code is as atomic there as in the loop. An owner is
handed to the registry behind the registry's pending commands (through its channel,
``ADMITTING`` until the registry decides), or directly when the registry is idle.
The registry reports back by calling ``on_admission`` (after its decision) and
``on_exit`` (after the owner physically exited and its outcome was committed)
directly: those calls run in the registry's or the actor's task, between two
checkpoints, so they are as atomic as a message and need no lock, and a slot never
waits an extra loop hop between two owners.

Decisions the design leaves open:

* A ``remove``/``cancel`` by ``TaskId`` always goes through the controller's channel
  when a controller is installed (so it is ordered after the submission it targets);
  work the controller does not hold is forwarded to the registry's channel.
* A JOIN on an idle slot starts its own work, like any policy on an idle slot.
* ``prepare_submission`` captures the caller's context variables when it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import attrs
import trio

from ._actor import TaskRecord
from ._bus import EventBus, check_capacity
from ._context import current_task_context
from ._events import EventKind
from ._exceptions import ConfigError, DeadlockError, SupervisorClosedError
from ._outcome import RejectionKind, TaskId, TaskWaiter, rejected_outcome
from ._registry import AddCommand, Command, Registry, Reply, StopCommand
from ._slots import (
    ADMIT,
    DETACH,
    JOIN,
    REJECT,
    STOP,
    SUBMITTED,
    AdmissionPolicy,
    Entry,
    SlotMachine,
    SlotStatus,
)
from ._spec import Resolver, TaskSpec


def _check_limit(what: str, value: object, *, minimum: int, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{what} must be {kind}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value!r}")


@attrs.frozen
class ControllerConfig:
    """Budgets of the keyed controller; ``None`` means unlimited where allowed."""

    queue_capacity: int = 1024
    max_slot_queue: int = 100
    max_total_pending: int | None = 1024
    max_slots: int | None = 1024
    max_waiters: int | None = 1024

    def __attrs_post_init__(self) -> None:
        check_capacity("queue_capacity", self.queue_capacity)
        _check_limit("max_slot_queue", self.max_slot_queue, minimum=0, optional=False)
        _check_limit("max_total_pending", self.max_total_pending, minimum=0)
        _check_limit("max_slots", self.max_slots, minimum=1)
        _check_limit("max_waiters", self.max_waiters, minimum=0)


def _check_slot(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"slot must be a str or None, got {value!r}")
    if not value:
        raise ConfigError(f"slot must not be empty, got {value!r}")
    return value


@attrs.frozen
class ControllerSpec:
    """A submission to the controller: the task, its slot and the busy-slot policy."""

    task: TaskSpec
    policy: AdmissionPolicy = AdmissionPolicy.QUEUE
    slot: str | None = attrs.field(default=None, converter=_check_slot)
    wait: bool = False

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.task, TaskSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"task must be a TaskSpec, got {self.task!r}")
        if not isinstance(self.policy, AdmissionPolicy):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"policy must be an AdmissionPolicy, got {self.policy!r}")
        if not isinstance(self.wait, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"wait must be a bool, got {self.wait!r}")
        if self.wait and self.policy in (AdmissionPolicy.JOIN, AdmissionPolicy.DROP_IF_RUNNING):
            raise ConfigError(f"policy {self.policy.name} has no wait mode, got wait=True")

    @property
    def slot_name(self) -> str:
        """The slot: ``slot``, or the task name."""
        return self.task.name if self.slot is None else self.slot

    @classmethod
    def queue(
        cls, task: TaskSpec, *, slot: str | None = None, wait: bool = False
    ) -> ControllerSpec:
        """Run when the slot is free; queue FIFO behind its owner."""
        return cls(task, AdmissionPolicy.QUEUE, slot, wait)

    @classmethod
    def replace(
        cls, task: TaskSpec, *, slot: str | None = None, wait: bool = False
    ) -> ControllerSpec:
        """Stop the slot's owner and become the head of its queue."""
        return cls(task, AdmissionPolicy.REPLACE, slot, wait)

    @classmethod
    def drop_if_running(cls, task: TaskSpec, *, slot: str | None = None) -> ControllerSpec:
        """Run only if the slot is idle; otherwise reject ``SLOT_BUSY``."""
        return cls(task, AdmissionPolicy.DROP_IF_RUNNING, slot)

    @classmethod
    def join(cls, task: TaskSpec, *, slot: str | None = None) -> ControllerSpec:
        """On a busy slot, start nothing: resolve to the outcome of the slot's last work."""
        return cls(task, AdmissionPolicy.JOIN, slot)


@attrs.frozen
class SlotView:
    """One tracked slot in a ``ControllerSnapshot``."""

    slot: str
    status: SlotStatus
    owner_id: TaskId
    queue_depth: int
    waiting: int
    status_for: float


@attrs.frozen
class ControllerSnapshot:
    """The controller's slots at one instant, sorted by slot."""

    slots: tuple[SlotView, ...]
    running_count: int
    total_queued: int

    def slot(self, name: str) -> SlotView | None:
        """The view of slot ``name``, or ``None`` if it is not tracked."""
        for view in self.slots:
            if view.slot == name:
                return view
        return None


class SubmitCommand:
    __slots__ = ("entry",)

    def __init__(self, entry: Entry) -> None:
        self.entry = entry


class RemoveCommand:
    __slots__ = ("reply", "target")

    def __init__(self, target: TaskId, reply: Reply) -> None:
        self.target = target
        self.reply = reply


ControllerCommand = SubmitCommand | RemoveCommand


class PreparedSubmission:
    """A submission whose ``TaskId`` is allocated; submit it once."""

    __slots__ = ("_controller", "_entry", "_used", "id")

    def __init__(self, controller: Controller, entry: Entry) -> None:
        self._controller = controller
        self._entry = entry
        self._used = False
        self.id: TaskId = entry.payload.id

    def __repr__(self) -> str:
        return f"<PreparedSubmission {self.id} slot={self._entry.key!r}>"

    def _claim(self) -> Entry:
        if self._used:
            raise RuntimeError(f"prepared submission {self.id} was already submitted")
        self._used = True
        return self._entry

    async def submit(self) -> TaskWaiter:
        """Submit; waits for controller command capacity (intake only)."""
        self._controller.check_open()
        entry = self._claim()
        try:
            return await self._controller.submit(entry)
        except BaseException:
            # Not sent (cancelled or closed before intake): leave the submission unused.
            self._used = False
            raise

    def submit_nowait(self) -> TaskWaiter:
        """Submit without blocking; raises ``trio.WouldBlock`` when the channel is full."""
        self._controller.check_open()
        if self._used:
            self._claim()  # raises: a second use must not send the entry again
        entry = self._entry
        self._controller.send_nowait(entry)
        self._claim()  # only now: a WouldBlock leaves the submission unused
        return entry.payload.waiter  # type: ignore[no-any-return]


class Controller:
    """The controller loop and the driver of its ``SlotMachine``."""

    def __init__(
        self,
        config: ControllerConfig,
        registry: Registry,
        bus: EventBus,
        resolve: Resolver,
        is_closed: Callable[[], bool],
    ) -> None:
        self.machine = SlotMachine(
            max_slot_queue=config.max_slot_queue,
            max_total_pending=config.max_total_pending,
            max_slots=config.max_slots,
            max_waiters=config.max_waiters,
        )
        self.registry = registry
        self.bus = bus
        self._resolve = resolve
        self._is_closed = is_closed
        self._send, self._recv = trio.open_memory_channel[ControllerCommand](config.queue_capacity)
        self._loop_scope = trio.CancelScope()
        self.exited = trio.Event()
        # Submissions sent but not yet taken in by the loop, and callers that wait
        # for one to be taken in (deadlock checks).
        self._in_channel: set[int] = set()
        self._taken_in: dict[int, trio.Event] = {}

    # -- intake (caller's task) ----------------------------------------------------------

    def check_open(self) -> None:
        if self._is_closed():
            raise SupervisorClosedError("the supervisor is shutting down; intake is closed")

    def prepare(self, request: ControllerSpec) -> Entry:
        """Build the entry (and its record) of ``request``; allocates the ``TaskId``."""
        if not isinstance(request, ControllerSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"expected a ControllerSpec, got {request!r}")
        spec = request.task
        key = request.slot_name
        rec = TaskRecord.for_spec(spec, self._resolve(spec), slot=key)
        rec.controller = self
        rec.waiter._guard = self  # pyright: ignore[reportPrivateUsage]
        entry = Entry(rec.id, key, request.policy, wait=request.wait, payload=rec)
        rec.entry = entry
        return entry

    async def submit(self, entry: Entry) -> TaskWaiter:
        """Submit: take it in here when nothing is queued before it, else send it.

        The fast path runs after the checkpoint every async method owes, so a caller
        cancelled there leaves no trace, as with the channel.
        """
        if self.idle():
            await trio.lowlevel.checkpoint()
            self.check_open()
            if self.idle():
                return self.take_in_now(entry)
        return await self.send(entry)

    async def send(self, entry: Entry) -> TaskWaiter:
        """Send a submission, waiting for channel capacity."""
        self._sending(entry)
        try:
            await self._send.send(SubmitCommand(entry))
        except BaseException as exc:
            self._not_sent(entry, exc)
        return entry.payload.waiter  # type: ignore[no-any-return]

    def send_nowait(self, entry: Entry) -> TaskWaiter:
        """Send a submission; ``trio.WouldBlock`` when the channel is full."""
        self._sending(entry)
        try:
            self._send.send_nowait(SubmitCommand(entry))
        except BaseException as exc:
            self._not_sent(entry, exc)
        return entry.payload.waiter  # type: ignore[no-any-return]

    def _sending(self, entry: Entry) -> None:
        # Counted from intake until the entry leaves the controller's custody.
        self.registry.work.add()
        self._in_channel.add(entry.id)

    def _not_sent(self, entry: Entry, exc: BaseException) -> NoReturn:
        self.registry.work.sub()
        self._in_channel.discard(entry.id)
        if isinstance(exc, trio.BrokenResourceError):
            raise SupervisorClosedError("the supervisor has shut down") from None
        raise exc

    def _take_in(self, entry: Entry) -> None:
        self._in_channel.discard(entry.id)
        if self._taken_in:
            event = self._taken_in.pop(entry.id, None)
            if event is not None:
                event.set()
        self.machine.submit(entry, trio.current_time())

    async def check_deadlock(self, waiter: TaskWaiter) -> None:
        """Raise ``DeadlockError`` if the calling attempt waits behind its own slot."""
        context = current_task_context.get(None)
        if context is None or context.slot is None:
            return
        if waiter.id in self._in_channel:
            event = self._taken_in.setdefault(waiter.id, trio.Event())
            await event.wait()
        if self.machine.is_behind(waiter.id, context.slot):
            raise DeadlockError(
                f"task {context.name!r} ({context.id}) waits for {waiter.name!r} ({waiter.id}), "
                f"which is queued behind the task's own slot {context.slot!r}"
            )

    async def stop(self, target: TaskId) -> tuple[bool, TaskRecord | None] | None:
        """Route a stop by id through the controller; ``None`` if the loop has ended."""
        reply = Reply()
        try:
            await self._send.send(RemoveCommand(target, reply))
        except trio.BrokenResourceError:
            return None
        await reply.wait()
        return reply.value  # type: ignore[return-value]

    def snapshot(self) -> ControllerSnapshot:
        now = trio.current_time()
        views: list[SlotView] = []
        for slot in sorted(self.machine.slots.values(), key=lambda s: s.key):
            # Invariant: a tracked slot always has an owner (held or queued work of an
            # ownerless slot starts at once).
            assert slot.owner is not None
            assert slot.status is not None
            views.append(
                SlotView(
                    slot=slot.key,
                    status=slot.status,
                    owner_id=TaskId(slot.owner.id),
                    queue_depth=len(slot.queue),
                    waiting=len(slot.held),
                    status_for=now - slot.since,
                )
            )
        return ControllerSnapshot(
            slots=tuple(views),
            running_count=sum(1 for v in views if v.status is SlotStatus.RUNNING),
            total_queued=self.machine.pending,
        )

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve submissions and removes until the shutdown ends the loop."""
        try:
            with self._loop_scope:
                task_status.started()
                receive = self._recv.receive
                receive_nowait = self._recv.receive_nowait
                while True:
                    await self._handle(await receive())
                    # Submissions already buffered: no scheduler pass each.
                    while True:
                        try:
                            command = receive_nowait()
                        except trio.WouldBlock:
                            break
                        await self._handle(command)
        finally:
            # The registry has ended: what is still queued gets the shutdown's replies.
            while True:
                try:
                    command = self._recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if type(command) is SubmitCommand:
                    self._take_in(command.entry)
                    self._apply_direct()
                else:
                    assert type(command) is RemoveCommand
                    command.reply.set(self._remove_held(command.target) or (False, None))
            self._recv.close()
            self.exited.set()

    def close(self) -> None:
        """Shutdown began: reject queued and held work; queues never advance again."""
        self.machine.close()
        self._apply_direct()

    def end(self) -> None:
        """The registry has ended: stop the loop once it drained its channel."""
        self._loop_scope.cancel(reason="supervisor shut down")

    async def _handle(self, command: ControllerCommand) -> None:
        if type(command) is SubmitCommand:
            self._take_in(command.entry)
            self._apply_direct()
            return
        assert type(command) is RemoveCommand
        removed = self._remove_held(command.target)
        if removed is not None:
            command.reply.set(removed)
            return
        try:
            await self._to_registry(StopCommand(command.target, command.reply))
        except trio.BrokenResourceError:
            command.reply.set((False, None))

    async def _to_registry(self, command: Command) -> None:
        """Send to the registry, yielding only when its channel is full.

        Not yielding keeps the loop on its buffered submissions, which thus see this
        owner still ``ADMITTING``; the loop's next ``receive`` is its checkpoint.
        """
        try:
            self.registry.send.send_nowait(command)
        except trio.WouldBlock:
            await self.registry.send.send(command)

    def _remove_held(self, target: TaskId) -> tuple[bool, TaskRecord] | None:
        entry = self.machine.remove(target, trio.current_time())
        if entry is None:
            return None
        rec: TaskRecord = entry.payload
        if self.bus.active:
            # As for registered work, before the rejection the removal causes.
            self.bus.publish(
                EventKind.TASK_REMOVE_REQUESTED, task_id=rec.id, name=rec.name, slot=entry.key
            )
        self._apply_direct()
        return True, rec

    # -- registry callbacks (registry's or actor's task) ------------------------------------

    def on_admission(self, rec: TaskRecord, accepted: bool) -> None:
        """The registry decided on an owner sent through its channel."""
        self.registry.work.sub()  # the entry left the controller's custody
        self.machine.admitted(rec.entry, accepted, trio.current_time())
        self._apply_direct()

    def on_exit(self, rec: TaskRecord) -> None:
        """An owner physically exited and its outcome is committed."""
        self.machine.exited(rec.entry, trio.current_time())
        self._apply_direct()

    # -- effects ------------------------------------------------------------------------------

    def _apply_direct(self) -> None:
        """Carry out pending effects now, without waiting."""
        machine = self.machine
        while machine.effects:
            for entry in self._apply(machine.effects):
                if not self._queue_admission(entry):
                    self._admit_now(entry)

    def _queue_admission(self, entry: Entry) -> bool:
        """Send an owner's admission behind the registry's pending commands.

        Returns ``False`` when the registry is idle (nothing is ordered before this
        admission, so it is admitted directly) or its channel is full or closed. While
        the command waits in the registry's channel, the owner is ``ADMITTING``.
        """
        registry = self.registry
        if registry.idle():
            return False
        registry.work.add()
        try:
            registry.send.send_nowait(AddCommand((entry.payload,), None))
        except (trio.WouldBlock, trio.BrokenResourceError):
            registry.work.sub()
            return False
        return True

    def _admit_now(self, entry: Entry) -> None:
        accepted = self.registry.admit_now(entry.payload)
        self.registry.work.sub()  # the entry left the controller's custody
        self.machine.admitted(entry, accepted, trio.current_time())

    def idle(self) -> bool:
        """Whether no submission is queued or in flight: the loop is parked in ``receive``.

        Then a caller may take its submission in itself (see ``take_in_now``).
        """
        stats = self._send.statistics()
        return stats.current_buffer_used == 0 and stats.tasks_waiting_receive == 1

    def take_in_now(self, entry: Entry) -> TaskWaiter:
        """Take a submission in, in the caller's task; only when ``idle()``."""
        self.registry.work.add()  # counted until it leaves the controller's custody
        self._take_in(entry)
        self._apply_direct()
        return entry.payload.waiter  # type: ignore[no-any-return]

    def _apply(self, effects: list[tuple[str, Entry, Any]]) -> list[Entry]:
        """Carry out every effect but admissions, which are returned in order."""
        self.machine.effects = []
        admits: list[Entry] = []
        work = self.registry.work
        bus = self.bus
        for tag, entry, arg in effects:
            rec: TaskRecord = entry.payload
            if tag is ADMIT:
                admits.append(entry)
            elif tag is STOP:
                self.registry.stop(rec.id)
            elif tag is REJECT or tag is DETACH:
                rejection = RejectionKind(arg)
                rec.waiter._resolve(rejected_outcome(rejection))  # pyright: ignore[reportPrivateUsage]
                if tag is REJECT:
                    work.sub()
                if bus.active:
                    bus.publish(
                        EventKind.CONTROLLER_REJECTED,
                        task_id=rec.id,
                        name=rec.name,
                        slot=entry.key,
                        rejection=rejection,
                        reason=rejection.value,
                    )
            elif tag is JOIN:
                work.sub()
                target: TaskRecord = arg.payload
                rec.waiter._follow(target.waiter)  # pyright: ignore[reportPrivateUsage]
            elif bus.active:
                kind = (
                    EventKind.CONTROLLER_SUBMITTED
                    if tag is SUBMITTED
                    else EventKind.CONTROLLER_SLOT_TRANSITION
                )
                bus.publish(kind, task_id=rec.id, name=rec.name, slot=entry.key, reason=arg)
        return admits
