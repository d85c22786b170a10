"""The controller's budgets and wait mode: ``max_slot_queue``, ``max_total_pending``,
``max_slots`` and ``max_waiters``; what is rejected, what is held (``wait=True``) instead,
and when and in which order held work is placed.

Removing held work is in ``test_controller_stops.py``, the snapshot's ``waiting`` count in
``test_controller_api.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import ControllerSpec, EventKind, OutcomeKind, RejectionKind, SlotStatus
from trio_taskvisor.testing import EventRecorder

from helpers import job, once, queue, rejected, replace, submitted_reasons, supervisor, winding_down

# -- budgets -------------------------------------------------------------------------------


async def test_full_slot_queue_rejects_queue_full(autojump_clock: trio.abc.Clock) -> None:
    """QUEUE past max_slot_queue is rejected QUEUE_FULL."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=1) as sup:
        await sup.submit(queue("owner"))
        await sup.submit(queue("queued"))
        full = await sup.submit(queue("full"))
        assert await full.wait() == rejected(RejectionKind.QUEUE_FULL)
    (event,) = recorder.of(EventKind.CONTROLLER_REJECTED, task_id=full.id)
    assert event.rejection is RejectionKind.QUEUE_FULL


async def test_total_pending_rejects_resource_limit(autojump_clock: trio.abc.Clock) -> None:
    """Queueing past max_total_pending (across slots) is rejected RESOURCE_LIMIT."""
    async with supervisor(max_total_pending=1) as sup:
        await sup.submit(queue("a", slot="a"))
        await sup.submit(queue("b", slot="b"))
        await sup.submit(queue("a2", slot="a"))
        over = await sup.submit(queue("b2", slot="b"))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_replace_creating_head_needs_pending_unit(autojump_clock: trio.abc.Clock) -> None:
    """A REPLACE that creates a queue head needs a pending unit; replacing a head does not."""
    async with supervisor(max_total_pending=1) as sup:
        await sup.submit(queue("a", winding_down, 2, slot="a"))
        await sup.submit(queue("b", winding_down, 2, slot="b"))
        await trio.testing.wait_all_tasks_blocked()
        head = await sup.submit(replace("a2", slot="a"))
        over = await sup.submit(replace("b2", slot="b"))
        again = await sup.submit(replace("a3", slot="a"))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert await head.wait() == rejected(RejectionKind.SUPERSEDED)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("a")
        assert view is not None
        assert view.queue_depth == 1
        with pytest.raises(trio.WouldBlock):
            again.outcome_nowait()


async def test_new_slot_past_max_slots_rejects_resource_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A submission for a new slot past max_slots is rejected RESOURCE_LIMIT."""
    async with supervisor(max_slots=1) as sup:
        await sup.submit(queue("a", slot="a"))
        over = await sup.submit(queue("b", slot="b"))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_new_slot_past_max_slots_is_rejected_even_with_wait(autojump_clock: Any) -> None:
    """A wait-mode submission for a new slot past max_slots is REJECTED(RESOURCE_LIMIT)."""
    async with supervisor(max_slots=1) as sup:
        await sup.submit(queue("a0", job, 1.0, slot="a"))
        other = await sup.submit(queue("b0", job, 1.0, slot="b", wait=True))
        assert await other.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert trio.current_time() == 0.0


async def test_existing_slot_accepts_work_at_max_slots(autojump_clock: trio.abc.Clock) -> None:
    """max_slots limits new slots only: a tracked slot still queues."""
    async with supervisor(max_slots=1) as sup:
        await sup.submit(queue("a", trio.sleep, 1, slot="a"))
        second = await sup.submit(queue("a2", trio.sleep, 1, slot="a"))
        assert (await second.wait()).is_success
        assert trio.current_time() == 2.0


# -- held work -----------------------------------------------------------------------------


async def test_wait_queue_is_held_when_slot_queue_is_full(autojump_clock: Any) -> None:
    """QUEUE with wait=True on a full slot queue is held, not rejected."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.WouldBlock):
            held.outcome_nowait()
        assert submitted_reasons(recorder, held) == ["held"]


async def test_wait_replace_is_held_when_total_pending_is_full(autojump_clock: Any) -> None:
    """REPLACE with wait=True is held when it needs a pending unit and none is free."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_total_pending=0) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        held = await sup.submit(replace("held", job, 1.0, slot="s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.WouldBlock):
            held.outcome_nowait()
        assert submitted_reasons(recorder, held) == ["held"]


async def test_held_work_is_submitted_again_when_placed(autojump_clock: Any) -> None:
    """Held work publishes CONTROLLER_SUBMITTED "held", then again when it is placed."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        await held.wait()
    events = recorder.of(EventKind.CONTROLLER_SUBMITTED, task_id=held.id)
    assert [(e.reason == "held", e.time) for e in events] == [(True, 0.0), (False, 1.0)]


async def test_held_work_past_max_waiters_is_rejected_resource_limit(autojump_clock: Any) -> None:
    """With max_waiters held submissions, the next one is REJECTED(RESOURCE_LIMIT)."""
    async with supervisor(max_slot_queue=0, max_waiters=1) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        extra = await sup.submit(queue("extra", job, 1.0, slot="s", wait=True))
        assert await extra.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert trio.current_time() == 0.0


async def test_max_waiters_zero_rejects_wait_mode_work_that_would_be_held(
    autojump_clock: Any,
) -> None:
    """max_waiters=0 is valid: wait-mode work that would be held is rejected at once."""
    async with supervisor(max_slot_queue=0, max_waiters=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        extra = await sup.submit(queue("extra", job, 1.0, slot="s", wait=True))
        assert await extra.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


# -- placing held work ---------------------------------------------------------------------


async def test_held_work_keeps_fifo_order_per_slot(autojump_clock: Any) -> None:
    """Held submissions of one slot run in submission order, one after another."""
    log: list[str] = []
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("w0", job, 1.0, "w0", log, slot="s"))
        waiters = [
            await sup.submit(queue(f"w{i}", job, 1.0, f"w{i}", log, slot="s", wait=True))
            for i in range(1, 5)
        ]
        await waiters[-1].wait()
        assert trio.current_time() == 5.0
    assert log == ["w0", "w1", "w2", "w3", "w4"]


async def test_wait_replace_is_held_behind_held_work_of_its_slot(autojump_clock: Any) -> None:
    """A wait-mode REPLACE keeps FIFO behind its slot's held work: held, owner untouched."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 10.0, slot="s"))
        await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        replace = await sup.submit(
            ControllerSpec.replace(once("new", job, 1.0), slot="s", wait=True)
        )
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.status, view.queue_depth, view.waiting) == (SlotStatus.RUNNING, 0, 2)
        assert submitted_reasons(recorder, replace) == ["held"]


async def test_freed_capacity_skips_held_work_of_a_full_slot(autojump_clock: Any) -> None:
    """A pending unit freed goes to held work whose slot has room, past a full slot's."""
    async with supervisor(max_slot_queue=1, max_total_pending=2) as sup:
        await sup.submit(queue("a0", job, 10.0, slot="a"))
        await sup.submit(queue("a1", job, 1.0, slot="a"))
        await sup.submit(queue("b0", job, 2.0, slot="b"))
        await sup.submit(queue("b1", job, 1.0, slot="b"))
        await sup.submit(queue("c0", job, 10.0, slot="c"))
        await sup.submit(queue("a2", job, 1.0, slot="a", wait=True))  # oldest held; a stays full
        await sup.submit(queue("c1", job, 1.0, slot="c", wait=True))  # held for the pending budget
        await trio.sleep(2.0)
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        views = {v.slot: (v.queue_depth, v.waiting) for v in snapshot.slots}
        assert views == {"a": (1, 1), "b": (0, 0), "c": (1, 0)}


async def test_freed_capacity_goes_to_the_oldest_held_work(autojump_clock: Any) -> None:
    """When one pending unit frees, the oldest held submission with room takes it."""
    async with supervisor(max_total_pending=1) as sup:
        await sup.submit(queue("a0", job, 1.0, slot="a"))
        await sup.submit(queue("a1", job, 1.0, slot="a"))
        await sup.submit(queue("b0", job, 10.0, slot="b"))
        await sup.submit(queue("c0", job, 10.0, slot="c"))
        await sup.submit(queue("c1", job, 1.0, slot="c", wait=True))
        await sup.submit(queue("b1", job, 1.0, slot="b", wait=True))
        await trio.sleep(1.0)  # a0 ends, a1 leaves the queue: one unit frees
        await trio.testing.wait_all_tasks_blocked()
        views = {v.slot: (v.queue_depth, v.waiting) for v in sup.controller_snapshot().slots}
        assert views == {"a": (0, 0), "b": (0, 1), "c": (1, 0)}


async def test_idle_slot_starts_its_oldest_held_work_at_once(autojump_clock: Any) -> None:
    """When the owner leaves and the queue is empty, the oldest held work starts then."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=0, max_total_pending=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        first = await sup.submit(queue("first", job, 1.0, slot="s", wait=True))
        await sup.submit(queue("second", job, 1.0, slot="s", wait=True))
        started = await recorder.wait_for(EventKind.ATTEMPT_STARTING, task_id=first.id)
        assert started.time == 1.0
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.owner_id, view.queue_depth, view.waiting) == (first.id, 0, 1)


async def test_held_replace_stops_the_owner_only_when_placed(autojump_clock: Any) -> None:
    """A held REPLACE leaves the owner running; it stops it when it is placed."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_total_pending=1) as sup:
        owner = await sup.submit(queue("a0", job, 10.0, slot="a"))
        await sup.submit(queue("b0", job, 2.0, slot="b"))
        await sup.submit(queue("b1", job, 1.0, slot="b"))  # takes the only pending unit
        await sup.submit(replace("a1", job, 1.0, "new", slot="a", wait=True))
        await trio.sleep(1.0)
        view = sup.controller_snapshot().slot("a")
        assert view is not None
        assert (view.status, view.waiting) == (SlotStatus.RUNNING, 1)
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 2.0
    [stop] = recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=owner.id)
    assert stop.time == 2.0
