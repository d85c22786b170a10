"""The service path's second round: critical tasks (``CriticalTaskError``), ``closing`` /
``wait_closing()``, repeated failure lines while a streak goes on, ``FATAL`` when calling
``fn(*args)`` raises, and ``TaskWaiter.done``; on the virtual clock, with exact times.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    ConcurrencyLimit,
    ControllerConfig,
    ControllerSpec,
    CriticalTaskError,
    EventKind,
    FatalError,
    OutcomeError,
    OutcomeKind,
    RestartPolicy,
    Supervisor,
    SupervisorClosedError,
    SupervisorConfig,
    TaskCancelled,
    TaskDefaults,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
    run,
)
from trio_taskvisor.testing import EventRecorder

from helpers import Attempts, deferring, forever, stubborn, supervisor_config

LOGGER = "trio_taskvisor"


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """The messages the ``trio_taskvisor`` logger wrote at ``level``."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


async def fails_after(seconds: float, error: BaseException) -> None:
    await trio.sleep(seconds)
    raise error


# -- critical tasks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [(ValueError("feed gone"), "failed"), (FatalError("feed gone"), "fatal")],
)
async def test_a_critical_failure_cancels_the_body_and_raises(
    autojump_clock: trio.abc.Clock, error: BaseException, kind: str
) -> None:
    """FAILED or FATAL: shutdown at once, the body cancelled, ``CriticalTaskError`` after."""
    recorder = EventRecorder()
    reached: list[str] = []
    with pytest.raises(CriticalTaskError) as info:  # noqa: PT012
        async with open_supervisor(supervisor_config(), subscribers=[recorder]) as sup:
            key = await sup.add(TaskSpec.once("key", fails_after, 5.0, error, critical=True))
            other = await sup.add(TaskSpec.once("other", forever))
            await trio.sleep_forever()
            reached.append("after the body's sleep")  # pragma: no cover
    assert reached == []
    assert trio.current_time() == 5.0
    critical = info.value
    assert str(critical) == f"critical task 'key' ({key.id}) ended {kind}: feed gone"
    assert (critical.task_id, critical.name) == (key.id, "key")
    assert critical.outcome is key.outcome_nowait()
    assert critical.outcome.error is error
    assert isinstance(critical, RuntimeError)
    assert other.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert recorder.kinds(EventKind.SHUTDOWN_REQUESTED) == [EventKind.SHUTDOWN_REQUESTED]


async def test_a_critical_failure_is_logged_once_at_error(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """One "shutting down" record, besides the failure's own record."""
    caplog.set_level(logging.DEBUG, LOGGER)
    with pytest.raises(CriticalTaskError):  # noqa: PT012
        async with open_supervisor() as sup:
            key = await sup.add(
                TaskSpec.once("key", fails_after, 1.0, ValueError("boom"), critical=True)
            )
            await trio.sleep_forever()
    assert records(caplog, logging.ERROR) == [
        f"task 'key' ({key.id}) ended failed: boom",
        f"critical task 'key' ({key.id}) ended failed: boom: shutting down",
    ]


async def test_only_the_first_critical_failure_escalates(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A second critical task failing in the same instant is an ordinary failure."""
    caplog.set_level(logging.DEBUG, LOGGER)
    a_fails = trio.Event()

    async def a_task() -> None:
        await trio.sleep(1.0)
        a_fails.set()
        raise ValueError("a")

    async def b_task() -> None:
        await a_fails.wait()  # woken in the instant a fails, before any stop
        raise ValueError("b")

    with pytest.raises(CriticalTaskError) as info:  # noqa: PT012
        async with open_supervisor() as sup:
            a = await sup.add(TaskSpec.once("a", a_task, critical=True))
            b = await sup.add(TaskSpec.once("b", b_task, critical=True))
            await trio.sleep_forever()
    assert info.value.task_id == a.id
    assert b.outcome_nowait().kind is OutcomeKind.FAILED
    assert records(caplog, logging.ERROR) == [
        f"task 'a' ({a.id}) ended failed: a",
        f"critical task 'a' ({a.id}) ended failed: a: shutting down",
        f"task 'b' ({b.id}) ended failed: b",
    ]


async def run_outcome(spec: TaskSpec[Any], act: Any = None) -> TaskWaiter[Any]:
    """Run ``spec`` (then ``act(sup, waiter)``) to its end in a block that ends by itself."""
    async with open_supervisor(supervisor_config(grace=1.0)) as sup:
        waiter = await sup.add(spec)
        await trio.testing.wait_all_tasks_blocked()
        if act is not None:
            await act(sup, waiter)
        await waiter.wait()
    return waiter


async def _remove(sup: Any, waiter: TaskWaiter[Any]) -> None:
    await sup.remove(waiter.id)


async def _cancel(sup: Any, waiter: TaskWaiter[Any]) -> None:
    await sup.cancel(waiter.id)


@pytest.mark.parametrize(
    ("spec", "act", "kind"),
    [
        (TaskSpec.once("t", trio.sleep, 1.0, critical=True), None, OutcomeKind.COMPLETED),
        (TaskSpec.once("t", forever, critical=True), _remove, OutcomeKind.CANCELLED),
        (
            TaskSpec.once("t", Attempts((0.0, TaskCancelled("no work"))), critical=True),
            None,
            OutcomeKind.CANCELLED,
        ),
        (TaskSpec.once("t", deferring, 5.0, critical=True), _cancel, OutcomeKind.FORCE_ABORTED),
    ],
    ids=["completed", "removed", "task-cancelled", "force-aborted"],
)
async def test_other_outcomes_of_a_critical_task_escalate_nothing(
    autojump_clock: trio.abc.Clock, spec: TaskSpec[Any], act: Any, kind: OutcomeKind
) -> None:
    """COMPLETED, CANCELLED, FORCE_ABORTED after a stop: the block ends normally."""
    waiter = await run_outcome(spec, act)
    assert waiter.outcome_nowait().kind is kind


async def test_a_rejected_critical_task_escalates_nothing(autojump_clock: trio.abc.Clock) -> None:
    """REJECTED (its slot busy): nothing ran, nothing escalates."""
    async with open_supervisor(SupervisorConfig(controller=ControllerConfig())) as sup:
        await sup.submit(ControllerSpec.queue(TaskSpec.once("busy", trio.sleep, 1.0)))
        spec = TaskSpec.once("late", trio.sleep, 1.0, critical=True)
        waiter = await sup.submit(ControllerSpec.drop_if_running(spec, slot="busy"))
        assert (await waiter.wait()).kind is OutcomeKind.REJECTED


async def test_critical_is_inherited_from_the_defaults(autojump_clock: trio.abc.Clock) -> None:
    """``TaskDefaults(critical=True)``; a spec's ``critical=False`` opts out."""
    config = SupervisorConfig(task_defaults=TaskDefaults(critical=True))
    async with open_supervisor(config) as sup:
        opted_out = TaskSpec.once("t", fails_after, 1.0, ValueError("x"), critical=False)
        assert (await (await sup.add(opted_out)).wait()).kind is OutcomeKind.FAILED
    with pytest.raises(CriticalTaskError, match="critical task 'u'"):  # noqa: PT012
        async with open_supervisor(config) as sup:
            await sup.add(TaskSpec.once("u", fails_after, 1.0, ValueError("x")))
            await trio.sleep_forever()
    assert trio.current_time() == 2.0


async def test_work_awaiting_a_failing_critical_task_gets_its_outcome_and_stops(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Tasks awaiting the critical task's waiter (in a shielded scope too) get its
    outcome in the instant it fails, then end as the shutdown stops them; the block
    awaiting it gets it too, then ``CriticalTaskError``; nothing waits longer than the
    shielded task's own sleep."""
    config = supervisor_config(grace=1.0)
    seen: list[tuple[str, OutcomeKind, float]] = []
    with pytest.raises(CriticalTaskError) as info:  # noqa: PT012
        async with open_supervisor(config) as sup:
            key = await sup.add(
                TaskSpec.once("key", fails_after, 1.0, ValueError("x"), critical=True)
            )

            async def awaits(label: str, shield: bool) -> None:
                with trio.CancelScope(shield=shield):
                    seen.append((label, (await key.wait()).kind, trio.current_time()))
                    await trio.sleep(0.5)

            plain = await sup.add(TaskSpec.once("plain", awaits, "plain", False))
            shielded = await sup.add(TaskSpec.once("shielded", awaits, "shielded", True))
            seen.append(("body", (await key.wait()).kind, trio.current_time()))
            await trio.sleep_forever()
    assert info.value.task_id == key.id
    assert sorted(seen) == [
        ("body", OutcomeKind.FAILED, 1.0),
        ("plain", OutcomeKind.FAILED, 1.0),
        ("shielded", OutcomeKind.FAILED, 1.0),
    ]
    assert plain.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert shielded.outcome_nowait().kind is OutcomeKind.CANCELLED  # stopped, then returned
    assert trio.current_time() == 1.5


async def test_keyed_work_inherits_critical_and_a_joiner_runs_nothing_to_escalate(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Under ``TaskDefaults(critical=True)`` controller work is critical like any task:
    a keyed call's failure raises ``OutcomeError`` to its caller and shuts down (its
    ``critical=False`` opts out). A joiner follows the joined work's outcome and runs
    nothing: a non-critical owner's failure escalates through none of its joiners."""
    config = SupervisorConfig(
        controller=ControllerConfig(), task_defaults=TaskDefaults(critical=True)
    )
    async with open_supervisor(config) as sup:
        with pytest.raises(OutcomeError):
            await sup.run_in_slot("s", fails_after, 1.0, ValueError("x"), critical=False)
        owner = TaskSpec.once("o", fails_after, 1.0, ValueError("o"), critical=False)
        await sup.submit(ControllerSpec.queue(owner, slot="s"))
        joiner = await sup.submit(ControllerSpec.join(TaskSpec.once("j", forever), slot="s"))
        assert (await joiner.wait()).kind is OutcomeKind.FAILED
    assert trio.current_time() == 2.0
    with pytest.raises(CriticalTaskError, match=r"critical task 'fails_after#\d+'"):  # noqa: PT012
        async with open_supervisor(config) as sup:
            with pytest.raises(OutcomeError):
                await sup.run_in_slot("s", fails_after, 1.0, ValueError("x"))
            await trio.sleep_forever()
    assert trio.current_time() == 3.0


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_critical_must_be_a_bool(value: object) -> None:
    """``critical`` takes a ``bool`` only: anything else is a ``TypeError``."""
    with pytest.raises(TypeError, match="critical must be a bool"):
        TaskSpec.once("t", forever, critical=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="critical must be a bool"):
        TaskSpec("t", forever, critical=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="critical must be a bool"):
        TaskDefaults(critical=value)  # type: ignore[arg-type]


def test_critical_defaults_to_false() -> None:
    assert TaskDefaults().critical is False
    assert TaskSpec.once("t", forever).critical is TaskSpec("t", forever).critical


async def test_run_raises_critical_task_error(autojump_clock: trio.abc.Clock) -> None:
    """``run()``: the same rule; the other tasks are stopped."""
    with pytest.raises(CriticalTaskError, match=r"ended fatal: no schema$"):
        await run(
            [
                TaskSpec.once("migrate", fails_after, 2.0, FatalError("no schema"), critical=True),
                TaskSpec.once("serve", forever),
            ]
        )
    assert trio.current_time() == 2.0


async def test_a_body_exception_raised_first_wins(autojump_clock: trio.abc.Clock) -> None:
    """The body raised before the critical task could fail: the body's exception."""
    with pytest.raises(KeyError):  # noqa: PT012
        async with open_supervisor() as sup:
            key = await sup.add(
                TaskSpec.once("key", fails_after, 5.0, ValueError("x"), critical=True)
            )
            await trio.sleep(1.0)
            raise KeyError("body")
    assert key.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_a_body_exception_in_the_same_instant_wins(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The critical task fails first, the body raises in that instant: the body's own
    exception (the critical failure is logged)."""
    caplog.set_level(logging.DEBUG, LOGGER)
    failing_now = trio.Event()

    async def key_task() -> None:
        await trio.sleep(3.0)
        failing_now.set()
        raise ValueError("feed gone")

    with pytest.raises(KeyError):  # noqa: PT012
        async with open_supervisor() as sup:
            await sup.add(TaskSpec.once("key", key_task, critical=True))
            await failing_now.wait()  # woken before the cancellation: no checkpoint after
            raise KeyError("body")
    assert trio.current_time() == 3.0
    assert any(m.endswith("shutting down") for m in records(caplog, logging.ERROR))


async def test_a_body_exception_group_of_the_same_instant_carries_no_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The body's nursery gathers, in the critical failure's instant, a child's error and
    the body scope's own cancellation: the group raised holds the error only. Before, it
    held trio's ``Cancelled`` too, out of the scope it belongs to."""
    one = ConcurrencyLimit("one", 1)

    async def block(sup: Supervisor) -> None:
        async with sup.limited(one):
            pytest.fail("the holder never lets go")

    with pytest.raises(ExceptionGroup) as info:  # noqa: PT012
        async with open_supervisor() as sup, trio.open_nursery() as nursery:
            await sup.add(TaskSpec.once("holder", trio.sleep_forever, limits=(one,)))
            await sup.add(TaskSpec.once("key", fails_after, 1.0, ValueError("x"), critical=True))
            nursery.start_soon(block, sup)
            await trio.sleep_forever()
    assert [type(e) for e in info.value.exceptions] == [SupervisorClosedError]
    assert trio.current_time() == 1.0


async def test_a_body_exception_of_a_later_instant_gives_way(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The cancelled body raises one second later: ``CriticalTaskError``, caused by it."""
    cleanup_error = RuntimeError("cleanup failed")
    with pytest.raises(CriticalTaskError) as info:  # noqa: PT012
        async with open_supervisor() as sup:
            await sup.add(TaskSpec.once("key", fails_after, 2.0, ValueError("x"), critical=True))
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(1.0)
                raise cleanup_error
    assert trio.current_time() == 3.0
    assert info.value.__cause__ is cleanup_error


async def test_critical_task_error_wins_over_grace_exceeded(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A grace overrun of that shutdown is logged and published, not raised."""
    caplog.set_level(logging.DEBUG, LOGGER)
    recorder = EventRecorder()
    with pytest.raises(CriticalTaskError):  # noqa: PT012
        async with open_supervisor(supervisor_config(grace=1.0), subscribers=[recorder]) as sup:
            await sup.add(TaskSpec.once("flush", stubborn, 10.0))
            await sup.add(TaskSpec.once("key", fails_after, 2.0, ValueError("x"), critical=True))
            await trio.sleep_forever()
    assert trio.current_time() == 10.0  # forced at 3, the flush's body exits at its own end
    assert [e.reason for e in recorder.of(EventKind.GRACE_EXCEEDED)] == ["forced: flush"]
    assert (
        "shutdown after a critical task's failure: 1 task(s) did not stop within the grace "
        "of 1.0 s: flush"
    ) in records(caplog, logging.ERROR)


# -- closing and wait_closing -----------------------------------------------------------------


async def _end_block(sup: Any) -> None:
    await trio.sleep(3.0)


async def _call_shutdown(sup: Any) -> None:
    await trio.sleep(3.0)
    await sup.shutdown()


async def _signal(sup: Any) -> None:
    await trio.sleep(3.0)
    os.kill(os.getpid(), signal.SIGTERM)
    await trio.sleep_forever()


async def _critical(sup: Any) -> None:
    await sup.add(TaskSpec.once("key", fails_after, 3.0, ValueError("x"), critical=True))
    await trio.sleep_forever()


@pytest.mark.parametrize(
    "cause",
    [_end_block, _call_shutdown, _signal, _critical],
    ids=["block-end", "shutdown", "signal", "critical"],
)
async def test_closing_turns_true_when_the_shutdown_begins(
    autojump_clock: trio.abc.Clock, cause: Any
) -> None:
    """Whatever begins the shutdown, ``wait_closing()`` returns then, while the
    supervisor drains (a task's 2 s of cleanup), and ``closing`` stays ``True``."""
    seen: list[tuple[float, bool]] = []

    async def readiness(sup: Any) -> None:
        seen.append((trio.current_time(), sup.closing))
        await sup.wait_closing()
        seen.append((trio.current_time(), sup.closing))

    async def drains() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2.0)

    expected: contextlib.AbstractContextManager[Any] = (
        pytest.raises(CriticalTaskError) if cause is _critical else contextlib.nullcontext()
    )
    async with trio.open_nursery() as nursery:
        with expected:
            async with open_supervisor(supervisor_config(), handle_signals=True) as sup:
                nursery.start_soon(readiness, sup)
                await sup.add(TaskSpec.once("flush", drains))
                await cause(sup)
    assert seen == [(0.0, False), (3.0, True)]
    assert trio.current_time() == 5.0  # the drain
    assert sup.closing


async def test_wait_closing_returns_at_once_once_closing(autojump_clock: trio.abc.Clock) -> None:
    """Already closing: a checkpoint, no wait."""
    async with open_supervisor() as sup:
        assert not sup.closing
        await sup.shutdown()
        assert sup.closing
        with trio.testing.assert_checkpoints():
            await sup.wait_closing()
    assert trio.current_time() == 0.0


# -- failures that go on ---------------------------------------------------------------------


async def resets() -> None:
    """Fail after 0.25 s (a fresh error each time: a raised one keeps its traceback)."""
    await trio.sleep(0.25)
    raise ConnectionError("reset")


async def test_a_long_streak_logs_a_line_a_minute(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """An hour failing every 0.25 s: the first failure at once, then one line per 60 s
    (60 lines, not 14 400 and not 1), each counting the streak's failed attempts."""
    caplog.set_level(logging.DEBUG, LOGGER)
    spec = TaskSpec.restartable("poll", resets, backoff=BackoffPolicy.constant(0.0))
    async with open_supervisor() as sup:
        waiter = await sup.add(spec)
        await trio.sleep(3600.0)
    lines = records(caplog, logging.WARNING)
    assert len(lines) == 60
    assert lines[0] == f"task 'poll' ({waiter.id}) attempt 1 failed, retrying in 0 s: reset"
    assert lines[1] == (
        f"task 'poll' ({waiter.id}) still failing: 241 attempts failed in 60.0 s, "
        "retrying in 0 s: reset"
    )
    assert lines[59] == (
        f"task 'poll' ({waiter.id}) still failing: 14161 attempts failed in 3540.0 s, "
        "retrying in 0 s: reset"
    )


async def test_still_failing_lines_name_the_next_delay_and_the_latest_error(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A growing backoff: lines at the first failure at or after each minute's end."""
    caplog.set_level(logging.DEBUG, LOGGER)

    async def failing_poll() -> None:
        raise ConnectionError(f"refused {current_context().attempt}")

    spec = TaskSpec.restartable(
        "poll", failing_poll, backoff=BackoffPolicy.exponential(1.0, max=30.0)
    )
    async with open_supervisor() as sup:
        waiter = await sup.add(spec)
        await trio.sleep(100.0)
    # Failures at 0, 1, 3, 7, 15, 31, 61, 91: delays 1, 2, 4, 8, 16, 30, 30, 30.
    assert records(caplog, logging.WARNING) == [
        f"task 'poll' ({waiter.id}) attempt 1 failed, retrying in 1 s: refused 1",
        f"task 'poll' ({waiter.id}) still failing: 7 attempts failed in 61.0 s, "
        "retrying in 30 s: refused 7",
    ]


async def test_a_new_streak_logs_its_first_failure_at_once(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A success ends the streak: the next failure is logged even within the minute."""
    caplog.set_level(logging.DEBUG, LOGGER)
    body = Attempts((0.0, OSError("a")), (0.0, "ok"), (0.0, OSError("b")), (0.0, "ok"))
    spec = TaskSpec.periodic("poll", 1.0, body, backoff=BackoffPolicy.constant(1.0))
    async with open_supervisor() as sup:
        await sup.add(spec)
        await trio.sleep(3.5)
    lines = records(caplog, logging.WARNING)
    assert [line.rpartition(": ")[2] for line in lines] == ["a", "b"]
    assert all("attempt" in line and "still failing" not in line for line in lines)


async def test_no_failure_lines_without_log_failures(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    spec = TaskSpec.restartable("poll", resets, backoff=BackoffPolicy.constant(0.0))
    async with open_supervisor(SupervisorConfig(log_failures=False)) as sup:
        await sup.add(spec)
        await trio.sleep(600.0)
    assert records(caplog, logging.WARNING) == []


# -- a call that cannot start -----------------------------------------------------------------


async def needs_a_feed(feed: str) -> None:
    await trio.sleep(1.0)


class Poller:
    """A callable object whose ``__call__`` wants an argument."""

    async def run(self, feed: str) -> None:
        await trio.sleep(1.0)

    def __call__(self, feed: str) -> Any:
        return self.run(feed)


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (
            needs_a_feed,
            "calling needs_a_feed failed: "
            "needs_a_feed() missing 1 required positional argument: 'feed'",
        ),
        (
            functools.partial(functools.partial(needs_a_feed)),
            "calling needs_a_feed failed: "
            "needs_a_feed() missing 1 required positional argument: 'feed'",
        ),
        (
            Poller(),
            "calling Poller failed: "
            "Poller.__call__() missing 1 required positional argument: 'feed'",
        ),
    ],
    ids=["function", "partial", "callable-object"],
)
async def test_a_call_that_raises_ends_fatal_without_retry(
    autojump_clock: trio.abc.Clock, fn: Any, reason: str
) -> None:
    """FATAL at once, one attempt, whatever the restart policy."""
    recorder = EventRecorder()
    spec = TaskSpec("poll", fn, (), restart=RestartPolicy.ON_FAILURE, max_retries=None)
    async with open_supervisor(subscribers=[recorder]) as sup:
        outcome = await (await sup.add(spec)).wait()
    assert outcome.kind is OutcomeKind.FATAL
    assert outcome.reason == reason
    assert isinstance(outcome.error, TypeError)
    assert trio.current_time() == 0.0
    assert recorder.kinds(EventKind.ATTEMPT_FAILED, EventKind.BACKOFF_SCHEDULED) == [
        EventKind.ATTEMPT_FAILED
    ]


async def test_a_call_that_raises_with_section_12_rules_ends_fatal(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The fuller failure path (``retry_on`` and friends) gives the same outcome."""
    spec = TaskSpec(
        "poll", needs_a_feed, (), restart=RestartPolicy.ON_FAILURE, retry_on=(TypeError,)
    )
    async with open_supervisor() as sup:
        outcome = await (await sup.add(spec)).wait()
    assert outcome.kind is OutcomeKind.FATAL
    assert outcome.reason is not None
    assert outcome.reason.startswith("calling needs_a_feed failed: ")


async def test_a_call_that_raises_fails_start(autojump_clock: trio.abc.Clock) -> None:
    """``start()``: the FATAL outcome, as ``OutcomeError``."""
    async with open_supervisor() as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.start(TaskSpec("server", needs_a_feed, ()))
    assert info.value.outcome.kind is OutcomeKind.FATAL


async def takes_no_status() -> None:
    await trio.sleep(1.0)


async def needs_a_status(*, task_status: trio.TaskStatus[None]) -> None:
    task_status.started()


async def test_start_of_a_function_without_task_status_says_what_to_do(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``start()`` passes ``task_status``, as ``nursery.start`` does: a function that
    takes none ends FATAL with the documented reason, and its error says what to do (a note,
    which its traceback shows)."""
    async with open_supervisor() as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.start(TaskSpec("server", takes_no_status, ()))
    outcome = info.value.outcome
    assert outcome.reason == (
        "calling takes_no_status failed: "
        "takes_no_status() got an unexpected keyword argument 'task_status'"
    )
    assert outcome.error is not None
    assert outcome.error.__notes__ == [
        "start() and start_in_slot() pass task_status, as nursery.start does: give the"
        " function a task_status keyword argument, or add or submit the work instead"
    ]


async def test_add_of_a_function_that_needs_task_status_says_what_to_do(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``add()`` passes no ``task_status``: the error of a function that requires one
    says so."""
    async with open_supervisor() as sup:
        outcome = await (await sup.add(TaskSpec("server", needs_a_status, ()))).wait()
    assert outcome.kind is OutcomeKind.FATAL
    assert outcome.reason == (
        "calling needs_a_status failed: needs_a_status() missing 1 required keyword-only"
        " argument: 'task_status'"
    )
    assert outcome.error is not None
    assert outcome.error.__notes__ == ["only start() and start_in_slot() pass task_status"]


async def test_a_non_awaitable_result_keeps_its_reason(autojump_clock: trio.abc.Clock) -> None:
    """A call that returns (not raises) a non-awaitable: FATAL with ``str(error)``."""

    class Sync:
        def __call__(self) -> int:
            return 7

    async with open_supervisor() as sup:
        outcome = await (await sup.add(TaskSpec("t", Sync(), ()))).wait()  # type: ignore[arg-type]
    assert outcome.kind is OutcomeKind.FATAL
    assert outcome.reason == str(outcome.error)
    assert outcome.reason is not None
    assert not outcome.reason.startswith("calling")


# -- TaskWaiter.done ---------------------------------------------------------------------------


async def test_done_turns_true_when_the_outcome_is_committed(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", trio.sleep, 2.0))
        assert not waiter.done
        with pytest.raises(trio.WouldBlock):
            waiter.outcome_nowait()
        await trio.sleep(2.0)
        await trio.testing.wait_all_tasks_blocked()
        assert waiter.done
        assert waiter.outcome_nowait().kind is OutcomeKind.COMPLETED
