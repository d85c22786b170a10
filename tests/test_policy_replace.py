"""REPLACE: the owner is stopped and the replacement admitted once the owner has exited;
a queue head is superseded, the tail kept; REPLACE while ADMITTING or TERMINATING; storms.

A REPLACE that needs a pending unit, and a held (wait-mode) REPLACE, are in
``test_budgets_and_held_work.py``.
"""

from __future__ import annotations

import trio
import trio.testing

from trio_taskvisor import (
    ControllerConfig,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    TaskWaiter,
)
from trio_taskvisor.testing import EventRecorder

from helpers import (
    SLOT_TRANSITION,
    Occupancy,
    once,
    queue,
    rejected,
    replace,
    stall_registry,
    starts,
    stubborn,
    supervisor,
    trail,
    winding_down,
)

# -- stopping the owner --------------------------------------------------------------------


async def test_replace_stops_running_owner(autojump_clock: trio.abc.Clock) -> None:
    """REPLACE on RUNNING: running->terminating, the owner ends CANCELLED."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(replace("new"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 2.0
    assert trail(recorder, owner) == [
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "running->terminating",
        "TASK_REMOVE_REQUESTED",
        "ATTEMPT_CANCELLED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_replacement_starts_after_owner_exits(autojump_clock: trio.abc.Clock) -> None:
    """The replacement is admitted only once the owner physically exited."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.submit(replace("new"))
        await trio.sleep(3)
    assert starts(recorder, new) == [2.0]
    assert trail(recorder, new) == [
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "TASK_REMOVE_REQUESTED",
        "ATTEMPT_CANCELLED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_terminating_snapshot_counts_replacement_head(
    autojump_clock: trio.abc.Clock,
) -> None:
    """While the owner winds down the slot is TERMINATING; queue_depth counts the replacement."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(replace("new"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        view = snapshot.slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (
            SlotStatus.TERMINATING,
            owner.id,
            1,
        )
        assert (snapshot.running_count, snapshot.total_queued) == (0, 1)


async def test_replacement_waits_for_late_exit_of_forced_owner(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A forced owner that exits late keeps the slot: the replacement starts at its exit."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0, controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", stubborn, 10))
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert (await owner.wait()).kind is OutcomeKind.FORCE_ABORTED
        assert trio.current_time() == 5.0
        await trio.sleep(2)
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (
            SlotStatus.TERMINATING,
            owner.id,
            1,
        )
        assert (await new.wait()).is_success
        assert trio.current_time() == 11.0
    assert starts(recorder, new) == [10.0]


# -- while ADMITTING -----------------------------------------------------------------------


async def test_replace_while_admitting_stops_owner_on_acceptance(
    autojump_clock: trio.abc.Clock,
) -> None:
    """REPLACE while ADMITTING: admitting->terminating; the owner is stopped once accepted."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await trio.testing.wait_all_tasks_blocked()
        stall_registry(sup)
        owner = sup.submit_nowait(queue("owner"))
        new = sup.submit_nowait(replace("new"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id) == (SlotStatus.RUNNING, new.id)
    assert trail(recorder, owner, attempts=False) == [
        "CONTROLLER_SUBMITTED",
        "admitting->terminating",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "TASK_REMOVE_REQUESTED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]
    assert recorder.of(SLOT_TRANSITION, task_id=owner.id, reason="admitting->running") == []


async def test_two_nowait_submissions_replace_admitted_owner(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Two submit_nowait calls in a row (QUEUE then REPLACE) leave only the replacement running."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = sup.submit_nowait(queue("owner"))
        new = sup.submit_nowait(replace("new"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (SlotStatus.RUNNING, new.id, 0)


async def test_rejected_admitting_owner_after_replace_goes_to_next(
    autojump_clock: trio.abc.Clock,
) -> None:
    """ADMITTING -> TERMINATING, then a registry rejection: no removal, the slot goes on."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.add(once("dup"))
        await trio.testing.wait_all_tasks_blocked()
        stall_registry(sup)
        owner = sup.submit_nowait(queue("dup", slot="k"))
        new = sup.submit_nowait(replace("new"))
        assert await owner.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id) == (SlotStatus.RUNNING, new.id)
    assert trail(recorder, owner) == [
        "CONTROLLER_SUBMITTED",
        "admitting->terminating",
        "TASK_ADD_REQUESTED",
        "TASK_ADD_FAILED",
    ]


# -- the queue head and tail ---------------------------------------------------------------


async def test_replace_while_terminating_supersedes_head(autojump_clock: trio.abc.Clock) -> None:
    """Another REPLACE while TERMINATING rejects the head SUPERSEDED and stops nothing more."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        first = await sup.submit(replace("first", trio.sleep, 1))
        second = await sup.submit(replace("second", trio.sleep, 1))
        assert await first.wait() == rejected(RejectionKind.SUPERSEDED)
        assert trio.current_time() == 0.0
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (
            SlotStatus.TERMINATING,
            owner.id,
            1,
        )
        assert (await second.wait()).is_success
        assert trio.current_time() == 3.0
    assert [e.reason for e in recorder.of(SLOT_TRANSITION, task_id=owner.id)] == [
        "admitting->running",
        "running->terminating",
    ]
    assert len(recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=owner.id)) == 1
    assert trail(recorder, first) == ["CONTROLLER_SUBMITTED", "CONTROLLER_REJECTED"]


async def test_replace_keeps_queue_tail(autojump_clock: trio.abc.Clock) -> None:
    """REPLACE swaps the queue head and keeps the FIFO tail behind the replacement."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        head = await sup.submit(queue("head", trio.sleep, 1))
        tail = await sup.submit(queue("tail", trio.sleep, 1))
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert (await tail.wait()).is_success
        assert trio.current_time() == 4.0
    assert head.outcome_nowait() == rejected(RejectionKind.SUPERSEDED)
    assert starts(recorder, new) == [2.0]
    assert starts(recorder, tail) == [3.0]


async def test_replace_ignores_max_slot_queue(autojump_clock: trio.abc.Clock) -> None:
    """REPLACE is placed even when max_slot_queue=0 leaves no room to QUEUE."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        queued = await sup.submit(queue("queued"))
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert await queued.wait() == rejected(RejectionKind.QUEUE_FULL)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 1
        assert (await new.wait()).is_success
        assert trio.current_time() == 3.0


# -- storms --------------------------------------------------------------------------------


async def test_replace_storm_keeps_one_owner(autojump_clock: trio.abc.Clock) -> None:
    """200 REPLACEs into one slot: one owner at a time, only the last completes."""
    occupancy = Occupancy()
    async with supervisor(controller=ControllerConfig()) as sup:
        waiters: list[TaskWaiter] = []
        for i in range(200):
            waiters.append(await sup.submit(replace(f"r{i}", occupancy.run, 1)))
            if i % 7 == 0:
                await trio.testing.wait_all_tasks_blocked()
        await sup.wait_idle()
    outcomes = [w.outcome_nowait() for w in waiters]
    assert outcomes[-1].is_success
    assert all(
        o.kind is OutcomeKind.CANCELLED or o == rejected(RejectionKind.SUPERSEDED)
        for o in outcomes[:-1]
    )
    assert occupancy.peak["k"] == 1


async def test_nowait_replace_storm_keeps_one_owner(autojump_clock: trio.abc.Clock) -> None:
    """200 REPLACEs sent without yielding: one owner at a time, only the last completes."""
    occupancy = Occupancy()
    async with supervisor(controller=ControllerConfig()) as sup:
        waiters = [sup.submit_nowait(replace(f"r{i}", occupancy.run, 1)) for i in range(200)]
        await sup.wait_idle()
        assert trio.current_time() == 1.0
    outcomes = [w.outcome_nowait() for w in waiters]
    assert outcomes[-1].is_success
    assert all(
        o.kind is OutcomeKind.CANCELLED or o == rejected(RejectionKind.SUPERSEDED)
        for o in outcomes[:-1]
    )
    assert occupancy.peak["k"] == 1
