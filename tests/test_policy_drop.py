"""DROP_IF_RUNNING: it runs on an idle slot; on a busy one it is rejected SLOT_BUSY and
touches nothing. (Through ``run_in_slot``: ``test_keyed_calls.py``.)
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_taskvisor import ControllerConfig, RejectionKind
from trio_taskvisor.testing import EventRecorder

from helpers import Occupancy, drop, queue, rejected, supervisor, trail

# -- idle and busy slots -------------------------------------------------------------------


async def test_drop_if_running_rejects_slot_busy(autojump_clock: trio.abc.Clock) -> None:
    """DROP_IF_RUNNING on a busy slot is rejected SLOT_BUSY; owner and queue are untouched."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("owner"))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(queue("queued"))
        await trio.testing.wait_all_tasks_blocked()
        before = sup.controller_snapshot()
        dropped = await sup.submit(drop("dropped"))
        assert await dropped.wait() == rejected(RejectionKind.SLOT_BUSY)
        assert sup.controller_snapshot() == before
        with pytest.raises(trio.WouldBlock):
            owner.outcome_nowait()
    assert trail(recorder, dropped) == ["CONTROLLER_REJECTED"]


async def test_drop_if_running_runs_on_idle_slot(autojump_clock: trio.abc.Clock) -> None:
    """DROP_IF_RUNNING on an idle slot starts at once."""
    async with supervisor(controller=ControllerConfig()) as sup:
        waiter = await sup.submit(drop("a", trio.sleep, 1))
        assert (await waiter.wait()).is_success
        assert trio.current_time() == 1.0


async def test_drop_if_running_storm_runs_first_only(autojump_clock: trio.abc.Clock) -> None:
    """200 DROP_IF_RUNNINGs into one slot: the first runs, every other is SLOT_BUSY."""
    occupancy = Occupancy()
    async with supervisor(controller=ControllerConfig()) as sup:
        waiters = [sup.submit_nowait(drop(f"d{i}", occupancy.run, 1)) for i in range(200)]
        await sup.wait_idle()
        assert trio.current_time() == 1.0
    assert waiters[0].outcome_nowait().is_success
    assert {w.outcome_nowait() for w in waiters[1:]} == {rejected(RejectionKind.SLOT_BUSY)}
    assert occupancy.peak["k"] == 1
