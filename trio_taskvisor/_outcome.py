"""Identity and final results: ``TaskId``, ``TaskOutcome`` and ``TaskWaiter``.

Every piece of accepted work ends with exactly one ``TaskOutcome``; its ``TaskWaiter``
resolves once, and never depends on events.

Decisions the design leaves open:

* ``TaskId`` values come from one process-wide counter, so ids are unique across
  supervisors too.
* ``TaskWaiter.wait()`` creates its ``trio.Event`` lazily, so a waiter nobody awaits
  costs no event.
"""

from __future__ import annotations

import enum
import itertools
from typing import Any, Final, Protocol

import attrs
import trio

from ._exceptions import OutcomeError


class TaskId(int):
    """A process-local task identity: from 1, strictly increasing, never reused."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"#{int(self)}"

    def __repr__(self) -> str:
        return f"TaskId({int(self)})"


_next_id: Final = itertools.count(1).__next__


def allocate_id() -> TaskId:
    """Allocate the next ``TaskId``."""
    return TaskId(_next_id())


class OutcomeKind(enum.Enum):
    """How a task ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    FATAL = "fatal"
    CANCELLED = "cancelled"
    FORCE_ABORTED = "force_aborted"
    PANICKED = "panicked"
    REJECTED = "rejected"
    LEASE_LOST = "lease_lost"


class RejectionKind(enum.Enum):
    """Why work was rejected before its body ran."""

    ALREADY_EXISTS = "already_exists"
    BATCH_REJECTED = "batch_rejected"
    SLOT_BUSY = "slot_busy"
    QUEUE_FULL = "queue_full"
    SUPERSEDED = "superseded"
    REMOVED_FROM_QUEUE = "removed_from_queue"
    SHUTTING_DOWN = "shutting_down"
    RESOURCE_LIMIT = "resource_limit"
    STORE_UNAVAILABLE = "store_unavailable"


_REJECTION_REASONS: Final = {
    RejectionKind.ALREADY_EXISTS: "task name already in use",
    RejectionKind.BATCH_REJECTED: "batch rejected as a whole",
    RejectionKind.SLOT_BUSY: "slot is busy",
    RejectionKind.QUEUE_FULL: "slot queue is full",
    RejectionKind.SUPERSEDED: "superseded by a newer submission",
    RejectionKind.REMOVED_FROM_QUEUE: "removed from the queue",
    RejectionKind.SHUTTING_DOWN: "supervisor is shutting down",
    RejectionKind.RESOURCE_LIMIT: "resource limit reached",
    RejectionKind.STORE_UNAVAILABLE: "slot store is unavailable",
}

FORCE_ABORTED_REASON: Final = "force-aborted: did not stop within the grace window"


@attrs.frozen
class TaskOutcome:
    """The final result of one task.

    ``value`` is set for ``COMPLETED``; ``error`` for ``FAILED`` and ``FATAL``;
    ``rejection`` for ``REJECTED``.
    """

    kind: OutcomeKind
    value: object = None
    error: BaseException | None = None
    reason: str | None = None
    exit_code: int | None = None
    rejection: RejectionKind | None = None

    @property
    def is_success(self) -> bool:
        """Whether the task completed."""
        return self.kind is OutcomeKind.COMPLETED

    def unwrap(self) -> Any:
        """Return ``value``, or raise ``OutcomeError(self)`` chained to ``error``."""
        if self.kind is OutcomeKind.COMPLETED:
            return self.value
        raise OutcomeError(self) from self.error


def rejected_outcome(rejection: RejectionKind) -> TaskOutcome:
    """The outcome of work rejected before its body ran."""
    return TaskOutcome(
        OutcomeKind.REJECTED, reason=_REJECTION_REASONS[rejection], rejection=rejection
    )


COMPLETED_NONE: Final = TaskOutcome(OutcomeKind.COMPLETED)
CANCELLED: Final = TaskOutcome(OutcomeKind.CANCELLED)
FORCE_ABORTED: Final = TaskOutcome(OutcomeKind.FORCE_ABORTED, reason=FORCE_ABORTED_REASON)


class _DeadlockGuard(Protocol):
    async def check_deadlock(self, waiter: TaskWaiter, /) -> None: ...


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
        self._guard: _DeadlockGuard | None = None

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
                await self._guard.check_deadlock(self)
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
