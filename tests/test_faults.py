"""Faults: bad subscribers, BaseExceptions, awaiting cleanup, nurseries, threads, a full bus.

Timing asserts are exact under ``MockClock(autojump_threshold=0)``. Tests with real
threads keep every thread blocked on a ``threading.Event`` while they assert virtual
times (a blocked thread cannot race the clock), release the thread only afterwards,
and never sleep to settle: they wait for the thread with ``to_thread.run_sync(event.wait)``
and for the supervisor with ``wait_idle()``.

Decisions the documentation leaves open
-----------------------------------
* A task that raises ``KeyboardInterrupt``, ``SystemExit`` or any other
  ``BaseException`` that is not trio's cancellation ends ``CANCELLED`` (it is not a
  task failure); the supervisor shuts down gracefully (other tasks get their grace)
  and then the exception propagates bare from ``open_supervisor`` / ``run`` (not
  wrapped in a group), taking precedence over ``GraceExceededError``. ``SystemExit``
  is treated exactly like ``KeyboardInterrupt``: it keeps its ``code``. Only the
  first such exception propagates; a later one (raised during that shutdown) is
  logged at ERROR with its traceback, not swallowed silently.
* A ``BaseExceptionGroup`` raised by a task (a child task of the attempt's own nursery
  raised ``KeyboardInterrupt``) is such a ``BaseException``: it propagates as the
  task raised it, after the graceful shutdown.
* An ``ExceptionGroup`` raised by an attempt (a child task failed; trio's strict
  groups) is a retryable failure: ``FAILED`` with the group as ``error``, retried
  under ``ON_FAILURE``. It is not unwrapped: a ``FatalError`` or ``TaskCancelled``
  inside a group does not make the outcome ``FATAL`` / ``CANCELLED``; raise it from
  the attempt itself (e.g. with ``except*``) for that.
* A subscriber whose ``on_event`` raises an ``Exception`` (trio's resource errors
  included) is isolated and reported as ``SUBSCRIBER_FAILED``. A ``BaseException``
  from ``on_event`` (``KeyboardInterrupt``) is not isolated: like one from a task, it
  starts the graceful shutdown and propagates bare from ``open_supervisor``; that
  subscriber receives no further events.
* An ``await`` in a task's ``finally`` block that is neither shielded nor in
  ``defer_cancel()`` is cancelled at once (plain trio semantics: the stop's cancel
  scope is still cancelled); cleanup that must await uses ``defer_cancel()`` or a
  shield, and gets the grace window.
* ``to_thread.run_sync(..., abandon_on_cancel=True)``: a stopped or forced attempt
  leaves at once and is physically done (name free, not alive); the thread runs on
  and is nobody's to wait for. Without ``abandon_on_cancel`` the attempt stays alive
  (and keeps its name) until the thread returns, past the grace deadline if need be.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    FatalError,
    GraceExceededError,
    OutcomeKind,
    RestartPolicy,
    TaskCancelled,
    TaskNameInUseError,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
    run,
)
from trio_taskvisor._registry import Registry
from trio_taskvisor.testing import EventRecorder

from helpers import (
    ONE_ATTEMPT_SUCCESS,
    Body,
    deferring,
    forever,
    kinds_of,
    settle,
    stubborn,
    supervisor,
    supervisor_config,
)

THREAD_TIMEOUT = 30.0  # real seconds; a safety net so a broken test cannot hang a thread


# -- subscribers -----------------------------------------------------------------------------


class RaisingSubscriber:
    name = "raising"

    def __init__(self, exc_type: type[Exception] = ValueError) -> None:
        self.exc_type = exc_type
        self.seen: list[EventKind] = []

    async def on_event(self, event: Any) -> None:
        self.seen.append(event.kind)
        raise self.exc_type(f"bad subscriber on {event.kind.value}")


class BlockingSubscriber:
    name = "blocking"
    queue_capacity = 2

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0

    async def on_event(self, event: Any) -> None:
        self.calls += 1
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled += 1


class SlowSubscriber:
    name = "slow"

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self.started: list[int] = []
        self.delivered: list[int] = []

    async def on_event(self, event: Any) -> None:
        self.started.append(event.seq)
        await trio.sleep(self.seconds)
        self.delivered.append(event.seq)


@pytest.mark.parametrize(
    "exc_type",
    [ValueError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError],
)
async def test_raising_subscriber_is_isolated_and_reported(
    autojump_clock: Any, exc_type: type[Exception]
) -> None:
    """A failing on_event (trio's own errors too) is reported; everyone else is unaffected."""
    raising = RaisingSubscriber(exc_type)
    recorder = EventRecorder()
    async with supervisor(recorder, subscribers=[raising]) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(TaskSpec.once("job", Body(3.0)))
        assert (await waiter.wait()).value == "ok"
        assert trio.current_time() == t0 + 3.0
        await settle()
    assert kinds_of(recorder, "job") == ONE_ATTEMPT_SUCCESS
    failures = recorder.of(EventKind.SUBSCRIBER_FAILED, name="raising")
    assert len(failures) == len(raising.seen)
    assert all(f.reason is not None and "bad subscriber on" in f.reason for f in failures)
    # The failing subscriber keeps receiving later events, never its own failures.
    assert raising.seen[: len(ONE_ATTEMPT_SUCCESS)] == ONE_ATTEMPT_SUCCESS
    assert EventKind.SUBSCRIBER_FAILED not in raising.seen


async def test_blocked_subscriber_does_not_slow_tasks_and_drops_are_counted(
    autojump_clock: Any,
) -> None:
    """A subscriber stuck in on_event: tasks keep exact timing, its lane drops and counts."""
    blocking = BlockingSubscriber()
    recorder = EventRecorder()
    async with supervisor(recorder, subscribers=[blocking], subscriber_shutdown_timeout=3.0) as sup:
        t0 = trio.current_time()
        waiters = await sup.add_batch([TaskSpec.once(f"job-{i}", Body(1.0 + i)) for i in range(3)])
        for i, waiter in enumerate(waiters):
            assert (await waiter.wait()).value == "ok"
            assert trio.current_time() == t0 + 1.0 + i
        await settle()
        stats = sup.statistics()
        # One event in on_event, two queued, everything else dropped for that lane only.
        assert stats.subscriber_dropped["blocking"] == len(recorder.events) - 3
        assert stats.subscriber_dropped["EventRecorder"] == 0
        assert stats.events_dropped == stats.subscriber_dropped["blocking"]
        t_exit = trio.current_time()
    # The drain is bounded: the stuck on_event is cancelled at the deadline.
    assert trio.current_time() == t_exit + 3.0
    assert blocking.calls == 1
    assert blocking.cancelled == 1
    stats = sup.statistics()
    assert stats.subscriber_dropped["blocking"] == len(recorder.events) - 1
    assert stats.events_dropped == stats.subscriber_dropped["blocking"]


async def test_slow_subscriber_gets_every_event_in_order_within_the_drain(
    autojump_clock: Any,
) -> None:
    """A slow subscriber with room never slows tasks and, drained in time, misses nothing."""
    slow = SlowSubscriber(1.0)
    recorder = EventRecorder()
    async with supervisor(recorder, subscribers=[slow], subscriber_shutdown_timeout=1000.0) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(TaskSpec.periodic("job", 0.5, Body(0.25)))
        await trio.sleep(3.0)
        assert await sup.cancel("job") is True
        assert trio.current_time() == t0 + 3.0
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        starts = [e.time for e in recorder.of(EventKind.ATTEMPT_STARTING, name="job")]
        assert starts == [t0 + 0.75 * i for i in range(len(starts))]
        t_exit = trio.current_time()
    assert slow.delivered == [e.seq for e in recorder.events]
    assert sup.statistics().events_dropped == 0
    # The shutdown waited for the slow drain: one second per event not yet delivered.
    assert trio.current_time() > t_exit


async def test_slow_subscriber_drain_is_bounded_and_the_rest_counted(autojump_clock: Any) -> None:
    slow = SlowSubscriber(1.0)
    recorder = EventRecorder()
    async with supervisor(recorder, subscribers=[slow], subscriber_shutdown_timeout=2.5) as sup:
        await sup.add_batch([TaskSpec.once(f"job-{i}", Body(0.5)) for i in range(3)])
        await sup.wait_idle()
        t_exit = trio.current_time()
    assert trio.current_time() == t_exit + 2.5
    total = len(recorder.events)
    dropped = sup.statistics().subscriber_dropped["slow"]
    # Every event was either started (the last one cancelled mid-call) or dropped.
    assert len(slow.started) + dropped == total
    assert len(slow.delivered) == len(slow.started) - 1
    assert slow.started == [e.seq for e in recorder.events][: len(slow.started)]


class InterruptingSubscriber:
    name = "interrupting"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.seen: list[EventKind] = []

    async def on_event(self, event: Any) -> None:
        self.seen.append(event.kind)
        if event.kind is EventKind.TASK_ADDED and event.name == "trigger":
            raise self.exc


class Custom(BaseException):
    """A BaseException that is neither an Exception nor trio's."""


@pytest.mark.parametrize(
    "exc", [KeyboardInterrupt(), SystemExit(3), Custom("custom")], ids=["ki", "exit", "custom"]
)
async def test_base_exception_from_a_subscriber_shuts_down_gracefully_and_propagates(
    autojump_clock: Any, exc: BaseException
) -> None:
    interrupting = InterruptingSubscriber(exc)
    recorder = EventRecorder()
    cleaned: list[float] = []

    async def cleanup_two_seconds() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2.0)
            cleaned.append(trio.current_time())

    with pytest.raises(type(exc)) as info:  # noqa: PT012
        async with supervisor(recorder, subscribers=[interrupting]) as sup:
            other = await sup.add(TaskSpec.once("other", cleanup_two_seconds))
            await settle()
            t0 = trio.current_time()
            await sup.add(TaskSpec.once("trigger", forever))
            await trio.sleep_forever()
    assert info.value is exc
    assert trio.current_time() == t0 + 2.0
    assert cleaned == [t0 + 2.0]
    assert other.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]
    assert recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE)
    # The subscriber that raised got nothing after its failure.
    assert interrupting.seen[-1] is EventKind.TASK_ADDED


async def test_regression_subscriber_keyboard_interrupt_does_not_panic_tasks(
    autojump_clock: Any,
) -> None:
    """A KeyboardInterrupt in on_event ends other tasks CANCELLED, never PANICKED."""
    interrupting = InterruptingSubscriber(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        async with supervisor(subscribers=[interrupting]) as sup:
            other = await sup.add(TaskSpec.once("other", forever))
            await sup.add(TaskSpec.once("trigger", forever))
            await trio.sleep_forever()
    assert other.outcome_nowait().kind is OutcomeKind.CANCELLED


# -- tasks raising BaseException ------------------------------------------------------------------


def raising_after(seconds: float, exc: BaseException) -> Any:
    async def body() -> None:
        await trio.sleep(seconds)
        raise exc

    return body


async def cleanup_for(seconds: float, cleaned: list[float]) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with current_context().defer_cancel():
            await trio.sleep(seconds)
        cleaned.append(trio.current_time())


@pytest.mark.parametrize(
    "exc", [KeyboardInterrupt(), SystemExit(3), Custom("custom")], ids=["ki", "exit", "custom"]
)
async def test_base_exception_in_a_task_shuts_down_gracefully_then_propagates_bare(
    autojump_clock: Any, exc: BaseException
) -> None:
    recorder = EventRecorder()
    cleaned: list[float] = []
    body_cancelled: list[float] = []
    with pytest.raises(type(exc)) as info:  # noqa: PT012
        async with supervisor(recorder) as sup:
            t0 = trio.current_time()
            other = await sup.add(TaskSpec.once("other", cleanup_for, 2.0, cleaned))
            raiser = await sup.add(TaskSpec.restartable("raiser", raising_after(1.0, exc)))
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                body_cancelled.append(trio.current_time())
                raise
    assert info.value is exc  # bare: not wrapped in a group
    if isinstance(exc, SystemExit):
        assert info.value.code == 3
    assert body_cancelled == [t0 + 1.0]
    assert cleaned == [t0 + 3.0]  # the other task got its grace
    assert trio.current_time() == t0 + 3.0
    assert other.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert raiser.outcome_nowait().kind is OutcomeKind.CANCELLED  # not retried, not FAILED
    assert len(recorder.of(EventKind.ATTEMPT_STARTING, name="raiser")) == 1
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]
    assert recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE)


async def test_keyboard_interrupt_stops_other_tasks_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After a task's KeyboardInterrupt, the other tasks end CANCELLED."""
    recorder = EventRecorder()
    waiters: list[TaskWaiter] = []
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        async with supervisor(recorder) as sup:
            waiters.append(await sup.add(TaskSpec.once("a", forever)))
            waiters.append(await sup.add(TaskSpec.once("b", deferring, 3.0)))
            await sup.add(TaskSpec.once("ki", raising_after(1.0, KeyboardInterrupt())))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await trio.sleep_forever()
    assert [w.outcome_nowait().kind for w in waiters] == [OutcomeKind.CANCELLED] * 2
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]
    assert recorder.kinds(EventKind.GRACE_EXCEEDED) == []


async def test_keyboard_interrupt_takes_precedence_over_grace_exceeded(
    autojump_clock: Any,
) -> None:
    recorder = EventRecorder()

    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        async with supervisor(recorder) as sup:
            t0 = trio.current_time()
            stuck = await sup.add(TaskSpec.once("stubborn", stubborn, 10.0))
            await sup.add(TaskSpec.once("raiser", raising_after(1.0, KeyboardInterrupt())))
            await trio.sleep_forever()
    assert stuck.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    [exceeded] = recorder.of(EventKind.GRACE_EXCEEDED)
    assert exceeded.time == t0 + 1.0 + 5.0
    assert trio.current_time() == t0 + 10.0  # the physical exit of the stubborn task


async def test_keyboard_interrupt_wins_over_grace_exceeded_at_the_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A task's KeyboardInterrupt propagates even when the shutdown had to force."""
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("slow", deferring, 100.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await sup.add(TaskSpec.once("ki", raising_after(1.0, KeyboardInterrupt())))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await trio.sleep_forever()
    assert trio.current_time() == 6.0


async def test_keyboard_interrupt_during_shutdown_propagates_bare(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A KeyboardInterrupt raised by a task while the shutdown runs still propagates."""

    async def interrupt_on_stop() -> None:
        with current_context().defer_cancel():
            await current_context().wait_cancel_requested()
            await trio.sleep(2.0)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as excinfo:  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("ki", interrupt_on_stop))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
    assert type(excinfo.value) is KeyboardInterrupt
    assert trio.current_time() == 2.0


async def test_keyboard_interrupt_in_a_task_propagates_bare_from_run(autojump_clock: Any) -> None:
    cleaned: list[float] = []
    specs = [
        TaskSpec.once("other", cleanup_for, 2.0, cleaned),
        TaskSpec.once("raiser", raising_after(1.0, KeyboardInterrupt())),
    ]
    t0 = trio.current_time()
    with pytest.raises(KeyboardInterrupt):
        await run(specs, supervisor_config())
    assert cleaned == [t0 + 3.0]
    assert trio.current_time() == t0 + 3.0


async def test_keyboard_interrupt_from_run_ends_when_the_other_tasks_stopped(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``run()`` shuts down and re-raises a task's KeyboardInterrupt bare."""
    with pytest.raises(KeyboardInterrupt) as excinfo:
        await run(
            [
                TaskSpec.once("a", forever),
                TaskSpec.once("ki", raising_after(1.0, KeyboardInterrupt())),
            ],
            supervisor_config(),
        )
    assert type(excinfo.value) is KeyboardInterrupt
    assert trio.current_time() == 1.0


async def test_keyboard_interrupt_in_the_body_propagates_after_a_graceful_shutdown(
    autojump_clock: Any,
) -> None:
    cleaned: list[float] = []
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        async with supervisor() as sup:
            t0 = trio.current_time()
            waiter = await sup.add(TaskSpec.once("other", cleanup_for, 2.0, cleaned))
            await settle()
            raise KeyboardInterrupt
    assert cleaned == [t0 + 2.0]
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_base_exception_group_from_a_child_task_propagates_as_raised(
    autojump_clock: Any,
) -> None:
    cleaned: list[float] = []

    async def spawns_an_interrupting_child() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(raising_after(1.0, KeyboardInterrupt()))
            await trio.sleep_forever()

    with pytest.raises(BaseExceptionGroup) as info:  # noqa: PT012
        async with supervisor() as sup:
            t0 = trio.current_time()
            other = await sup.add(TaskSpec.once("other", cleanup_for, 2.0, cleaned))
            await sup.add(TaskSpec.once("parent", spawns_an_interrupting_child))
            await trio.sleep_forever()
    assert info.value.subgroup(KeyboardInterrupt) is not None
    assert info.value.split(KeyboardInterrupt)[1] is None  # nothing else in the group
    assert cleaned == [t0 + 3.0]
    assert other.outcome_nowait().kind is OutcomeKind.CANCELLED


# -- finally blocks that await ----------------------------------------------------------------


async def test_shielded_finally_within_grace_completes(autojump_clock: Any) -> None:
    done: list[float] = []

    async def body() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2.0)
            done.append(trio.current_time())

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", body))
        await settle()
        t0 = trio.current_time()
        assert await sup.cancel("job") is True
        assert trio.current_time() == t0 + 2.0
        assert done == [t0 + 2.0]
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert sup.alive_snapshot() == ()


async def test_deferred_finally_within_grace_completes(autojump_clock: Any) -> None:
    done: list[float] = []
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", cleanup_for, 2.0, done))
        await settle()
        t0 = trio.current_time()
        assert await sup.cancel("job") is True
        assert done == [t0 + 2.0]
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_unprotected_await_in_finally_is_cancelled_at_once(autojump_clock: Any) -> None:
    reached: list[str] = []

    async def body() -> None:
        try:
            await trio.sleep_forever()
        finally:
            reached.append("finally")
            await trio.sleep(2.0)  # neither shielded nor deferred: cancelled here
            reached.append("after the await")

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", body))
        await settle()
        t0 = trio.current_time()
        await sup.cancel("job")
        assert trio.current_time() == t0
        assert reached == ["finally"]
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_shielded_finally_past_grace_is_force_aborted_and_waited_for(
    autojump_clock: Any,
) -> None:
    done: list[float] = []

    async def body() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(10.0)
            done.append(trio.current_time())

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", body))
        await settle()
        t0 = trio.current_time()
        assert await sup.cancel("job") is True
        # The outcome is committed at the grace deadline; the task is still in there.
        assert trio.current_time() == t0 + 5.0
        assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        assert sup.list() == ()
        assert sup.alive_snapshot() == ("job",)
        with pytest.raises(TaskNameInUseError):
            await sup.add(TaskSpec.once("job", forever))
        await sup.wait_idle()
        assert trio.current_time() == t0 + 10.0
        assert done == [t0 + 10.0]
        assert sup.alive_snapshot() == ()
        again = await sup.add(TaskSpec.once("job", Body(0.0)))
        assert (await again.wait()).value == "ok"


async def test_deferred_finally_past_grace_is_forced_out_at_the_deadline(
    autojump_clock: Any,
) -> None:
    done: list[float] = []
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", cleanup_for, 10.0, done))
        await settle()
        t0 = trio.current_time()
        await sup.cancel("job")
        assert trio.current_time() == t0 + 5.0
        assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        await sup.wait_idle()
        assert trio.current_time() == t0 + 5.0  # forced out at once: no physical overrun
        assert done == []  # the code after the forced block never ran


# -- tasks with their own nurseries ----------------------------------------------------------


async def test_child_tasks_are_cancelled_with_the_attempt(autojump_clock: Any) -> None:
    children_cancelled: list[float] = []

    async def child() -> None:
        try:
            await trio.sleep_forever()
        finally:
            children_cancelled.append(trio.current_time())

    async def parent() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(child)

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("parent", parent))
        await settle()
        t0 = trio.current_time()
        assert await sup.cancel("parent") is True
        assert children_cancelled == [t0] * 3
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert sup.alive_snapshot() == ()


async def test_child_tasks_are_cancelled_by_the_attempt_timeout(autojump_clock: Any) -> None:
    recorder = EventRecorder()
    cancelled: list[float] = []

    async def child() -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(trio.current_time())

    async def parent() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    async with supervisor(recorder) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(TaskSpec.once("parent", parent, timeout=2.0))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED
    assert isinstance(outcome.error, TimeoutError)
    assert cancelled == [t0 + 2.0]
    assert recorder.kinds(EventKind.ATTEMPT_TIMED_OUT) == [EventKind.ATTEMPT_TIMED_OUT]


async def test_child_task_error_fails_the_attempt_with_the_group(autojump_clock: Any) -> None:
    """A failing child: the attempt raises an ExceptionGroup, a retryable failure."""
    recorder = EventRecorder()
    siblings_cancelled: list[float] = []

    async def sibling() -> None:
        try:
            await trio.sleep_forever()
        finally:
            siblings_cancelled.append(trio.current_time())

    async def failing_child() -> None:
        await trio.sleep(1.0)
        raise ValueError("child broke")

    async def parent() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sibling)
            nursery.start_soon(failing_child)

    async with supervisor(recorder) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(
            TaskSpec.restartable(
                "parent", parent, max_retries=1, backoff=BackoffPolicy.constant(0.5)
            )
        )
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED
    assert isinstance(outcome.error, ExceptionGroup)
    [inner] = outcome.error.exceptions
    assert isinstance(inner, ValueError)
    assert outcome.reason == f"retry limit reached after 1 retry: {outcome.error}"
    assert siblings_cancelled == [t0 + 1.0, t0 + 2.5]  # retried once, after the backoff
    assert len(recorder.of(EventKind.ATTEMPT_FAILED, name="parent")) == 2


@pytest.mark.parametrize("inner", [FatalError("fatal child"), TaskCancelled("child gave up")])
async def test_steering_exceptions_inside_a_group_are_plain_failures(
    autojump_clock: Any, inner: Exception
) -> None:
    async def child() -> None:
        raise inner

    async def parent() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("parent", parent))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED
    assert isinstance(outcome.error, ExceptionGroup)
    assert outcome.error.exceptions == (inner,)


async def test_child_tasks_see_the_task_context(autojump_clock: Any) -> None:
    seen: list[tuple[str, int]] = []

    async def child() -> None:
        ctx = current_context()
        seen.append((ctx.name, ctx.attempt))

    async def parent() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    async with supervisor() as sup:
        await (await sup.add(TaskSpec.once("parent", parent))).wait()
    assert seen == [("parent", 1)]


# -- threads ------------------------------------------------------------------------------------


class Blocker:
    """A sync function for a worker thread: blocks until released (or a safety timeout)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self) -> str:
        self.started.set()
        self.release.wait(THREAD_TIMEOUT)
        self.finished.set()
        return "thread done"

    async def wait_started(self) -> None:
        assert await trio.to_thread.run_sync(self.started.wait, THREAD_TIMEOUT)

    async def release_and_join(self) -> None:
        self.release.set()
        assert await trio.to_thread.run_sync(self.finished.wait, THREAD_TIMEOUT)


async def test_abandoned_thread_lets_a_stopped_attempt_leave_at_once(autojump_clock: Any) -> None:
    blocker = Blocker()

    async def body() -> str:
        return await trio.to_thread.run_sync(blocker, abandon_on_cancel=True)

    try:
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("job", body))
            await blocker.wait_started()
            t0 = trio.current_time()
            assert await sup.cancel("job") is True
            assert trio.current_time() == t0
            assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
            # Physically done: nothing alive, the name is free; the thread runs on.
            assert sup.alive_snapshot() == ()
            assert sup.statistics().alive == 0
            assert not blocker.finished.is_set()
            again = await sup.add(TaskSpec.once("job", Body(0.0)))
            assert (await again.wait()).value == "ok"
    finally:
        await blocker.release_and_join()


async def test_abandoned_thread_in_a_deferred_block_is_left_at_the_force(
    autojump_clock: Any,
) -> None:
    blocker = Blocker()

    async def body() -> str:
        with current_context().defer_cancel():
            return await trio.to_thread.run_sync(blocker, abandon_on_cancel=True)

    try:
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("job", body))
            await blocker.wait_started()
            t0 = trio.current_time()
            assert await sup.cancel("job") is True
            assert trio.current_time() == t0 + 5.0
            assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
            await sup.wait_idle()
            assert trio.current_time() == t0 + 5.0
            assert sup.alive_snapshot() == ()
            assert not blocker.finished.is_set()
    finally:
        await blocker.release_and_join()


async def test_abandoned_thread_does_not_hold_up_shutdown(autojump_clock: Any) -> None:
    blocker = Blocker()

    async def body() -> str:
        return await trio.to_thread.run_sync(blocker, abandon_on_cancel=True)

    try:
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("job", body))
            await blocker.wait_started()
            t0 = trio.current_time()
        assert trio.current_time() == t0  # within grace, no error
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert sup.alive_snapshot() == ()
        assert not blocker.finished.is_set()
    finally:
        await blocker.release_and_join()


async def test_unabandoned_thread_keeps_a_stopped_attempt_alive_until_it_returns(
    mock_clock: Any,
) -> None:
    """Without abandon_on_cancel the stop waits for the thread (time frozen: within grace)."""
    blocker = Blocker()

    async def body() -> str:
        return await trio.to_thread.run_sync(blocker)

    try:
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("job", body))
            await blocker.wait_started()
            assert await sup.remove("job") is True
            await settle()
            assert sup.alive_snapshot() == ("job",)
            [info] = sup.list()
            assert info.state is TaskState.STOPPING
            with pytest.raises(trio.WouldBlock):
                waiter.outcome_nowait()
            await blocker.release_and_join()
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.CANCELLED  # however it ended, within grace
            await sup.wait_idle()
            assert sup.alive_snapshot() == ()
    finally:
        blocker.release.set()


async def test_unabandoned_thread_past_grace_is_force_aborted_and_keeps_its_name(
    autojump_clock: Any,
) -> None:
    blocker = Blocker()

    async def body() -> str:
        return await trio.to_thread.run_sync(blocker)

    try:
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("job", body))
            await blocker.wait_started()
            t0 = trio.current_time()
            assert await sup.cancel("job") is True
            # The thread is still blocked, so these virtual times are exact.
            assert trio.current_time() == t0 + 5.0
            assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
            assert sup.list() == ()
            assert sup.alive_snapshot() == ("job",)
            assert sup.statistics().alive == 1
            with pytest.raises(TaskNameInUseError):
                await sup.add(TaskSpec.once("job", forever))
            await blocker.release_and_join()
            await sup.wait_idle()
            assert sup.alive_snapshot() == ()
            again = await sup.add(TaskSpec.once("job", Body(0.0)))
            assert (await again.wait()).value == "ok"
    finally:
        blocker.release.set()


async def test_shutdown_waits_for_an_unabandoned_thread_and_reports_it_stuck(
    autojump_clock: Any,
) -> None:
    blocker = Blocker()
    recorder = EventRecorder()

    async def body() -> str:
        return await trio.to_thread.run_sync(blocker)

    async def release_when_forced() -> None:
        await recorder.wait_for(EventKind.GRACE_EXCEEDED)
        await blocker.release_and_join()

    errors: list[GraceExceededError] = []
    try:
        async with trio.open_nursery() as nursery:
            try:
                async with supervisor(recorder) as sup:
                    waiter = await sup.add(TaskSpec.once("job", body))
                    await blocker.wait_started()
                    nursery.start_soon(release_when_forced)
            except GraceExceededError as exc:
                errors.append(exc)
    finally:
        blocker.release.set()
    [error] = errors
    assert error.stuck == ("job",)
    assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert blocker.finished.is_set()  # the shutdown waited for the physical exit
    assert sup.alive_snapshot() == ()


# -- the event bus at capacity -----------------------------------------------------------------


async def test_bus_at_capacity_drops_and_counts_and_tasks_are_unaffected(
    autojump_clock: Any,
) -> None:
    recorder = EventRecorder()
    async with supervisor(recorder, bus_capacity=1) as sup:
        t0 = trio.current_time()
        waiters = await sup.add_batch([TaskSpec.once(f"job-{i}", Body(1.0)) for i in range(5)])
        for waiter in waiters:
            assert (await waiter.wait()).value == "ok"
        assert trio.current_time() == t0 + 1.0
        assert sup.statistics().events_dropped > 0
    stats = sup.statistics()
    # Bus drops are counted once; the subscriber itself dropped nothing.
    assert stats.subscriber_dropped == {"EventRecorder": 0}
    assert len(recorder.events) + stats.events_dropped == stats.events_published
    seqs = [e.seq for e in recorder.events]
    assert seqs == sorted(set(seqs))


async def test_tasks_keep_exact_timing_with_every_kind_of_bad_subscriber(
    autojump_clock: Any,
) -> None:
    subscribers = [RaisingSubscriber(), BlockingSubscriber(), SlowSubscriber(10.0)]
    body = Body(0.5)
    async with supervisor(
        subscribers=subscribers, bus_capacity=1, subscriber_shutdown_timeout=0
    ) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(TaskSpec("periodic", body, restart=RestartPolicy.always(1.0)))
        await trio.sleep(10.0)
        await sup.cancel("periodic")
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert trio.current_time() == t0 + 10.0
        # Starts at 0, 1.5, 3, ..., 9 (a 0.5 s attempt, then the 1 s interval); the
        # last one ended at 9.5.
        assert body.started == body.finished == 7
        t_exit = trio.current_time()
    assert trio.current_time() == t_exit  # subscriber_shutdown_timeout=0: no drain wait


async def test_regression_second_base_exception_is_logged_not_swallowed(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the first BaseException propagates; a later one is logged with its traceback."""

    async def exits_during_the_shutdown() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with current_context().defer_cancel():
                await trio.sleep(1.0)
            raise SystemExit(4)

    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("raiser", raising_after(1.0, KeyboardInterrupt())))
            late = await sup.add(TaskSpec.once("late", exits_during_the_shutdown))
            await trio.sleep_forever()
    assert late.outcome_nowait().kind is OutcomeKind.CANCELLED
    [record] = [r for r in caplog.records if r.name == "trio_taskvisor"]
    assert record.levelname == "ERROR"
    assert "SystemExit raised during the shutdown after KeyboardInterrupt" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], SystemExit)


# -- exception groups that mix trio.Cancelled with other exceptions ------------------------
# What remains of a group once trio.Cancelled is removed decides. Only
# Exceptions left: an ordinary failure. A non-Exception BaseException left: the supervisor
# goes down. No trio.Cancelled ever leaves the scope it belongs to.


def nursery_whose_child_cleanup_raises(exc: BaseException) -> Any:
    """A body running a nursery whose child raises ``exc`` while being cancelled."""

    async def body() -> None:
        async def child() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await trio.sleep_forever()

    return body


async def test_regression_stopped_task_whose_nursery_raises_ends_cancelled(
    autojump_clock: Any,
) -> None:
    """A stop that makes the task's own nursery raise [Cancelled, ValueError] is a stop."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        waiter = await sup.add(
            TaskSpec.once("t", nursery_whose_child_cleanup_raises(ValueError("cleanup failed")))
        )
        await trio.sleep(1.0)
        assert await sup.cancel(waiter.id) is True
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
        # The supervisor is unharmed: later work runs.
        after = await sup.add(TaskSpec.once("ok", trio.sleep, 0))
        assert (await after.wait()).kind is OutcomeKind.COMPLETED
    [failed] = recorder.of(EventKind.ATTEMPT_FAILED, name="t")
    assert failed.reason == "Exceptions from Trio nursery (1 sub-exception)"  # str(error)
    assert trio.current_time() == 1.0


async def test_regression_replaced_owner_whose_nursery_raises_lets_the_replacement_run(
    autojump_clock: Any,
) -> None:
    """REPLACE of an owner whose nursery raises on the stop: the replacement runs."""
    async with supervisor(controller=ControllerConfig()) as sup:
        body = nursery_whose_child_cleanup_raises(ValueError("cleanup failed"))
        owner = await sup.submit(ControllerSpec.queue(TaskSpec.once("a", body), slot="k"))
        await trio.sleep(1.0)
        newer = await sup.submit(
            ControllerSpec.replace(TaskSpec.once("b", trio.sleep, 1.0), slot="k")
        )
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert (await newer.wait()).kind is OutcomeKind.COMPLETED
    assert trio.current_time() == 2.0


async def test_mixed_group_on_a_failing_attempt_without_a_stop_is_a_retryable_failure(
    autojump_clock: Any,
) -> None:
    """[Cancelled, ValueError] from a child's own cancel scope is an ordinary failure."""

    async def body() -> None:
        # The child's Cancelled belongs to this scope; the error joins it in a group that
        # leaves the scope: what reaches the actor is a plain ExceptionGroup.
        attempt = current_context().attempt
        if attempt > 1:
            return
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(nursery_whose_child_cleanup_raises(ValueError("x")))
                await trio.sleep(1.0)
                scope.cancel()
                await trio.sleep_forever()

    async with supervisor() as sup:
        spec = TaskSpec.restartable("t", body, backoff=BackoffPolicy.constant(1.0))
        outcome = await (await sup.add(spec)).wait()
    assert outcome.kind is OutcomeKind.COMPLETED
    assert trio.current_time() == 2.0


async def test_stopped_task_whose_nursery_raises_keyboard_interrupt_takes_it_down(
    autojump_clock: Any,
) -> None:
    """[Cancelled, KeyboardInterrupt] on a stop: the KeyboardInterrupt propagates, no Cancelled."""
    with pytest.raises(BaseExceptionGroup) as info:  # noqa: PT012
        async with supervisor() as sup:
            waiter = await sup.add(
                TaskSpec.once("t", nursery_whose_child_cleanup_raises(KeyboardInterrupt()))
            )
            await trio.sleep(1.0)
            await sup.remove(waiter.id)
            await trio.sleep_forever()
    assert info.value.split(KeyboardInterrupt)[1] is None  # no Cancelled left in it
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


class NurserySubscriber:
    """``on_event`` runs a nursery whose child's cleanup raises, on ``TASK_ADDED``."""

    name = "nursery"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.seen: list[EventKind] = []

    async def on_event(self, event: Any) -> None:
        self.seen.append(event.kind)
        if event.kind is EventKind.TASK_ADDED:
            await nursery_whose_child_cleanup_raises(self.exc)()


async def test_regression_subscriber_nursery_raising_at_the_drain_deadline_is_isolated(
    autojump_clock: Any,
) -> None:
    """Cancelled at the drain deadline, [ValueError, Cancelled] from on_event leaks nothing."""
    subscriber = NurserySubscriber(ValueError("cleanup failed"))
    async with supervisor(subscribers=[subscriber], subscriber_shutdown_timeout=3.0) as sup:
        await sup.add(TaskSpec.once("t", trio.sleep, 1.0))
    assert trio.current_time() == 3.0  # the task stops at once; then the 3 s drain deadline


async def test_subscriber_nursery_raising_keyboard_interrupt_at_the_drain_deadline(
    autojump_clock: Any,
) -> None:
    """[KeyboardInterrupt, Cancelled] from on_event: the KeyboardInterrupt, no Cancelled."""
    subscriber = NurserySubscriber(KeyboardInterrupt())
    with pytest.raises(BaseExceptionGroup) as info:
        async with supervisor(subscribers=[subscriber], subscriber_shutdown_timeout=3.0) as sup:
            await sup.add(TaskSpec.once("t", trio.sleep, 1.0))
    assert info.value.split(KeyboardInterrupt)[1] is None


async def test_subscriber_mixed_group_while_running_is_an_isolated_failure(
    autojump_clock: Any,
) -> None:
    """A group of [Cancelled, ValueError] whose Cancelled is on_event's own: SUBSCRIBER_FAILED."""

    class Failing:
        name = "failing"

        async def on_event(self, event: Any) -> None:
            if event.kind is EventKind.TASK_ADDED:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(nursery_whose_child_cleanup_raises(ValueError("x")))
                        await trio.lowlevel.checkpoint()
                        scope.cancel()

    recorder = EventRecorder()
    async with supervisor(recorder, subscribers=[Failing()]) as sup:
        await (await sup.add(TaskSpec.once("t", trio.sleep, 1.0))).wait()
    [failed] = recorder.of(EventKind.SUBSCRIBER_FAILED)
    assert failed.name == "failing"


async def test_body_group_mixing_an_outer_cancelled_propagates_to_its_scope(
    autojump_clock: Any,
) -> None:
    """A body's [Cancelled, ValueError] leaves unchanged; its scope takes the Cancelled."""
    with pytest.raises(ExceptionGroup) as info:  # noqa: PT012
        with trio.move_on_after(1.0):
            async with supervisor() as sup:
                await sup.add(TaskSpec.once("t", forever))
                await nursery_whose_child_cleanup_raises(ValueError("body cleanup"))()
    assert info.value.split(trio.Cancelled)[0] is None
    assert info.value.split(ValueError)[0] is not None
    assert trio.current_time() == 1.0


async def test_body_group_holding_a_keyboard_interrupt_propagates_as_raised(
    autojump_clock: Any,
) -> None:
    """A body's group of [KeyboardInterrupt] propagates after the graceful shutdown."""
    with pytest.raises(BaseExceptionGroup) as info:  # noqa: PT012
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("t", forever))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(raising_after(1.0, KeyboardInterrupt()))
                await trio.sleep_forever()
    assert info.value.split(KeyboardInterrupt)[1] is None
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_cancelled_keyed_call_whose_body_nursery_raises_on_the_stop(
    autojump_clock: Any,
) -> None:
    """A run_in_slot caller cancelled while its work's nursery raises on the stop leaves cleanly."""
    async with supervisor(controller=ControllerConfig()) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("k", nursery_whose_child_cleanup_raises(ValueError("x")))
        assert scope.cancelled_caught
        assert trio.current_time() == 1.0
        assert await sup.run_in_slot("k", trio.sleep, 0) is None  # the slot is free again


async def test_regression_an_internal_error_propagates_alone(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor's own loop that raises (a bug: here the registry's commit of an
    outcome, patched to raise) ends ``open_supervisor`` with that error alone. Before,
    the shutdown's start then failed too, with trio's "Nursery is closed to new
    arrivals", in the same group."""
    bug = ValueError("an internal bug")

    def commit(*args: object) -> None:
        raise bug

    async def service() -> None:
        async with open_supervisor() as sup:
            monkeypatch.setattr(Registry, "_commit", commit)
            await sup.add(TaskSpec.once("quick", trio.sleep, 1.0))
            await trio.sleep(5.0)

    with pytest.raises(ExceptionGroup) as info:
        await service()
    # the bug, and nothing else, in trio's nested groups
    assert info.value.subgroup(lambda exc: exc is bug) is not None
    others = info.value.subgroup(lambda e: not isinstance(e, BaseExceptionGroup) and e is not bug)
    assert others is None
    assert trio.current_time() == 1.0
