"""Keyed scheduling in virtual time: wait-mode admission, JOIN, run_in_slot, DeadlockError,
fairness across slots, and the release of idle controller state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    DeadlockError,
    EventKind,
    OutcomeError,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    Supervisor,
    SupervisorConfig,
    TaskDefaults,
    TaskOutcome,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor._outcome import rejected_outcome
from trio_taskvisor.testing import EventRecorder

# -- helpers ------------------------------------------------------------------------------


@asynccontextmanager
async def supervisor(
    recorder: EventRecorder | None = None,
    *,
    grace: float = 5.0,
    max_concurrent: int | None = None,
    task_defaults: TaskDefaults | None = None,
    **controller: Any,
) -> AsyncIterator[Supervisor]:
    """Open a supervisor with a controller built from ``controller`` (grace 5 s)."""
    config = SupervisorConfig(
        grace=grace,
        max_concurrent=max_concurrent,
        task_defaults=TaskDefaults() if task_defaults is None else task_defaults,
        controller=ControllerConfig(**controller),
    )
    subscribers = () if recorder is None else (recorder,)
    async with open_supervisor(config, subscribers=subscribers) as sup:
        yield sup


async def job(seconds: float, value: object = None, log: list[str] | None = None) -> object:
    """Sleep ``seconds`` and return ``value``, logging ``value`` on start if asked."""
    if log is not None:
        log.append(str(value))
    await trio.sleep(seconds)
    return value


async def deferring(seconds: float) -> str:
    """Run ``seconds`` inside a ``defer_cancel()`` block, then return."""
    with current_context().defer_cancel():
        await trio.sleep(seconds)
    return "done"


async def failing() -> None:
    raise ValueError("boom")


def once(name: str, seconds: float = 1.0, value: object = None, **kw: Any) -> TaskSpec:
    return TaskSpec.once(name, job, seconds, value, **kw)


def queue(
    name: str, slot: str, seconds: float = 1.0, value: object = None, **kw: Any
) -> ControllerSpec:
    return ControllerSpec.queue(once(name, seconds, value), slot=slot, **kw)


def reasons(recorder: EventRecorder, waiter: TaskWaiter) -> list[str | None]:
    return [e.reason for e in recorder.of(EventKind.CONTROLLER_SUBMITTED, task_id=waiter.id)]


def rejected(kind: RejectionKind) -> TaskOutcome:
    return rejected_outcome(kind)


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


# -- wait-mode admission -----------------------------------------------------------------


async def test_wait_queue_is_held_when_slot_queue_is_full(autojump_clock: Any) -> None:
    """QUEUE with wait=True on a full slot queue is held, not rejected."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", "s"))
        held = await sup.submit(queue("held", "s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.WouldBlock):
            held.outcome_nowait()
        assert reasons(recorder, held) == ["held"]


async def test_wait_replace_is_held_when_total_pending_is_full(autojump_clock: Any) -> None:
    """REPLACE with wait=True is held when it needs a pending unit and none is free."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_total_pending=0) as sup:
        await sup.submit(queue("owner", "s", 10.0))
        held = await sup.submit(ControllerSpec.replace(once("held"), slot="s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.WouldBlock):
            held.outcome_nowait()
        assert reasons(recorder, held) == ["held"]


async def test_held_work_is_submitted_again_when_placed(autojump_clock: Any) -> None:
    """Held work publishes CONTROLLER_SUBMITTED "held", then again when it is placed."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", "s"))
        held = await sup.submit(queue("held", "s", wait=True))
        await held.wait()
    events = recorder.of(EventKind.CONTROLLER_SUBMITTED, task_id=held.id)
    assert [(e.reason == "held", e.time) for e in events] == [(True, 0.0), (False, 1.0)]


async def test_slot_view_waiting_counts_held_work(autojump_clock: Any) -> None:
    """SlotView.waiting counts the held submissions of the slot, not its queue."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", "s"))
        await sup.submit(queue("queued", "s"))
        await sup.submit(queue("held-1", "s", wait=True))
        await sup.submit(queue("held-2", "s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.queue_depth, view.waiting) == (1, 2)


async def test_held_work_past_max_waiters_is_rejected_resource_limit(autojump_clock: Any) -> None:
    """With max_waiters held submissions, the next one is REJECTED(RESOURCE_LIMIT)."""
    async with supervisor(max_slot_queue=0, max_waiters=1) as sup:
        await sup.submit(queue("owner", "s"))
        await sup.submit(queue("held", "s", wait=True))
        extra = await sup.submit(queue("extra", "s", wait=True))
        assert await extra.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert trio.current_time() == 0.0


async def test_max_waiters_zero_rejects_wait_mode_work_that_would_be_held(
    autojump_clock: Any,
) -> None:
    """max_waiters=0 is valid: wait-mode work that would be held is rejected at once."""
    async with supervisor(max_slot_queue=0, max_waiters=0) as sup:
        await sup.submit(queue("owner", "s"))
        extra = await sup.submit(queue("extra", "s", wait=True))
        assert await extra.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_held_work_keeps_fifo_order_per_slot(autojump_clock: Any) -> None:
    """Held submissions of one slot run in submission order, one after another."""
    log: list[str] = []
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(ControllerSpec.queue(TaskSpec.once("w0", job, 1.0, "w0", log), slot="s"))
        waiters = [
            await sup.submit(
                ControllerSpec.queue(
                    TaskSpec.once(f"w{i}", job, 1.0, f"w{i}", log), slot="s", wait=True
                )
            )
            for i in range(1, 5)
        ]
        await waiters[-1].wait()
        assert trio.current_time() == 5.0
    assert log == ["w0", "w1", "w2", "w3", "w4"]


async def test_wait_replace_is_held_behind_held_work_of_its_slot(autojump_clock: Any) -> None:
    """A wait-mode REPLACE keeps FIFO behind its slot's held work: held, owner untouched."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", "s", 10.0))
        await sup.submit(queue("held", "s", wait=True))
        replace = await sup.submit(ControllerSpec.replace(once("new"), slot="s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.status, view.queue_depth, view.waiting) == (SlotStatus.RUNNING, 0, 2)
        assert reasons(recorder, replace) == ["held"]


async def test_freed_capacity_skips_held_work_of_a_full_slot(autojump_clock: Any) -> None:
    """A pending unit freed goes to held work whose slot has room, past a full slot's."""
    async with supervisor(max_slot_queue=1, max_total_pending=2) as sup:
        await sup.submit(queue("a0", "a", 10.0))
        await sup.submit(queue("a1", "a"))
        await sup.submit(queue("b0", "b", 2.0))
        await sup.submit(queue("b1", "b"))
        await sup.submit(queue("c0", "c", 10.0))
        await sup.submit(queue("a2", "a", wait=True))  # oldest held; slot a stays full
        await sup.submit(queue("c1", "c", wait=True))  # held for the pending budget
        await trio.sleep(2.0)
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        views = {v.slot: (v.queue_depth, v.waiting) for v in snapshot.slots}
        assert views == {"a": (1, 1), "b": (0, 0), "c": (1, 0)}


async def test_freed_capacity_goes_to_the_oldest_held_work(autojump_clock: Any) -> None:
    """When one pending unit frees, the oldest held submission with room takes it."""
    async with supervisor(max_total_pending=1) as sup:
        await sup.submit(queue("a0", "a"))
        await sup.submit(queue("a1", "a"))
        await sup.submit(queue("b0", "b", 10.0))
        await sup.submit(queue("c0", "c", 10.0))
        await sup.submit(queue("c1", "c", wait=True))
        await sup.submit(queue("b1", "b", wait=True))
        await trio.sleep(1.0)  # a0 ends, a1 leaves the queue: one unit frees
        await trio.testing.wait_all_tasks_blocked()
        views = {v.slot: (v.queue_depth, v.waiting) for v in sup.controller_snapshot().slots}
        assert views == {"a": (0, 0), "b": (0, 1), "c": (1, 0)}


async def test_idle_slot_starts_its_oldest_held_work_at_once(autojump_clock: Any) -> None:
    """When the owner leaves and the queue is empty, the oldest held work starts then."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0, max_total_pending=0) as sup:
        await sup.submit(queue("owner", "s"))
        first = await sup.submit(queue("first", "s", wait=True))
        await sup.submit(queue("second", "s", wait=True))
        started = await recorder.wait_for(EventKind.ATTEMPT_STARTING, task_id=first.id)
        assert started.time == 1.0
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.owner_id, view.queue_depth, view.waiting) == (first.id, 0, 1)


async def test_new_slot_past_max_slots_is_rejected_even_with_wait(autojump_clock: Any) -> None:
    """A wait-mode submission for a new slot past max_slots is REJECTED(RESOURCE_LIMIT)."""
    async with supervisor(max_slots=1) as sup:
        await sup.submit(queue("a0", "a"))
        other = await sup.submit(queue("b0", "b", wait=True))
        assert await other.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert trio.current_time() == 0.0


async def test_removing_held_work_by_id_rejects_it(autojump_clock: Any) -> None:
    """remove(id) of held work returns True and resolves it REMOVED_FROM_QUEUE."""
    log: list[str] = []
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", "s"))
        held = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("held", job, 1.0, "held", log), slot="s", wait=True)
        )
        assert await sup.remove(held.id) is True
        assert await held.wait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert view.waiting == 0
    assert log == []


async def test_held_work_is_rejected_shutting_down_at_shutdown(autojump_clock: Any) -> None:
    """Shutdown resolves held work REJECTED(SHUTTING_DOWN)."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", "s", 10.0))
        held = await sup.submit(queue("held", "s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
    assert held.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)


async def test_held_replace_stops_the_owner_only_when_placed(autojump_clock: Any) -> None:
    """A held REPLACE leaves the owner running; it stops it when it is placed."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_total_pending=1) as sup:
        owner = await sup.submit(queue("a0", "a", 10.0))
        await sup.submit(queue("b0", "b", 2.0))
        await sup.submit(queue("b1", "b"))  # takes the only pending unit
        await sup.submit(ControllerSpec.replace(once("a1", value="new"), slot="a", wait=True))
        await trio.sleep(1.0)
        view = sup.controller_snapshot().slot("a")
        assert view is not None
        assert (view.status, view.waiting) == (SlotStatus.RUNNING, 1)
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 2.0
    [stop] = recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=owner.id)
    assert stop.time == 2.0


# -- JOIN ------------------------------------------------------------------------------------


async def test_join_on_busy_slot_resolves_to_the_owner_outcome(autojump_clock: Any) -> None:
    """A joiner on a slot with no queue resolves to the owner's outcome, when it does."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", "s", 1.0, 42))
        joiner = await sup.submit(ControllerSpec.join(once("joiner", 5.0, "mine"), slot="s"))
        outcome = await joiner.wait()
        assert trio.current_time() == 1.0
        assert outcome == await owner.wait()
        assert outcome.value == 42


async def test_join_follows_the_queue_tail(autojump_clock: Any) -> None:
    """A joiner on a slot with a queue resolves to the last queued work's outcome."""
    async with supervisor() as sup:
        await sup.submit(queue("first", "s", 1.0, "first"))
        await sup.submit(queue("second", "s", 1.0, "second"))
        joiner = await sup.submit(ControllerSpec.join(once("joiner", 5.0, "mine"), slot="s"))
        assert (await joiner.wait()).value == "second"
        assert trio.current_time() == 2.0


async def test_join_resolves_rejected_when_followed_work_is_superseded(
    autojump_clock: Any,
) -> None:
    """A joiner following a queue head that gets superseded resolves REJECTED(SUPERSEDED)."""
    async with supervisor() as sup:
        await sup.submit(queue("owner", "s", 10.0))
        head = await sup.submit(queue("head", "s"))
        joiner = await sup.submit(ControllerSpec.join(once("joiner"), slot="s"))
        await sup.submit(ControllerSpec.replace(once("new"), slot="s"))
        assert await joiner.wait() == rejected(RejectionKind.SUPERSEDED)
        assert await head.wait() == rejected(RejectionKind.SUPERSEDED)
        assert trio.current_time() == 0.0


async def test_join_on_idle_slot_runs_its_own_work(autojump_clock: Any) -> None:
    """A JOIN on an idle slot starts its own work, like any policy."""
    async with supervisor() as sup:
        joiner = await sup.submit(ControllerSpec.join(once("joiner", 1.0, "mine"), slot="s"))
        assert (await joiner.wait()).value == "mine"
        assert trio.current_time() == 1.0


async def test_joiner_id_is_never_registered(autojump_clock: Any) -> None:
    """A joiner's own TaskId never appears in list()."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", "s"))
        joiner = await sup.submit(ControllerSpec.join(once("joiner"), slot="s"))
        await trio.testing.wait_all_tasks_blocked()
        assert [info.id for info in sup.list()] == [owner.id]
        assert joiner.id != owner.id


async def test_join_publishes_submitted_naming_the_followed_work(autojump_clock: Any) -> None:
    """A joiner publishes CONTROLLER_SUBMITTED with reason "joined #N"."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.submit(queue("owner", "s"))
        tail = await sup.submit(queue("tail", "s"))
        joiner = await sup.submit(ControllerSpec.join(once("joiner"), slot="s"))
        await joiner.wait()
    assert reasons(recorder, joiner) == [f"joined {tail.id}"]


async def test_removing_a_joiner_detaches_it_only(autojump_clock: Any) -> None:
    """remove(joiner id) resolves the joiner REMOVED_FROM_QUEUE; the followed work runs on."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", "s", 1.0, "owner"))
        joiner = await sup.submit(ControllerSpec.join(once("joiner"), slot="s"))
        assert await sup.remove(joiner.id) is True
        assert await joiner.wait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        assert (await owner.wait()).value == "owner"
        assert trio.current_time() == 1.0


async def test_joiner_uses_a_max_waiters_unit(autojump_clock: Any) -> None:
    """A joiner counts against max_waiters: held work past it gets RESOURCE_LIMIT."""
    async with supervisor(max_slot_queue=0, max_waiters=1) as sup:
        await sup.submit(queue("owner", "s"))
        joiner = await sup.submit(ControllerSpec.join(once("joiner"), slot="s"))
        held = await sup.submit(queue("held", "s", wait=True))
        assert await held.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert (await joiner.wait()).kind is OutcomeKind.COMPLETED


async def test_join_past_max_waiters_is_rejected_resource_limit(autojump_clock: Any) -> None:
    """A JOIN on a busy slot with max_waiters in use is REJECTED(RESOURCE_LIMIT)."""
    async with supervisor(max_waiters=1) as sup:
        await sup.submit(queue("owner", "s"))
        await sup.submit(ControllerSpec.join(once("joiner-1"), slot="s"))
        extra = await sup.submit(ControllerSpec.join(once("joiner-2"), slot="s"))
        assert await extra.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_join_on_full_queue_follows_the_queue_tail_not_held_work(
    autojump_clock: Any,
) -> None:
    """With the queue full and work held, a JOIN follows the queue tail."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", "s", 1.0, "owner"))
        await sup.submit(queue("tail", "s", 1.0, "tail"))
        await sup.submit(queue("held", "s", 1.0, "held", wait=True))
        joiner = await sup.submit(ControllerSpec.join(once("joiner"), slot="s"))
        assert (await joiner.wait()).value == "tail"
        assert trio.current_time() == 2.0


# -- run_in_slot ---------------------------------------------------------------------------


async def test_run_in_slot_returns_the_value(autojump_clock: Any) -> None:
    """run_in_slot returns what the function returned."""
    async with supervisor() as sup:
        assert await sup.run_in_slot("s", job, 1.0, "value") == "value"
        assert trio.current_time() == 1.0


async def test_run_in_slot_raises_outcome_error_chained_to_the_failure(
    autojump_clock: Any,
) -> None:
    """A failing call raises OutcomeError(FAILED) chained to the task's exception."""
    async with supervisor() as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", failing)
    assert info.value.outcome.kind is OutcomeKind.FAILED
    assert isinstance(info.value.__cause__, ValueError)


async def test_run_in_slot_uses_unique_automatic_names(autojump_clock: Any) -> None:
    """Each call runs under its own automatic task name, in the given slot."""

    async def whoami() -> tuple[str, str | None]:
        context = current_context()
        return context.name, context.slot

    async with supervisor() as sup:
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

    async with supervisor() as sup:
        # The names of an earlier scheme, and the one a call would get now (its TaskId
        # comes next: ids are allocated in order).
        for n in range(1, 4):
            await sup.add(TaskSpec.once(f"s/call-{n}", trio.sleep_forever))
        next_id = sup.prepare_submission(queue("probe", "p")).id + 1
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
    async with supervisor() as sup:
        await sup.submit(queue("owner", "s", 2.0))
        assert await sup.run_in_slot("s", job, 1.0, "call") == "call"
        assert trio.current_time() == 3.0


async def test_run_in_slot_replace_stops_the_owner(autojump_clock: Any) -> None:
    """policy=REPLACE stops the slot's owner and runs the call at once."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", "s", 10.0))
        await trio.testing.wait_all_tasks_blocked()
        value = await sup.run_in_slot("s", job, 1.0, "call", policy=AdmissionPolicy.REPLACE)
        assert value == "call"
        assert trio.current_time() == 1.0
        assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_run_in_slot_join_returns_the_followed_value(autojump_clock: Any) -> None:
    """policy=JOIN on a busy slot returns the followed work's value; fn never runs."""
    log: list[str] = []
    async with supervisor() as sup:
        await sup.submit(queue("owner", "s", 1.0, "owner"))
        value = await sup.run_in_slot("s", job, 5.0, "call", log, policy=AdmissionPolicy.JOIN)
        assert value == "owner"
        assert trio.current_time() == 1.0
    assert log == []


async def test_run_in_slot_drop_if_running_raises_slot_busy(autojump_clock: Any) -> None:
    """policy=DROP_IF_RUNNING on a busy slot raises OutcomeError(SLOT_BUSY)."""
    async with supervisor() as sup:
        await sup.submit(queue("owner", "s"))
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", job, 1.0, policy=AdmissionPolicy.DROP_IF_RUNNING)
        assert trio.current_time() == 0.0
    assert info.value.outcome == rejected(RejectionKind.SLOT_BUSY)


async def test_run_in_slot_drop_if_running_runs_on_idle_slot(autojump_clock: Any) -> None:
    """policy=DROP_IF_RUNNING on an idle slot runs the call."""
    async with supervisor() as sup:
        value = await sup.run_in_slot("s", job, 1.0, "call", policy=AdmissionPolicy.DROP_IF_RUNNING)
        assert value == "call"


async def test_run_in_slot_passes_timeout_to_the_task(autojump_clock: Any) -> None:
    """timeout= reaches TaskSpec.once: the call fails with a TimeoutError at the timeout."""
    async with supervisor() as sup:
        with pytest.raises(OutcomeError) as info:
            await sup.run_in_slot("s", job, 10.0, timeout=1.5)
        assert trio.current_time() == 1.5
    assert info.value.outcome.kind is OutcomeKind.FAILED
    assert isinstance(info.value.outcome.error, TimeoutError)


async def test_run_in_slot_timeout_none_overrides_the_default(autojump_clock: Any) -> None:
    """timeout=None disables the supervisor's default timeout for the call."""
    async with supervisor(task_defaults=TaskDefaults(timeout=1.0)) as sup:
        assert await sup.run_in_slot("s", job, 3.0, "late", timeout=None) == "late"


async def test_run_in_slot_validates_backoff_through_task_spec(autojump_clock: Any) -> None:
    """backoff= reaches TaskSpec.once: a non-policy raises its TypeError; a policy works."""
    async with supervisor() as sup:
        with pytest.raises(TypeError, match="backoff"):
            await sup.run_in_slot("s", job, 1.0, backoff="fast")
        policy = BackoffPolicy.constant(2.0)
        assert await sup.run_in_slot("s", job, 1.0, "ok", backoff=policy) == "ok"


async def test_cancelled_run_in_slot_withdraws_held_work(autojump_clock: Any) -> None:
    """Cancelling the caller while its work is held withdraws it: it never runs."""
    recorder = EventRecorder()
    log: list[str] = []
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", "s", 10.0))
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
    async with supervisor(recorder) as sup:
        await sup.submit(queue("owner", "s", 10.0))
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
    async with supervisor(recorder) as sup:
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
    async with supervisor(recorder, grace=5.0) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", deferring, 2.0)
        assert scope.cancelled_caught
        assert trio.current_time() == 2.0
    [finished] = recorder.of(EventKind.TASK_FINISHED, slot="s")
    assert finished.outcome is OutcomeKind.CANCELLED


async def test_cancelled_run_in_slot_waits_at_most_the_grace(autojump_clock: Any) -> None:
    """The cancelled caller's wait for the stop ends at the grace deadline (forced)."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0) as sup:
        with trio.move_on_after(1.0) as scope:
            await sup.run_in_slot("s", deferring, 100.0)
        assert scope.cancelled_caught
        assert trio.current_time() == 6.0
    [finished] = recorder.of(EventKind.TASK_FINISHED, slot="s")
    assert finished.outcome is OutcomeKind.FORCE_ABORTED


# -- DeadlockError -------------------------------------------------------------------------


async def test_waiting_on_own_slot_queued_work_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting QUEUE work it submitted to its own slot gets DeadlockError."""
    async with supervisor() as sup:
        inner = queue("inner", "s", 1.0, "x")
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("owner", submit_and_wait, sup, inner), slot="s")
        )
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_own_slot_held_work_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting work held behind its own slot gets DeadlockError."""
    async with supervisor(max_slot_queue=0) as sup:
        inner = queue("inner", "s", 1.0, "x", wait=True)
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("owner", submit_and_wait, sup, inner), slot="s")
        )
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_joiner_of_own_queued_work_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting a JOIN that follows work queued behind it gets DeadlockError."""
    async with supervisor() as sup:
        inner = queue("inner", "s", 1.0, "x")
        joiner = ControllerSpec.join(once("joiner"), slot="s")
        owner = await sup.submit(
            ControllerSpec.queue(
                TaskSpec.once("owner", submit_and_wait, sup, inner, joiner), slot="s"
            )
        )
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_joiner_of_itself_raises_deadlock(autojump_clock: Any) -> None:
    """A slot owner awaiting a JOIN that follows the owner itself gets DeadlockError."""
    async with supervisor() as sup:
        joiner = ControllerSpec.join(once("joiner"), slot="s")
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("owner", submit_and_wait, sup, joiner), slot="s")
        )
        assert (await owner.wait()).value == ("deadlock", 0.0)


async def test_waiting_on_work_in_another_slot_works(autojump_clock: Any) -> None:
    """A slot owner awaiting work in another slot gets its outcome normally."""
    async with supervisor() as sup:
        other = queue("inner", "other", 1.0, "x")
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("owner", submit_and_wait, sup, other), slot="s")
        )
        assert (await owner.wait()).value == ("value 'x'", 1.0)


async def test_added_task_never_gets_deadlock_error(autojump_clock: Any) -> None:
    """A task added with add (no slot) awaiting queued work waits normally."""
    async with supervisor() as sup:
        await sup.submit(queue("owner", "s", 1.0))
        inner = queue("inner", "s", 1.0, "x")
        added = await sup.add(TaskSpec.once("s", submit_and_wait, sup, inner))
        assert (await added.wait()).value == ("value 'x'", 2.0)


# -- fairness ----------------------------------------------------------------------------------


async def test_backlog_in_one_slot_does_not_delay_another_slot(autojump_clock: Any) -> None:
    """With max_concurrent=1, new work in another slot waits at most one backlog unit."""
    async with supervisor(max_concurrent=1) as sup:
        for i in range(20):
            await sup.submit(queue(f"a{i}", "a", 1.0))
        await trio.sleep(0.5)
        other = await sup.submit(queue("b0", "b", 1.0, "b"))
        assert (await other.wait()).value == "b"
        assert trio.current_time() == 2.0


async def test_queued_work_holds_no_permit(autojump_clock: Any) -> None:
    """Only slot owners wait for a permit: work queued behind a busy slot does not."""
    async with supervisor(max_concurrent=1) as sup:
        for i in range(5):
            await sup.submit(queue(f"a{i}", "a", 10.0))
        await sup.submit(queue("b0", "b", 10.0))
        await sup.submit(queue("c0", "c", 10.0))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.statistics().waiting_for_permit == 2
        assert sup.controller_snapshot().total_queued == 4


# -- idle state ----------------------------------------------------------------------------------


async def test_settled_slots_release_all_controller_state(autojump_clock: Any) -> None:
    """Once every slot's work settles, no slot, queue, held or joiner state remains."""
    async with supervisor(max_slot_queue=1) as sup:
        for k in range(10):
            slot = f"s{k}"
            await sup.submit(queue(f"{slot}-owner", slot))
            await sup.submit(queue(f"{slot}-queued", slot))
            await sup.submit(ControllerSpec.join(once(f"{slot}-joiner"), slot=slot))
            held = await sup.submit(queue(f"{slot}-held", slot, wait=True))
            await sup.submit(queue(f"{slot}-held-2", slot, wait=True))
            if k % 2:
                await sup.remove(held.id)
        await sup.wait_idle()
        assert trio.current_time() == 4.0  # owner, queued, held, held-2 in even slots
        assert sup.controller_snapshot().slots == ()
        controller = sup._controller  # pyright: ignore[reportPrivateUsage]
        assert controller is not None
        machine = controller.machine
        assert (machine.slots, machine.queued, machine.held, machine.joiners) == ({}, {}, {}, {})
        assert machine.pending == 0


async def test_wait_idle_waits_for_submissions_in_the_command_channel(
    autojump_clock: Any,
) -> None:
    """wait_idle does not return while submissions still sit in the controller channel."""
    async with supervisor() as sup:
        waiters = [sup.submit_nowait(queue(f"w{i}", "s", 1.0)) for i in range(3)]
        await sup.wait_idle()
        assert trio.current_time() == 3.0
        assert [w.outcome_nowait().kind for w in waiters] == [OutcomeKind.COMPLETED] * 3
