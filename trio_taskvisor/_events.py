"""Typed lifecycle events: ``TaskEvent``, ``EventKind`` and ``BackoffSource``.

Events are best-effort observability. Reliable results come from ``TaskWaiter``,
never from events.

Decisions the design leaves open:

* ``FORCED_TASK_EXITED`` (DESIGN section 12) is the one event of a task after its
  ``TASK_REMOVED``: a force-aborted task's physical exit, ``duration`` seconds after the
  force.
* ``TaskEvent`` supports no weak references: the bus builds events with
  ``new_event`` (fields in declaration order, no checks), which skips attrs' frozen
  ``__init__`` and needs a layout without a weak-reference slot (``_frozen``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final

import attrs

from ._frozen import trusted_constructor
from ._outcome import OutcomeKind, RejectionKind, TaskId


class EventKind(enum.StrEnum):
    """What happened; the values are the snake_case names."""

    TASK_ADD_REQUESTED = "task_add_requested"
    TASK_ADDED = "task_added"
    TASK_ADD_FAILED = "task_add_failed"
    ATTEMPT_STARTING = "attempt_starting"
    ATTEMPT_SUCCEEDED = "attempt_succeeded"
    ATTEMPT_FAILED = "attempt_failed"
    ATTEMPT_TIMED_OUT = "attempt_timed_out"
    ATTEMPT_CANCELLED = "attempt_cancelled"
    BACKOFF_SCHEDULED = "backoff_scheduled"
    TASK_REMOVE_REQUESTED = "task_remove_requested"
    TASK_FINISHED = "task_finished"
    TASK_REMOVED = "task_removed"
    SHUTDOWN_REQUESTED = "shutdown_requested"
    ALL_STOPPED_WITHIN_GRACE = "all_stopped_within_grace"
    GRACE_EXCEEDED = "grace_exceeded"
    CONTROLLER_SUBMITTED = "controller_submitted"
    CONTROLLER_REJECTED = "controller_rejected"
    CONTROLLER_SLOT_TRANSITION = "controller_slot_transition"
    SUBSCRIBER_OVERFLOW = "subscriber_overflow"
    SUBSCRIBER_FAILED = "subscriber_failed"
    CONTROLLER_LEASE_ACQUIRED = "controller_lease_acquired"
    CONTROLLER_LEASE_LOST = "controller_lease_lost"
    CONTROLLER_REMOTE_STOP = "controller_remote_stop"
    CONTROLLER_STORE_UNAVAILABLE = "controller_store_unavailable"
    CONTROLLER_STORE_RECOVERED = "controller_store_recovered"
    FORCED_TASK_EXITED = "forced_task_exited"


class BackoffSource(enum.Enum):
    """Why a ``BACKOFF_SCHEDULED`` delay was scheduled."""

    SUCCESS = "success"
    FAILURE = "failure"


@attrs.frozen(weakref_slot=False)
class TaskEvent:
    """One lifecycle event.

    ``seq`` counts from 1 per supervisor in publication order; ``time`` is
    ``trio.current_time()`` and ``wall_time`` is ``time.time()`` at publication.
    """

    seq: int
    time: float
    wall_time: float
    kind: EventKind
    task_id: TaskId | None = None
    name: str | None = None
    slot: str | None = None
    attempt: int | None = None
    reason: str | None = None
    outcome: OutcomeKind | None = None
    rejection: RejectionKind | None = None
    delay: float | None = None
    timeout: float | None = None
    duration: float | None = None
    exit_code: int | None = None
    backoff_source: BackoffSource | None = None
    dropped: int | None = None
    fence_token: int | None = None


new_event: Final[Callable[..., TaskEvent]] = trusted_constructor(TaskEvent)
"""Build a ``TaskEvent`` from trusted fields, positionally in declaration order."""
