"""QUEUE, the default policy: an idle slot admits its work at once, a busy slot queues it
FIFO behind the owner; and the registry's rejection of queued work when it is admitted.

The slot queue's budget (``max_slot_queue``) is in ``test_budgets_and_held_work.py``.
"""

from __future__ import annotations

import trio
import trio.testing

from trio_taskvisor import ControllerConfig, EventKind, RejectionKind
from trio_taskvisor.testing import EventRecorder

from helpers import once, queue, rejected, starts, supervisor, trail

# -- admission and FIFO order --------------------------------------------------------------


async def test_idle_slot_admits_then_runs(autojump_clock: trio.abc.Clock) -> None:
    """An idle slot goes ADMITTING then RUNNING, with the exact event sequence."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        waiter = await sup.submit(queue("a", trio.sleep, 1))
        assert (await waiter.wait()).is_success
    assert trail(recorder, waiter) == [
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "ATTEMPT_SUCCEEDED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_queue_runs_fifo_with_exact_start_times(autojump_clock: trio.abc.Clock) -> None:
    """Queued work of one slot runs in submission order, each after the previous ended."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        a = await sup.submit(queue("a", trio.sleep, 1))
        b = await sup.submit(queue("b", trio.sleep, 2))
        c = await sup.submit(queue("c", trio.sleep, 1))
        assert (await c.wait()).is_success
        assert trio.current_time() == 4.0
    assert [starts(recorder, w) for w in (a, b, c)] == [[0.0], [1.0], [3.0]]
    assert trail(recorder, b) == [
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "ATTEMPT_SUCCEEDED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


# -- registry rejections -------------------------------------------------------------------


async def test_registry_rejection_of_queued_work(autojump_clock: trio.abc.Clock) -> None:
    """A duplicate name is rejected by the registry (TASK_ADD_FAILED, no CONTROLLER_REJECTED)."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.add(once("dup"))
        await sup.submit(queue("owner", trio.sleep, 1))
        dup = await sup.submit(queue("dup"))
        assert await dup.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        assert trio.current_time() == 1.0
    assert trail(recorder, dup) == [
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADD_FAILED",
    ]
    (failed,) = recorder.of(EventKind.TASK_ADD_FAILED, task_id=dup.id)
    assert (failed.slot, failed.rejection) == ("k", RejectionKind.ALREADY_EXISTS)


async def test_registry_rejection_moves_slot_to_next_item(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After a registry rejection the slot admits its next queued item at once."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.add(once("dup"))
        await sup.submit(queue("owner", trio.sleep, 1))
        await sup.submit(queue("dup"))
        after = await sup.submit(queue("after", trio.sleep, 1))
        assert (await after.wait()).is_success
        assert trio.current_time() == 2.0
    assert starts(recorder, after) == [1.0]


async def test_registry_rejection_on_idle_slot_leaves_no_slot(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A rejected first owner leaves the slot idle, so it vanishes from the snapshot."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.add(once("dup"))
        waiter = await sup.submit(queue("dup", slot="k"))
        assert await waiter.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.controller_snapshot().slots == ()
