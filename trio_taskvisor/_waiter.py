"""``TaskWaiter``: the handle to one piece of work's final outcome, and its placement.

Every piece of accepted work ends with exactly one ``TaskOutcome``; its waiter resolves
once, and never depends on events. The waiter's state is written by one class only: its
subclass ``TaskRecord`` (``_record``), the record every piece of work has (one object per
task), whose ``resolve``, ``follow`` and ``place`` the loops call. This module reads the
state for the public methods and writes nothing but the lazily created events and the
observed mark.

A waiter also learns, once, where the admission decision put its work (``placement``):
set by the controller (or, for work added with ``add``, by the registry) with
``TaskRecord.place``, before the outcome.

Decisions the design leaves open:

* ``wait()`` creates its ``trio.Event`` lazily, so a waiter nobody awaits costs no event;
  ``wait_placed()`` likewise keeps its event in the same slot as the placement until the
  placement is known.
* ``TaskWaiter[T]`` is generic (covariant, like ``TaskSpec`` and ``TaskOutcome``: they
  are read-only) in the task's return type; ``T`` is only a promise of the types, never
  checked at run time (for a JOIN, the caller's promise that the followed
  work returns the same type).
* Readiness (``Supervisor.start``) is state of the waiter: a
  ``Readiness`` exists only for work started with ``start`` / ``start_in_slot``, and
  each of its attempts gets a fresh ``AttemptStatus`` (trio's ``TaskStatus`` protocol).
  A second ``started()`` on one attempt's status raises ``RuntimeError`` in every
  attempt, as trio's does; the first ``started()`` of a later attempt, once readiness
  was reached, does nothing. A ``started()`` after the outcome is final (a forced task
  still running) does nothing either. A ``started()`` in a worker thread raises
  ``RuntimeError`` before it changes anything (trio's ``Event.set`` there would take
  the caller of ``start`` off the event, then fail to wake it).
* ``outcome_nowait()`` (which ``wait()`` ends with) marks the waiter observed: the pytest
  plugin's unobserved-failure check reads that mark.
"""

from __future__ import annotations

import contextvars
from threading import get_ident
from typing import Any, Generic, Protocol, TypeVar

import trio

from ._outcome import Placement, TaskId, TaskOutcome

T_co = TypeVar("T_co", covariant=True)


class WaitGuard(Protocol):
    """Checks waits made inside attempts for wait-for cycles (``_waits``: ``DeadlockError``)."""

    attempt_context: contextvars.ContextVar[Any]
    """Set (to its record) inside every attempt: ``caller()`` is ``None`` while unset.
    ``wait()`` reads it before calling ``caller()``: most waits are made outside attempts,
    and this spares them a call (benchmark row 1a awaits every waiter)."""

    thread: int
    """The ident of the supervisor's thread (its trio run's)."""

    active: bool
    """A checked wait is blocked: ``caller_stopping`` has work to do."""

    def caller_stopping(self, rec: Any, /) -> None:
        """``rec``'s stop was requested: its blocked waits that can end only once it has
        (a wait for itself) end with ``DeadlockError``, which a shielded wait gets."""

    def check_thread(self, call: str) -> None:
        """Raise ``RuntimeError`` for ``call`` (``"waiter.wait"``) in a thread other than
        the supervisor's: it would park a task of another trio run on its events."""

    def caller(self) -> object | None:
        """The attempt making the current call if its waits are checked, else ``None``."""

    async def guarded_wait(
        self, caller: object, waiter: TaskWaiter[Any], event: trio.Event, /, *, placement: bool
    ) -> None:
        """Wait for ``event`` (``waiter``'s outcome, or its placement when ``placement``).

        Raises ``DeadlockError`` when the wait closes a wait-for cycle, at once or when
        a later edge closes it.
        """


class Readiness:
    """The readiness handshake of work started with ``start`` (``task_status``)."""

    __slots__ = ("event", "reached", "thread", "value")

    def __init__(self) -> None:
        self.reached = False
        self.value: Any = None
        # Set by the first counting started(), or by the final outcome.
        self.event = trio.Event()
        self.thread = get_ident()  # the supervisor's trio run's

    def status(self) -> AttemptStatus:
        """A fresh status for one attempt."""
        return AttemptStatus(self)


class AttemptStatus:
    """The ``task_status`` one attempt of ``start``-ed work is called with.

    Follows trio's ``TaskStatus`` protocol: ``started(value=None)``.
    """

    __slots__ = ("_called", "_readiness")

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness
        self._called = False

    def __repr__(self) -> str:
        return f"<taskvisor task status {'called' if self._called else 'pending'}>"

    def started(self, value: Any = None) -> None:
        """Report readiness: ``Supervisor.start`` returns, ``started_value`` is ``value``.

        Only the first attempt that calls it counts. Raises ``RuntimeError`` when called
        twice in the same attempt, and in a thread other than the supervisor's (a worker
        thread goes through ``trio.from_thread.run_sync``), before it changes anything.
        """
        if get_ident() != self._readiness.thread:
            raise RuntimeError(
                "task_status.started() works only in the thread of the supervisor's trio "
                "run; from a worker thread, go through "
                "trio.from_thread.run_sync(task_status.started, value)"
            )
        if self._called:
            raise RuntimeError("called 'started' twice on the same task status")
        self._called = True
        readiness = self._readiness
        if not readiness.event.is_set():
            readiness.reached = True
            readiness.value = value
            readiness.event.set()


class TaskWaiter(Generic[T_co]):
    """The handle to one task's final outcome; generic in the task's return type.

    Dropping a waiter never affects the task.
    """

    __slots__ = (
        "_event",
        "_followers",
        "_guard",
        "_observed",
        "_outcome",
        "_placement",
        "_readiness",
        "id",
        "name",
    )

    def __init__(self, id: TaskId, name: str) -> None:
        self.id = id
        """The work's ``TaskId``, allocated at add or submit."""
        self.name = name
        """The task's name (an automatic one for a nameless task)."""
        self._outcome: TaskOutcome[T_co] | None = None
        self._event: trio.Event | None = None
        # The records of the joiners following this work (``TaskRecord.follow``).
        self._followers: list[Any] | None = None
        # Set by the supervisor: checks waits made inside attempts (DeadlockError).
        self._guard: WaitGuard | None = None
        # The placement, or the event wait_placed() waits on until it is known.
        self._placement: Placement | trio.Event | None = None
        self._readiness: Readiness | None = None  # work started with start()
        self._observed = False  # outcome_nowait() was called (the pytest plugin's check)

    def __repr__(self) -> str:
        state = self._outcome.kind.value if self._outcome else "pending"
        return f"<TaskWaiter {self.id} {self.name!r} {state}>"

    @property
    def done(self) -> bool:
        """Whether the outcome is committed: ``outcome_nowait()`` then returns it.

        Reading it does not count as observing the outcome (the pytest plugin's check).
        """
        return self._outcome is not None

    @property
    def started_value(self) -> Any:
        """The value the task passed to ``task_status.started()`` (``Supervisor.start``).

        ``None`` until then, and for work not started with ``start`` / ``start_in_slot``.
        """
        readiness = self._readiness
        return None if readiness is None else readiness.value

    async def wait(self) -> TaskOutcome[T_co]:
        """Wait for the task's final outcome and return it.

        Always a checkpoint, even when the outcome is already known. Called inside a
        supervised attempt, raises ``DeadlockError`` when the awaited work cannot start
        or finish until the caller's own attempt ends (a wait-for cycle): at once, or
        when a later change closes the cycle.
        """
        if self._outcome is None:
            guard = self._guard
            if guard is not None and get_ident() != guard.thread:
                guard.check_thread("waiter.wait")
            if self._event is None:
                self._event = trio.Event()
            if guard is None or guard.attempt_context.get(None) is None:
                caller = None
            else:
                caller = guard.caller()
            if caller is None:
                await self._event.wait()
            else:
                assert guard is not None
                await guard.guarded_wait(caller, self, self._event, placement=False)
        else:
            await trio.lowlevel.checkpoint()
        return self.outcome_nowait()

    def outcome_nowait(self) -> TaskOutcome[T_co]:
        """Return the final outcome; raise ``trio.WouldBlock`` if not yet final."""
        if self._outcome is None:
            raise trio.WouldBlock
        self._observed = True
        return self._outcome

    # -- placement ---------------------------------------------------------

    @property
    def placement(self) -> Placement | None:
        """Where the admission decision put the work; ``None`` before the decision.

        Set once and never changed: work that is queued and later starts stays
        ``QUEUED``; an owner that the registry then rejects stays ``OWNER``. Held
        (``wait=True``) work has none until it is placed or rejected.
        """
        placement = self._placement
        return placement if isinstance(placement, Placement) else None

    async def wait_placed(self) -> Placement:
        """Wait until the admission decision is made and return the placement.

        Always a checkpoint, even when the placement is known. Called inside a supervised
        attempt, raises ``DeadlockError`` when the decision cannot be made until the
        caller's own attempt ends (work held behind the caller's slot).
        """
        placement = self._placement
        if isinstance(placement, Placement):
            await trio.lowlevel.checkpoint()
            return placement
        guard = self._guard
        if guard is not None and get_ident() != guard.thread:
            guard.check_thread("waiter.wait_placed")
        if placement is None:
            placement = self._placement = trio.Event()
        caller = None if guard is None else guard.caller()
        if caller is None:
            await placement.wait()
        else:
            assert guard is not None
            await guard.guarded_wait(caller, self, placement, placement=True)
        placed = self._placement
        assert isinstance(placed, Placement)
        return placed
