"""Section 11 across processes: placement, queue deadlines, ``cancel_slot`` and
``wait_slot_idle`` of cluster slots.

Two supervisors in this process share one slot store on the real server (real clock,
``lease_ttl`` 1 s). Timing bounds are liveness bounds with at least a 2x margin; waits
are for events and outcomes, never sleeps.
"""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing
from cluster_helpers import gated, quick, replica
from conftest import RedisServer

from trio_taskvisor import (
    ControllerSpec,
    EventKind,
    OutcomeKind,
    Placement,
    RejectionKind,
    SlotStoreUnavailableError,
    Supervisor,
    TaskSpec,
)
from trio_taskvisor.redis import RedisSlotStore
from trio_taskvisor.testing import EventRecorder

TIMEOUT = 0.3  # a queue_timeout, seconds of real time


async def own(sup: Supervisor, recorder: EventRecorder, spec: TaskSpec, slot: str = "s") -> None:
    """Submit ``spec`` to ``slot`` and wait until it holds the slot's lease."""
    waiter = await sup.submit(ControllerSpec.queue(spec, slot=slot))
    await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=waiter.id)


# -- placement --------------------------------------------------------------------------------


async def test_work_on_a_free_cluster_slot_is_placed_owner(store: RedisSlotStore) -> None:
    """Every policy on a slot idle cluster-wide is placed OWNER once its lease is granted."""
    async with replica(store) as (a, _):
        for policy in (ControllerSpec.queue, ControllerSpec.join, ControllerSpec.drop_if_running):
            waiter = await a.submit(policy(quick(f"p-{policy.__name__}"), slot="s"))
            assert await waiter.wait_placed() is Placement.OWNER
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
            # The outcome comes before the owner's physical exit, and the release after
            # it: without this, a JOIN could find the lease still held (and join it).
            await a.wait_slot_idle("s")


async def test_work_behind_another_process_owner_is_placed_queued(store: RedisSlotStore) -> None:
    """QUEUE and REPLACE behind another process's owner are QUEUED; the QUEUE the REPLACE
    displaced stays QUEUED while it ends SUPERSEDED."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        await own(a, rec_a, gated(gate))
        queued = await b.submit(ControllerSpec.queue(quick("q"), slot="s"))
        assert await queued.wait_placed() is Placement.QUEUED
        replacing = await b.submit(ControllerSpec.replace(quick("r", "r"), slot="s"))
        assert await replacing.wait_placed() is Placement.QUEUED
        assert (await queued.wait()).rejection is RejectionKind.SUPERSEDED
        assert queued.placement is Placement.QUEUED
        assert (await replacing.wait()).value == "r"  # the remote owner was stopped


async def test_join_of_remote_work_is_placed_joined(store: RedisSlotStore) -> None:
    """A JOIN behind another process's owner is JOINED and resolves to its outcome."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        await own(a, rec_a, gated(gate, 42))
        joiner = await b.submit(ControllerSpec.join(quick("j"), slot="s"))
        assert await joiner.wait_placed() is Placement.JOINED
        gate.set()
        assert (await joiner.wait()).value == 42


async def test_work_the_store_rejects_is_placed_rejected(store: RedisSlotStore) -> None:
    """DROP_IF_RUNNING behind a remote owner (SLOT_BUSY) and QUEUE into a full cluster
    queue (QUEUE_FULL) are REJECTED."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store, max_slot_queue=1) as (b, _):
        await own(a, rec_a, gated(gate))
        dropped = await b.submit(ControllerSpec.drop_if_running(quick("d"), slot="s"))
        assert await dropped.wait_placed() is Placement.REJECTED
        assert (await dropped.wait()).rejection is RejectionKind.SLOT_BUSY
        await a.submit(ControllerSpec.queue(quick("fills"), slot="s"))
        full = await b.submit(ControllerSpec.queue(quick("f"), slot="s"))
        assert await full.wait_placed() is Placement.REJECTED
        assert (await full.wait()).rejection is RejectionKind.QUEUE_FULL
        gate.set()


async def test_held_work_has_no_placement_until_the_cluster_queue_has_room(
    store: RedisSlotStore,
) -> None:
    """wait=True work held for room in the cluster queue has placement None; an entry
    leaving the queue places it QUEUED."""
    gate_a, gate_next = trio.Event(), trio.Event()
    async with replica(store) as (a, rec_a), replica(store, max_slot_queue=1) as (b, rec_b):
        await own(a, rec_a, gated(gate_a))
        nxt = await a.submit(ControllerSpec.queue(gated(gate_next), slot="s"))
        assert await nxt.wait_placed() is Placement.QUEUED
        held = await b.submit(ControllerSpec.queue(quick("h", "h"), slot="s", wait=True))
        await rec_b.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=held.id, reason="held")
        assert held.placement is None
        gate_a.set()  # A's next entry leaves the queue to own the slot: room
        assert await held.wait_placed() is Placement.QUEUED
        gate_next.set()
        assert (await held.wait()).value == "h"


# -- queue deadlines ----------------------------------------------------------------------------


async def test_a_cluster_queue_entry_leaves_at_its_deadline(store: RedisSlotStore) -> None:
    """Work queued behind another process's owner is withdrawn at its deadline (this
    process's clock): REJECTED(QUEUE_TIMEOUT), gone from the cluster queue, and its
    joiners in both processes share the outcome."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, rec_b):
        await own(a, rec_a, gated(gate))
        started = time.monotonic()
        late = await b.submit(ControllerSpec.queue(quick("late"), slot="s", queue_timeout=TIMEOUT))
        assert await late.wait_placed() is Placement.QUEUED
        local_joiner = await b.submit(ControllerSpec.join(quick("jb"), slot="s"))
        remote_joiner = await a.submit(ControllerSpec.join(quick("ja"), slot="s"))
        assert await remote_joiner.wait_placed() is Placement.JOINED
        outcome = await late.wait()
        elapsed = time.monotonic() - started
        assert outcome.rejection is RejectionKind.QUEUE_TIMEOUT
        assert TIMEOUT <= elapsed < 2 * TIMEOUT
        assert (await local_joiner.wait()).rejection is RejectionKind.QUEUE_TIMEOUT
        assert (await remote_joiner.wait()).rejection is RejectionKind.QUEUE_TIMEOUT
        info = await a.cluster_slot("s")
        assert info is not None
        assert (info.holder, info.queue_depth) == (a.instance_id, 0)
        assert rec_b.of(EventKind.CONTROLLER_REJECTED, task_id=late.id)[0].rejection is (
            RejectionKind.QUEUE_TIMEOUT
        )
        gate.set()


async def test_held_cluster_work_times_out_while_held(store: RedisSlotStore) -> None:
    """wait=True work held for room in a full cluster queue is rejected QUEUE_TIMEOUT at
    its deadline, placed REJECTED."""
    gate_a, gate_next = trio.Event(), trio.Event()
    async with replica(store) as (a, rec_a), replica(store, max_slot_queue=1) as (b, _):
        await own(a, rec_a, gated(gate_a))
        await a.submit(ControllerSpec.queue(gated(gate_next), slot="s"))
        started = time.monotonic()
        held = await b.submit(
            ControllerSpec.queue(quick("h"), slot="s", wait=True, queue_timeout=TIMEOUT)
        )
        outcome = await held.wait()
        elapsed = time.monotonic() - started
        assert outcome.rejection is RejectionKind.QUEUE_TIMEOUT
        assert held.placement is Placement.REJECTED
        assert TIMEOUT <= elapsed < 2 * TIMEOUT
        view = b.controller_snapshot().slot("s")
        assert view is None
        gate_a.set()
        gate_next.set()


async def test_a_zero_queue_timeout_on_a_free_cluster_slot_still_runs(
    store: RedisSlotStore,
) -> None:
    """queue_timeout=0 withdraws only work that would be queued or held: on a slot idle
    cluster-wide the work is granted the lease and runs."""
    async with replica(store) as (a, _):
        waiter = await a.submit(ControllerSpec.queue(quick("now", 1), slot="s", queue_timeout=0))
        assert await waiter.wait_placed() is Placement.OWNER
        assert (await waiter.wait()).value == 1


# -- cancel_slot ----------------------------------------------------------------------------------


async def test_cancel_slot_stops_a_remote_owner_and_waits_for_its_lease(
    store: RedisSlotStore,
) -> None:
    """``cancel_slot`` withdraws this process's entries and asks the owner's process to
    stop its owner (CONTROLLER_REMOTE_STOP there); it returns once the lease is
    released, counting the withdrawn entry and the remote owner."""
    exited = trio.Event()

    async def slow_to_stop() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(TIMEOUT)  # cleanup within the grace
            exited.set()

    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        owner = await a.submit(ControllerSpec.queue(TaskSpec.once("o", slow_to_stop), slot="s"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        queued = await b.submit(ControllerSpec.queue(quick("q"), slot="s"))
        assert await queued.wait_placed() is Placement.QUEUED
        assert await b.cancel_slot("s") == 2
        assert exited.is_set()  # the owner's body has physically exited
        assert await b.cluster_slot("s") is None  # no lease, no queue entry
        assert (await queued.wait()).rejection is RejectionKind.REMOVED_FROM_QUEUE
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        stop = await rec_a.wait_for(EventKind.CONTROLLER_REMOTE_STOP, task_id=owner.id)
        assert stop.reason == f"stop requested by {b.instance_id}"


async def test_cancel_slot_counts_a_remote_owner_with_nothing_here(
    store: RedisSlotStore,
) -> None:
    """With no work of its own in the slot, ``cancel_slot`` returns 1 for the remote owner;
    a slot idle cluster-wide gives 0."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        assert await b.cancel_slot("s") == 0
        await own(a, rec_a, gated(gate))
        assert await b.cancel_slot("s") == 1
        assert await b.cluster_slot("s") is None
        assert not gate.is_set()


async def test_cancel_slot_with_a_local_owner_leaves_other_processes_entries(
    store: RedisSlotStore,
) -> None:
    """With the owner here, ``cancel_slot`` stops it and withdraws this process's queued
    work only: another process's queued entry then owns the slot."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        await own(a, rec_a, gated(gate))
        mine = await a.submit(ControllerSpec.queue(quick("mine"), slot="s"))
        assert await mine.wait_placed() is Placement.QUEUED
        theirs = await b.submit(ControllerSpec.queue(quick("theirs", "b"), slot="s"))
        assert await theirs.wait_placed() is Placement.QUEUED
        assert await a.cancel_slot("s") == 2
        assert (await mine.wait()).rejection is RejectionKind.REMOVED_FROM_QUEUE
        assert (await theirs.wait()).value == "b"


async def test_cancel_slot_raises_when_the_server_does_not_answer(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server hangs (SIGSTOP) while the slot is remote: ``cancel_slot`` withdraws the
    local work at once and raises ``SlotStoreUnavailableError`` after ``connect_timeout``,
    as ``cluster_slot`` does."""
    quick_store = RedisSlotStore(
        store.url, namespace=store.namespace, lease_ttl=store.lease_ttl, connect_timeout=0.5
    )
    gate = trio.Event()
    async with replica(quick_store) as (a, rec_a), replica(quick_store) as (b, _):
        await own(a, rec_a, gated(gate))
        queued = await b.submit(ControllerSpec.queue(quick("q"), slot="s"))
        assert await queued.wait_placed() is Placement.QUEUED
        redis_server.pause()
        started = time.monotonic()
        with pytest.raises(SlotStoreUnavailableError, match=r"did not answer within 0\.5 s"):
            await b.cancel_slot("s")
        assert time.monotonic() - started < 2 * 0.5
        assert (await queued.wait()).rejection is RejectionKind.REMOVED_FROM_QUEUE
        redis_server.resume()
        gate.set()


# -- wait_slot_idle ------------------------------------------------------------------------------


async def test_wait_slot_idle_waits_for_the_slot_to_be_idle_cluster_wide(
    store: RedisSlotStore,
) -> None:
    """A process with nothing in the slot waits for another process's owner and for the
    cluster queue behind it; it returns once neither is left."""
    gate, gate_next = trio.Event(), trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        await own(a, rec_a, gated(gate))
        nxt = await a.submit(ControllerSpec.queue(gated(gate_next), slot="s"))
        assert await nxt.wait_placed() is Placement.QUEUED
        async with trio.open_nursery() as nursery:

            async def release_in_turn() -> None:
                gate.set()
                await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=nxt.id)
                gate_next.set()

            nursery.start_soon(release_in_turn)
            await b.wait_slot_idle("s")
            assert gate_next.is_set()
        assert (await nxt.wait()).kind is OutcomeKind.COMPLETED
        assert await b.cluster_slot("s") is None


async def test_wait_slot_idle_on_a_slot_idle_cluster_wide_returns(store: RedisSlotStore) -> None:
    """A slot with no lease and no entry anywhere: ``wait_slot_idle`` returns (a
    checkpoint)."""
    async with replica(store) as (a, _):
        with trio.testing.assert_checkpoints():
            await a.wait_slot_idle("s")


async def test_wait_slot_idle_raises_when_the_server_does_not_answer(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Idle here, the slot's cluster state cannot be read: ``SlotStoreUnavailableError``
    after ``connect_timeout``."""
    quick_store = RedisSlotStore(
        store.url, namespace=store.namespace, lease_ttl=store.lease_ttl, connect_timeout=0.5
    )
    async with replica(quick_store) as (a, _):
        redis_server.pause()
        started = time.monotonic()
        with pytest.raises(SlotStoreUnavailableError, match=r"did not answer within 0\.5 s"):
            await a.wait_slot_idle("s")
        assert time.monotonic() - started < 2 * 0.5
        redis_server.resume()
