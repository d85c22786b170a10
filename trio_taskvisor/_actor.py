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
"""

from __future__ import annotations

import contextvars
import enum
import math
import types
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import trio

from ._context import TaskContext, current_task_context
from ._events import BackoffSource, EventKind
from ._exceptions import FatalError, TaskCancelled
from ._outcome import (
    CANCELLED,
    COMPLETED_NONE,
    OutcomeKind,
    TaskId,
    TaskOutcome,
    TaskWaiter,
)
from ._spec import ResolvedSpec, TaskFn

if TYPE_CHECKING:
    from trio_util import AsyncBool

    from ._controller import Controller
    from ._registry import Registry

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
        "slot",
        "state",
        "stop_requested",
        "stop_scope",
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
        self.context = context
        self.slot = slot
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
        self.defer_scopes: set[trio.CancelScope] = set()
        self._flag: AsyncBool | None = None
        # Set for controller work: the controller to notify, and its slot machine entry.
        self.controller: Controller | None = None
        self.entry: Any = None

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
        for scope in self.defer_scopes:
            scope.shield = False


def _exit_code(error: BaseException) -> int | None:
    code = getattr(error, "exit_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _is_awaitable(value: object) -> bool:
    return type(value) is types.CoroutineType or hasattr(value, "__await__")


def _only_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None  # pyright: ignore[reportUnknownMemberType]
    return False


async def run_actor(rec: TaskRecord, reg: Registry) -> None:
    """Run ``rec``'s attempts until it ends, then commit its outcome."""
    outcome: TaskOutcome = CANCELLED
    try:
        with rec.stop_scope:
            outcome = await _run_attempts(rec, reg)
    except BaseException as exc:
        if _only_cancellation(exc):
            # Only an internal fault cancels the supervisor's shielded region early.
            reg.actor_exited(rec, _PANICKED)
            raise
        reg.actor_exited(rec, CANCELLED)
        reg.crashed(exc)
        return
    reg.actor_exited(rec, CANCELLED if rec.stop_requested else outcome)


async def _run_attempts(rec: TaskRecord, reg: Registry) -> TaskOutcome:
    policy = rec.policy
    restart = policy.restart
    limiter = reg.limiter
    bus = reg.bus
    task_context = TaskContext(rec, reg.supervisor)
    current_task_context.set(task_context)
    retries = 0  # retries in the current failure streak
    while True:
        if limiter is not None:
            rec.state = TaskState.WAITING
            reg.waiting_for_permit += 1
            try:
                await limiter.acquire_on_behalf_of(rec)
            finally:
                reg.waiting_for_permit -= 1
        try:
            started, status, result = await _attempt(rec, reg)
        finally:
            if limiter is not None:
                limiter.release_on_behalf_of(rec)

        if status is _OK:
            retries = 0
            if not restart.restarts_on_success:
                return (
                    COMPLETED_NONE
                    if result is None
                    else TaskOutcome(OutcomeKind.COMPLETED, value=result)
                )
            interval = restart.interval
            _fresh_context(rec, task_context)
            rec.state = TaskState.BACKOFF
            if interval is None:
                await trio.sleep_until(max(started + _MIN_RESTART_GAP, trio.current_time()))
            else:
                if bus.active:
                    bus.publish(
                        EventKind.BACKOFF_SCHEDULED,
                        task_id=rec.id,
                        name=rec.name,
                        slot=rec.slot,
                        attempt=rec.attempt,
                        delay=interval,
                        backoff_source=BackoffSource.SUCCESS,
                    )
                await trio.sleep(interval)
            continue

        assert isinstance(result, BaseException)
        if status is _CANCELLED:
            return CANCELLED
        reason = str(result)
        exit_code = _exit_code(result)
        if status is _FATAL:
            return TaskOutcome(OutcomeKind.FATAL, error=result, reason=reason, exit_code=exit_code)
        # A retryable failure or a timeout.
        if not restart.restarts_on_failure:
            return TaskOutcome(OutcomeKind.FAILED, error=result, reason=reason, exit_code=exit_code)
        if policy.max_retries is not None and retries >= policy.max_retries:
            return TaskOutcome(
                OutcomeKind.FAILED,
                error=result,
                reason=f"retry limit reached after {retries} retries: {reason}",
                exit_code=exit_code,
            )
        delay = policy.backoff.delay_for_retry(retries, reg.random)
        retries += 1
        if bus.active:
            bus.publish(
                EventKind.BACKOFF_SCHEDULED,
                task_id=rec.id,
                name=rec.name,
                slot=rec.slot,
                attempt=rec.attempt,
                delay=delay,
                reason=reason,
                exit_code=exit_code,
                backoff_source=BackoffSource.FAILURE,
            )
        _fresh_context(rec, task_context)
        rec.state = TaskState.BACKOFF
        await trio.sleep(delay)


def _fresh_context(rec: TaskRecord, task_context: TaskContext) -> None:
    """Make the next attempt run in a fresh copy of the captured context.

    Takes effect at the actor's next checkpoint, which always precedes the attempt.
    """
    context = rec.context.copy()
    context.run(current_task_context.set, task_context)
    trio.lowlevel.current_task().context = context


_OK = "ok"
_FAILED = "failed"
_FATAL = "fatal"
_CANCELLED = "cancelled"


async def _attempt(rec: TaskRecord, reg: Registry) -> tuple[float, str, Any]:
    """Run one attempt; return (start time, status, value or error)."""
    rec.attempt += 1
    rec.state = TaskState.RUNNING
    rec.in_attempt = True
    reg.running_attempts += 1
    bus = reg.bus
    timeout = rec.policy.timeout
    if bus.active:
        bus.publish(
            EventKind.ATTEMPT_STARTING,
            task_id=rec.id,
            name=rec.name,
            slot=rec.slot,
            attempt=rec.attempt,
            timeout=timeout,
        )
    started = trio.current_time()
    rec.hard_deadline = math.inf if timeout is None else started + timeout
    value: object = None
    timed_out = False
    try:
        awaitable: Awaitable[object] = rec.fn(*rec.args)
        if not _is_awaitable(awaitable):
            error: Exception = TypeError(
                f"task function {rec.fn!r} returned {type(awaitable).__name__}, not an awaitable"
            )
            _publish_end(rec, reg, EventKind.ATTEMPT_FAILED, started, error)
            return started, _FATAL, error
        if timeout is None:
            value = await awaitable
        else:
            with trio.CancelScope(deadline=rec.hard_deadline) as scope:
                value = await awaitable
            timed_out = scope.cancel_called
    except TaskCancelled as exc:
        _publish_end(rec, reg, EventKind.ATTEMPT_CANCELLED, started, exc)
        return started, _CANCELLED, exc
    except FatalError as exc:
        _publish_end(rec, reg, EventKind.ATTEMPT_FAILED, started, exc)
        return started, _FATAL, exc
    except Exception as exc:
        _publish_end(rec, reg, EventKind.ATTEMPT_FAILED, started, exc)
        return started, _FAILED, exc
    except BaseException:
        _publish_end(rec, reg, EventKind.ATTEMPT_CANCELLED, started, None)
        raise
    finally:
        rec.in_attempt = False
        rec.hard_deadline = math.inf
        reg.running_attempts -= 1
    if timed_out:
        error = TimeoutError(f"attempt timed out after {timeout!r} s")
        _publish_end(rec, reg, EventKind.ATTEMPT_TIMED_OUT, started, error)
        return started, _FAILED, error
    _publish_end(rec, reg, EventKind.ATTEMPT_SUCCEEDED, started, None)
    return started, _OK, value


def _publish_end(
    rec: TaskRecord, reg: Registry, kind: EventKind, started: float, error: BaseException | None
) -> None:
    bus = reg.bus
    if not bus.active:
        return
    reason = None if error is None or isinstance(error, trio.Cancelled) else str(error)
    bus.publish(
        kind,
        task_id=rec.id,
        name=rec.name,
        slot=rec.slot,
        attempt=rec.attempt,
        reason=reason,
        exit_code=None if error is None else _exit_code(error),
        duration=trio.current_time() - started,
        timeout=rec.policy.timeout if kind is EventKind.ATTEMPT_TIMED_OUT else None,
    )
