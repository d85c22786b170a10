"""``TaskRecord``: one registered task's state, shared by its actor and the registry.

The record *is* the task's ``TaskWaiter`` (one object per task): ``add`` and ``submit``
return it. It is mutated only by code of its supervisor, between two checkpoints, so
every change is atomic. The waiter's own state (outcome, placement, followers,
readiness) is written only by the record's methods (``resolve``, ``follow``, ``place``,
``expect_readiness``), which the loops call; they never touch the waiter's private
members.

Lower layers call upward only through the small protocol declared here:
``RecordListener``, which the controller implements for the records of its work. A
record refers to nothing above it: ``supervisor`` is the public ``Supervisor`` as an opaque
object, for ``TaskContext.supervisor`` alone.

Once the actor has exited, ``release()`` drops what the record held for running the
task (function, arguments, context, scopes, the listener and supervisor), so a waiter kept
by a user keeps none of it alive.
"""

from __future__ import annotations

import contextvars
import enum
import math
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from ._outcome import Placement, TaskId, TaskOutcome
from ._waiter import Readiness, TaskWaiter, WaitGuard

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from trio_util import AsyncBool

    from ._spec import ResolvedSpec, TaskFn


class TaskState(enum.Enum):
    """Where a registered task is in its life."""

    WAITING = "waiting"
    """Registered, before an attempt: waiting for a ``max_concurrent`` permit, if any."""
    RUNNING = "running"
    """An attempt is in progress."""
    BACKOFF = "backoff"
    """Between attempts: waiting out a backoff delay, or a periodic task's interval."""
    STOPPING = "stopping"
    """A stop was requested and the task has not ended yet; it keeps this state."""


class RecordListener(Protocol):
    """What the controller learns of the records of its submissions."""

    def admission_decided(self, rec: TaskRecord, accepted: bool, /) -> None:
        """The registry's loop decided on an admission queued behind its commands.

        Called in the registry loop's task: it must not call back into the registry
        (the controller hands the decision to its own loop). A rejected record is left
        for its listener to ``release()`` once it has handled the decision.
        """

    def lease_lost(self, rec: TaskRecord, /) -> str | None:
        """Why the record's cluster lease counts as lost now (``None``: it is held).

        Asked by the registry for a record with a fence token just before it commits
        the outcome of the actor's exit, so a body that returns in the instant its lease
        is lost ends ``LEASE_LOST`` whichever task trio ran first; and when the record's
        limit units are lost, so that a slot lease lost with them names the cause.
        """

    def owner_forced(self, rec: TaskRecord, /) -> None:
        """The record's outcome is committed by a force; its actor may run on.

        Called by the registry, in whichever task forced it.
        """

    def owner_exited(self, rec: TaskRecord, /) -> None:
        """The record's actor physically exited and its outcome is committed.

        Called by the actor, after the registry is done with the record.
        """


# The running attempt's record: ``current_context()`` wraps it on first use.
current_task_context: Final = contextvars.ContextVar["TaskRecord"]("trio_taskvisor_context")


class _Extras:
    """What few records need: created on first use."""

    __slots__ = (
        "cancel_flag",
        "defer_scopes",
        "failing_since",
        "failure_logged",
        "streak",
        "task_context",
    )

    def __init__(self) -> None:
        self.cancel_flag: AsyncBool | None = None
        self.defer_scopes: set[trio.CancelScope] | None = None
        self.task_context: object = None  # the TaskContext, built by _context
        self.streak: object = None  # the actor's failure-streak state (streak rules)
        # ``log_failures``: when the current failure streak began, and when it was last
        # logged (the actor's repeated WARNING lines).
        self.failing_since = 0.0
        self.failure_logged = 0.0


class TaskRecord(TaskWaiter[Any]):
    """The registry's and the actor's shared state for one task; also its waiter."""

    __slots__ = (
        "_extras",
        "args",
        "attempt",
        "committed",
        "context",
        "entry",
        "fence_token",
        "fn",
        "force_deadline",
        "forced",
        "hard_deadline",
        "in_attempt",
        "listener",
        "policy",
        "reserved",
        "slot",
        "state",
        "stop_requested",
        "stop_scope",
        "supervisor",
    )

    def __init__(
        self,
        id: TaskId,
        name: str,
        fn: TaskFn,
        args: tuple[Any, ...],
        policy: ResolvedSpec,
        supervisor: object,
        guard: WaitGuard | None,
        slot: str | None = None,
    ) -> None:
        # Not super(): its lookup cost 0.7% of a task's instructions (benchmark row 1a).
        TaskWaiter.__init__(self, id, name)  # pyright: ignore[reportUnknownMemberType]
        self._guard = guard  # checks waits made inside attempts (DeadlockError)
        self.fn: TaskFn | None = fn
        self.args = args
        self.policy = policy
        self.supervisor = supervisor
        self.slot = slot
        # The submitter's context variables; each attempt runs in a copy.
        self.context: contextvars.Context | None = contextvars.copy_context()
        self.state = TaskState.WAITING
        self.attempt = 0
        self.stop_requested = False
        self.forced = False
        self.committed = False
        self.in_attempt = False
        self.reserved = True  # its name is reserved while the actor lives (not keyed calls)
        self.stop_scope: trio.CancelScope | None = None  # the actor's, from its start
        self.hard_deadline = math.inf
        # The stop's force deadline; once forced, the time of the force (FORCED_TASK_EXITED).
        self.force_deadline = math.inf
        # Controller work: whom to tell, and the slot machine's entry (opaque here).
        self.listener: RecordListener | None = None
        self.entry: object = None
        self.fence_token: int | None = None  # the lease's, for cluster slots
        self._extras: _Extras | None = None

    def __dir__(self) -> list[str]:
        # The public waiter shows its public names only: the record's internals stay on
        # this one object (a second object per task would cost memory, benchmark row 7,
        # and instructions, row 1a), reachable by the loops but out of dir() and
        # completion.
        return list(_WAITER_NAMES)

    # -- the waiter's state: written here only ----------------------------------------------

    def resolve(self, outcome: TaskOutcome[Any]) -> bool:
        """Set the outcome once, wake its waits and followers; whether this call set it."""
        if self._outcome is not None:
            return False
        self._outcome = outcome
        self._guard = None  # only pending waits check; a kept waiter must not pin the controller
        if self._event is not None:
            self._event.set()
        if self._readiness is not None:
            self._readiness.event.set()  # start() gives up: the task ended unready
        followers = self._followers
        if followers is not None:
            self._followers = None
            for follower in followers:
                follower.resolve(outcome)
        return True

    def follow(self, target: TaskRecord) -> None:
        """Resolve to ``target``'s outcome (a JOIN)."""
        outcome = target._outcome
        if outcome is not None:
            self.resolve(outcome)
        elif target._followers is None:
            target._followers = [self]
        else:
            target._followers.append(self)

    def place(self, placement: Placement) -> None:
        """Record the admission decision, once; later calls change nothing."""
        current = self._placement
        if current is None:
            self._placement = placement
        elif type(current) is trio.Event:
            self._placement = placement
            current.set()  # wakes wait_placed()

    def final_outcome(self) -> TaskOutcome[Any] | None:
        """The outcome once it is set; reading it does not observe it (``outcome_nowait``)."""
        return self._outcome

    def observed(self) -> bool:
        """Whether ``wait()`` or ``outcome_nowait()`` returned the outcome (the pytest
        plugin's unobserved-failure check)."""
        return self._observed

    def joiners(self) -> list[TaskRecord]:
        """The records following this one (JOINs) while its outcome is pending."""
        return [] if self._followers is None else list(self._followers)

    def call(self) -> Awaitable[Any]:
        """Call the function for one attempt: ``fn(*args)``, and for work started with
        ``start`` a fresh ``task_status`` (the actor's task)."""
        fn = self.fn
        assert fn is not None
        readiness = self._readiness
        if readiness is None:
            return fn(*self.args)
        return fn(*self.args, task_status=readiness.status())

    def expect_readiness(self) -> Readiness:
        """Give work started with ``start`` its readiness handshake (before admission)."""
        readiness = self._readiness = Readiness()
        return readiness

    async def wait_ready(self) -> bool:
        """Wait until readiness is reached or the outcome is final; whether it was reached.

        Inside a supervised attempt, raises ``DeadlockError`` when the wait closes a
        wait-for cycle, as ``wait()`` does: readiness needs the work to run.
        """
        readiness = self._readiness
        assert readiness is not None
        guard = self._guard
        caller = None if guard is None else guard.caller()
        if caller is None:
            await readiness.event.wait()
        else:
            assert guard is not None
            await guard.guarded_wait(caller, self, readiness.event, placement=False)
        return readiness.reached

    # -- the rest of the record --------------------------------------------------------------

    def extras(self) -> _Extras:
        """The rarely used state, created on first use."""
        if self._extras is None:
            self._extras = _Extras()
        return self._extras

    def cancel_flag(self) -> AsyncBool:
        """The observable stop request, created on first use."""
        extras = self.extras()
        if extras.cancel_flag is None:
            from trio_util import AsyncBool

            extras.cancel_flag = AsyncBool(self.stop_requested)
        return extras.cancel_flag

    def request_stop(self, reason: str) -> None:
        """Soft-stop: flag the request and cancel the stop scope."""
        self.stop_requested = True
        self.state = TaskState.STOPPING
        extras = self._extras
        if extras is not None and extras.cancel_flag is not None:
            extras.cancel_flag.value = True
        if self.stop_scope is not None:
            self.stop_scope.cancel(reason=reason)
        guard = self._guard
        if guard is not None and guard.active:
            guard.caller_stopping(self)  # its waits for itself end (DeadlockError)

    def force(self) -> None:
        """Unshield every deferred block so the pending stop reaches it."""
        self.forced = True
        if self._extras is not None:
            for scope in self._extras.defer_scopes or ():
                scope.shield = False

    def release(self) -> None:
        """The actor has exited: keep only what a waiter needs."""
        self.fn = None
        self.args = ()
        self.context = None
        self.supervisor = None
        self.listener = None
        self.entry = None
        self.stop_scope = None
        self._extras = None


# What ``dir()`` of a waiter lists: ``TaskWaiter``'s public names and dunders.
_WAITER_NAMES: Final = tuple(
    name for name in dir(TaskWaiter) if not name.startswith("_") or name.endswith("__")
)
