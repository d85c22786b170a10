"""Identity and results: ``TaskId``, ``OutcomeKind``, ``RejectionKind``, ``TaskOutcome``,
``Placement``.

Plain values with no trio import: the pure slot machine uses the rejection kinds
directly. ``OutcomeError`` (what ``TaskOutcome.unwrap()`` raises) lives here too, next to
the value it carries; ``_exceptions`` draws it in the error tree and re-exports it.

Decisions the design leaves open:

* ``TaskId`` values come from one process-wide counter, so ids are unique across
  supervisors too.
* ``Placement`` is a ``StrEnum`` (DESIGN section 11: a ``str`` enum with lower-case
  values), as ``EventKind`` is: ``Placement.OWNER == "owner"``.
* ``TaskOutcome[T]`` is generic in the task's return type: ``value`` is ``T | None``
  (``None`` unless ``COMPLETED``), ``unwrap()`` returns ``T``. The shared outcomes that
  carry no value (rejections, ``CANCELLED``, ...) are ``TaskOutcome[Any]``.
"""

from __future__ import annotations

import enum
import itertools
from typing import Any, Final, Generic, TypeVar, cast

import attrs

T_co = TypeVar("T_co", covariant=True)


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
    QUEUE_TIMEOUT = "queue_timeout"


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
    RejectionKind.QUEUE_TIMEOUT: "queue timeout passed before the work could start",
}


class Placement(enum.StrEnum):
    """Where the admission decision put a submission (``TaskWaiter.placement``).

    Set once, when the decision is made: ``OWNER`` (started on an idle slot, or added
    with ``add``), ``QUEUED`` (in a busy slot's queue: QUEUE, REPLACE), ``JOINED`` (a JOIN
    following a busy slot's last work), ``REJECTED`` (rejected at intake or while held).
    """

    OWNER = "owner"
    QUEUED = "queued"
    JOINED = "joined"
    REJECTED = "rejected"


FORCE_ABORTED_REASON: Final = "force-aborted: did not stop within the grace window"


class OutcomeError(Exception):
    """``TaskOutcome.unwrap()`` of an outcome that is not a success."""

    def __init__(self, outcome: TaskOutcome[Any]) -> None:
        detail = f": {outcome.reason}" if outcome.reason else ""
        super().__init__(f"task ended {outcome.kind.value}{detail}")
        self.outcome = outcome


@attrs.frozen
class TaskOutcome(Generic[T_co]):
    """The final result of one task; generic in the task's return type ``T``.

    ``value`` is set for ``COMPLETED``; ``error`` for ``FAILED`` and ``FATAL``;
    ``rejection`` for ``REJECTED``.
    """

    kind: OutcomeKind
    value: T_co | None = None
    error: BaseException | None = None
    reason: str | None = None
    exit_code: int | None = None
    rejection: RejectionKind | None = None

    @property
    def is_success(self) -> bool:
        """Whether the task completed."""
        return self.kind is OutcomeKind.COMPLETED

    def unwrap(self) -> T_co:
        """Return ``value``, or raise ``OutcomeError(self)`` chained to ``error``."""
        if self.kind is OutcomeKind.COMPLETED:
            return cast("T_co", self.value)
        raise OutcomeError(self) from self.error


_REJECTED: Final[dict[RejectionKind, TaskOutcome[Any]]] = {
    kind: TaskOutcome(OutcomeKind.REJECTED, reason=reason, rejection=kind)
    for kind, reason in _REJECTION_REASONS.items()
}


def rejected_outcome(rejection: RejectionKind) -> TaskOutcome[Any]:
    """The outcome of work rejected before its body ran (one shared value per kind)."""
    return _REJECTED[rejection]


COMPLETED_NONE: Final[TaskOutcome[Any]] = TaskOutcome(OutcomeKind.COMPLETED)
CANCELLED: Final[TaskOutcome[Any]] = TaskOutcome(OutcomeKind.CANCELLED)
FORCE_ABORTED: Final[TaskOutcome[Any]] = TaskOutcome(
    OutcomeKind.FORCE_ABORTED, reason=FORCE_ABORTED_REASON
)
PANICKED: Final[TaskOutcome[Any]] = TaskOutcome(
    OutcomeKind.PANICKED, reason="the supervisor's runner was cancelled"
)
