"""Readiness: ``start()`` and ``start_in_slot()`` with ``task_status``.

Virtual time throughout (``autojump_clock``, starting at 0): readiness times and the
caller's wait for a stop are exact.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ControllerSpec,
    DeadlockError,
    EventKind,
    OutcomeError,
    OutcomeKind,
    RejectionKind,
    SupervisorClosedError,
    TaskNameInUseError,
    TaskSpec,
    TaskState,
    current_context,
)
from trio_taskvisor.testing import EventRecorder

from helpers import forever, supervisor

ONE_SECOND = BackoffPolicy.constant(1.0)


async def serve(
    port: int, delay: float = 2.0, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """A server written for ``nursery.start``: listening after ``delay`` s, then serving."""
    await trio.sleep(delay)
    task_status.started(port)
    await trio.sleep_forever()


async def test_start_returns_when_the_task_is_ready(autojump_clock: trio.abc.Clock) -> None:
    """``start`` waits for ``task_status.started(value)``; the value is ``started_value``."""
    async with supervisor() as sup:
        waiter = await sup.start(TaskSpec.once("server", serve, 8080))
        assert trio.current_time() == 2.0
        assert waiter.started_value == 8080
        assert [(i.name, i.state) for i in sup.list()] == [("server", TaskState.RUNNING)]
        with pytest.raises(trio.WouldBlock):
            waiter.outcome_nowait()  # still serving


async def test_code_written_for_nursery_start_works_unchanged(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The same function under ``nursery.start`` and under ``Supervisor.start``."""
    async with trio.open_nursery() as nursery:
        assert await nursery.start(serve, 1) == 1
        nursery.cancel_scope.cancel()
    async with supervisor() as sup:
        assert (await sup.start(TaskSpec.once("s", serve, 2))).started_value == 2


async def test_add_never_passes_task_status(autojump_clock: trio.abc.Clock) -> None:
    """Work added with ``add`` sees its ``task_status`` default."""
    seen: list[object] = []

    async def body(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        seen.append(task_status)

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await waiter.wait()
    assert seen == [trio.TASK_STATUS_IGNORED]
    assert waiter.started_value is None


async def test_every_attempt_gets_a_task_status(autojump_clock: trio.abc.Clock) -> None:
    """An attempt that fails before ``started`` is retried; a later attempt makes it ready."""

    async def flaky_server(*, task_status: trio.TaskStatus[int]) -> None:
        attempt = current_context().attempt
        await trio.sleep(0.5)
        if attempt < 3:
            raise ConnectionError("port busy")
        task_status.started(attempt)
        await trio.sleep_forever()

    async with supervisor() as sup:
        waiter = await sup.start(TaskSpec.restartable("t", flaky_server, backoff=ONE_SECOND))
        assert trio.current_time() == 3 * 0.5 + 2 * 1.0
        assert waiter.started_value == 3


async def test_only_the_first_started_counts(autojump_clock: trio.abc.Clock) -> None:
    """Later attempts get a status whose ``started()`` does nothing."""
    calls: list[int] = []

    async def body(*, task_status: trio.TaskStatus[int]) -> None:
        attempt = current_context().attempt
        task_status.started(attempt)
        calls.append(attempt)
        await trio.sleep(1.0)
        if attempt < 3:
            raise ValueError("again")

    async with supervisor() as sup:
        waiter = await sup.start(TaskSpec.restartable("t", body, backoff=ONE_SECOND))
        assert waiter.started_value == 1
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert calls == [1, 2, 3]
    assert waiter.started_value == 1


async def test_a_second_started_in_one_attempt_raises(autojump_clock: trio.abc.Clock) -> None:
    """As in trio, calling ``started()`` twice on one status is a ``RuntimeError``."""
    errors: list[str] = []

    async def body(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            task_status.started()
        except RuntimeError as exc:
            errors.append(str(exc))

    async with supervisor() as sup:
        waiter = await sup.start(TaskSpec.once("t", body))
        await waiter.wait()
    assert errors == ["called 'started' twice on the same task status"]


async def test_regression_started_from_a_worker_thread_raises_and_start_learns_the_outcome() -> (
    None
):
    """``task_status.started()`` called in a worker thread raises ``RuntimeError`` naming
    ``trio.from_thread``, before it changes anything; the task then fails and ``start``
    raises ``OutcomeError`` for it. Before, the status was marked called and the event
    half set (trio's "must be called from async context" came after): ``start`` waited
    for ever, though the task's outcome was committed. The real clock: a worker thread
    runs in real time, and the autojump clock would jump while it does."""
    errors: list[str] = []

    async def binds_in_a_thread(*, task_status: trio.TaskStatus[int]) -> None:
        try:
            await trio.to_thread.run_sync(task_status.started, 8080)
        except RuntimeError as exc:
            errors.append(str(exc))
            raise
        await trio.sleep_forever()

    async def through_trio(*, task_status: trio.TaskStatus[int]) -> None:
        await trio.to_thread.run_sync(trio.from_thread.run_sync, task_status.started, 8080)
        await trio.sleep_forever()

    with trio.fail_after(10):  # a liveness bound
        async with supervisor() as sup:
            with pytest.raises(OutcomeError) as info:
                await sup.start(TaskSpec.once("wrong", binds_in_a_thread))
            assert info.value.outcome.kind is OutcomeKind.FAILED
            waiter = await sup.start(TaskSpec.once("right", through_trio))
            assert waiter.started_value == 8080
            await sup.cancel("right")
    assert errors == [
        "task_status.started() works only in the thread of the supervisor's trio run; from "
        "a worker thread, go through trio.from_thread.run_sync(task_status.started, value)"
    ]


async def test_start_raises_outcome_error_for_a_task_that_completes_unready(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A COMPLETED outcome before ``started()`` raises ``OutcomeError`` too."""

    async def quits(*, task_status: trio.TaskStatus[None]) -> str:
        await trio.sleep(1.0)
        return "bye"

    async with supervisor() as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.start(TaskSpec.once("t", quits))
        assert trio.current_time() == 1.0
    assert info.value.outcome.kind is OutcomeKind.COMPLETED
    assert info.value.outcome.value == "bye"


async def test_start_raises_outcome_error_chained_to_the_failure(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A task that fails for good before it is ready: ``OutcomeError`` from its error."""
    error = OSError("address in use")

    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise error

    async with supervisor() as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.start(TaskSpec.restartable("t", broken, backoff=ONE_SECOND, max_retries=2))
        assert trio.current_time() == 2.0
    assert info.value.outcome.kind is OutcomeKind.FAILED
    assert info.value.__cause__ is error


@pytest.mark.parametrize(
    ("deferred", "outcome", "returns_at"),
    [
        pytest.param(3.0, OutcomeKind.CANCELLED, 3.0, id="stops-within-grace"),
        pytest.param(10.0, OutcomeKind.FORCE_ABORTED, 6.0, id="forced-at-grace"),
    ],
)
async def test_cancelling_the_caller_of_start_stops_the_task_and_waits(
    autojump_clock: trio.abc.Clock, deferred: float, outcome: OutcomeKind, returns_at: float
) -> None:
    """The caller waits for the stop, shielded, for at most the grace window (5 s)."""

    async def slow_to_stop(*, task_status: trio.TaskStatus[None]) -> None:
        with current_context().defer_cancel():
            await trio.sleep(deferred)
        await trio.sleep_forever()

    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.start(TaskSpec.once("t", slow_to_stop))
        assert scope.cancelled_caught
        assert trio.current_time() == returns_at  # the defer_cancel() block began at 0
        assert sup.list() == ()
    finished = recorder.of(EventKind.TASK_FINISHED, name="t")
    assert [e.outcome for e in finished] == [outcome]


async def test_cancelled_caller_of_start_leaves_the_task_stopped(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After the cancelled ``start``, the task has ended CANCELLED."""

    async def never_ready(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep_forever()

    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        with trio.move_on_after(1.0):
            await sup.start(TaskSpec.once("t", never_ready))
        assert trio.current_time() == 1.0
    finished = recorder.of(EventKind.TASK_FINISHED, name="t")
    assert [e.outcome for e in finished] == [OutcomeKind.CANCELLED]


async def test_start_raises_add_rejections_and_stops_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A duplicate name raises ``TaskNameInUseError``; the task of that name runs on."""
    async with supervisor() as sup:
        first = await sup.start(TaskSpec.once("server", serve, 1))
        with pytest.raises(TaskNameInUseError):
            await sup.start(TaskSpec.once("server", serve, 2))
        assert [i.id for i in sup.list()] == [first.id]
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            await sup.start(TaskSpec.once("late", serve, 3))


async def test_start_is_a_checkpoint(autojump_clock: trio.abc.Clock) -> None:
    """``start`` is a checkpoint even when the task is ready at its first step."""

    async def ready_at_once(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep_forever()

    async with supervisor() as sup:
        with trio.testing.assert_checkpoints():
            await sup.start(TaskSpec.once("t", ready_at_once))


# -- start_in_slot ---------------------------------------------------------------------------


async def test_start_in_slot_waits_through_the_queue(autojump_clock: trio.abc.Clock) -> None:
    """Queued behind a 3 s owner, the work is ready 2 s after it starts: at 5 s."""
    async with supervisor(max_slot_queue=4) as sup:
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("owner", trio.sleep, 3.0), slot="db")
        )
        waiter = await sup.start_in_slot(
            ControllerSpec.queue(TaskSpec.once("migrator", serve, 5432), slot="db")
        )
        assert trio.current_time() == 5.0
        assert waiter.started_value == 5432
        assert owner.outcome_nowait().kind is OutcomeKind.COMPLETED
        view = sup.controller_snapshot().slot("db")
        assert view is not None
        assert view.owner_id == waiter.id


async def test_start_in_slot_raises_outcome_error_when_rejected(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A rejection is a final outcome before readiness: ``OutcomeError(REJECTED)``."""
    async with supervisor(max_slot_queue=4) as sup:
        await sup.start_in_slot(ControllerSpec.queue(TaskSpec.once("a", serve, 1), slot="k"))
        with pytest.raises(OutcomeError) as info:
            await sup.start_in_slot(
                ControllerSpec.drop_if_running(TaskSpec.once("b", serve, 2), slot="k")
            )
    assert info.value.outcome.rejection is RejectionKind.SLOT_BUSY


async def test_cancelled_start_in_slot_withdraws_queued_work(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cancelled while its work is queued: the work is withdrawn and never runs."""
    ran: list[str] = []

    async def body(*, task_status: trio.TaskStatus[None]) -> None:
        ran.append("ran")

    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=4) as sup:
        await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", forever), slot="k"))
        with trio.move_on_after(1.0):
            await sup.start_in_slot(ControllerSpec.queue(TaskSpec.once("queued", body), slot="k"))
        assert trio.current_time() == 1.0
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 0
    assert ran == []
    rejected = recorder.of(EventKind.CONTROLLER_REJECTED, name="queued")
    assert [e.rejection for e in rejected] == [RejectionKind.REMOVED_FROM_QUEUE]


async def test_start_in_slot_refuses_join(autojump_clock: trio.abc.Clock) -> None:
    """A JOIN starts no work of its own to wait for: ``TypeError``."""
    async with supervisor(max_slot_queue=4) as sup:
        with pytest.raises(TypeError, match="JOIN"):
            await sup.start_in_slot(
                ControllerSpec(TaskSpec.once("j", serve, 1), AdmissionPolicy.JOIN, "k")
            )


# -- start / start_in_slot as waits: wait-for cycles -----------------------------------------


async def test_start_in_slot_behind_the_callers_own_slot_raises_and_withdraws_the_work(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The owner of 'k' waiting for the readiness of work queued behind 'k' closes a
    cycle: ``DeadlockError`` at once, and the queued work is stopped (withdrawn)."""
    ran: list[str] = []

    async def body(*, task_status: trio.TaskStatus[None]) -> None:
        ran.append("ran")
        task_status.started()

    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=4) as sup:

        async def owner() -> str:
            with pytest.raises(DeadlockError):
                await sup.start_in_slot(
                    ControllerSpec.queue(TaskSpec.once("inner", body), slot="k")
                )
            return "raised"

        waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", owner), slot="k"))
        assert (await waiter.wait()).value == "raised"
        assert trio.current_time() == 0.0
    assert ran == []
    [event] = recorder.of(EventKind.CONTROLLER_REJECTED, name="inner")
    assert event.rejection is RejectionKind.REMOVED_FROM_QUEUE


async def test_start_waiting_for_the_callers_own_permit_raises_and_stops_the_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    """With ``max_concurrent=1`` a task that ``start``s another waits for the permit it
    holds itself: ``DeadlockError``, and the started task is stopped as ``remove`` does."""
    ran: list[str] = []

    async def body(*, task_status: trio.TaskStatus[None]) -> None:
        ran.append("ran")
        task_status.started()

    recorder = EventRecorder()
    async with supervisor(recorder, max_concurrent=1) as sup:

        async def outer() -> list[str]:
            with pytest.raises(DeadlockError):
                await sup.start(TaskSpec.once("inner", body))
            return [i.name for i in sup.list()]

        waiter = await sup.add(TaskSpec.once("outer", outer))
        assert (await waiter.wait()).value == ["outer"]
        assert trio.current_time() == 0.0
    assert ran == []
    [finished] = recorder.of(EventKind.TASK_FINISHED, name="inner")
    assert finished.outcome is OutcomeKind.CANCELLED
    assert recorder.of(EventKind.TASK_REMOVE_REQUESTED, name="inner")
