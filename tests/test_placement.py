"""Placement: ``waiter.placement`` and ``await waiter.wait_placed()``.

Every value and the moment it is decided: ``OWNER`` on an idle slot (every policy) and
for work added with ``add``; ``QUEUED``, ``JOINED`` and ``REJECTED`` on a busy slot; no
placement while held, then the decision; set once, whatever happens to the work later.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    ControllerSpec,
    OutcomeKind,
    Placement,
    RejectionKind,
    TaskNameInUseError,
    TaskSpec,
)

from helpers import drop, job, join, once, queue, rejected, replace, settle, supervisor

OWNER, QUEUED, JOINED, REJECTED = (
    Placement.OWNER,
    Placement.QUEUED,
    Placement.JOINED,
    Placement.REJECTED,
)


def test_placement_is_a_str_enum_with_lower_case_values() -> None:
    """Placement values are their lower-case names, as plain strings."""
    assert [p.value for p in Placement] == ["owner", "queued", "joined", "rejected"]
    assert Placement.OWNER == "owner"
    assert isinstance(Placement.QUEUED, str)


# -- idle and busy slots ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(AdmissionPolicy))
async def test_every_policy_on_an_idle_slot_is_placed_owner(
    autojump_clock: Any, policy: AdmissionPolicy
) -> None:
    """On an idle slot every policy, JOIN and DROP_IF_RUNNING included, is OWNER."""
    async with supervisor(max_slot_queue=10) as sup:
        waiter = await sup.submit(ControllerSpec(once("w", job, 1.0), policy, "s"))
        assert await waiter.wait_placed() is OWNER
        assert waiter.placement is OWNER
        assert (await waiter.wait()).is_success


@pytest.mark.parametrize(
    ("make", "placement"),
    [(queue, QUEUED), (replace, QUEUED), (join, JOINED), (drop, REJECTED)],
    ids=["queue", "replace", "join", "drop_if_running"],
)
async def test_busy_slot_placement_by_policy(
    autojump_clock: Any, make: Any, placement: Placement
) -> None:
    """On a busy slot: QUEUE and REPLACE are QUEUED, JOIN JOINED, DROP_IF_RUNNING REJECTED."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        waiter = await sup.submit(make("w", job, 1.0, slot="s"))
        assert await waiter.wait_placed() is placement
        assert waiter.placement is placement
        assert trio.current_time() == 0.0


async def test_placement_is_none_until_the_controller_takes_the_work_in(
    autojump_clock: Any,
) -> None:
    """submit_nowait hands work over unplaced; wait_placed returns once it is taken in."""
    async with supervisor(max_slot_queue=10) as sup:
        waiter = sup.submit_nowait(queue("w", job, 1.0, slot="s"))
        assert waiter.placement is None
        assert await waiter.wait_placed() is OWNER
        assert trio.current_time() == 0.0


async def test_wait_placed_when_known_is_a_checkpoint(autojump_clock: Any) -> None:
    """wait_placed on a placed waiter is still a checkpoint."""
    async with supervisor(max_slot_queue=10) as sup:
        waiter = await sup.submit(queue("w", job, 1.0, slot="s"))
        with trio.testing.assert_checkpoints():
            assert await waiter.wait_placed() is OWNER


# -- set once ---------------------------------------------------------------------------------


async def test_queued_work_that_becomes_the_owner_stays_queued(autojump_clock: Any) -> None:
    """Work placed QUEUED keeps that placement after it starts."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        waiter = await sup.submit(queue("next", job, 1.0, "v", slot="s"))
        assert (await waiter.wait()).value == "v"
        assert trio.current_time() == 2.0
        assert waiter.placement is QUEUED


async def test_superseded_queued_work_stays_queued(autojump_clock: Any) -> None:
    """A queue head displaced by a REPLACE ends SUPERSEDED and stays QUEUED."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        head = await sup.submit(queue("head", job, 1.0, slot="s"))
        await sup.submit(replace("newer", job, 1.0, slot="s"))
        assert await head.wait() == rejected(RejectionKind.SUPERSEDED)
        assert head.placement is QUEUED


async def test_removed_queued_work_stays_queued(autojump_clock: Any) -> None:
    """Queued work removed by id ends REMOVED_FROM_QUEUE and stays QUEUED."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, slot="s"))
        assert await sup.remove(waiter.id)
        assert await waiter.wait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        assert waiter.placement is QUEUED


async def test_queued_work_rejected_at_shutdown_stays_queued(autojump_clock: Any) -> None:
    """Queued work rejected SHUTTING_DOWN keeps its placement."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, slot="s"))
    assert waiter.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)
    assert waiter.placement is QUEUED


async def test_owner_the_registry_rejects_stays_owner(autojump_clock: Any) -> None:
    """An owner rejected by the registry (duplicate name) resolves REJECTED, stays OWNER."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.add(once("taken", job, 10.0))
        waiter = await sup.submit(queue("taken", job, 1.0, slot="s"))
        assert await waiter.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        assert waiter.placement is OWNER


async def test_joiner_stays_joined_when_its_work_is_rejected(autojump_clock: Any) -> None:
    """A joiner shares the REJECTED outcome of the work it follows, and stays JOINED."""
    async with supervisor(max_slot_queue=10) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        tail = await sup.submit(queue("tail", job, 1.0, slot="s"))
        joiner = await sup.submit(join("j", job, 1.0, slot="s"))
        assert await sup.remove(tail.id)
        assert await joiner.wait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        assert joiner.placement is JOINED


# -- rejected at intake ------------------------------------------------------------------------


async def test_queue_full_is_rejected_placement(autojump_clock: Any) -> None:
    """Work rejected QUEUE_FULL at intake is placed REJECTED."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        waiter = await sup.submit(queue("w", job, 1.0, slot="s"))
        assert await waiter.wait() == rejected(RejectionKind.QUEUE_FULL)
        assert waiter.placement is REJECTED


async def test_new_slot_past_max_slots_is_rejected_placement(autojump_clock: Any) -> None:
    """Work rejected RESOURCE_LIMIT (max_slots) at intake is placed REJECTED."""
    async with supervisor(max_slots=1) as sup:
        await sup.submit(queue("a", job, 1.0, slot="a"))
        waiter = await sup.submit(queue("b", job, 1.0, slot="b", wait=True))
        assert await waiter.wait_placed() is REJECTED


async def test_joiner_past_max_waiters_is_rejected_placement(autojump_clock: Any) -> None:
    """A JOIN rejected RESOURCE_LIMIT (max_waiters) at intake is placed REJECTED."""
    async with supervisor(max_waiters=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        joiner = await sup.submit(join("j", job, 1.0, slot="s"))
        assert await joiner.wait_placed() is REJECTED
        assert await joiner.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


# -- held work ---------------------------------------------------------------------------------


async def test_held_work_has_no_placement_until_it_is_queued(autojump_clock: Any) -> None:
    """Held work is unplaced; it is placed QUEUED at the instant room frees."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        await sup.submit(queue("queued", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        await settle()
        assert held.placement is None
        assert await held.wait_placed() is QUEUED
        assert trio.current_time() == 1.0  # the queued head started: room for one


async def test_held_work_on_a_slot_turned_idle_is_placed_owner(autojump_clock: Any) -> None:
    """Held work started on its slot turning idle is placed OWNER."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        assert await held.wait_placed() is OWNER
        assert trio.current_time() == 1.0


async def test_held_work_removed_while_held_is_rejected_placement(autojump_clock: Any) -> None:
    """Held work removed by id before it was placed is placed REJECTED."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        await settle()
        assert await sup.remove(held.id)
        assert await held.wait_placed() is REJECTED
        assert held.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)


async def test_held_work_rejected_at_shutdown_is_rejected_placement(autojump_clock: Any) -> None:
    """Held work rejected SHUTTING_DOWN is placed REJECTED."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        held = await sup.submit(queue("held", job, 1.0, slot="s", wait=True))
        await settle()
    assert held.placement is REJECTED
    assert held.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)


async def test_producer_awaits_placement_for_back_pressure(autojump_clock: Any) -> None:
    """A producer awaiting wait_placed of each held submission advances as room frees."""
    placed_at: list[float] = []
    async with supervisor(max_slot_queue=1) as sup:
        for i in range(4):
            waiter = await sup.submit(queue(f"w{i}", job, 1.0, slot="s", wait=True))
            await waiter.wait_placed()
            placed_at.append(trio.current_time())
    # w0 owner, w1 queued at once; w2 once w0 ended (w1 started), w3 once w1 ended.
    assert placed_at == [0.0, 0.0, 1.0, 2.0]


# -- work added with add -----------------------------------------------------------------------


@pytest.mark.parametrize("controller", [False, True])
async def test_added_work_is_owner_once_registered(autojump_clock: Any, controller: bool) -> None:
    """Work added with add is OWNER when add returns, with or without a controller."""
    fields: dict[str, Any] = {"max_slot_queue": 10} if controller else {}
    async with supervisor(**fields) as sup:
        waiter = await sup.add(once("w", job, 1.0))
        assert waiter.placement is OWNER


async def test_add_nowait_is_placed_when_the_registry_registers_it(autojump_clock: Any) -> None:
    """add_nowait returns unplaced work; wait_placed returns OWNER once it is registered."""
    async with supervisor() as sup:
        waiter = sup.add_nowait(once("w", job, 1.0))
        assert waiter.placement is None
        assert await waiter.wait_placed() is OWNER
        assert trio.current_time() == 0.0


async def test_added_work_the_registry_rejects_is_rejected_placement(autojump_clock: Any) -> None:
    """add_nowait of a name in use, and every item of a rejected batch, are REJECTED."""
    async with supervisor() as sup:
        await sup.add(once("taken", job, 10.0))
        duplicate = sup.add_nowait(once("taken", job, 1.0))
        assert await duplicate.wait_placed() is REJECTED
        specs = [TaskSpec.once("fresh", job, 1.0), TaskSpec.once("taken", job, 1.0)]
        with pytest.raises(TaskNameInUseError):
            await sup.add_batch(specs)
        assert await duplicate.wait() == rejected(RejectionKind.ALREADY_EXISTS)


async def test_outcome_and_placement_of_completed_added_work(autojump_clock: Any) -> None:
    """Completed added work stays OWNER after its outcome."""
    async with supervisor() as sup:
        waiter = await sup.add(once("w", job, 1.0))
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        assert waiter.placement is OWNER
