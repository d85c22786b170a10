"""Typed lifecycle events: ``TaskEvent``, ``EventKind`` and ``BackoffSource``.

Events are best-effort observability. Reliable results come from ``TaskWaiter``,
never from events.

Decisions the design leaves open:

* ``FORCED_TASK_EXITED`` is the one event of a task after its
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
    """The registry took in a task to admit, from ``add``, ``add_batch`` or the controller."""
    TASK_ADDED = "task_added"
    """The task is registered; published before its body can start."""
    TASK_ADD_FAILED = "task_add_failed"
    """The registry rejected the task (``outcome`` ``REJECTED``, ``rejection``, ``reason``)."""
    ATTEMPT_STARTING = "attempt_starting"
    """An attempt starts, its concurrency permit acquired; carries ``attempt`` and ``timeout``."""
    ATTEMPT_SUCCEEDED = "attempt_succeeded"
    """An attempt returned; carries ``attempt`` and ``duration``."""
    ATTEMPT_FAILED = "attempt_failed"
    """An attempt raised an exception, ``FatalError`` included.

    ``reason`` is ``str(error)``; carries ``attempt``, ``duration`` and the error's ``exit_code``.
    """
    ATTEMPT_TIMED_OUT = "attempt_timed_out"
    """An attempt ran past its configured ``timeout``; carries ``timeout`` and ``duration``."""
    ATTEMPT_CANCELLED = "attempt_cancelled"
    """A stop cancelled an attempt, or it raised ``TaskCancelled``; carries ``duration``."""
    BACKOFF_SCHEDULED = "backoff_scheduled"
    """The task waits ``delay`` seconds before its next attempt.

    After a failure (``backoff_source=FAILURE``, ``reason`` = ``str(error)``), or after a
    success under ``RestartPolicy.always(interval)`` (``SUCCESS``).
    """
    TASK_REMOVE_REQUESTED = "task_remove_requested"
    """A stop was requested (remove, cancel, replace, shutdown), or queued work withdrawn."""
    TASK_FINISHED = "task_finished"
    """The task's outcome is committed; carries ``outcome``, ``reason`` and ``exit_code``.

    Once per registered task; rejected work never gets it.
    """
    TASK_REMOVED = "task_removed"
    """The task left the registry, after ``TASK_FINISHED``; only ``FORCED_TASK_EXITED`` follows."""
    SHUTDOWN_REQUESTED = "shutdown_requested"
    """Shutdown began: a call, a signal, or leaving the ``open_supervisor`` block.

    Not published when ``run()`` ends by natural completion.
    """
    ALL_STOPPED_WITHIN_GRACE = "all_stopped_within_grace"
    """Shutdown: every task stopped within grace."""
    GRACE_EXCEEDED = "grace_exceeded"
    """Shutdown had to force tasks that did not stop within grace; ``reason`` names them."""
    CONTROLLER_SUBMITTED = "controller_submitted"
    """Submitted work was held, placed in admission or a queue, or joined; ``reason`` says how."""
    CONTROLLER_REJECTED = "controller_rejected"
    """The controller rejected or withdrew work; carries ``outcome`` (``REJECTED``),
    ``rejection`` and ``reason``."""
    CONTROLLER_SLOT_TRANSITION = "controller_slot_transition"
    """A slot's status changed; ``reason`` says how.

    One of ``"admitting->running"``, ``"running->terminating"``, ``"admitting->terminating"``.
    """
    SUBSCRIBER_OVERFLOW = "subscriber_overflow"
    """A subscriber (``name``) caught up after losing ``dropped`` events; delivered to it only."""
    SUBSCRIBER_FAILED = "subscriber_failed"
    """A subscriber's ``on_event`` raised; ``name`` is its name, ``reason`` has ``str(exc)``."""
    CONTROLLER_LEASE_ACQUIRED = "controller_lease_acquired"
    """This process took a slot's cluster lease for its owner; carries ``fence_token``."""
    CONTROLLER_LEASE_LOST = "controller_lease_lost"
    """A local owner's cluster lease was lost (``reason``); the owner is forced at once."""
    CONTROLLER_REMOTE_STOP = "controller_remote_stop"
    """A REPLACE from another process stopped a local owner; ``reason`` names the requester."""
    CONTROLLER_STORE_UNAVAILABLE = "controller_store_unavailable"
    """The slot store stopped answering; once per outage."""
    CONTROLLER_STORE_RECOVERED = "controller_store_recovered"
    """The slot store answers again, leases renewed and subscriptions re-opened."""
    FORCED_TASK_EXITED = "forced_task_exited"
    """A force-aborted task's work physically exited, after its ``TASK_REMOVED``.

    ``duration`` is the seconds from the force to the exit.
    """
    LIMIT_WAITING = "limit_waiting"
    """An attempt starts to wait for limit pools without room; ``reason`` names them.

    Published only when a limit pool, not only the ``max_concurrent`` permit, is full.
    """
    LIMIT_ACQUIRED = "limit_acquired"
    """An attempt that waited for limit pools got its units; ``reason`` names its pools.

    Published after a ``LIMIT_WAITING``: an attempt whose wait began while no subscriber
    was there publishes neither.
    """


class BackoffSource(enum.Enum):
    """Why a ``BACKOFF_SCHEDULED`` delay was scheduled."""

    SUCCESS = "success"
    """The wait of a periodic (``always``) task before its next run, after a success."""
    FAILURE = "failure"
    """The backoff before a retry, after a failure or a timeout."""


@attrs.frozen(weakref_slot=False)
class TaskEvent:
    """One lifecycle event.

    ``seq`` counts from 1 per supervisor in publication order; ``time`` is
    ``trio.current_time()`` and ``wall_time`` is ``time.time()`` at publication.
    """

    seq: int
    """The sequence number: from 1 per supervisor, in publication order."""
    time: float
    """When it was published, on trio's clock (``trio.current_time()``)."""
    wall_time: float
    """When it was published, as ``time.time()``."""
    kind: EventKind
    """What happened; it says which of the other fields are set."""
    task_id: TaskId | None = None
    """The task concerned, or ``None`` for supervisor-wide events."""
    name: str | None = None
    """The task's name, or the subscriber's for ``SUBSCRIBER_*`` events; else ``None``."""
    slot: str | None = None
    """The controller slot, or ``None`` for work added with ``add``."""
    attempt: int | None = None
    """The attempt number, on attempt, backoff and ``TASK_FINISHED`` events."""
    reason: str | None = None
    """What happened, in words, where the kind has any; else ``None``."""
    outcome: OutcomeKind | None = None
    """The outcome's kind, on ``TASK_FINISHED``, ``TASK_ADD_FAILED`` and
    ``CONTROLLER_REJECTED``."""
    rejection: RejectionKind | None = None
    """Why work was rejected, on ``TASK_ADD_FAILED`` and ``CONTROLLER_REJECTED``."""
    delay: float | None = None
    """Seconds until the next attempt, on ``BACKOFF_SCHEDULED``."""
    timeout: float | None = None
    """The attempt timeout in seconds, on ``ATTEMPT_STARTING`` and ``ATTEMPT_TIMED_OUT``."""
    duration: float | None = None
    """Seconds the attempt ran, on its end event; from force to exit, on ``FORCED_TASK_EXITED``."""
    exit_code: int | None = None
    """The error's exit code, on failed attempts, their backoff and ``TASK_FINISHED``."""
    backoff_source: BackoffSource | None = None
    """Why the ``BACKOFF_SCHEDULED`` wait was scheduled."""
    dropped: int | None = None
    """How many events the subscriber lost, on ``SUBSCRIBER_OVERFLOW``."""
    fence_token: int | None = None
    """The slot lease's fence token, on lease events and on the events of work holding one."""


new_event: Final[Callable[..., TaskEvent]] = trusted_constructor(TaskEvent)
"""Build a ``TaskEvent`` from trusted fields, positionally in declaration order."""
