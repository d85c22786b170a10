"""The one shared graceful shutdown, leaving ``open_supervisor``, and ``run()``.

A KeyboardInterrupt (or any other BaseException) from a task, the body or a subscriber,
and the shutdown it starts, are in ``test_faults.py``.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    DeadlockError,
    EventKind,
    GraceExceededError,
    OutcomeKind,
    Supervisor,
    SupervisorClosedError,
    TaskEvent,
    TaskNameInUseError,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
    run,
)
from trio_taskvisor.testing import EventRecorder

from helpers import deferring, forever, returns_done, stubborn, supervisor, supervisor_config

# ``pytest.raises`` wraps whole supervisor blocks (PT012): shutdown errors and
# re-raised exceptions surface only when the block is left.


class BlockingOnKind:
    """Blocks forever on the first event of ``kind``; records when it was cancelled."""

    def __init__(self, kind: EventKind) -> None:
        self.kind = kind
        self.cancelled_at: list[float] = []

    async def on_event(self, event: TaskEvent) -> None:
        if event.kind is self.kind:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self.cancelled_at.append(trio.current_time())
                raise


# -- the shared result -------------------------------------------------------------------


async def test_shutdown_returns_none_when_all_stop_within_grace(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``shutdown()`` returns None, now and later, when no task had to be forced."""
    async with supervisor() as sup:
        await sup.add(TaskSpec.once("t", deferring, 3.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.shutdown()
        assert trio.current_time() == 3.0
        await sup.shutdown()


async def test_stopped_tasks_leave_no_reference_cycles(autojump_clock: trio.abc.Clock) -> None:
    """Tasks stopped by the shutdown leave nothing to the garbage collector: a frame of a
    ``Cancelled``'s traceback that held the exception made a cycle of about forty
    objects per task, and a shutdown of 10k tasks spent half its time collecting them."""
    gc.collect()
    gc.disable()
    try:
        async with supervisor() as sup:
            await sup.add_batch([TaskSpec.once(f"t{i}", trio.sleep_forever) for i in range(50)])
            await trio.testing.wait_all_tasks_blocked()
        found = gc.collect()
    finally:
        gc.enable()
    assert found < 50  # less than one object per task (it was 2107)


async def test_concurrent_shutdown_callers_share_one_result(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Concurrent and later callers each get a GraceExceededError with the same values."""
    errors: list[GraceExceededError] = []

    async def call(sup: Any) -> None:
        with pytest.raises(GraceExceededError) as excinfo:
            await sup.shutdown()
        errors.append(excinfo.value)
        assert trio.current_time() == 5.0

    with pytest.raises(GraceExceededError):  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("t", deferring, 100.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(call, sup)
            await call(sup)
    assert len({id(error) for error in errors}) == 4
    assert {(error.grace, error.stuck) for error in errors} == {(5.0, ("t",))}


async def test_stuck_names_are_sorted(autojump_clock: trio.abc.Clock) -> None:
    """``GraceExceededError.stuck`` lists the forced tasks sorted by name."""
    with pytest.raises(GraceExceededError) as excinfo:  # noqa: PT012
        async with supervisor() as sup:
            for name in ("b", "c", "a"):
                await sup.add(TaskSpec.once(name, deferring, 100.0))
                await trio.testing.wait_all_tasks_blocked()  # the body is running
            await sup.add(TaskSpec.once("polite", forever))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
    assert excinfo.value.stuck == ("a", "b", "c")
    assert excinfo.value.grace == 5.0


async def test_grace_zero_lists_every_running_task_as_stuck(
    autojump_clock: trio.abc.Clock,
) -> None:
    """With ``grace=0`` every task still running at shutdown is forced and stuck."""
    with pytest.raises(GraceExceededError) as excinfo:  # noqa: PT012
        async with supervisor(grace=0.0) as sup:
            await sup.add(TaskSpec.once("x", forever))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await sup.add(TaskSpec.once("y", forever))
            await trio.testing.wait_all_tasks_blocked()
    assert excinfo.value.stuck == ("x", "y")


async def test_cancelled_shutdown_caller_does_not_stop_shutdown(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cancelling a ``shutdown()`` caller leaves the shutdown running to its end."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 3.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        with trio.move_on_after(1.0) as scope:
            await sup.shutdown()
        assert scope.cancelled_caught
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 3.0
        with pytest.raises(SupervisorClosedError):
            await sup.add(TaskSpec.once("late", returns_done))


async def test_shutdown_with_no_task_returns_at_once(autojump_clock: trio.abc.Clock) -> None:
    """A shutdown with nothing registered ends without waiting."""
    async with supervisor() as sup:
        await sup.shutdown()
        assert trio.current_time() == 0.0


async def test_task_calling_shutdown_is_stopped_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A task that starts the shutdown itself is soft-stopped like the others."""

    async def body() -> None:
        await current_context().supervisor.shutdown()

    async with supervisor() as sup:
        other = await sup.add(TaskSpec.once("other", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert (await other.wait()).kind is OutcomeKind.CANCELLED
        with pytest.raises(SupervisorClosedError):
            sup.add_nowait(TaskSpec.once("late", returns_done))


@pytest.mark.parametrize("shielded", ["cancel-scope", "defer-cancel"])
async def test_a_task_calling_shutdown_in_a_shielded_scope_gets_deadlock_error(
    autojump_clock: trio.abc.Clock, shielded: str
) -> None:
    """The stop cannot reach a shielded wait, and the shutdown waits for the task to end:
    ``DeadlockError`` as the shutdown stops it, and the task ends ``CANCELLED``. Before,
    the task and the shutdown waited for each other: for ever in a shielded scope (the
    deadline bounds it here), until the grace deadline forced it in a ``defer_cancel()``
    block (``FORCE_ABORTED``, and a ``GraceExceededError`` of the shutdown)."""
    raised: list[tuple[float, str]] = []

    async def body() -> None:
        if shielded == "cancel-scope":
            scope: Any = trio.CancelScope(shield=True, deadline=100.0)
        else:
            scope = current_context().defer_cancel()
        with scope:
            try:
                await current_context().supervisor.shutdown()
            except DeadlockError as exc:
                raised.append((trio.current_time(), str(exc)))

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
    assert trio.current_time() == 0.0
    assert raised == [
        (
            0.0,
            f"sup.shutdown() in task 't' ({waiter.id}) cannot wait for the shutdown, which "
            "waits for this task to end: it has begun, and has asked this task to stop",
        )
    ]


# -- intake --------------------------------------------------------------------------------


async def _add(sup: Any, method: str) -> None:
    spec = TaskSpec.once("late", returns_done)
    if method == "add":
        await sup.add(spec)
        await trio.testing.wait_all_tasks_blocked()  # the body is running
    elif method == "add_nowait":
        sup.add_nowait(spec)
    else:
        await sup.add_batch([spec])


@pytest.mark.parametrize("method", ["add", "add_nowait", "add_batch"])
async def test_intake_during_shutdown_raises_closed(
    autojump_clock: trio.abc.Clock, method: str
) -> None:
    """Intake after shutdown began raises SupervisorClosedError."""
    async with supervisor() as sup:
        await sup.add(TaskSpec.once("t", deferring, 3.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.shutdown)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(SupervisorClosedError):
                await _add(sup, method)
            assert sup.list() != ()


@pytest.mark.parametrize("method", ["add", "add_nowait", "add_batch"])
async def test_intake_after_shutdown_raises_closed(
    autojump_clock: trio.abc.Clock, method: str
) -> None:
    """Intake after the shutdown finished raises SupervisorClosedError."""
    async with supervisor() as sup:
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            await _add(sup, method)


async def test_supervisor_closed_error_is_a_closed_resource_error() -> None:
    """SupervisorClosedError can be caught as trio.ClosedResourceError."""
    async with supervisor() as sup:
        await sup.shutdown()
        with pytest.raises(trio.ClosedResourceError):
            await sup.add(TaskSpec.once("late", returns_done))


async def test_add_accepted_before_shutdown_is_processed(autojump_clock: trio.abc.Clock) -> None:
    """An add already on the channel when shutdown begins is admitted, then stopped."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        waiter = sup.add_nowait(TaskSpec.once("t", forever))
        batch_waiter = sup.add_nowait(TaskSpec.once("u", forever))
        await sup.shutdown()
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert batch_waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert [e.name for e in recorder.of(EventKind.TASK_ADDED)] == ["t", "u"]
    assert recorder.of(EventKind.TASK_ADD_FAILED) == []


# -- leaving open_supervisor -----------------------------------------------------------------


async def test_leaving_block_publishes_shutdown_requested(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Leaving the ``open_supervisor`` block publishes SHUTDOWN_REQUESTED."""
    recorder = EventRecorder()
    async with supervisor(recorder):
        pass
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED, EventKind.ALL_STOPPED_WITHIN_GRACE) == [
        EventKind.SHUTDOWN_REQUESTED,
        EventKind.ALL_STOPPED_WITHIN_GRACE,
    ]


async def test_leaving_block_stops_every_task(autojump_clock: trio.abc.Clock) -> None:
    """Leaving the block soft-stops every task: each ends CANCELLED."""
    async with supervisor() as sup:
        waiters = [await sup.add(TaskSpec.once(name, forever)) for name in "abc"]
        await trio.sleep(2.0)
    assert trio.current_time() == 2.0
    assert {w.outcome_nowait().kind for w in waiters} == {OutcomeKind.CANCELLED}


async def test_body_exception_propagates_unwrapped(autojump_clock: trio.abc.Clock) -> None:
    """An exception raised in the body reaches the caller bare, after the shutdown."""
    with pytest.raises(ValueError, match="body") as excinfo:  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("t", deferring, 3.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            raise ValueError("body")
    assert type(excinfo.value) is ValueError
    assert trio.current_time() == 3.0


async def test_body_exception_wins_over_grace_exceeded(autojump_clock: trio.abc.Clock) -> None:
    """When the body raised and grace was exceeded, the body's exception propagates bare."""
    recorder = EventRecorder()
    with pytest.raises(ValueError, match="body") as excinfo:  # noqa: PT012
        async with supervisor(recorder) as sup:
            await sup.add(TaskSpec.once("t", deferring, 100.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            raise ValueError("body")
    assert type(excinfo.value) is ValueError
    assert recorder.kinds(EventKind.GRACE_EXCEEDED) == [EventKind.GRACE_EXCEEDED]
    assert trio.current_time() == 5.0


async def test_grace_exceeded_propagates_bare_from_block(autojump_clock: trio.abc.Clock) -> None:
    """A shutdown that forced tasks raises a bare GraceExceededError from the block."""
    with pytest.raises(GraceExceededError) as excinfo:  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("t", deferring, 100.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
    assert type(excinfo.value) is GraceExceededError
    assert excinfo.value.stuck == ("t",)


async def test_outer_cancellation_still_gets_full_grace(autojump_clock: trio.abc.Clock) -> None:
    """Cancelling the scope around ``open_supervisor`` still grants the whole grace."""
    waiters: list[TaskWaiter] = []
    with trio.move_on_after(1.0) as scope:
        async with supervisor() as sup:
            waiters.append(await sup.add(TaskSpec.once("t", deferring, 100.0)))
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() == 6.0
    assert waiters[0].outcome_nowait().kind is OutcomeKind.FORCE_ABORTED


_CANCELLED_AT_START = """
import sys, trio, trio.testing
from trio_taskvisor import TaskSpec, open_supervisor

async def forever():
    await trio.sleep_forever()

async def main(how, handle_signals):
    with trio.CancelScope() as scope:
        if how == "before":
            scope.cancel()

        async def cancel():  # a sibling that fails at once, as a service's may
            scope.cancel()

        async with trio.open_nursery() as nursery:
            if how == "during":
                nursery.start_soon(cancel)  # runs while the background starts
            async with open_supervisor(handle_signals=handle_signals) as sup:
                print("entered at", trio.current_time())
                await sup.add(TaskSpec.once("t", forever))  # a checkpoint: cancelled here
                print("added")
    print("cancelled_caught", scope.cancelled_caught, "at", trio.current_time())

trio.run(main, sys.argv[1], sys.argv[2] == "1", clock=trio.testing.MockClock(autojump_threshold=0))
"""


@pytest.mark.parametrize("handle_signals", [False, True])
@pytest.mark.parametrize("how", ["before", "during"])
def test_a_caller_cancelled_as_the_supervisor_starts_gets_its_cancellation(
    how: str, handle_signals: bool
) -> None:
    """The scope around ``open_supervisor`` cancelled before it is entered, or while its
    background starts (a sibling that fails at once, in a service's nursery): the body
    runs to its first checkpoint (as a nursery's does), the shutdown runs, and the
    cancellation reaches the caller's scope. Before, the start waited for ever, Ctrl+C
    and SIGTERM too: the background shields itself before it reports itself started,
    and trio ignores that report under a cancelled start (a child process here, as the
    old code hung beyond any deadline of its own run)."""
    result = subprocess.run(
        [sys.executable, "-c", _CANCELLED_AT_START, how, str(int(handle_signals))],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == ["entered at 0.0", "cancelled_caught True at 0.0"]


async def test_outer_cancellation_lets_deferred_work_finish(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After an outer cancellation, deferred work that ends within grace ends CANCELLED."""
    waiters: list[TaskWaiter] = []
    with trio.move_on_after(1.0):
        async with supervisor() as sup:
            waiters.append(await sup.add(TaskSpec.once("t", deferring, 3.0)))
            await trio.sleep_forever()
    assert trio.current_time() == 3.0
    assert waiters[0].outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_already_stopping_task_keeps_later_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A task stopping before shutdown gets the later, shared deadline and is stuck."""
    with pytest.raises(GraceExceededError) as excinfo:  # noqa: PT012
        async with supervisor() as sup:
            waiter = await sup.add(TaskSpec.once("t", deferring, 100.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await sup.remove("t")
            await trio.sleep(2.0)
            await sup.shutdown()
    assert trio.current_time() == 7.0
    assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert excinfo.value.stuck == ("t",)


async def test_regression_task_forced_before_shutdown_still_running_at_its_deadline_is_stuck(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Forced before shutdown and still running at the shared deadline: stuck, GRACE_EXCEEDED."""
    recorder = EventRecorder()
    with pytest.raises(GraceExceededError) as excinfo:  # noqa: PT012
        async with supervisor(recorder) as sup:
            waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await sup.remove("t")
            await waiter.wait()  # forced at 5.0; the shutdown begins then
    assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
    assert trio.current_time() == 20.0  # its physical exit
    assert excinfo.value.stuck == ("t",)
    [exceeded] = recorder.of(EventKind.GRACE_EXCEEDED)
    assert exceeded.time == 10.0  # the shared deadline: 5.0 + grace
    assert recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE) == []
    waiting = [r for r in caplog.records if "physical exit" in r.getMessage()]
    assert len(waiting) == 1
    assert waiting[0].levelname == "WARNING"
    assert "'t'" in waiting[0].getMessage()


async def test_task_forced_before_shutdown_that_exits_within_the_shared_grace_is_not_stuck(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Forced before shutdown, it exits before the shared deadline: all stopped within grace."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 8.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await waiter.wait()  # forced at 5.0
    assert trio.current_time() == 8.0
    [stopped] = recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE)
    assert stopped.time == 8.0  # published once the forced work has exited
    assert recorder.of(EventKind.GRACE_EXCEEDED) == []
    assert len([r for r in caplog.records if "physical exit" in r.getMessage()]) == 1


async def test_shutdown_logs_once_the_forced_tasks_it_waits_for(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Tasks forced by the shutdown itself and still running are named in one warning."""
    with pytest.raises(GraceExceededError):  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("b", stubborn, 20.0))
            await sup.add(TaskSpec.once("a", stubborn, 30.0))
            await trio.testing.wait_all_tasks_blocked()
    [waiting] = [r for r in caplog.records if "physical exit" in r.getMessage()]
    assert "'a', 'b'" in waiting.getMessage()


async def test_shutdown_names_forced_tasks_only_once_they_linger(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``defer_cancel`` block the force unshields exits at once: no warning for it (it
    named a task that had left by the next line of the log). One that runs on (its own
    shield) is named once ``EXIT_WAIT_WARNING`` has passed, and once only."""
    logged_at: list[float] = []

    def note_the_time(record: logging.LogRecord) -> bool:
        logged_at.append(trio.current_time())
        return True

    caplog.handler.addFilter(note_the_time)
    with pytest.raises(GraceExceededError) as excinfo:  # noqa: PT012
        async with supervisor() as sup:
            await sup.add(TaskSpec.once("deferring", deferring, 100.0))
            await sup.add(TaskSpec.once("stubborn", stubborn, 7.5))
            await trio.testing.wait_all_tasks_blocked()
    assert excinfo.value.stuck == ("deferring", "stubborn")
    assert trio.current_time() == 7.5  # the stubborn task's physical exit
    [(at, waiting)] = [
        (at, r)
        for at, r in zip(logged_at, caplog.records, strict=True)
        if "physical exit" in r.getMessage()
    ]
    assert waiting.getMessage() == (
        "shutdown has waited 1 s for the physical exit of 1 force-aborted task(s): 'stubborn'"
    )
    assert at == 6.0  # forced at 5.0


async def test_all_stopped_within_grace_event(autojump_clock: trio.abc.Clock) -> None:
    """A shutdown without forcing publishes ALL_STOPPED_WITHIN_GRACE, not GRACE_EXCEEDED."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.add(TaskSpec.once("t", deferring, 3.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
    [event] = recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE)
    assert event.time == 3.0
    assert recorder.of(EventKind.GRACE_EXCEEDED) == []


async def test_grace_exceeded_event(autojump_clock: trio.abc.Clock) -> None:
    """A shutdown that forces publishes GRACE_EXCEEDED at the deadline, naming the stuck."""
    recorder = EventRecorder()
    with pytest.raises(GraceExceededError):  # noqa: PT012
        async with supervisor(recorder) as sup:
            await sup.add(TaskSpec.once("t", deferring, 100.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
    [event] = recorder.of(EventKind.GRACE_EXCEEDED)
    assert event.time == 5.0
    assert event.reason is not None
    assert "t" in event.reason
    assert recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE) == []


# -- subscriber drain ----------------------------------------------------------------------


async def test_subscriber_drain_starts_after_every_actor_exits(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The drain deadline counts from the physical exit of the last actor."""
    blocker = BlockingOnKind(EventKind.TASK_ADDED)
    with pytest.raises(GraceExceededError):  # noqa: PT012
        async with supervisor(subscribers=[blocker], subscriber_shutdown_timeout=3.0) as sup:
            await sup.add(TaskSpec.once("t", stubborn, 20.0))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
    assert trio.current_time() == 23.0


async def test_blocked_subscriber_cancelled_at_drain_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An ``on_event`` still running at the drain deadline is cancelled then."""
    blocker = BlockingOnKind(EventKind.TASK_ADDED)
    async with supervisor(subscribers=[blocker], subscriber_shutdown_timeout=3.0) as sup:
        await sup.add(TaskSpec.once("t", deferring, 2.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
    assert blocker.cancelled_at == [5.0]
    assert trio.current_time() == 5.0


async def test_a_subscriber_that_outlives_the_drain_deadline_is_given_nothing_more(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An ``on_event`` that shields itself runs on past the drain deadline, but the
    events still queued then are dropped, as they are counted. Before, it was handed
    every one of them after the deadline: 33 s for 33 events of 1 s each."""

    class Flusher:
        def __init__(self) -> None:
            self.delivered: list[float] = []

        async def on_event(self, event: TaskEvent) -> None:
            with trio.CancelScope(shield=True):  # a flush it will not have cut in half
                await trio.sleep(1.0)
            self.delivered.append(trio.current_time())

    flusher = Flusher()
    async with supervisor(subscribers=[flusher], subscriber_shutdown_timeout=0.5) as sup:
        for i in range(5):
            await sup.add(TaskSpec.once(f"t{i}", trio.sleep, 0))
    assert trio.current_time() == 1.0
    assert flusher.delivered == [1.0]
    stats = sup.statistics()
    assert stats.events_dropped == stats.events_published - 1
    assert stats.subscriber_dropped == {"Flusher": stats.events_published - 1}


async def test_drained_subscriber_does_not_delay_shutdown(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A subscriber that keeps up lets the shutdown end when the last actor exits."""
    recorder = EventRecorder()
    async with supervisor(recorder, subscriber_shutdown_timeout=3.0) as sup:
        await sup.add(TaskSpec.once("t", deferring, 2.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
    assert trio.current_time() == 2.0
    assert recorder.kinds()[-1] is EventKind.ALL_STOPPED_WITHIN_GRACE


# -- run() ---------------------------------------------------------------------------------


async def test_run_returns_after_natural_completion(autojump_clock: trio.abc.Clock) -> None:
    """``run()`` returns once every task ended, at the last task's end."""

    async def nap(seconds: float) -> None:
        await trio.sleep(seconds)

    await run([TaskSpec.once("a", nap, 1.0), TaskSpec.once("b", nap, 4.0)], supervisor_config())
    assert trio.current_time() == 4.0


async def test_run_natural_completion_publishes_no_shutdown_requested(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Natural completion publishes ALL_STOPPED_WITHIN_GRACE but not SHUTDOWN_REQUESTED."""
    recorder = EventRecorder()
    await run([TaskSpec.once("a", returns_done)], supervisor_config(), subscribers=[recorder])
    assert recorder.of(EventKind.SHUTDOWN_REQUESTED) == []
    assert len(recorder.of(EventKind.ALL_STOPPED_WITHIN_GRACE)) == 1


async def test_run_raises_add_batch_errors(autojump_clock: trio.abc.Clock) -> None:
    """``run()`` raises what ``add_batch`` raises, bare, and runs no body."""
    ran: list[str] = []

    async def body() -> None:
        ran.append("ran")

    with pytest.raises(TaskNameInUseError) as excinfo:
        await run([TaskSpec.once("a", body), TaskSpec.once("a", body)], supervisor_config())
    assert type(excinfo.value) is TaskNameInUseError
    assert excinfo.value.name == "a"
    assert ran == []


async def test_run_raises_grace_exceeded_after_signal(autojump_clock: trio.abc.Clock) -> None:
    """A signalled ``run()`` raises GraceExceededError when it had to force a task."""
    started = trio.Event()

    async def body() -> None:
        started.set()
        await deferring(100.0)

    async def interrupt_after_start() -> None:
        await started.wait()
        await trio.testing.wait_all_tasks_blocked()
        signal.raise_signal(signal.SIGTERM)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupt_after_start)
        with pytest.raises(GraceExceededError) as excinfo:
            await run([TaskSpec.once("t", body)], supervisor_config(), handle_signals=True)
    assert excinfo.value.stuck == ("t",)
    assert trio.current_time() == 5.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_run_shuts_down_gracefully_on_signal(signum: signal.Signals) -> None:
    """With ``handle_signals``, SIGTERM/SIGINT start the graceful shutdown."""
    recorder = EventRecorder()

    async def terminate_after_start() -> None:
        await recorder.wait_for(EventKind.ATTEMPT_STARTING, name="b")
        await recorder.wait_for(EventKind.ATTEMPT_STARTING, name="a")
        await trio.testing.wait_all_tasks_blocked()
        os.kill(os.getpid(), signum)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(terminate_after_start)
        await run(
            [TaskSpec.once("a", forever), TaskSpec.once("b", forever)],
            supervisor_config(),
            subscribers=[recorder],
            handle_signals=True,
        )
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]
    finished = recorder.of(EventKind.TASK_FINISHED)
    assert {(e.name, e.outcome) for e in finished} == {
        ("a", OutcomeKind.CANCELLED),
        ("b", OutcomeKind.CANCELLED),
    }


# -- waiters -------------------------------------------------------------------------------


async def test_no_waiter_left_pending_after_shutdown(autojump_clock: trio.abc.Clock) -> None:
    """After the block, every waiter handed out has its outcome."""
    waiters: list[TaskWaiter] = []
    with pytest.raises(GraceExceededError):  # noqa: PT012
        async with supervisor(max_registered_tasks=3) as sup:
            waiters.append(await sup.add(TaskSpec.once("done", returns_done)))
            await trio.testing.wait_all_tasks_blocked()  # the body is running
            await waiters[0].wait()
            waiters.append(await sup.add(TaskSpec.once("cancelled", forever)))
            waiters.append(await sup.add(TaskSpec.once("forced", deferring, 100.0)))
            waiters.append(await sup.add(TaskSpec.once("stubborn", stubborn, 20.0)))
            await trio.testing.wait_all_tasks_blocked()  # the bodies are running
            waiters.append(sup.add_nowait(TaskSpec.once("over-limit", forever)))
            waiters.append(sup.add_nowait(TaskSpec.once("queued", forever)))
    kinds = [w.outcome_nowait().kind for w in waiters]
    assert kinds == [
        OutcomeKind.COMPLETED,
        OutcomeKind.CANCELLED,
        OutcomeKind.FORCE_ABORTED,
        OutcomeKind.FORCE_ABORTED,
        OutcomeKind.REJECTED,
        OutcomeKind.REJECTED,
    ]


class ShutsDown:
    """A subscriber that awaits ``sup.shutdown()`` when task ``t`` finishes, in its
    ``on_event`` or in a task it spawns there; it records what it gets."""

    def __init__(self, spawned: bool) -> None:
        self.spawned = spawned
        self.sup: Supervisor | None = None
        self.kinds: list[EventKind] = []
        self.error: BaseException | None = None

    async def on_event(self, event: TaskEvent) -> None:
        self.kinds.append(event.kind)
        if event.kind is EventKind.TASK_FINISHED:
            if self.spawned:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._shut_down)
            else:
                await self._shut_down()

    async def _shut_down(self) -> None:
        assert self.sup is not None
        try:
            await self.sup.shutdown()
        except DeadlockError as exc:
            self.error = exc


@pytest.mark.parametrize("spawned", [False, True], ids=["on_event", "spawned"])
async def test_shutdown_in_a_subscriber_begins_and_raises_deadlock_error(
    autojump_clock: trio.abc.Clock, spawned: bool
) -> None:
    """The shutdown ends by draining the subscribers: one whose ``on_event`` awaits
    ``sup.shutdown()`` begins it and gets ``DeadlockError`` at once, then every later
    event, and the shutdown ends without waiting for the drain's deadline. Before, the
    call waited until that deadline cancelled it, and the later events were lost."""
    subscriber = ShutsDown(spawned)
    async with open_supervisor(subscribers=[subscriber]) as sup:
        subscriber.sup = sup
        await sup.add(TaskSpec.once("t", trio.sleep, 1.0))
        await sup.wait_closing()
    assert trio.current_time() == 1.0
    assert isinstance(subscriber.error, DeadlockError)
    assert str(subscriber.error) == (
        "sup.shutdown() in the on_event of subscriber 'ShutsDown' cannot wait for the "
        "shutdown, which ends by draining the subscribers, this one included: it has "
        "begun, and ends once on_event returns"
    )
    finished = subscriber.kinds.index(EventKind.TASK_FINISHED)
    assert subscriber.kinds[finished + 1 :] == [
        EventKind.TASK_REMOVED,
        EventKind.SHUTDOWN_REQUESTED,
        EventKind.ALL_STOPPED_WITHIN_GRACE,
    ]


async def test_shutdown_in_another_supervisors_subscriber_waits(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A subscriber of supervisor A may await B's shutdown: B's drain does not wait
    for A's subscribers."""
    subscriber = ShutsDown(spawned=False)
    async with open_supervisor(subscribers=[subscriber]) as a, open_supervisor() as b:
        subscriber.sup = b
        await b.add(TaskSpec.once("u", trio.sleep, 2.0))
        await a.add(TaskSpec.once("t", trio.sleep, 1.0))
        await b.wait_closing()
        await a.wait_idle()
    assert subscriber.error is None
    assert b.closing
