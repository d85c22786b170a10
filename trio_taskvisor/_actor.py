"""One task's actor: its retry loop, and each attempt's cancel scopes.

Scope layout of one actor (outermost first)::

    stop_scope          cancelled by a stop request (soft stop)
      permit            max_concurrent, held only during an attempt
      timeout scope     the attempt's hard deadline
        fn(*args)       ctx.defer_cancel() blocks: shielded scopes with the same deadline

A soft stop cancels ``stop_scope``; deferred blocks keep running until the registry
forces the stop at the grace deadline by unshielding them. The timeout is hard: the
deferred blocks carry the attempt deadline themselves and unshield when it passes.

Decisions the design leaves open:

* Each attempt after the first runs in a fresh copy of the submitter's captured
  context: the actor swaps its trio task's ``context`` before the checkpoint that
  precedes the attempt (the backoff sleep), so nothing an attempt set leaks into the
  next one.
* An attempt that returns after its timeout passed (it swallowed the cancellation)
  still counts as timed out.
* A ``BaseException`` that is not a task failure (``KeyboardInterrupt``,
  ``SystemExit``) ends that task ``CANCELLED``; the supervisor then shuts down
  gracefully and re-raises it.
* An exception group is judged by what remains once trio's ``Cancelled`` is removed
  (``split_cancelled``): only ``Exception`` instances left make an ordinary failed attempt
  (``ATTEMPT_FAILED``; a stopped task still ends ``CANCELLED``); a non-``Exception``
  remainder is re-raised without its ``Cancelled``, so no ``Cancelled`` leaves the scope
  it belongs to.
"""

from __future__ import annotations

import contextvars
import enum
import math
import types
from typing import TYPE_CHECKING, Any

import trio

from ._context import TaskContext, current_task_context
from ._events import BackoffSource, EventKind
from ._exceptions import FatalError, TaskCancelled, split_cancelled
from ._outcome import (
    CANCELLED,
    COMPLETED_NONE,
    OutcomeKind,
    TaskId,
    TaskOutcome,
    TaskWaiter,
    allocate_id,
)
from ._spec import ResolvedSpec, TaskFn, TaskSpec

if TYPE_CHECKING:
    from trio_util import AsyncBool

    from ._controller import Controller
    from ._registry import Registry
    from ._supervisor import Supervisor

_PANICKED = TaskOutcome(OutcomeKind.PANICKED, reason="the supervisor's runner was cancelled")
_MIN_RESTART_GAP = 0.001


class TaskState(enum.Enum):
    """Where a registered task is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"


class TaskRecord:
    """The registry's and the actor's shared state for one task.

    Mutated only by code of the owning supervisor; every change between two
    checkpoints is atomic.
    """

    __slots__ = (
        "_flag",
        "_task_context",
        "args",
        "attempt",
        "committed",
        "context",
        "controller",
        "defer_scopes",
        "entry",
        "fn",
        "force_deadline",
        "forced",
        "hard_deadline",
        "id",
        "in_attempt",
        "name",
        "policy",
        "reserved",
        "slot",
        "state",
        "stop_requested",
        "stop_scope",
        "supervisor",
        "waiter",
    )

    def __init__(
        self,
        id: TaskId,
        name: str,
        fn: TaskFn,
        args: tuple[Any, ...],
        policy: ResolvedSpec,
        context: contextvars.Context,
        slot: str | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.fn = fn
        self.args = args
        self.policy = policy
        self.context: contextvars.Context | None = context
        self.slot = slot
        self.reserved = True  # its name is reserved while the actor lives (not keyed calls)
        self.waiter = TaskWaiter(id, name)
        self.state = TaskState.WAITING
        self.attempt = 0
        self.stop_requested = False
        self.forced = False
        self.committed = False
        self.in_attempt = False
        self.stop_scope = trio.CancelScope()
        self.hard_deadline = math.inf
        self.force_deadline = math.inf
        self.defer_scopes: set[trio.CancelScope] | None = None  # created on first use
        self._flag: AsyncBool | None = None
        self._task_context: TaskContext | None = None
        self.supervisor: Supervisor | None = None  # set when the registry admits it
        # Set for controller work: the controller to notify, and its slot machine entry.
        self.controller: Controller | None = None
        self.entry: Any = None

    @classmethod
    def for_spec(cls, spec: TaskSpec, policy: ResolvedSpec, slot: str | None = None) -> TaskRecord:
        """A new record for ``spec``: allocates its ``TaskId``, captures the caller's context."""
        return cls(
            allocate_id(), spec.name, spec.fn, spec.args, policy, contextvars.copy_context(), slot
        )

    def cancel_flag(self) -> AsyncBool:
        """The observable stop request, created on first use."""
        if self._flag is None:
            from trio_util import AsyncBool

            self._flag = AsyncBool(self.stop_requested)
        return self._flag

    def request_stop(self, reason: str) -> None:
        """Soft-stop: flag the request and cancel the stop scope."""
        self.stop_requested = True
        self.state = TaskState.STOPPING
        if self._flag is not None:
            self._flag.value = True
        self.stop_scope.cancel(reason=reason)

    def force(self) -> None:
        """Unshield every deferred block so the pending stop reaches it."""
        self.forced = True
        for scope in self.defer_scopes or ():
            scope.shield = False

    def task_context(self) -> TaskContext:
        """The public view of this task, created on first use."""
        if self._task_context is None:
            assert self.supervisor is not None
            self._task_context = TaskContext(self, self.supervisor)
        return self._task_context


def _exit_code(error: BaseException) -> int | None:
    code = getattr(error, "exit_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _is_awaitable(value: object) -> bool:
    return type(value) is types.CoroutineType or hasattr(value, "__await__")


async def run_actor(rec: TaskRecord, reg: Registry) -> None:
    """Run ``rec``'s attempts strictly in sequence until it ends; commit its outcome.

    The retry loop and the attempt are inlined in this one coroutine, with few locals
    and bookkeeping in plain helpers, on purpose: the memory of an idle supervised task
    is mostly its coroutine frames.
    """
    current_task_context.set(rec)
    retries = 0  # retries in the current failure streak
    outcome: TaskOutcome | None = None
    try:
        with rec.stop_scope:
            while True:
                if reg.limiter is not None:
                    await _acquire_permit(rec, reg)
                try:
                    if rec.stop_requested:
                        # Stopped before this attempt began (before the actor's first
                        # step, or while it was being woken): begin none, as a stop during
                        # a permit wait or backoff does. With grace=0 the outcome may even
                        # be committed already; a body must never start after that.
                        break
                    started = _begin_attempt(rec, reg)
                    status: str = _OK
                    result: object = None
                    try:
                        result = rec.fn(*rec.args)
                        if not _is_awaitable(result):
                            status, result = _FATAL, _not_awaitable(rec, result)
                        elif rec.policy.timeout is None:
                            result = await result
                        else:
                            rec.hard_deadline = started + rec.policy.timeout
                            with trio.CancelScope(deadline=rec.hard_deadline) as scope:
                                result = await result
                            if scope.cancel_called:
                                status, result = _TIMED_OUT, _timed_out(rec)
                    except TaskCancelled as exc:
                        status, result = _CANCELLED, exc
                    except FatalError as exc:
                        status, result = _FATAL, exc
                    except Exception as exc:
                        status, result = _FAILED, exc
                    except BaseException as exc:
                        _, rest = split_cancelled(exc)
                        if not isinstance(rest, Exception):
                            _end_attempt(rec, reg, EventKind.ATTEMPT_CANCELLED, started, None)
                            if rest is None or rest is exc:
                                raise
                            raise rest from None  # the group without its Cancelled
                        # Cancelled mixed with Exceptions (the task's own nursery, stopped
                        # while a child's cleanup raised): the Exceptions decide.
                        status, result = _FAILED, rest
                    _end_attempt(
                        rec, reg, _END_EVENTS[status], started, None if status is _OK else result
                    )
                finally:
                    if reg.limiter is not None:
                        reg.limiter.release_on_behalf_of(rec)
                # -- what next ---------------------------------------------------------
                if status is _OK:
                    retries = 0
                    if not rec.policy.restart.restarts_on_success:
                        outcome = (
                            COMPLETED_NONE
                            if result is None
                            else TaskOutcome(OutcomeKind.COMPLETED, value=result)
                        )
                        break
                    started = _schedule_repeat(rec, reg, started)
                else:
                    assert isinstance(result, BaseException)
                    outcome = _final_outcome(rec, status, result, retries)
                    if outcome is not None:
                        break
                    started = _schedule_retry(rec, reg, result, retries)
                    retries += 1
                _fresh_context(rec)
                if not rec.stop_requested:  # a stopping task stays STOPPING
                    rec.state = TaskState.BACKOFF
                await trio.sleep_until(started)  # ``started`` now holds the wake-up time
    except BaseException as exc:
        if split_cancelled(exc)[1] is None:
            # Only an internal fault cancels the supervisor's shielded region early.
            reg.actor_exited(rec, _PANICKED)
            raise
        reg.actor_exited(rec, CANCELLED)
        reg.crashed(exc)
        return
    reg.actor_exited(rec, CANCELLED if outcome is None or rec.stop_requested else outcome)


async def _acquire_permit(rec: TaskRecord, reg: Registry) -> None:
    assert reg.limiter is not None
    if not rec.stop_requested:  # a stopping task stays STOPPING
        rec.state = TaskState.WAITING
    reg.waiting_for_permit += 1
    try:
        await reg.limiter.acquire_on_behalf_of(rec)
    finally:
        reg.waiting_for_permit -= 1


def _begin_attempt(rec: TaskRecord, reg: Registry) -> float:
    """Account for a starting attempt; return its start time."""
    rec.attempt += 1
    rec.state = TaskState.RUNNING
    rec.in_attempt = True
    reg.running_attempts += 1
    if reg.bus.active:
        reg.bus.publish(
            EventKind.ATTEMPT_STARTING,
            task_id=rec.id,
            name=rec.name,
            slot=rec.slot,
            attempt=rec.attempt,
            timeout=rec.policy.timeout,
        )
    return trio.current_time()


def _end_attempt(
    rec: TaskRecord, reg: Registry, kind: EventKind, started: float, error: object
) -> None:
    """Account for an ended attempt and publish its terminal event."""
    rec.in_attempt = False
    rec.hard_deadline = math.inf
    reg.running_attempts -= 1
    bus = reg.bus
    if not bus.active:
        return
    failure = error if isinstance(error, BaseException) else None
    bus.publish(
        kind,
        task_id=rec.id,
        name=rec.name,
        slot=rec.slot,
        attempt=rec.attempt,
        reason=None if failure is None else str(failure),
        exit_code=None if failure is None else _exit_code(failure),
        duration=trio.current_time() - started,
        timeout=rec.policy.timeout if kind is EventKind.ATTEMPT_TIMED_OUT else None,
    )


def _not_awaitable(rec: TaskRecord, value: object) -> TypeError:
    return TypeError(f"task function {rec.fn!r} returned {type(value).__name__}, not an awaitable")


def _timed_out(rec: TaskRecord) -> TimeoutError:
    return TimeoutError(f"attempt timed out after {rec.policy.timeout!r} s")


_OK = "ok"
_FAILED = "failed"
_TIMED_OUT = "timed out"
_FATAL = "fatal"
_CANCELLED = "cancelled"
_END_EVENTS = {
    _OK: EventKind.ATTEMPT_SUCCEEDED,
    _FAILED: EventKind.ATTEMPT_FAILED,
    _TIMED_OUT: EventKind.ATTEMPT_TIMED_OUT,
    _FATAL: EventKind.ATTEMPT_FAILED,
    _CANCELLED: EventKind.ATTEMPT_CANCELLED,
}


def _final_outcome(
    rec: TaskRecord, status: str, error: BaseException, retries: int
) -> TaskOutcome | None:
    """The outcome an unsuccessful attempt ends the task with, or ``None`` to retry."""
    if status is _CANCELLED:
        return CANCELLED
    policy = rec.policy
    if status is _FATAL:
        kind, prefix = OutcomeKind.FATAL, ""
    elif not policy.restart.restarts_on_failure:
        kind, prefix = OutcomeKind.FAILED, ""
    elif policy.max_retries is not None and retries >= policy.max_retries:
        kind, prefix = OutcomeKind.FAILED, f"retry limit reached after {retries} retries: "
    else:
        return None  # retry: no outcome, so no reason text to build
    return TaskOutcome(kind, error=error, reason=prefix + str(error), exit_code=_exit_code(error))


def _schedule_retry(rec: TaskRecord, reg: Registry, error: BaseException, retries: int) -> float:
    """Publish the backoff after a retryable failure; return when to retry."""
    delay = rec.policy.backoff.delay_for_retry(retries, reg.random)
    _publish_backoff(rec, reg, delay, BackoffSource.FAILURE, error)
    return trio.current_time() + delay


def _schedule_repeat(rec: TaskRecord, reg: Registry, started: float) -> float:
    """Publish the wait after a success under ``always``; return when to run again."""
    interval = rec.policy.restart.interval
    now = trio.current_time()
    if interval is None:
        # Successive starts at least 1 ms apart; no event for an immediate repeat.
        return max(started + _MIN_RESTART_GAP, now)
    _publish_backoff(rec, reg, interval, BackoffSource.SUCCESS, None)
    return now + interval


def _publish_backoff(
    rec: TaskRecord,
    reg: Registry,
    delay: float,
    source: BackoffSource,
    error: BaseException | None,
) -> None:
    if reg.bus.active:
        reg.bus.publish(
            EventKind.BACKOFF_SCHEDULED,
            task_id=rec.id,
            name=rec.name,
            slot=rec.slot,
            attempt=rec.attempt,
            delay=delay,
            reason=None if error is None else str(error),
            exit_code=None if error is None else _exit_code(error),
            backoff_source=source,
        )


def _fresh_context(rec: TaskRecord) -> None:
    """Make the next attempt run in a fresh copy of the captured context.

    Takes effect at the actor's next checkpoint, which always precedes the attempt.
    """
    assert rec.context is not None  # kept for every policy that restarts
    context = rec.context.copy()
    context.run(current_task_context.set, rec)
    trio.lowlevel.current_task().context = context
