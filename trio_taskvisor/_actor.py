"""One task's actor: its retry loop, and each attempt's cancel scopes.

Scope layout of one actor (outermost first)::

    stop_scope          cancelled by a stop request (soft stop)
      permit            max_concurrent, held only during an attempt
      timeout scope     the attempt's hard deadline
        fn(*args)       ctx.defer_cancel() blocks: shielded scopes with the same deadline

A soft stop cancels ``stop_scope``; deferred blocks keep running until the registry
forces the stop at the grace deadline by unshielding them. The timeout is hard: the
deferred blocks carry the attempt deadline themselves and unshield when it passes.

The actor knows its host (the registry) only through ``ActorHost``, declared here. When
it ends it reports to the host (``actor_exited``: the name is free, the outcome
committed) and then, for controller work, to the record's listener (``owner_exited``):
two calls in sequence from the actor's task, neither calling back into the other.

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
  (``split_cancelled``): only ``Exception`` instances left make an ordinary failed
  attempt (``ATTEMPT_FAILED``; a stopped task still ends ``CANCELLED``); a
  non-``Exception`` remainder is re-raised without its ``Cancelled``, so no
  ``Cancelled`` leaves the scope it belongs to.
* A retry whose backoff is zero waits for one plain checkpoint (never a timer), so a
  failing task cannot starve the others.
* An attempt that ends after a stop was requested ends the task at once (``CANCELLED``,
  or the force's ``FORCE_ABORTED``): no backoff or repeat is scheduled for it, so no
  ``BACKOFF_SCHEDULED`` follows a stop, and a forced task publishes no attempt event
  once its outcome is committed (nothing after ``TASK_REMOVED`` but
  ``FORCED_TASK_EXITED``, which the registry publishes at the actor's exit).
* Failure streaks with streak rules (``ResolvedSpec.streak_rules``) take a fuller
  path, ``_streak_failure``; tasks without them keep the plain one. At a retryable
  failure the checks run in this order, the first that stops the task decides:
  ``max_retries`` (after a healthy attempt's reset), ``retry_budget``,
  ``restart_limit``, then ``retry_on`` (it "applies only to failures that would
  otherwise be retried"). The backoff delay is drawn before the budget and limit
  checks, which need it.
* ``log_failures``: the first failed attempt of each failure streak is logged at
  WARNING when a retry is scheduled for it (so never for the final attempt), without a
  traceback; the final outcome's ERROR record (the registry's) carries it. While the
  streak goes on, a retried failure is logged again at most once per 60 s of the
  supervisor's clock, naming the attempts failed since the streak began.
* Calling ``fn(*args)`` that raises (a ``TypeError`` for missing arguments) ends the
  task ``FATAL`` at once, whatever the exception (``TaskCancelled`` and ``FatalError``
  included): no awaitable exists, and every later call would raise the same.
* Work started with ``Supervisor.start`` is called ``fn(*args, task_status=status)`` on
  every attempt, with a fresh status each time (``_waiter.AttemptStatus``).
"""

from __future__ import annotations

import enum
import logging
import math
import random
import sys
import types
from typing import Any, Final, Protocol

import trio

from ._bus import EventBus
from ._events import BackoffSource, EventKind
from ._exceptions import FatalError, TaskCancelled, error_text, exit_code_of, split_cancelled
from ._logging import log, seconds
from ._outcome import CANCELLED, COMPLETED_NONE, PANICKED, OutcomeKind, TaskOutcome
from ._policies import (
    RestartLimit,
    RestartWindow,
    retry_budget_reason,
    retry_budget_spent,
    retry_on_matches,
)
from ._record import TaskRecord, TaskState, current_task_context
from ._spec import qualname

_MIN_RESTART_GAP = 0.001
# What async functions return, checked before the generic awaitable (row 1a: every attempt).
_COROUTINE: type[object] = types.CoroutineType


class _Status(enum.Enum):
    """How an attempt's call of its function ended, with the event that ends the attempt."""

    OK = ("ok", EventKind.ATTEMPT_SUCCEEDED)
    FAILED = ("failed", EventKind.ATTEMPT_FAILED)
    TIMED_OUT = ("timed out", EventKind.ATTEMPT_TIMED_OUT)
    FATAL = ("fatal", EventKind.ATTEMPT_FAILED)
    CANCELLED = ("cancelled", EventKind.ATTEMPT_CANCELLED)
    # Calling fn(*args) raised: no awaitable exists, nothing to retry.
    UNCALLABLE = ("uncallable", EventKind.ATTEMPT_FAILED)

    def __init__(self, _label: str, event: EventKind) -> None:
        self.event = event


# The members as module globals: the hot path reads them once or twice per attempt, and an
# Enum class's attribute lookup is not specialised by the interpreter (its metaclass has a
# __getattr__), which cost 1.5% of benchmark row 1a.
_OK: Final = _Status.OK
_FAILED: Final = _Status.FAILED
_TIMED_OUT: Final = _Status.TIMED_OUT
_FATAL: Final = _Status.FATAL
_CANCELLED: Final = _Status.CANCELLED
_UNCALLABLE: Final = _Status.UNCALLABLE


class ActorHost(Protocol):
    """What an actor needs from the registry that spawned it."""

    bus: EventBus
    random: random.Random
    running_attempts: int
    log_failures: bool
    intake_closed: bool  # the shutdown has begun

    async def await_stop(self) -> None:
        """The shutdown has begun: wait for its stop (which cancels this wait)."""

    async def acquire_permit(self, rec: TaskRecord, /) -> None:
        """Wait (FIFO) for a permit for the attempt after the first."""

    def release_permit(self, rec: TaskRecord, /) -> None:
        """An attempt holding a permit ended."""

    def actor_exited(self, rec: TaskRecord, outcome: TaskOutcome[Any], /) -> None:
        """The actor ends: free its name and commit ``outcome`` unless committed."""

    def settle(self) -> None:
        """The record's listener has heard of the exit too (it may have admitted more)."""

    def crashed(self, exc: BaseException, /) -> None:
        """A non-task ``BaseException`` ended the actor: take the supervisor down."""


async def run_actor(rec: TaskRecord, host: ActorHost, permit: bool | None) -> None:
    """Run ``rec``'s attempts strictly in sequence until it ends; commit its outcome.

    ``permit``: ``None`` without ``max_concurrent``; else whether the host acquired the
    first attempt's permit before spawning it. The retry loop and the attempt are inlined
    in this one coroutine, with few locals and the bookkeeping in plain helpers, on
    purpose: the memory of an idle supervised task is mostly its coroutine frames.
    """
    # Set in the actor's own context, not in the captured one before the spawn: a burst
    # of N spawns then leaves the garbage collector less to walk (row 1a at 10k: -10%).
    current_task_context.set(rec)
    retries = 0  # retries in the current failure streak
    result: object = None
    # ``result`` ends as the outcome: one local fewer than an ``outcome`` of its own, 16 B
    # per idle task (benchmark row 7). Every break but a stop's sets it to the outcome.
    try:
        # The stop scope is entered and exited by hand, not with ``with``: a ``with``
        # keeps its bound ``__exit__`` on the suspended coroutine's stack for the task's
        # whole life, 64 B and a stack slot per idle task (benchmark row 7).
        _stop_scope(rec).__enter__()
        try:
            while True:
                if permit is False:
                    await _acquire_permit(rec, host)
                    permit = True
                try:
                    if host.intake_closed and not rec.stop_requested:
                        # The shutdown has begun, its stop still to come (the exit that
                        # began it gave back the units this attempt waited for): begin
                        # none, so no body starts during a shutdown.
                        await host.await_stop()
                    if rec.stop_requested:
                        # Stopped before this attempt began (before the actor's first
                        # step, or while it was being woken): begin none, as a stop during
                        # a permit wait or backoff does. With grace=0 the outcome may even
                        # be committed already; a body must never start after that.
                        break
                    started = _begin_attempt(rec, host)
                    status = _UNCALLABLE  # until fn(*args) returns
                    result = None
                    try:
                        result = rec.call()
                        status = _OK
                        if type(result) is not _COROUTINE and not hasattr(result, "__await__"):
                            status, result = _FATAL, _not_awaitable(rec, result)
                        elif rec.policy.timeout is None:
                            result = await result
                        else:
                            assert started is not None
                            rec.hard_deadline = started + rec.policy.timeout
                            with trio.CancelScope(deadline=rec.hard_deadline):
                                result = await result
                            # Cancelled at the deadline, or returned after it having
                            # swallowed the cancellation: timed out either way.
                            if trio.current_time() >= rec.hard_deadline:
                                status, result = _TIMED_OUT, _timed_out(rec)
                    # No ``except ... as exc``: the name would cost the coroutine a
                    # local, 16 B per idle task (benchmark row 7).
                    except TaskCancelled:
                        status = _CANCELLED if status is _OK else _UNCALLABLE
                        result = sys.exception()
                    except FatalError:
                        status = _FATAL if status is _OK else _UNCALLABLE
                        result = sys.exception()
                    except Exception:
                        status = _FAILED if status is _OK else _UNCALLABLE
                        result = sys.exception()
                    except BaseException:
                        status = _FAILED
                        result = _failure_in(rec, host, started)
                    _end_attempt(rec, host, status, started, result)
                finally:
                    if permit:
                        host.release_permit(rec)
                        permit = False
                # -- what next: ``started`` becomes the wake-up time -------------------
                if rec.stop_requested:
                    # CANCELLED (or the force's outcome): no retry, no repeat. (mypy
                    # keeps the narrowing of the check above across the awaits.)
                    break  # type: ignore[unreachable]
                if status is _OK:
                    retries = 0
                    if not rec.policy.repeats:
                        result = (
                            COMPLETED_NONE
                            if result is None
                            else TaskOutcome(OutcomeKind.COMPLETED, value=result)
                        )
                        break
                    started = _schedule_repeat(rec, host, started)
                elif rec.policy.streak_rules:
                    assert isinstance(result, BaseException)
                    if _healthy(rec, started):
                        retries = 0  # a healthy attempt: this failure begins a new streak
                    result, started, retries = _streak_failure(rec, host, status, result, retries)
                    if result is not None:
                        break
                else:
                    assert isinstance(result, BaseException)
                    result, started = _plain_failure(rec, host, status, result, retries)
                    if result is not None:
                        break
                    retries += 1
                _fresh_context(rec)
                if not rec.stop_requested:  # a stopping task stays STOPPING
                    rec.state = TaskState.BACKOFF
                if started is None:
                    await trio.lowlevel.checkpoint()
                else:
                    await trio.sleep_until(started)
        except BaseException:
            # As ``with`` would: the scope swallows its own Cancelled, re-raises the rest.
            if not _close_stop_scope(rec, handling=True):
                raise
        else:
            _close_stop_scope(rec, handling=False)
    except BaseException:
        if _crashed(rec, host):
            raise
        return
    if rec.stop_requested:
        _exit(rec, host, CANCELLED)
    else:
        assert isinstance(result, TaskOutcome)
        _exit(rec, host, result)  # pyright: ignore[reportUnknownArgumentType]


def _stop_scope(rec: TaskRecord) -> trio.CancelScope:
    """The actor's stop scope, cancelled at once if a stop came before its first step."""
    rec.stop_scope = scope = trio.CancelScope()
    if rec.stop_requested:
        scope.cancel(reason="stop requested")
    return scope


def _close_stop_scope(rec: TaskRecord, *, handling: bool) -> bool:
    """Exit the stop scope as ``with`` does, ``handling`` the exception being handled:
    whether the scope swallowed it (its own ``Cancelled``)."""
    scope = rec.stop_scope
    assert scope is not None
    if not handling:
        return scope.__exit__(None, None, None)
    exc = sys.exception()
    assert exc is not None
    try:
        return scope.__exit__(type(exc), exc, exc.__traceback__)
    finally:
        del exc  # raised again, its traceback would hold this frame: no cycle


def _crashed(rec: TaskRecord, host: ActorHost) -> bool:
    """A ``BaseException`` left the actor: end the task; whether to re-raise it."""
    exc = sys.exception()
    assert exc is not None
    try:
        if split_cancelled(exc)[1] is None:
            # Only an internal fault cancels the supervisor's shielded region early.
            _exit(rec, host, PANICKED)
            return True
        host.crashed(exc)  # first: its shutdown closes the slot queue this exit advances
        _exit(rec, host, CANCELLED)
        return False
    finally:
        del exc


def _failure_in(rec: TaskRecord, host: ActorHost, started: float | None) -> Exception:
    """An attempt raised a ``BaseException`` (being handled): its failure, or re-raise it.

    Cancelled mixed with Exceptions (the task's own nursery, stopped while a child's
    cleanup raised): the Exceptions decide, as an ordinary failure. Anything else ends
    the attempt cancelled and propagates, without its ``Cancelled``.
    """
    exc = sys.exception()
    assert exc is not None
    rest = split_cancelled(exc)[1]
    if isinstance(rest, Exception):
        return rest
    _end_attempt(rec, host, _CANCELLED, started, None)
    try:
        if rest is None or rest is exc:
            raise exc
        raise rest from None  # the group without its Cancelled
    finally:
        # The traceback holds this frame: without the del, this frame and the exception
        # would form a cycle, left to the garbage collector with every frame it holds
        # (a shutdown of 10k tasks spent half its time in collections).
        del exc, rest


def _exit(rec: TaskRecord, host: ActorHost, outcome: TaskOutcome[Any]) -> None:
    """Report the exit: to the host, then to the record's listener; then let go."""
    host.actor_exited(rec, outcome)
    if rec.listener is not None:
        rec.listener.owner_exited(rec)
        host.settle()
    rec.release()


async def _acquire_permit(rec: TaskRecord, host: ActorHost) -> None:
    if not rec.stop_requested:  # a stopping task stays STOPPING
        rec.state = TaskState.WAITING
    await host.acquire_permit(rec)


def _begin_attempt(rec: TaskRecord, host: ActorHost) -> float | None:
    """Account for a starting attempt; return its start time (``None``: nobody needs it)."""
    rec.attempt += 1
    rec.state = TaskState.RUNNING
    rec.in_attempt = True
    host.running_attempts += 1
    bus = host.bus
    policy = rec.policy
    if bus.active:
        bus.publish(
            EventKind.ATTEMPT_STARTING,
            rec.id,
            rec.name,
            rec.slot,
            rec.attempt,
            timeout=policy.timeout,
            fence_token=rec.fence_token,
        )
    elif not policy.needs_clock:
        return None  # no deadline, no duration, no repeat gap, no healthy mark: no clock read
    return trio.current_time()


def _end_attempt(
    rec: TaskRecord, host: ActorHost, status: _Status, started: float | None, result: object
) -> None:
    """Account for an ended attempt and publish its terminal event."""
    rec.in_attempt = False
    rec.hard_deadline = math.inf
    host.running_attempts -= 1
    bus = host.bus
    if not bus.active or rec.committed:
        return  # committed: forced, its events ended with TASK_REMOVED
    kind = status.event
    failure = None if status is _OK or not isinstance(result, BaseException) else result
    bus.publish(
        kind,
        rec.id,
        rec.name,
        rec.slot,
        rec.attempt,
        None if failure is None else error_text(failure),
        exit_code=None if failure is None else exit_code_of(failure),
        duration=None if started is None else trio.current_time() - started,
        timeout=rec.policy.timeout if kind is EventKind.ATTEMPT_TIMED_OUT else None,
        fence_token=rec.fence_token,
    )


def _not_awaitable(rec: TaskRecord, value: object) -> TypeError:
    return TypeError(f"task function {rec.fn!r} returned {type(value).__name__}, not an awaitable")


def _uncallable(rec: TaskRecord, error: BaseException) -> TaskOutcome[Any]:
    """FATAL: calling the function raised before any awaitable existed (missing
    arguments, say); every later call would raise the same, so none is retried."""
    reason = f"calling {qualname(rec.fn)} failed: {error_text(error)}"
    _note_task_status(error)
    return TaskOutcome(OutcomeKind.FATAL, error=error, reason=reason, exit_code=exit_code_of(error))


def _note_task_status(error: BaseException) -> None:
    """Say what to do, as a note on ``error`` (its traceback shows it; the reason keeps
    its documented form), when the function and the call disagree on ``task_status``."""
    text = str(error) if isinstance(error, TypeError) else ""
    if "unexpected keyword argument 'task_status'" in text:
        error.add_note(
            "start() and start_in_slot() pass task_status, as nursery.start does: give the"
            " function a task_status keyword argument, or add or submit the work instead"
        )
    elif "required" in text and "'task_status'" in text:
        error.add_note("only start() and start_in_slot() pass task_status")


def _timed_out(rec: TaskRecord) -> TimeoutError:
    return TimeoutError(f"attempt timed out after {rec.policy.timeout!r} s")


def _plain_failure(
    rec: TaskRecord, host: ActorHost, status: _Status, error: BaseException, retries: int
) -> tuple[TaskOutcome[Any] | None, float | None]:
    """An unsuccessful attempt of a task without streak rules: (the outcome it ends the
    task with, or ``None`` and when to retry)."""
    if status is _CANCELLED:
        return CANCELLED, None
    policy = rec.policy
    if status is _FATAL:
        kind, prefix = OutcomeKind.FATAL, ""
    elif status is _UNCALLABLE:
        return _uncallable(rec, error), None
    elif not policy.restart.restarts_on_failure:
        kind, prefix = OutcomeKind.FAILED, ""
    elif policy.max_retries is not None and retries >= policy.max_retries:
        kind, prefix = OutcomeKind.FAILED, f"{_retry_limit_reached(retries)}: "
    else:
        # Retry: no outcome, so no reason text to build.
        return None, _schedule_retry(rec, host, error, retries)
    outcome: TaskOutcome[Any] = TaskOutcome(
        kind, error=error, reason=prefix + error_text(error), exit_code=exit_code_of(error)
    )
    return outcome, None


def _retry_limit_reached(retries: int) -> str:
    return f"retry limit reached after {retries} {'retry' if retries == 1 else 'retries'}"


def _schedule_retry(
    rec: TaskRecord, host: ActorHost, error: BaseException, retries: int
) -> float | None:
    """Publish the backoff after a retryable failure; when to retry (``None``: at once)."""
    delay = rec.policy.backoff.delay_for_retry(retries, host.random)
    _publish_backoff(rec, host, delay, BackoffSource.FAILURE, error)
    if host.log_failures:
        _log_retry(rec, error, delay, retries)
    return None if delay == 0 else trio.current_time() + delay


class _Streak:
    """The failure-streak state of a task with streak rules (in its record's extras)."""

    __slots__ = ("first_failure", "window")

    def __init__(self, limit: RestartLimit | None) -> None:
        self.first_failure = 0.0  # of the current streak: set at its first failure
        self.window = None if limit is None else RestartWindow(limit)


def _ended(kind: OutcomeKind, error: BaseException, reason: str) -> TaskOutcome[Any]:
    return TaskOutcome(kind, error=error, reason=reason, exit_code=exit_code_of(error))


def _healthy(rec: TaskRecord, started: float | None) -> bool:
    """Whether the failed attempt that began at ``started`` ran long enough to count as
    healthy (``healthy_after``): its failure then begins a new streak."""
    healthy_after = rec.policy.healthy_after
    return (
        healthy_after is not None
        and started is not None
        and trio.current_time() - started >= healthy_after
    )


def _streak_failure(
    rec: TaskRecord,
    host: ActorHost,
    status: _Status,
    error: BaseException,
    retries: int,
) -> tuple[TaskOutcome[Any] | None, float | None, int]:
    """An unsuccessful attempt of a task with streak rules: (the outcome it ends the
    task with, or ``None`` and when to retry), and the streak's retry count from now.

    ``retries`` is already reset when the attempt was healthy (``_healthy``).
    """
    if status is _CANCELLED:
        return CANCELLED, None, retries
    policy = rec.policy
    if status is _FATAL:
        return _ended(OutcomeKind.FATAL, error, error_text(error)), None, retries
    if status is _UNCALLABLE:
        return _uncallable(rec, error), None, retries
    if not policy.restart.restarts_on_failure:
        return _ended(OutcomeKind.FAILED, error, error_text(error)), None, retries
    now = trio.current_time()
    if policy.max_retries is not None and retries >= policy.max_retries:
        reason = f"{_retry_limit_reached(retries)}: {error_text(error)}"
        return _ended(OutcomeKind.FAILED, error, reason), None, retries
    delay = policy.backoff.delay_for_retry(retries, host.random)
    at = now + delay
    extras = rec.extras()
    streak = extras.streak
    if streak is None:
        streak = extras.streak = _Streak(policy.restart_limit)
    assert isinstance(streak, _Streak)
    if retries == 0:
        streak.first_failure = now
    budget = policy.retry_budget
    if budget is not None and retry_budget_spent(streak.first_failure, budget, at):
        return _ended(OutcomeKind.FAILED, error, retry_budget_reason(budget, error)), None, retries
    window = streak.window
    if window is not None and not window.admits(at):
        assert policy.restart_limit is not None
        reason = policy.restart_limit.reason(error)
        return _ended(OutcomeKind.FAILED, error, reason), None, retries
    if policy.retry_on is not None and not retry_on_matches(error, policy.retry_on):
        return _ended(OutcomeKind.FATAL, error, error_text(error)), None, retries
    if window is not None:
        window.record(at)
    _publish_backoff(rec, host, delay, BackoffSource.FAILURE, error)
    if host.log_failures:
        _log_retry(rec, error, delay, retries)
    return None, None if delay == 0 else at, retries + 1


FAILURE_LINE_INTERVAL = 60.0
"""Seconds of the supervisor's clock between two WARNING lines of one failure streak."""


def _log_retry(rec: TaskRecord, error: BaseException, delay: float, retries: int) -> None:
    """``log_failures``: a failed attempt of a streak, which will be retried.

    The streak's first failure is logged at once; while the streak goes on, one line at
    most per ``FAILURE_LINE_INTERVAL``, counting the attempts failed since it began (a
    task failing every 0.2 s for an hour logs about 60 lines, not 18 000 and not 1).
    """
    now = trio.current_time()
    extras = rec.extras()
    if retries == 0:
        extras.failing_since = now
    elif now - extras.failure_logged < FAILURE_LINE_INTERVAL:
        return  # throttled: neither the error's text nor the log record's extra is built
    extras.failure_logged = now
    text = error_text(error)
    extra = {
        "taskvisor_name": rec.name,
        "taskvisor_task_id": rec.id,
        "taskvisor_attempt": rec.attempt,
        "taskvisor_reason": text,
        "taskvisor_delay": delay,
    }
    if retries == 0:
        log(
            logging.WARNING,
            "task %r (%s) attempt %d failed, retrying in %s: %s",
            rec.name,
            rec.id,
            rec.attempt,
            seconds(delay),
            text,
            extra=extra,
        )
    else:
        log(
            logging.WARNING,
            "task %r (%s) still failing: %d attempts failed in %.1f s, retrying in %s: %s",
            rec.name,
            rec.id,
            retries + 1,
            now - extras.failing_since,
            seconds(delay),
            text,
            extra=extra,
        )


def _schedule_repeat(rec: TaskRecord, host: ActorHost, started: float | None) -> float:
    """Publish the wait after a success under ``always``; return when to run again."""
    assert started is not None  # read for every policy that repeats
    interval = rec.policy.restart.interval
    now = trio.current_time()
    if interval is None:
        # Successive starts at least 1 ms apart; no event for an immediate repeat.
        return max(started + _MIN_RESTART_GAP, now)
    _publish_backoff(rec, host, interval, BackoffSource.SUCCESS, None)
    return now + interval


def _publish_backoff(
    rec: TaskRecord,
    host: ActorHost,
    delay: float,
    source: BackoffSource,
    error: BaseException | None,
) -> None:
    if host.bus.active:
        host.bus.publish(
            EventKind.BACKOFF_SCHEDULED,
            rec.id,
            rec.name,
            rec.slot,
            rec.attempt,
            None if error is None else error_text(error),
            delay=delay,
            exit_code=None if error is None else exit_code_of(error),
            backoff_source=source,
            fence_token=rec.fence_token,
        )


def _fresh_context(rec: TaskRecord) -> None:
    """Make the next attempt run in a fresh copy of the captured context.

    Takes effect at the actor's next checkpoint, which always precedes the attempt.
    """
    captured = rec.context
    assert captured is not None  # kept for every policy that restarts
    if captured.get(current_task_context) is not rec:
        # The first restart: set once in the captured context (which may name the
        # attempt that added this task), so that later restarts copy it as it is.
        captured.run(current_task_context.set, rec)
    trio.lowlevel.current_task().context = captured.copy()
