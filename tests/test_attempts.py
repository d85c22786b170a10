"""How attempts end, retries, timeouts, permits, task context and outcomes.

Every async test runs on a fresh ``MockClock`` (``autojump_clock``) that starts at 0,
and opening a supervisor takes no virtual time, so the start times a fake records are
times since the supervisor opened. Events are checked after the ``open_supervisor``
block: its shutdown drains the subscribers, so every event has been delivered.
"""

from __future__ import annotations

import contextvars
import random
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    BackoffSource,
    EventKind,
    FatalError,
    Jitter,
    OutcomeError,
    OutcomeKind,
    RejectionKind,
    RestartPolicy,
    SupervisorConfig,
    TaskCancelled,
    TaskFailure,
    TaskOutcome,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

from helpers import ATTEMPT_END_KINDS, rejected, run_spec, starts

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")

ONE_SECOND = BackoffPolicy.constant(1.0)


# -- fakes and helpers -------------------------------------------------------------------


class Script:
    """A task whose n-th attempt plays the n-th step; the last step repeats.

    Each attempt records its start time, sleeps ``duration``, then raises the step if
    it is an exception and returns it otherwise.
    """

    def __init__(self, *steps: object, duration: float = 0.0) -> None:
        self.steps = steps
        self.duration = duration
        self.starts: list[float] = []

    async def __call__(self) -> object:
        self.starts.append(trio.current_time())
        step = self.steps[min(len(self.starts), len(self.steps)) - 1]
        if self.duration:
            await trio.sleep(self.duration)
        if isinstance(step, BaseException):
            raise step
        return step


class ForeverRecordingStarts:
    """A task that records its start times and sleeps until it is stopped."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    async def __call__(self) -> None:
        self.starts.append(trio.current_time())
        await trio.sleep_forever()


# -- a returned value --------------------------------------------------------------------


async def test_returned_value_completes(autojump_clock: trio.testing.MockClock) -> None:
    """An attempt that returns ends COMPLETED with the value and nothing else set."""
    run = await run_spec(TaskSpec.once("job", Script(42)))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value=42)


async def test_success_is_not_retried_under_on_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ON_FAILURE stops after the first success."""
    fn = Script("ok")
    run = await run_spec(TaskSpec.restartable("job", fn))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")
    assert fn.starts == [0.0]


# -- FatalError --------------------------------------------------------------------------


class ConfigProblem(FatalError):
    pass


@pytest.mark.parametrize(
    "restart",
    [RestartPolicy.NEVER, RestartPolicy.ON_FAILURE, RestartPolicy.always(1.0)],
    ids=repr,
)
async def test_fatal_error_ends_fatal_without_retry(
    autojump_clock: trio.testing.MockClock, restart: RestartPolicy
) -> None:
    """FatalError ends FATAL at once under every restart policy."""
    error = FatalError("bad config", exit_code=4)
    fn = Script(error)
    run = await run_spec(TaskSpec("job", fn, restart=restart, backoff=ONE_SECOND))
    assert run.outcome == TaskOutcome(
        OutcomeKind.FATAL, error=error, reason="bad config", exit_code=4
    )
    assert fn.starts == [0.0]


async def test_fatal_error_subclass_is_fatal(autojump_clock: trio.testing.MockClock) -> None:
    """A FatalError subclass is fatal too."""
    error = ConfigProblem("missing key")
    run = await run_spec(TaskSpec.restartable("job", Script(error)))
    assert run.outcome == TaskOutcome(OutcomeKind.FATAL, error=error, reason="missing key")


async def test_fatal_error_publishes_attempt_failed(autojump_clock: trio.testing.MockClock) -> None:
    """A fatal attempt publishes ATTEMPT_FAILED with the reason and exit code."""
    run = await run_spec(TaskSpec.once("job", Script(FatalError("bad", exit_code=9))))
    [event] = run.recorder.of(EventKind.ATTEMPT_FAILED)
    assert (event.reason, event.exit_code, event.attempt) == ("bad", 9, 1)
    assert run.recorder.of(EventKind.BACKOFF_SCHEDULED) == []


# -- other exceptions --------------------------------------------------------------------


async def test_exception_under_never_ends_failed(autojump_clock: trio.testing.MockClock) -> None:
    """Under NEVER an exception ends FAILED with the error, its text and no exit code."""
    error = ValueError("boom")
    fn = Script(error)
    run = await run_spec(TaskSpec.once("job", fn))
    assert run.outcome == TaskOutcome(OutcomeKind.FAILED, error=error, reason="boom")
    assert fn.starts == [0.0]


async def test_task_failure_carries_exit_code(autojump_clock: trio.testing.MockClock) -> None:
    """TaskFailure's exit code becomes the outcome's exit_code."""
    error = TaskFailure("disk full", exit_code=3)
    run = await run_spec(TaskSpec.once("job", Script(error)))
    assert run.outcome == TaskOutcome(
        OutcomeKind.FAILED, error=error, reason="disk full", exit_code=3
    )


async def test_task_failure_is_retryable(autojump_clock: trio.testing.MockClock) -> None:
    """TaskFailure is retried under ON_FAILURE like any other exception."""
    fn = Script(TaskFailure("flaky", exit_code=3), "ok")
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")
    assert fn.starts == [0.0, 1.0]


async def test_failure_is_retried_after_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """ON_FAILURE retries an exception after the backoff delay until a success."""
    fn = Script(ValueError("a"), ValueError("b"), "ok")
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")
    assert fn.starts == [0.0, 1.0, 2.0]
    assert run.elapsed == 2.0


async def test_exponential_backoff_timings(autojump_clock: trio.testing.MockClock) -> None:
    """Retries of one streak wait first, first*factor, first*factor**2 seconds."""
    fn = Script(ValueError("boom"))
    backoff = BackoffPolicy.exponential(1.0, factor=2.0)
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=backoff, max_retries=3))
    assert fn.starts == [0.0, 1.0, 3.0, 7.0]
    delays = [e.delay for e in run.recorder.of(EventKind.BACKOFF_SCHEDULED)]
    assert delays == [1.0, 2.0, 4.0]


async def test_failure_backoff_event_fields(autojump_clock: trio.testing.MockClock) -> None:
    """BACKOFF_SCHEDULED(FAILURE) carries the delay, str(error) and the exit code."""
    fn = Script(TaskFailure("flaky", exit_code=5), "ok")
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND))
    [event] = run.recorder.of(EventKind.BACKOFF_SCHEDULED)
    assert event.backoff_source is BackoffSource.FAILURE
    assert (event.delay, event.reason, event.exit_code, event.attempt) == (1.0, "flaky", 5, 1)
    [failed] = run.recorder.of(EventKind.ATTEMPT_FAILED)
    assert (failed.reason, failed.exit_code) == ("flaky", 5)


async def test_failure_under_always_uses_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """Under always(every) a failure waits the backoff, a success waits every."""
    fn = Script(ValueError("boom"), "ok", FatalError("stop"))
    await run_spec(TaskSpec.periodic("job", 10.0, fn, backoff=ONE_SECOND))
    assert fn.starts == [0.0, 1.0, 11.0]


# -- max_retries -------------------------------------------------------------------------


async def test_max_retries_stops_with_limit_reason(autojump_clock: trio.testing.MockClock) -> None:
    """After max_retries retries the task ends FAILED; the reason names the limit."""
    error = ValueError("boom")
    fn = Script(error)
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND, max_retries=2))
    assert run.outcome == TaskOutcome(
        OutcomeKind.FAILED, error=error, reason="retry limit reached after 2 retries: boom"
    )
    assert fn.starts == [0.0, 1.0, 2.0]
    assert run.elapsed == 2.0


async def test_max_retries_keeps_exit_code(autojump_clock: trio.testing.MockClock) -> None:
    """A retry-limit outcome keeps the last error's exit code."""
    fn = Script(TaskFailure("down", exit_code=7))
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND, max_retries=1))
    assert run.outcome.reason == "retry limit reached after 1 retry: down"
    assert run.outcome.exit_code == 7


async def test_task_finished_mirrors_limit_outcome(autojump_clock: trio.testing.MockClock) -> None:
    """TASK_FINISHED carries the retry-limit outcome's kind, reason and exit code."""
    fn = Script(TaskFailure("down", exit_code=7))
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND, max_retries=1))
    [event] = run.recorder.of(EventKind.TASK_FINISHED)
    assert (event.outcome, event.reason, event.exit_code) == (
        run.outcome.kind,
        run.outcome.reason,
        run.outcome.exit_code,
    )


async def test_no_backoff_scheduled_when_limit_reached(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The failure that hits the limit schedules no further backoff."""
    fn = Script(ValueError("boom"))
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND, max_retries=2))
    assert len(run.recorder.of(EventKind.BACKOFF_SCHEDULED)) == 2
    assert len(run.recorder.of(EventKind.ATTEMPT_FAILED)) == 3


async def test_unlimited_retries_continue(autojump_clock: trio.testing.MockClock) -> None:
    """max_retries=None retries every failure until a success."""
    fn = Script(*[ValueError("boom")] * 10, "ok")
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND, max_retries=None))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")
    assert len(fn.starts) == 11
    assert run.elapsed == 10.0


async def test_success_resets_failure_streak(autojump_clock: trio.testing.MockClock) -> None:
    """Under always, a success resets the streak, so max_retries counts anew."""
    boom = ValueError("boom")
    fn = Script(boom, "ok", boom, boom)
    run = await run_spec(TaskSpec.periodic("job", 10.0, fn, backoff=ONE_SECOND, max_retries=1))
    assert fn.starts == [0.0, 1.0, 11.0, 12.0]
    assert run.outcome.reason == "retry limit reached after 1 retry: boom"


async def test_success_repeats_do_not_consume_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Success-driven repeats under always never count against max_retries."""
    boom = ValueError("boom")
    fn = Script("a", "b", "c", boom, boom)
    run = await run_spec(TaskSpec.periodic("job", 1.0, fn, backoff=ONE_SECOND, max_retries=1))
    assert fn.starts == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert run.outcome.reason == "retry limit reached after 1 retry: boom"


async def test_backoff_restarts_from_first_after_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The backoff index restarts at 0 with a new failure streak."""
    boom = ValueError("boom")
    fn = Script(boom, boom, "ok", boom, FatalError("stop"))
    backoff = BackoffPolicy.exponential(1.0)
    await run_spec(TaskSpec.periodic("job", 10.0, fn, backoff=backoff))
    # 0 fail, +1 fail, +2 ok, +10 fail, +1 (not +4) fatal
    assert fn.starts == [0.0, 1.0, 3.0, 13.0, 14.0]


# -- periodic ----------------------------------------------------------------------------


async def test_periodic_restarts_every_after_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """periodic(every) starts the next attempt every seconds after a success ends."""
    fn = Script("a", "b", FatalError("stop"), duration=1.0)
    await run_spec(TaskSpec.periodic("job", 5.0, fn))
    assert fn.starts == [0.0, 6.0, 12.0]


async def test_periodic_publishes_success_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """Each periodic wait publishes BACKOFF_SCHEDULED(SUCCESS, delay=every)."""
    fn = Script("a", "b", FatalError("stop"))
    run = await run_spec(TaskSpec.periodic("job", 5.0, fn))
    events = run.recorder.of(EventKind.BACKOFF_SCHEDULED)
    assert [(e.backoff_source, e.delay, e.attempt) for e in events] == [
        (BackoffSource.SUCCESS, 5.0, 1),
        (BackoffSource.SUCCESS, 5.0, 2),
    ]


async def test_always_none_restarts_at_once_after_a_long_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """always(None) starts the next attempt as soon as a success ends."""
    fn = Script("a", "b", FatalError("stop"), duration=1.0)
    await run_spec(TaskSpec("job", fn, restart=RestartPolicy.always()))
    assert fn.starts == [0.0, 1.0, 2.0]


async def test_always_none_keeps_starts_one_ms_apart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """always(None) spaces instant successes 1 ms apart, start to start."""
    fn = Script("a", "b", "c", FatalError("stop"))
    await run_spec(TaskSpec("job", fn, restart=RestartPolicy.always()))
    gaps = [b - a for a, b in zip(fn.starts, fn.starts[1:], strict=False)]
    assert gaps == pytest.approx([0.001] * 3, rel=1e-9)


async def test_always_none_publishes_no_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """always(None) restarts without a BACKOFF_SCHEDULED event."""
    fn = Script("a", "b", FatalError("stop"))
    run = await run_spec(TaskSpec("job", fn, restart=RestartPolicy.always()))
    assert run.recorder.of(EventKind.BACKOFF_SCHEDULED) == []
    assert len(run.recorder.of(EventKind.ATTEMPT_SUCCEEDED)) == 2


# -- timeouts ----------------------------------------------------------------------------


async def test_timeout_ends_failed_with_timeout_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An attempt past its timeout ends FAILED with a TimeoutError naming the timeout."""
    run = await run_spec(TaskSpec.once("job", ForeverRecordingStarts(), timeout=2.0))
    outcome = run.outcome
    assert outcome.kind is OutcomeKind.FAILED
    assert isinstance(outcome.error, TimeoutError)
    assert "2.0" in str(outcome.error)
    assert outcome.reason == str(outcome.error)
    assert (outcome.value, outcome.exit_code, outcome.rejection) == (None, None, None)
    assert run.elapsed == 2.0


async def test_timeout_publishes_attempt_timed_out(autojump_clock: trio.testing.MockClock) -> None:
    """A timed-out attempt publishes ATTEMPT_TIMED_OUT carrying the timeout."""
    run = await run_spec(TaskSpec.once("job", ForeverRecordingStarts(), timeout=2.0))
    [event] = run.recorder.of(EventKind.ATTEMPT_TIMED_OUT)
    assert (event.timeout, event.attempt, event.duration) == (2.0, 1, 2.0)
    assert run.recorder.of(EventKind.ATTEMPT_FAILED) == []


async def test_attempt_starting_carries_timeout(autojump_clock: trio.testing.MockClock) -> None:
    """ATTEMPT_STARTING carries the attempt's resolved timeout."""
    run = await run_spec(TaskSpec.once("job", Script(1), timeout=2.0))
    [event] = run.recorder.of(EventKind.ATTEMPT_STARTING)
    assert event.timeout == 2.0


async def test_timeout_cancels_defer_cancel_block(autojump_clock: trio.testing.MockClock) -> None:
    """The attempt timeout is hard: it also cancels a defer_cancel() block."""

    after_block: list[float] = []

    async def deferring() -> None:
        with current_context().defer_cancel():
            await trio.sleep_forever()
        after_block.append(trio.current_time())

    run = await run_spec(TaskSpec.once("job", deferring, timeout=2.0))
    assert run.outcome.kind is OutcomeKind.FAILED
    assert isinstance(run.outcome.error, TimeoutError)
    assert run.elapsed == 2.0
    assert after_block == []


async def test_timeout_cancels_the_tasks_own_nursery(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A timeout ends an attempt whose children sleep in its own nursery."""

    async def fan_out() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(trio.sleep_forever)

    run = await run_spec(TaskSpec.once("job", fan_out, timeout=2.0))
    assert run.outcome.kind is OutcomeKind.FAILED
    assert isinstance(run.outcome.error, TimeoutError)
    assert run.elapsed == 2.0


async def test_timeout_is_retried_as_failure(autojump_clock: trio.testing.MockClock) -> None:
    """A timeout is retried with backoff and counts against max_retries."""
    fn = ForeverRecordingStarts()
    run = await run_spec(
        TaskSpec.restartable("job", fn, timeout=2.0, backoff=ONE_SECOND, max_retries=1)
    )
    assert fn.starts == [0.0, 3.0]
    assert run.elapsed == 5.0
    assert isinstance(run.outcome.error, TimeoutError)
    assert run.outcome.reason == f"retry limit reached after 1 retry: {run.outcome.error}"


async def test_timeout_restarts_with_each_attempt(autojump_clock: trio.testing.MockClock) -> None:
    """Every attempt gets the full timeout, counted from its own start."""
    fn = Script(ValueError("boom"), "ok", duration=1.5)
    run = await run_spec(TaskSpec.restartable("job", fn, timeout=2.0, backoff=ONE_SECOND))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")
    assert fn.starts == [0.0, 2.5]
    assert run.elapsed == 4.0


async def test_attempt_within_timeout_completes(autojump_clock: trio.testing.MockClock) -> None:
    """An attempt that returns before its timeout completes normally."""
    run = await run_spec(TaskSpec.once("job", Script("ok", duration=1.5), timeout=2.0))
    assert run.outcome == TaskOutcome(OutcomeKind.COMPLETED, value="ok")


# -- stops and TaskCancelled -------------------------------------------------------------


async def test_stop_ends_cancelled_without_retry(autojump_clock: trio.testing.MockClock) -> None:
    """A stopped attempt ends CANCELLED (no error, no reason) and is not retried."""
    fn = ForeverRecordingStarts()
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        waiter = await sup.add(TaskSpec.restartable("job", fn, backoff=ONE_SECOND))
        await trio.testing.wait_all_tasks_blocked()
        assert await sup.cancel(waiter.id)
        outcome = waiter.outcome_nowait()
    assert outcome == TaskOutcome(OutcomeKind.CANCELLED)
    assert fn.starts == [0.0]
    assert len(recorder.of(EventKind.ATTEMPT_CANCELLED, name="job")) == 1


async def test_task_cancelled_ends_cancelled_without_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A task raising TaskCancelled ends CANCELLED and is not retried."""
    fn = Script(TaskCancelled("no more work"))
    run = await run_spec(TaskSpec.restartable("job", fn, backoff=ONE_SECOND))
    assert run.outcome == TaskOutcome(OutcomeKind.CANCELLED)
    assert fn.starts == [0.0]


async def test_task_cancelled_publishes_attempt_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """TaskCancelled gives ATTEMPT_CANCELLED, not ATTEMPT_FAILED."""
    run = await run_spec(TaskSpec.once("job", Script(TaskCancelled())))
    assert len(run.recorder.of(EventKind.ATTEMPT_CANCELLED)) == 1
    assert run.recorder.of(EventKind.ATTEMPT_FAILED) == []


async def test_stop_during_backoff_ends_cancelled_without_attempt_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stop while the task sleeps in backoff ends it CANCELLED with no attempt event."""
    fn = Script(ValueError("boom"))
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        waiter = await sup.add(
            TaskSpec.restartable("job", fn, backoff=BackoffPolicy.constant(10.0))
        )
        await trio.testing.wait_all_tasks_blocked()
        assert [info.state for info in sup.list()] == [TaskState.BACKOFF]
        assert await sup.cancel(waiter.id)
        assert trio.current_time() == 0.0
    assert waiter.outcome_nowait() == TaskOutcome(OutcomeKind.CANCELLED)
    assert [e.kind for e in recorder.events if e.kind in ATTEMPT_END_KINDS] == [
        EventKind.ATTEMPT_FAILED
    ]


# -- backoff jitter ----------------------------------------------------------------------


async def test_jitter_draws_from_config_random(autojump_clock: trio.testing.MockClock) -> None:
    """Backoff jitter uses SupervisorConfig.random, so a seed fixes every delay."""
    backoff = BackoffPolicy(first=1.0, max=30.0, jitter=Jitter.FULL)
    expected_rng = random.Random(1234)
    expected = [backoff.delay_for_retry(n, expected_rng) for n in range(3)]
    fn = Script(ValueError("boom"))
    run = await run_spec(
        TaskSpec.restartable("job", fn, backoff=backoff, max_retries=3),
        SupervisorConfig(random=random.Random(1234)),
    )
    delays = [e.delay for e in run.recorder.of(EventKind.BACKOFF_SCHEDULED)]
    assert delays == expected
    gaps = [b - a for a, b in zip(fn.starts, fn.starts[1:], strict=False)]
    assert gaps == pytest.approx(expected, rel=1e-9)


async def test_same_seed_gives_same_delays(autojump_clock: trio.testing.MockClock) -> None:
    """Two supervisors seeded alike schedule identical jittered delays."""
    backoff = BackoffPolicy(first=1.0, max=30.0, jitter=Jitter.EQUAL)
    runs = [
        await run_spec(
            TaskSpec.restartable("job", Script(ValueError("boom")), backoff=backoff, max_retries=4),
            SupervisorConfig(random=random.Random(99)),
        )
        for _ in range(2)
    ]
    first, second = ([e.delay for e in r.recorder.of(EventKind.BACKOFF_SCHEDULED)] for r in runs)
    assert first == second
    assert len(set(first)) == 4


# -- max_concurrent ----------------------------------------------------------------------


async def test_permits_are_granted_fifo(autojump_clock: trio.testing.MockClock) -> None:
    """With max_concurrent=1 attempts start in arrival order, one after another."""
    fns = {name: Script(name, duration=1.0) for name in ("c", "a", "b")}
    async with open_supervisor(SupervisorConfig(max_concurrent=1)) as sup:
        waiters = []
        for name, fn in fns.items():
            waiters.append(await sup.add(TaskSpec.once(name, fn)))
            await trio.testing.wait_all_tasks_blocked()
        for waiter in waiters:
            await waiter.wait()
    assert {name: fn.starts for name, fn in fns.items()} == {
        "c": [0.0],
        "a": [1.0],
        "b": [2.0],
    }


async def test_attempt_starting_waits_for_permit(autojump_clock: trio.testing.MockClock) -> None:
    """ATTEMPT_STARTING is published only once the permit is acquired."""
    recorder = EventRecorder()
    async with open_supervisor(SupervisorConfig(max_concurrent=1), subscribers=[recorder]) as sup:
        first = await sup.add(TaskSpec.once("first", Script(1, duration=3.0)))
        second = await sup.add(TaskSpec.once("second", Script(2)))
        await second.wait()
        await first.wait()
    assert starts(recorder, "first") == [0.0]
    assert starts(recorder, "second") == [3.0]


async def test_waiting_for_permit_is_listed_as_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A task waiting for a permit is WAITING in list() and not alive."""
    async with open_supervisor(SupervisorConfig(max_concurrent=1)) as sup:
        await sup.add(TaskSpec.once("holder", ForeverRecordingStarts()))
        await trio.testing.wait_all_tasks_blocked()
        await sup.add(TaskSpec.once("waiter", ForeverRecordingStarts()))
        await trio.testing.wait_all_tasks_blocked()
        assert [(i.name, i.state) for i in sup.list()] == [
            ("holder", TaskState.RUNNING),
            ("waiter", TaskState.WAITING),
        ]
        assert sup.alive_snapshot() == ("holder",)
        stats = sup.statistics()
        assert (stats.running_attempts, stats.waiting_for_permit) == (1, 1)


async def test_stop_while_waiting_for_permit_publishes_no_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stop during the permit wait ends CANCELLED with no attempt event."""
    recorder = EventRecorder()
    async with open_supervisor(SupervisorConfig(max_concurrent=1), subscribers=[recorder]) as sup:
        await sup.add(TaskSpec.once("holder", ForeverRecordingStarts()))
        await trio.testing.wait_all_tasks_blocked()
        waiter = await sup.add(TaskSpec.once("waiter", ForeverRecordingStarts()))
        await trio.testing.wait_all_tasks_blocked()
        assert await sup.cancel("waiter")
    assert waiter.outcome_nowait() == TaskOutcome(OutcomeKind.CANCELLED)
    assert recorder.of(EventKind.ATTEMPT_STARTING, name="waiter") == []
    assert recorder.of(EventKind.ATTEMPT_CANCELLED, name="waiter") == []


async def test_backoff_holds_no_permit(autojump_clock: trio.testing.MockClock) -> None:
    """A task sleeping in backoff releases its permit to others."""
    flaky = Script(ValueError("boom"), "ok", duration=1.0)
    other = Script("other", duration=10.0)
    async with open_supervisor(SupervisorConfig(max_concurrent=1)) as sup:
        a = await sup.add(TaskSpec.restartable("flaky", flaky, backoff=BackoffPolicy.constant(5.0)))
        await trio.testing.wait_all_tasks_blocked()
        b = await sup.add(TaskSpec.once("other", other))
        await a.wait()
        await b.wait()
    # flaky fails at 1 and backs off until 6, but other holds the permit from 1 to 11.
    assert other.starts == [1.0]
    assert flaky.starts == [0.0, 11.0]


# -- current_context ---------------------------------------------------------------------


async def test_current_context_describes_the_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """current_context() gives id, name, no slot, attempt 1, the supervisor, no stop."""
    seen: list[tuple[Any, ...]] = []

    async def look() -> None:
        ctx = current_context()
        seen.append((ctx.id, ctx.name, ctx.slot, ctx.attempt, ctx.supervisor, ctx.cancel_requested))

    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("looker", look))
        await waiter.wait()
    assert seen == [(waiter.id, "looker", None, 1, sup, False)]


async def test_current_context_counts_attempts(autojump_clock: trio.testing.MockClock) -> None:
    """TaskContext.attempt is 1-based and grows with every retry."""
    attempts: list[int] = []

    async def flaky() -> None:
        attempts.append(current_context().attempt)
        if len(attempts) < 3:
            raise ValueError("again")

    await run_spec(TaskSpec.restartable("job", flaky, backoff=ONE_SECOND))
    assert attempts == [1, 2, 3]


async def test_current_context_raises_in_supervisor_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """current_context() raises RuntimeError outside a supervised attempt."""
    async with open_supervisor():
        with pytest.raises(RuntimeError):
            current_context()


def test_current_context_raises_outside_trio() -> None:
    """current_context() raises RuntimeError with no trio run at all."""
    with pytest.raises(RuntimeError):
        current_context()


# -- context variables -------------------------------------------------------------------


async def test_attempt_sees_submitter_contextvars(autojump_clock: trio.testing.MockClock) -> None:
    """An attempt sees the context variables the submitter had at add time."""

    async def read() -> str:
        return request_id.get()

    request_id.set("req-1")
    run = await run_spec(TaskSpec.once("job", read))
    assert run.outcome.value == "req-1"


async def test_contextvars_are_captured_at_add(autojump_clock: trio.testing.MockClock) -> None:
    """A change the submitter makes after add does not reach the task."""

    async def read_later() -> str:
        await trio.sleep(1.0)
        return request_id.get()

    request_id.set("at-add")
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", read_later))
        request_id.set("after-add")
        outcome = await waiter.wait()
    assert outcome.value == "at-add"


async def test_each_attempt_runs_in_a_fresh_copy(autojump_clock: trio.testing.MockClock) -> None:
    """A variable set in attempt 1 is not visible in attempt 2."""
    seen: list[str] = []

    async def dirty() -> None:
        seen.append(request_id.get())
        request_id.set("set-by-attempt")
        if len(seen) == 1:
            raise ValueError("retry me")

    request_id.set("submitter")
    await run_spec(TaskSpec.restartable("job", dirty, backoff=ONE_SECOND))
    assert seen == ["submitter", "submitter"]


async def test_periodic_repeat_runs_in_a_fresh_copy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Success-driven repeats also start from the submitter's context."""
    seen: list[str] = []

    async def dirty() -> None:
        seen.append(request_id.get())
        request_id.set("set-by-attempt")
        if len(seen) == 3:
            raise FatalError("stop")

    request_id.set("submitter")
    await run_spec(TaskSpec.periodic("job", 1.0, dirty))
    assert seen == ["submitter"] * 3


async def test_a_task_added_by_an_attempt_names_itself_in_every_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The context captured at add names the adding attempt; each of the added task's
    attempts, restarts too, sees its own record in ``current_context()``."""
    seen: list[tuple[str, int]] = []

    async def child() -> None:
        context = current_context()
        seen.append((context.name, context.attempt))
        if context.attempt < 3:
            raise ValueError("retry me")

    async def parent() -> None:
        spec = TaskSpec.restartable("child", child, backoff=ONE_SECOND)
        await (await current_context().supervisor.add(spec)).wait()
        seen.append((current_context().name, current_context().attempt))

    run = await run_spec(TaskSpec.once("parent", parent))
    assert run.outcome.kind is OutcomeKind.COMPLETED
    assert seen == [("child", 1), ("child", 2), ("child", 3), ("parent", 1)]


async def test_attempt_changes_do_not_leak_to_submitter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A variable the task sets does not change the submitter's value."""

    async def dirty() -> None:
        request_id.set("set-by-attempt")

    request_id.set("submitter")
    await run_spec(TaskSpec.once("job", dirty))
    assert request_id.get() == "submitter"


# -- TaskOutcome -------------------------------------------------------------------------


def test_unwrap_returns_value_of_completed() -> None:
    """unwrap() returns the value of a COMPLETED outcome."""
    assert TaskOutcome(OutcomeKind.COMPLETED, value=7).unwrap() == 7


def test_unwrap_raises_outcome_error_chained_to_error() -> None:
    """unwrap() of a FAILED outcome raises OutcomeError(outcome) from its error."""
    error = ValueError("boom")
    outcome = TaskOutcome(OutcomeKind.FAILED, error=error, reason="boom")
    with pytest.raises(OutcomeError) as info:
        outcome.unwrap()
    assert info.value.outcome is outcome
    assert info.value.__cause__ is error


def test_unwrap_of_cancelled_has_no_cause() -> None:
    """unwrap() of an outcome without an error raises OutcomeError with no cause."""
    outcome = TaskOutcome(OutcomeKind.CANCELLED)
    with pytest.raises(OutcomeError) as info:
        outcome.unwrap()
    assert info.value.outcome is outcome
    assert info.value.__cause__ is None


@pytest.mark.parametrize("kind", list(OutcomeKind))
def test_is_success_only_for_completed(kind: OutcomeKind) -> None:
    """is_success is true exactly for COMPLETED."""
    assert TaskOutcome(kind).is_success is (kind is OutcomeKind.COMPLETED)


def test_rejected_outcome_has_fixed_reason() -> None:
    """A REJECTED outcome carries its rejection kind and a reason text."""
    outcome = rejected(RejectionKind.QUEUE_FULL)
    assert (outcome.kind, outcome.rejection) == (OutcomeKind.REJECTED, RejectionKind.QUEUE_FULL)
    assert outcome.reason


async def test_unwrap_of_failed_task_chains_task_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A real failed task's unwrap() raises OutcomeError chained to the task's error."""
    error = KeyError("missing")
    run = await run_spec(TaskSpec.once("job", Script(error)))
    with pytest.raises(OutcomeError) as info:
        run.outcome.unwrap()
    assert info.value.__cause__ is error


# -- TaskWaiter ------------------------------------------------------------------------


async def test_waiter_names_its_task(autojump_clock: trio.testing.MockClock) -> None:
    """A waiter exposes its task's id and name."""
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("named", Script(1, duration=1.0)))
        assert isinstance(waiter, TaskWaiter)
        assert waiter.name == "named"
        assert [(info.id, info.name) for info in sup.list()] == [(waiter.id, "named")]


async def test_wait_is_a_checkpoint_when_outcome_known(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """TaskWaiter.wait() is a checkpoint even when the outcome is already final."""
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", Script(1)))
        await waiter.wait()
        with trio.testing.assert_checkpoints():
            outcome = await waiter.wait()
    assert outcome == TaskOutcome(OutcomeKind.COMPLETED, value=1)


async def test_wait_is_a_checkpoint_while_pending(autojump_clock: trio.testing.MockClock) -> None:
    """TaskWaiter.wait() is a checkpoint while the task is still running."""
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", Script(1, duration=1.0)))
        with trio.testing.assert_checkpoints():
            await waiter.wait()


async def test_outcome_nowait_would_block_before_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """outcome_nowait() raises trio.WouldBlock until the task has ended."""
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", Script(1, duration=1.0)))
        with pytest.raises(trio.WouldBlock):
            waiter.outcome_nowait()
        outcome = await waiter.wait()
        assert waiter.outcome_nowait() is outcome


async def test_every_wait_gets_the_same_outcome(autojump_clock: trio.testing.MockClock) -> None:
    """Concurrent and later wait() calls return the same outcome object."""
    results: list[TaskOutcome] = []
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("job", Script(1, duration=1.0)))

        async def collect() -> None:
            results.append(await waiter.wait())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect)
            nursery.start_soon(collect)
        results.append(await waiter.wait())
    assert results[0] is results[1] is results[2]
