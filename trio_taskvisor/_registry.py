"""The registry loop: the one writer of membership, and of every stop's deadline.

The registry takes commands from one ``Inbox`` and handles them in order, so a stop
sent after an add always sees that add. It spawns one actor per admitted task in its own
nursery, and keeps a heap of force deadlines: while stops are pending it waits for the
next command only until the earliest deadline, then forces.

Nothing outside the registry builds a command, touches its inbox or its counters; its
callers use these methods:

* ``add`` (the facade) and ``admit`` (the controller) run the loop's own admission core
  (``_admit_one``) in the caller's task when the inbox is idle (nothing queued, the loop
  parked in its wait): nothing is ordered before the call then, and code between two
  checkpoints is as atomic there as in the loop. ``add`` follows trio's idiom: a caller
  already cancelled leaves no trace, the decision is made in its task, then a shielded
  checkpoint, so an added task is registered on return; its actor is spawned only after
  that checkpoint, so ``add`` returns before the body starts.
  Otherwise the command is queued behind the others: ``add`` waits for room and for the
  decision; a controller's admission is never refused, and its decision reaches
  ``rec.listener.admission_decided`` (handed to the controller's own loop).
* ``add_nowait``, ``add_batch`` and ``stop`` always queue their command, in call order
  (``add_nowait`` raises ``trio.WouldBlock`` when the inbox is full).
* ``forward_stop`` (the controller's loop, for a stop by id it does not hold) queues the
  caller's stop without waiting; ``stop_record`` (the controller's REPLACE) runs directly:
  its target is registered.
* ``close_intake`` (the shutdown's start) closes intake for the whole supervisor:
  ``check_intake`` is the one intake check, used by the facade and the controller too.
* ``ActorHost`` (``_actor``): actors report their exit and borrow permits directly,
  between two checkpoints of their own.
* ``force_all`` (the facade, for a signal received during the shutdown) runs directly:
  it forces every remaining task at once, as if the shared grace deadline were now.

Membership has two views:

* ``_live``: every live record, from admission until its actor physically exited,
  force-aborted ones included (``max_registered_tasks``, ``alive_snapshot()``,
  ``list()`` without the committed ones);
* ``_names``: the names those records reserve (duplicate checks, name targets).

With ``max_concurrent``, an admitted task's actor is spawned only once a permit is free
for its first attempt: until then the record waits (``WAITING``) in the registry's own
FIFO, which is also where actors wait for the permits of later attempts, so permits go
out in the order they were asked for, first attempts and retries alike. The FIFO is where
wait-for cycles get their permit edges: while waits are being checked,
``watch_permits`` has each record that starts waiting there reported (``_waits``).

Work added here is placed ``OWNER`` when it is registered, ``REJECTED`` when rejected
(``TaskWaiter.placement``); controller work was placed by the controller before.

Decisions the design leaves open:

* ``TASK_ADD_REQUESTED`` is published when the registry takes the command in, just
  before ``TASK_ADDED`` / ``TASK_ADD_FAILED``.
* An add accepted before shutdown began is admitted and then stopped with everything
  else; one that reaches the registry after the shutdown is rejected
  ``SHUTTING_DOWN`` (``add`` raises ``SupervisorClosedError``). No attempt begins once
  intake has closed (``intake_closed``), though the shutdown's stop reaches the task a
  moment later: the actor waits for that stop (``await_stop``) and ends ``CANCELLED``,
  as one stopped before its first step does. So neither a task added just before, nor
  one granted its units by the exit that began the shutdown (a critical task's), starts
  its body during the shutdown.
* A stop, a lost lease or a refused limit of a record waiting for its first attempt's
  units (it has no actor yet) takes it out of the wait at once and spawns its actor,
  which ends at its first step (``_leave_units``): no request is left in the pools'
  lines, where the units would be granted to a task that has ended.
* For a batch, the "first conflicting" name is that of the first item, in batch order,
  that clashes with a registered name or with an earlier item. Duplicates are checked
  before the limit.
* ``GraceExceededError.stuck`` lists the tasks forced after shutdown began, and the
  tasks forced before it that are still physically running at the shared grace
  deadline; ``ALL_STOPPED_WITHIN_GRACE`` is published only once no
  forced work is left running or due to be listed. Once every outcome is committed and
  forced work still runs, one warning names the tasks the shutdown waits for, when
  they still run a second (``EXIT_WAIT_WARNING``) later: a task whose ``defer_cancel``
  block the force unshielded exits at once, and the warning logged then named work
  that had left by the next line of the log.
* Keyed calls (``run_in_slot``) reserve no name (``TaskRecord.reserved = False``):
  their automatic names are labels, so a user task of the same name never makes a keyed
  call fail, and a batch never conflicts over one. Name targets do not find them; their
  ``TaskId`` does. Other nameless tasks' automatic names are names like any other.
* A force-aborted task publishes ``FORCED_TASK_EXITED`` when its actor exits, with
  ``duration`` from the force to that exit (``force_deadline`` holds the force's time
  once forced). ``forced_alive`` counts such tasks still running.
* ``log_failures``: final ``FAILED``, ``FATAL`` and ``PANICKED`` outcomes are logged
  when they are committed, at ERROR, with the error as ``exc_info`` (none for
  ``PANICKED``) and the task's name, id, outcome and reason in ``extra``.
* Intake (``check_intake``: ``add``, ``add_nowait``, ``add_batch``, ``submit``,
  ``submit_nowait``, a prepared submission, ``run_in_slot``, ``start``,
  ``start_in_slot``, ``limited``) from a thread other than the one of the supervisor's
  trio run raises ``RuntimeError`` naming the call and its way through
  ``trio.from_thread``, before it changes anything: the loops' state and trio's
  channels belong to that thread (a memory channel's ``send_nowait`` from another
  thread takes the waiting loop off the channel, then fails to wake it, and the loop
  sleeps for good, and with it the shutdown).
* A signal during the shutdown (``force_all``) forces every task not yet committed and
  lists it in ``stuck``; forced work from before the shutdown that still runs is listed
  at once too. A ``force_all`` before the registry has taken the shutdown in makes the
  shutdown's deadline "now" when it does.
* A ``limited`` block waiting when the shutdown begins (or entered after it began)
  raises ``SupervisorClosedError`` at once, unless it waits in (or is entered by) an
  attempt of this supervisor that the shutdown's stops are still to reach: the stop
  ends it as it ends the attempt (``CANCELLED``, as every waiting attempt ends), rather
  than an error that would fail the task (and, for a critical task, turn a clean
  shutdown into ``CriticalTaskError``). Such a block that the stop does not end
  (shielded, or in a task the attempt spawned into another nursery) raises it once the
  stops have been asked. (An attempt added as the shutdown begins may first run after
  it began, and enter a block then.)
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, Protocol, TypeVar

import attrs
import outcome
import trio
from trio_util import AsyncBool

from ._actor import run_actor
from ._bus import EventBus
from ._config import SupervisorConfig
from ._events import EventKind
from ._exceptions import (
    ConfigError,
    ResourceLimitError,
    SlotStoreUnavailableError,
    SupervisorClosedError,
    TaskNameInUseError,
)
from ._inbox import Inbox, Reply
from ._limits import Limit, LimitView, Pool, PoolId, RateLimit, limit_view, pool_label
from ._logging import log
from ._outcome import (
    FORCE_ABORTED,
    FORCED_AT_ONCE,
    PANICKED,
    OutcomeKind,
    Placement,
    RejectionKind,
    TaskId,
    TaskOutcome,
    rejected_outcome,
)
from ._pools import PoolTable, Request
from ._record import TaskRecord, TaskState, current_task_context

R = TypeVar("R")
# A module global: an Enum class's attribute lookup is not specialised by the interpreter
# (its metaclass has a __getattr__), and every registered task is placed (row 1a).
_OWNER: Final = Placement.OWNER
# Once every outcome is committed: how long forced work may still run before the
# shutdown's warning names it (seconds).
EXIT_WAIT_WARNING: Final = 1.0


@attrs.frozen
class TaskInfo:
    """A registered or stopping task, as ``Supervisor.list()`` reports it."""

    id: TaskId
    """The task's ``TaskId``."""
    name: str
    """The task's name."""
    slot: str | None
    """The controller slot, or ``None`` for work added with ``add``."""
    state: TaskState
    """Where the task is in its life."""
    attempt: int
    """The number of the current or last attempt, from 1; ``0`` before the first."""


class _Add(NamedTuple):
    recs: Sequence[TaskRecord]
    reply: Reply[BaseException | None] | None
    batch: bool


class _Stop(NamedTuple):
    target: TaskId | str
    reply: Reply[tuple[bool, TaskRecord | None]]


class _Shutdown(NamedTuple):
    deadline: float


_Command = _Add | _Stop | _Shutdown


_BLOCK: Final = "a limited block"  # the payload of a block's request
_CLOSED: Final = "a block the shutdown ended"  # ... once the shutdown refused it


class PoolBackend(Protocol):
    """Limit pools kept elsewhere (on the slot store's server: the lease keeper).

    Requests are synchronous and never block; the answers come back to the units'
    ``limit_granted``, ``limit_waiting``, ``limit_refused`` and ``limit_lost``.
    """

    def limit_acquire(self, rid: int, pools: tuple[tuple[PoolId, Limit], ...]) -> None:
        """Ask for one unit of every pool at once."""

    def limit_release(self, rid: int) -> None:
        """Give back a request's units, or withdraw it while it waits."""


class _Remote:
    """One request to the cluster's pools: an attempt's (``rec``) or a block's."""

    __slots__ = ("error", "granted", "idents", "lost", "rec", "rid", "scope", "task", "waited")

    def __init__(self, rid: int, idents: tuple[PoolId, ...], rec: TaskRecord | None) -> None:
        self.rid = rid
        self.idents = idents
        self.rec = rec
        self.task: trio.lowlevel.Task | None = None  # parked while it waits
        self.granted = False
        self.waited = False  # published LIMIT_WAITING
        self.lost: str | None = None  # why its units were lost
        self.error: BaseException | None = None  # raised into a waiting block
        self.scope: trio.CancelScope | None = None  # a held block's, cancelled on a loss


class _Units:
    """What attempts take before they start: the ``max_concurrent`` permit and limit pools.

    A driver of the pure ``PoolTable`` (``_pools``). A record waits in it for its first
    attempt with no actor yet (it is spawned with its units), or with its actor parked
    for a later attempt; a ``limited`` block waits with its task parked. Grants come back
    in the table's ``granted``, oldest first, and are delivered at once: a record with no
    actor is spawned, a parked task rescheduled.
    """

    __slots__ = (
        "_bus",
        "_held",
        "_limit_waits",
        "_parked",
        "_rids",
        "_spawn",
        "cluster",
        "end_wait",
        "lose",
        "remote",
        "remote_of",
        "table",
        "tasks_waiting",
        "wake_at",
        "watch",
    )

    def __init__(
        self,
        max_concurrent: int | None,
        bus: EventBus,
        spawn: Callable[[TaskRecord], None],
        wake_at: Callable[[float], None],
    ) -> None:
        self.table = PoolTable(max_concurrent)
        self._bus = bus
        # Requests of attempts that waited for a limit pool (LIMIT_ACQUIRED when granted).
        self._limit_waits: set[Request] = set()
        self._spawn = spawn
        self.wake_at = wake_at
        # The requests of records waiting or holding through the table (a record that
        # took the permit alone on the fast path has none).
        self._held: dict[TaskRecord, Request] = {}
        self._parked: dict[Request, trio.lowlevel.Task] = {}
        self.tasks_waiting = 0  # records waiting (``statistics().waiting_for_permit``)
        # Told of each record that starts waiting here (wait-for cycles), when set.
        self.watch: Callable[[TaskRecord], None] | None = None
        # With a slot store, limit pools are the cluster's: attempts take the permit
        # here first, then their pools' units from ``cluster``.
        self.cluster: PoolBackend | None = None
        self.remote: dict[int, _Remote] = {}
        self.remote_of: dict[TaskRecord, _Remote] = {}
        self._rids = 0
        # The registry's: force a holder whose units were lost; end a waiting record.
        self.lose: Callable[[TaskRecord, str], None] | None = None
        self.end_wait: Callable[[TaskRecord, TaskOutcome[object]], None] | None = None

    def first(self, rec: TaskRecord) -> bool:
        """Take the units of ``rec``'s first attempt now, or queue ``rec``; whether taken."""
        if not rec.policy.limits and self.table.take_permit():
            return True
        return self._take(rec, None)

    async def acquire(self, rec: TaskRecord) -> None:
        """Wait for a later attempt's units (the actor's task, after its backoff)."""
        # The backoff sleep before it was the checkpoint.
        # PoolTable.take_permit, inlined on the path of every later attempt (1% of an
        # attempt: benchmark row 3, restarts); first() calls it.
        table = self.table
        permit = table.permit
        if (
            permit is not None
            and permit.held < permit.capacity
            and not table.rate_waiting
            and not rec.policy.limits
        ):
            permit.held += 1
            return
        if self._take(rec, trio.lowlevel.current_task()):
            return
        request = self._held[rec]

        def abort(_: object) -> trio.lowlevel.Abort:
            remote = self.remote_of.get(rec)
            if remote is not None:
                self._withdraw_remote(rec, remote)
            else:
                self._withdraw(rec, request)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _take(self, rec: TaskRecord, task: trio.lowlevel.Task | None) -> bool:
        """Ask the table, with the time, for what the permit's fast path could not give."""
        table = self.table
        limits = rec.policy.limits
        now = trio.current_time()
        clustered = self.cluster is not None and bool(limits)
        request = table.acquire(() if clustered else limits, now, rec, permit=True)
        self._held[rec] = request
        if table.granted:
            self.deliver()  # older rate waiters the clock let fit, before its timer
        if request.granted:
            if clustered:
                self.tasks_waiting += 1
                self._ask_cluster(rec, task)
                if self.watch is not None:
                    self.watch(rec)
                return False
            return True
        if clustered:
            limits = ()  # the pools are asked for once the permit is taken
        if task is not None:
            self._parked[request] = task
        self.tasks_waiting += 1
        if limits and self._bus.active:
            # Its LIMIT_WAITING, and LIMIT_ACQUIRED once granted, for a subscriber there
            # is now (one that comes later sees neither: row 11 pays nothing for them).
            blocked = table.without_room(request, now)
            if blocked:
                self._limit_waits.add(request)
                self._publish_waiting(rec, blocked)
        if table.rate_waiting:
            self.wake_at(table.next_wakeup(now))
        if self.watch is not None:
            self.watch(rec)
        return False

    def withdraw(self, rec: TaskRecord) -> bool:
        """Take a record that has no actor yet out of the wait; whether it was waiting."""
        remote = self.remote_of.get(rec)
        if remote is not None:
            if remote.granted or remote.task is not None:
                return False
            self._withdraw_remote(rec, remote)
            return True
        request = self._held.get(rec)
        if request is None or request.granted or request in self._parked:
            return False
        self._withdraw(rec, request)
        return True

    def _acquired(self, request: Request) -> None:
        rec = request.payload
        assert isinstance(rec, TaskRecord)
        if self._bus.active:
            labels = [pool_label(ident) for ident in rec.policy.limits]
            self._bus.publish(
                EventKind.LIMIT_ACQUIRED, rec.id, rec.name, rec.slot, reason=", ".join(labels)
            )

    def _withdraw(self, rec: TaskRecord, request: Request) -> None:
        del self._held[rec]
        self._limit_waits.discard(request)
        self._parked.pop(request, None)
        self.tasks_waiting -= 1
        self.table.cancel(request, trio.current_time())

    def release(self, rec: TaskRecord) -> None:
        """An attempt ended: give back its units and start what then fits."""
        remote = self.remote_of.pop(rec, None)
        if remote is not None:
            del self.remote[remote.rid]
            assert self.cluster is not None
            self.cluster.limit_release(remote.rid)
        table = self.table
        request = self._held.pop(rec, None)
        if request is None:
            # PoolTable.release_permit, inlined as take_permit is in acquire() (row 3).
            permit = table.permit
            assert permit is not None
            permit.held -= 1
            if permit.waiters or table.rate_waiting:
                table.settle_permit(trio.current_time())
        else:
            table.release(request, trio.current_time())
        if table.granted:
            self.deliver()

    # -- ``limited`` blocks (their own tasks) -----------------------------------------------

    async def hold(
        self, idents: tuple[PoolId, ...], limits: tuple[Limit, ...] = ()
    ) -> Request | _Remote:
        """Take one unit of each pool for a block, all at once; a checkpoint.

        Raises ``SupervisorClosedError`` if the shutdown begins while it waits.
        Cancelled while waiting, it holds nothing. With a cluster backend, ``limits``
        are the pools' settings, and a conflict with the server's raises ``ConfigError``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.cluster is not None:
            return await self._hold_remote(idents, limits)
        request = self.table.acquire(idents, trio.current_time(), _BLOCK)
        if self.table.granted:
            self.deliver()  # older rate waiters the clock let fit, before its timer
        if request.granted:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return request
        self._parked[request] = trio.lowlevel.current_task()
        if self.table.rate_waiting:
            self.wake_at(self.table.next_wakeup(trio.current_time()))

        def abort(_: object) -> trio.lowlevel.Abort:
            del self._parked[request]
            self.table.cancel(request, trio.current_time())
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        if request.payload is _CLOSED:
            raise SupervisorClosedError
        return request

    def unhold(self, request: Request | _Remote) -> None:
        """A block exits: give back its concurrency units and start what then fits."""
        if isinstance(request, _Remote):
            self.remote.pop(request.rid, None)
            assert self.cluster is not None
            self.cluster.limit_release(request.rid)
            return
        self.table.release(request, trio.current_time())
        if self.table.granted:
            self.deliver()

    def close_blocks(self, spare: Callable[[TaskRecord], bool] | None = None) -> None:
        """The shutdown began: blocks still waiting raise ``SupervisorClosedError``.

        With ``spare``, not those of a task whose context names a record it spares: the
        stop the shutdown asks of that attempt next ends them (``CANCELLED``, as the
        attempt), and the call without ``spare`` after those stops refuses what they
        did not end (a shielded block, a task the attempt spawned elsewhere)."""

        def refused(task: trio.lowlevel.Task) -> bool:
            if spare is None:
                return True
            rec = task.context.get(current_task_context)
            return rec is None or not spare(rec)

        for remote in list(self.remote.values()):
            task = remote.task
            if remote.rec is None and not remote.granted and task is not None and refused(task):
                self._refuse_block(remote, SupervisorClosedError())
        now = trio.current_time()
        for request, task in list(self._parked.items()):
            if request.payload is _BLOCK and refused(task):
                del self._parked[request]
                self.table.cancel(request, now)
                request.payload = _CLOSED
                trio.lowlevel.reschedule(task)

    def poll(self) -> float:
        """Start what rate pools allow by now; when they may allow more (``inf``: never)."""
        table = self.table
        if not table.rate_waiting:
            return math.inf
        now = trio.current_time()
        table.poll(now)
        if table.granted:
            self.deliver()
        return table.next_wakeup(now)

    def deliver(self) -> None:
        """Start the requests the table granted, oldest first."""
        granted = self.table.granted
        while granted:
            request = granted.pop(0)
            task = self._parked.pop(request, None)
            rec = request.payload
            if self.cluster is not None and isinstance(rec, TaskRecord) and rec.policy.limits:
                self._ask_cluster(rec, task)  # the permit is taken: now the pools
                continue
            if request.payload is not _BLOCK:
                self.tasks_waiting -= 1
                if request in self._limit_waits:
                    self._limit_waits.discard(request)
                    self._acquired(request)
            if task is not None:
                trio.lowlevel.reschedule(task)
            else:
                rec = request.payload
                assert isinstance(rec, TaskRecord)
                self._spawn(rec)

    # -- the cluster's pools (a slot store) -------------------------------------------------

    def _new_remote(
        self, idents: tuple[PoolId, ...], limits: tuple[Limit, ...], rec: TaskRecord | None
    ) -> _Remote:
        assert self.cluster is not None
        self._rids += 1
        remote = _Remote(self._rids, idents, rec)
        self.remote[remote.rid] = remote
        self.cluster.limit_acquire(remote.rid, tuple(zip(idents, limits, strict=True)))
        return remote

    def _ask_cluster(self, rec: TaskRecord, task: trio.lowlevel.Task | None) -> None:
        """``rec`` holds its permit: ask the cluster for its pools' units (it waits)."""
        idents = rec.policy.limits
        remote = self._new_remote(idents, tuple(map(self._settings, idents)), rec)
        remote.task = task
        self.remote_of[rec] = remote

    def _settings(self, pool: PoolId) -> Limit:
        limit = self.table.settings(pool[0])
        assert limit is not None  # every pool a record names was checked at admission
        return limit

    def _withdraw_remote(self, rec: TaskRecord, remote: _Remote) -> None:
        """A waiting record leaves: withdraw its request, give back its permit."""
        del self.remote_of[rec]
        self.remote.pop(remote.rid, None)
        assert self.cluster is not None
        self.cluster.limit_release(remote.rid)
        remote.task = None
        self.tasks_waiting -= 1
        request = self._held.pop(rec)
        self.table.release(request, trio.current_time())
        if self.table.granted:
            self.deliver()

    async def _hold_remote(self, idents: tuple[PoolId, ...], limits: tuple[Limit, ...]) -> _Remote:
        remote = self._new_remote(idents, limits, None)
        remote.task = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            remote.task = None
            if self.remote.pop(remote.rid, None) is not None:
                assert self.cluster is not None
                self.cluster.limit_release(remote.rid)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        return remote

    def guard(self, request: Request | _Remote, scope: trio.CancelScope) -> None:
        """A held block runs in ``scope``: cancel it when its cluster units are lost."""
        if isinstance(request, _Remote):
            request.scope = scope
            if request.lost is not None:
                scope.cancel(reason=request.lost)

    @staticmethod
    def lost(request: Request | _Remote) -> str | None:
        """Why a block's cluster units were lost, or ``None``."""
        return request.lost if isinstance(request, _Remote) else None

    def _refuse_block(self, remote: _Remote, error: BaseException) -> None:
        task = remote.task
        assert task is not None
        remote.task = None
        if self.remote.pop(remote.rid, None) is not None:
            assert self.cluster is not None
            self.cluster.limit_release(remote.rid)
        trio.lowlevel.reschedule(task, outcome.Error(error))

    # the backend's answers (the keeper's ``LimitSink``)

    def limit_granted(self, rid: int) -> None:
        remote = self.remote.get(rid)
        if remote is None or remote.granted:
            return
        remote.granted = True
        task, remote.task = remote.task, None
        rec = remote.rec
        if rec is not None:
            self.tasks_waiting -= 1
            if remote.waited and self._bus.active:
                labels = [pool_label(ident) for ident in remote.idents]
                self._bus.publish(
                    EventKind.LIMIT_ACQUIRED, rec.id, rec.name, rec.slot, reason=", ".join(labels)
                )
            if task is None:
                self._spawn(rec)
                return
        if task is not None:
            trio.lowlevel.reschedule(task)

    def limit_waiting(self, rid: int, blocked: tuple[PoolId, ...]) -> None:
        remote = self.remote.get(rid)
        if remote is None or remote.rec is None or not blocked or not self._bus.active:
            return  # no subscriber: no LIMIT_WAITING, and no LIMIT_ACQUIRED after it
        remote.waited = True
        self._publish_waiting(remote.rec, list(map(pool_label, blocked)))

    def _publish_waiting(self, rec: TaskRecord, blocked: Sequence[str]) -> None:
        """``LIMIT_WAITING`` for ``rec``, naming the pools without room."""
        if self._bus.active:
            self._bus.publish(
                EventKind.LIMIT_WAITING,
                rec.id,
                rec.name,
                rec.slot,
                reason="waiting for " + ", ".join(blocked),
            )

    def limit_refused(self, rid: int, error: ConfigError | SlotStoreUnavailableError) -> None:
        remote = self.remote.pop(rid, None)
        if remote is None:
            return
        rec = remote.rec
        if rec is None:
            if remote.task is not None:
                self._refuse_block(remote, error)
            return
        self.remote_of.pop(rec, None)
        self.remote[rid] = remote  # withdrawn below, through the wait's own path
        self.remote_of[rec] = remote
        assert self.end_wait is not None
        self.end_wait(rec, TaskOutcome(OutcomeKind.FATAL, error=error, reason=str(error)))

    def limit_lost(self, rid: int) -> None:
        remote = self.remote.get(rid)
        if remote is None or not remote.granted:
            return
        labels = [pool_label(i) for i in remote.idents if self._holds(i)]
        self._lose(remote, f"limit lease lost: {', '.join(labels)}")

    def _lose(self, remote: _Remote, reason: str) -> None:
        remote.lost = reason
        rec = remote.rec
        if rec is not None:
            if rec.fence_token is not None and rec.listener is not None:
                # A slot owner whose slot lease is lost too: that is the cause it names.
                reason = rec.listener.lease_lost(rec) or reason
            assert self.lose is not None
            self.lose(rec, reason)
        elif remote.scope is not None:
            remote.scope.cancel(reason=reason)

    def lose_blocks(self) -> None:
        """The keeper has stopped: blocks still holding cluster units (tasks outside the
        supervisor) lose them, as nothing renews them now. Another process takes them
        once their lease expires; ``LeaseLostError`` tells the block before that."""
        for remote in self.remote.values():
            if remote.rec is None and remote.granted and remote.lost is None:
                labels = [pool_label(i) for i in remote.idents if self._holds(i)]
                if labels:
                    self._lose(
                        remote,
                        f"limit lease lost: {', '.join(labels)}"
                        " (the supervisor's shutdown ended during the block)",
                    )

    def _holds(self, pool: PoolId) -> bool:
        """Whether a unit of ``pool`` is held (a rate pool's start holds nothing)."""
        return not isinstance(self.table.settings(pool[0]), RateLimit)

    def remote_usage(self) -> dict[PoolId, list[int]]:
        """``pool -> [held, waiting]`` of this process's requests to the cluster."""
        usage: dict[PoolId, list[int]] = {}
        for remote in self.remote.values():
            for ident in remote.idents:
                row = usage.setdefault(ident, [0, 0])
                if not remote.granted:
                    row[1] += 1
                elif remote.lost is None and self._holds(ident):
                    row[0] += 1
        return usage


class Registry:
    """Membership, admission, stops and forces of one supervisor; the actors' host."""

    def __init__(
        self,
        config: SupervisorConfig,
        bus: EventBus,
        on_crash: Callable[[BaseException], None],
        *,
        log_failures: bool = False,
        on_critical: Callable[[TaskRecord, TaskOutcome[object]], None] | None = None,
    ) -> None:
        self.bus = bus
        # Told of the final FAILED, FATAL and PANICKED outcomes of tasks marked critical.
        self._on_critical = on_critical
        self.random = config.random
        self.log_failures = log_failures
        # Failed outcomes committed, kept only when the pytest plugin asks (its check).
        # The pytest plugin's check: failed records, with the joiners that followed each.
        self.failures: list[tuple[TaskRecord, list[TaskRecord]]] | None = None
        self._grace = config.grace
        self._limit = config.max_registered_tasks
        self._max_concurrent = config.max_concurrent
        self._on_crash = on_crash
        # Its loop waits for the next command only until the earliest force deadline (or
        # rate pool wake-up); one set from another task (the controller's REPLACE, a
        # caller's stop, a rate pool's new waiter) brings that wait forward (wake_at).
        self._inbox: Inbox[_Command] = Inbox(config.command_capacity)
        self._units = (
            None
            if config.max_concurrent is None
            else _Units(config.max_concurrent, bus, self._spawn_with_permit, self._inbox.wake_at)
        )
        self.intake_closed = False
        self.thread = threading.get_ident()  # the thread of the supervisor's trio run
        self._live: dict[TaskId, TaskRecord] = {}
        self._names: dict[str, TaskRecord] = {}
        self.registered = 0  # live records whose outcome is not committed
        self._pending = 0  # records in queued add commands
        # No pending add and no live record: what wait_idle() waits for; set only when
        # that changes (``_idle`` is its value, read without trio-util's property: rows
        # 1a and 1b, where every task would otherwise set it twice).
        self.idle = AsyncBool(True)
        self._idle = True
        self._heap: list[tuple[float, int, TaskRecord]] = []
        self._nursery: trio.Nursery | None = None
        self._loop_scope = trio.CancelScope()
        # While a caller decides directly (``add``, the controller's ``submit``): the
        # actors its decision admits, spawned once it has passed its checkpoint.
        self._held: list[tuple[TaskRecord, bool | None]] | None = None
        self.running_attempts = 0
        self.shutting_down = False
        self._shutdown_deadline = math.inf
        self._force_now = False  # force_all() came before the shutdown was taken in
        # Forced before shutdown began and still running: stuck if so at the deadline.
        self._overstaying: dict[TaskId, TaskRecord] = {}
        self._overstay_deadline = math.inf
        self._warned = False
        self._warn_at = math.inf  # when forced work still running is named (once)
        self.stuck: list[str] = []
        self.stopped = trio.Event()  # every outcome committed after shutdown began
        self._stops_asked = trio.Event()  # the shutdown asked its stops of every attempt
        self.exited = trio.Event()  # the loop ended: every actor physically exited

    # -- reading (any task) -----------------------------------------------------------

    def infos(self) -> tuple[TaskInfo, ...]:
        return tuple(
            TaskInfo(rec.id, rec.name, rec.slot, rec.state, rec.attempt)
            for rec in sorted(self._live.values(), key=lambda rec: rec.id)
            if not rec.committed
        )

    def alive(self) -> tuple[str, ...]:
        return tuple(sorted(rec.name for rec in self._live.values() if rec.in_attempt))

    def is_alive(self, name: str) -> bool:
        rec = self._names.get(name)
        if rec is None:  # a keyed call's name is not reserved
            return any(rec.name == name and rec.in_attempt for rec in self._live.values())
        return rec.in_attempt

    @property
    def waiting_for_permit(self) -> int:
        return 0 if self._units is None else self._units.tasks_waiting

    # -- permits, for wait-for cycles (``_waits``) ---------------------------------------------

    def permits_exhausted(self) -> int | None:
        """``max_concurrent`` when every permit is in use, else ``None``."""
        permits = self._units
        total = self._max_concurrent
        if permits is None or total is None:
            return None
        return total if permits.table.permit_in_use >= total else None

    def permit_waiters(self) -> list[TaskRecord]:
        """The records waiting for a permit, first come first."""
        if self._units is None:
            return []
        return [rec for rec in self._units.table.permit_waiters() if isinstance(rec, TaskRecord)]

    def watch_permits(self, watch: Callable[[TaskRecord], None] | None) -> None:
        """Report each record that starts waiting for a permit to ``watch`` (``None``: stop)."""
        if self._units is not None:
            self._units.watch = watch

    def limit_views(self) -> tuple[LimitView, ...]:
        """The limit pools with holders or waiters, sorted by name and key."""
        units = self._units
        if units is None:
            return ()
        table = units.table
        views: list[LimitView] = []
        for (name, key), held, waiting in table.usage():
            limit = table.settings(name)
            assert limit is not None
            views.append(limit_view(limit, key, held, waiting))
        for (name, key), (held, waiting) in units.remote_usage().items():
            limit = table.settings(name)
            assert limit is not None
            views.append(limit_view(limit, key, held, waiting))
        views.sort(key=lambda view: (view.name, view.key or ""))
        return tuple(views)

    @property
    def forced_alive(self) -> int:
        """Force-aborted tasks still physically running (committed, not exited)."""
        return len(self._live) - self.registered

    # -- intake (the facade's and the controller's tasks) -----------------------------------

    def check_intake(self, call: str, advice: str | None = None, *, sync: bool = False) -> None:
        """Raise ``RuntimeError`` for ``call`` in a thread other than the supervisor's
        (see ``check_thread``), and ``SupervisorClosedError`` once the shutdown has begun."""
        if threading.get_ident() != self.thread:
            self.check_thread(call, advice, sync=sync)
        if self.intake_closed:
            raise SupervisorClosedError

    async def await_stop(self) -> None:
        """The shutdown has begun: wait until its stops were asked (a checkpoint; the
        stop of the caller's attempt cancels it)."""
        await self._stops_asked.wait()

    async def check_block_intake(self, rec: TaskRecord | None, call: str, advice: str) -> None:
        """``check_intake`` for a ``limited`` block (in the attempt of ``rec``, if of this
        supervisor). One entered in an attempt that the shutdown's stops are still to
        reach waits for that stop instead (a checkpoint), which ends it with its
        attempt, as it ends a block waiting when the shutdown began."""
        try:
            self.check_intake(call, advice)
        except SupervisorClosedError:
            if rec is None or not self._stops_next(rec):
                raise
        else:
            return
        await self.await_stop()  # cancelled by the stop: CANCELLED
        raise SupervisorClosedError  # the stop did not end it (shielded, spawned elsewhere)

    def check_thread(self, call: str, advice: str | None = None, *, sync: bool = False) -> None:
        """``RuntimeError`` for ``call`` in a thread other than the supervisor's: a trio
        run of its own there would park on this run's events (never woken, then
        crashing this run when they are set), and a read there would see the state
        while this thread changes it. ``call``: what ``trio.from_thread.run`` (``run_sync``
        when ``sync``) takes instead (``"sup.remove, target"``), unless ``advice`` says
        otherwise."""
        if threading.get_ident() != self.thread:
            name = call.partition(",")[0]
            if advice is None:
                run = "run_sync" if sync else "run"
                advice = f"from another thread, go through trio.from_thread.{run}({call})"
            raise RuntimeError(
                f"{name}() works only in the thread of the supervisor's trio run; {advice}"
            )

    def store_closed(self) -> None:
        """The keeper has stopped: ``limited`` blocks still holding cluster units lose them."""
        if self._units is not None:
            self._units.lose_blocks()

    def close_intake(self) -> None:
        """The shutdown began: refuse intake from now on (``limited`` blocks included)."""
        self.intake_closed = True
        if self._units is not None:
            self._units.close_blocks(self._stops_next)

    def _stops_next(self, rec: TaskRecord) -> bool:
        """Whether the shutdown's stops, still to come, will reach ``rec``'s attempt."""
        return self._live.get(rec.id) is rec and not rec.stop_requested

    def add_nowait(self, rec: TaskRecord) -> None:
        """Queue the admission of ``rec``; a rejection resolves it ``REJECTED``.

        Raises ``trio.WouldBlock`` when the inbox is full.
        """
        command = _Add((rec,), None, False)
        try:
            self._inbox.put_nowait(command)
        except trio.BrokenResourceError:
            raise SupervisorClosedError from None
        self._queued(command)

    async def add(self, rec: TaskRecord) -> None:
        """Admit ``rec``, or raise its rejection; a checkpoint.

        Cancelled before the decision, nothing is admitted; once decided, the admission
        stands and a cancellation reaches the caller at its next checkpoint.
        """
        if self._inbox.idle():
            # Nothing queued before it: decide here, in the caller's task, then a
            # checkpoint that cannot undo the decision (as trio's channel send does).
            await trio.lowlevel.checkpoint_if_cancelled()
            # The actor starts only after the checkpoint, so add returns before the body
            # starts, as when the loop decides; until then the record is registered
            # with no actor, as one waiting for a permit is.
            held: list[tuple[TaskRecord, bool | None]] = []
            self._held = held
            try:
                error = self._admit_one(rec)
            finally:
                self._held = None
            await trio.lowlevel.cancel_shielded_checkpoint()
            for admitted, permit in held:
                self._start_actor(admitted, permit)
            if error is not None:
                raise error
            return
        reply: Reply[BaseException | None] = Reply()
        error = await self._ask(_Add((rec,), reply, False), reply)
        if error is not None:
            raise error

    def hold_actors(self) -> list[tuple[TaskRecord, bool | None]]:
        """Spawn no actor until ``start_held``: keep them in the list returned.

        For a decision made in a caller's task before its checkpoint (``add``, the
        controller's ``submit``): the call returns before the body starts, as when the
        loop decides. Until then the record is registered with no actor, as one waiting
        for a permit is. ``stop_holding`` must follow before the checkpoint.
        """
        held: list[tuple[TaskRecord, bool | None]] = []
        self._held = held
        return held

    def stop_holding(self) -> None:
        """Spawn actors at once again (after ``hold_actors``)."""
        self._held = None

    def start_held(self, held: list[tuple[TaskRecord, bool | None]]) -> None:
        """Spawn the actors ``hold_actors`` kept, in order."""
        for rec, permit in held:
            self._start_actor(rec, permit)

    async def add_batch(self, recs: Sequence[TaskRecord]) -> None:
        """Admit every record or none, in one command; raise a rejection."""
        reply: Reply[BaseException | None] = Reply()
        error = await self._ask(_Add(recs, reply, True), reply)
        if error is not None:
            raise error

    def admit(self, rec: TaskRecord) -> bool | None:
        """Admit a controller's owner: whether accepted now, or ``None`` when queued.

        Never refused: a queued decision reaches ``rec.listener.admission_decided``.
        """
        if self._inbox.idle() or self._inbox.closed:
            return self._admit_one(rec) is None
        command = _Add((rec,), None, False)
        self._inbox.put_nowait(command, force=True)
        self._queued(command)
        return None

    async def stop(self, target: TaskId | str) -> tuple[bool, TaskRecord | None]:
        """Claim or join the stop of ``target``: (claimed, the task if it is stopping)."""
        reply: Reply[tuple[bool, TaskRecord | None]] = Reply()
        try:
            return await self._ask(_Stop(target, reply), reply)
        except SupervisorClosedError:
            await trio.lowlevel.checkpoint()
            return False, None  # the registry has ended: every task is gone

    def forward_stop(self, target: TaskId, reply: Reply[tuple[bool, TaskRecord | None]]) -> None:
        """Queue a caller's stop by id (the controller's loop); the caller awaits ``reply``."""
        try:
            self._inbox.put_nowait(_Stop(target, reply), force=True)
        except trio.BrokenResourceError:
            reply.set((False, None))

    def lose_lease(self, rec: TaskRecord, reason: str) -> None:
        """The owner's cluster lease is lost: force it at once, no grace (``LEASE_LOST``).

        Its name and slot stay reserved until it physically exits, as for any forced task.
        """
        if rec.committed:
            return
        if not rec.stop_requested:
            rec.request_stop(reason)
        self._leave_units(rec)
        rec.force()
        self._commit_forced(rec, TaskOutcome(OutcomeKind.LEASE_LOST, reason=reason))

    def end_wait(self, rec: TaskRecord, outcome: TaskOutcome[object]) -> None:
        """End a task that waits for its units with ``outcome`` (a conflict of a limit's
        settings across the cluster: ``FATAL``); nothing is held afterwards."""
        if rec.committed:
            return
        if not rec.stop_requested:
            rec.request_stop(outcome.reason or "ended")
        self._leave_units(rec)
        rec.force()
        self._commit(rec, outcome)

    def use_cluster_pools(self, backend: PoolBackend) -> _Units:
        """Keep limit pools in ``backend`` (a slot store's server); return the units,
        which take the backend's answers."""
        units = self.units()
        units.cluster = backend
        units.lose = self.lose_lease
        units.end_wait = self.end_wait
        return units

    def stop_record(self, rec: TaskRecord) -> None:
        """Stop a registered record (the controller's REPLACE); nothing if already stopping."""
        if not rec.stop_requested and not rec.committed:
            self._request_stop(rec, trio.current_time() + self._grace)

    def begin_shutdown(self, deadline: float) -> None:
        """Queue the shutdown behind every command already accepted."""
        self._inbox.put_nowait(_Shutdown(deadline), force=True)

    def _queued(self, command: _Command, sign: int = 1) -> None:
        """Count (or, ``sign=-1``, uncount) the records of a queued add."""
        if type(command) is _Add:
            self._pending += sign * len(command.recs)
            self._busy()

    async def _ask(self, command: _Add | _Stop, reply: Reply[R]) -> R:
        """Queue ``command`` (a checkpoint; cancelled before it is queued, nothing is) and
        wait for its ``reply`` (cancelled then, the command still runs)."""
        self._queued(command, 1)  # before the put: the loop may take it during its yield
        try:
            await self._inbox.put(command)
        except BaseException as exc:
            self._queued(command, -1)
            self._maybe_idle()
            if isinstance(exc, trio.BrokenResourceError):
                raise SupervisorClosedError from None
            raise
        return await reply.wait()

    # -- the loop ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve commands until shutdown has seen every actor exit."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                with self._loop_scope:
                    await self._inbox.serve(self._handle, self._due)
        finally:
            # Later callers get SupervisorClosedError; what is still queued gets the
            # shutdown's replies.
            self._inbox.close()
            self._inbox.drain(self._handle)
            self.exited.set()

    def _due(self) -> float:
        """Force what is due, start what rate pools allow; the next deadline (``inf``: none)."""
        heap = self._heap
        if heap or self.shutting_down:
            self._force_due()
        units = self._units  # made on the first use of a limit
        pools_wake = math.inf if units is None else units.poll()
        return min(
            heap[0][0] if heap else math.inf, self._overstay_deadline, self._warn_at, pools_wake
        )

    def _handle(self, command: _Command) -> None:
        match command:
            case _Add(recs, reply, batch):
                if batch:
                    error = self._admit_batch(recs)
                else:
                    rec = recs[0]
                    listener = rec.listener
                    error = self._admit_one(rec)
                    if reply is None and listener is not None:
                        listener.admission_decided(rec, error is None)
                self._pending -= len(recs)
                self._maybe_idle()
                if reply is not None:
                    reply.set(error)
            case _Stop(target, reply):
                reply.set(self._stop_now(target))
            case _Shutdown(deadline):
                self._begin_shutdown(deadline)

    # -- admission ----------------------------------------------------------------------

    def _reject(self, rec: TaskRecord, rejection: RejectionKind) -> None:
        outcome = rejected_outcome(rejection)
        if self.bus.active:
            self.bus.publish(
                EventKind.TASK_ADD_FAILED,
                rec.id,
                rec.name,
                rec.slot,
                reason=outcome.reason,
                outcome=outcome.kind,
                rejection=rejection,
            )
        rec.place(Placement.REJECTED)  # not controller work's OWNER: placed once
        rec.resolve(outcome)
        if rec.listener is None:
            rec.release()  # controller work: its listener releases it after the decision

    def _admit_one(self, rec: TaskRecord) -> BaseException | None:
        """Decide on one record: register and spawn it, or reject it; the error."""
        bus = self.bus
        if bus.active:
            bus.publish(
                EventKind.TASK_ADD_REQUESTED,
                rec.id,
                rec.name,
                rec.slot,
                fence_token=rec.fence_token,
            )
        if self.shutting_down:
            self._reject(rec, RejectionKind.SHUTTING_DOWN)
            return SupervisorClosedError()
        if rec.reserved and rec.name in self._names:
            self._reject(rec, RejectionKind.ALREADY_EXISTS)
            return TaskNameInUseError(rec.name)
        if self._limit is not None and len(self._live) >= self._limit:
            self._reject(rec, RejectionKind.RESOURCE_LIMIT)
            return ResourceLimitError("max_registered_tasks", self._limit)
        self._register(rec)
        self._spawn(rec)
        return None

    def _admit_batch(self, recs: Sequence[TaskRecord]) -> BaseException | None:
        bus = self.bus
        if bus.active:
            for rec in recs:
                bus.publish(EventKind.TASK_ADD_REQUESTED, rec.id, rec.name, rec.slot)
        error: BaseException | None = None
        kinds = [RejectionKind.BATCH_REJECTED] * len(recs)
        if self.shutting_down:
            kinds = [RejectionKind.SHUTTING_DOWN] * len(recs)
            error = SupervisorClosedError()
        else:
            seen: set[str] = set()
            for i, rec in enumerate(recs):
                if not rec.reserved:
                    continue  # an automatic name: a label, never a conflict
                if rec.name in self._names or rec.name in seen:
                    kinds[i] = RejectionKind.ALREADY_EXISTS
                    if error is None:
                        error = TaskNameInUseError(rec.name)
                seen.add(rec.name)
            if (
                error is None
                and self._limit is not None
                and len(self._live) + len(recs) > self._limit
            ):
                kinds = [RejectionKind.RESOURCE_LIMIT] * len(recs)
                error = ResourceLimitError("max_registered_tasks", self._limit)
        if error is not None:
            for rec, kind in zip(recs, kinds, strict=True):
                self._reject(rec, kind)
            return error
        for rec in recs:
            self._register(rec)
        # Bodies start only once every item of the batch is registered.
        for rec in recs:
            self._spawn(rec)
        return None

    def _register(self, rec: TaskRecord) -> None:
        if self._idle:  # _busy(), inlined: every registered task passes here (row 1a)
            self._idle = False
            self.idle.value = False
        rec.place(_OWNER)
        self._live[rec.id] = rec
        if rec.reserved:
            self._names[rec.name] = rec
        self.registered += 1
        if self.bus.active:
            self.bus.publish(
                EventKind.TASK_ADDED, rec.id, rec.name, rec.slot, fence_token=rec.fence_token
            )

    def pool_ids(self, pools: tuple[Pool, ...]) -> tuple[PoolId, ...]:
        """Learn ``pools``' settings; ``ConfigError`` if a known name has other settings."""
        return self.units().table.check(pools)

    def units(self) -> _Units:
        """The units' driver, made on first use when there is no ``max_concurrent``."""
        units = self._units
        if units is None:
            units = self._units = _Units(
                None, self.bus, self._spawn_with_permit, self._inbox.wake_at
            )
        return units

    def _spawn(self, rec: TaskRecord) -> None:
        units = self._units
        if units is None or (not rec.policy.limits and self._max_concurrent is None):
            self._start_actor(rec, None)
        elif units.first(rec):
            self._start_actor(rec, True)
        # else: it waits in the permits' FIFO, with no actor yet.

    def _spawn_with_permit(self, rec: TaskRecord) -> None:
        self._start_actor(rec, True)

    def _start_actor(self, rec: TaskRecord, permit: bool | None) -> None:
        """Spawn ``rec``'s actor; ``permit`` as ``run_actor`` takes it."""
        if self._held is not None:
            self._held.append((rec, permit))
            return
        context = rec.context
        assert context is not None
        # start_soon copies the current context: call it inside the captured one.
        context.run(self._start_soon, rec, permit)
        restart = rec.policy.restart
        if not (restart.restarts_on_failure or restart.restarts_on_success):
            # One attempt only: the actor's own copy is all it needs (row 7, idle memory).
            rec.context = None

    def _start_soon(self, rec: TaskRecord, permit: bool | None) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(run_actor, rec, self, permit, name=rec.name)

    # -- the actors' host (their tasks) -------------------------------------------------------

    async def acquire_permit(self, rec: TaskRecord) -> None:
        assert self._units is not None
        await self._units.acquire(rec)

    def release_permit(self, rec: TaskRecord) -> None:
        assert self._units is not None
        self._units.release(rec)

    def actor_exited(self, rec: TaskRecord, outcome: TaskOutcome[object]) -> None:
        """Free the name, then commit ``outcome`` unless the force committed one."""
        del self._live[rec.id]
        if rec.reserved:
            del self._names[rec.name]
        if not rec.committed:
            if rec.fence_token is not None and rec.listener is not None:
                # The lease may have been lost in this very instant (its deadline passed
                # while the body ran its last step, or the loss is still in the
                # controller's inbox): the loss wins over whatever the body did.
                lost = rec.listener.lease_lost(rec)
                if lost is not None:
                    outcome = TaskOutcome(OutcomeKind.LEASE_LOST, reason=lost)
            self._commit(rec, outcome)
        else:
            bus = self.bus
            if bus.active:
                bus.publish(
                    EventKind.FORCED_TASK_EXITED,
                    rec.id,
                    rec.name,
                    rec.slot,
                    duration=trio.current_time() - rec.force_deadline,
                    fence_token=rec.fence_token,
                )
            if self._overstaying.pop(rec.id, None) is not None and not self._overstaying:
                self._overstay_deadline = math.inf  # every one exited within the grace
                self._check_all_stopped()
        if rec.listener is None:
            self._maybe_idle()
        # else: its listener may admit the slot's next owner first, then ``settle``.
        if self.shutting_down and not self._live:
            self._loop_scope.cancel(reason="shutdown: every actor exited")

    def settle(self) -> None:
        self._maybe_idle()

    def crashed(self, exc: BaseException) -> None:
        self._on_crash(exc)

    # -- stops ----------------------------------------------------------------------------

    def _lookup(self, target: TaskId | str) -> TaskRecord | None:
        """Find a registered (not yet committed) task by id or name."""
        rec = self._names.get(target) if isinstance(target, str) else self._live.get(target)
        return None if rec is None or rec.committed else rec

    def _stop_now(self, target: TaskId | str) -> tuple[bool, TaskRecord | None]:
        rec = self._lookup(target)
        if rec is None:
            return False, None
        if rec.stop_requested:
            return False, rec
        self._request_stop(rec, trio.current_time() + self._grace)
        return True, rec

    def _request_stop(self, rec: TaskRecord, deadline: float) -> None:
        if self.bus.active:
            self.bus.publish(
                EventKind.TASK_REMOVE_REQUESTED,
                rec.id,
                rec.name,
                rec.slot,
                fence_token=rec.fence_token,
            )
        rec.request_stop("stop requested")
        self._leave_units(rec)
        self._set_force_deadline(rec, deadline)

    def _leave_units(self, rec: TaskRecord) -> None:
        """A stop was asked of ``rec``: if it waits for its first attempt's units (it has
        no actor yet), take it out of the wait and spawn its actor, which sees the stop
        and ends at once, needing no units (its exit is reported as every actor's is).
        A parked actor leaves the wait by itself: the stop cancels its wait."""
        if self._units is not None and self._units.withdraw(rec):
            self._start_actor(rec, None)

    def _set_force_deadline(self, rec: TaskRecord, deadline: float) -> None:
        rec.force_deadline = deadline
        if deadline <= trio.current_time():
            self._force(rec)
        elif not math.isinf(deadline):
            heapq.heappush(self._heap, (deadline, int(rec.id), rec))
            self._inbox.wake_at(deadline)

    def _force_due(self) -> None:
        heap = self._heap
        now = trio.current_time()
        if now >= self._overstay_deadline:
            self._overstayed()
        if now >= self._warn_at:
            self._warn_at = math.inf
            self._warn_still_running()
        while heap and heap[0][0] <= now:
            deadline, _, rec = heapq.heappop(heap)
            if not rec.committed and rec.force_deadline == deadline:
                self._force(rec)

    def _force(self, rec: TaskRecord) -> None:
        rec.force()
        rec.force_deadline = trio.current_time()  # from now on: the time of the force
        if self.shutting_down:
            self.stuck.append(rec.name)
        self._commit_forced(rec, FORCED_AT_ONCE if self._force_now else FORCE_ABORTED)

    def _commit_forced(self, rec: TaskRecord, outcome: TaskOutcome[object]) -> None:
        """Commit the outcome of a force: the actor may run on, but its joiners have
        their outcome now (its listener, controller work's, is told)."""
        self._commit(rec, outcome)
        if rec.listener is not None:
            rec.listener.owner_forced(rec)

    def force_all(self) -> None:
        """Force every remaining task now (a signal during the shutdown)."""
        self._force_now = True
        if not self.shutting_down:
            return  # the shutdown, once taken in, takes "now" as its deadline
        now = trio.current_time()
        self._shutdown_deadline = now
        for rec in [rec for rec in self._live.values() if not rec.committed]:
            self._force(rec)
        if self._overstaying:
            self._overstayed()

    # -- endings --------------------------------------------------------------------------

    def _commit(self, rec: TaskRecord, outcome: TaskOutcome[object]) -> None:
        rec.committed = True
        self.registered -= 1
        heap = self._heap
        if len(heap) > 2 * self.registered:
            # Invariant: at least half of the heap is live (one item per stopping task
            # at most), so an ended task's record is not kept until its grace deadline.
            # In place: the loop holds the list. Amortised O(1) per item.
            heap[:] = [e for e in heap if not e[2].committed and e[2].force_deadline == e[0]]
            heapq.heapify(heap)
        bus = self.bus
        if bus.active:
            bus.publish(
                EventKind.TASK_FINISHED,
                rec.id,
                rec.name,
                rec.slot,
                rec.attempt,
                outcome.reason,
                outcome.kind,
                exit_code=outcome.exit_code,
                fence_token=rec.fence_token,
            )
            bus.publish(
                EventKind.TASK_REMOVED, rec.id, rec.name, rec.slot, fence_token=rec.fence_token
            )
        failed = outcome.error is not None or outcome is PANICKED  # FAILED, FATAL, PANICKED
        if failed:
            self._failed(rec, outcome)
        rec.resolve(outcome)
        if failed and rec.policy.critical and self._on_critical is not None:
            self._on_critical(rec, outcome)
        if self.shutting_down and not self.registered:
            self._check_all_stopped()

    def _failed(self, rec: TaskRecord, outcome: TaskOutcome[object]) -> None:
        """A FAILED, FATAL or PANICKED outcome: log it, keep it for the plugin's check."""
        if self.failures is not None:
            self.failures.append((rec, rec.joiners()))
        if self.log_failures:
            log(
                logging.ERROR,
                "task %r (%s) ended %s: %s",
                rec.name,
                rec.id,
                outcome.kind.value,
                outcome.reason,
                exc_info=outcome.error,
                extra={
                    "taskvisor_name": rec.name,
                    "taskvisor_task_id": rec.id,
                    "taskvisor_outcome": outcome.kind,
                    "taskvisor_reason": outcome.reason,
                },
            )

    def _busy(self) -> None:
        if self._idle:
            self._idle = False
            self.idle.value = False

    def _maybe_idle(self) -> None:
        if not self._idle and not self._live and not self._pending:
            self._idle = True
            self.idle.value = True

    # -- shutdown ---------------------------------------------------------------------------

    def _begin_shutdown(self, deadline: float) -> None:
        if self._force_now:
            deadline = trio.current_time()
        self.shutting_down = True
        self._shutdown_deadline = deadline
        # Forced earlier, still running: stuck too if still so at the shared deadline.
        self._overstaying = {id: rec for id, rec in self._live.items() if rec.committed}
        if self._overstaying:
            self._overstay_deadline = deadline
        for rec in [rec for rec in self._live.values() if not rec.committed]:
            if rec.stop_requested:
                # Already stopping: keep the later of its own deadline and the shared one.
                if deadline > rec.force_deadline:
                    self._set_force_deadline(rec, deadline)
            else:
                self._request_stop(rec, deadline)
        if self._units is not None:
            self._units.close_blocks()  # those the stops did not end
        self._stops_asked.set()
        if self._overstaying and deadline <= trio.current_time():
            self._overstayed()  # grace=0
        elif not self.registered:
            self._check_all_stopped()
        if not self._live:
            self._loop_scope.cancel(reason="shutdown: no actor left")

    def _overstayed(self) -> None:
        """The shared deadline passed: forced work still running from before is stuck."""
        self.stuck.extend(rec.name for rec in self._overstaying.values())
        self._overstaying = {}
        self._overstay_deadline = math.inf
        self._check_all_stopped()

    def _check_all_stopped(self) -> None:
        """Every outcome is committed: warn about forced work still running, end the stop."""
        if self.registered:
            return
        if self._live and not self._warned:
            self._warned = True
            self._warn_at = trio.current_time() + EXIT_WAIT_WARNING
            self._inbox.wake_at(self._warn_at)
        if not self._overstaying:
            self._all_stopped()

    def _warn_still_running(self) -> None:
        if not self._live:
            return
        names = ", ".join(repr(name) for name in sorted(r.name for r in self._live.values()))
        log(
            logging.WARNING,
            "shutdown has waited %g s for the physical exit of %d force-aborted task(s): %s",
            EXIT_WAIT_WARNING,
            len(self._live),
            names,
        )

    def _all_stopped(self) -> None:
        if self.stopped.is_set():
            return
        self.stuck.sort()
        if self.bus.active:
            if self.stuck:
                how = "forced at once (a signal)" if self._force_now else "forced"
                self.bus.publish(EventKind.GRACE_EXCEEDED, reason=f"{how}: {', '.join(self.stuck)}")
            else:
                self.bus.publish(EventKind.ALL_STOPPED_WITHIN_GRACE)
        self.stopped.set()
