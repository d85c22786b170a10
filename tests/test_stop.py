"""Stopping one task: soft stop, grace, force, and the remove/cancel calls."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    EventKind,
    FatalError,
    OutcomeKind,
    RejectionKind,
    ResourceLimitError,
    Supervisor,
    TaskFailure,
    TaskNameInUseError,
    TaskSpec,
    TaskState,
    current_context,
)
from trio_taskvisor.testing import EventRecorder

from helpers import ATTEMPT_KINDS, deferring, failing, forever, stubborn, supervisor

# -- soft stop ---------------------------------------------------------------------------


async def test_soft_stop_cancels_attempt_at_once(autojump_clock: trio.abc.Clock) -> None:
    """A stop delivers trio cancellation at once: CANCELLED at the stop's time."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(3.0)
        assert await sup.remove("t") is True
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 3.0


async def test_stopped_restartable_task_is_not_restarted(autojump_clock: trio.abc.Clock) -> None:
    """A stop ends a restartable task CANCELLED after one attempt."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        waiter = await sup.add(TaskSpec.restartable("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
    assert recorder.kinds(*ATTEMPT_KINDS) == [
        EventKind.ATTEMPT_STARTING,
        EventKind.ATTEMPT_CANCELLED,
    ]


async def test_cancel_requested_is_false_before_stop(autojump_clock: trio.abc.Clock) -> None:
    """``ctx.cancel_requested`` is false while no stop was requested."""
    seen: list[bool] = []

    async def body() -> None:
        seen.append(current_context().cancel_requested)

    async with supervisor() as sup:
        await (await sup.add(TaskSpec.once("t", body))).wait()
    assert seen == [False]


async def test_cancel_requested_is_true_after_stop(autojump_clock: trio.abc.Clock) -> None:
    """``ctx.cancel_requested`` turns true when the stop is requested."""
    seen: list[bool] = []

    async def body() -> None:
        ctx = current_context()
        with ctx.defer_cancel():
            await trio.sleep(10.0)
            seen.append(ctx.cancel_requested)

    async with supervisor(grace=60.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        await sup.remove("t")
        await waiter.wait()
    assert seen == [True]


async def test_wait_cancel_requested_returns_at_stop(autojump_clock: trio.abc.Clock) -> None:
    """``await ctx.wait_cancel_requested()`` returns at the moment of the stop."""
    woke: list[float] = []

    async def body() -> None:
        ctx = current_context()
        with ctx.defer_cancel():
            await ctx.wait_cancel_requested()
            woke.append(trio.current_time())

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(4.0)
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
    assert woke == [4.0]


async def test_defer_cancel_block_runs_on_within_grace(autojump_clock: trio.abc.Clock) -> None:
    """A ``defer_cancel()`` block keeps running after the stop, within grace."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 4.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        await sup.remove("t")
        outcome = await waiter.wait()
        assert trio.current_time() == 4.0
        assert outcome.kind is OutcomeKind.CANCELLED


async def test_defer_cancel_block_cancelled_at_grace_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """At grace expiry the stop is forced into the deferred block."""
    cancelled_at: list[float] = []

    async def body() -> None:
        with current_context().defer_cancel():
            try:
                await trio.sleep(100.0)
            except trio.Cancelled:
                cancelled_at.append(trio.current_time())
                raise

    async with supervisor(grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
        await trio.testing.wait_all_tasks_blocked()
        assert sup.alive_snapshot() == ()
    assert cancelled_at == [6.0]


async def test_checkpoint_after_deferred_block_ends_attempt(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Once a deferred block ends, the pending stop lands at the next checkpoint."""
    reached: list[str] = []

    async def body() -> None:
        with current_context().defer_cancel():
            await trio.sleep(3.0)
        await trio.sleep(100.0)
        reached.append("after")

    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 3.0
    assert reached == []


async def test_nested_defer_cancel_blocks_forced_together(
    autojump_clock: trio.abc.Clock,
) -> None:
    """At the grace deadline the force reaches nested deferred blocks, inner and outer."""
    exited: list[tuple[str, float]] = []

    async def body() -> None:
        ctx = current_context()
        try:
            with ctx.defer_cancel():
                try:
                    with ctx.defer_cancel():
                        await trio.sleep(100.0)
                finally:
                    exited.append(("inner", trio.current_time()))
                await trio.sleep(100.0)
        finally:
            exited.append(("outer", trio.current_time()))

    async with supervisor(grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
    assert exited == [("inner", 5.0), ("outer", 5.0)]


async def test_defer_cancel_in_child_task_forced_at_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A deferred block in a child task of the attempt is forced at the deadline too."""
    exited_at: list[float] = []

    async def child() -> None:
        with current_context().defer_cancel():
            try:
                await trio.sleep(100.0)
            finally:
                exited_at.append(trio.current_time())

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    async with supervisor(grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
        await trio.testing.wait_all_tasks_blocked()
        assert sup.alive_snapshot() == ()
    assert exited_at == [6.0]


# -- force -------------------------------------------------------------------------------


async def test_force_commits_outcome_at_grace_deadline(autojump_clock: trio.abc.Clock) -> None:
    """A task that ignores the stop is FORCE_ABORTED exactly at the deadline."""
    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        await sup.remove("t")
        outcome = await waiter.wait()
        assert trio.current_time() == 6.0
        assert outcome.kind is OutcomeKind.FORCE_ABORTED
        assert outcome.reason is not None


async def test_forced_task_leaves_list_at_deadline(autojump_clock: trio.abc.Clock) -> None:
    """``list()`` drops a forced task at the deadline, before it exits."""
    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert [info.state for info in sup.list()] == [TaskState.STOPPING]
        await waiter.wait()
        assert sup.list() == ()


async def test_forced_task_stays_alive_until_physical_exit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A forced task stays in ``alive_snapshot()`` until it physically exits."""
    async with supervisor(grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await waiter.wait()
        assert sup.alive_snapshot() == ("t",)
        assert sup.is_alive("t")
        await trio.sleep_until(20.0)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.alive_snapshot() == ()
        assert not sup.is_alive("t")


async def test_forced_task_keeps_name_reserved(autojump_clock: trio.abc.Clock) -> None:
    """Adding the name of a forced but still running task raises TaskNameInUseError."""
    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await waiter.wait()
        with pytest.raises(TaskNameInUseError) as excinfo:
            await sup.add(TaskSpec.once("t", forever))
        assert excinfo.value.name == "t"


async def test_forced_task_name_rejects_add_nowait(autojump_clock: trio.abc.Clock) -> None:
    """``add_nowait`` of a forced but still running task's name resolves REJECTED."""
    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await waiter.wait()
        outcome = await sup.add_nowait(TaskSpec.once("t", forever)).wait()
        assert outcome.kind is OutcomeKind.REJECTED
        assert outcome.rejection is RejectionKind.ALREADY_EXISTS


async def test_forced_task_keeps_registered_tasks_unit(autojump_clock: trio.abc.Clock) -> None:
    """A forced but still running task counts against ``max_registered_tasks``."""
    async with supervisor(stuck=("t",), grace=5.0, max_registered_tasks=1) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await waiter.wait()
        with pytest.raises(ResourceLimitError):
            await sup.add(TaskSpec.once("other", forever))


async def test_name_reusable_after_forced_task_exits(autojump_clock: trio.abc.Clock) -> None:
    """After the physical exit the name is free again, under a new TaskId."""
    async with supervisor(grace=5.0, max_registered_tasks=1) as sup:
        old = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await old.wait()
        await trio.sleep_until(20.0)
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert new.id > old.id
        assert [info.id for info in sup.list()] == [new.id]


async def test_defer_cancel_after_force_does_not_shield(autojump_clock: trio.abc.Clock) -> None:
    """A ``defer_cancel()`` block entered after the force is cancelled at once."""
    exited_at: list[float] = []

    async def body() -> None:
        try:
            with trio.CancelScope(shield=True):
                await trio.sleep(20.0)
            with current_context().defer_cancel():
                await trio.sleep(10.0)
        finally:
            exited_at.append(trio.current_time())

    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
    assert exited_at == [20.0]


async def test_outcome_cancelled_when_attempt_returns_within_grace(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An attempt that returns a value after the stop still ends CANCELLED."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 3.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELLED
        assert outcome.value is None


@pytest.mark.parametrize(
    "error", [ValueError("boom"), TaskFailure("boom", exit_code=3), FatalError("fatal")]
)
async def test_outcome_cancelled_when_attempt_raises_within_grace(
    autojump_clock: trio.abc.Clock, error: Exception
) -> None:
    """An attempt that raises after the stop, within grace, ends CANCELLED."""

    async def body() -> None:
        with current_context().defer_cancel():
            await trio.sleep(3.0)
        raise error

    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELLED
        assert outcome.error is None
        assert trio.current_time() == 3.0


async def test_outcome_cancelled_when_attempt_swallows_cancellation(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An attempt that catches the stop's Cancelled and returns ends CANCELLED."""

    async def body() -> str | None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            return "swallowed"

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED


async def test_grace_zero_forces_at_moment_of_stop(autojump_clock: trio.abc.Clock) -> None:
    """With ``grace=0`` a deferred task is FORCE_ABORTED when the stop is processed."""
    async with supervisor(grace=0.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 10.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(2.0)
        await sup.remove("t")
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FORCE_ABORTED
        assert trio.current_time() == 2.0
        await trio.testing.wait_all_tasks_blocked()
        assert sup.alive_snapshot() == ()


async def test_grace_zero_forces_even_cooperative_task(autojump_clock: trio.abc.Clock) -> None:
    """With ``grace=0`` even a task that would exit at its next checkpoint is forced."""
    async with supervisor(grace=0.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED


async def test_stop_during_backoff_ends_cancelled_without_attempt_event(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A stop during backoff ends the task CANCELLED with no further attempt event."""
    recorder = EventRecorder()
    spec = TaskSpec.restartable("t", failing, backoff=BackoffPolicy.constant(10.0))
    async with supervisor(recorder) as sup:
        waiter = await sup.add(spec)
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await recorder.wait_for(EventKind.BACKOFF_SCHEDULED, name="t")
        await trio.sleep(1.0)
        assert [info.state for info in sup.list()] == [TaskState.BACKOFF]
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 1.0
    assert recorder.kinds(*ATTEMPT_KINDS) == [
        EventKind.ATTEMPT_STARTING,
        EventKind.ATTEMPT_FAILED,
    ]


async def test_stop_while_waiting_for_permit_ends_cancelled_without_attempt_event(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A stop while waiting for a ``max_concurrent`` permit ends CANCELLED, no attempt."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_concurrent=1) as sup:
        await sup.add(TaskSpec.once("holder", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        waiter = await sup.add(TaskSpec.once("queued", forever))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.statistics().waiting_for_permit == 1
        await sup.remove("queued")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert sup.statistics().waiting_for_permit == 0
    assert recorder.of(EventKind.ATTEMPT_STARTING, name="queued") == []
    assert recorder.of(EventKind.ATTEMPT_CANCELLED, name="queued") == []


async def test_force_aborted_attempt_keeps_permit_until_exit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A forced attempt holds its ``max_concurrent`` permit until it physically exits."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0, max_concurrent=1) as sup:
        stuck = await sup.add(TaskSpec.once("stuck", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("stuck")
        await stuck.wait()
        await sup.add(TaskSpec.once("next", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        started = await recorder.wait_for(EventKind.ATTEMPT_STARTING, name="next")
        assert started.time == 20.0


# -- remove and cancel -------------------------------------------------------------------


async def test_remove_returns_true_to_claimer(autojump_clock: trio.abc.Clock) -> None:
    """``remove`` returns True to the caller that claims the stop."""
    async with supervisor() as sup:
        await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert await sup.remove("t") is True


@pytest.mark.parametrize("method", ["remove", "cancel"])
async def test_concurrent_stops_have_exactly_one_claimer(
    autojump_clock: trio.abc.Clock, method: str
) -> None:
    """Of several concurrent ``remove``/``cancel`` calls exactly one returns True."""
    results: list[bool] = []

    async def stop(sup: Supervisor) -> None:
        results.append(await getattr(sup, method)("t"))

    async with supervisor(grace=10.0) as sup:
        await sup.add(TaskSpec.once("t", deferring, 4.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(stop, sup)
    assert sorted(results) == [False, False, False, False, True]


async def test_remove_returns_false_when_already_stopping(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A second ``remove`` of a stopping task returns False."""
    async with supervisor(grace=10.0) as sup:
        await sup.add(TaskSpec.once("t", deferring, 5.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert await sup.remove("t") is True
        assert await sup.remove("t") is False


async def test_remove_finished_task_returns_false(autojump_clock: trio.abc.Clock) -> None:
    """``remove`` of a task that already ended returns False."""

    async def quick() -> None:
        pass

    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", quick))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await waiter.wait()
        assert await sup.remove(waiter.id) is False
        assert await sup.remove("t") is False


async def test_remove_does_not_wait_for_the_stop(autojump_clock: trio.abc.Clock) -> None:
    """``remove`` returns at once, while the task is still stopping."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 5.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert trio.current_time() == 0.0
        with pytest.raises(trio.WouldBlock):
            waiter.outcome_nowait()


async def test_remove_of_forced_running_task_returns_false(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A forced task that still runs is no longer a stop target."""
    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        await waiter.wait()
        assert await sup.remove("t") is False
        assert await sup.remove(waiter.id) is False
        assert await sup.cancel("t") is False


@pytest.mark.parametrize("by", ["id", "name"])
async def test_remove_targets_by_id_or_name(autojump_clock: trio.abc.Clock, by: str) -> None:
    """``remove`` finds a task by its TaskId and by its name."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert await sup.remove(waiter.id if by == "id" else "t") is True
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED


@pytest.mark.parametrize("by", ["id", "name"])
async def test_remove_right_after_add_nowait_sees_task(
    autojump_clock: trio.abc.Clock, by: str
) -> None:
    """A remove sent right after ``add_nowait`` is ordered after the add."""
    async with supervisor() as sup:
        waiter = sup.add_nowait(TaskSpec.once("t", forever))
        assert await sup.remove(waiter.id if by == "id" else "t") is True
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED


async def test_cancel_returns_true_after_outcome_committed(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``cancel`` claims the stop and returns once the outcome is committed."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 4.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert await sup.cancel("t") is True
        assert trio.current_time() == 4.0
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED
        assert sup.list() == ()


async def test_cancel_joining_a_stop_returns_false_after_outcome(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A ``cancel`` that joins a claimed stop returns False, once the task ended."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 4.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        assert await sup.remove("t") is True
        assert await sup.cancel(waiter.id) is False
        assert trio.current_time() == 4.0
        assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_cancel_unknown_target_returns_false(autojump_clock: trio.abc.Clock) -> None:
    """``cancel`` of an unknown target returns False at once."""
    async with supervisor() as sup:
        assert await sup.cancel("nobody") is False
        assert trio.current_time() == 0.0


async def test_cancel_of_forced_task_returns_at_grace_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``cancel`` of a task that ignores the stop returns at the grace deadline."""
    async with supervisor(stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(1.0)
        assert await sup.cancel("t") is True
        assert trio.current_time() == 6.0
        assert waiter.outcome_nowait().kind is OutcomeKind.FORCE_ABORTED
        assert sup.is_alive("t")


async def test_cancel_bounded_by_move_on_after_stop_continues(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Leaving ``cancel`` early through ``move_on_after`` does not undo the stop."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 4.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        with trio.move_on_after(1.0) as scope:
            await sup.cancel("t")
        assert scope.cancelled_caught
        assert [info.state for info in sup.list()] == [TaskState.STOPPING]
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 4.0


async def test_cancel_bounded_by_move_on_after_still_forces(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A stop whose ``cancel`` caller left early is still forced at the deadline."""
    async with supervisor(grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 100.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        with trio.move_on_after(1.0):
            await sup.cancel("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
        assert trio.current_time() == 5.0


@pytest.mark.parametrize("method", ["remove", "cancel"])
async def test_stop_during_shutdown_returns_false(
    autojump_clock: trio.abc.Clock, method: str
) -> None:
    """``remove``/``cancel`` during shutdown join the shutdown's stop and return False."""
    async with supervisor(grace=10.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 4.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.shutdown)
            await trio.testing.wait_all_tasks_blocked()
            assert await getattr(sup, method)("t") is False
            assert trio.current_time() == (4.0 if method == "cancel" else 0.0)
            assert (await waiter.wait()).kind is OutcomeKind.CANCELLED


@pytest.mark.parametrize("method", ["remove", "cancel"])
async def test_stop_after_shutdown_returns_false(
    autojump_clock: trio.abc.Clock, method: str
) -> None:
    """``remove``/``cancel`` after the shutdown finished return False, without raising."""
    async with supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.shutdown()
        assert await getattr(sup, method)("t") is False
        assert await getattr(sup, method)(waiter.id) is False


@pytest.mark.parametrize("method", ["remove", "cancel"])
@pytest.mark.parametrize("target", [1.5, None, b"t", True, ("t",)])
async def test_bad_target_type_raises_type_error(
    autojump_clock: trio.abc.Clock, method: str, target: object
) -> None:
    """A target that is neither a TaskId nor a name raises TypeError."""
    async with supervisor() as sup:
        with pytest.raises(TypeError):
            await getattr(sup, method)(target)


# -- events ------------------------------------------------------------------------------


async def test_stop_publishes_remove_requested_finished_removed(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A stop publishes TASK_REMOVE_REQUESTED, TASK_FINISHED(CANCELLED), TASK_REMOVED."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        waiter = await sup.add(TaskSpec.once("t", forever))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await trio.sleep(2.0)
        await sup.remove("t")
        await waiter.wait()
        await recorder.wait_for(EventKind.TASK_REMOVED, name="t")
    kinds = (EventKind.TASK_REMOVE_REQUESTED, EventKind.TASK_FINISHED, EventKind.TASK_REMOVED)
    events = [e for e in recorder.events if e.kind in kinds]
    assert [e.kind for e in events] == list(kinds)
    assert all(e.task_id == waiter.id and e.time == 2.0 for e in events)
    assert events[1].outcome is OutcomeKind.CANCELLED
    assert events[1].reason is None


async def test_forced_stop_publishes_task_finished_at_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A forced stop publishes TASK_FINISHED(FORCE_ABORTED) and TASK_REMOVED at the deadline."""
    recorder = EventRecorder()
    async with supervisor(recorder, stuck=("t",), grace=5.0) as sup:
        waiter = await sup.add(TaskSpec.once("t", stubborn, 20.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        outcome = await waiter.wait()
        finished = await recorder.wait_for(EventKind.TASK_FINISHED, name="t")
        removed = await recorder.wait_for(EventKind.TASK_REMOVED, name="t")
        assert finished.outcome is OutcomeKind.FORCE_ABORTED
        assert finished.reason == outcome.reason
        assert finished.time == removed.time == 5.0


async def test_stop_with_infinite_grace_never_forces(autojump_clock: trio.abc.Clock) -> None:
    """With ``grace=inf`` a deferred block runs to its end, however long."""
    async with supervisor(grace=math.inf) as sup:
        waiter = await sup.add(TaskSpec.once("t", deferring, 1000.0))
        await trio.testing.wait_all_tasks_blocked()  # the body is running
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 1000.0
