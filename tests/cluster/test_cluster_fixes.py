"""Regression tests of the bugs the end-to-end tests found, each at the smallest scale
that shows it (the end-to-end test that found it is named in each docstring)."""

from __future__ import annotations

import gc
import warnings

import pytest
import trio

from trio_taskvisor import (
    ControllerConfig,
    SlotStoreUnavailableError,
    SupervisorConfig,
    open_supervisor,
)
from trio_taskvisor._clusterslots import Ask, ClusterSlotMachine
from trio_taskvisor._slots import Entry, SlotStatus
from trio_taskvisor._spec import AdmissionPolicy
from trio_taskvisor.redis import RedisSlotStore

QUEUE = AdmissionPolicy.QUEUE


def machine(**budgets: int) -> ClusterSlotMachine[None]:
    fields: dict[str, int | None] = {
        "max_slot_queue": 10,
        "max_total_pending": None,
        "max_slots": None,
        "max_waiters": None,
    }
    fields.update(budgets)
    return ClusterSlotMachine(**fields)  # type: ignore[arg-type]


def test_work_held_for_an_unavailable_store_leaves_its_slot_remote() -> None:
    """Wait-mode work the store cannot take (``Full``) on an otherwise empty slot keeps
    the slot tracked with a status: ``REMOTE``, not ``None`` (``controller_snapshot()``
    failed its invariant; found by ``test_wait_mode_work_is_held_through_an_outage``)."""
    m = machine()
    m.submit(Entry(1, "s", QUEUE, wait=True), 0.0)
    assert [type(e) for e in m.extra] == [Ask]
    assert m.slots["s"].status is SlotStatus.ADMITTING
    m.full(1, 1.0)
    slot = m.slots["s"]
    assert (slot.status, [e.id for e in slot.held]) == (SlotStatus.REMOTE, [1])
    m.room("s", 2.0)  # asked again: the status stays REMOTE while the store decides
    assert m.slots["s"].status is SlotStatus.REMOTE


def test_work_held_for_the_local_budget_leaves_its_slot_remote() -> None:
    """Work held for ``max_total_pending`` on a new slot has a status too: ``REMOTE``."""
    m = machine(max_total_pending=1)
    m.submit(Entry(1, "a", QUEUE), 0.0)  # reserves the only pending unit while asked
    m.submit(Entry(2, "b", QUEUE, wait=True), 0.0)
    slot = m.slots["b"]
    assert (slot.status, [e.id for e in slot.held]) == (SlotStatus.REMOTE, [2])


async def test_failed_connections_leave_no_unclosed_streams() -> None:
    """A connection attempt the server refuses leaves nothing to the garbage collector:
    coredis left six memory streams per attempt, one ``ResourceWarning`` each (errors
    under ``-W error``; found by ``test_wait_mode_work_is_held_through_an_outage``)."""
    with trio.socket.socket() as sock:  # bound, never listening: connections are refused
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        store = RedisSlotStore(f"redis://127.0.0.1:{port}/0", lease_ttl=1.0, connect_timeout=1.0)
        config = SupervisorConfig(controller=ControllerConfig(slot_store=store))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(SlotStoreUnavailableError):
                async with open_supervisor(config):
                    pytest.fail("the block must not run")
            gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
