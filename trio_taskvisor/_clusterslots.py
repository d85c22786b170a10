"""The slot machine of a controller with a slot store: pure, synchronous logic.

No trio here. ``ClusterSlotMachine`` is a ``SlotMachine`` whose placement decisions are
the slot store's: a submission is *asked* (``Ask``) and placed when the lease keeper's
answer comes back. The driver feeds every keeper report to ``report``, which places the
work (``granted``, ``queued_in_cluster``, ``joined``, ``rejected``, ``full``, ...) and
returns the one thing the driver must do about the report itself (a ``Notice``: set a
fence token, give back a lease, publish an event, resolve a joiner), before the
machine's ``effects`` and ``extra``. An owner's exit gives its lease back (``Release``)
instead of starting the next local entry, which waits for its own grant (the cluster
queue is FIFO across processes); a REPLACE is carried out by the store (it asks the
owner's process to stop its owner: ``remote_stop``). What stays local, as in
``SlotMachine``: one owner per slot in this process, held work (FIFO per slot), joiners
of local work, the budgets ``max_total_pending``, ``max_slots`` and ``max_waiters``, and
the shutdown.

Words: an *entry* is one submission (``Entry``; on the server, its queue entry); its
``id`` is the local ``TaskId`` (``task_id`` in the reports); an *entry id* is only ever
the server's string ``"<instance_id>/<task_id>[.<attempt>]"`` (``_slotstore.entry_id``).

Decisions the design leaves open:

* A QUEUE or REPLACE submission reserves a ``max_total_pending`` unit while the store
  decides, so the budget holds whatever the answer; an owner's grant gives it back.
* ``DROP_IF_RUNNING`` on a slot with a local owner is rejected ``SLOT_BUSY`` at once,
  without asking the store; every other submission asks it (JOIN always does).
* Held work is asked again, oldest of its slot first, when the store reports room in
  the slot's queue (``room``), when the store recovers (``recovered``), and, for work
  held for the local ``max_total_pending`` budget, when that budget frees. While it is
  asked again it keeps its place: it still counts in ``max_waiters``, newer wait-mode
  work of its slot is held behind it, and if the store still cannot take it, it goes
  back where it was (no second ``CONTROLLER_SUBMITTED``). Once the store places it, the
  slot's next held work is asked at once: a room report wakes a process only once.
* A slot with local work but no local owner is ``REMOTE``; while a submission is being
  decided on an otherwise empty slot it is ``ADMITTING`` (lease acquisition), with no
  owner yet.
* The lease of work that is granted after it left (removed, withdrawn, timed out, shut
  down) is given back at once (``granted`` returns ``None``: the driver withdraws the
  entry again, which frees its lease and keeps the reason it first left for its joiners).

Placement, queue deadlines and slot-wide operations in cluster slots:

* Queue deadlines run on this process's clock. Queued work (in the cluster queue) whose
  deadline comes is withdrawn ``QUEUE_TIMEOUT`` and leaves the cluster queue
  (``Withdraw``); held work, asked again or not, is rejected ``QUEUE_TIMEOUT`` while held
  (asked again, its request is withdrawn too). Work the store is deciding on for the first
  time is neither queued nor held yet: its answer decides. Queued or held, it is withdrawn
  at once then (placement ``REJECTED``, with no ``Submitted``, as for a deadline that came
  at intake); granted, it is the owner (work starting on an idle slot is unaffected,
  ``queue_timeout=0`` included). So a deadline is late by at most the store's answer,
  which comes within ``connect_timeout``. Every transition first withdraws what is due, so
  a grant that comes at or after the deadline of queued work finds it gone.
* ``withdraw_slot`` (``cancel_slot``) withdraws this process's line of the slot: the next
  owner granted while a lost-lease owner still runs (its lease is given back), queued
  work from the head, work the store is deciding on, then held work (held work asked
  again first). Queued and asked work leaves the cluster (``Withdraw``). A remote owner is
  not the machine's: the driver asks the store to stop it.
"""

from __future__ import annotations

import heapq
from typing import Any, Generic, NamedTuple, TypeAlias, Union, assert_never

from ._outcome import RejectionKind, TaskOutcome
from ._slots import (
    JOINED,
    QUEUE_TIMEOUT,
    QUEUED,
    REMOVED_FROM_QUEUE,
    RESOURCE_LIMIT,
    SHUTTING_DOWN,
    SLOT_BUSY,
    Detach,
    Entry,
    Join,
    P,
    RemoveRequested,
    Slot,
    SlotMachine,
    SlotStatus,
    Stop,
    Submitted,
)
from ._slotstore import (
    FollowedOutcome,
    Full,
    Joined,
    LeaseLost,
    Owner,
    Queued,
    Rejected,
    RemoteStop,
    Report,
    Room,
    StoreRecovered,
    StoreUnavailable,
)
from ._spec import AdmissionPolicy

# -- effects of cluster slots, on top of the local ones -------------------------------------


class Ask(NamedTuple, Generic[P]):
    """Ask the slot store to place ``entry`` (the keeper's ``submit``)."""

    entry: Entry[P]


class Withdraw(NamedTuple, Generic[P]):
    """Take ``entry`` out of the cluster queue (or give back a lease it may hold)."""

    entry: Entry[P]
    kind: RejectionKind


class Release(NamedTuple, Generic[P]):
    """The owner ``entry`` has exited (or was refused): give its lease back."""

    entry: Entry[P]


class LoseLease(NamedTuple, Generic[P]):
    """The owner ``entry`` lost its lease: force it at once (``LEASE_LOST``)."""

    entry: Entry[P]
    reason: str


class LostUnstarted(NamedTuple, Generic[P]):
    """``entry``, granted but never admitted, lost its lease: it ends ``LEASE_LOST``
    without running (its ``Release`` follows, carrying that outcome)."""

    entry: Entry[P]
    reason: str


class Follow(NamedTuple, Generic[P]):
    """The joiner ``entry`` follows ``target``, work of another process (an entry id)."""

    entry: Entry[P]
    target: str


class Unfollow(NamedTuple, Generic[P]):
    """The joiner ``entry`` no longer follows remote work."""

    entry: Entry[P]


ClusterEffect: TypeAlias = Union[  # noqa: UP007 - a generic alias: ClusterEffect[P]
    Ask[P], Withdraw[P], Release[P], LoseLease[P], LostUnstarted[P], Follow[P], Unfollow[P]
]

# -- what a keeper's report asks of the driver, before the machine's effects ----------------


class SetFence(NamedTuple, Generic[P]):
    """``entry`` holds its slot's lease now, with fence ``token`` (``LEASE_ACQUIRED``)."""

    entry: Entry[P]
    token: int


class GiveBack(NamedTuple):
    """A lease was granted to work that left meanwhile (its withdrawal is on its way):
    withdraw ``task_id`` again, which frees the lease and keeps the first reason it left."""

    slot: str
    task_id: int


class StopAsked(NamedTuple, Generic[P]):
    """``requester`` (an instance id) asked to stop the owner ``entry`` (``REMOTE_STOP``,
    unless the requester is this process)."""

    entry: Entry[P]
    requester: str


class LeaseLostNotice(NamedTuple, Generic[P]):
    """The owner ``entry`` lost the lease of fence ``token`` (``LEASE_LOST``)."""

    entry: Entry[P]
    token: int
    reason: str


class FollowerDone(NamedTuple, Generic[P]):
    """The joiner ``entry`` of remote work ends with ``outcome``."""

    entry: Entry[P]
    outcome: TaskOutcome[Any]


class StoreState(NamedTuple):
    """The store became unavailable, or answers again (once per outage each)."""

    available: bool


Notice: TypeAlias = Union[  # noqa: UP007 - a generic alias: Notice[P]
    SetFence[P], GiveBack, StopAsked[P], LeaseLostNotice[P], FollowerDone[P], StoreState
]


_RESERVES = (AdmissionPolicy.QUEUE, AdmissionPolicy.REPLACE)


class ClusterSlotMachine(SlotMachine[P]):
    """Local view and budgets of cluster slots; the slot store places the work.

    Its cluster effects go to ``extra``, which the driver carries out after ``effects``
    (so a ``Release`` finds the outcome a ``Reject`` just set).
    """

    def __init__(
        self,
        *,
        max_slot_queue: int,
        max_total_pending: int | None,
        max_slots: int | None,
        max_waiters: int | None,
    ) -> None:
        super().__init__(
            max_slot_queue=max_slot_queue,
            max_total_pending=max_total_pending,
            max_slots=max_slots,
            max_waiters=max_waiters,
        )
        self.owners: dict[int, Entry[P]] = {}  # local owners, and granted next owners
        self.extra: list[ClusterEffect[P]] = []
        self._reserved = 0  # pending units reserved by asked QUEUE / REPLACE work
        self._lost: dict[int, str] = {}  # owners whose lease was lost: the reason
        self._stopping: set[int] = set()  # granted owners to stop once admitted
        self._local_holds: set[int] = set()  # held for the local pending budget
        self._reasked: set[int] = set()  # held work asked again: it keeps its place

    # -- queries ------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Held submissions (held work asked again included) plus joiners."""
        return len(self.held) + len(self._reasked) + len(self.joiners)

    def waits_for(self, entry: Entry[P]) -> tuple[Entry[P], str] | None:
        """As ``SlotMachine.waits_for``; work the store is deciding on waits for its slot's
        local owner too. A remote owner is no edge: cycles are found within one process."""
        if self.asking.get(entry.id) is entry:
            owner = self.slots[entry.key].owner
            return None if owner is None else (owner, "queued")
        return super().waits_for(entry)

    def find(self, task_id: int) -> Entry[P] | None:
        """The local entry ``task_id``: an owner, queued, asked or held work."""
        return (
            self.owners.get(task_id)
            or self.queued.get(task_id)
            or self.asking.get(task_id)
            or self.held.get(task_id)
        )

    # -- intake ---------------------------------------------------------------------------

    def submit(self, entry: Entry[P], now: float) -> None:
        """Take a new submission in: ask the store, unless it is settled here; then
        ``track_deadline`` if it has a deadline."""
        self._due(now)
        if self.closed:
            self._reject(entry, SHUTTING_DOWN)
            return
        slot = self.slots.get(entry.key)
        if slot is None:
            if self.max_slots is not None and len(self.slots) >= self.max_slots:
                self._reject(entry, RESOURCE_LIMIT)
                return
            slot = self.slots[entry.key] = Slot(entry.key, now)
        if entry.policy is AdmissionPolicy.DROP_IF_RUNNING and slot.owner is not None:
            self._reject(entry, SLOT_BUSY)
        elif entry.wait and (slot.held or self._reasking(slot)):
            self._hold(slot, entry)  # FIFO behind this slot's held work
        elif entry.policy in _RESERVES and self._budget_full():
            if entry.wait:
                self._hold(slot, entry)
                if self.held.get(entry.id) is entry:  # not rejected for max_waiters
                    self._local_holds.add(entry.id)
            else:
                self._reject(entry, RESOURCE_LIMIT)
        else:
            self._ask(slot, entry, now)
        self._drop_if_empty(slot)

    # -- the keeper's reports ---------------------------------------------------------------

    def report(self, report: Report, now: float) -> Notice[P] | None:
        """Take in one report of the lease keeper; return what the driver must do about
        it before it carries out ``effects`` and ``extra`` (``None``: nothing)."""
        match report:
            case Owner(slot, task_id, token):
                owner = self.granted(task_id, now)
                return GiveBack(slot, task_id) if owner is None else SetFence(owner, token)
            case Queued(_, task_id, _):
                self.queued_in_cluster(task_id, now)
            case Joined(_, task_id, target, local_target, label):
                self.joined(task_id, local_target, target, label, now)
            case Rejected(_, task_id, kind, reason):
                self.rejected(task_id, kind, now, reason)
            case Full(_, task_id, _):
                self.full(task_id, now)
            case Room(slot):
                self.room(slot, now)
            case RemoteStop(_, task_id, requester):
                owner = self.remote_stop(task_id, now)
                return None if owner is None else StopAsked(owner, requester)
            case LeaseLost(_, task_id, token, reason):
                owner = self.lease_lost(task_id, reason)
                return None if owner is None else LeaseLostNotice(owner, token, reason)
            case FollowedOutcome(joiner, outcome):
                follower = self.followed_ended(joiner)
                return None if follower is None else FollowerDone(follower, outcome)
            case StoreUnavailable():
                return StoreState(available=False)
            case StoreRecovered():
                self.recovered(now)
                return StoreState(available=True)
            case _:
                assert_never(report)
        return None

    # -- the store's answers (each returns the entry concerned, or None if gone) ----------

    def granted(self, task_id: int, now: float) -> Entry[P] | None:
        """``task_id`` holds the slot's lease now: it becomes (or will be) the owner."""
        self._due(now)
        again = task_id in self._reasked
        entry = self._take_asking(task_id, now)
        reason = "admitting: lease acquired"
        if entry is None:
            entry = self._take_queued(task_id, now)
            if entry is None:
                return None
            reason = "admitting: next in the cluster queue"
        slot = self.slots[entry.key]
        self.owners[entry.id] = entry
        if slot.owner is not None:
            # The previous owner lost its lease and still runs. A next owner granted
            # before this one lost its own lease meanwhile (the server has moved the lease
            # on): it never runs, and ends LEASE_LOST.
            earlier = slot.granted
            if earlier is not None:
                del self.owners[earlier.id]
                reason = self._lost.pop(earlier.id, "lease expired: it went on to other work")
                self._stopping.discard(earlier.id)
                self._ended(earlier)
                self.extra.append(LostUnstarted(earlier, reason))
                self.extra.append(Release(earlier))
            slot.granted = entry
        else:
            self._start(slot, entry, now, reason)
        if again:
            self.room(slot.key, now)
        return entry

    def queued_in_cluster(self, task_id: int, now: float) -> Entry[P] | None:
        """``task_id`` is in the slot's cluster queue (its pending unit comes along);
        withdrawn at once if its queue deadline has come meanwhile."""
        self._due(now)
        entry = self.asking.get(task_id)
        if entry is None:
            return None
        again = task_id in self._reasked
        self._unask(entry, now)
        slot = self.slots[entry.key]
        slot.queue.append(entry)
        self.queued[entry.id] = entry
        self.pending += 1
        if slot.owner is None and slot.status is not SlotStatus.REMOTE:
            slot.status = SlotStatus.REMOTE
            slot.since = now
        if entry.deadline <= now:  # it never enters the queue: placed REJECTED
            self._withdraw(entry, QUEUE_TIMEOUT, now)
        else:
            self.effects.append(Submitted(entry, "queued in the cluster", QUEUED))
        if again:
            self.room(slot.key, now)
        return entry

    def joined(
        self, task_id: int, local_target: int | None, target: str, label: str, now: float
    ) -> Entry[P] | None:
        """The JOIN ``task_id`` follows ``target`` (``local_target``: its local id)."""
        self._due(now)
        entry = self._take_asking(task_id, now)
        if entry is None:
            return None
        slot = self.slots[entry.key]
        followed = None if local_target is None else self.find(local_target)
        if self.max_waiters is not None and self.waiting >= self.max_waiters:
            self._reject(entry, RESOURCE_LIMIT)
        elif followed is not None:
            self._follow(entry, followed)
            self.effects.append(Submitted(entry, f"joined #{int(followed.id)}", JOINED))
            self.effects.append(Join(entry, followed))
        else:
            self.joiners[entry.id] = entry  # no target: it follows remote work
            self.effects.append(Submitted(entry, f"joined {label}", JOINED))
            self.extra.append(Follow(entry, target))
        self._drop_if_empty(slot)
        return entry

    def rejected(
        self, task_id: int, kind: RejectionKind, now: float, reason: str | None = None
    ) -> Entry[P] | None:
        """The store rejected ``task_id`` (asked or queued work)."""
        self._due(now)
        entry = self._take_asking(task_id, now) or self._take_queued(task_id, now)
        if entry is None:
            return None
        self._reject(entry, kind, reason)
        self._drop_if_empty(self.slots[entry.key])
        return entry

    def full(self, task_id: int, now: float) -> Entry[P] | None:
        """Wait-mode work the store cannot take now: held until room or recovery;
        rejected at once if its queue deadline has come meanwhile."""
        self._due(now)
        again = task_id in self._reasked
        entry = self._take_asking(task_id, now)
        if entry is None:
            return None
        slot = self.slots[entry.key]
        if again:
            self._rehold(slot, entry)
        elif entry.deadline <= now:
            self._reject(entry, QUEUE_TIMEOUT)  # never held: placed REJECTED
        else:
            self._hold(slot, entry)
        if entry.deadline <= now and self.held.get(entry.id) is entry:
            self._withdraw(entry, QUEUE_TIMEOUT, now)
        self._drop_if_empty(slot)
        return entry

    def room(self, key: str, now: float) -> None:
        """The slot's cluster queue has room: ask its oldest held work again."""
        self._due(now)
        slot = self.slots.get(key)
        if slot is None or not slot.held or self.closed:
            return
        head = slot.held[0]
        if head.policy in _RESERVES and self._budget_full():
            self._local_holds.add(head.id)
            return
        self._ask_again(slot, now)

    def recovered(self, now: float) -> None:
        """The store answers again: ask every slot's oldest held work again."""
        for slot in list(self._held_slots.values()):
            self.room(slot.key, now)

    def remote_stop(self, task_id: int, now: float) -> Entry[P] | None:
        """The store asks to stop the local owner ``task_id`` (another's REPLACE)."""
        entry = self.owners.get(task_id)
        if entry is None:
            return None
        slot = self.slots[entry.key]
        if slot.owner is not entry:
            self._stopping.add(entry.id)  # granted, not started: stopped once admitted
        elif slot.status is SlotStatus.RUNNING:
            self._set_status(slot, SlotStatus.TERMINATING, now, "running->terminating")
            self.effects.append(Stop(entry))
        elif slot.status is SlotStatus.ADMITTING:
            self._set_status(slot, SlotStatus.TERMINATING, now, "admitting->terminating")
        return entry

    def lease_lost(self, task_id: int, reason: str) -> Entry[P] | None:
        """The owner ``task_id`` lost its lease: force it (once the registry has it)."""
        entry = self.owners.get(task_id)
        if entry is None:
            return None
        slot = self.slots[entry.key]
        if slot.owner is entry and slot.status in (SlotStatus.RUNNING, SlotStatus.TERMINATING):
            self.extra.append(LoseLease(entry, reason))
        else:
            self._lost[entry.id] = reason  # not admitted yet: forced once it is
        return entry

    def followed_ended(self, task_id: int) -> Entry[P] | None:
        """The remote work the joiner ``task_id`` follows has an outcome: it leaves."""
        joiner = self.joiners.get(task_id)
        if joiner is None or joiner.target is not None:
            return None
        del self.joiners[task_id]
        return joiner

    # -- the registry and the owners --------------------------------------------------------

    def admitted(self, entry: Entry[P], accepted: bool, now: float) -> None:
        """The registry's decision on an owner; stale decisions are ignored."""
        self._due(now)
        slot = self.slots.get(entry.key)
        if slot is None or slot.owner is not entry:
            return
        if not accepted:
            self._ended(entry)
            self._owner_left(slot, entry, now)
            return
        if entry.id in self._stopping:
            self._stopping.discard(entry.id)
            slot.status = SlotStatus.TERMINATING
        if slot.status is SlotStatus.ADMITTING:
            self._set_status(slot, SlotStatus.RUNNING, now, "admitting->running")
        elif slot.status is SlotStatus.TERMINATING:
            self.effects.append(Stop(entry))  # stopped by the store while admitting
        reason = self._lost.pop(entry.id, None)
        if reason is not None:
            self.extra.append(LoseLease(entry, reason))

    def exited(self, entry: Entry[P], now: float) -> None:
        """The owner physically exited and its outcome is committed: give its lease back."""
        self._due(now)
        slot = self.slots.get(entry.key)
        if slot is None or slot.owner is not entry:
            return
        self._ended(entry)
        self._owner_left(slot, entry, now)

    def remove(self, task_id: int, now: float) -> Entry[P] | None:
        """Take queued, asked or held work, or a joiner, out at once; return it if found."""
        self._due(now)
        entry = self.queued.get(task_id) or self.asking.get(task_id)
        if entry is not None:
            self.effects.append(RemoveRequested(entry))
            self.extra.append(Withdraw(entry, REMOVED_FROM_QUEUE))
            self.rejected(task_id, REMOVED_FROM_QUEUE, now)
            return entry
        joiner = self.joiners.get(task_id)
        if joiner is not None and joiner.target is None:
            del self.joiners[task_id]
            self.extra.append(Unfollow(joiner))
            self.effects.append(RemoveRequested(joiner))
            self.effects.append(Detach(joiner, REMOVED_FROM_QUEUE))
            return joiner
        self._local_holds.discard(task_id)
        return super().remove(task_id, now)

    def withdraw_slot(self, key: str, now: float) -> tuple[int, Entry[P] | None]:
        """``cancel_slot``: withdraw this process's line of ``key`` (see the module
        docstring for the order); queued and asked work leaves the cluster, a granted next
        owner gives its lease back.

        Returns how many were withdrawn and the local owner (``None``: no owner here; the
        driver asks the store to stop a remote one). Held work is taken out before any
        room is freed; other slots' held work then gets the room.
        """
        self._due(now)
        slot = self.slots.get(key)
        if slot is None:
            return 0, None
        held = list(slot.held)
        for entry in held:
            del self.held[entry.id]
            self._local_holds.discard(entry.id)
        slot.held.clear()
        self._held_slots.pop(key, None)
        # Work asked for the first time, in submission order, then held work asked again.
        asking = (slot.asking or {}).values()
        asked = [e for e in asking if e.id not in self._reasked]
        asked += [e for e in asking if e.id in self._reasked]
        for entry in asked:
            self._unask(entry, now)
        queue = list(slot.queue)
        for entry in queue:
            del self.queued[entry.id]
        self.pending -= len(queue)
        slot.queue.clear()
        granted, slot.granted = slot.granted, None
        leaving = [*queue, *asked]
        for entry in leaving:
            self.extra.append(Withdraw(entry, REMOVED_FROM_QUEUE))
        line = [*leaving, *held]
        if granted is not None:
            del self.owners[granted.id]
            self._lost.pop(granted.id, None)
            self._stopping.discard(granted.id)
            line.insert(0, granted)
        for entry in line:
            self.effects.append(RemoveRequested(entry))
            self._reject(entry, REMOVED_FROM_QUEUE)
        if granted is not None:
            self.extra.append(Release(granted))  # after its Reject: it carries the outcome
        owner = slot.owner
        self._drop_if_empty(slot)
        if line:
            self._place_held(now)
        return len(line), owner

    def close(self) -> None:
        """Shutdown: withdraw asked and queued work, reject held work; nothing advances."""
        self.closed = True
        for slot in list(self.slots.values()):
            for entry in [*slot.queue, *(slot.asking or {}).values()]:
                self.extra.append(Withdraw(entry, SHUTTING_DOWN))
                self.rejected(entry.id, SHUTTING_DOWN, 0.0)
            if slot.granted is not None:
                granted, slot.granted = slot.granted, None
                del self.owners[granted.id]
                self._reject(granted, SHUTTING_DOWN)
                self.extra.append(Release(granted))
            while slot.held:
                self._reject(self._unhold_head(slot), SHUTTING_DOWN)
            self._drop_if_empty(slot)
        for joiner in [j for j in self.joiners.values() if j.target is None]:
            del self.joiners[joiner.id]
            self.extra.append(Unfollow(joiner))
            self.effects.append(Detach(joiner, SHUTTING_DOWN))

    # -- internals ------------------------------------------------------------------------

    def _budget_full(self) -> bool:
        limit = self.max_total_pending
        return limit is not None and self.pending + self._reserved >= limit

    def _ask(self, slot: Slot[P], entry: Entry[P], now: float) -> None:
        if slot.asking is None:
            slot.asking = {}
        slot.asking[entry.id] = entry
        self.asking[entry.id] = entry
        if entry.policy in _RESERVES:
            self._reserved += 1
        if slot.owner is None and slot.status is None:
            slot.status = SlotStatus.ADMITTING  # lease acquisition
            slot.since = now
        self.extra.append(Ask(entry))

    def _take_asking(self, task_id: int, now: float) -> Entry[P] | None:
        """The asked entry ``task_id`` has its answer; its reserved unit is free."""
        entry = self.asking.get(task_id)
        if entry is None:
            return None
        self._unask(entry, now)
        if entry.policy in _RESERVES:
            self._place_held(now)
        return entry

    def _unask(self, entry: Entry[P], now: float) -> None:
        """The store no longer decides on ``entry``; its reserved unit is free (not offered)."""
        del self.asking[entry.id]
        self._reasked.discard(entry.id)
        slot = self.slots[entry.key]
        assert slot.asking is not None
        del slot.asking[entry.id]
        if slot.owner is None and slot.status is SlotStatus.ADMITTING and not slot.asking:
            slot.status = SlotStatus.REMOTE if slot.queue or slot.held else None
            slot.since = now
        if entry.policy in _RESERVES:
            self._reserved -= 1

    # -- queue deadlines ----------------------------------------------------------------

    def _in_line(self, entry: Entry[P]) -> bool:
        """Queued, held or asked: work whose queue deadline is kept (see ``expire``)."""
        return super()._in_line(entry) or self.asking.get(entry.id) is entry

    def _due(self, now: float) -> None:
        """Withdraw what is due before any other transition."""
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire(now)

    def expire(self, now: float) -> None:
        """Withdraw queued and held work whose deadline has come (``QUEUE_TIMEOUT``).

        Queued work leaves the cluster queue; held work asked again is withdrawn from the
        store too. Work asked for the first time is left to its answer (see the module
        docstring). All of it first, then the room is offered.
        """
        heap = self._deadlines
        due: list[Entry[P]] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if self.asking.get(entry.id) is entry:
                if entry.id in self._reasked:
                    due.append(entry)
            elif super()._in_line(entry):
                due.append(entry)
        for entry in due:
            if self.asking.get(entry.id) is entry:
                self.extra.append(Withdraw(entry, QUEUE_TIMEOUT))
                self._unask(entry, now)
                self._reject(entry, QUEUE_TIMEOUT)
                self._drop_if_empty(self.slots[entry.key])
            else:
                self._withdraw(entry, QUEUE_TIMEOUT, now, offer=False)
        if due:
            self._place_held(now)

    def _withdraw(
        self, entry: Entry[P], kind: RejectionKind, now: float, *, offer: bool = True
    ) -> None:
        """As ``SlotMachine._withdraw``; queued work also leaves the cluster queue."""
        if self.queued.get(entry.id) is entry:
            self.extra.append(Withdraw(entry, kind))
        self._local_holds.discard(entry.id)
        super()._withdraw(entry, kind, now, offer=offer)

    def _take_queued(self, task_id: int, now: float) -> Entry[P] | None:
        entry = self.queued.pop(task_id, None)
        if entry is None:
            return None
        self.slots[entry.key].queue.remove(entry)
        self.pending -= 1
        self._place_held(now)
        return entry

    def _owner_left(self, slot: Slot[P], entry: Entry[P], now: float) -> None:
        """The owner left (exited, or refused by the registry): give its lease back."""
        self.owners.pop(entry.id, None)
        self._lost.pop(entry.id, None)
        self._stopping.discard(entry.id)
        self.extra.append(Release(entry))
        slot.owner = None
        slot.status = None
        slot.since = now
        if slot.granted is not None and not self.closed:
            granted, slot.granted = slot.granted, None
            self._start(slot, granted, now, "admitting: lease acquired")
        elif slot.asking and not slot.queue:
            slot.status = SlotStatus.ADMITTING
        elif slot.queue or slot.held or slot.asking:
            slot.status = SlotStatus.REMOTE
        else:
            self._drop_if_empty(slot)

    def _hold(self, slot: Slot[P], entry: Entry[P]) -> None:
        super()._hold(slot, entry)
        if slot.held and slot.owner is None and slot.status is None:
            # Invariant: a tracked slot has a status. Held work alone (the store was
            # unavailable, or the local budget is full) leaves a slot with local work and
            # no local owner: REMOTE, as for queued work.
            slot.status = SlotStatus.REMOTE

    def _ask_again(self, slot: Slot[P], now: float) -> None:
        """Ask the store again for the slot's oldest held work; it keeps its place."""
        entry = self._unhold_head(slot)
        self._reasked.add(entry.id)
        self._ask(slot, entry, now)

    def _reasking(self, slot: Slot[P]) -> bool:
        """Whether held work of ``slot`` is being asked again."""
        reasked = self._reasked  # mostly empty: no scan (benchmark 10, the 3x50 callers)
        return bool(reasked) and any(task_id in reasked for task_id in slot.asking or ())

    def _rehold(self, slot: Slot[P], entry: Entry[P]) -> None:
        """Hold again work that was asked again and still does not fit: in its place
        (by hold order), within the ``max_waiters`` it never left, with no new event."""
        held = slot.held
        held.insert(next((i for i, e in enumerate(held) if e.seq > entry.seq), len(held)), entry)
        self.held[entry.id] = entry
        self._held_slots[slot.key] = slot
        if slot.owner is None and slot.status is None:
            slot.status = SlotStatus.REMOTE

    def _unhold_head(self, slot: Slot[P]) -> Entry[P]:
        entry = super()._unhold_head(slot)
        self._local_holds.discard(entry.id)
        return entry

    def _place_held(self, now: float) -> None:
        """Ask again the held work that waits for the local pending budget, oldest first."""
        if self.closed or not self._local_holds:
            return
        for entry in sorted((self.held[i] for i in self._local_holds), key=lambda e: e.seq):
            slot = self.slots[entry.key]
            if self._budget_full():
                return
            if slot.held[0] is entry:
                self._ask_again(slot, now)
