"""Stopping controller work: ``remove`` and ``cancel`` of queued, held and joined work and of
slot owners, by id and by name; and what the shutdown does to controller work.

Stopping a keyed call by cancelling its caller is in ``test_keyed_calls.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    CriticalTaskError,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    SupervisorClosedError,
    TaskSpec,
    TaskWaiter,
)
from trio_taskvisor.testing import EventRecorder

from helpers import job, join, queue, rejected, replace, supervisor, trail, winding_down

# -- queued, held and joined work ----------------------------------------------------------


async def test_remove_queued_by_id_rejects_at_once(autojump_clock: trio.abc.Clock) -> None:
    """remove(id) of queued work returns True and resolves REMOVED_FROM_QUEUE at once."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued"))
        assert await sup.remove(queued.id) is True
        assert queued.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        assert trio.current_time() == 0.0
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 0
    (event,) = recorder.of(EventKind.CONTROLLER_REJECTED, task_id=queued.id)
    assert event.rejection is RejectionKind.REMOVED_FROM_QUEUE


async def test_cancel_queued_by_id_returns_at_once(autojump_clock: trio.abc.Clock) -> None:
    """cancel(id) of queued work returns True at once, resolved REMOVED_FROM_QUEUE."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued"))
        assert await sup.cancel(queued.id) is True
        assert trio.current_time() == 0.0
        assert queued.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)


async def test_remove_queued_by_name_is_false(autojump_clock: trio.abc.Clock) -> None:
    """Name targets see registered work only: remove("queued-name") is False, work stays queued."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued-name"))
        assert await sup.remove("queued-name") is False
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 1
        with pytest.raises(trio.WouldBlock):
            queued.outcome_nowait()


async def test_remove_right_after_submit_nowait_sees_queued_work(
    autojump_clock: trio.abc.Clock,
) -> None:
    """remove(id) just after submit_nowait is ordered after it: the queued work is removed."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner"))
        queued = sup.submit_nowait(queue("queued"))
        assert await sup.remove(queued.id) is True
        assert queued.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)


async def test_remove_held_by_id_rejects_at_once(autojump_clock: trio.abc.Clock) -> None:
    """Held (wait-mode) work removed by id resolves REMOVED_FROM_QUEUE."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner"))
        held = await sup.submit(queue("held", wait=True))
        assert await sup.remove(held.id) is True
        assert held.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.waiting == 0


async def test_removed_held_work_never_runs(autojump_clock: Any) -> None:
    """remove(id) of held work returns True and resolves it REMOVED_FROM_QUEUE."""
    log: list[str] = []
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, "held", log, slot="s", wait=True))
        assert await sup.remove(held.id) is True
        assert await held.wait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert view.waiting == 0
    assert log == []


async def test_removing_a_joiner_detaches_it_only(autojump_clock: Any) -> None:
    """remove(joiner id) resolves the joiner REMOVED_FROM_QUEUE; the followed work runs on."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", job, 1.0, "owner", slot="s"))
        joiner = await sup.submit(join("joiner", job, 1.0, slot="s"))
        assert await sup.remove(joiner.id) is True
        assert await joiner.wait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        assert (await owner.wait()).value == "owner"
        assert trio.current_time() == 1.0


@pytest.mark.parametrize("how", ["queued", "held", "joiner"])
async def test_regression_removing_controller_work_publishes_remove_requested_first(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    """Removing queued, held or joined work by id: TASK_REMOVE_REQUESTED, then the rejection."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slot_queue=1) as sup:
        await sup.submit(queue("owner"))
        await sup.submit(queue("queued-0"))
        request = {
            "queued": queue("target", slot="k2"),
            "held": queue("target", wait=True),
            "joiner": join("target"),
        }[how]
        if how == "queued":
            await sup.submit(queue("owner-2", slot="k2"))
        target = await sup.submit(request)
        assert await sup.remove(target.id) is True
        await trio.testing.wait_all_tasks_blocked()
    kinds = [
        (e.kind, e.rejection)
        for e in recorder.events
        if e.task_id == target.id and e.kind is not EventKind.CONTROLLER_SUBMITTED
    ]
    assert kinds == [
        (EventKind.TASK_REMOVE_REQUESTED, None),
        (EventKind.CONTROLLER_REJECTED, RejectionKind.REMOVED_FROM_QUEUE),
    ]
    [requested] = recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=target.id)
    assert (requested.name, requested.slot) == ("target", "k2" if how == "queued" else "k")


# -- slot owners ---------------------------------------------------------------------------


async def test_remove_owner_by_name_works(autojump_clock: trio.abc.Clock) -> None:
    """A registered owner is a name target like any task."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner"))
        await trio.testing.wait_all_tasks_blocked()
        assert await sup.remove("owner") is True
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED


async def test_remove_right_after_submit_nowait_stops_new_owner(
    autojump_clock: trio.abc.Clock,
) -> None:
    """remove(id) just after submit_nowait on an idle slot stops the admitted owner."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = sup.submit_nowait(queue("owner"))
        assert await sup.remove(owner.id) is True
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 0.0


async def test_remove_owner_by_id_keeps_status(autojump_clock: trio.abc.Clock) -> None:
    """remove(owner id) stops the owner but the slot stays RUNNING until it exits."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.sleep(1)
        assert await sup.remove(owner.id) is True
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.status_for) == (SlotStatus.RUNNING, owner.id, 1.0)
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 2.0


async def test_cancel_owner_by_id_keeps_status(autojump_clock: trio.abc.Clock) -> None:
    """While cancel(owner id) waits, the slot stays RUNNING; on exit it advances."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        nxt = await sup.submit(queue("next"))
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.cancel, owner.id)
            await trio.testing.wait_all_tasks_blocked()
            view = sup.controller_snapshot().slot("k")
            assert view is not None
            assert (view.status, view.owner_id) == (SlotStatus.RUNNING, owner.id)
        assert trio.current_time() == 2.0
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (SlotStatus.RUNNING, nxt.id, 0)


async def test_stopping_owner_keeps_queued_replacement(autojump_clock: trio.abc.Clock) -> None:
    """Removing a replaced owner does not purge the replacement queued behind it."""
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert await sup.remove(owner.id) is False  # already stopping (replaced)
        assert (await new.wait()).is_success
        assert trio.current_time() == 3.0


# -- shutdown ------------------------------------------------------------------------------


async def test_submit_after_shutdown_raises_closed(autojump_clock: trio.abc.Clock) -> None:
    """After shutdown began, submit and submit_nowait raise SupervisorClosedError."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            await sup.submit(queue("a"))
        with pytest.raises(SupervisorClosedError):
            sup.submit_nowait(queue("b"))


async def test_shutdown_rejects_queued_and_held_work(autojump_clock: trio.abc.Clock) -> None:
    """Shutdown stops the owner and rejects queued and held work SHUTTING_DOWN."""
    async with supervisor(max_slot_queue=1) as sup:
        owner = await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued"))
        held = await sup.submit(queue("held", wait=True))
        await trio.testing.wait_all_tasks_blocked()
    assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert queued.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)
    assert held.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)


async def test_shutdown_rejects_work_still_in_channel(autojump_clock: trio.abc.Clock) -> None:
    """Work still in the controller's channel when shutdown begins is rejected SHUTTING_DOWN."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner"))
        await trio.testing.wait_all_tasks_blocked()
        pending = sup.submit_nowait(queue("pending"))
        await sup.shutdown()
    assert pending.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)


async def test_queues_never_advance_after_shutdown(autojump_clock: trio.abc.Clock) -> None:
    """Queued work behind an owner that exits during shutdown is never admitted."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        queued = await sup.submit(queue("queued"))
        await trio.testing.wait_all_tasks_blocked()
    assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert trail(recorder, queued) == ["CONTROLLER_SUBMITTED", "CONTROLLER_REJECTED"]
    assert trio.current_time() == 2.0


async def _fails_after(seconds: float, error: BaseException) -> None:
    await trio.sleep(seconds)
    raise error


@pytest.mark.parametrize(
    ("error", "raised"),
    [(ValueError("boom"), CriticalTaskError), (KeyboardInterrupt(), KeyboardInterrupt)],
)
async def test_the_owner_whose_end_begins_the_shutdown_does_not_advance_its_slot(
    autojump_clock: trio.abc.Clock, error: BaseException, raised: type[BaseException]
) -> None:
    """A critical owner that fails, an owner that raises ``KeyboardInterrupt``: the
    shutdown begins as it ends, and the work queued behind it is rejected, never run.
    Before, the shutdown's controller step came a scheduler pass later, after the exit
    had admitted the next owner: its body ran, then ended ``CANCELLED``."""
    ran: list[float] = []

    async def side_effect() -> None:
        ran.append(trio.current_time())  # a card charged, a mail sent
        await trio.sleep(5.0)

    recorder = EventRecorder()
    with pytest.raises(raised):  # noqa: PT012
        async with supervisor(recorder, controller=ControllerConfig()) as sup:
            spec = TaskSpec.once("owner", _fails_after, 1.0, error, critical=True)
            await sup.submit(ControllerSpec.queue(spec, slot="k"))
            queued = await sup.submit(queue("queued", side_effect))
            await trio.sleep_forever()
    assert ran == []
    assert queued.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)
    assert trail(recorder, queued) == ["CONTROLLER_SUBMITTED", "CONTROLLER_REJECTED"]
    assert trio.current_time() == 1.0


async def test_shutdown_resolves_every_waiter_and_leaves_no_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After the block, every waiter is resolved and no supervisor task is left."""
    living = trio.lowlevel.current_statistics().tasks_living
    waiters: list[TaskWaiter] = []
    async with supervisor(max_slot_queue=2) as sup:
        for slot in ("a", "b", "c"):
            waiters.append(await sup.submit(queue(f"{slot}0", slot=slot)))
            waiters.append(await sup.submit(queue(f"{slot}1", slot=slot)))
            waiters.append(await sup.submit(replace(f"{slot}2", slot=slot)))
            waiters.append(await sup.submit(queue(f"{slot}3", slot=slot)))
            waiters.append(await sup.submit(queue(f"{slot}4", slot=slot, wait=True)))
        waiters.append(sup.submit_nowait(queue("d0", slot="d")))
    assert trio.current_time() == 0.0
    assert all(w.outcome_nowait().kind is not None for w in waiters)
    assert trio.lowlevel.current_statistics().tasks_living == living
