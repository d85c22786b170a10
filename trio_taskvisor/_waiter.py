"""``TaskWaiter``: the handle to one piece of work's final outcome, and its placement.

Every piece of accepted work ends with exactly one ``TaskOutcome``; its waiter resolves
once, and never depends on events. The registry's ``TaskRecord`` *is* the waiter of
registered work (one object per task); joiners, which never register, are plain waiters.

A waiter also learns, once, where the admission decision put its work (``placement``,
DESIGN section 11): set by the controller (or, for work added with ``add``, by the
registry) with ``_place``, before the outcome.

Decisions the design leaves open:

* ``wait()`` creates its ``trio.Event`` lazily, so a waiter nobody awaits costs no event;
  ``wait_placed()`` likewise keeps its event in the same slot as the placement until the
  placement is known.
"""

from __future__ import annotations

from typing import Protocol

import trio

from ._outcome import Placement, TaskId, TaskOutcome


class WaitGuard(Protocol):
    """Checks waits made inside attempts for wait-for cycles (``_waits``: ``DeadlockError``)."""

    def caller(self) -> object | None:
        """The attempt making the current call if its waits are checked, else ``None``."""

    async def guarded_wait(
        self, caller: object, waiter: TaskWaiter, event: trio.Event, /, *, placement: bool
    ) -> None:
        """Wait for ``event`` (``waiter``'s outcome, or its placement when ``placement``).

        Raises ``DeadlockError`` when the wait closes a wait-for cycle, at once or when
        a later edge closes it.
        """


class TaskWaiter:
    """The handle to one task's final outcome.

    Dropping a waiter never affects the task.
    """

    __slots__ = ("_event", "_followers", "_guard", "_outcome", "_placement", "id", "name")

    def __init__(self, id: TaskId, name: str) -> None:
        self.id = id
        self.name = name
        self._outcome: TaskOutcome | None = None
        self._event: trio.Event | None = None
        self._followers: list[TaskWaiter] | None = None
        # Set by the supervisor: checks waits made inside attempts (DeadlockError).
        self._guard: WaitGuard | None = None
        # The placement, or the event wait_placed() waits on until it is known.
        self._placement: Placement | trio.Event | None = None

    def __repr__(self) -> str:
        state = self._outcome.kind.value if self._outcome else "pending"
        return f"<TaskWaiter {self.id} {self.name!r} {state}>"

    async def wait(self) -> TaskOutcome:
        """Wait for the task's final outcome and return it.

        Always a checkpoint, even when the outcome is already known. Called inside a
        supervised attempt, raises ``DeadlockError`` when the awaited work cannot start
        or finish until the caller's own attempt ends (a wait-for cycle, DESIGN section
        11): at once, or when a later change closes the cycle.
        """
        if self._outcome is None:
            if self._event is None:
                self._event = trio.Event()
            guard = self._guard
            caller = None if guard is None else guard.caller()
            if caller is None:
                await self._event.wait()
            else:
                assert guard is not None
                await guard.guarded_wait(caller, self, self._event, placement=False)
        else:
            await trio.lowlevel.checkpoint()
        return self.outcome_nowait()

    def outcome_nowait(self) -> TaskOutcome:
        """Return the final outcome; raise ``trio.WouldBlock`` if not yet final."""
        if self._outcome is None:
            raise trio.WouldBlock
        return self._outcome

    def _resolve(self, outcome: TaskOutcome) -> bool:
        """Set the outcome once; return whether this call set it."""
        if self._outcome is not None:
            return False
        self._outcome = outcome
        self._guard = None  # only pending waits check; a kept waiter must not pin the controller
        if self._event is not None:
            self._event.set()
        if self._followers is not None:
            for follower in self._followers:
                follower._resolve(outcome)
            self._followers = None
        return True

    def _follow(self, target: TaskWaiter) -> None:
        """Resolve to ``target``'s outcome (a JOIN)."""
        if target._outcome is not None:
            self._resolve(target._outcome)
        elif target._followers is None:
            target._followers = [self]
        else:
            target._followers.append(self)

    # -- placement (DESIGN section 11) ---------------------------------------------------------

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
        caller's own attempt ends (work held behind the caller's slot, DESIGN section 11).
        """
        placement = self._placement
        if isinstance(placement, Placement):
            await trio.lowlevel.checkpoint()
            return placement
        if placement is None:
            placement = self._placement = trio.Event()
        guard = self._guard
        caller = None if guard is None else guard.caller()
        if caller is None:
            await placement.wait()
        else:
            assert guard is not None
            await guard.guarded_wait(caller, self, placement, placement=True)
        placed = self._placement
        assert isinstance(placed, Placement)
        return placed

    def _place(self, placement: Placement) -> None:
        """Record the admission decision, once; later calls change nothing."""
        current = self._placement
        if current is None:
            self._placement = placement
        elif isinstance(current, trio.Event):
            self._placement = placement
            current.set()
