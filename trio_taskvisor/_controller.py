"""The keyed controller: one owner per slot, with queue / replace / drop / join policies.

The controller loop takes submissions, id-based removes and the registry's reports from
one ``Inbox`` and drives the pure ``SlotMachine`` (``_slots``), carrying out its effects.
Its callers use these methods:

* ``submit`` (the facade) takes a submission in with the loop's own core (``_take_in``)
  in the caller's task when the inbox is idle (nothing queued, the loop parked in its
  wait), then takes a shielded checkpoint (trio's idiom): nothing is ordered before it
  then, and code between two checkpoints is as atomic there as in the loop. Otherwise
  it is queued.
* ``submit_nowait``, ``remove`` and ``cancel_slot`` always queue, in call order. A remove
  by ``TaskId`` that the controller does not hold is forwarded to the registry's inbox
  with the caller's reply (``Registry.forward_stop``), so it is ordered after the
  submission it targets.
* ``wait_slot_idle`` and ``snapshot`` read the state in the caller's task.
* ``close`` (the shutdown) runs directly: from then on nothing is admitted, and queued
  and held work is rejected.
* ``RecordListener`` (``_record``): ``owner_exited`` runs directly in the exiting actor's
  task, after the registry has committed the owner's outcome, so a slot never waits a loop
  hop between two owners; ``admission_decided`` (the registry's loop, for an admission it
  had queued) is handed to this loop's inbox, so the registry never calls back into itself.

Owners go to the registry with ``Registry.admit``: decided at once when the registry is
idle (then ``ADMITTING`` is not observable), or queued behind its commands (``ADMITTING``
until the decision).

Placement, queue deadlines, slot-wide operations, wait-for cycles:

* Placement comes with the machine's ``Submitted`` effects (``OWNER``, ``QUEUED``,
  ``JOINED``) and its rejections (``REJECTED``, which changes nothing once placed).
* Queue deadlines: a submission's deadline is its intake time plus its ``queue_timeout``,
  stamped when ``submit`` / ``submit_nowait`` hands it over. The loop waits for its next
  command or the machine's ``next_deadline``, whichever comes first, as the registry's
  loop does for force deadlines (the skeleton both share: ``Inbox.serve``); work taken
  in from another task (``submit``'s direct path) with an earlier deadline brings the
  wake-up forward (``Inbox.wake_at``).
* The wait guard (``_waits``) learns from ``slot_edge`` / ``slot_owner`` what work waits
  for in the slots, and from ``_take_in`` when taken-in work gains such an edge.

Placement, queue deadlines and slot-wide operations in cluster slots: the cluster machine places
the work from the keeper's reports with the same ``Submitted`` / ``Reject`` effects, and
its queue deadlines run through the same ``next_deadline`` / ``_expire`` wake-ups (a
timed-out cluster entry also leaves the cluster queue: ``Withdraw``). The slot-wide
operations go through ``_cancel_slot_now`` (withdraw this process's line, stop a local
owner: ``_stop_owner``) and ``slot_idle``; the wait guard sees the slots through
``slot_edge`` / ``slot_owner`` (local only: detection is local to one process). What the
slot-wide operations add for a cluster slot runs in the caller's task, after the loop's
part, and is awaited there (the loop never awaits the server):

* ``cancel_slot`` without a local owner asks the store to stop the lease holder wherever
  it runs (``keeper.stop_owner``: the ``stop_owner`` script, which marks the lease and
  messages its process as a REPLACE does, once per lease; sent by the loop after its
  withdrawals, so a caller cancelled meanwhile does not stop it). Its answer is the
  stopped lease's fence token; the caller then asks the store (``query``) every
  ``STORE_POLL_INTERVAL`` until the slot's lease is no longer that one. Polled, because
  a release wakes only the queue's head and an expiry wakes nobody; the token, because
  the next owner may be of the same process.
* ``wait_slot_idle``, once the slot is idle here, asks the store every
  ``STORE_POLL_INTERVAL`` until it reports no lease and no live entry (``query`` is
  ``None``) while the slot is still idle here.
* Both raise ``SlotStoreUnavailableError`` when the server does not answer within
  ``connect_timeout``, as ``cluster_slot`` does; withdrawals and the stop request stay
  pending in the keeper and are sent once the server answers.
* A grant that arrives for work that has left (removed, timed out, cancelled) is given
  back with a second, idempotent withdrawal rather than a release: the server keeps the
  first reason the entry left, which is what joiners in other processes read.

Decisions the design leaves open:

* A JOIN on an idle slot starts its own work, like any policy on an idle slot.
* No ``CONTROLLER_SLOT_TRANSITION`` is published for an owner whose outcome is committed
  (after its ``TASK_REMOVED``: a forced owner still running, a late admission report).
* ``prepare_submission`` captures the caller's context variables when it is called.
* ``cancel_slot`` changes no slot status (as ``cancel`` by id): an owner it stops stays
  ``RUNNING`` until it exits. An owner the registry has not decided on yet is stopped
  through the registry's inbox, after its admission, as ``cancel`` by id is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, NamedTuple, Protocol, assert_never, cast

import attrs
import trio
from trio_util import AsyncBool

from ._bus import EventBus
from ._clusterslots import (
    Ask,
    ClusterEffect,
    ClusterSlotMachine,
    Follow,
    FollowerDone,
    GiveBack,
    LeaseLostNotice,
    LoseLease,
    LostUnstarted,
    Notice,
    Release,
    SetFence,
    StopAsked,
    StoreState,
    Unfollow,
    Withdraw,
)
from ._config import ControllerConfig, check_sendable
from ._events import EventKind
from ._exceptions import ConfigError, DeadlockError, SupervisorClosedError
from ._inbox import Inbox, Reply
from ._outcome import OutcomeKind, Placement, RejectionKind, TaskId, TaskOutcome, rejected_outcome
from ._record import TaskRecord
from ._registry import Registry
from ._slots import (
    NO_DEADLINE,
    Admit,
    Detach,
    Effect,
    Entry,
    Join,
    Reject,
    RemoveRequested,
    SlotMachine,
    SlotStatus,
    Stop,
    Submitted,
    Transition,
)
from ._slotstore import (
    ClusterSlotInfo,
    FollowedOutcome,
    Full,
    Joined,
    LeaseLost,
    Owner,
    Queued,
    Rejected,
    RemoteStop,
    Report,
    ReportSink,
    Room,
    StoreRecovered,
    StoreUnavailable,
)
from ._spec import AdmissionPolicy, ControllerSpec, TaskSpec, not_a
from ._waitfor import Edge
from ._waits import WaitChecker


@attrs.frozen
class SlotView:
    """One tracked slot in a ``ControllerSnapshot``."""

    slot: str
    """The slot's name."""
    status: SlotStatus
    """The owner's stage."""
    owner_id: TaskId | None
    """The local owner's ``TaskId``; ``None`` when the slot is ``REMOTE``."""
    queue_depth: int
    """Entries queued behind the owner, a replacement head included; this process's only."""
    waiting: int
    """``wait=True`` submissions held for budget room."""
    status_for: float
    """Seconds since the slot entered its current status."""
    fence_token: int | None = None
    """The local owner's lease fence token; ``None`` without a slot store or a local owner."""


@attrs.frozen
class ControllerSnapshot:
    """The controller's slots at one instant, sorted by slot."""

    slots: tuple[SlotView, ...]
    """Every tracked slot, sorted by name: those with an owner, queued or held work."""
    running_count: int
    """The number of slots whose status is ``RUNNING``."""
    total_queued: int
    """Queued entries over all slots (the ``max_total_pending`` budget); held work excluded."""

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


class _CancelSlot(NamedTuple):
    key: str
    reply: Reply[_SlotCancelled]


class _SlotCancelled(NamedTuple):
    """The loop's part of ``cancel_slot``: the count so far, the local owner it stopped,
    and (cluster slots without a local owner) the stop it asked of a remote owner."""

    counted: int
    owner: TaskRecord | None
    remote: StopRequest | None


_Command = _Submit | _Remove | _Decided | _CancelSlot | Report

_EDGE_LABELS: Final = {
    "queued": "is queued behind",
    "held": "is held behind",
    "joined": "follows",
}

NewRecord = Callable[[TaskSpec[Any], str], TaskRecord]

# Seconds between the slot store queries of cancel_slot (a remote owner's lease released)
# and wait_slot_idle (the slot idle cluster-wide): real time, one round trip each.
STORE_POLL_INTERVAL: Final = 0.05


class StopRequest(Protocol):
    """A stop asked of the holder of a slot's lease (``LeaseKeeperSeam.stop_owner``)."""

    async def wait(self) -> int | None:
        """The fence token of the lease asked to stop (``None``: the slot had none)."""
        ...


class LeaseKeeperSeam(Protocol):
    """What the controller needs of the lease keeper (``_keeper.LeaseKeeper``)."""

    instance_id: str

    def submit(
        self, slot: str, task_id: int, policy: AdmissionPolicy, max_queue: int, wait: bool, /
    ) -> None: ...

    def withdraw(self, slot: str, task_id: int, reason: RejectionKind, /) -> None: ...

    def release(self, slot: str, task_id: int, outcome: TaskOutcome[Any], /) -> None: ...

    def follow(self, joiner: int, slot: str, target: str, /) -> None: ...

    def unfollow(self, joiner: int, /) -> None: ...

    def stop_owner(self, slot: str, /) -> StopRequest: ...

    def lease_lost(self, task_id: int, /) -> str | None: ...

    async def query(self, slot: str, /) -> ClusterSlotInfo | None: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    async def aclose(self) -> None: ...


class _ReportInbox:
    """The keeper's ``ReportSink``: its reports go to the controller's inbox, never refused."""

    __slots__ = ("_inbox",)

    def __init__(self, inbox: Inbox[_Command]) -> None:
        self._inbox = inbox

    def send_nowait(self, report: Report) -> None:
        self._inbox.put_nowait(report, force=True)


class Controller:
    """The controller loop and the driver of its ``SlotMachine``; a ``RecordListener``."""

    def __init__(
        self,
        config: ControllerConfig,
        registry: Registry,
        bus: EventBus,
        new_record: NewRecord,
        waits: WaitChecker,
        keeper: Callable[[ReportSink], LeaseKeeperSeam] | None = None,
    ) -> None:
        self._registry = registry
        self._bus = bus
        self._new_record = new_record
        self._max_slot_queue = config.max_slot_queue
        self._inbox: Inbox[_Command] = Inbox(config.queue_capacity)
        # With a slot store, the lease keeper (built here: it reports to this inbox)
        # places the work and the machine keeps the local view of cluster slots.
        self.keeper = None if keeper is None else keeper(_ReportInbox(self._inbox))
        kind: type[SlotMachine[TaskRecord]] = (
            SlotMachine[TaskRecord] if self.keeper is None else ClusterSlotMachine[TaskRecord]
        )
        machine = kind(
            max_slot_queue=config.max_slot_queue,
            max_total_pending=config.max_total_pending,
            max_slots=config.max_slots,
            max_waiters=config.max_waiters,
        )
        self.machine = machine
        self._cluster = (
            None if self.keeper is None else cast("ClusterSlotMachine[TaskRecord]", machine)
        )
        self._loop_scope = trio.CancelScope()
        self.exited = trio.Event()
        self._waits = waits
        waits.slots = self
        # Submissions in the inbox, by id (wait_slot_idle looks for their slots).
        self._in_inbox: dict[int, Entry[TaskRecord]] = {}
        # The registry's queued decisions on owners, in the inbox: until the loop takes
        # a rejection in, its slot is admitting an owner the registry no longer counts.
        self._decisions = 0
        # Nothing in the controller's custody (in the inbox, queued or held: owners are
        # the registry's, joiners follow other work): what wait_idle() waits for.
        # Derived from that state and set only when it changes, so work that passes
        # straight through (an idle slot) never touches it (benchmark row 4a).
        self.idle = AsyncBool(True)
        self._idle = True
        # wait_slot_idle: one event per slot waited for, set when the slot is idle.
        self._idle_waits: dict[str, trio.Event] = {}

    # -- intake (the caller's task) --------------------------------------------------------

    def prepare(self, request: ControllerSpec[Any]) -> Entry[TaskRecord]:
        """Build the entry (and its record) of ``request``; allocates the ``TaskId``."""
        if not isinstance(request, ControllerSpec):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise not_a(ControllerSpec, request)
        key = request.slot_name
        self.check_slot(key)
        rec = self._new_record(request.task, key)
        rec.listener = self
        timeout = request.queue_timeout
        entry = Entry(
            rec.id,
            key,
            request.policy,
            wait=request.wait,
            payload=rec,
            timeout=None if timeout is None or timeout == math.inf else timeout,
        )
        rec.entry = entry
        return entry

    def check_slot(self, key: str) -> None:
        """``ConfigError`` for a slot the slot store's server cannot be sent (see
        ``check_sendable``); any slot without a store."""
        if self.keeper is not None:
            check_sendable("slot", key)

    def submit_nowait(self, entry: Entry[TaskRecord]) -> None:
        """Queue ``entry``; ``trio.WouldBlock`` when the inbox is full."""
        if entry.timeout is not None:
            entry.deadline = trio.current_time() + entry.timeout  # intake: now
        try:
            self._inbox.put_nowait(_Submit(entry))
        except trio.BrokenResourceError:
            raise SupervisorClosedError from None
        self._in_inbox[entry.id] = entry
        self._sync_idle()

    async def submit(self, entry: Entry[TaskRecord]) -> None:
        """Take ``entry`` in, then a checkpoint; cancelled before intake, it is not.

        Once taken in, the submission stands: a cancellation that arrives during the
        checkpoint reaches the caller at its next one.
        """
        if self._inbox.idle():
            # Nothing queued before it: decide here, in the caller's task, then a
            # checkpoint that cannot undo the decision (as Registry.add and trio's
            # channel send do). The caller checked that the intake is open, and nothing
            # ran since. An owner's actor starts after the checkpoint, so submit returns
            # before the body starts, as when the loop takes the work in.
            await trio.lowlevel.checkpoint_if_cancelled()
            if entry.timeout is not None:
                entry.deadline = trio.current_time() + entry.timeout
            registry = self._registry
            held = registry.hold_actors()
            try:
                self._take_in(entry)
            finally:
                registry.stop_holding()
            await trio.lowlevel.cancel_shielded_checkpoint()
            registry.start_held(held)
            return
        self._in_inbox[entry.id] = entry  # counted from here: the loop may take it in the put
        self._sync_idle()
        try:
            if entry.timeout is None:
                await self._inbox.put(_Submit(entry))
            else:
                await self._put_timed(entry)
        except BaseException as exc:
            self._in_inbox.pop(entry.id, None)
            self._sync_idle()
            if self._idle_waits:
                self._check_idle_waits()
            if isinstance(exc, trio.BrokenResourceError):
                raise SupervisorClosedError from None
            raise

    async def _put_timed(self, entry: Entry[TaskRecord]) -> None:
        """Queue ``entry``, stamping its deadline at the moment the inbox takes it."""
        assert entry.timeout is not None
        command = _Submit(entry)
        await trio.lowlevel.checkpoint_if_cancelled()
        entry.deadline = trio.current_time() + entry.timeout
        try:
            self._inbox.put_nowait(command)
        except trio.WouldBlock:
            # Full: wait for room. ``put`` returns right after handing it over, before
            # the loop can have taken it in, so the intake time is now.
            await self._inbox.put(command)
            if entry.id in self._in_inbox:
                entry.deadline = trio.current_time() + entry.timeout
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

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

    def _sync_idle(self) -> None:
        machine = self.machine
        idle = not (
            self._in_inbox or self._decisions or machine.queued or machine.held or machine.asking
        )
        if idle is not self._idle:
            self._idle = idle
            self.idle.value = idle

    def _take_in(self, entry: Entry[TaskRecord]) -> None:
        machine = self.machine
        now = trio.current_time()
        machine.submit(entry, now)
        if entry.deadline != NO_DEADLINE:
            machine.track_deadline(entry, now)
            self._apply()
            # From another task the loop may be waiting: have it wake up in time.
            self._inbox.wake_at(machine.next_deadline)
        else:
            self._apply()
        if self._waits.active:
            self._waits.edges_added(entry.payload)  # queued, held or joined: a later edge

    # -- slot-wide operations (the caller's task) ----------------------------------------------

    def check_not_owner(self, key: str, operation: str) -> None:
        """Raise ``DeadlockError`` when called from inside an attempt owning slot ``key``."""
        caller = self._waits.caller()
        if caller is None:
            return
        owner = self.machine.owner_of(key)
        if owner is not None and owner.payload is caller:
            raise DeadlockError(
                f"task {caller.name!r} ({caller.id}) owns slot {key!r}: "
                f"{operation} from inside it would wait for the task itself"
            )

    async def cancel_slot(self, key: str) -> tuple[int, TaskRecord | None]:
        """Withdraw the slot's queued and held work and stop its owner, in command order.

        Returns the count ``cancel_slot`` reports and the local owner (``None``: no owner
        here), whose outcome the caller awaits. In a cluster slot whose owner is remote,
        waits until its lease is released (polling the store every
        ``STORE_POLL_INTERVAL``); raises ``SlotStoreUnavailableError`` when the server
        does not answer within ``connect_timeout`` (the withdrawals and the stop request
        are still sent once it answers). After the loop has ended: ``(0, None)``.
        """
        self.check_slot(key)
        reply: Reply[_SlotCancelled] = Reply()
        try:
            await self._inbox.put(_CancelSlot(key, reply))
        except trio.BrokenResourceError:
            await trio.lowlevel.checkpoint()
            return 0, None  # the registry has ended: every task is gone
        count, owner, remote = await reply.wait()
        if remote is not None:
            token = await remote.wait()
            if token is not None:
                count += 1
                # Released: no lease, a hand-over in flight, or another owner's lease.
                await self._poll_store(key, lambda info: info is None or info.fence_token != token)
        return count, owner

    def _cancel_slot_now(self, key: str) -> _SlotCancelled:
        """The loop's part of ``cancel_slot``: withdraw this process's line and stop the
        local owner, or (a cluster slot without one) ask the store to stop the owner
        wherever it runs, after the withdrawals (the keeper sends requests in order)."""
        withdrawn, owner = self.machine.withdraw_slot(key, trio.current_time())
        self._apply()
        if owner is not None:
            self._stop_owner(owner)
            return _SlotCancelled(withdrawn + 1, owner.payload, None)
        if self.keeper is None:
            return _SlotCancelled(withdrawn, None, None)
        return _SlotCancelled(withdrawn, None, self.keeper.stop_owner(key))

    def _stop_owner(self, owner: Entry[TaskRecord]) -> None:
        """Soft-stop a slot's owner (grace, then force), as ``cancel`` by id would."""
        slot = self.machine.slots[owner.key]
        if slot.status is SlotStatus.ADMITTING:
            # Not decided yet: a stop queued behind its admission, as cancel by id.
            self._registry.forward_stop(owner.payload.id, Reply())
        elif slot.status is SlotStatus.RUNNING:
            self._registry.stop_record(owner.payload)
        # TERMINATING: a REPLACE stopped it already, or will once it is admitted.

    def slot_idle(self, key: str) -> bool:
        """Whether slot ``key`` has no owner, no line and nothing of it in the inbox."""
        if key in self.machine.slots:
            return False
        return not any(entry.key == key for entry in self._in_inbox.values())

    async def wait_slot_idle(self, key: str) -> None:
        """Wait until slot ``key`` is idle (at once if it is); a checkpoint.

        Idleness is checked after the checkpoint and after every wake-up, so the slot is
        idle at the moment this returns (work submitted during the checkpoint counts).
        In a cluster slot, once it is idle here, the store is asked whether it is idle
        cluster-wide (no lease, no live queue entry), every ``STORE_POLL_INTERVAL`` until
        it is and the slot is still idle here; ``SlotStoreUnavailableError`` when the
        server does not answer within ``connect_timeout``.
        """
        self.check_slot(key)
        await trio.lowlevel.checkpoint()
        while True:
            await self._wait_locally_idle(key)
            if self.keeper is None or await self.keeper.query(key) is None:
                if self.slot_idle(key):
                    return
            else:
                await trio.sleep(STORE_POLL_INTERVAL)

    async def _wait_locally_idle(self, key: str) -> None:
        while not self.slot_idle(key):
            event = self._idle_waits.get(key)
            if event is None:
                event = self._idle_waits[key] = trio.Event()
            caller = self._waits.caller()
            if caller is None:
                await event.wait()
            else:
                await self._waits.guarded_slot_wait(caller, key, event)

    async def _poll_store(self, key: str, done: Callable[[ClusterSlotInfo | None], bool]) -> None:
        """Ask the store about slot ``key`` until ``done`` says yes (a checkpoint)."""
        assert self.keeper is not None
        # Polled: the store pushes a release only to the queue's head, and an expiry to
        # nobody, so there is no event to wait for here.
        while not done(await self.keeper.query(key)):  # noqa: ASYNC110
            await trio.sleep(STORE_POLL_INTERVAL)

    def _check_idle_waits(self) -> None:
        for key in [key for key in self._idle_waits if self.slot_idle(key)]:
            self._idle_waits.pop(key).set()

    # -- what work waits for, for the wait guard (SlotEdges) ------------------------------------

    def slot_edge(self, rec: TaskRecord) -> Edge[TaskRecord] | None:
        if rec.entry is None or rec.listener is not self:
            return None  # added work, or work of another controller, or ended
        found = self.machine.waits_for(cast("Entry[TaskRecord]", rec.entry))
        if found is None:
            return None
        target, how = found
        return target.payload, _EDGE_LABELS[how]

    def slot_owner(self, key: str) -> TaskRecord | None:
        owner = self.machine.owner_of(key)
        return None if owner is None else owner.payload

    def snapshot(self) -> ControllerSnapshot:
        slots = sorted(self.machine.slots.values(), key=lambda s: s.key)
        # None after the supervisor's run, as statistics() and list() answer then too.
        now = trio.current_time() if slots else 0.0
        views: list[SlotView] = []
        for slot in slots:
            # Invariant: a tracked slot has a status; a local one always has an owner (held
            # or queued work of an ownerless slot starts at once), a cluster slot without
            # a local owner is REMOTE (or ADMITTING, while the store decides).
            assert slot.status is not None
            owner = slot.owner
            views.append(
                SlotView(
                    slot=slot.key,
                    status=slot.status,
                    owner_id=None if owner is None else TaskId(owner.id),
                    queue_depth=len(slot.queue),
                    waiting=len(slot.held),
                    status_for=now - slot.since,
                    fence_token=None if owner is None else owner.payload.fence_token,
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
        try:
            with self._loop_scope:
                task_status.started()
                await self._inbox.serve(self._handle, self._due)
        finally:
            # The registry has ended: what is still queued gets the shutdown's answers.
            self._inbox.close()
            self._inbox.drain(self._handle)
            self.exited.set()

    def _due(self) -> float:
        """Expire the queue deadlines that came; the next one (``inf``: none)."""
        machine = self.machine
        deadline = machine.next_deadline
        if deadline != NO_DEADLINE:
            now = trio.current_time()
            if now >= deadline:
                self._expire(now)
                deadline = machine.next_deadline
        return deadline

    def _expire(self, now: float) -> None:
        """Queue deadlines came: withdraw that work (``QUEUE_TIMEOUT``)."""
        self.machine.expire(now)
        self._apply()

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
                self._in_inbox.pop(entry.id, None)
                self._take_in(entry)
            case _Remove(target, reply):
                removed = self._remove(target)
                if removed is None:
                    self._registry.forward_stop(target, reply)
                else:
                    reply.set(removed)
            case (
                Owner()
                | Queued()
                | Joined()
                | Rejected()
                | Full()
                | Room()
                | RemoteStop()
                | LeaseLost()
                | FollowedOutcome()
                | StoreUnavailable()
                | StoreRecovered()
            ):
                self._report(command)
            case _Decided(entry, accepted):
                # Stale when the owner has exited meanwhile: the machine ignores it.
                self._decisions -= 1
                self.machine.admitted(entry, accepted, trio.current_time())
                self._apply()
                if not accepted:
                    entry.payload.release()
            case _CancelSlot(key, reply):
                reply.set(self._cancel_slot_now(key))

    def _remove(self, target: TaskId) -> tuple[bool, TaskRecord] | None:
        entry = self.machine.remove(target, trio.current_time())
        # Also when nothing was found: the removal first expired the deadlines that came,
        # perhaps the target's own, and its outcome must be committed before the reply.
        self._apply()
        return None if entry is None else (True, entry.payload)

    # -- the registry's reports (RecordListener) ----------------------------------------------

    def admission_decided(self, rec: TaskRecord, accepted: bool) -> None:
        # The entry now: an accepted owner may run and exit before this loop gets to it.
        entry = rec.entry
        assert isinstance(entry, Entry)
        self._inbox.put_nowait(_Decided(entry, accepted), force=True)  # pyright: ignore[reportUnknownArgumentType]
        self._decisions += 1
        self._sync_idle()

    def lease_lost(self, rec: TaskRecord) -> str | None:
        keeper = self.keeper
        entry = rec.entry
        if keeper is None or not isinstance(entry, Entry):
            return None
        reason = keeper.lease_lost(entry.id)
        if reason is not None and self._cluster is not None and self._bus.active:
            # Published here, before the outcome: the keeper's report of the loss finds
            # the owner gone and publishes nothing.
            self._bus.publish(
                EventKind.CONTROLLER_LEASE_LOST,
                rec.id,
                rec.name,
                entry.key,
                reason=reason,
                fence_token=rec.fence_token,
            )
        return reason

    def owner_forced(self, rec: TaskRecord) -> None:
        entry = rec.entry
        assert isinstance(entry, Entry)
        self.machine.answered(entry)  # pyright: ignore[reportUnknownArgumentType]

    def owner_exited(self, rec: TaskRecord) -> None:
        entry = rec.entry
        assert isinstance(entry, Entry)
        self.machine.exited(entry, trio.current_time())  # pyright: ignore[reportUnknownArgumentType]
        self._apply()

    # -- effects ------------------------------------------------------------------------------

    def _apply(self) -> None:
        """Carry out the machine's effects: all but admissions in order, then those, then
        a cluster machine's requests to the lease keeper."""
        machine = self.machine
        cluster = self._cluster
        while True:
            effects = machine.effects
            if effects:
                machine.effects = []
                # One pass, the admissions collected for after the rest, and the two
                # effects every submission has tested before the ``match`` (benchmark
                # row 4a: three effects per submission).
                admits: list[Entry[TaskRecord]] | None = None
                for effect in effects:
                    kind = type(effect)
                    if kind is Admit:
                        if admits is None:
                            admits = [effect.entry]
                        else:
                            admits.append(effect.entry)
                    elif kind is Submitted:
                        self._submitted(effect)  # type: ignore[arg-type]
                    elif kind is not Transition or self._bus.active:
                        self._carry_out(effect)
                if admits is not None:
                    for entry in admits:
                        self._admit(entry)
            elif cluster is not None and cluster.extra:
                extra, cluster.extra = cluster.extra, []
                for request in extra:
                    self._request(request)
            else:
                break
        self._sync_idle()
        if self._idle_waits:
            self._check_idle_waits()

    def _submitted(self, effect: Submitted[TaskRecord]) -> None:
        entry, reason, placement = effect
        if placement is not None:
            entry.payload.place(placement)
        bus = self._bus
        if bus.active:
            rec = entry.payload
            bus.publish(EventKind.CONTROLLER_SUBMITTED, rec.id, rec.name, entry.key, reason=reason)

    def _carry_out(self, effect: Effect[TaskRecord]) -> None:
        # Submitted and Admit are handled by _apply; a Transition only publishes an event.
        bus = self._bus
        match effect:
            case Submitted():
                self._submitted(effect)
            case Transition(entry, reason):
                # Not after the owner's TASK_REMOVED (a forced owner still running, a
                # decision that arrived late): a task's events end there.
                if bus.active and not (rec := entry.payload).committed:
                    bus.publish(
                        EventKind.CONTROLLER_SLOT_TRANSITION,
                        rec.id,
                        rec.name,
                        entry.key,
                        reason=reason,
                    )
            case Admit():
                pass  # after the others (see _apply)
            case Stop(entry):
                self._registry.stop_record(entry.payload)
            case Reject(entry, kind, reason):
                self._rejected(entry, kind, reason)
                entry.payload.release()
            case Join(entry, target):
                # Not released: the wait guard follows its entry to the followed work.
                entry.payload.follow(target.payload)
            case Detach(entry, kind):
                self._rejected(entry, kind)  # a joiner: out of custody since it joined
            case RemoveRequested(entry):
                if bus.active:
                    # As for registered work, before the rejection the removal causes.
                    rec = entry.payload
                    bus.publish(EventKind.TASK_REMOVE_REQUESTED, rec.id, rec.name, entry.key)

    # -- cluster slots: the lease keeper's reports and the requests to it ---------------------

    def _report(self, report: Report) -> None:
        """Feed a lease keeper's report to the cluster machine; carry out its notice, then
        its effects."""
        cluster = self._cluster
        assert cluster is not None
        notice = cluster.report(report, trio.current_time())
        if notice is not None:
            self._notice(notice)
        self._apply()

    def _notice(self, notice: Notice[TaskRecord]) -> None:
        """Carry out what a keeper's report asks beyond the machine's effects."""
        bus = self._bus
        match notice:
            case SetFence(owner, token):
                rec = owner.payload
                rec.fence_token = token
                if bus.active:
                    bus.publish(
                        EventKind.CONTROLLER_LEASE_ACQUIRED,
                        rec.id,
                        rec.name,
                        owner.key,
                        fence_token=token,
                    )
            case GiveBack(slot, task_id):
                assert self.keeper is not None
                self.keeper.withdraw(slot, task_id, RejectionKind.REMOVED_FROM_QUEUE)
            case StopAsked(owner, requester):
                assert self.keeper is not None
                if requester != self.keeper.instance_id and bus.active:
                    rec = owner.payload
                    bus.publish(
                        EventKind.CONTROLLER_REMOTE_STOP,
                        rec.id,
                        rec.name,
                        owner.key,
                        reason=f"stop requested by {requester}",
                        fence_token=rec.fence_token,
                    )
            case LeaseLostNotice(owner, token, reason):
                if bus.active:
                    rec = owner.payload
                    bus.publish(
                        EventKind.CONTROLLER_LEASE_LOST,
                        rec.id,
                        rec.name,
                        owner.key,
                        reason=reason,
                        fence_token=token,
                    )
            case FollowerDone(follower, outcome):
                follower.payload.resolve(outcome)
            case StoreState(available):
                if bus.active:
                    bus.publish(
                        EventKind.CONTROLLER_STORE_RECOVERED
                        if available
                        else EventKind.CONTROLLER_STORE_UNAVAILABLE
                    )
            case _:
                assert_never(notice)

    def _request(self, request: ClusterEffect[TaskRecord]) -> None:
        """Carry out a cluster machine's request: to the lease keeper, or a lost lease."""
        keeper = self.keeper
        assert keeper is not None
        match request:
            case Ask(entry):
                keeper.submit(entry.key, entry.id, entry.policy, self._max_slot_queue, entry.wait)
            case Withdraw(entry, kind):
                keeper.withdraw(entry.key, entry.id, kind)
            case Release(entry):
                outcome = entry.payload.final_outcome()
                if outcome is None:  # refused by the registry before its decision was final
                    outcome = rejected_outcome(RejectionKind.SHUTTING_DOWN)
                keeper.release(entry.key, entry.id, outcome)
            case LoseLease(entry, reason):
                self._registry.lose_lease(entry.payload, reason)
            case LostUnstarted(entry, reason):
                rec = entry.payload
                rec.place(Placement.OWNER)  # it was granted the lease (not once placed)
                rec.resolve(TaskOutcome(OutcomeKind.LEASE_LOST, reason=reason))
                if self._bus.active:
                    self._bus.publish(
                        EventKind.CONTROLLER_LEASE_LOST, rec.id, rec.name, entry.key, reason=reason
                    )
                rec.release()  # never admitted: nothing else lets go of it
            case Follow(entry, target):
                keeper.follow(entry.id, entry.key, target)
            case Unfollow(entry):
                keeper.unfollow(entry.id)

    async def cluster_slot(self, slot: str) -> ClusterSlotInfo | None:
        """Ask the slot store about ``slot`` (``ConfigError`` without one)."""
        if self.keeper is None:
            raise ConfigError("cluster_slot needs a slot store: ControllerConfig(slot_store=...)")
        self.check_slot(slot)
        return await self.keeper.query(slot)

    async def close_store(self) -> None:
        """The registry has ended: flush the keeper's withdrawals and releases and stop it
        (bounded by the store's ``connect_timeout``). Blocks of tasks outside the
        supervisor that still hold cluster units then lose them."""
        if self.keeper is not None:
            await self.keeper.aclose()
            self._registry.store_closed()

    def _rejected(
        self, entry: Entry[TaskRecord], kind: RejectionKind, reason: str | None = None
    ) -> None:
        rec = entry.payload
        outcome = rejected_outcome(kind, reason)
        rec.place(Placement.REJECTED)  # not once placed
        rec.resolve(outcome)
        if self._bus.active:
            self._bus.publish(
                EventKind.CONTROLLER_REJECTED,
                rec.id,
                rec.name,
                entry.key,
                reason=outcome.reason,  # the words, beside the kind
                outcome=outcome.kind,
                rejection=kind,
            )

    def _admit(self, entry: Entry[TaskRecord]) -> None:
        """Hand an owner to the registry; learn its decision now or from its loop."""
        rec = entry.payload
        accepted = self._registry.admit(rec)  # counted by the registry from here
        if accepted is not None:
            self.machine.admitted(entry, accepted, trio.current_time())
            if not accepted:
                rec.release()
