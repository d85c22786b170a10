"""The controller's slot state machine (``_slots``): pure, synchronous tests.

Examples pin each transition of the slot table; a Hypothesis
stateful machine drives random submissions, registry decisions, exits, removes and the
shutdown under small budgets and checks the module's invariants after every step.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from trio_taskvisor import AdmissionPolicy, Placement, SlotStatus

# The slot machine's own names: private, so they come through helpers like every internal.
from helpers import (
    ADMIT,
    DETACH,
    JOIN,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    REJECT,
    REMOVED_FROM_QUEUE,
    RESOURCE_LIMIT,
    SHUTTING_DOWN,
    SLOT_BUSY,
    STOP,
    SUBMITTED,
    SUPERSEDED,
    TRANSITION,
    Entry,
    SlotMachine,
    Submitted,
    triples,
)

QUEUE = AdmissionPolicy.QUEUE
REPLACE = AdmissionPolicy.REPLACE
DROP = AdmissionPolicy.DROP_IF_RUNNING
JOINS = AdmissionPolicy.JOIN
ADMITTING = SlotStatus.ADMITTING
RUNNING = SlotStatus.RUNNING
TERMINATING = SlotStatus.TERMINATING
HELD = "held"  # a SUBMITTED effect whose reason is "held" (a documented text)


class Harness:
    """A ``SlotMachine`` with an id counter; ``take()`` returns and clears its effects."""

    def __init__(
        self,
        *,
        max_slot_queue: int = 10,
        max_total_pending: int | None = None,
        max_slots: int | None = None,
        max_waiters: int | None = None,
    ) -> None:
        self.m = SlotMachine(
            max_slot_queue=max_slot_queue,
            max_total_pending=max_total_pending,
            max_slots=max_slots,
            max_waiters=max_waiters,
        )
        self.ids = itertools.count(1)

    def submit(
        self, key: str, policy: AdmissionPolicy = QUEUE, *, wait: bool = False, now: float = 0.0
    ) -> Entry:
        entry = Entry(next(self.ids), key, policy, wait=wait)
        self.m.submit(entry, now)
        return entry

    def timed(self, entry: Entry, deadline: float, now: float) -> Entry:
        """Submit ``entry`` with a queue deadline, as the controller does."""
        entry.deadline = deadline
        self.m.submit(entry, now)
        self.m.track_deadline(entry, now)
        return entry

    def running(self, key: str) -> Entry:
        """Start an owner on idle ``key`` and let the registry accept it."""
        owner = self.submit(key)
        self.m.admitted(owner, True, 0.0)
        self.take()
        return owner

    def take(self) -> list[tuple[Any, ...]]:
        """The effects so far, SUBMITTED reasons other than "held" left out; then clear."""
        effects, self.m.effects = triples(self.m.effects), []
        out: list[tuple[Any, ...]] = []
        for tag, entry, arg in effects:
            if tag == SUBMITTED:
                out.append((HELD, entry) if arg == HELD else (SUBMITTED, entry))
            else:
                out.append((tag, entry, arg))
        return out

    def queue(self, key: str) -> list[Entry]:
        return list(self.m.slots[key].queue)

    def held(self, key: str) -> list[Entry]:
        return list(self.m.slots[key].held)

    def status(self, key: str) -> SlotStatus | None:
        return self.m.slots[key].status


# -- idle -> ADMITTING -> RUNNING ---------------------------------------------------------------


@pytest.mark.parametrize("policy", list(AdmissionPolicy))
def test_idle_slot_starts_admission_for_every_policy(policy: AdmissionPolicy) -> None:
    """Any policy on an idle slot becomes its owner and asks the registry to admit it."""
    h = Harness()
    a = h.submit("k", policy, now=2.0)
    assert h.take() == [(SUBMITTED, a), (ADMIT, a, None)]
    slot = h.m.slots["k"]
    assert (slot.owner, slot.status, slot.since) == (a, ADMITTING, 2.0)
    assert h.m.pending == 0


def test_registry_accept_moves_admitting_to_running() -> None:
    """The registry's acceptance makes the owner RUNNING and says so."""
    h = Harness()
    a = h.submit("k")
    h.take()
    h.m.admitted(a, True, 3.0)
    assert h.take() == [(TRANSITION, a, "admitting->running")]
    assert (h.status("k"), h.m.slots["k"].since) == (RUNNING, 3.0)


def test_registry_reject_starts_next_queued_item() -> None:
    """A rejected owner leaves at once (no REJECT from the machine); the queue head starts."""
    h = Harness()
    a = h.submit("k")
    b = h.submit("k")
    c = h.submit("k")
    h.take()
    h.m.admitted(a, False, 1.0)
    assert h.take() == [(SUBMITTED, b), (ADMIT, b, None)]
    assert h.m.slots["k"].owner is b
    assert h.status("k") is ADMITTING
    assert h.queue("k") == [c]
    assert h.m.pending == 1


def test_registry_reject_of_a_lone_owner_drops_the_slot() -> None:
    """With nothing behind it, a rejected owner leaves the slot idle, and idle slots vanish."""
    h = Harness()
    a = h.submit("k")
    h.take()
    h.m.admitted(a, False, 1.0)
    assert h.take() == []
    assert h.m.slots == {}


def test_registry_reject_falls_back_to_the_oldest_held_submission() -> None:
    """With an empty queue, a rejected owner's slot starts its oldest held submission."""
    h = Harness(max_slot_queue=0)
    a = h.submit("k")
    w1 = h.submit("k", wait=True)
    w2 = h.submit("k", wait=True)
    h.take()
    h.m.admitted(a, False, 1.0)
    assert h.take() == [(SUBMITTED, w1), (ADMIT, w1, None)]
    assert h.held("k") == [w2]


# -- REPLACE ------------------------------------------------------------------------------------


def test_replace_while_admitting_terminates_then_stops_at_acceptance() -> None:
    """REPLACE during admission marks the slot TERMINATING; the STOP waits for acceptance."""
    h = Harness()
    a = h.submit("k")
    h.take()
    r = h.submit("k", REPLACE, now=1.0)
    assert h.take() == [(SUBMITTED, r), (TRANSITION, a, "admitting->terminating")]
    assert h.status("k") is TERMINATING
    h.m.admitted(a, True, 2.0)
    assert h.take() == [(STOP, a, None)]
    assert h.status("k") is TERMINATING
    h.m.exited(a, 3.0)
    assert h.take() == [(SUBMITTED, r), (ADMIT, r, None)]
    assert h.m.slots["k"].owner is r


def test_replace_while_admitting_then_registry_reject_goes_to_the_replacement() -> None:
    """A rejected ADMITTING->TERMINATING owner hands the slot straight to its replacement."""
    h = Harness()
    a = h.submit("k")
    r = h.submit("k", REPLACE)
    h.take()
    h.m.admitted(a, False, 1.0)
    assert h.take() == [(SUBMITTED, r), (ADMIT, r, None)]
    assert h.status("k") is ADMITTING


def test_replace_while_running_stops_the_owner() -> None:
    """REPLACE on a RUNNING owner becomes the queue head and stops the owner."""
    h = Harness()
    a = h.running("k")
    r = h.submit("k", REPLACE, now=4.0)
    assert h.take() == [
        (SUBMITTED, r),
        (TRANSITION, a, "running->terminating"),
        (STOP, a, None),
    ]
    assert (h.status("k"), h.m.slots["k"].since) == (TERMINATING, 4.0)
    assert h.queue("k") == [r]
    assert h.m.pending == 1


def test_replace_while_terminating_supersedes_the_head_without_a_second_stop() -> None:
    """Another REPLACE swaps the head (SUPERSEDED) and stops nothing again."""
    h = Harness()
    h.running("k")
    r1 = h.submit("k", REPLACE)
    h.take()
    r2 = h.submit("k", REPLACE)
    assert h.take() == [(SUBMITTED, r2), (REJECT, r1, SUPERSEDED)]
    assert h.status("k") is TERMINATING
    assert h.queue("k") == [r2]
    assert h.m.pending == 1


def test_replace_supersedes_a_queued_head_and_keeps_the_fifo_tail() -> None:
    """REPLACE takes the head's place; the rest of the queue keeps its order."""
    h = Harness()
    a = h.running("k")
    q1 = h.submit("k")
    q2 = h.submit("k")
    h.take()
    r = h.submit("k", REPLACE)
    assert h.take() == [
        (SUBMITTED, r),
        (REJECT, q1, SUPERSEDED),
        (TRANSITION, a, "running->terminating"),
        (STOP, a, None),
    ]
    assert h.queue("k") == [r, q2]
    assert h.m.pending == 2


def test_replace_ignores_max_slot_queue() -> None:
    """A REPLACE head is queued even when the slot queue budget is zero."""
    h = Harness(max_slot_queue=0)
    h.running("k")
    r = h.submit("k", REPLACE)
    assert (SUBMITTED, r) in h.take()
    assert h.queue("k") == [r]


def test_replace_creating_a_head_needs_a_pending_unit() -> None:
    """A new head needs ``max_total_pending`` room; the owner is not stopped when rejected."""
    h = Harness(max_total_pending=0)
    h.running("k")
    r = h.submit("k", REPLACE)
    assert h.take() == [(REJECT, r, RESOURCE_LIMIT)]
    assert h.status("k") is RUNNING


def test_replace_of_an_existing_head_needs_no_pending_unit() -> None:
    """Replacing a queued head reuses its unit, so a full pending budget does not matter."""
    h = Harness(max_total_pending=1)
    h.running("k")
    q = h.submit("k")
    h.take()
    r = h.submit("k", REPLACE)
    assert (REJECT, q, SUPERSEDED) in h.take()
    assert h.queue("k") == [r]
    assert h.m.pending == 1


def test_removing_the_replacement_keeps_the_slot_terminating() -> None:
    """Remove by id does not change the status; the stopped owner still runs to its exit."""
    h = Harness()
    a = h.running("k")
    r = h.submit("k", REPLACE)
    h.take()
    assert h.m.remove(r.id, 1.0) is r
    assert h.take() == [(REJECT, r, REMOVED_FROM_QUEUE)]
    assert h.status("k") is TERMINATING
    h.m.exited(a, 2.0)
    assert h.take() == []
    assert h.m.slots == {}


# -- exit, DROP_IF_RUNNING, JOIN ------------------------------------------------------------------


def test_exit_starts_queued_work_in_fifo_order_then_the_slot_vanishes() -> None:
    """Each exit starts the next queued item; the last exit removes the slot."""
    h = Harness()
    a = h.running("k")
    b = h.submit("k")
    c = h.submit("k")
    h.take()
    h.m.exited(a, 1.0)
    assert h.take() == [(SUBMITTED, b), (ADMIT, b, None)]
    assert (h.status("k"), h.m.slots["k"].since) == (ADMITTING, 1.0)
    h.m.admitted(b, True, 2.0)
    h.m.exited(b, 3.0)
    assert h.take()[-2:] == [(SUBMITTED, c), (ADMIT, c, None)]
    h.m.admitted(c, True, 4.0)
    h.m.exited(c, 5.0)
    assert h.take() == [(TRANSITION, c, "admitting->running")]
    assert h.m.slots == {}
    assert (h.m.pending, h.m.queued) == (0, {})


def test_drop_if_running_rejects_slot_busy_and_touches_nothing() -> None:
    """DROP_IF_RUNNING on a busy slot is rejected; owner and queue stay as they were."""
    h = Harness()
    a = h.running("k")
    q = h.submit("k")
    h.take()
    d = h.submit("k", DROP)
    assert h.take() == [(REJECT, d, SLOT_BUSY)]
    assert h.m.slots["k"].owner is a
    assert h.queue("k") == [q]


def test_join_follows_the_owner_when_the_queue_is_empty() -> None:
    """A JOIN starts nothing and follows the owner."""
    h = Harness()
    a = h.running("k")
    j = h.submit("k", JOINS)
    assert h.take() == [(SUBMITTED, j), (JOIN, j, a)]
    assert h.m.joiners == {j.id: j}
    assert h.m.waiting == 1
    assert h.queue("k") == []


def test_join_follows_the_queue_tail() -> None:
    """A JOIN follows the last work in line: the queue tail."""
    h = Harness()
    h.running("k")
    h.submit("k")
    tail = h.submit("k")
    h.take()
    j = h.submit("k", JOINS)
    assert h.take() == [(SUBMITTED, j), (JOIN, j, tail)]


def test_join_ignores_held_work() -> None:
    """Held work is not in the line: a JOIN on a full queue follows the queue tail."""
    h = Harness(max_slot_queue=1)
    h.running("k")
    tail = h.submit("k")
    h.submit("k", wait=True)
    h.take()
    j = h.submit("k", JOINS)
    assert h.take() == [(SUBMITTED, j), (JOIN, j, tail)]


def test_joiner_stops_counting_when_its_work_ends() -> None:
    """Joiners count against ``max_waiters`` until the work they follow exits."""
    h = Harness(max_waiters=1)
    a = h.running("k")
    h.submit("k", JOINS)
    h.take()
    extra = h.submit("k", JOINS)
    assert h.take() == [(REJECT, extra, RESOURCE_LIMIT)]
    h.m.exited(a, 1.0)
    assert h.take() == []
    assert (h.m.joiners, h.m.waiting) == ({}, 0)


def test_joiner_is_released_when_its_work_is_superseded() -> None:
    """A superseded head takes its joiners with it (they follow its REJECTED outcome)."""
    h = Harness()
    h.running("k")
    q = h.submit("k")
    h.submit("k", JOINS)
    h.take()
    h.submit("k", REPLACE)
    assert (REJECT, q, SUPERSEDED) in h.take()
    assert h.m.joiners == {}


# -- budgets without wait -----------------------------------------------------------------------


def test_full_slot_queue_rejects_queue_full() -> None:
    """QUEUE past ``max_slot_queue`` is rejected QUEUE_FULL."""
    h = Harness(max_slot_queue=1)
    h.running("k")
    h.submit("k")
    h.take()
    q = h.submit("k")
    assert h.take() == [(REJECT, q, QUEUE_FULL)]
    assert h.m.pending == 1


def test_full_total_pending_rejects_resource_limit() -> None:
    """QUEUE past ``max_total_pending`` is rejected RESOURCE_LIMIT."""
    h = Harness(max_total_pending=1)
    h.running("a")
    h.running("b")
    h.submit("a")
    h.take()
    q = h.submit("b")
    assert h.take() == [(REJECT, q, RESOURCE_LIMIT)]


def test_max_slots_rejects_a_new_slot() -> None:
    """A new slot past ``max_slots`` is rejected RESOURCE_LIMIT; known slots still queue."""
    h = Harness(max_slots=1)
    h.running("a")
    b = h.submit("b")
    assert h.take() == [(REJECT, b, RESOURCE_LIMIT)]
    q = h.submit("a")
    assert h.take() == [(SUBMITTED, q)]
    assert list(h.m.slots) == ["a"]


@pytest.mark.parametrize("policy", [QUEUE, REPLACE])
def test_max_slots_rejects_a_new_slot_even_with_wait(policy: AdmissionPolicy) -> None:
    """Waiting never applies to ``max_slots``."""
    h = Harness(max_slots=1)
    h.running("a")
    b = h.submit("b", policy, wait=True)
    assert h.take() == [(REJECT, b, RESOURCE_LIMIT)]
    assert h.m.held == {}


def test_max_slots_frees_when_a_slot_vanishes() -> None:
    """An idle slot no longer counts against ``max_slots``."""
    h = Harness(max_slots=1)
    a = h.running("a")
    h.m.exited(a, 1.0)
    b = h.submit("b")
    assert h.take() == [(SUBMITTED, b), (ADMIT, b, None)]


# -- wait mode ------------------------------------------------------------------------------------


def test_wait_holds_instead_of_queue_full_and_places_when_room_frees() -> None:
    """A held QUEUE reserves nothing; it is queued as soon as its slot has room."""
    h = Harness(max_slot_queue=1)
    a = h.running("k")
    q = h.submit("k")
    h.take()
    w = h.submit("k", wait=True)
    assert h.take() == [(HELD, w)]
    assert (h.m.held, h.m.pending, h.m.waiting) == ({w.id: w}, 1, 1)
    h.m.exited(a, 1.0)
    assert h.take() == [(SUBMITTED, q), (ADMIT, q, None), (SUBMITTED, w)]
    assert h.queue("k") == [w]
    assert (h.m.held, h.m.pending, h.m.waiting) == ({}, 1, 0)


def test_wait_holds_instead_of_resource_limit() -> None:
    """A wait-mode submission also waits for the global pending budget."""
    h = Harness(max_total_pending=1)
    h.running("a")
    h.running("b")
    qa = h.submit("a")
    h.take()
    w = h.submit("b", wait=True)
    assert h.take() == [(HELD, w)]
    h.m.remove(qa.id, 1.0)
    assert h.take() == [(REJECT, qa, REMOVED_FROM_QUEUE), (SUBMITTED, w)]
    assert h.queue("b") == [w]


def test_held_work_keeps_fifo_order_in_its_slot() -> None:
    """Held work of a slot is placed oldest first as its queue frees."""
    h = Harness(max_slot_queue=1)
    a = h.running("k")
    q = h.submit("k")
    w1 = h.submit("k", wait=True)
    w2 = h.submit("k", wait=True)
    assert h.take() == [(SUBMITTED, q), (HELD, w1), (HELD, w2)]
    h.m.exited(a, 1.0)
    assert h.take() == [(SUBMITTED, q), (ADMIT, q, None), (SUBMITTED, w1)]
    h.m.admitted(q, True, 2.0)
    h.m.exited(q, 3.0)
    assert h.take()[1:] == [(SUBMITTED, w1), (ADMIT, w1, None), (SUBMITTED, w2)]


def test_held_work_keeps_fifo_order_whatever_its_policy() -> None:
    """A wait-mode REPLACE that needs a budget waits behind the slot's older held work."""
    h = Harness(max_total_pending=0)
    a = h.running("k")
    w = h.submit("k", wait=True)
    r = h.submit("k", REPLACE, wait=True)
    assert h.take() == [(HELD, w), (HELD, r)]
    assert h.status("k") is RUNNING
    h.m.exited(a, 1.0)
    assert h.take() == [(SUBMITTED, w), (ADMIT, w, None)]
    assert h.held("k") == [r]
    h.m.admitted(w, True, 2.0)
    h.m.exited(w, 3.0)
    assert h.take()[1:] == [(SUBMITTED, r), (ADMIT, r, None)]


def test_held_replace_placed_behind_a_fresh_owner_marks_it_terminating() -> None:
    """When an idle slot starts its oldest held work, a held REPLACE behind it is placed
    at once and marks the new owner TERMINATING (stopped once accepted)."""
    h = Harness(max_slot_queue=0)
    a = h.running("k")
    w = h.submit("k", wait=True)
    r = h.submit("k", REPLACE, wait=True)
    assert h.take() == [(HELD, w), (HELD, r)]
    h.m.exited(a, 1.0)
    assert h.take() == [
        (SUBMITTED, w),
        (ADMIT, w, None),
        (SUBMITTED, r),
        (TRANSITION, w, "admitting->terminating"),
    ]
    assert (h.status("k"), h.queue("k"), h.held("k")) == (TERMINATING, [r], [])
    h.m.admitted(w, True, 2.0)
    assert h.take() == [(STOP, w, None)]


def test_held_replace_stops_the_owner_only_when_placed() -> None:
    """A held REPLACE leaves the owner RUNNING until it is placed."""
    h = Harness(max_total_pending=1)
    a = h.running("a")
    h.running("b")
    qb = h.submit("b")
    h.take()
    r = h.submit("a", REPLACE, wait=True)
    assert h.take() == [(HELD, r)]
    assert h.status("a") is RUNNING
    h.m.remove(qb.id, 1.0)
    assert h.take() == [
        (REJECT, qb, REMOVED_FROM_QUEUE),
        (SUBMITTED, r),
        (TRANSITION, a, "running->terminating"),
        (STOP, a, None),
    ]
    assert h.queue("a") == [r]


def test_held_replace_supersedes_older_held_work_placed_in_the_same_step() -> None:
    """Freed capacity places a slot's held work in order, so a held REPLACE placed right
    after older held work displaces it at once (SUPERSEDED)."""
    h = Harness(max_slot_queue=1, max_total_pending=1)
    a = h.running("a")
    b = h.running("b")
    qa = h.submit("a")
    wb = h.submit("b", wait=True)
    rb = h.submit("b", REPLACE, wait=True)
    assert h.take() == [(SUBMITTED, qa), (HELD, wb), (HELD, rb)]
    h.m.exited(a, 1.0)
    assert h.take() == [
        (SUBMITTED, qa),
        (ADMIT, qa, None),
        (SUBMITTED, wb),
        (SUBMITTED, rb),
        (REJECT, wb, SUPERSEDED),
        (TRANSITION, b, "running->terminating"),
        (STOP, b, None),
    ]
    assert (h.queue("b"), h.held("b"), h.m.pending) == ([rb], [], 1)


def test_wait_replace_of_an_existing_head_is_placed_despite_held_work() -> None:
    """A REPLACE that needs no budget is placed at once, even ahead of held work."""
    h = Harness(max_slot_queue=1)
    h.running("k")
    q = h.submit("k")
    w = h.submit("k", wait=True)
    h.take()
    r = h.submit("k", REPLACE, wait=True)
    assert (REJECT, q, SUPERSEDED) in h.take()
    assert h.queue("k") == [r]
    assert h.held("k") == [w]


def test_non_wait_submission_never_waits_behind_held_work() -> None:
    """Without wait, a submission that lacks a budget is rejected even if others are held."""
    h = Harness(max_slot_queue=1)
    h.running("k")
    h.submit("k")
    h.submit("k", wait=True)
    h.take()
    q = h.submit("k")
    assert h.take() == [(REJECT, q, QUEUE_FULL)]


def test_freed_capacity_goes_to_the_oldest_held_submission_first() -> None:
    """One freed pending unit goes to the oldest held submission across slots."""
    h = Harness(max_total_pending=1)
    h.running("a")
    h.running("b")
    qa = h.submit("a")
    wb = h.submit("b", wait=True)
    wa = h.submit("a", wait=True)
    h.take()
    h.m.remove(qa.id, 1.0)
    assert h.take() == [(REJECT, qa, REMOVED_FROM_QUEUE), (SUBMITTED, wb)]
    assert h.held("a") == [wa]


def test_a_full_slot_does_not_block_held_work_of_other_slots() -> None:
    """The oldest held submission waits for its full slot; a younger one elsewhere goes."""
    h = Harness(max_slot_queue=1, max_total_pending=2)
    h.running("a")
    h.running("b")
    h.submit("a")
    qb = h.submit("b")
    wa = h.submit("a", wait=True)  # slot "a" queue is full
    wb = h.submit("b", wait=True)
    h.take()
    h.m.remove(qb.id, 1.0)
    assert h.take() == [(REJECT, qb, REMOVED_FROM_QUEUE), (SUBMITTED, wb)]
    assert h.held("a") == [wa]
    assert h.queue("b") == [wb]


def test_an_idle_slot_starts_its_oldest_held_submission_at_once() -> None:
    """An owner needs no queue room: the oldest held submission starts when the slot idles."""
    h = Harness(max_slot_queue=0)
    a = h.running("k")
    w1 = h.submit("k", wait=True)
    w2 = h.submit("k", wait=True)
    h.take()
    h.m.exited(a, 1.0)
    assert h.take() == [(SUBMITTED, w1), (ADMIT, w1, None)]
    assert h.held("k") == [w2]
    assert h.m.waiting == 1


def test_max_waiters_counts_held_work_and_joiners() -> None:
    """A hold or a JOIN past ``max_waiters`` is rejected RESOURCE_LIMIT."""
    h = Harness(max_slot_queue=0, max_waiters=2)
    h.running("k")
    h.submit("k", wait=True)
    h.submit("k", JOINS)
    h.take()
    assert h.m.waiting == 2
    w = h.submit("k", wait=True)
    j = h.submit("k", JOINS)
    assert h.take() == [(REJECT, w, RESOURCE_LIMIT), (REJECT, j, RESOURCE_LIMIT)]


def test_max_waiters_zero_turns_wait_into_reject() -> None:
    """With ``max_waiters=0`` a wait-mode submission that would be held is rejected."""
    h = Harness(max_slot_queue=0, max_waiters=0)
    h.running("k")
    w = h.submit("k", wait=True)
    assert h.take() == [(REJECT, w, RESOURCE_LIMIT)]


# -- remove -----------------------------------------------------------------------------------


def test_remove_queued_work_rejects_it_and_frees_its_budget() -> None:
    """Removed queued work is REMOVED_FROM_QUEUE and gives its units back."""
    h = Harness()
    a = h.running("k")
    q1 = h.submit("k")
    q2 = h.submit("k")
    h.take()
    assert h.m.remove(q1.id, 1.0) is q1
    assert h.take() == [(REJECT, q1, REMOVED_FROM_QUEUE)]
    assert (h.queue("k"), h.m.pending, h.m.slots["k"].owner) == ([q2], 1, a)
    assert h.status("k") is RUNNING


def test_remove_held_work_rejects_it() -> None:
    """Held work removed by id is REMOVED_FROM_QUEUE and frees its waiter unit."""
    h = Harness(max_slot_queue=0)
    h.running("k")
    w1 = h.submit("k", wait=True)
    w2 = h.submit("k", wait=True)
    h.take()
    assert h.m.remove(w1.id, 1.0) is w1
    assert h.take() == [(REJECT, w1, REMOVED_FROM_QUEUE)]
    assert h.held("k") == [w2]
    assert h.m.waiting == 1


def test_remove_a_joiner_detaches_it_and_keeps_its_work() -> None:
    """Removing a joiner detaches it; the followed work is untouched."""
    h = Harness()
    a = h.running("k")
    q = h.submit("k")
    j = h.submit("k", JOINS)
    h.take()
    assert h.m.remove(j.id, 1.0) is j
    assert h.take() == [(DETACH, j, REMOVED_FROM_QUEUE)]
    assert (h.m.joiners, q.followers) == ({}, [])
    assert h.m.slots["k"].owner is a
    assert h.queue("k") == [q]


@pytest.mark.parametrize("which", ["owner", "unknown", "rejected"])
def test_remove_of_work_the_machine_does_not_hold_returns_none(which: str) -> None:
    """Owners (stopped by the registry), unknown and finished ids are not the machine's."""
    h = Harness(max_slot_queue=0)
    a = h.running("k")
    r = h.submit("k")
    h.take()
    target = {"owner": a.id, "unknown": 999, "rejected": r.id}[which]
    assert h.m.remove(target, 1.0) is None
    assert h.take() == []
    assert h.m.slots["k"].owner is a


# -- section 11: placement, queue deadlines, cancel_slot, what work waits for ------------------


def test_submitted_effects_carry_the_placement() -> None:
    """OWNER on an idle slot, QUEUED in a queue, JOINED for a joiner, none while held."""
    h = Harness(max_slot_queue=1)
    owner = h.submit("k")
    queued = h.submit("k")
    held = h.submit("k", wait=True)
    joiner = h.submit("k", JOINS)
    placements = {
        effect.entry.id: effect.placement for effect in h.m.effects if type(effect) is Submitted
    }
    assert placements == {
        owner.id: Placement.OWNER,
        queued.id: Placement.QUEUED,
        held.id: None,
        joiner.id: Placement.JOINED,
    }


def test_removals_are_announced_before_their_rejection() -> None:
    """remove() and withdraw_slot() emit RemoveRequested right before each rejection."""
    h = Harness(max_slot_queue=1)
    h.running("k")
    queued = h.submit("k")
    held = h.submit("k", wait=True)
    h.m.effects.clear()
    h.m.remove(queued.id, 1.0)
    kinds = [type(effect).__name__ for effect in h.m.effects]
    assert kinds[:2] == ["RemoveRequested", "Reject"]
    h.m.effects.clear()
    h.m.withdraw_slot("k", 2.0)
    assert [type(effect).__name__ for effect in h.m.effects] == ["RemoveRequested", "Reject"]
    assert h.m.effects[0].entry is held


def test_queued_work_expires_at_its_deadline_and_frees_its_units() -> None:
    """expire(now) withdraws queued work whose deadline is <= now, QUEUE_TIMEOUT."""
    h = Harness()
    h.running("k")
    late = h.timed(Entry(100, "k", QUEUE), 5.0, now=1.0)
    h.take()
    assert h.m.next_deadline == 5.0
    h.m.expire(4.999)
    assert h.take() == []
    h.m.expire(5.0)
    assert h.take() == [(REJECT, late, QUEUE_TIMEOUT)]
    assert (h.m.pending, h.m.next_deadline) == (0, math.inf)


def test_a_due_deadline_goes_before_the_owner_exit_that_would_start_it() -> None:
    """Every transition first withdraws what is due: the head never starts at its deadline."""
    h = Harness()
    owner = h.running("k")
    nxt = h.submit("k")
    head = h.timed(Entry(100, "k", QUEUE), 3.0, now=1.0)  # behind nxt
    h.take()
    h.m.exited(owner, 3.0)
    effects = h.take()
    assert effects[0] == (REJECT, head, QUEUE_TIMEOUT)
    assert h.m.slots["k"].owner is nxt


def test_a_deadline_already_due_at_intake_rejects_at_once() -> None:
    """A deadline <= now at intake: never queued, so no ``Submitted`` (placement
    REJECTED); the REPLACE still stops the owner."""
    h = Harness()
    owner = h.running("k")
    entry = h.timed(Entry(100, "k", REPLACE), 1.0, now=1.0)
    assert h.take() == [
        (TRANSITION, owner, "running->terminating"),
        (STOP, owner, None),
        (REJECT, entry, QUEUE_TIMEOUT),
    ]
    assert h.status("k") is TERMINATING


def test_held_work_expires_as_held_and_due_work_gets_no_room() -> None:
    """All due work is withdrawn before room is offered: due held work is not placed."""
    h = Harness(max_slot_queue=1)
    h.running("k")
    queued = h.timed(Entry(100, "k", QUEUE), 4.0, now=1.0)
    held = h.timed(Entry(101, "k", QUEUE, wait=True), 4.0, now=1.0)
    h.take()
    h.m.expire(4.0)
    assert h.take() == [(REJECT, queued, QUEUE_TIMEOUT), (REJECT, held, QUEUE_TIMEOUT)]


def test_withdraw_slot_returns_the_count_and_the_owner() -> None:
    """withdraw_slot takes the queue (head first) and the held work; the owner stays."""
    h = Harness(max_slot_queue=1)
    owner = h.running("k")
    queued = h.submit("k")
    held = h.submit("k", wait=True)
    h.take()
    assert h.m.withdraw_slot("k", 1.0) == (2, owner)
    assert h.take() == [(REJECT, queued, REMOVED_FROM_QUEUE), (REJECT, held, REMOVED_FROM_QUEUE)]
    assert (h.queue("k"), h.held("k"), h.m.pending, h.m.waiting) == ([], [], 0, 0)
    assert h.m.withdraw_slot("idle", 1.0) == (0, None)


def test_waits_for_names_the_owner_or_the_followed_work() -> None:
    """Queued and held work waits for its owner, a joiner for its target, an owner for nothing."""
    h = Harness(max_slot_queue=1)
    owner = h.running("k")
    queued = h.submit("k")
    held = h.submit("k", wait=True)
    joiner = h.submit("k", JOINS)
    assert h.m.waits_for(queued) == (owner, "queued")
    assert h.m.waits_for(held) == (owner, "held")
    assert h.m.waits_for(joiner) == (queued, "joined")
    assert h.m.waits_for(owner) is None


# -- close ------------------------------------------------------------------------------------


def test_close_rejects_queued_and_held_work_shutting_down() -> None:
    """Shutdown rejects queued and held work; owners stay until they exit."""
    h = Harness(max_slot_queue=1)
    a = h.running("k")
    q = h.submit("k")
    w = h.submit("k", wait=True)
    j = h.submit("k", JOINS)  # follows q, so it is released with it
    h.take()
    h.m.close()
    assert h.take() == [(REJECT, q, SHUTTING_DOWN), (REJECT, w, SHUTTING_DOWN)]
    assert j.id not in h.m.joiners
    assert (h.m.pending, h.m.queued, h.m.held) == (0, {}, {})
    assert h.m.slots["k"].owner is a


def test_nothing_advances_after_close() -> None:
    """After shutdown an exit or a registry rejection admits nothing, and the slot vanishes."""
    h = Harness()
    a = h.running("a")
    b = h.submit("b")
    h.submit("a")
    h.take()
    h.m.close()
    h.take()
    h.m.exited(a, 1.0)
    h.m.admitted(b, False, 1.0)
    assert h.take() == []
    assert h.m.slots == {}


def test_submit_after_close_is_rejected_shutting_down() -> None:
    """Every policy is rejected SHUTTING_DOWN after shutdown, on a busy or idle slot."""
    h = Harness()
    h.running("a")
    h.m.close()
    entries = [h.submit(k, p) for k in ("a", "b") for p in AdmissionPolicy]
    assert h.take() == [(REJECT, e, SHUTTING_DOWN) for e in entries]
    assert list(h.m.slots) == ["a"]


def test_an_accepted_replacement_target_is_still_stopped_after_close() -> None:
    """A stop owed to an ADMITTING->TERMINATING owner is still carried out after close."""
    h = Harness()
    a = h.submit("k")
    r = h.submit("k", REPLACE)
    h.take()
    h.m.close()
    assert h.take() == [(REJECT, r, SHUTTING_DOWN)]
    h.m.admitted(a, True, 1.0)
    assert h.take() == [(STOP, a, None)]


# -- stale replies --------------------------------------------------------------------------


def test_stale_admission_and_exit_calls_are_ignored() -> None:
    """Decisions and exits for entries that are not the slot's owner change nothing."""
    h = Harness()
    a = h.running("k")
    q = h.submit("k")
    h.take()
    for call in (
        lambda: h.m.admitted(q, True, 1.0),
        lambda: h.m.admitted(q, False, 1.0),
        lambda: h.m.exited(q, 1.0),
    ):
        call()
        assert h.take() == []
        assert (h.m.slots["k"].owner, h.queue("k"), h.status("k")) == (a, [q], RUNNING)
    h.m.exited(a, 2.0)
    h.take()
    h.m.exited(a, 3.0)  # a second exit of a previous owner
    h.m.admitted(a, False, 3.0)
    assert h.take() == []
    assert (h.m.slots["k"].owner, h.status("k")) == (q, ADMITTING)


def test_stale_calls_for_a_vanished_slot_are_ignored() -> None:
    """Calls about a slot that no longer exists neither fail nor recreate it."""
    h = Harness()
    a = h.running("k")
    h.m.exited(a, 1.0)
    h.m.exited(a, 2.0)
    h.m.admitted(a, True, 2.0)
    assert h.take() == []
    assert h.m.slots == {}


# -- stateful property test ---------------------------------------------------------------------

KEYS = ("a", "b", "c")


def _budget(limit: int | None, used: int) -> bool:
    """Whether an optional budget has room."""
    return limit is None or used < limit


class SlotMachineModel(RuleBasedStateMachine):
    """Random traffic against a ``SlotMachine``, with its effects checked step by step.

    The model keeps each entry's effect log and the registry's side (which owners await
    a decision, which are accepted) and predicts every submission's placement from the
    state before the step; invariants are checked against the machine's own structures.
    """

    def __init__(self) -> None:
        super().__init__()
        self.m: SlotMachine | None = None
        self.keys: tuple[str, ...] = ()
        self.entries: dict[int, Entry] = {}
        self.log: dict[int, list[str]] = {}  # effect tags per entry, in order
        self.awaiting: set[int] = set()  # owners whose registry decision is outstanding
        self.accepted: set[int] = set()  # owners the registry accepted
        self.answered: set[int] = set()  # accepted owners forced: an outcome, still running
        self.ids = itertools.count(1)
        self.now = 0.0
        self.healthy = False  # the last step passed its checks (teardown drains only then)
        self.fresh: int | None = None  # the id submitted by the coming step
        self.closed = False  # the model's own record of the shutdown
        self.leaving: int | None = None  # the owner the coming step ends

    # -- setup --------------------------------------------------------------------------------

    @initialize(
        max_slot_queue=st.integers(0, 3),
        max_total_pending=st.sampled_from([1, 2, 3, 4, 0, None]),
        max_slots=st.sampled_from([2, 3, 1, None]),
        max_waiters=st.sampled_from([2, 3, 4, 1, 0, None]),
        n_keys=st.integers(2, 3),
    )
    def setup(
        self,
        max_slot_queue: int,
        max_total_pending: int | None,
        max_slots: int | None,
        max_waiters: int | None,
        n_keys: int,
    ) -> None:
        self.m = SlotMachine(
            max_slot_queue=max_slot_queue,
            max_total_pending=max_total_pending,
            max_slots=max_slots,
            max_waiters=max_waiters,
        )
        self.keys = KEYS[:n_keys]
        self.healthy = True

    @property
    def machine(self) -> SlotMachine:
        assert self.m is not None
        return self.m

    # -- helpers ------------------------------------------------------------------------------

    def where(self, entry: Entry) -> str:
        m = self.machine
        slot = m.slots.get(entry.key)
        if slot is not None and slot.owner is entry:
            return "owner"
        if entry.id in m.queued:
            return "queued"
        if entry.id in m.held:
            return "held"
        if entry.id in m.joiners:
            return "joiner"
        return "gone"

    def snapshot(self) -> dict[str, Any]:
        m = self.machine
        return {
            "where": {i: self.where(e) for i, e in self.entries.items()},
            "slots": {
                k: (s.owner, s.status, list(s.queue), list(s.held), s.since)
                for k, s in m.slots.items()
            },
            "pending": m.pending,
            "waiting": m.waiting,
            "closed": self.closed,
            "targets": {i: e.target for i, e in m.joiners.items()},
        }

    def step(self, action: Any) -> list[tuple[str, Entry, Any]]:
        """Run ``action`` on the machine; check each entry's move against its effects."""
        self.healthy = False
        m = self.machine
        pre = self.snapshot()
        if self.fresh is not None:
            pre["where"][self.fresh] = "new"
            self.fresh = None
        action()
        effects, m.effects = triples(m.effects), []
        post = self.snapshot()
        per_entry: dict[int, list[str]] = {}
        rejected = {e.id: arg for tag, e, arg in effects if tag == REJECT}
        for tag, entry, arg in effects:
            assert self.entries.get(entry.id) is entry, f"effect for an unknown entry {entry}"
            assert tag in (ADMIT, STOP, REJECT, JOIN, DETACH, SUBMITTED, TRANSITION)
            self.log[entry.id].append(tag)
            per_entry.setdefault(entry.id, []).append(tag)
            if tag == ADMIT:
                assert not pre["closed"], f"{entry} admitted after close"
                self.awaiting.add(entry.id)
            elif tag == REJECT:
                assert arg in (
                    SLOT_BUSY,
                    QUEUE_FULL,
                    SUPERSEDED,
                    REMOVED_FROM_QUEUE,
                    SHUTTING_DOWN,
                    RESOURCE_LIMIT,
                    QUEUE_TIMEOUT,
                )
            elif tag == DETACH:
                assert arg == REMOVED_FROM_QUEUE
            elif tag == JOIN:
                assert isinstance(arg, Entry)
            elif tag == STOP:
                assert post["where"][entry.id] == "owner", f"STOP for non-owner {entry}"
                assert entry.id in self.accepted, f"STOP for {entry} before acceptance"
                assert self.log[entry.id].count(STOP) == 1, f"second STOP for {entry}"
            elif tag == TRANSITION:
                assert post["where"][entry.id] == "owner"
                assert arg in (
                    "admitting->running",
                    "running->terminating",
                    "admitting->terminating",
                )
        for i, entry in self.entries.items():
            before = pre["where"].get(i, "new")
            after = post["where"][i]
            tags = per_entry.get(i, [])
            self.check_move(entry, before, after, tags, rejected, pre, post)
        self.leaving = None
        # A slot's status or owner changes only with a fresh ``since``.
        for key, (owner, status, *_rest, since) in post["slots"].items():
            if key in pre["slots"] and pre["slots"][key][:2] == (owner, status):
                assert since == pre["slots"][key][4]
            else:
                assert since == self.now
        self.check_fairness(pre, post, effects)
        return effects

    def check_move(
        self,
        entry: Entry,
        before: str,
        after: str,
        tags: list[str],
        rejected: dict[int, str],
        pre: dict[str, Any],
        post: dict[str, Any],
    ) -> None:
        # A fresh owner can be marked TERMINATING in the same step, by held REPLACE work
        # placed right after it started.
        start = [[SUBMITTED, ADMIT], [SUBMITTED, ADMIT, TRANSITION]]
        allowed: dict[tuple[str, str], list[list[str]]] = {
            ("new", "owner"): start,
            ("new", "queued"): [[SUBMITTED]],
            ("new", "held"): [[SUBMITTED]],
            ("new", "joiner"): [[SUBMITTED, JOIN]],
            # A JOIN of an owner that has its outcome (forced): it has it too, at once.
            ("new", "gone"): [[REJECT], [SUBMITTED, JOIN]],
            ("queued", "queued"): [[]],
            ("queued", "owner"): start,
            ("queued", "gone"): [[REJECT]],
            ("held", "held"): [[]],
            ("held", "queued"): [[SUBMITTED]],
            ("held", "owner"): start,
            # Placed, then superseded by a held REPLACE of its slot placed right after it.
            ("held", "gone"): [[REJECT], [SUBMITTED, REJECT]],
            ("joiner", "joiner"): [[]],
            ("joiner", "gone"): [[], [DETACH]],
            ("gone", "gone"): [[]],
        }
        if before == "owner":
            assert after in ("owner", "gone"), f"{entry}: owner -> {after}"
            assert after == "owner" or entry.id == self.leaving, f"{entry} left unasked"
            assert set(tags) <= {TRANSITION, STOP}, f"{entry}: owner got {tags}"
            return
        assert (before, after) in allowed, f"{entry}: {before} -> {after} with {tags}"
        assert tags in allowed[before, after], f"{entry}: {before} -> {after} with {tags}"
        if tags == [SUBMITTED, REJECT]:
            assert rejected[entry.id] == SUPERSEDED
        if (before, after) == ("joiner", "gone") and not tags:
            target = pre["targets"][entry.id]
            assert post["where"][target.id] == "gone" or target.id in self.answered, (
                f"{entry} released while {target} lives without an outcome"
            )

    def check_fairness(
        self, pre: dict[str, Any], post: dict[str, Any], effects: list[tuple[str, Entry, Any]]
    ) -> None:
        """Freed pending units go to held heads oldest first: no younger held work took one
        while an older held head, whose slot has room, still waits."""
        m = self.machine
        superseded_keys = {e.key for tag, e, arg in effects if tag == REJECT and arg == SUPERSEDED}
        took_unit = [
            i
            for i, before in pre["where"].items()
            if before == "held"
            and post["where"][i] == "queued"
            and not (self.entries[i].policy is REPLACE and self.entries[i].key in superseded_keys)
        ]
        for slot in m.slots.values():
            if not slot.held:
                continue
            head = slot.held[0]
            local_room = (
                not slot.queue if head.policy is REPLACE else len(slot.queue) < m.max_slot_queue
            )
            if local_room:
                younger = [i for i in took_unit if i > head.id]
                assert not younger, f"held {younger} placed before older held {head}"

    def tick(self) -> None:
        """Time passes (one unit per rule): work whose queue deadline came is withdrawn
        first, in a step of its own, so each rule's predictions see the state after it."""
        m = self.machine
        self.now += 1.0
        due = [
            e
            for e in self.entries.values()
            if self.where(e) in ("queued", "held") and e.deadline <= self.now
        ]
        if not due:
            return
        effects = self.step(lambda: m.expire(self.now))
        rejected = [(e, arg) for tag, e, arg in effects if tag == REJECT and arg == QUEUE_TIMEOUT]
        assert sorted(e.id for e, _ in rejected) == sorted(e.id for e in due)
        assert all(self.where(e) == "gone" for e in due)

    def new_entry(
        self, key: str, policy: AdmissionPolicy, wait: bool, timeout: float | None = None
    ) -> Entry:
        entry = Entry(next(self.ids), key, policy, wait=wait)
        if timeout is not None:
            entry.deadline = self.now + timeout  # never due at intake: timeout >= 1
        self.entries[entry.id] = entry
        self.log[entry.id] = []
        self.fresh = entry.id
        return entry

    def pick(self, ids: list[int], index: int) -> Entry:
        return self.entries[sorted(ids)[index % len(ids)]]

    # -- rules --------------------------------------------------------------------------------

    @rule(
        key_index=st.integers(0, 2),
        policy=st.sampled_from(AdmissionPolicy),
        wait=st.booleans(),
        timeout=st.sampled_from([None, None, 1.0, 2.0, 5.0]),
    )
    def submit(
        self, key_index: int, policy: AdmissionPolicy, wait: bool, timeout: float | None = None
    ) -> None:
        self.tick()
        m = self.machine
        key = self.keys[key_index % len(self.keys)]
        wait = wait and policy in (QUEUE, REPLACE)
        timeout = timeout if policy in (QUEUE, REPLACE) else None
        entry = self.new_entry(key, policy, wait, timeout)
        before = m.slots.get(key)
        owner = None if before is None else before.owner
        status = None if before is None else before.status
        queue = [] if before is None else list(before.queue)
        held = [] if before is None else list(before.held)
        n_slots, pending, waiting = len(m.slots), m.pending, m.waiting
        expected, kind = self.expect_submit(entry, owner, queue, held, n_slots, pending, waiting)

        def submit() -> None:
            m.submit(entry, self.now)
            if entry.deadline != math.inf:
                m.track_deadline(entry, self.now)

        effects = self.step(submit)
        got = self.where(entry)
        if expected == "rejected":
            assert got == "gone"
            assert effects == [(REJECT, entry, kind)]
            return
        if expected == "answered":
            assert got == "gone"
            assert effects == [(SUBMITTED, entry, f"joined #{owner.id}"), (JOIN, entry, owner)]
            return
        assert got == expected, f"{entry} expected {expected}, got {got} ({effects})"
        if expected == "joiner":
            assert entry.target is (queue[-1] if queue else owner)
        if expected == "queued" and policy is REPLACE:
            if queue:
                assert (REJECT, queue[0], SUPERSEDED) in effects
                assert m.slots[key].queue[0] is entry
            assert owner is not None
            stops = [e for tag, e, _ in effects if tag == STOP]
            assert stops == ([owner] if status is RUNNING else [])
            assert m.slots[key].status is TERMINATING

    @rule(
        key_index=st.integers(0, 2),
        replace=st.booleans(),
        timeout=st.sampled_from([None, 2.0, 3.0]),
    )
    def submit_wait(self, key_index: int, replace: bool, timeout: float | None) -> None:
        """A wait-mode QUEUE or REPLACE (a second submit rule, so holds are common)."""
        self.submit(key_index, REPLACE if replace else QUEUE, True, timeout)

    @rule(replace=st.booleans())
    def submit_wait_everywhere(self, replace: bool) -> None:
        """A wait-mode submission to every key in turn: held work in several slots."""
        for key_index in range(len(self.keys)):
            self.submit(key_index, REPLACE if replace else QUEUE, True)

    def expect_submit(
        self,
        entry: Entry,
        owner: Entry | None,
        queue: list[Entry],
        held: list[Entry],
        n_slots: int,
        pending: int,
        waiting: int,
    ) -> tuple[str, str | None]:
        """The placement the documented rules and the module docstring's decisions predict."""
        m = self.machine
        if self.closed:
            return "rejected", SHUTTING_DOWN
        if owner is None:
            if not _budget(m.max_slots, n_slots):
                return "rejected", RESOURCE_LIMIT
            return "owner", None
        waiters_room = _budget(m.max_waiters, waiting)
        if entry.policy is DROP:
            return "rejected", SLOT_BUSY
        if entry.policy is JOINS:
            if not waiters_room:
                return "rejected", RESOURCE_LIMIT
            answered = not queue and owner.id in self.answered
            return ("answered", None) if answered else ("joiner", None)
        if entry.policy is REPLACE and queue:
            return "queued", None  # replaces the head: needs no budget
        missing: str | None = None
        if entry.wait and held:
            missing = "behind held work"
        elif entry.policy is QUEUE and len(queue) >= m.max_slot_queue:
            missing = QUEUE_FULL
        elif not _budget(m.max_total_pending, pending):
            missing = RESOURCE_LIMIT
        if missing is None:
            return "queued", None
        if not entry.wait:
            return "rejected", missing
        return ("held", None) if waiters_room else ("rejected", RESOURCE_LIMIT)

    @rule(index=st.integers(0, 7), accept=st.booleans())
    def registry(self, index: int, accept: bool) -> None:
        """The registry decides on an owner awaiting admission, or an accepted owner exits."""
        owners = sorted(self.awaiting | self.accepted)
        if not owners:
            return
        entry = self.entries[owners[index % len(owners)]]
        if entry.id in self.awaiting:
            self.decide(entry, accept)
        else:
            self.exit(entry)

    def decide(self, entry: Entry, accept: bool) -> None:
        """The registry accepts or rejects ``entry``, which awaits its decision."""
        self.tick()
        m = self.machine
        slot = m.slots[entry.key]
        status, queue, held = slot.status, list(slot.queue), list(slot.held)
        self.awaiting.discard(entry.id)
        if accept:
            self.accepted.add(entry.id)
        else:
            self.leaving = entry.id
        effects = self.step(lambda: m.admitted(entry, accept, self.now))
        if accept:
            assert self.where(entry) == "owner"
            expected = (
                [(TRANSITION, entry, "admitting->running")]
                if status is ADMITTING
                else [(STOP, entry, None)]
            )
            assert effects == expected
            assert m.slots[entry.key].status is (RUNNING if status is ADMITTING else TERMINATING)
        else:
            self.check_next_owner(entry, queue, held)

    def exit(self, entry: Entry) -> None:
        """``entry``, an accepted owner, physically exits and its outcome is committed."""
        self.tick()
        m = self.machine
        slot = m.slots[entry.key]
        queue, held = list(slot.queue), list(slot.held)
        self.accepted.discard(entry.id)
        self.answered.discard(entry.id)
        self.leaving = entry.id
        self.step(lambda: m.exited(entry, self.now))
        self.check_next_owner(entry, queue, held)

    def check_next_owner(self, entry: Entry, queue: list[Entry], held: list[Entry]) -> None:
        """After an owner left: queue head, else oldest held, else the slot is gone."""
        m = self.machine
        assert self.where(entry) == "gone"
        slot = m.slots.get(entry.key)
        nxt = None if self.closed else queue[0] if queue else held[0] if held else None
        if nxt is None:
            assert slot is None, f"slot {entry.key!r} should be gone"
        else:
            assert slot is not None
            assert slot.owner is nxt
            assert ADMIT in self.log[nxt.id]
            # TERMINATING when held REPLACE work was placed right behind the new owner.
            assert slot.status is (
                TERMINATING if slot.queue and slot.queue[0].policy is REPLACE else ADMITTING
            )

    @rule(index=st.integers(0, 7))
    def force(self, index: int) -> None:
        """An accepted owner is forced: it has its outcome and runs on until it exits.
        Its joiners leave with it (they have that outcome) and no JOIN follows it."""
        owners = sorted(self.accepted - self.answered)
        if not owners:
            return
        entry = self.entries[owners[index % len(owners)]]
        self.tick()
        if entry.id not in self.accepted:
            return  # the tick's expiries do not end owners, but stay exact
        joiners = [j for j in self.machine.joiners.values() if j.target is entry]
        self.answered.add(entry.id)
        assert self.step(lambda: self.machine.answered(entry)) == []
        assert all(self.where(j) == "gone" for j in joiners)
        assert self.where(entry) == "owner"

    @rule(index=st.integers(0, 31), live=st.booleans())
    def remove(self, index: int, live: bool) -> None:
        """Remove a known id (a queued, held or joined one when ``live``): queued, held and
        joined work goes; anything else is not found."""
        self.tick()
        m = self.machine
        ids = [
            i
            for i, e in self.entries.items()
            if not live or self.where(e) in ("queued", "held", "joiner")
        ]
        if not ids:
            return
        entry = self.pick(ids, index)
        before = self.where(entry)
        target = entry.target if before == "joiner" else None
        result: list[Entry | None] = []
        effects = self.step(lambda: result.append(m.remove(entry.id, self.now)))
        if before in ("queued", "held"):
            assert result == [entry]
            assert effects[0] == (REJECT, entry, REMOVED_FROM_QUEUE)
        elif before == "joiner":
            assert result == [entry]
            assert effects == [(DETACH, entry, REMOVED_FROM_QUEUE)]
            assert target is not None
            assert target.followers is not None
            assert entry not in target.followers
        else:
            assert result == [None]
            assert effects == []

    @rule(index=st.integers(0, 31), call=st.sampled_from(["accept", "reject", "exit"]))
    def stale(self, index: int, call: str) -> None:
        """A decision or exit for an entry that is not a slot's owner changes nothing."""
        self.tick()
        m = self.machine
        candidates = [i for i, e in self.entries.items() if self.where(e) != "owner"]
        if not candidates:
            return
        entry = self.pick(candidates, index)
        pre = self.snapshot()
        if call == "exit":
            effects = self.step(lambda: m.exited(entry, self.now))
        else:
            effects = self.step(lambda: m.admitted(entry, call == "accept", self.now))
        assert effects == []
        post = self.snapshot()
        assert (pre["where"], pre["slots"], pre["pending"]) == (
            post["where"],
            post["slots"],
            post["pending"],
        )

    @rule(key_index=st.integers(0, 2))
    def cancel_slot(self, key_index: int) -> None:
        """cancel_slot: the slot's queue and held work are withdrawn, in line order, as
        removals; none of its held work is placed on the way; the owner is returned."""
        self.tick()
        m = self.machine
        key = self.keys[key_index % len(self.keys)]
        slot = m.slots.get(key)
        line = [] if slot is None else [*slot.queue, *slot.held]
        owner = None if slot is None else slot.owner
        result: list[tuple[int, Entry | None]] = []
        effects = self.step(lambda: result.append(m.withdraw_slot(key, self.now)))
        assert result == [(len(line), owner)]
        mine = [(tag, e, arg) for tag, e, arg in effects if e.key == key]
        assert mine[: len(line)] == [(REJECT, e, REMOVED_FROM_QUEUE) for e in line]
        assert all(self.where(e) == "gone" for e in line)
        after = m.slots.get(key)
        assert after is None or (not after.queue and not after.held)
        assert (after is None) == (owner is None)

    @rule()
    def time_passes(self) -> None:
        """Nothing but time: queue deadlines that come are kept."""
        self.tick()

    @rule(go=st.integers(0, 19))
    def close(self, go: int) -> None:
        """Shut down, on one draw in twenty (so most runs get far before it)."""
        if go == 19:
            self.shut_down()

    def shut_down(self) -> None:
        """Shutdown: queued and held work is rejected SHUTTING_DOWN; owners stay."""
        self.tick()
        m = self.machine
        doomed = [e for e in self.entries.values() if self.where(e) in ("queued", "held")]
        owners = {k: s.owner for k, s in m.slots.items()}
        self.closed = True
        effects = self.step(m.close)
        assert sorted(e.id for _, e, _ in effects) == sorted(e.id for e in doomed)
        assert all(tag == REJECT and arg == SHUTTING_DOWN for tag, _, arg in effects)
        assert {k: s.owner for k, s in m.slots.items()} == owners

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        """Every module invariant, after every step."""
        if self.m is None:
            return
        self.structures_agree()
        self.slots_are_well_formed()
        self.budgets_hold()
        self.held_heads_really_wait()
        self.closed_machine_holds_nothing()
        self.deadlines_are_kept()
        self.every_entry_ends_once()
        self.healthy = True

    def structures_agree(self) -> None:
        m = self.machine
        queued = {e.id: e for s in m.slots.values() for e in s.queue}
        assert m.queued == queued
        assert m.pending == len(queued)
        held_ids = list(m.held)
        for key, slot in m.slots.items():
            assert slot.key == key
            assert [e.id for e in slot.held] == [i for i in held_ids if m.held[i].key == key]
        assert {e.id for s in m.slots.values() for e in s.held} == set(m.held)
        assert all(m.held[i].id == i for i in m.held)
        owners = [s.owner for s in m.slots.values() if s.owner is not None]
        places = [e.id for e in owners] + list(m.queued) + list(m.held) + list(m.joiners)
        assert len(places) == len(set(places)), "an entry is in two places"
        followers = {j.id: j for e in [*owners, *queued.values()] for j in (e.followers or ())}
        assert m.joiners == followers
        for joiner in m.joiners.values():
            assert joiner.target is not None
            assert self.where(joiner.target) in ("owner", "queued")

    def slots_are_well_formed(self) -> None:
        m = self.machine
        owners = {s.owner.id for s in m.slots.values() if s.owner is not None}
        assert owners == self.awaiting | self.accepted, "owners differ from the registry's"
        for key, slot in m.slots.items():
            assert slot.owner is not None, f"slot {key!r} has no owner"
            assert slot.owner.key == key
            assert (slot.status is None) == (slot.owner is None)
            owner = slot.owner.id
            if slot.status is ADMITTING:
                assert owner in self.awaiting
            elif slot.status is RUNNING:
                assert owner in self.accepted
                assert STOP not in self.log[owner]
            else:
                assert self.log[owner].count(STOP) == (1 if owner in self.accepted else 0)
            queue = list(slot.queue)
            assert all(e.key == key for e in queue + list(slot.held))
            assert all(e.policy in (QUEUE, REPLACE) for e in queue + list(slot.held))
            assert all(e.policy is QUEUE for e in queue[1:]), "REPLACE only at the queue head"
            if queue and queue[0].policy is REPLACE:
                assert slot.status is TERMINATING
            tail_ids = (
                [e.id for e in queue[1:]]
                if queue and queue[0].policy is REPLACE
                else [e.id for e in queue]
            )
            assert tail_ids == sorted(tail_ids), f"queue of {key!r} out of FIFO order: {queue}"
            held_ids = [e.id for e in slot.held]
            assert held_ids == sorted(held_ids), f"held of {key!r} out of order"
            assert all(e.wait for e in slot.held)

    def budgets_hold(self) -> None:
        m = self.machine
        for slot in m.slots.values():
            plain = [e for e in slot.queue if e.policy is QUEUE]
            assert len(plain) <= m.max_slot_queue
            assert len(slot.queue) <= max(m.max_slot_queue, 1)
        assert m.max_total_pending is None or m.pending <= m.max_total_pending
        assert m.max_slots is None or len(m.slots) <= m.max_slots
        assert m.max_waiters is None or m.waiting <= m.max_waiters
        assert m.waiting == len(m.held) + len(m.joiners)

    def held_heads_really_wait(self) -> None:
        """No slot's held head could be placed with the budgets as they are."""
        m = self.machine
        pending_room = _budget(m.max_total_pending, m.pending)
        for key, slot in m.slots.items():
            if not slot.held:
                continue
            head = slot.held[0]
            if head.policy is REPLACE:
                placeable = bool(slot.queue) or pending_room
            else:
                placeable = len(slot.queue) < m.max_slot_queue and pending_room
            assert not placeable, f"held head {head} of {key!r} could be placed"

    def closed_machine_holds_nothing(self) -> None:
        m = self.machine
        assert m.closed == self.closed
        if self.closed:
            assert (m.queued, m.held, m.pending) == ({}, {}, 0)

    def deadlines_are_kept(self) -> None:
        m = self.machine
        for entry in [*m.queued.values(), *m.held.values()]:
            assert entry.deadline > self.now, f"{entry} still waits past its deadline"

    def every_entry_ends_once(self) -> None:
        for i, tags in self.log.items():
            assert tags.count(REJECT) <= 1
            assert tags.count(ADMIT) <= 1
            assert tags.count(JOIN) <= 1
            assert tags.count(DETACH) <= (1 if JOIN in tags else 0)
            assert sum(t in tags for t in (REJECT, ADMIT, JOIN)) <= 1, f"#{i}: {tags}"
            ended = REJECT in tags or JOIN in tags or ADMIT in tags
            where = self.where(self.entries[i])
            if where == "gone":
                assert ended, f"#{i} left without an end: {tags}"
            elif where in ("queued", "held"):
                assert not ended, f"#{i} is {where} after {tags}"

    def teardown(self) -> None:
        """Drain: shut down, let every owner be decided and exit; every entry then ended."""
        if self.m is None or not self.healthy:
            return
        m = self.m
        self.shut_down()
        while m.slots:
            for slot in list(m.slots.values()):
                assert slot.owner is not None
                if slot.owner.id in self.awaiting:
                    self.decide(slot.owner, True)
                else:
                    self.exit(slot.owner)
            self.structures_agree()
        assert m.joiners == {}
        assert self.awaiting == self.accepted == set()
        for i, tags in self.log.items():
            ends = tags.count(REJECT) + tags.count(ADMIT) + tags.count(JOIN)
            assert ends == 1, f"#{i} ended {ends} times: {tags}"


SlotMachineModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None
)
test_slot_machine = SlotMachineModel.TestCase
