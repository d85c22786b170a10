"""Regression tests of the bugs the end-to-end tests found, each at the smallest scale
that shows it (the end-to-end test that found it is named in each docstring)."""

from __future__ import annotations

import gc
import warnings

import pytest
import trio
from cluster_helpers import machine

from trio_taskvisor import (
    ControllerConfig,
    SlotStoreUnavailableError,
    SupervisorConfig,
    open_supervisor,
)
from trio_taskvisor._clusterslots import Ask, ClusterSlotMachine
from trio_taskvisor._outcome import RejectionKind
from trio_taskvisor._slots import Entry, SlotStatus
from trio_taskvisor._spec import AdmissionPolicy
from trio_taskvisor.redis import RedisSlotStore

QUEUE = AdmissionPolicy.QUEUE


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


def held_machine(**budgets: int) -> ClusterSlotMachine[None]:
    """A machine with work 1 and 2 held in slot "s" (the cluster queue was full)."""
    m = machine(**budgets)
    m.submit(Entry(1, "s", QUEUE, wait=True), 0.0)
    m.full(1, 0.0)
    m.submit(Entry(2, "s", QUEUE, wait=True), 0.0)  # behind 1, without asking
    assert [e.id for e in m.slots["s"].held] == [1, 2]
    m.effects.clear()
    m.extra.clear()
    return m


def test_held_work_asked_again_keeps_its_place() -> None:
    """The oldest held work, asked again (at every renewal) and still refused, goes back
    to the head: it went to the tail, so a process's held work was served out of order."""
    m = held_machine()
    m.room("s", 1.0)
    assert [e.entry.id for e in m.extra if isinstance(e, Ask)] == [1]
    m.full(1, 1.0)
    assert [e.id for e in m.slots["s"].held] == [1, 2]
    assert m.effects == []  # no second CONTROLLER_SUBMITTED "held"
    m.extra.clear()
    m.room("s", 2.0)
    assert [e.entry.id for e in m.extra if isinstance(e, Ask)] == [1]


def test_held_work_asked_again_keeps_its_max_waiters_place() -> None:
    """While held work is asked again it still counts in ``max_waiters``: newer work is
    refused, instead of taking the place and getting the older work rejected."""
    m = held_machine(max_waiters=2)
    m.room("s", 1.0)
    m.submit(Entry(3, "s", QUEUE, wait=True), 1.0)
    assert [(type(e).__name__, e.entry.id) for e in m.effects] == [("Reject", 3)]
    m.effects.clear()
    m.full(1, 1.0)
    assert [e.id for e in m.slots["s"].held] == [1, 2]
    assert m.effects == []


def test_new_wait_work_queues_behind_held_work_asked_again() -> None:
    """Wait-mode work submitted while the slot's only held work is asked again is held
    behind it, not asked ahead of it."""
    m = machine()
    m.submit(Entry(1, "s", QUEUE, wait=True), 0.0)
    m.full(1, 0.0)
    m.extra.clear()
    m.room("s", 1.0)
    m.submit(Entry(2, "s", QUEUE, wait=True), 1.0)
    assert [e.entry.id for e in m.extra if isinstance(e, Ask)] == [1]
    m.full(1, 1.0)
    assert [e.id for e in m.slots["s"].held] == [1, 2]


def test_placing_held_work_asks_the_next_held_work_of_its_slot() -> None:
    """Once held work asked again is placed, the slot's next held work is asked at once.
    A room report wakes a process once and the store forgets its watch: the next held
    work waited for ever (found by
    ``test_held_work_of_one_process_runs_in_order_as_room_appears``)."""
    for place in ("queued", "granted"):
        m = held_machine()
        m.room("s", 1.0)
        m.extra.clear()
        if place == "queued":
            m.queued_in_cluster(1, 1.0)
        else:
            m.granted(1, 1.0)
        assert [e.entry.id for e in m.extra if isinstance(e, Ask)] == [2], place


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


def test_wait_mode_work_refused_for_max_waiters_is_not_kept_for_the_pending_budget() -> None:
    """Wait-mode work that the full ``max_total_pending`` budget would hold, but that
    ``max_waiters`` refuses, is rejected and forgotten: the budget's next room no longer
    looks it up among the held work (a ``KeyError`` in the controller loop; found by the
    state machine of ``test_cluster_machine_stateful.py``)."""
    m = machine(max_slot_queue=1, max_total_pending=1, max_waiters=1)
    m.submit(Entry(1, "a", QUEUE), 0.0)  # asked: reserves the one pending unit
    m.submit(Entry(2, "a", QUEUE, wait=True), 0.0)  # held for the budget: the one waiter
    m.submit(Entry(3, "b", QUEUE, wait=True), 0.0)  # no waiter left: rejected
    assert [type(e).__name__ for e in m.effects][-1] == "Reject"
    m.rejected(1, RejectionKind.SLOT_BUSY, 1.0)  # the unit is free: held work is asked
    assert [e.entry.id for e in m.extra if isinstance(e, Ask)] == [1, 2]


def test_a_next_owner_that_lost_its_lease_before_it_started_ends_lease_lost() -> None:
    """The owner lost its lease and still runs; the next owner granted behind it lost its
    own lease too, and the server gave the lease to later work: the earlier next owner
    never runs and ends ``LEASE_LOST`` (its lease given back, carrying that outcome),
    and the later one takes its place. It stayed in the slot for ever, its waiter hanging
    (found by the state machine of ``test_cluster_machine_stateful.py``)."""
    m = machine()
    m.submit(Entry(1, "a", QUEUE), 0.0)
    m.granted(1, 0.0)
    m.admitted(m.owners[1], True, 0.0)
    m.lease_lost(1, "lease expired")  # forced; still running
    m.submit(Entry(2, "a", QUEUE), 1.0)
    second = m.granted(2, 1.0)  # the next owner, behind the running one
    assert second is not None
    assert m.slots["a"].granted is second
    m.lease_lost(2, "lease expired (paused)")  # before it could start
    m.submit(Entry(3, "a", QUEUE), 2.0)
    m.extra.clear()
    third = m.granted(3, 2.0)
    assert m.slots["a"].granted is third
    assert [(type(e).__name__, e.entry.id) for e in m.extra] == [
        ("LostUnstarted", 2),
        ("Release", 2),
    ]
    assert m.extra[0].reason == "lease expired (paused)"  # type: ignore[union-attr]
    assert 2 not in m.owners
    m.exited(m.owners[1], 3.0)  # the lost owner exits: the later next owner starts
    assert m.slots["a"].owner is third
