"""Identity and results: ``TaskId``, ``OutcomeKind``, ``RejectionKind``, ``TaskOutcome``,
``Placement``.

Plain values with no trio import: the pure slot machine uses the rejection kinds
directly. ``OutcomeError`` (what ``TaskOutcome.unwrap()`` raises) lives here too, next to
the value it carries; ``_exceptions`` draws it in the error tree and re-exports it.

Decisions the design leaves open:

* ``TaskId`` values come from one process-wide counter, so ids are unique across
  supervisors too.
* ``Placement`` is a ``StrEnum`` (a ``str`` enum with lower-case
  values), as ``EventKind`` is: ``Placement.OWNER == "owner"``.
* ``TaskOutcome[T]`` is generic in the task's return type: ``value`` is ``T | None``
  (``None`` unless ``COMPLETED``), ``unwrap()`` returns ``T``. The shared outcomes that
  carry no value (rejections, ``CANCELLED``, ...) are ``TaskOutcome[Any]``.
* ``FORCE_ABORTED``'s fixed reason names why the task was forced: the grace ran out
  ("did not stop within the grace window"), or a signal during the shutdown forced every
  task at once ("forced at once by a signal during the shutdown"). Before, the second
  read as the first, although its grace had not run out. The reason says why, not what:
  the kind names the outcome (``force_aborted``), as every outcome's does, so a line
  that shows both reads "force_aborted - did not stop ...", never a second spelling.
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
    """The last attempt returned and no repeat followed; ``value`` is its return value."""
    FAILED = "failed"
    """A retryable failure or timeout was not retried: by the restart policy or a limit.

    ``error`` is the last error; ``reason`` names the limit when one was hit.
    """
    FATAL = "fatal"
    """An attempt raised ``FatalError`` (or an exception outside ``retry_on``); ``error`` is set."""
    CANCELLED = "cancelled"
    """A stop ended the task within grace, or an attempt raised ``TaskCancelled``."""
    FORCE_ABORTED = "force_aborted"
    """A stop was forced when grace ran out; the body may still be running."""
    PANICKED = "panicked"
    """An internal fault of the supervisor's runner ended the task, never the task's own."""
    REJECTED = "rejected"
    """The body never ran; ``rejection`` says why."""
    LEASE_LOST = "lease_lost"
    """The slot's cluster lease was lost and the owner forced at once, without grace.

    ``reason`` starts with ``"lease refused"`` or ``"lease expired"``; a joiner whose remote
    work vanished gets it with ``"followed work lost: <instance_id>"``.
    """


class RejectionKind(enum.Enum):
    """Why work was rejected before its body ran."""

    ALREADY_EXISTS = "already_exists"
    """The name is taken by a registered, a stopping, or a forced but still running task."""
    BATCH_REJECTED = "batch_rejected"
    """Rejected with the rest of an ``add_batch`` that had a name conflict."""
    SLOT_BUSY = "slot_busy"
    """A ``DROP_IF_RUNNING`` submission found its slot busy."""
    QUEUE_FULL = "queue_full"
    """The slot's queue was at ``max_slot_queue`` and the submission did not wait."""
    SUPERSEDED = "superseded"
    """A newer ``REPLACE`` displaced this work from the head of the slot's queue."""
    REMOVED_FROM_QUEUE = "removed_from_queue"
    """Queued or held work, or a joiner, removed by id or by ``cancel_slot``."""
    SHUTTING_DOWN = "shutting_down"
    """Shutdown began before the work was admitted, or while it was queued or held."""
    RESOURCE_LIMIT = "resource_limit"
    """A limit was full: ``max_registered_tasks``, or the controller's ``max_total_pending``,
    ``max_slots`` or ``max_waiters``.
    """
    STORE_UNAVAILABLE = "store_unavailable"
    """Cluster work found the slot store unreachable and did not wait."""
    QUEUE_TIMEOUT = "queue_timeout"
    """The work's ``queue_timeout`` passed while it was still queued or held."""


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
    """Started on an idle slot (any policy), or registered by ``add``."""
    QUEUED = "queued"
    """Queued in a busy slot (QUEUE, REPLACE); it stays so if it later starts or is withdrawn."""
    JOINED = "joined"
    """A JOIN following the last work of a busy slot."""
    REJECTED = "rejected"
    """Rejected at intake or while held."""


class OutcomeError(Exception):
    """``TaskOutcome.unwrap()`` of an outcome that is not a success."""

    def __init__(self, outcome: TaskOutcome[Any]) -> None:
        detail = f": {outcome.reason}" if outcome.reason else ""
        super().__init__(f"task ended {outcome.kind.value}{detail}")
        self.outcome = outcome
        """The outcome that was not a success."""

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy (see ``_exceptions``)
        return type(self), (self.outcome,), self.__dict__


@attrs.frozen
class TaskOutcome(Generic[T_co]):
    """The final result of one task; generic in the task's return type ``T``.

    ``value`` is set for ``COMPLETED``; ``error`` for ``FAILED`` and ``FATAL``;
    ``rejection`` for ``REJECTED``.
    """

    kind: OutcomeKind
    """How the task ended."""
    value: T_co | None = None
    """The last successful attempt's return value, for ``COMPLETED``; else ``None``."""
    error: BaseException | None = None
    """The final exception, for ``FAILED`` and ``FATAL``; else ``None``."""
    reason: str | None = None
    """Why the task ended, in words; ``None`` for ``COMPLETED`` and ``CANCELLED``."""
    exit_code: int | None = None
    """The ``exit_code`` of the final error (``FatalError``, ``TaskFailure``), or ``None``."""
    rejection: RejectionKind | None = None
    """Why the work was rejected, for ``REJECTED``; else ``None``."""

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


def rejected_outcome(rejection: RejectionKind, reason: str | None = None) -> TaskOutcome[Any]:
    """The outcome of work rejected before its body ran (one shared value per kind, but
    for a ``reason`` of its own)."""
    if reason is None:
        return _REJECTED[rejection]
    return TaskOutcome(OutcomeKind.REJECTED, reason=reason, rejection=rejection)


COMPLETED_NONE: Final[TaskOutcome[Any]] = TaskOutcome(OutcomeKind.COMPLETED)
CANCELLED: Final[TaskOutcome[Any]] = TaskOutcome(OutcomeKind.CANCELLED)
FORCE_ABORTED: Final[TaskOutcome[Any]] = TaskOutcome(
    OutcomeKind.FORCE_ABORTED, reason="did not stop within the grace window"
)
FORCED_AT_ONCE: Final[TaskOutcome[Any]] = TaskOutcome(
    OutcomeKind.FORCE_ABORTED,
    reason="forced at once by a signal during the shutdown",
)
PANICKED: Final[TaskOutcome[Any]] = TaskOutcome(
    OutcomeKind.PANICKED, reason="the supervisor's runner was cancelled"
)
