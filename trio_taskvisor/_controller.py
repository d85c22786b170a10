"""The keyed controller: one owner per slot, with queue / replace / drop / join policies.

The controller loop takes submissions, id-based removes and the registry's reports from
one ``Inbox`` and drives the pure ``SlotMachine`` (``_slots``), carrying out its effects.
Its callers use these methods:

* ``submit`` (the facade) takes a submission in with the loop's own core (``_take_in``)
  in the caller's task when the inbox is idle (nothing queued, the loop parked in
  ``get()``), after the caller's checkpoint: nothing is ordered before it then, and code
  between two checkpoints is as atomic there as in the loop. Otherwise it is queued.
* ``submit_nowait`` and ``remove`` always queue, in call order. A remove by ``TaskId``
  that the controller does not hold is forwarded to the registry's inbox with the
  caller's reply (``Registry.forward_stop``), so it is ordered after the submission it
  targets.
* ``close`` (the shutdown) runs directly: from then on nothing is admitted, and queued
  and held work is rejected.
* ``RecordListener`` (``_record``): ``owner_exited`` runs directly in the exiting actor's
  task, after the registry has committed the owner's outcome, so a slot never waits a loop
  hop between two owners; ``admission_decided`` (the registry's loop, for an admission it
  had queued) is handed to this loop's inbox, so the registry never calls back into itself.

Owners go to the registry with ``Registry.admit``: decided at once when the registry is
idle (then ``ADMITTING`` is not observable), or queued behind its commands (``ADMITTING``
until the decision).

Decisions the design leaves open:

* A JOIN on an idle slot starts its own work, like any policy on an idle slot.
* No ``CONTROLLER_SLOT_TRANSITION`` is published for an owner whose outcome is committed
  (after its ``TASK_REMOVED``: a forced owner still running, a late admission report).
* ``prepare_submission`` captures the caller's context variables when it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import trio
from trio_util import AsyncBool

from ._bus import EventBus
from ._config import ControllerConfig
from ._events import EventKind
from ._exceptions import DeadlockError, SupervisorClosedError
from ._inbox import Inbox, Reply
from ._outcome import RejectionKind, TaskId, rejected_outcome
from ._record import TaskRecord, current_task_context
from ._registry import Registry
from ._slots import (
    Admit,
    Detach,
    Effect,
    Entry,
    Join,
    Reject,
    SlotMachine,
    SlotStatus,
    Stop,
    Submitted,
    Transition,
)
from ._spec import ControllerSpec, TaskSpec
from ._waiter import TaskWaiter


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


class _Submit(NamedTuple):
    entry: Entry[TaskRecord]


class _Remove(NamedTuple):
    target: TaskId
    reply: Reply[tuple[bool, TaskRecord | None]]


class _Decided(NamedTuple):
    """The registry's loop decided on an owner it had queued."""

    entry: Entry[TaskRecord]
    accepted: bool


_Command = _Submit | _Remove | _Decided

NewRecord = Callable[[TaskSpec[Any], str], TaskRecord]


class Controller:
    """The controller loop and the driver of its ``SlotMachine``; a ``RecordListener``."""

    def __init__(
        self,
        config: ControllerConfig,
        registry: Registry,
        bus: EventBus,
        new_record: NewRecord,
    ) -> None:
        self.machine: SlotMachine[TaskRecord] = SlotMachine(
            max_slot_queue=config.max_slot_queue,
            max_total_pending=config.max_total_pending,
            max_slots=config.max_slots,
            max_waiters=config.max_waiters,
        )
        self._registry = registry
        self._bus = bus
        self._new_record = new_record
        self._inbox: Inbox[_Command] = Inbox(config.queue_capacity)
        self._loop_scope = trio.CancelScope()
        self.exited = trio.Event()
        # Submissions in the inbox, and callers waiting for one to be taken in (deadlock
        # checks).
        self._in_inbox: set[int] = set()
        self._taken_in: dict[int, trio.Event] = {}
        # Entries in the controller's custody: from intake until rejected, joined or
        # handed to the registry. No custody: what wait_idle() waits for.
        self._custody = 0
        self.idle = AsyncBool(True)

    # -- intake (the caller's task) --------------------------------------------------------

    def prepare(self, request: ControllerSpec[Any]) -> Entry[TaskRecord]:
        """Build the entry (and its record) of ``request``; allocates the ``TaskId``."""
        if not isinstance(request, ControllerSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"expected a ControllerSpec, got {request!r}")
        key = request.slot_name
        rec = self._new_record(request.task, key)
        rec.listener = self
        rec._guard = self  # pyright: ignore[reportPrivateUsage]
        entry = Entry(rec.id, key, request.policy, wait=request.wait, payload=rec)
        rec.entry = entry
        return entry

    def submit_nowait(self, entry: Entry[TaskRecord]) -> None:
        """Queue ``entry``; ``trio.WouldBlock`` when the inbox is full."""
        try:
            self._inbox.put_nowait(_Submit(entry))
        except trio.BrokenResourceError:
            raise SupervisorClosedError from None
        self._accept(entry)
        self._in_inbox.add(entry.id)

    async def submit(self, entry: Entry[TaskRecord]) -> None:
        """Take ``entry`` in: a checkpoint first; cancelled before intake, it is not."""
        if self._inbox.idle():
            await trio.lowlevel.checkpoint()
            self._registry.check_intake()  # the shutdown may have begun meanwhile
            if self._inbox.idle():  # still nothing queued before it: take it in here
                self._accept(entry)
                self._take_in(entry)
                return
        self._accept(entry)
        self._in_inbox.add(entry.id)
        try:
            await self._inbox.put(_Submit(entry))
        except BaseException as exc:
            self._in_inbox.discard(entry.id)
            self._release_custody()
            if isinstance(exc, trio.BrokenResourceError):
                raise SupervisorClosedError from None
            raise

    async def remove(self, target: TaskId) -> tuple[bool, TaskRecord | None] | None:
        """Stop work by id, ordered after every submission before it.

        Queued, held or joined work is taken out here: ``(True, its record)``; any other
        target is stopped by the registry. ``None`` once the loop has ended.
        """
        reply: Reply[tuple[bool, TaskRecord | None]] = Reply()
        try:
            await self._inbox.put(_Remove(target, reply))
        except trio.BrokenResourceError:
            return None
        return await reply.wait()

    def _accept(self, entry: Entry[TaskRecord]) -> None:
        if not self._custody:
            self.idle.value = False
        self._custody += 1

    def _release_custody(self) -> None:
        self._custody -= 1
        if not self._custody:
            self.idle.value = True

    def _take_in(self, entry: Entry[TaskRecord]) -> None:
        if self._taken_in:
            event = self._taken_in.pop(entry.id, None)
            if event is not None:
                event.set()
        self.machine.submit(entry, trio.current_time())
        self._apply()

    # -- waits (a waiter's task) -------------------------------------------------------------

    async def check_wait(self, waiter: TaskWaiter[Any]) -> None:
        """Raise ``DeadlockError`` if the calling attempt waits behind its own slot."""
        context = current_task_context.get(None)
        if context is None or context.slot is None:
            return
        if waiter.id in self._in_inbox:
            event = self._taken_in.setdefault(waiter.id, trio.Event())
            await event.wait()
        if self.machine.is_behind(waiter.id, context.slot):
            raise DeadlockError(
                f"task {context.name!r} ({context.id}) waits for {waiter.name!r} ({waiter.id}), "
                f"which is queued behind the task's own slot {context.slot!r}"
            )

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
        """Serve the inbox until the shutdown ends the loop."""
        get = self._inbox.get
        get_nowait = self._inbox.get_nowait
        try:
            with self._loop_scope:
                task_status.started()
                while True:
                    self._handle(await get())
                    # Commands already queued: no scheduler pass each.
                    while True:
                        try:
                            command = get_nowait()
                        except trio.WouldBlock:
                            break
                        self._handle(command)
        finally:
            # The registry has ended: what is still queued gets the shutdown's answers.
            self._inbox.close()
            while True:
                try:
                    command = get_nowait()
                except trio.WouldBlock:
                    break
                self._handle(command)
            self.exited.set()

    def close(self) -> None:
        """Shutdown began: reject queued and held work; nothing advances any more."""
        self.machine.close()
        self._apply()

    def end(self) -> None:
        """The registry has ended: stop the loop once it drained its inbox."""
        self._loop_scope.cancel(reason="supervisor shut down")

    def _handle(self, command: _Command) -> None:
        match command:
            case _Submit(entry):
                self._in_inbox.discard(entry.id)
                self._take_in(entry)
            case _Remove(target, reply):
                removed = self._remove(target)
                if removed is None:
                    self._registry.forward_stop(target, reply)
                else:
                    reply.set(removed)
            case _Decided(entry, accepted):
                # Stale when the owner has exited meanwhile: the machine ignores it.
                self.machine.admitted(entry, accepted, trio.current_time())
                self._apply()
                if not accepted:
                    entry.payload.release()

    def _remove(self, target: TaskId) -> tuple[bool, TaskRecord] | None:
        entry = self.machine.remove(target, trio.current_time())
        if entry is None:
            return None
        rec = entry.payload
        if self._bus.active:
            # As for registered work, before the rejection the removal causes.
            self._bus.publish(EventKind.TASK_REMOVE_REQUESTED, rec.id, rec.name, entry.key)
        self._apply()
        return True, rec

    # -- the registry's reports (RecordListener) ----------------------------------------------

    def admission_decided(self, rec: TaskRecord, accepted: bool) -> None:
        # The entry now: an accepted owner may run and exit before this loop gets to it.
        entry = rec.entry
        assert isinstance(entry, Entry)
        self._inbox.put_nowait(_Decided(entry, accepted), force=True)  # pyright: ignore[reportUnknownArgumentType]

    def owner_exited(self, rec: TaskRecord) -> None:
        entry = rec.entry
        assert isinstance(entry, Entry)
        self.machine.exited(entry, trio.current_time())  # pyright: ignore[reportUnknownArgumentType]
        self._apply()

    # -- effects ------------------------------------------------------------------------------

    def _apply(self) -> None:
        """Carry out the machine's effects: all but admissions in order, then those."""
        machine = self.machine
        while machine.effects:
            effects, machine.effects = machine.effects, []
            admits = [effect.entry for effect in effects if type(effect) is Admit]
            for effect in effects:
                self._carry_out(effect)
            for entry in admits:
                self._admit(entry)

    def _carry_out(self, effect: Effect[TaskRecord]) -> None:
        bus = self._bus
        match effect:
            case Admit():
                pass  # after the others (see _apply)
            case Stop(entry):
                self._registry.stop_record(entry.payload)
            case Reject(entry, kind):
                self._release_custody()
                self._rejected(entry, kind)
                entry.payload.release()
            case Detach(entry, kind):
                self._rejected(entry, kind)  # a joiner: out of custody since it joined
            case Join(entry, target):
                self._release_custody()  # it only follows: the followed work is counted
                entry.payload._follow(target.payload)  # pyright: ignore[reportPrivateUsage]
            case Submitted(entry, reason):
                if bus.active:
                    rec = entry.payload
                    bus.publish(
                        EventKind.CONTROLLER_SUBMITTED, rec.id, rec.name, entry.key, reason=reason
                    )
            case Transition(entry, reason):
                rec = entry.payload
                # Not after the owner's TASK_REMOVED (a forced owner still running, a
                # decision that arrived late): a task's events end there (section 12).
                if bus.active and not rec.committed:
                    bus.publish(
                        EventKind.CONTROLLER_SLOT_TRANSITION,
                        rec.id,
                        rec.name,
                        entry.key,
                        reason=reason,
                    )

    def _rejected(self, entry: Entry[TaskRecord], kind: RejectionKind) -> None:
        rec = entry.payload
        rec._resolve(rejected_outcome(kind))  # pyright: ignore[reportPrivateUsage]
        if self._bus.active:
            self._bus.publish(
                EventKind.CONTROLLER_REJECTED,
                rec.id,
                rec.name,
                entry.key,
                reason=kind.value,
                rejection=kind,
            )

    def _admit(self, entry: Entry[TaskRecord]) -> None:
        """Hand an owner to the registry; learn its decision now or from its loop."""
        rec = entry.payload
        accepted = self._registry.admit(rec)
        self._release_custody()  # the registry counts it from here
        if accepted is not None:
            self.machine.admitted(entry, accepted, trio.current_time())
            if not accepted:
                rec.release()
