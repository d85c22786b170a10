"""``TaskWaiter``: the handle to one piece of work's final outcome.

Every piece of accepted work ends with exactly one ``TaskOutcome``; its waiter resolves
once, and never depends on events. The registry's ``TaskRecord`` *is* the waiter of
registered work (one object per task); joiners, which never register, are plain waiters.

Decisions the design leaves open:

* ``wait()`` creates its ``trio.Event`` lazily, so a waiter nobody awaits costs no event.
"""

from __future__ import annotations

from typing import Protocol

import trio

from ._outcome import TaskId, TaskOutcome


class WaitGuard(Protocol):
    """Checks a wait before it parks (the controller: deadlocks behind one's own slot)."""

    async def check_wait(self, waiter: TaskWaiter, /) -> None:
        """Raise ``DeadlockError`` if the calling attempt would wait forever."""


class TaskWaiter:
    """The handle to one task's final outcome.

    Dropping a waiter never affects the task.
    """

    __slots__ = ("_event", "_followers", "_guard", "_outcome", "id", "name")

    def __init__(self, id: TaskId, name: str) -> None:
        self.id = id
        self.name = name
        self._outcome: TaskOutcome | None = None
        self._event: trio.Event | None = None
        self._followers: list[TaskWaiter] | None = None
        # Set for controller work: raises DeadlockError when waiting would never end.
        self._guard: WaitGuard | None = None

    def __repr__(self) -> str:
        state = self._outcome.kind.value if self._outcome else "pending"
        return f"<TaskWaiter {self.id} {self.name!r} {state}>"

    async def wait(self) -> TaskOutcome:
        """Wait for the task's final outcome and return it.

        Always a checkpoint, even when the outcome is already known. Raises
        ``DeadlockError`` when called from a task that owns a slot, on work queued or
        held behind that same slot (or joined to such work or to the caller).
        """
        if self._outcome is None:
            if self._guard is not None:
                await self._guard.check_wait(self)
            # The check may have waited for the controller to take the work in, and
            # taking it in may have resolved it (rejected at intake): then do not wait.
            if self._outcome is None:
                if self._event is None:
                    self._event = trio.Event()
                await self._event.wait()
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
