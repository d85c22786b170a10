"""The controller's slot state machine and admission budgets: pure, synchronous logic.

No trio here. The controller loop drives a ``SlotMachine`` with submissions, registry
decisions, physical exits, removals, slot-wide cancels, queue deadlines and the shutdown;
each call appends *effects* (``Admit``, ``Stop``, ``Reject``, ``Join``, ``Detach``,
``Submitted``, ``Transition``, ``RemoveRequested``: small frozen tuples, handled with
``match``) to ``machine.effects`` for the driver to carry out. An ``Entry`` carries the
driver's ``payload`` (the controller's record), which the machine never looks at.

Queue deadlines: an entry with a finite ``deadline`` (the driver sets
it at intake, and calls ``track_deadline`` right after ``submit``; work without one costs
nothing) is withdrawn ``QUEUE_TIMEOUT`` if it is still queued or held when
``now >= deadline``. The driver calls ``expire(now)`` at ``next_deadline``; every other
transition first withdraws what is due, so work whose deadline has come never starts,
whichever of two same-instant events the driver sees first.

Invariants (checked by the property tests):

* A slot has at most one owner, from admission until the owner physically exited.
* Queued work of a slot runs in FIFO order; held work of a slot keeps FIFO order.
* Budgets are never exceeded: ``len(queue) <= max_slot_queue`` (except REPLACE heads,
  which ignore it), ``pending <= max_total_pending``, ``len(slots) <= max_slots``,
  ``waiting <= max_waiters``.
* A held submission holds no budget while it waits; it reserves everything it needs
  at once, when it is placed.
* Every submission ends exactly once: it is rejected, or admitted (and then leaves
  with its owner's exit or a registry rejection), or joined to other work.
* A slot with no owner, no queue and no held work is not in ``slots``.

Decisions the design leaves open:

* A non-wait submission never waits behind held work: it is placed when the budgets
  it needs have room, else rejected.
* A REPLACE that needs no budget (it replaces an existing head) is placed at once even
  when wait-mode work of its slot is held.
* Joiners count against ``max_waiters`` until the work they follow ends, or has its
  outcome: an owner forced at its grace deadline (``answered``) runs on until its
  physical exit, but its joiners have their outcome, hold no budget and cannot be
  removed; a JOIN of it gets that outcome at once. (Before, they counted until the exit,
  perhaps never, and refused every JOIN and held submission in every slot meanwhile.)
* A queue deadline is inclusive: work still queued or held at exactly its deadline is
  withdrawn, even if its slot's owner exits at that same instant. A deadline that has
  already come at intake (``queue_timeout=0``, or time spent in the command channel)
  rejects the work ``QUEUE_TIMEOUT`` in the same step: it never enters the queue, so its
  placement is ``REJECTED`` and no ``Submitted`` is emitted for it; a REPLACE still stops
  the owner and supersedes a queued head.
* ``cancel_slot`` withdraws the slot's line in order: queued work from the head, then held
  work oldest first; the room it frees goes to other slots' held work only.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from typing import Final, Generic, NamedTuple, TypeAlias, TypeVar, Union

from ._outcome import Placement, RejectionKind
from ._spec import AdmissionPolicy

P = TypeVar("P")

SLOT_BUSY = RejectionKind.SLOT_BUSY
QUEUE_FULL = RejectionKind.QUEUE_FULL
SUPERSEDED = RejectionKind.SUPERSEDED
REMOVED_FROM_QUEUE = RejectionKind.REMOVED_FROM_QUEUE
SHUTTING_DOWN = RejectionKind.SHUTTING_DOWN
RESOURCE_LIMIT = RejectionKind.RESOURCE_LIMIT
QUEUE_TIMEOUT = RejectionKind.QUEUE_TIMEOUT
OWNER = Placement.OWNER
QUEUED = Placement.QUEUED
JOINED = Placement.JOINED
NO_DEADLINE: Final = math.inf


class SlotStatus(enum.Enum):
    """The owner's stage in a busy slot (``REMOTE``: a cluster slot owned elsewhere)."""

    ADMITTING = "admitting"
    """The owner awaits registry admission (and, in a cluster slot, the lease)."""
    RUNNING = "running"
    """The registry accepted the owner, which holds the slot until it has exited."""
    TERMINATING = "terminating"
    """A REPLACE (from any process) stops the owner; the slot advances once it has exited."""
    REMOTE = "remote"
    """A cluster slot whose lease, or whose queue head, belongs to another process."""


class Entry(Generic[P]):
    """One submission as the machine sees it; ``payload`` belongs to the driver."""

    __slots__ = (
        "deadline",
        "followers",
        "id",
        "key",
        "payload",
        "policy",
        "seq",
        "target",
        "timeout",
        "wait",
    )

    def __init__(
        self,
        id: int,
        key: str,
        policy: AdmissionPolicy,
        *,
        wait: bool = False,
        payload: P = None,  # type: ignore[assignment]  # the machine's own tests carry none
        timeout: float | None = None,
    ) -> None:
        self.id = id
        self.key = key
        self.policy = policy
        self.wait = wait
        self.payload = payload
        self.followers: list[Entry[P]] | None = None  # joiners following this entry
        self.target: Entry[P] | None = None  # for a joiner: the entry it follows
        self.seq = 0  # for held entries: the order in which they were held
        # The queue timeout (``None``: none) and, from intake, its absolute deadline.
        self.timeout = timeout
        self.deadline = NO_DEADLINE

    def __repr__(self) -> str:
        return f"Entry({self.id}, {self.key!r}, {self.policy.name})"


# -- effects: what the driver must do, in order ------------------------------------------


class Admit(NamedTuple, Generic[P]):
    """Hand ``entry`` to the registry as its slot's owner."""

    entry: Entry[P]


class Stop(NamedTuple, Generic[P]):
    """Stop the owner ``entry`` (a REPLACE)."""

    entry: Entry[P]


class Reject(NamedTuple, Generic[P]):
    """``entry`` ends ``REJECTED(kind)`` without running; ``reason`` replaces the kind's
    usual words."""

    entry: Entry[P]
    kind: RejectionKind
    reason: str | None = None


class Detach(NamedTuple, Generic[P]):
    """The joiner ``entry`` stops following its target and ends ``REJECTED(kind)``."""

    entry: Entry[P]
    kind: RejectionKind


class Join(NamedTuple, Generic[P]):
    """The joiner ``entry`` resolves to ``target``'s outcome."""

    entry: Entry[P]
    target: Entry[P]


class Submitted(NamedTuple, Generic[P]):
    """``entry`` entered admission, a queue, held work or a join (``reason``).

    ``placement``: the admission decision this step makes (``None`` while held, and for
    queued work that starts: its placement was made when it was queued).
    """

    entry: Entry[P]
    reason: str
    placement: Placement | None = None


class RemoveRequested(NamedTuple, Generic[P]):
    """A removal (by id, or ``cancel_slot``) takes ``entry`` out; its rejection follows."""

    entry: Entry[P]


class Transition(NamedTuple, Generic[P]):
    """The owner ``entry``'s slot changed status (``reason``: ``"a->b"``)."""

    entry: Entry[P]
    reason: str


Effect: TypeAlias = Union[  # noqa: UP007 - a generic alias: Effect[P]
    Admit[P],
    Stop[P],
    Reject[P],
    Detach[P],
    Join[P],
    Submitted[P],
    Transition[P],
    RemoveRequested[P],
]


class Slot(Generic[P]):
    """State of one busy slot."""

    __slots__ = ("asking", "granted", "held", "key", "owner", "queue", "since", "status")

    def __init__(self, key: str, now: float) -> None:
        self.key = key
        self.status: SlotStatus | None = None
        self.owner: Entry[P] | None = None
        self.queue: deque[Entry[P]] = deque()
        self.held: deque[Entry[P]] = deque()
        self.since = now
        # Cluster slots only (``_clusterslots``): submissions the slot store is deciding
        # on, and the next owner, granted its lease while a lost-lease owner still runs.
        self.asking: dict[int, Entry[P]] | None = None
        self.granted: Entry[P] | None = None


class SlotMachine(Generic[P]):
    """Slots, queues, held submissions, joiners and budgets of one controller."""

    def __init__(
        self,
        *,
        max_slot_queue: int,
        max_total_pending: int | None,
        max_slots: int | None,
        max_waiters: int | None,
    ) -> None:
        self.max_slot_queue = max_slot_queue
        self.max_total_pending = max_total_pending
        self.max_slots = max_slots
        self.max_waiters = max_waiters
        self.slots: dict[str, Slot[P]] = {}
        self.pending: int = 0  # queued entries in every slot (the max_total_pending budget)
        self.held: dict[int, Entry[P]] = {}  # held entries, oldest first
        self._held_slots: dict[str, Slot[P]] = {}  # the slots that have held entries
        self._held_count = 0
        self.joiners: dict[int, Entry[P]] = {}
        self._answered: set[int] = set()  # owners with an outcome, still running
        self.queued: dict[int, Entry[P]] = {}
        self.asking: dict[int, Entry[P]] = {}  # cluster slots: work the store decides on
        # Queue deadlines of queued and held entries: (deadline, id, entry), stale ones
        # (the entry started or ended) dropped lazily.
        self._deadlines: list[tuple[float, int, Entry[P]]] = []
        self.closed = False
        self.effects: list[Effect[P]] = []

    # -- queries ------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Held submissions plus joiners: the ``max_waiters`` budget in use."""
        return len(self.held) + len(self.joiners)

    def owner_of(self, key: str) -> Entry[P] | None:
        slot = self.slots.get(key)
        return None if slot is None else slot.owner

    def waits_for(self, entry: Entry[P]) -> tuple[Entry[P], str] | None:
        """What ``entry`` waits for in the slots, for wait-for cycles.

        Queued or held work waits for its slot's owner (``"queued"`` / ``"held"``); a
        joiner for the work it follows (``"joined"``); anything else for nothing here.
        """
        task_id = entry.id
        if self.queued.get(task_id) is entry:
            owner = self.slots[entry.key].owner
            return None if owner is None else (owner, "queued")
        if self.held.get(task_id) is entry:
            owner = self.slots[entry.key].owner
            return None if owner is None else (owner, "held")
        if self.joiners.get(task_id) is entry and entry.target is not None:
            return entry.target, "joined"
        return None

    @property
    def next_deadline(self) -> float:
        """The earliest queue deadline of queued or held work (``math.inf``: none)."""
        heap = self._deadlines
        while heap and not self._in_line(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else NO_DEADLINE

    def _in_line(self, entry: Entry[P]) -> bool:
        return self.queued.get(entry.id) is entry or self.held.get(entry.id) is entry

    # -- transitions --------------------------------------------------------------------

    def submit(self, entry: Entry[P], now: float) -> None:
        """Take a new submission in; then ``track_deadline`` if it has a deadline."""
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire(now)
        if self.closed:
            self._reject(entry, SHUTTING_DOWN)
            return
        slot = self.slots.get(entry.key)
        if slot is None:
            if self.max_slots is not None and len(self.slots) >= self.max_slots:
                self._reject(entry, RESOURCE_LIMIT)
                return
            slot = self.slots[entry.key] = Slot(entry.key, now)
        if slot.owner is None:
            self._start(slot, entry, now, "admitting: slot idle")
            return
        policy = entry.policy
        if policy is AdmissionPolicy.DROP_IF_RUNNING:
            self._reject(entry, SLOT_BUSY)
        elif policy is AdmissionPolicy.JOIN:
            self._join(slot, entry)
        elif entry.wait and slot.held and not (policy is AdmissionPolicy.REPLACE and slot.queue):
            # FIFO behind this slot's held work; a REPLACE of an existing head needs no
            # budget, so it is never held (see the decisions above).
            self._hold(slot, entry)
        else:
            missing = self._missing_budget(slot, entry)
            if missing is None:
                self._place(slot, entry, now)
            elif entry.wait:
                self._hold(slot, entry)
            else:
                self._reject(entry, missing)

    def track_deadline(self, entry: Entry[P], now: float) -> None:
        """``entry``, just submitted with a ``deadline``: keep it if it was queued or held,
        and reject it at once if the deadline has already come (it never entered the
        queue: no ``Submitted``, so its placement is ``REJECTED``; what its intake did to
        others, a REPLACE's stop of the owner included, stands)."""
        if self._in_line(entry):
            self._add_deadline(entry)
            if entry.deadline <= now:
                effects = self.effects
                for i in range(len(effects) - 1, -1, -1):
                    effect = effects[i]
                    if type(effect) is Submitted and effect.entry is entry:
                        del effects[i]
                        break
                self.expire(now)

    def admitted(self, entry: Entry[P], accepted: bool, now: float) -> None:
        """The registry's decision on an owner's admission; stale decisions are ignored."""
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire(now)
        slot = self.slots.get(entry.key)
        if slot is None or slot.owner is not entry:
            return
        if not accepted:
            # The registry rejected the owner: on to the next item, with no removal.
            self._ended(entry)
            self._advance(slot, now)
        elif slot.status is SlotStatus.RUNNING:
            return  # a repeated acceptance: nothing changes
        elif slot.status is SlotStatus.ADMITTING:
            self._set_status(slot, SlotStatus.RUNNING, now, "admitting->running")
        else:
            # REPLACE arrived while admitting: stop the new owner at once.
            self.effects.append(Stop(entry))

    def exited(self, entry: Entry[P], now: float) -> None:
        """The owner physically exited and its outcome is committed."""
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire(now)
        slot = self.slots.get(entry.key)
        if slot is None or slot.owner is not entry:
            return
        self._ended(entry)
        self._advance(slot, now)

    def answered(self, entry: Entry[P]) -> None:
        """The owner ``entry`` has its outcome before its physical exit (forced): its
        joiners have theirs, and a later JOIN of it gets it at once."""
        slot = self.slots.get(entry.key)
        if slot is not None and slot.owner is entry:
            self._ended(entry)
            self._answered.add(entry.id)

    def remove(self, task_id: int, now: float) -> Entry[P] | None:
        """Take queued or held work, or a joiner, out at once; return it if found."""
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire(now)
        entry = self.queued.get(task_id)
        if entry is not None:
            self.effects.append(RemoveRequested(entry))
            self._withdraw(entry, REMOVED_FROM_QUEUE, now)
            return entry
        entry = self.held.get(task_id)
        if entry is not None:
            self.effects.append(RemoveRequested(entry))
            self._withdraw(entry, REMOVED_FROM_QUEUE, now)
            return entry
        entry = self.joiners.pop(task_id, None)
        if entry is not None:
            assert entry.target is not None
            assert entry.target.followers is not None
            entry.target.followers.remove(entry)
            self.effects.append(RemoveRequested(entry))
            self.effects.append(Detach(entry, REMOVED_FROM_QUEUE))
            return entry
        return None

    def expire(self, now: float) -> None:
        """Withdraw queued and held work whose deadline has come (``QUEUE_TIMEOUT``).

        All of it first, then the room is offered: none goes to work that is due itself.
        """
        heap = self._deadlines
        withdrawn = False
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if self._in_line(entry):
                self._withdraw(entry, QUEUE_TIMEOUT, now, offer=False)
                withdrawn = True
        if withdrawn:
            self._place_held(now)

    def withdraw_slot(self, key: str, now: float) -> tuple[int, Entry[P] | None]:
        """``cancel_slot``: withdraw every queued and held entry of ``key``.

        Returns how many were withdrawn and the slot's owner (``None``: the slot is
        idle), which the driver stops. Held work is taken out before any queue room is
        freed, so none of it is placed on the way; other slots' held work then gets the
        room.
        """
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire(now)
        slot = self.slots.get(key)
        if slot is None:
            return 0, None
        line = [*slot.queue, *slot.held]
        for entry in slot.held:
            del self.held[entry.id]
        slot.held.clear()
        self._held_slots.pop(key, None)
        for entry in slot.queue:
            del self.queued[entry.id]
        self.pending -= len(slot.queue)
        slot.queue.clear()
        for entry in line:
            self.effects.append(RemoveRequested(entry))
            self._reject(entry, REMOVED_FROM_QUEUE)
        owner = slot.owner
        self._drop_if_empty(slot)
        if line:
            self._place_held(now)
        return len(line), owner

    def close(self) -> None:
        """Shutdown: reject queued and held work; nothing advances any more."""
        self.closed = True
        for slot in list(self.slots.values()):
            while slot.queue:
                entry = slot.queue.popleft()
                del self.queued[entry.id]
                self.pending -= 1
                self._reject(entry, SHUTTING_DOWN)
            while slot.held:
                self._reject(self._unhold_head(slot), SHUTTING_DOWN)
            self._drop_if_empty(slot)

    # -- internals ------------------------------------------------------------------------

    def _withdraw(
        self, entry: Entry[P], kind: RejectionKind, now: float, *, offer: bool = True
    ) -> None:
        """Take queued or held ``entry`` out, reject it ``kind``, and offer the room."""
        slot = self.slots[entry.key]
        if self.queued.pop(entry.id, None) is not None:
            slot.queue.remove(entry)
            self.pending -= 1
        else:
            del self.held[entry.id]
            slot.held.remove(entry)
            if not slot.held:
                del self._held_slots[slot.key]
        self._reject(entry, kind)
        self._drop_if_empty(slot)
        if offer:
            self._place_held(now)

    def _add_deadline(self, entry: Entry[P]) -> None:
        heap = self._deadlines
        live = len(self.queued) + len(self.held) + len(self.asking)
        if len(heap) >= 64 and len(heap) > 2 * live:
            # Invariant: at least half of the heap is live, so entries that started or
            # ended are not kept until their deadline. Amortised O(1) per entry.
            heap[:] = [item for item in heap if self._in_line(item[2])]
            heapq.heapify(heap)
        heapq.heappush(heap, (entry.deadline, entry.id, entry))

    def _missing_budget(self, slot: Slot[P], entry: Entry[P]) -> RejectionKind | None:
        """The rejection kind of the first full budget ``entry`` needs, or ``None``."""
        if entry.policy is AdmissionPolicy.REPLACE and slot.queue:
            return None  # replacing an existing head needs no budget
        if entry.policy is AdmissionPolicy.QUEUE and len(slot.queue) >= self.max_slot_queue:
            return QUEUE_FULL
        if self.max_total_pending is not None and self.pending >= self.max_total_pending:
            return RESOURCE_LIMIT
        return None

    def _start(
        self, slot: Slot[P], entry: Entry[P], now: float, reason: str, placed: bool = False
    ) -> None:
        """``placed``: the entry was placed when it was queued."""
        slot.owner = entry
        slot.status = SlotStatus.ADMITTING
        slot.since = now
        self.effects.append(Submitted(entry, reason, None if placed else OWNER))
        self.effects.append(Admit(entry))

    def _place(self, slot: Slot[P], entry: Entry[P], now: float) -> None:
        if entry.policy is AdmissionPolicy.REPLACE:
            if slot.queue:
                displaced = slot.queue[0]
                slot.queue[0] = entry
                del self.queued[displaced.id]
                self.queued[entry.id] = entry
                self.effects.append(Submitted(entry, "replacing the queue head", QUEUED))
                self._reject(displaced, SUPERSEDED)
            else:
                slot.queue.append(entry)
                self.queued[entry.id] = entry
                self.pending += 1
                self.effects.append(Submitted(entry, "queue head, replacing the owner", QUEUED))
            if slot.status is SlotStatus.RUNNING:
                self._set_status(slot, SlotStatus.TERMINATING, now, "running->terminating")
                assert slot.owner is not None
                self.effects.append(Stop(slot.owner))
            elif slot.status is SlotStatus.ADMITTING:
                self._set_status(slot, SlotStatus.TERMINATING, now, "admitting->terminating")
        else:
            slot.queue.append(entry)
            self.queued[entry.id] = entry
            self.pending += 1
            self.effects.append(Submitted(entry, "queued", QUEUED))

    def _hold(self, slot: Slot[P], entry: Entry[P]) -> None:
        if self.max_waiters is not None and self.waiting >= self.max_waiters:
            self._reject(entry, RESOURCE_LIMIT)
            return
        slot.held.append(entry)
        self.held[entry.id] = entry
        self._held_slots[slot.key] = slot
        entry.seq = self._held_count
        self._held_count += 1
        self.effects.append(Submitted(entry, "held"))

    def _join(self, slot: Slot[P], entry: Entry[P]) -> None:
        if self.max_waiters is not None and self.waiting >= self.max_waiters:
            self._reject(entry, RESOURCE_LIMIT)
            return
        target = slot.queue[-1] if slot.queue else slot.owner
        assert target is not None
        self._follow(entry, target)
        self.effects.append(Submitted(entry, f"joined #{int(target.id)}", JOINED))
        self.effects.append(Join(entry, target))

    def _follow(self, entry: Entry[P], target: Entry[P]) -> None:
        """``entry`` joins ``target``: one of its joiners until it ends or is answered."""
        if target.id in self._answered:
            return  # its Join resolves it at once
        entry.target = target
        if target.followers is None:
            target.followers = []
        target.followers.append(entry)
        self.joiners[entry.id] = entry

    def _reject(self, entry: Entry[P], kind: RejectionKind, reason: str | None = None) -> None:
        self.effects.append(Reject(entry, kind, reason))
        self._ended(entry)

    def _ended(self, entry: Entry[P]) -> None:
        """``entry`` will never run (again): release the joiners that follow it."""
        self._answered.discard(entry.id)
        if entry.followers:
            for joiner in entry.followers:
                del self.joiners[joiner.id]
            entry.followers = None

    def _set_status(self, slot: Slot[P], status: SlotStatus, now: float, reason: str) -> None:
        slot.status = status
        slot.since = now
        assert slot.owner is not None
        self.effects.append(Transition(slot.owner, reason))

    def _advance(self, slot: Slot[P], now: float) -> None:
        """The owner left: start the next queued item, else the oldest held one."""
        slot.owner = None
        slot.status = None
        if self.closed:
            self._drop_if_empty(slot)
            return
        if slot.queue:
            entry = slot.queue.popleft()
            del self.queued[entry.id]
            self.pending -= 1
            self._start(slot, entry, now, "admitting: next in queue", placed=True)
        elif slot.held:
            # An owner needs no queue room: the oldest held submission starts at once.
            self._start(slot, self._unhold_head(slot), now, "admitting: held, slot idle")
        else:
            del self.slots[slot.key]
        self._place_held(now)

    def _place_held(self, now: float) -> None:
        """Place held heads, oldest first, while the budgets they need have room.

        Only the oldest held entry of a slot is eligible (FIFO per slot), so each pick
        scans the slots with held work, not every held entry.
        """
        while self._held_slots:
            best: Entry[P] | None = None
            for slot in self._held_slots.values():
                head = slot.held[0]
                if (best is None or head.seq < best.seq) and self._missing_budget(
                    slot, head
                ) is None:
                    best = head
            if best is None:
                return
            slot = self.slots[best.key]
            self._place(slot, self._unhold_head(slot), now)

    def _unhold_head(self, slot: Slot[P]) -> Entry[P]:
        entry = slot.held.popleft()
        del self.held[entry.id]
        if not slot.held:
            del self._held_slots[slot.key]
        return entry

    def _drop_if_empty(self, slot: Slot[P]) -> None:
        if (
            slot.owner is None
            and not slot.queue
            and not slot.held
            and not slot.asking
            and slot.granted is None
        ):
            self.slots.pop(slot.key, None)
