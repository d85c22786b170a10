"""The registry loop: sole owner of membership, and of every stop's deadline.

The registry receives commands on one bounded memory channel and processes them in
order, so a remove sent after an add always sees that add. It spawns one actor per
admitted task in its own nursery, and keeps a heap of force deadlines: while stops are
pending it waits for the next command only until the earliest deadline, then forces.

Membership has three views:

* ``_tasks``: registered and stopping tasks, whose outcome is not committed yet
  (``list()``);
* ``_live``: every live actor, including force-aborted actors that have not physically
  exited (``max_registered_tasks``, ``alive_snapshot()``);
* ``_names``: the names those actors reserve (duplicate checks, name targets).

Actors call ``actor_exited`` directly when they end: the call runs in the actor's
task but between two checkpoints, so it is as atomic as a command.

Decisions the design leaves open:

* ``TASK_ADD_REQUESTED`` is published when the registry takes the command in, just
  before ``TASK_ADDED`` / ``TASK_ADD_FAILED``.
* An add accepted on the channel before shutdown began is admitted and then stopped
  with everything else; one that reaches the registry after the shutdown command is
  rejected ``SHUTTING_DOWN`` (``add`` raises ``SupervisorClosedError``).
* For a batch, the "first conflicting" name is that of the first item, in batch order,
  that clashes with a registered name or with an earlier item. Duplicates are checked
  before the limit.
* ``GraceExceededError.stuck`` lists the tasks forced after shutdown began, and the
  tasks forced before it that are still physically running at the shared grace
  deadline (DESIGN section 8); ``ALL_STOPPED_WITHIN_GRACE`` is published only once no
  forced work is left running or due to be listed. Once every outcome is committed and
  forced work still runs, one warning names the tasks the shutdown waits for.
* Keyed calls (``run_in_slot``) reserve no name: their automatic names are labels, so
  a user task of the same name never collides with one. Name targets do not find them;
  their ``TaskId`` does.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import attrs
import trio
from trio_util import AsyncBool

from ._actor import TaskRecord, TaskState, run_actor
from ._events import EventKind
from ._exceptions import ResourceLimitError, SupervisorClosedError, TaskNameInUseError
from ._outcome import FORCE_ABORTED, RejectionKind, TaskId, TaskOutcome, rejected_outcome

if TYPE_CHECKING:
    from ._bus import EventBus
    from ._supervisor import Supervisor

logger = logging.getLogger("trio_taskvisor")


@attrs.frozen
class TaskInfo:
    """A registered or stopping task, as ``Supervisor.list()`` reports it."""

    id: TaskId
    name: str
    slot: str | None
    state: TaskState
    attempt: int


class WorkCounter:
    """Outstanding work: accepted commands and submissions not yet decided, live actors.

    ``idle`` (a trio-util ``AsyncBool``, what ``wait_idle()`` waits on) changes only
    when the count crosses zero, so counting is a plain integer update on hot paths.
    """

    __slots__ = ("count", "idle")

    def __init__(self) -> None:
        self.count = 0
        self.idle = AsyncBool(True)

    def add(self, n: int = 1) -> None:
        if not self.count:
            self.idle.value = False
        self.count += n

    def sub(self, n: int = 1) -> None:
        self.count -= n
        if not self.count:
            self.idle.value = True


class Reply:
    """A one-shot answer from a loop to a waiting caller."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.error: BaseException | None = None
        self.value: object = None

    def set(self, value: object = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error
        self.event.set()

    async def wait(self) -> object:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class AddCommand:
    __slots__ = ("batch", "records", "reply")

    def __init__(
        self, records: Sequence[TaskRecord], reply: Reply | None, *, batch: bool = False
    ) -> None:
        self.records = records
        self.reply = reply
        self.batch = batch


class StopCommand:
    __slots__ = ("reply", "target")

    def __init__(self, target: TaskId | str, reply: Reply) -> None:
        self.target = target
        self.reply = reply


class ShutdownCommand:
    __slots__ = ("deadline",)

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline


class _Wake:
    """A no-op command: makes the loop look at its force deadlines again."""


WAKE: Final = _Wake()

Command = AddCommand | StopCommand | ShutdownCommand | _Wake


class Registry:
    """Membership, admission, stops and forces of one supervisor."""

    def __init__(self, supervisor: Supervisor, bus: EventBus) -> None:
        config = supervisor.config
        self.supervisor = supervisor
        self.bus = bus
        self.random: random.Random = config.random
        self.grace: float = config.grace
        self.limit: int | None = config.max_registered_tasks
        self.limiter = (
            None if config.max_concurrent is None else trio.CapacityLimiter(config.max_concurrent)
        )
        self.send, self._recv = trio.open_memory_channel[Command](config.command_capacity)
        self._tasks: dict[TaskId, TaskRecord] = {}
        self._live: dict[TaskId, TaskRecord] = {}
        self._names: dict[str, TaskRecord] = {}
        self._heap: list[tuple[float, int, TaskRecord]] = []
        self._nursery: trio.Nursery | None = None
        self._loop_scope = trio.CancelScope()
        # The loop's wait for the next command; a stop requested from another task
        # (the controller's REPLACE) brings its deadline forward, so the force is on time.
        self._wait_scope: trio.CancelScope | None = None
        self._parked = False  # waiting for a command with no deadline pending
        self.running_attempts = 0
        self.waiting_for_permit = 0
        self.work = WorkCounter()
        self.shutting_down = False
        self._shutdown_deadline = math.inf
        # Forced before shutdown began and still running: stuck if so at the deadline.
        self._overstaying: dict[TaskId, TaskRecord] = {}
        self._overstay_deadline = math.inf
        self._warned = False
        self.stuck: list[str] = []
        self.stopped = trio.Event()  # every outcome committed after shutdown began
        self.exited = trio.Event()  # the loop ended: every actor physically exited
        self.on_crash: Callable[[BaseException], None] = lambda exc: None

    # -- reading (any task) -----------------------------------------------------------

    def infos(self) -> tuple[TaskInfo, ...]:
        return tuple(
            TaskInfo(rec.id, rec.name, rec.slot, rec.state, rec.attempt)
            for rec in sorted(self._tasks.values(), key=lambda rec: rec.id)
        )

    def alive(self) -> tuple[str, ...]:
        return tuple(sorted(rec.name for rec in self._live.values() if rec.in_attempt))

    def is_alive(self, name: str) -> bool:
        rec = self._names.get(name)
        if rec is None:  # a keyed call's name is not reserved
            return any(rec.name == name and rec.in_attempt for rec in self._live.values())
        return rec.in_attempt

    @property
    def registered(self) -> int:
        return len(self._tasks)

    # -- the loop ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve commands until shutdown has seen every actor exit."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                with self._loop_scope:
                    await self._serve()
        finally:
            # Answer whatever is still queued (with the shutdown's replies), then
            # close: later senders get BrokenResourceError.
            while True:
                try:
                    command = self._recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self._handle(command)
            self._recv.close()
            self.exited.set()

    async def _serve(self) -> None:
        receive = self._recv.receive
        receive_nowait = self._recv.receive_nowait
        handle = self._handle
        heap = self._heap
        while True:
            if heap or self._overstaying:
                self._force_due()
            if heap or self._overstaying:
                wake = min(heap[0][0] if heap else math.inf, self._overstay_deadline)
                with trio.move_on_at(wake) as self._wait_scope:
                    handle(await receive())
                self._wait_scope = None
            else:
                # No deadline pending, so no scope; a stop requested meanwhile from
                # another task wakes this wait with a WAKE command instead.
                self._parked = True
                handle(await receive())
                self._parked = False
            # Commands already buffered are handled without a scheduler pass each.
            while True:
                try:
                    command = receive_nowait()
                except trio.WouldBlock:
                    break
                handle(command)

    def _handle(self, command: Command) -> None:
        if type(command) is AddCommand:
            if command.batch:
                self._admit_batch(command.records, command.reply)
            else:
                rec = command.records[0]
                error = self._admit_one(rec, command.reply)
                if rec.controller is not None:
                    rec.controller.on_admission(rec, error is None)
            self.work.sub(len(command.records))
        elif type(command) is StopCommand:
            command.reply.set(self.stop(command.target))
        elif type(command) is ShutdownCommand:
            self._begin_shutdown(command.deadline)

    # -- admission ----------------------------------------------------------------------

    def _reject(self, rec: TaskRecord, rejection: RejectionKind) -> None:
        outcome = rejected_outcome(rejection)
        if self.bus.active:
            self.bus.publish(
                EventKind.TASK_ADD_FAILED,
                task_id=rec.id,
                name=rec.name,
                slot=rec.slot,
                reason=outcome.reason,
                outcome=outcome.kind,
                rejection=rejection,
            )
        rec.waiter._resolve(outcome)  # pyright: ignore[reportPrivateUsage]

    def admit_now(self, rec: TaskRecord) -> bool:
        """Admit controller work directly (no channel hop); return whether accepted."""
        return self._admit_one(rec, None) is None

    def idle(self) -> bool:
        """Whether no command is queued or in flight: the loop is parked in ``receive``.

        Then a caller may run an admission itself, in its own task: nothing is ordered
        before it, and the registry code is as atomic there as in the loop.
        """
        stats = self.send.statistics()
        return stats.current_buffer_used == 0 and stats.tasks_waiting_receive == 1

    def admit_direct(self, rec: TaskRecord) -> BaseException | None:
        """Admit in the caller's task (see ``idle``); return the rejection error."""
        return self._admit_one(rec, None)

    def _admit_one(self, rec: TaskRecord, reply: Reply | None) -> BaseException | None:
        bus = self.bus
        if bus.active:
            bus.publish(EventKind.TASK_ADD_REQUESTED, task_id=rec.id, name=rec.name, slot=rec.slot)
        error: BaseException | None = None
        if self.shutting_down:
            self._reject(rec, RejectionKind.SHUTTING_DOWN)
            error = SupervisorClosedError("the supervisor is shutting down")
        elif rec.reserved and rec.name in self._names:
            self._reject(rec, RejectionKind.ALREADY_EXISTS)
            error = TaskNameInUseError(rec.name)
        elif self.limit is not None and len(self._live) >= self.limit:
            self._reject(rec, RejectionKind.RESOURCE_LIMIT)
            error = ResourceLimitError("max_registered_tasks", self.limit)
        else:
            self._register(rec)
            self._spawn(rec)
        if reply is not None:
            reply.set(rec.waiter, error)
        return error

    def _admit_batch(self, recs: Sequence[TaskRecord], reply: Reply | None) -> None:
        bus = self.bus
        if bus.active:
            for rec in recs:
                bus.publish(
                    EventKind.TASK_ADD_REQUESTED, task_id=rec.id, name=rec.name, slot=rec.slot
                )
        error: BaseException | None = None
        kinds = [RejectionKind.BATCH_REJECTED] * len(recs)
        if self.shutting_down:
            kinds = [RejectionKind.SHUTTING_DOWN] * len(recs)
            error = SupervisorClosedError("the supervisor is shutting down")
        else:
            seen: set[str] = set()
            for i, rec in enumerate(recs):
                if rec.name in self._names or rec.name in seen:
                    kinds[i] = RejectionKind.ALREADY_EXISTS
                    if error is None:
                        error = TaskNameInUseError(rec.name)
                seen.add(rec.name)
            if (
                error is None
                and self.limit is not None
                and len(self._live) + len(recs) > self.limit
            ):
                kinds = [RejectionKind.RESOURCE_LIMIT] * len(recs)
                error = ResourceLimitError("max_registered_tasks", self.limit)
        if error is not None:
            for rec, kind in zip(recs, kinds, strict=True):
                self._reject(rec, kind)
        else:
            for rec in recs:
                self._register(rec)
            # Bodies start only once every item of the batch is registered.
            for rec in recs:
                self._spawn(rec)
        if reply is not None:
            reply.set([rec.waiter for rec in recs], error)

    def _register(self, rec: TaskRecord) -> None:
        self._tasks[rec.id] = rec
        self._live[rec.id] = rec
        if rec.reserved:
            self._names[rec.name] = rec
        self.work.add()
        if self.bus.active:
            self.bus.publish(EventKind.TASK_ADDED, task_id=rec.id, name=rec.name, slot=rec.slot)
        if self.shutting_down:
            self._request_stop(rec, self._shutdown_deadline)

    def _spawn(self, rec: TaskRecord) -> None:
        rec.supervisor = self.supervisor
        # start_soon copies the current context: call it inside the captured one.
        assert rec.context is not None
        rec.context.run(self._start_actor, rec)
        restart = rec.policy.restart
        if not (restart.restarts_on_failure or restart.restarts_on_success):
            rec.context = None  # one attempt only: the actor's own copy is all it needs

    def _start_actor(self, rec: TaskRecord) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(run_actor, rec, self, name=rec.name)

    # -- stops ----------------------------------------------------------------------------

    def lookup(self, target: TaskId | str) -> TaskRecord | None:
        """Find a registered (not yet committed) task by id or name."""
        if isinstance(target, str):
            rec = self._names.get(target)
            return None if rec is None or rec.committed else rec
        return self._tasks.get(target)  # pyright: ignore[reportArgumentType]

    def stop(self, target: TaskId | str) -> tuple[bool, TaskRecord | None]:
        """Claim or join the stop of ``target``: (claimed, the task if it is stopping)."""
        rec = self.lookup(target)
        if rec is None:
            return False, None
        if rec.stop_requested:
            return False, rec
        self._request_stop(rec, trio.current_time() + self.grace)
        return True, rec

    def _request_stop(self, rec: TaskRecord, deadline: float) -> None:
        if self.bus.active:
            self.bus.publish(
                EventKind.TASK_REMOVE_REQUESTED, task_id=rec.id, name=rec.name, slot=rec.slot
            )
        rec.request_stop("stop requested")
        self._set_force_deadline(rec, deadline)

    def _set_force_deadline(self, rec: TaskRecord, deadline: float) -> None:
        rec.force_deadline = deadline
        if deadline <= trio.current_time():
            self._force(rec)
        elif not math.isinf(deadline):
            heapq.heappush(self._heap, (deadline, int(rec.id), rec))
            # Called from another task (the controller's REPLACE, an actor's callback)
            # while the loop waits: bring its wake-up forward.
            scope = self._wait_scope
            if scope is not None and deadline < scope.deadline:
                scope.deadline = deadline
            elif self._parked:
                self._parked = False
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                    self.send.send_nowait(WAKE)

    def _force_due(self) -> None:
        heap = self._heap
        now = trio.current_time()
        if now >= self._overstay_deadline:
            self._overstayed()
        while heap and heap[0][0] <= now:
            deadline, _, rec = heapq.heappop(heap)
            if not rec.committed and rec.force_deadline == deadline:
                self._force(rec)

    def _force(self, rec: TaskRecord) -> None:
        rec.force()
        if self.shutting_down:
            self.stuck.append(rec.name)
        self._commit(rec, FORCE_ABORTED)

    # -- endings --------------------------------------------------------------------------

    def _commit(self, rec: TaskRecord, outcome: TaskOutcome) -> None:
        rec.committed = True
        del self._tasks[rec.id]
        heap = self._heap
        if len(heap) > 2 * len(self._tasks):
            # Invariant: at least half of the heap is live (one entry per stopping task
            # at most), so an ended task's record is not kept until its grace deadline.
            # In place: the loop holds the list. Amortised O(1) per entry.
            heap[:] = [e for e in heap if not e[2].committed and e[2].force_deadline == e[0]]
            heapq.heapify(heap)
        bus = self.bus
        if bus.active:
            fields = {"task_id": rec.id, "name": rec.name, "slot": rec.slot}
            bus.publish(
                EventKind.TASK_FINISHED,
                outcome=outcome.kind,
                reason=outcome.reason,
                exit_code=outcome.exit_code,
                attempt=rec.attempt,
                **fields,
            )
            bus.publish(EventKind.TASK_REMOVED, **fields)
        rec.waiter._resolve(outcome)  # pyright: ignore[reportPrivateUsage]
        if self.shutting_down and not self._tasks:
            self._check_all_stopped()

    def actor_exited(self, rec: TaskRecord, outcome: TaskOutcome) -> None:
        """Called by the actor as it ends: free the name, then commit."""
        del self._live[rec.id]
        if rec.reserved:
            del self._names[rec.name]
        self.work.sub()
        if not rec.committed:
            self._commit(rec, outcome)
        elif self._overstaying.pop(rec.id, None) is not None and not self._overstaying:
            self._overstay_deadline = math.inf  # every one exited within the grace
            self._check_all_stopped()
        if rec.controller is not None:
            rec.controller.on_exit(rec)
        if self.shutting_down and not self._live:
            self._loop_scope.cancel(reason="shutdown: every actor exited")

    def crashed(self, exc: BaseException) -> None:
        self.on_crash(exc)

    # -- shutdown ---------------------------------------------------------------------------

    def _begin_shutdown(self, deadline: float) -> None:
        self.shutting_down = True
        self._shutdown_deadline = deadline
        # Forced earlier, still running: stuck too if still so at the shared deadline.
        self._overstaying = {id: rec for id, rec in self._live.items() if rec.committed}
        if self._overstaying:
            self._overstay_deadline = deadline
        for rec in list(self._tasks.values()):
            if rec.stop_requested:
                # Already stopping: keep the later of its own deadline and the shared one.
                if deadline > rec.force_deadline:
                    self._set_force_deadline(rec, deadline)
            else:
                self._request_stop(rec, deadline)
        if self._overstaying and deadline <= trio.current_time():
            self._overstayed()  # grace=0
        elif not self._tasks:
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
        if self._tasks:
            return
        if self._live and not self._warned:
            self._warned = True
            names = ", ".join(repr(name) for name in sorted(r.name for r in self._live.values()))
            logger.warning(
                "shutdown is waiting for the physical exit of %d force-aborted task(s): %s",
                len(self._live),
                names,
            )
        if not self._overstaying:
            self._all_stopped()

    def _all_stopped(self) -> None:
        if self.stopped.is_set():
            return
        self.stuck.sort()
        if self.bus.active:
            if self.stuck:
                self.bus.publish(
                    EventKind.GRACE_EXCEEDED, reason=f"forced: {', '.join(self.stuck)}"
                )
            else:
                self.bus.publish(EventKind.ALL_STOPPED_WITHIN_GRACE)
        self.stopped.set()
