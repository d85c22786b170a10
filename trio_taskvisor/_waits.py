"""The wait guard: ``DeadlockError`` for waits that close a wait-for cycle.

Loops layer, between the controller (which tells it what its work waits for, through
``SlotEdges``, declared here) and the registry (whose permits it reads); the cycle search
itself is the pure ``_waitfor``.

Every waiter of a supervisor has its ``WaitChecker`` as ``WaitGuard``. A wait made
outside an attempt of the same supervisor parks as usual (``caller()`` is ``None``: one
context-variable read). A wait made inside one is registered in the pure ``WaitFor``
(``_waitfor``) for as long as it is blocked, and the wait-for graph is searched:

* when the wait begins: if its target can reach the caller, it raises at once;
* when a node gains edges (a later edge): the controller reports work it took in
  (``edges_added``: queued or held behind a slot, or joined), the registry each record
  that starts waiting for a permit (``watch_permits``, set only while waits are
  registered), and a wait that makes every permit holder blocked brings permit edges
  from every permit waiter. A cycle found then raises in the wait that closes it: its
  ``CancelScope`` is cancelled and the wait raises ``DeadlockError`` instead.

The edges, computed from the live state when a search asks:

* wait edges: a blocked caller waits for its waits' targets (the awaited work; for
  ``wait_slot_idle`` the slot's owner). A satisfied wait (its target resolved, or placed
  for ``wait_placed``) has none, and neither have the waits of a caller whose stop was
  requested: they end by its stop, or by its grace deadline at the latest, so they are
  only slow (self-waits, below, aside); nor has a wait for work whose stop was
  requested, for the same reason (before, a task
  blocked in ``cancel()`` of work waiting for a permit counted as a blocked permit
  holder, and another holder's wait for permit-waiting work raised ``DeadlockError``
  about half the time, with no cycle);
* slot edges (``SlotEdges``, the controller): queued or held work waits for its slot's
  owner, a joiner for the work it follows;
* permit edges: with ``max_concurrent``, when every permit is held by an attempt blocked
  in such a wait, each record waiting for a permit (the registry's FIFO: admitted work
  without an actor yet, and actors before a later attempt) waits for every holder; one
  whose stop was requested ends at once and waits for none.

Self-waits: a wait of a caller whose stop was requested that would close a cycle if the
caller's waits kept their edges (``_self_cycle``: the awaited work waits for the caller,
as a REPLACE of the caller's own slot does) can end only once the caller has. The stop's
``Cancelled`` ends it; a scope the stop cannot reach (shielded, a ``defer_cancel()``
block) gets ``DeadlockError`` instead, its message the cycle's and that the task was
asked to stop. It is looked for when such a wait begins (its ``checkpoint_if_cancelled``
passed, so the stop could not reach it), when a blocked caller's stop is requested
(``caller_stopping``, from ``TaskRecord.request_stop`` while ``active``: a REPLACE
stops the owner as it takes the replacement in), and, for the stopping callers' waits
that closed none yet (``_stopping``), when a node gains edges. ``refuse_self_wait`` ends
the calls that wait for their own task with no waiter to check (``shutdown()``,
``cancel()`` of the caller's own task) the same way: once the task is asked to stop.

Nothing here runs for a wait made outside an attempt, and the hooks run only while a
checked wait is blocked, so a supervisor whose attempts wait for nothing pays nothing.

Decisions the design leaves open:

* The message reads ``wait-for cycle: task 'a' (#1) waits for 'b' (#2), which is queued
  behind 'a' (#1)``: each task by name and id, from the caller, with how each waits for
  the next.
* A cancelled caller gets ``Cancelled``, never ``DeadlockError``: the check comes after
  the wait's cancellation point.
* A wait made from a task that copied an attempt's context but outlived the attempt is
  not checked (the attempt it names is over).
* A self-wait of a stopping caller raises in a shielded scope, where it would wait
  for ever (or, in a ``defer_cancel()`` block, until the grace deadline forces it), as
  the stop comes: the stop, which the call asked (a REPLACE, ``cancel()``) or someone
  else did, stands, and the task, returning, ends ``CANCELLED``. Before, a stopping
  caller's waits were never checked. Any other wait of a stopping caller still waits
  (it is only slow, or waits for a task outside the caller's reach).
* Held work waits for its slot's owner (a slot edge) whatever budget holds it, as the
  design defines the edge; ``wait_placed`` on work held behind the caller's own slot
  therefore raises even when only the global pending budget holds it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import trio

from ._exceptions import DeadlockError
from ._record import TaskRecord, current_task_context
from ._waitfor import Edge, Step, Wait, WaitFor

if TYPE_CHECKING:
    from ._registry import Registry
    from ._waiter import TaskWaiter


class SlotEdges(Protocol):
    """What the controller tells the wait guard about its work."""

    def slot_edge(self, rec: TaskRecord, /) -> Edge[TaskRecord] | None:
        """What ``rec`` waits for in the slots: its slot's owner, or its joined work."""

    def slot_owner(self, key: str, /) -> TaskRecord | None:
        """The owner of slot ``key`` (``None``: no owner)."""


class _Kind(enum.Enum):
    OUTCOME = "waits for"
    PLACEMENT = "waits for the placement of"
    SLOT = "waits for slot"


_PERMIT = "waits for a permit held by"


class _Guarded(Wait[TaskRecord]):
    """A checked wait, with the scope it parks in and the error that ends it."""

    __slots__ = ("error", "scope")

    def __init__(self, caller: TaskRecord, target: object, kind: _Kind) -> None:
        super().__init__(caller, target, kind)
        self.scope: trio.CancelScope | None = None
        self.error: DeadlockError | None = None


class WaitChecker:
    """The ``WaitGuard`` of one supervisor's waiters: wait-for cycle detection."""

    def __init__(self, registry: Registry, supervisor: object) -> None:
        self._registry = registry
        self._supervisor = supervisor  # records of other supervisors are not ours
        self.attempt_context = current_task_context  # an attribute: read on every wait()
        self.thread = registry.thread  # read on every wait() that blocks
        self.slots: SlotEdges | None = None
        self._graph: WaitFor[TaskRecord] = WaitFor(self._state_edges, self._wait_edges)
        self.active = False  # a checked wait is blocked: the hooks have work to do
        # Permit edges, recomputed before each search: the holders (None: no permit
        # edges) and the ids of the records waiting for a permit.
        self._holders: list[Edge[TaskRecord]] | None = None
        self._permit_waiters: set[int] = set()
        # The blocked waits of stopping callers that do not wait for their caller (yet):
        # a later edge may make them (edges_added).
        self._stopping: list[_Guarded] = []

    # -- the guard (a waiter's task) -----------------------------------------------------------

    def check_thread(self, call: str) -> None:
        """``RuntimeError`` for ``call`` outside the thread of the supervisor's run."""
        self._registry.check_thread(call)

    def caller(self) -> TaskRecord | None:
        """The running attempt of this supervisor making the call, or ``None``."""
        rec = current_task_context.get(None)
        if rec is None or rec.supervisor is not self._supervisor or not rec.in_attempt:
            return None
        return rec

    async def refuse_self_wait(self, caller: TaskRecord, message: str) -> NoReturn:
        """End a call of ``caller`` that can end only once ``caller``'s task has.

        Waits until the task is asked to stop (the call has asked it, or will): the
        stop's ``Cancelled`` ends the call, and in a scope the stop cannot reach (a
        shielded one, a ``defer_cancel()`` block) ``DeadlockError(message)`` does.
        """
        await caller.cancel_flag().wait_value(True)  # pyright: ignore[reportUnknownMemberType]
        await trio.lowlevel.checkpoint_if_cancelled()  # the stop, unless shielded
        raise DeadlockError(message)

    async def guarded_wait(
        self, caller: object, waiter: TaskWaiter[Any], event: trio.Event, /, *, placement: bool
    ) -> None:
        """Wait for ``event`` (``waiter``'s outcome or placement); raise on a cycle."""
        assert isinstance(caller, TaskRecord)
        kind = _Kind.PLACEMENT if placement else _Kind.OUTCOME
        await self._guarded(_Guarded(caller, waiter, kind), event)

    async def guarded_slot_wait(self, caller: TaskRecord, key: str, event: trio.Event) -> None:
        """Wait for ``event`` (slot ``key`` idle); raise on a cycle."""
        await self._guarded(_Guarded(caller, key, _Kind.SLOT), event)

    async def _guarded(self, wait: _Guarded, event: trio.Event) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if event.is_set():
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        graph = self._graph
        self._prepare()
        had_permit_edges = self._holders is not None
        graph.add(wait)
        self._sync_active()
        self._prepare()
        cycle = graph.closing_cycle(wait)
        stopping = cycle is None and wait.caller.stop_requested
        if stopping:
            # Its stop came first and could not reach it (``checkpoint_if_cancelled``):
            # a wait for itself can end only once the task has; any other is only slow.
            cycle = self._self_cycle(wait)
            if cycle is None:
                self._stopping.append(wait)
        if cycle is not None:
            graph.remove(wait)
            self._sync_active()
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise DeadlockError(_message(cycle, stopping=stopping))
        if self._holders is not None and not had_permit_edges:
            # This wait blocked the last free permit holder: every permit waiter now
            # waits for every holder, which may close cycles through other waits.
            for rec in self._registry.permit_waiters():
                self._resolve_cycles_through(rec)
        try:
            if wait.error is None:
                with trio.CancelScope() as wait.scope:
                    await event.wait()
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            graph.remove(wait)
            if self._stopping and wait in self._stopping:
                self._stopping.remove(wait)
            self._sync_active()
        if wait.error is not None:
            raise wait.error

    # -- later edges (the controller's and the registry's tasks) --------------------------------

    def edges_added(self, rec: TaskRecord) -> None:
        """``rec`` gained edges (taken in behind a slot, joined, waiting for a permit)."""
        if self.active:
            self._resolve_cycles_through(rec)
            if self._stopping:
                for wait in list(self._stopping):
                    self._end_self_wait(wait)

    def caller_stopping(self, rec: TaskRecord) -> None:
        """``rec``'s stop was requested (called only while ``active``): end its waits
        that wait for itself. In a scope the stop reaches, its ``Cancelled`` wins."""
        waits = self._graph.waits.get(rec)
        if waits is None:
            return
        for wait in list(waits):
            assert isinstance(wait, _Guarded)
            if not self._end_self_wait(wait):
                self._stopping.append(wait)

    def _end_self_wait(self, wait: _Guarded) -> bool:
        """End ``wait`` of a stopping caller if it waits for its caller; whether it did."""
        cycle = self._self_cycle(wait)
        if cycle is None:
            return False
        self._graph.remove(wait)
        if wait in self._stopping:
            self._stopping.remove(wait)
        wait.error = DeadlockError(_message(cycle, stopping=True))
        if wait.scope is not None:
            wait.scope.cancel(reason="wait for its own task")
        return True

    def _self_cycle(self, wait: _Guarded) -> list[Step[TaskRecord]] | None:
        """The cycle back to its stopping caller that ``wait`` would close if the caller
        were not stopping (its waits then have no edges), or ``None``."""
        self._prepare()
        return self._graph.closing_cycle(wait, self._edges(wait))

    def _resolve_cycles_through(self, rec: TaskRecord) -> None:
        """End, one by one, the waits that close cycles through ``rec``."""
        graph = self._graph
        while graph:
            self._prepare()
            found = graph.cycle_through(rec)
            if found is None:
                return
            wait, cycle = found
            assert isinstance(wait, _Guarded)
            graph.remove(wait)
            wait.error = DeadlockError(_message(cycle))
            if wait.scope is not None:
                wait.scope.cancel(reason="wait-for cycle")

    def _sync_active(self) -> None:
        """Keep the hooks on exactly while a checked wait is registered."""
        active = bool(self._graph)
        if active is not self.active:
            self.active = active
            self._registry.watch_permits(self.edges_added if active else None)

    # -- edges ----------------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Compute the permit edges the next search sees."""
        self._holders = None
        total = self._registry.permits_exhausted()
        if total is None:
            return
        holders = [
            (rec, _PERMIT)
            for rec, waits in self._graph.waits.items()
            if rec.in_attempt and any(self._wait_edges(w) for w in waits)
        ]
        if len(holders) >= total:
            self._holders = holders
            self._permit_waiters = {id(rec) for rec in self._registry.permit_waiters()}

    def _state_edges(self, rec: TaskRecord) -> list[Edge[TaskRecord]]:
        slots = self.slots
        if slots is not None:
            edge = slots.slot_edge(rec)
            if edge is not None:
                return [edge]
        holders = self._holders
        if holders is not None and id(rec) in self._permit_waiters and not rec.stop_requested:
            return holders
        return []

    def _wait_edges(self, wait: Wait[TaskRecord]) -> list[Edge[TaskRecord]]:
        if wait.caller.stop_requested:
            return []  # its waits end by its grace deadline at the latest
        return self._edges(wait)

    def _edges(self, wait: Wait[TaskRecord]) -> list[Edge[TaskRecord]]:
        """``wait``'s edges, whether or not its caller is stopping."""
        kind = wait.kind
        if kind is _Kind.SLOT:
            assert isinstance(wait.target, str)
            owner = None if self.slots is None else self.slots.slot_owner(wait.target)
            return [] if owner is None else [(owner, f"waits for slot {wait.target!r}, owned by")]
        target = wait.target
        assert isinstance(target, TaskRecord)
        if target.done or (target.stop_requested and target is not wait.caller):
            return []  # it ends by its own grace deadline at the latest
        if kind is _Kind.PLACEMENT and target.placement is not None:
            return []
        assert isinstance(kind, _Kind)
        return [(target, kind.value)]


def _message(cycle: list[Step[TaskRecord]], *, stopping: bool = False) -> str:
    """``DeadlockError``'s message: every task on the cycle from the caller, in order.

    ``stopping``: the caller has been asked to stop, which cannot reach the wait.
    """

    def task(rec: TaskRecord) -> str:
        return f"{rec.name!r} ({rec.id})"

    count = len(cycle)
    parts = [
        f"{'task ' + task(rec) if i == 0 else 'which'} {label} {task(cycle[(i + 1) % count][0])}"
        for i, (rec, label) in enumerate(cycle)
    ]
    message = "wait-for cycle: " + ", ".join(parts)
    if stopping:
        message += (
            f"; {task(cycle[0][0])} has been asked to stop, which cannot reach this wait "
            "(a shielded scope, a defer_cancel() block), and the wait ends only once the "
            "task has"
        )
    return message
