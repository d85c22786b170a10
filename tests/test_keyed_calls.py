"""Keyed calls (``run_in_slot``): the value and errors, automatic names, each policy,
``timeout``/``backoff`` options, and a cancelled caller; ``DeadlockError`` for work awaited
inside its own slot; fairness and permits across slots.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    DeadlockError,
    EventKind,
    OutcomeError,
    OutcomeKind,
    RejectionKind,
    Supervisor,
    TaskDefaults,
    TaskSpec,
    current_context,
)
from trio_taskvisor.testing import EventRecorder

from helpers import Occupancy, deferring, failing, job, join, queue, rejected, supervisor


async def submit_and_wait(sup: Supervisor, *requests: ControllerSpec) -> tuple[str, float]:
    """Submit ``requests`` in order and wait on the last: (how the wait ended, when)."""
    waiters = [await sup.submit(request) for request in requests]
    try:
        with trio.fail_after(60.0):  # a missed deadlock fails the test instead of hanging
            outcome = await waiters[-1].wait()
    except DeadlockError:
        return "deadlock", trio.current_time()
    except trio.TooSlowError:
        return "stuck", trio.current_time()
    return f"value {outcome.value!r}", trio.current_time()


# -- run_in_slot ---------------------------------------------------------------------------


async def test_run_in_slot_returns_the_value(autojump_clock: Any) -> None:
    """run_in_slot returns what the function returned."""
    async with supervisor(controller=ControllerConfig()) as sup:
        assert await sup.run_in_slot("s", job, 1.0, "value") == "value"
        assert trio.current_time() == 1.0


async def test_run_in_slot_raises_outcome_error_chained_to_the_failure(
    autojump_clock: Any,
) -> None:
    """A failing call raises OutcomeError(FAILED) chained to the task's exception."""
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", failing)
    assert info.value.outcome.kind is OutcomeKind.FAILED
    assert isinstance(info.value.__cause__, ValueError)


async def test_run_in_slot_uses_unique_automatic_names(autojump_clock: Any) -> None:
    """Each call runs under its own automatic task name, in the given slot."""

    async def whoami() -> tuple[str, str | None]:
        context = current_context()
        return context.name, context.slot

    async with supervisor(controller=ControllerConfig()) as sup:
        first = await sup.run_in_slot("s", whoami)
        second = await sup.run_in_slot("s", whoami)
    assert first[1] == second[1] == "s"
    assert first[0] != second[0]


async def test_regression_run_in_slot_works_beside_user_tasks_named_like_its_calls(
    autojump_clock: Any,
) -> None:
    """User tasks named like keyed calls' automatic work never make a keyed call fail."""

    async def whoami() -> str:
        return current_context().name

    async with supervisor(controller=ControllerConfig()) as sup:
        # The names of an earlier scheme, and the one a call would get now (its TaskId
        # comes next: ids are allocated in order).
        for n in range(1, 4):
            await sup.add(TaskSpec.once(f"s/call-{n}", trio.sleep_forever))
        next_id = sup.prepare_submission(queue("probe", job, 1.0, slot="p")).id + 1
        await sup.add(TaskSpec.once(f"whoami#{next_id}", trio.sleep_forever))
        names = [await sup.run_in_slot("s", whoami) for _ in range(3)]
        assert len(set(names)) == 3
        # A running keyed call reserves no name either.
        gate = trio.Event()
        seen: list[str] = []

        async def held_open() -> None:
            seen.append(current_context().name)
            await gate.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.run_in_slot, "s", held_open)
            await trio.testing.wait_all_tasks_blocked()
            await sup.add(TaskSpec.once(seen[0], trio.sleep_forever))
            gate.set()
        await sup.shutdown()


async def test_run_in_slot_queues_behind_the_owner(autojump_clock: Any) -> None:
    """The default policy QUEUE runs the call after the slot's owner."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 2.0, slot="s"))
        assert await sup.run_in_slot("s", job, 1.0, "call") == "call"
        assert trio.current_time() == 3.0


async def test_run_in_slot_replace_stops_the_owner(autojump_clock: Any) -> None:
    """policy=REPLACE stops the slot's owner and runs the call at once."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", job, 10.0, slot="s"))
        await trio.testing.wait_all_tasks_blocked()
        value = await sup.run_in_slot("s", job, 1.0, "call", policy=AdmissionPolicy.REPLACE)
        assert value == "call"
        assert trio.current_time() == 1.0
        assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_run_in_slot_join_returns_the_followed_value(autojump_clock: Any) -> None:
    """policy=JOIN on a busy slot returns the followed work's value; fn never runs."""
    log: list[str] = []
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 1.0, "owner", slot="s"))
        value = await sup.run_in_slot("s", job, 5.0, "call", log, policy=AdmissionPolicy.JOIN)
        assert value == "owner"
        assert trio.current_time() == 1.0
    assert log == []


async def test_run_in_slot_drop_if_running_raises_slot_busy(autojump_clock: Any) -> None:
    """policy=DROP_IF_RUNNING on a busy slot raises OutcomeError(SLOT_BUSY)."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", job, 1.0, policy=AdmissionPolicy.DROP_IF_RUNNING)
        assert trio.current_time() == 0.0
    assert info.value.outcome == rejected(RejectionKind.SLOT_BUSY)


async def test_run_in_slot_drop_if_running_runs_on_idle_slot(autojump_clock: Any) -> None:
    """policy=DROP_IF_RUNNING on an idle slot runs the call."""
    async with supervisor(controller=ControllerConfig()) as sup:
        value = await sup.run_in_slot("s", job, 1.0, "call", policy=AdmissionPolicy.DROP_IF_RUNNING)
        assert value == "call"


async def test_run_in_slot_passes_timeout_to_the_task(autojump_clock: Any) -> None:
    """timeout= reaches TaskSpec.once: the call fails with a TimeoutError at the timeout."""
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", job, 10.0, timeout=1.5)
        assert trio.current_time() == 1.5
    assert info.value.outcome.kind is OutcomeKind.FAILED
    assert isinstance(info.value.outcome.error, TimeoutError)


async def test_run_in_slot_timeout_none_overrides_the_default(autojump_clock: Any) -> None:
    """timeout=None disables the supervisor's default timeout for the call."""
    async with supervisor(
        task_defaults=TaskDefaults(timeout=1.0), controller=ControllerConfig()
    ) as sup:
        assert await sup.run_in_slot("s", job, 3.0, "late", timeout=None) == "late"


async def test_run_in_slot_validates_backoff_through_task_spec(autojump_clock: Any) -> None:
    """backoff= reaches TaskSpec.once: a non-policy raises its TypeError; a policy works."""
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(TypeError, match="backoff"):
            await sup.run_in_slot("s", job, 1.0, backoff="fast")
        policy = BackoffPolicy.constant(2.0)
        assert await sup.run_in_slot("s", job, 1.0, "ok", backoff=policy) == "ok"


async def test_run_in_slot_refuses_a_number_of_retries(autojump_clock: Any) -> None:
    """A keyed call runs one attempt: ``max_retries=3`` raises at the call, naming it,
    before anything is submitted. Before, the work ran once and failed as if asked to."""
    async with supervisor(controller=ControllerConfig()) as sup:
        with pytest.raises(ConfigError, match=r"^run_in_slot\(\) runs one attempt"):
            await sup.run_in_slot("s", job, 1.0, max_retries=3)
        assert sup.controller_snapshot().slots == ()


# -- a cancelled caller --------------------------------------------------------------------


async def test_cancelled_run_in_slot_withdraws_held_work(autojump_clock: Any) -> None:
    """Cancelling the caller while its work is held withdraws it: it never runs."""
    recorder = EventRecorder()
    log: list[str] = []
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", job, 1.0, "call", log)
        assert scope.cancelled_caught
        assert trio.current_time() == 1.0
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert view.waiting == 0
        await sup.wait_idle()
    assert log == []
    [event] = recorder.of(EventKind.CONTROLLER_REJECTED, slot="s")
    assert (event.rejection, event.time) == (RejectionKind.REMOVED_FROM_QUEUE, 1.0)


async def test_cancelled_run_in_slot_withdraws_queued_work(autojump_clock: Any) -> None:
    """Cancelling the caller while its work is queued withdraws it: it never runs."""
    recorder = EventRecorder()
    log: list[str] = []
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", job, 1.0, "call", log)
        assert scope.cancelled_caught
        assert trio.current_time() == 1.0
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert view.queue_depth == 0
        await sup.wait_idle()
    assert log == []
    [event] = recorder.of(EventKind.CONTROLLER_REJECTED, slot="s")
    assert (event.rejection, event.time) == (RejectionKind.REMOVED_FROM_QUEUE, 1.0)


async def test_cancelled_run_in_slot_stops_running_work(autojump_clock: Any) -> None:
    """Cancelling the caller while its work runs stops it (CANCELLED) before returning."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", job, 10.0)
        assert scope.cancelled_caught
        assert trio.current_time() == 1.0
        assert sup.list() == ()
    [finished] = recorder.of(EventKind.TASK_FINISHED, slot="s")
    assert (finished.outcome, finished.time) == (OutcomeKind.CANCELLED, 1.0)


async def test_cancelled_run_in_slot_waits_for_a_deferred_stop(autojump_clock: Any) -> None:
    """The cancelled caller waits, shielded, until deferring work stops within grace."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0, controller=ControllerConfig()) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", deferring, 2.0)
        assert scope.cancelled_caught
        assert trio.current_time() == 2.0
    [finished] = recorder.of(EventKind.TASK_FINISHED, slot="s")
    assert finished.outcome is OutcomeKind.CANCELLED


async def test_cancelled_run_in_slot_waits_at_most_the_grace(autojump_clock: Any) -> None:
    """The cancelled caller's wait for the stop ends at the grace deadline (forced)."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0, controller=ControllerConfig()) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", deferring, 100.0)
        assert scope.cancelled_caught
        assert trio.current_time() == 6.0
    [finished] = recorder.of(EventKind.TASK_FINISHED, slot="s")
    assert finished.outcome is OutcomeKind.FORCE_ABORTED


# -- DeadlockError -------------------------------------------------------------------------


async def test_waiting_on_own_slot_queued_work_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting QUEUE work it submitted to its own slot gets DeadlockError."""
    async with supervisor(controller=ControllerConfig()) as sup:
        inner = queue("inner", job, 1.0, "x", slot="s")
        owner = await sup.submit(queue("owner", submit_and_wait, sup, inner, slot="s"))
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_own_slot_held_work_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting work held behind its own slot gets DeadlockError."""
    async with supervisor(max_slot_queue=0) as sup:
        inner = queue("inner", job, 1.0, "x", slot="s", wait=True)
        owner = await sup.submit(queue("owner", submit_and_wait, sup, inner, slot="s"))
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_joiner_of_own_queued_work_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting a JOIN that follows work queued behind it gets DeadlockError."""
    async with supervisor(controller=ControllerConfig()) as sup:
        inner = queue("inner", job, 1.0, "x", slot="s")
        joiner = join("joiner", job, 1.0, slot="s")
        owner = await sup.submit(queue("owner", submit_and_wait, sup, inner, joiner, slot="s"))
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_joiner_of_itself_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting a JOIN that follows the owner itself gets DeadlockError."""
    async with supervisor(controller=ControllerConfig()) as sup:
        joiner = join("joiner", job, 1.0, slot="s")
        owner = await sup.submit(queue("owner", submit_and_wait, sup, joiner, slot="s"))
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_work_in_another_slot_works(autojump_clock: Any) -> None:
    """A slot owner awaiting work in another slot gets its outcome normally."""
    async with supervisor(controller=ControllerConfig()) as sup:
        other = queue("inner", job, 1.0, "x", slot="other")
        owner = await sup.submit(queue("owner", submit_and_wait, sup, other, slot="s"))
        assert (await owner.wait()).value == ("value 'x'", 1.0)


async def test_added_task_never_gets_deadlock_error(autojump_clock: Any) -> None:
    """A task added with add (no slot) awaiting queued work waits normally."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        inner = queue("inner", job, 1.0, "x", slot="s")
        added = await sup.add(TaskSpec.once("s", submit_and_wait, sup, inner))
        assert (await added.wait()).value == ("value 'x'", 2.0)


# -- fairness and permits ------------------------------------------------------------------


async def test_backlog_in_one_slot_does_not_delay_another_slot(autojump_clock: Any) -> None:
    """With max_concurrent=1, new work in another slot waits at most one backlog unit."""
    async with supervisor(max_concurrent=1, controller=ControllerConfig()) as sup:
        for i in range(20):
            await sup.submit(queue(f"a{i}", job, 1.0, slot="a"))
        await trio.sleep(0.5)
        other = await sup.submit(queue("b0", job, 1.0, "b", slot="b"))
        assert (await other.wait()).value == "b"
        assert trio.current_time() == 2.0


async def test_queued_work_holds_no_permit(autojump_clock: Any) -> None:
    """Only slot owners wait for a permit: work queued behind a busy slot does not."""
    async with supervisor(max_concurrent=1, controller=ControllerConfig()) as sup:
        for i in range(5):
            await sup.submit(queue(f"a{i}", job, 10.0, slot="a"))
        await sup.submit(queue("b0", job, 10.0, slot="b"))
        await sup.submit(queue("c0", job, 10.0, slot="c"))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.statistics().waiting_for_permit == 2
        assert sup.controller_snapshot().total_queued == 4


async def test_many_slots_share_max_concurrent(autojump_clock: trio.abc.Clock) -> None:
    """300 slots at once with max_concurrent=8 run 8 at a time and all complete."""
    occupancy = Occupancy()
    async with supervisor(max_concurrent=8, controller=ControllerConfig()) as sup:
        waiters = [
            sup.submit_nowait(queue(f"t{i}", occupancy.run, 1, slot=f"s{i}")) for i in range(300)
        ]
        await sup.wait_idle()
        assert trio.current_time() == 38.0
    assert all(w.outcome_nowait().is_success for w in waiters)
    assert occupancy.total_peak == 8
    assert max(occupancy.peak.values()) == 1
