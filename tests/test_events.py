"""Lifecycle events: sequences, numbering, subscriber lanes, drops and the built-ins.

Every test runs on pytest-trio's ``autojump_clock``, so times are exact and a stuck
subscriber only costs virtual time at the shutdown drain.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    BackoffSource,
    ConfigError,
    ControllerSpec,
    EventKind,
    FatalError,
    LoggingSubscriber,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
    TaskCancelled,
    TaskEvent,
    TaskFailure,
    TaskNameInUseError,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

from helpers import ONE_ATTEMPT_SUCCESS, forever, kinds_of, returns_done, supervisor

K = EventKind


def make_event(seq: int, kind: EventKind, **fields: Any) -> TaskEvent:
    return TaskEvent(seq=seq, time=0.0, wall_time=0.0, kind=kind, **fields)


class GatedSubscriber:
    """Blocks in ``on_event`` until ``gate`` is set; a queue of one event."""

    def __init__(self, name: str = "gated") -> None:
        self.name = name
        self.queue_capacity = 1
        self.gate = trio.Event()
        self.events: list[TaskEvent] = []

    async def on_event(self, event: TaskEvent) -> None:
        await self.gate.wait()
        self.events.append(event)


class FailingSubscriber:
    """Records everything and raises ``error`` on ``TASK_ADDED``; no ``name``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error if error is not None else RuntimeError("subscriber exploded")
        self.events: list[TaskEvent] = []

    async def on_event(self, event: TaskEvent) -> None:
        self.events.append(event)
        if event.kind is K.TASK_ADDED:
            raise self.error


class SleepySubscriber:
    """Takes 1000 s per event."""

    queue_capacity = 1

    async def on_event(self, event: TaskEvent) -> None:
        await trio.sleep(1000)


async def run_one_task_with_lanes_parked(sup: Any) -> None:
    """Run one successful task (6 events) once every lane is waiting for events."""
    await trio.testing.wait_all_tasks_blocked()
    waiter = await sup.add(TaskSpec.once("t", returns_done))
    await waiter.wait()
    await trio.testing.wait_all_tasks_blocked()


# -- the event types -----------------------------------------------------------------------


def test_event_kind_values_are_snake_case_names() -> None:
    """EventKind is a str enum of the documented kinds, each valued by its lower-cased name."""
    expected = {
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "TASK_ADD_FAILED",
        "ATTEMPT_STARTING",
        "ATTEMPT_SUCCEEDED",
        "ATTEMPT_FAILED",
        "ATTEMPT_TIMED_OUT",
        "ATTEMPT_CANCELLED",
        "BACKOFF_SCHEDULED",
        "TASK_REMOVE_REQUESTED",
        "TASK_FINISHED",
        "TASK_REMOVED",
        "SHUTDOWN_REQUESTED",
        "ALL_STOPPED_WITHIN_GRACE",
        "GRACE_EXCEEDED",
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_REJECTED",
        "CONTROLLER_SLOT_TRANSITION",
        "SUBSCRIBER_OVERFLOW",
        "SUBSCRIBER_FAILED",
        # section 10: cluster slots
        "CONTROLLER_LEASE_ACQUIRED",
        "CONTROLLER_LEASE_LOST",
        "CONTROLLER_REMOTE_STOP",
        "CONTROLLER_STORE_UNAVAILABLE",
        "CONTROLLER_STORE_RECOVERED",
        "FORCED_TASK_EXITED",
        # limits
        "LIMIT_WAITING",
        "LIMIT_ACQUIRED",
    }
    assert {k.name for k in EventKind} == expected
    assert all(isinstance(k, str) and k == k.name.lower() for k in EventKind)


def test_task_event_fields_and_defaults() -> None:
    """TaskEvent has the documented fields; everything after ``kind`` defaults to None."""
    names = [f.name for f in attrs.fields(TaskEvent)]
    assert names[:4] == ["seq", "time", "wall_time", "kind"]
    assert set(names[4:]) == {
        "task_id",
        "name",
        "slot",
        "attempt",
        "reason",
        "outcome",
        "rejection",
        "delay",
        "timeout",
        "duration",
        "exit_code",
        "backoff_source",
        "dropped",
        "fence_token",  # section 10
    }
    event = make_event(1, K.TASK_ADDED)
    assert all(getattr(event, name) is None for name in names[4:])


def test_task_event_is_frozen_with_slots() -> None:
    """TaskEvent is immutable and has no instance ``__dict__``."""
    event = make_event(1, K.TASK_ADDED)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.seq = 2  # type: ignore[misc]
    assert not hasattr(event, "__dict__")


# -- sequences -----------------------------------------------------------------------------


async def test_successful_once_task_publishes_full_sequence(autojump_clock: Any) -> None:
    """A one-shot success publishes add, one attempt and the end, in that order."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        waiter = await sup.add(TaskSpec.once("t", returns_done))
        await waiter.wait()
    assert kinds_of(recorder, "t") == ONE_ATTEMPT_SUCCESS


async def test_task_added_is_published_before_the_body_starts(autojump_clock: Any) -> None:
    """By the time the body runs, TASK_ADDED has already been published."""
    recorder = EventRecorder()
    published_at_start: list[int] = []

    async with open_supervisor(subscribers=[recorder]) as sup:

        async def body() -> None:
            published_at_start.append(sup.statistics().events_published)

        waiter = await sup.add(TaskSpec.once("t", body))
        await waiter.wait()
    [added] = recorder.of(K.TASK_ADDED, name="t")
    assert published_at_start[0] >= added.seq


async def test_duplicate_add_publishes_requested_then_add_failed(autojump_clock: Any) -> None:
    """A rejected add publishes TASK_ADD_REQUESTED then TASK_ADD_FAILED, and nothing else."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        await sup.add(TaskSpec.once("t", forever))
        rejected = sup.add_nowait(TaskSpec.once("t", returns_done))
        outcome = await rejected.wait()
    events = [e for e in recorder.events if e.task_id == rejected.id]
    assert [e.kind for e in events] == [K.TASK_ADD_REQUESTED, K.TASK_ADD_FAILED]
    failed = events[1]
    assert (failed.name, failed.outcome, failed.rejection, failed.reason) == (
        "t",
        OutcomeKind.REJECTED,
        RejectionKind.ALREADY_EXISTS,
        outcome.reason,
    )


async def test_controller_rejected_carries_the_rejected_outcome(autojump_clock: Any) -> None:
    """CONTROLLER_REJECTED carries ``outcome=REJECTED`` besides ``rejection`` and ``reason``."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=4) as sup:
        await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", forever), slot="s"))
        dropped = await sup.submit(
            ControllerSpec.drop_if_running(TaskSpec.once("d", returns_done), slot="s")
        )
        outcome = await dropped.wait()
    [event] = recorder.of(K.CONTROLLER_REJECTED)
    assert (event.task_id, event.outcome, event.rejection, event.reason) == (
        dropped.id,
        OutcomeKind.REJECTED,
        RejectionKind.SLOT_BUSY,
        outcome.reason,
    )


async def test_rejected_work_never_gets_task_finished(autojump_clock: Any) -> None:
    """Work rejected at admission gets no TASK_FINISHED and no TASK_REMOVED."""
    recorder = EventRecorder()
    config = SupervisorConfig(max_registered_tasks=1)
    async with open_supervisor(config, subscribers=[recorder]) as sup:
        await sup.add(TaskSpec.once("first", forever))
        rejected = sup.add_nowait(TaskSpec.once("second", returns_done))
        assert (await rejected.wait()).rejection is RejectionKind.RESOURCE_LIMIT
    ends = recorder.kinds(K.TASK_FINISHED, K.TASK_REMOVED)
    assert len(ends) == 2
    assert not [e for e in recorder.events if e.task_id == rejected.id and e.kind in ends]


async def test_failed_attempt_publishes_attempt_failed_with_reason(autojump_clock: Any) -> None:
    """A raising attempt publishes ATTEMPT_FAILED with str(error) and its exit code."""
    recorder = EventRecorder()

    async def fails() -> None:
        raise TaskFailure("disk full", exit_code=28)

    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(TaskSpec.once("t", fails))).wait()
    assert kinds_of(recorder, "t")[2:4] == [K.ATTEMPT_STARTING, K.ATTEMPT_FAILED]
    [failed] = recorder.of(K.ATTEMPT_FAILED)
    assert (failed.attempt, failed.reason, failed.exit_code) == (1, "disk full", 28)


async def test_fatal_error_publishes_attempt_failed(autojump_clock: Any) -> None:
    """A FatalError ends the attempt with ATTEMPT_FAILED, then TASK_FINISHED(FATAL)."""
    recorder = EventRecorder()

    async def fatal() -> None:
        raise FatalError("bad config", exit_code=2)

    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(TaskSpec.restartable("t", fatal))).wait()
    assert kinds_of(recorder, "t") == [
        K.TASK_ADD_REQUESTED,
        K.TASK_ADDED,
        K.ATTEMPT_STARTING,
        K.ATTEMPT_FAILED,
        K.TASK_FINISHED,
        K.TASK_REMOVED,
    ]
    assert recorder.of(K.TASK_FINISHED)[0].outcome is OutcomeKind.FATAL


async def test_task_raised_cancelled_publishes_attempt_cancelled(autojump_clock: Any) -> None:
    """An attempt raising TaskCancelled publishes ATTEMPT_CANCELLED."""
    recorder = EventRecorder()

    async def gives_up() -> None:
        raise TaskCancelled("not needed")

    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(TaskSpec.restartable("t", gives_up))).wait()
    assert kinds_of(recorder, "t")[2:] == [
        K.ATTEMPT_STARTING,
        K.ATTEMPT_CANCELLED,
        K.TASK_FINISHED,
        K.TASK_REMOVED,
    ]
    assert recorder.of(K.TASK_FINISHED)[0].outcome is OutcomeKind.CANCELLED


async def test_timeout_publishes_attempt_timed_out(autojump_clock: Any) -> None:
    """An attempt over its timeout publishes ATTEMPT_TIMED_OUT with timeout and duration."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(TaskSpec.once("t", forever, timeout=1.5))).wait()
    assert kinds_of(recorder, "t")[2:4] == [K.ATTEMPT_STARTING, K.ATTEMPT_TIMED_OUT]
    [timed_out] = recorder.of(K.ATTEMPT_TIMED_OUT)
    assert (timed_out.timeout, timed_out.duration) == (1.5, 1.5)


async def test_retry_publishes_backoff_scheduled_failure(autojump_clock: Any) -> None:
    """Each retry publishes BACKOFF_SCHEDULED(FAILURE) with delay, reason and exit code."""
    recorder = EventRecorder()
    calls = 0

    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TaskFailure(f"boom {calls}", exit_code=3)
        return calls

    spec = TaskSpec.restartable("t", flaky, backoff=BackoffPolicy.constant(0.5))
    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(spec)).wait()
    attempt = [K.ATTEMPT_STARTING, K.ATTEMPT_FAILED, K.BACKOFF_SCHEDULED]
    assert kinds_of(recorder, "t") == [
        K.TASK_ADD_REQUESTED,
        K.TASK_ADDED,
        *attempt,
        *attempt,
        K.ATTEMPT_STARTING,
        K.ATTEMPT_SUCCEEDED,
        K.TASK_FINISHED,
        K.TASK_REMOVED,
    ]
    backoffs = [
        (e.backoff_source, e.delay, e.reason, e.exit_code, e.attempt)
        for e in recorder.of(K.BACKOFF_SCHEDULED)
    ]
    assert backoffs == [
        (BackoffSource.FAILURE, 0.5, "boom 1", 3, 1),
        (BackoffSource.FAILURE, 0.5, "boom 2", 3, 2),
    ]


async def test_periodic_publishes_backoff_scheduled_success(autojump_clock: Any) -> None:
    """A periodic success publishes BACKOFF_SCHEDULED(SUCCESS, delay=every) and waits it."""
    recorder = EventRecorder()
    calls = 0

    async def tick() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise FatalError("enough")

    async with open_supervisor(subscribers=[recorder]) as sup:
        t0 = trio.current_time()
        await (await sup.add(TaskSpec.periodic("t", 2.0, tick))).wait()
    backoffs = [(e.backoff_source, e.delay, e.reason) for e in recorder.of(K.BACKOFF_SCHEDULED)]
    assert backoffs == [(BackoffSource.SUCCESS, 2.0, None)] * 2
    assert [e.time for e in recorder.of(K.ATTEMPT_STARTING)] == [t0, t0 + 2.0, t0 + 4.0]


async def test_stopped_task_publishes_remove_requested_before_the_end(
    autojump_clock: Any,
) -> None:
    """A removed task publishes TASK_REMOVE_REQUESTED, then its attempt and task end."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        waiter = await sup.add(TaskSpec.once("t", forever))
        await recorder.wait_for(K.ATTEMPT_STARTING, name="t")
        assert await sup.remove("t")
        await waiter.wait()
    assert kinds_of(recorder, "t") == [
        K.TASK_ADD_REQUESTED,
        K.TASK_ADDED,
        K.ATTEMPT_STARTING,
        K.TASK_REMOVE_REQUESTED,
        K.ATTEMPT_CANCELLED,
        K.TASK_FINISHED,
        K.TASK_REMOVED,
    ]
    assert recorder.of(K.TASK_FINISHED)[0].outcome is OutcomeKind.CANCELLED


async def _ends_completed() -> str:
    return "value"


async def _ends_fatal() -> None:
    raise FatalError("fatal reason", exit_code=9)


async def _ends_failed() -> None:
    raise TaskFailure("failed reason", exit_code=7)


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        (TaskSpec.once("t", _ends_completed), OutcomeKind.COMPLETED),
        (TaskSpec.once("t", _ends_fatal), OutcomeKind.FATAL),
        (TaskSpec.once("t", _ends_failed), OutcomeKind.FAILED),
        (
            TaskSpec.restartable(
                "t", _ends_failed, max_retries=2, backoff=BackoffPolicy.constant(1.0)
            ),
            OutcomeKind.FAILED,
        ),
    ],
    ids=["completed", "fatal", "failed", "retry-limit"],
)
async def test_task_finished_carries_the_outcome(
    autojump_clock: Any, spec: TaskSpec, kind: OutcomeKind
) -> None:
    """TASK_FINISHED has the outcome's kind, reason and exit code."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        outcome = await (await sup.add(spec)).wait()
    [finished] = recorder.of(K.TASK_FINISHED)
    assert outcome.kind is kind
    assert (finished.outcome, finished.reason, finished.exit_code) == (
        outcome.kind,
        outcome.reason,
        outcome.exit_code,
    )


async def test_retry_limit_reason_reaches_task_finished(autojump_clock: Any) -> None:
    """A stop by max_retries puts the retry-limit reason on TASK_FINISHED."""
    recorder = EventRecorder()
    spec = TaskSpec.restartable(
        "t", _ends_failed, max_retries=2, backoff=BackoffPolicy.constant(1.0)
    )
    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(spec)).wait()
    [finished] = recorder.of(K.TASK_FINISHED)
    assert finished.reason == "retry limit reached after 2 retries: failed reason"


async def test_force_aborted_task_ends_once(autojump_clock: Any) -> None:
    """A forced task gets exactly one TASK_FINISHED(FORCE_ABORTED) and one TASK_REMOVED."""
    recorder = EventRecorder()

    async def stubborn() -> None:
        with current_context().defer_cancel():
            await trio.sleep(10)

    async with open_supervisor(SupervisorConfig(grace=1.0), subscribers=[recorder]) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn))
        await recorder.wait_for(K.ATTEMPT_STARTING, name="t")
        await sup.remove("t")
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FORCE_ABORTED
    assert recorder.kinds(K.TASK_FINISHED, K.TASK_REMOVED) == [K.TASK_FINISHED, K.TASK_REMOVED]
    [finished] = recorder.of(K.TASK_FINISHED)
    assert (finished.outcome, finished.reason) == (outcome.kind, outcome.reason)


async def test_every_registered_task_ends_exactly_once(autojump_clock: Any) -> None:
    """Each registered task gets one TASK_FINISHED and one TASK_REMOVED, however it ends."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        waiters = await sup.add_batch(
            [
                TaskSpec.once("done", returns_done),
                TaskSpec.once("fails", _ends_failed),
                TaskSpec.once("stopped", forever),
                TaskSpec.once("at-shutdown", forever),
            ]
        )
        await sup.cancel("stopped")
    ids = [w.id for w in waiters]
    for kind in (K.TASK_FINISHED, K.TASK_REMOVED):
        assert sorted(int(e.task_id or 0) for e in recorder.of(kind)) == ids


# -- numbering and time --------------------------------------------------------------------


async def test_seq_counts_from_one_in_publication_order(autojump_clock: Any) -> None:
    """Without drops a subscriber sees seq 1, 2, 3, ... with no gap."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(TaskSpec.once("a", returns_done))).wait()
        await (await sup.add(TaskSpec.once("b", _ends_failed))).wait()
    assert [e.seq for e in recorder.events] == list(range(1, len(recorder.events) + 1))


async def test_event_time_is_the_trio_clock(autojump_clock: Any) -> None:
    """Each event's ``time`` is ``trio.current_time()`` when it was published."""
    recorder = EventRecorder()

    async def naps() -> None:
        await trio.sleep(2.5)

    async with open_supervisor(subscribers=[recorder]) as sup:
        await trio.sleep(1.0)
        t0 = trio.current_time()
        await (await sup.add(TaskSpec.once("t", naps))).wait()
    times = [(e.kind, e.time) for e in recorder.events if e.name == "t"]
    assert times == [
        (K.TASK_ADD_REQUESTED, t0),
        (K.TASK_ADDED, t0),
        (K.ATTEMPT_STARTING, t0),
        (K.ATTEMPT_SUCCEEDED, t0 + 2.5),
        (K.TASK_FINISHED, t0 + 2.5),
        (K.TASK_REMOVED, t0 + 2.5),
    ]
    [succeeded] = recorder.of(K.ATTEMPT_SUCCEEDED)
    assert succeeded.duration == 2.5


# -- subscribers ---------------------------------------------------------------------------


async def test_each_subscriber_sees_publication_order(autojump_clock: Any) -> None:
    """Every subscriber receives the same events in increasing seq order."""
    first, second = EventRecorder(name="first"), EventRecorder(name="second")
    async with open_supervisor(subscribers=[first, second]) as sup:
        await sup.add_batch([TaskSpec.once(n, returns_done) for n in "abc"])
        await sup.wait_idle()
    seqs = [e.seq for e in first.events]
    assert seqs == sorted(seqs)
    assert [e.seq for e in second.events] == seqs


async def test_full_subscriber_queue_drops_for_that_subscriber_only(
    autojump_clock: Any,
) -> None:
    """A full lane drops its new events while other subscribers get every event."""
    gated, recorder = GatedSubscriber(), EventRecorder()
    async with open_supervisor(subscribers=[gated, recorder]) as sup:
        await run_one_task_with_lanes_parked(sup)
        assert kinds_of(recorder, "t") == ONE_ATTEMPT_SUCCESS
        gated.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        # The event in on_event and the one queued survive; the other four are dropped.
        assert [e.kind for e in gated.events if e.name == "t"] == ONE_ATTEMPT_SUCCESS[:2]


async def test_overflow_marker_reports_drops_with_the_next_seq(autojump_clock: Any) -> None:
    """Once caught up, a lane gets one SUBSCRIBER_OVERFLOW(dropped=n) taking the next seq."""
    gated = GatedSubscriber(name="slowpoke")
    async with open_supervisor(subscribers=[gated]) as sup:
        await run_one_task_with_lanes_parked(sup)
        gated.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert [e.seq for e in gated.events] == [1, 2, 7]
        marker = gated.events[2]
        assert (marker.kind, marker.dropped, marker.name) == (
            K.SUBSCRIBER_OVERFLOW,
            4,
            "slowpoke",
        )
    assert len([e for e in gated.events if e.kind is K.SUBSCRIBER_OVERFLOW]) == 1


async def test_overflow_marker_goes_to_the_dropping_lane_only(autojump_clock: Any) -> None:
    """Other subscribers never see another lane's SUBSCRIBER_OVERFLOW."""
    gated, recorder = GatedSubscriber(), EventRecorder()
    async with open_supervisor(subscribers=[gated, recorder]) as sup:
        await run_one_task_with_lanes_parked(sup)
        gated.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert gated.events[-1].kind is K.SUBSCRIBER_OVERFLOW
    assert recorder.of(K.SUBSCRIBER_OVERFLOW) == []


async def test_statistics_count_subscriber_drops(autojump_clock: Any) -> None:
    """events_dropped and subscriber_dropped count a lane's drops by subscriber name."""
    gated, recorder = GatedSubscriber(), EventRecorder()
    async with open_supervisor(subscribers=[gated, recorder]) as sup:
        await run_one_task_with_lanes_parked(sup)
        stats = sup.statistics()
        gated.gate.set()
    assert stats.events_dropped == 4
    assert dict(stats.subscriber_dropped) == {"gated": 4, "EventRecorder": 0}


async def test_subscriber_exception_is_isolated(autojump_clock: Any) -> None:
    """A subscriber whose on_event raises keeps receiving later events; tasks are unaffected."""
    failing = FailingSubscriber()
    async with open_supervisor(subscribers=[failing]) as sup:
        outcome = await (await sup.add(TaskSpec.once("t", returns_done))).wait()
    assert outcome.kind is OutcomeKind.COMPLETED
    assert [e.kind for e in failing.events if e.name == "t"] == ONE_ATTEMPT_SUCCESS


@pytest.mark.parametrize(
    "error",
    [trio.ClosedResourceError("sink closed"), trio.BrokenResourceError("sink broken")],
    ids=["closed", "broken"],
)
async def test_subscriber_raising_trio_resource_errors_is_isolated(
    autojump_clock: Any, error: Exception
) -> None:
    """trio's resource errors from on_event are isolated like any other exception."""
    failing, recorder = FailingSubscriber(error), EventRecorder()
    async with open_supervisor(subscribers=[failing, recorder]) as sup:
        outcome = await (await sup.add(TaskSpec.once("t", returns_done))).wait()
    assert outcome.kind is OutcomeKind.COMPLETED
    assert [e.kind for e in failing.events if e.name == "t"] == ONE_ATTEMPT_SUCCESS
    assert len(recorder.of(K.SUBSCRIBER_FAILED)) == 1


async def test_subscriber_failure_is_reported_to_the_others(autojump_clock: Any) -> None:
    """Other subscribers get SUBSCRIBER_FAILED naming the subscriber and str(exc)."""
    failing, recorder = FailingSubscriber(), EventRecorder()
    async with open_supervisor(subscribers=[failing, recorder]) as sup:
        await (await sup.add(TaskSpec.once("t", returns_done))).wait()
    [failed] = recorder.of(K.SUBSCRIBER_FAILED)
    assert failed.name == "FailingSubscriber"
    assert failed.reason is not None
    assert "subscriber exploded" in failed.reason


async def test_subscriber_failure_is_not_reported_to_itself(autojump_clock: Any) -> None:
    """The failing subscriber never receives its own SUBSCRIBER_FAILED."""
    failing, recorder = FailingSubscriber(), EventRecorder()
    async with open_supervisor(subscribers=[failing, recorder]) as sup:
        await (await sup.add(TaskSpec.once("t", returns_done))).wait()
    assert len(recorder.of(K.SUBSCRIBER_FAILED)) == 1
    assert [e for e in failing.events if e.kind is K.SUBSCRIBER_FAILED] == []


async def test_a_failure_on_a_failure_report_is_not_reported(autojump_clock: Any) -> None:
    """Two subscribers that fail on every event: each one's failure on a task's event
    is reported to the other and to the rest, once; a failure on that report is not
    reported in turn. Before, they reported each other's failures for ever (about
    100,000 events a second), and ``wait_all_tasks_blocked()`` never returned."""

    class Down:
        def __init__(self, name: str) -> None:
            self.name = name
            self.events: list[TaskEvent] = []

        async def on_event(self, event: TaskEvent) -> None:
            self.events.append(event)
            if len(self.events) < 1000:  # then back up: a storm ends, to be counted
                raise ConnectionError(f"{self.name} is down")

    a, b, recorder = Down("a"), Down("b"), EventRecorder()
    async with open_supervisor(subscribers=[a, b, recorder]) as sup:
        await (await sup.add(TaskSpec.once("t", returns_done))).wait()
        await trio.testing.wait_all_tasks_blocked()
    task_events = [e for e in recorder.events if e.kind is not K.SUBSCRIBER_FAILED]
    reports = recorder.of(K.SUBSCRIBER_FAILED)
    assert sorted(e.name for e in reports) == sorted(["a", "b"] * len(task_events))
    # Each got the other's reports, one per task event, failed on each: unreported.
    assert [e.name for e in a.events if e.kind is K.SUBSCRIBER_FAILED] == ["b"] * len(task_events)


async def test_slow_subscriber_never_slows_tasks(autojump_clock: Any) -> None:
    """Attempts and backoff keep exact virtual times while a subscriber takes 1000 s each."""
    starts: list[float] = []

    async def flaky() -> None:
        starts.append(trio.current_time())
        await trio.sleep(0.5)
        if len(starts) < 3:
            raise TaskFailure("again")

    spec = TaskSpec.restartable("t", flaky, backoff=BackoffPolicy.constant(1.0))
    async with open_supervisor(subscribers=[SleepySubscriber()]) as sup:
        t0 = trio.current_time()
        outcome = await (await sup.add(spec)).wait()
        assert trio.current_time() == t0 + 3.5
    assert outcome.kind is OutcomeKind.COMPLETED
    assert starts == [t0, t0 + 1.5, t0 + 3.0]


async def test_default_subscriber_name_is_the_class_name(autojump_clock: Any) -> None:
    """A subscriber without ``name`` is known by its class name."""
    async with open_supervisor(subscribers=[SleepySubscriber()]) as sup:
        assert dict(sup.statistics().subscriber_dropped) == {"SleepySubscriber": 0}


class _SyncOnEvent:
    def on_event(self, event: TaskEvent) -> None:
        pass


class _NoOnEvent:
    pass


@pytest.mark.parametrize("subscriber", [_SyncOnEvent(), _NoOnEvent()], ids=["sync", "missing"])
async def test_subscriber_without_async_on_event_is_a_type_error(subscriber: object) -> None:
    """open_supervisor rejects a subscriber without ``async def on_event`` with TypeError."""
    with pytest.raises(TypeError, match="on_event"):
        async with open_supervisor(subscribers=[subscriber]):  # type: ignore[list-item]
            pytest.fail("the supervisor must not start")


async def test_the_same_subscriber_twice_is_a_config_error() -> None:
    """One subscriber object given twice would get (and count) every event twice:
    ``ConfigError`` naming it. Two subscribers of one name are two subscribers."""
    recorder = EventRecorder()
    with pytest.raises(ConfigError, match=r"subscriber <.*EventRecorder.*> is given twice"):
        async with open_supervisor(subscribers=[recorder, SleepySubscriber(), recorder]):
            pytest.fail("the supervisor must not start")
    other = EventRecorder()
    async with open_supervisor(subscribers=[recorder, other]) as sup:
        await (await sup.add(TaskSpec.once("t", trio.sleep, 0))).wait()
    assert [e.kind for e in recorder.events] == [e.kind for e in other.events]
    assert len({e.seq for e in recorder.events}) == len(recorder.events)


@pytest.mark.parametrize("capacity", [0, -1])
async def test_subscriber_queue_capacity_below_one_is_a_config_error(capacity: int) -> None:
    """open_supervisor rejects a subscriber ``queue_capacity`` below 1 with ConfigError
    (``EventRecorder`` itself refuses one when it is built)."""

    class Small:
        queue_capacity = capacity

        async def on_event(self, event: TaskEvent) -> None:
            pass

    with pytest.raises(ConfigError, match=str(capacity)):
        async with open_supervisor(subscribers=[Small()]):
            pytest.fail("the supervisor must not start")
    with pytest.raises(ConfigError, match=str(capacity)):
        EventRecorder(queue_capacity=capacity)


# -- the bus and events() streams ----------------------------------------------------------


async def test_no_subscriber_and_no_stream_publishes_nothing(autojump_clock: Any) -> None:
    """With nobody listening, events are not built and events_published stays 0."""
    async with open_supervisor() as sup:
        await (await sup.add(TaskSpec.once("t", _ends_failed))).wait()
        await sup.cancel("nothing")
        assert sup.statistics().events_published == 0


async def test_events_stream_gets_later_events(autojump_clock: Any) -> None:
    """An events() stream receives the events published after it opened."""
    async with open_supervisor() as sup:
        await (await sup.add(TaskSpec.once("before", returns_done))).wait()
        async with sup.events() as stream:
            await (await sup.add(TaskSpec.once("after", returns_done))).wait()
            received = [await stream.receive() for _ in range(6)]
    assert [(e.kind, e.name) for e in received] == [(k, "after") for k in ONE_ATTEMPT_SUCCESS]
    assert [e.seq for e in received] == list(range(1, 7))


async def test_events_stream_drops_and_reports_overflow(autojump_clock: Any) -> None:
    """A full events() stream drops, counts the drops and then delivers an overflow marker."""
    async with open_supervisor() as sup, sup.events(capacity=1) as stream:
        await run_one_task_with_lanes_parked(sup)
        assert sup.statistics().events_dropped == 4
        received = [await stream.receive() for _ in range(3)]
    assert [e.kind for e in received] == [*ONE_ATTEMPT_SUCCESS[:2], K.SUBSCRIBER_OVERFLOW]
    assert (received[2].seq, received[2].dropped) == (7, 4)


async def test_events_stream_closed_by_its_consumer_ends_quietly(autojump_clock: Any) -> None:
    """Closing a stream's receive side mid-flow harms neither tasks nor the supervisor."""
    async with open_supervisor() as sup:
        async with sup.events() as stream:
            await stream.aclose()
            outcome = await (await sup.add(TaskSpec.once("t", returns_done))).wait()
        assert outcome.kind is OutcomeKind.COMPLETED


async def test_events_stream_opened_during_the_drain_ends_at_once(autojump_clock: Any) -> None:
    """A stream opened while the shutdown drains the subscribers ends at once, and the
    shutdown ends with the subscriber's drain (it waited for the drain deadline)."""

    class SlowFirst:
        def __init__(self) -> None:
            self.calls = 0

        async def on_event(self, event: TaskEvent) -> None:
            self.calls += 1
            if self.calls == 1:
                await trio.sleep(1.0)  # the drain runs until 1.0

    received: list[TaskEvent] = []
    ended_at = -1.0

    async def late_reader(sup: Any) -> None:
        nonlocal ended_at
        await sup.wait_closing()
        await trio.sleep(0.5)  # the fan-out has ended, the subscriber still drains
        async with sup.events() as stream:
            received.extend([event async for event in stream])
        ended_at = trio.current_time()

    async with trio.open_nursery() as nursery:
        async with open_supervisor(subscribers=[SlowFirst()]) as sup:
            nursery.start_soon(late_reader, sup)
            await (await sup.add(TaskSpec.once("t", returns_done))).wait()
        assert trio.current_time() == 1.0
    assert (received, ended_at) == ([], 0.5)


@pytest.mark.parametrize("capacity", [0, -5])
async def test_events_capacity_below_one_is_a_config_error(capacity: int) -> None:
    """events() with a capacity below 1 raises ConfigError at the call."""
    async with open_supervisor() as sup:
        with pytest.raises(ConfigError, match=str(capacity)):
            sup.events(capacity)


async def test_full_bus_drops_and_counts(autojump_clock: Any) -> None:
    """Events that find the bus channel full are dropped and counted in events_dropped."""
    recorder = EventRecorder()
    config = SupervisorConfig(bus_capacity=1)
    async with open_supervisor(config, subscribers=[recorder]) as sup:
        await trio.testing.wait_all_tasks_blocked()
        # Six events in one step: the fan-out takes one, the bus holds one.
        with pytest.raises(TaskNameInUseError):
            await sup.add_batch([TaskSpec.once(n, returns_done) for n in "aba"])
        await trio.testing.wait_all_tasks_blocked()
        stats = sup.statistics()
    assert stats.events_dropped == 4
    assert dict(stats.subscriber_dropped) == {"EventRecorder": 0}
    assert [(e.seq, e.kind) for e in recorder.events[:2]] == [
        (1, K.TASK_ADD_REQUESTED),
        (2, K.TASK_ADD_REQUESTED),
    ]


# -- LoggingSubscriber ---------------------------------------------------------------------


async def _run_logged(
    caplog: pytest.LogCaptureFixture, logger: logging.Logger | None = None
) -> EventRecorder:
    """Run a success and a failure with a LoggingSubscriber and a recorder."""
    caplog.set_level(logging.DEBUG)
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[LoggingSubscriber(logger), recorder]) as sup:
        await (await sup.add(TaskSpec.once("good-task", returns_done))).wait()
        await (await sup.add(TaskSpec.once("bad-task", _ends_failed))).wait()
    return recorder


def _event_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, "taskvisor_kind")]


async def test_logging_subscriber_logs_one_record_per_event(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """LoggingSubscriber emits exactly one record per event, in order."""
    recorder = await _run_logged(caplog)
    records = _event_records(caplog)
    assert [r.taskvisor_seq for r in records] == [e.seq for e in recorder.events]  # type: ignore[attr-defined]


async def test_logging_subscriber_message_names_task_and_reason(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The message of a failure record contains the task name and the reason."""
    await _run_logged(caplog)
    [record] = [
        r
        for r in _event_records(caplog)
        if r.taskvisor_kind is K.ATTEMPT_FAILED  # type: ignore[attr-defined]
    ]
    assert "bad-task" in record.getMessage()
    assert "failed reason" in record.getMessage()


async def test_logging_subscriber_puts_every_field_in_extra(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every TaskEvent field is on the record as ``taskvisor_<field>``."""
    recorder = await _run_logged(caplog)
    records = _event_records(caplog)
    assert len(records) == len(recorder.events)
    for record, event in zip(records, recorder.events, strict=True):
        for field in attrs.fields(TaskEvent):
            assert getattr(record, f"taskvisor_{field.name}") == getattr(event, field.name)


async def test_logging_subscriber_logs_failures_at_warning_or_above(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Failed attempts and failed tasks log at WARNING or ERROR; successes below WARNING."""
    await _run_logged(caplog)
    levels = {
        (r.taskvisor_kind, r.taskvisor_name): r.levelno  # type: ignore[attr-defined]
        for r in _event_records(caplog)
    }
    assert levels[K.ATTEMPT_FAILED, "bad-task"] in (logging.WARNING, logging.ERROR)
    assert levels[K.TASK_FINISHED, "bad-task"] in (logging.WARNING, logging.ERROR)
    assert levels[K.ATTEMPT_SUCCEEDED, "good-task"] < logging.WARNING
    assert levels[K.TASK_FINISHED, "good-task"] < logging.WARNING


async def test_logging_subscriber_uses_the_given_logger(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """LoggingSubscriber(logger) logs to that logger."""
    # A name nothing else configures: the logging how-to's "myapp.tasks" keeps its
    # propagate=False after that page's test, and pytest before 9.1 captures only records
    # that reach the root logger.
    await _run_logged(caplog, logging.getLogger("test_events.given_logger"))
    records = _event_records(caplog)
    assert records
    assert {r.name for r in records} == {"test_events.given_logger"}


# -- EventRecorder -------------------------------------------------------------------------


def test_event_recorder_is_constructible_outside_trio() -> None:
    """EventRecorder() needs no running trio loop."""
    recorder = EventRecorder()
    assert recorder.events == []
    assert recorder.kinds() == []


async def test_event_recorder_kinds_filters_by_wanted_kinds() -> None:
    """kinds() lists every recorded kind in order; kinds(*wanted) only those."""
    recorder = EventRecorder()
    for seq, kind in enumerate([K.TASK_ADD_REQUESTED, K.TASK_ADDED, K.TASK_FINISHED], 1):
        await recorder.on_event(make_event(seq, kind))
    assert recorder.kinds() == [K.TASK_ADD_REQUESTED, K.TASK_ADDED, K.TASK_FINISHED]
    assert recorder.kinds(K.TASK_FINISHED, K.TASK_ADDED) == [K.TASK_ADDED, K.TASK_FINISHED]


async def test_event_recorder_of_matches_kind_and_fields() -> None:
    """of(kind, **fields) returns the recorded events of that kind with equal fields."""
    recorder = EventRecorder()
    a, b = make_event(1, K.TASK_ADDED, name="a"), make_event(2, K.TASK_ADDED, name="b")
    for event in (a, b, make_event(3, K.TASK_REMOVED, name="a")):
        await recorder.on_event(event)
    assert recorder.of(K.TASK_ADDED) == [a, b]
    assert recorder.of(K.TASK_ADDED, name="a") == [a]
    assert recorder.of(K.TASK_ADDED, name="c") == []


async def test_event_recorder_wait_for_returns_a_recorded_match_at_once(
    autojump_clock: Any,
) -> None:
    """wait_for returns the first recorded match without waiting, as a checkpoint."""
    recorder = EventRecorder()
    match = make_event(1, K.TASK_ADDED, name="a")
    await recorder.on_event(match)
    await recorder.on_event(make_event(2, K.TASK_ADDED, name="a"))
    t0 = trio.current_time()
    with trio.testing.assert_checkpoints(), trio.fail_after(1):
        assert await recorder.wait_for(K.TASK_ADDED, name="a") is match
    assert trio.current_time() == t0


async def test_event_recorder_wait_for_waits_for_a_later_match() -> None:
    """wait_for blocks until a matching event is recorded, ignoring others."""
    recorder = EventRecorder()
    match = make_event(2, K.TASK_ADDED, name="b")
    got: list[TaskEvent] = []

    async def waits() -> None:
        got.append(await recorder.wait_for(K.TASK_ADDED, name="b"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waits)
        await trio.testing.wait_all_tasks_blocked()
        await recorder.on_event(make_event(1, K.TASK_ADDED, name="a"))
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await recorder.on_event(match)
    assert got == [match]
