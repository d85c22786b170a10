"""Section 11 in the cluster slot machine, pure:
queue deadlines of queued, held and asked work, and ``withdraw_slot`` (``cancel_slot``).

No server and no trio: the machine is driven directly, as the controller drives it with
the lease keeper's reports, and its effects (``effects``) and requests to the keeper
(``extra``) are read back.
"""

from __future__ import annotations

import math

from cluster_helpers import machine

from trio_taskvisor._clusterslots import Ask, ClusterSlotMachine, Release, Withdraw
from trio_taskvisor._outcome import Placement, RejectionKind
from trio_taskvisor._slots import Admit, Entry, Join, Reject, RemoveRequested, Submitted
from trio_taskvisor._spec import AdmissionPolicy

QUEUE = AdmissionPolicy.QUEUE
JOIN = AdmissionPolicy.JOIN
TIMEOUT = RejectionKind.QUEUE_TIMEOUT
REMOVED = RejectionKind.REMOVED_FROM_QUEUE


def take_in(
    m: ClusterSlotMachine[None],
    entry_id: int,
    now: float,
    deadline: float = math.inf,
    *,
    key: str = "s",
    wait: bool = False,
    policy: AdmissionPolicy = QUEUE,
) -> Entry[None]:
    """Submit as the controller's ``_take_in`` does (the deadline stamped at intake)."""
    entry = Entry(entry_id, key, policy, wait=wait)
    entry.deadline = deadline
    m.submit(entry, now)
    if deadline != math.inf:
        m.track_deadline(entry, now)
    return entry


def drained(m: ClusterSlotMachine[None]) -> tuple[list[object], list[object]]:
    """The effects and keeper requests so far, cleared."""
    effects, extra = list(m.effects), list(m.extra)
    m.effects.clear()
    m.extra.clear()
    return effects, extra


# -- queue deadlines --------------------------------------------------------------------------


def test_queued_work_leaves_the_cluster_queue_at_its_deadline() -> None:
    """Work in the cluster queue whose deadline comes is rejected QUEUE_TIMEOUT and
    withdrawn from the store (``Withdraw``), at its deadline and not before."""
    m = machine()
    e = take_in(m, 1, 0.0, 5.0)
    m.queued_in_cluster(1, 0.1)
    drained(m)
    assert m.next_deadline == 5.0
    m.expire(4.9)
    assert drained(m) == ([], [])
    m.expire(5.0)
    assert drained(m) == ([Reject(e, TIMEOUT)], [Withdraw(e, TIMEOUT)])
    assert (m.pending, m.slots, m.next_deadline) == (0, {}, math.inf)


def test_held_work_is_rejected_at_its_deadline_without_a_withdrawal() -> None:
    """Held work (the cluster queue was full) is rejected while held: the store holds no
    entry for it, so nothing is withdrawn there."""
    m = machine()
    e = take_in(m, 1, 0.0, 3.0, wait=True)
    m.full(1, 0.1)
    drained(m)
    m.expire(3.0)
    assert drained(m) == ([Reject(e, TIMEOUT)], [])
    assert (m.held, m.slots) == ({}, {})


def test_work_held_for_the_local_budget_is_rejected_at_its_deadline() -> None:
    """Work held for ``max_total_pending`` (never asked) times out as local held work."""
    m = machine(max_total_pending=1)
    take_in(m, 1, 0.0, key="a")  # reserves the only pending unit while the store decides
    e = take_in(m, 2, 0.0, 2.0, key="b", wait=True)
    assert m.held == {2: e}
    drained(m)
    m.expire(2.0)
    assert drained(m) == ([Reject(e, TIMEOUT)], [])
    m.queued_in_cluster(1, 2.5)  # its unit comes back: nothing held is asked
    assert [r for r in m.extra if isinstance(r, Ask)] == []


def test_held_work_asked_again_is_withdrawn_from_the_store_at_its_deadline() -> None:
    """Held work being asked again still counts as held: at its deadline its request is
    withdrawn and it is rejected; the store's late answers find nothing."""
    m = machine()
    e = take_in(m, 1, 0.0, 4.0, wait=True)
    m.full(1, 0.1)
    drained(m)
    m.room("s", 3.0)
    assert drained(m)[1] == [Ask(e)]
    m.expire(4.0)
    assert drained(m) == ([Reject(e, TIMEOUT)], [Withdraw(e, TIMEOUT)])
    assert m.full(1, 4.1) is None
    assert m.granted(1, 4.1) is None
    assert (m.asking, m.waiting, m.slots) == ({}, 0, {})


def test_work_asked_for_the_first_time_is_decided_by_its_answer() -> None:
    """While the store decides, the deadline passes without effect (and without a wake-up
    loop: ``next_deadline`` moves on); queued after it, the work is withdrawn at once,
    placed REJECTED with no ``Submitted``, as for a deadline that came at intake."""
    m = machine()
    e = take_in(m, 1, 0.0, 1.0)
    drained(m)
    assert m.next_deadline == 1.0
    m.expire(2.0)
    assert drained(m) == ([], [])
    assert m.next_deadline == math.inf
    m.queued_in_cluster(1, 2.0)
    effects, extra = drained(m)
    assert effects == [Reject(e, TIMEOUT)]
    assert extra == [Withdraw(e, TIMEOUT)]
    assert (m.pending, m.slots) == (0, {})


def test_work_granted_after_its_deadline_on_an_idle_slot_is_the_owner() -> None:
    """``queue_timeout=0`` on a slot that is idle cluster-wide: the grant makes it the
    owner (work starting on an idle slot is unaffected)."""
    m = machine()
    e = take_in(m, 1, 0.0, 0.0)
    drained(m)
    assert m.granted(1, 0.01) is e
    effects, _ = drained(m)
    assert effects == [Submitted(e, "admitting: lease acquired", Placement.OWNER), Admit(e)]


def test_wait_work_held_after_its_deadline_is_rejected_at_once() -> None:
    """First asked wait=True work the store cannot take after its deadline: never held,
    rejected at once (placement REJECTED, no ``Submitted``)."""
    m = machine()
    e = take_in(m, 1, 0.0, 0.5, wait=True)
    drained(m)
    m.full(1, 0.6)
    effects, extra = drained(m)
    assert effects == [Reject(e, TIMEOUT)]
    assert (extra, m.held, m.slots) == ([], {}, {})


def test_a_grant_at_the_deadline_of_queued_work_finds_it_gone() -> None:
    """The deadline of queued work and its grant at the same instant: the deadline wins,
    ``granted`` returns ``None`` (the driver gives the lease back)."""
    m = machine()
    e = take_in(m, 1, 0.0, 2.0)
    m.queued_in_cluster(1, 0.1)
    drained(m)
    assert m.granted(1, 2.0) is None
    assert drained(m) == ([Reject(e, TIMEOUT)], [Withdraw(e, TIMEOUT)])
    assert m.owners == {}


def test_local_joiners_of_timed_out_work_leave_with_it() -> None:
    """A JOIN following queued local work is released when that work times out (its
    ``Join`` resolves it to the same outcome)."""
    m = machine()
    take_in(m, 1, 0.0, 2.0)
    m.queued_in_cluster(1, 0.1)
    take_in(m, 2, 0.2, policy=JOIN)
    m.joined(2, 1, "me/1", "me#1", 0.3)
    assert set(m.joiners) == {2}
    m.expire(2.0)
    assert m.joiners == {}


def test_joiners_of_an_answered_owner_leave_and_later_ones_are_not_kept() -> None:
    """A local owner forced (``answered``: it has its outcome, runs on): its joiners
    leave the budget, and a JOIN of it later is answered by its ``Join`` at once."""
    m = machine()
    owner = take_in(m, 1, 0.0)
    m.granted(1, 0.1)
    m.admitted(owner, True, 0.1)
    take_in(m, 2, 0.2, policy=JOIN)
    m.joined(2, 1, "me/1", "me#1", 0.3)
    assert (set(m.joiners), m.waiting) == ({2}, 1)
    m.answered(owner)
    assert (m.joiners, m.waiting) == ({}, 0)
    drained(m)
    late = take_in(m, 3, 0.4, policy=JOIN)
    m.joined(3, 1, "me/1", "me#1", 0.5)
    effects, _ = drained(m)
    assert effects[-2:] == [Submitted(late, "joined #1", Placement.JOINED), Join(late, owner)]
    assert (m.joiners, m.waiting, m.remove(3, 0.6)) == ({}, 0, None)


# -- withdraw_slot (cancel_slot) -----------------------------------------------------------------


def test_withdraw_slot_takes_this_process_line_out_in_order() -> None:
    """Queued work, then work the store decides on, then held work: each removed and
    rejected REMOVED_FROM_QUEUE; queued and asked work is withdrawn from the store."""
    m = machine()
    queued = take_in(m, 1, 0.0)
    m.queued_in_cluster(1, 0.0)
    held = take_in(m, 2, 0.0, wait=True)
    m.full(2, 0.0)
    behind = take_in(m, 3, 0.0, wait=True)  # held behind 2, never asked
    asked = take_in(m, 4, 0.0)
    drained(m)
    assert m.withdraw_slot("s", 1.0) == (4, None)
    effects, extra = drained(m)
    line = [queued, asked, held, behind]
    assert effects == [x for e in line for x in (RemoveRequested(e), Reject(e, REMOVED))]
    assert extra == [Withdraw(queued, REMOVED), Withdraw(asked, REMOVED)]
    assert (m.slots, m.pending, m.waiting, m.asking) == ({}, 0, 0, {})
    assert m.withdraw_slot("s", 1.0) == (0, None)


def test_withdraw_slot_returns_the_local_owner() -> None:
    """With a local owner, its queued work is withdrawn and the owner returned to stop."""
    m = machine()
    owner = take_in(m, 1, 0.0)
    m.granted(1, 0.0)
    take_in(m, 2, 0.0)
    m.queued_in_cluster(2, 0.0)
    drained(m)
    assert m.withdraw_slot("s", 1.0) == (1, owner)
    assert m.slots["s"].owner is owner


def test_withdraw_slot_gives_back_a_granted_next_owner() -> None:
    """The next owner granted while a lost-lease owner still runs is withdrawn too, and
    its lease given back (``Release`` after its rejection)."""
    m = machine()
    owner = take_in(m, 1, 0.0)
    m.granted(1, 0.0)
    m.admitted(owner, True, 0.0)
    m.lease_lost(1, "lease expired")
    nxt = take_in(m, 2, 0.0)
    m.granted(2, 0.5)
    assert m.slots["s"].granted is nxt
    drained(m)
    assert m.withdraw_slot("s", 1.0) == (1, owner)
    effects, extra = drained(m)
    assert effects == [RemoveRequested(nxt), Reject(nxt, REMOVED)]
    assert extra == [Release(nxt)]
    assert 2 not in m.owners


def test_withdraw_slot_offers_the_room_to_other_slots_only() -> None:
    """Room freed in the local pending budget goes to other slots' held work, never to
    the cancelled slot's."""
    m = machine(max_total_pending=1)
    take_in(m, 1, 0.0, key="s")
    m.queued_in_cluster(1, 0.0)
    take_in(m, 2, 0.0, key="s", wait=True)
    other = take_in(m, 3, 0.0, key="t", wait=True)
    drained(m)
    assert m.withdraw_slot("s", 1.0) == (2, None)
    assert [r for r in drained(m)[1] if isinstance(r, Ask)] == [Ask(other)]
