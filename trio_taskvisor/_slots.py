"""The controller's slot state machine and admission budgets: pure, synchronous logic.

No trio here. The controller loop drives a ``SlotMachine`` with submissions, registry
decisions, physical exits, removals and the shutdown; each call appends *effects*
(admit, stop, reject, join, event) to ``machine.effects`` for the driver to carry out.

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
* Joiners count against ``max_waiters`` until the work they follow ends.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any, Final


class AdmissionPolicy(enum.Enum):
    """What a submission does when its slot is busy."""

    QUEUE = "queue"
    REPLACE = "replace"
    DROP_IF_RUNNING = "drop_if_running"
    JOIN = "join"


class SlotStatus(enum.Enum):
    """The owner's stage in a busy slot."""

    ADMITTING = "admitting"
    RUNNING = "running"
    TERMINATING = "terminating"


# Rejection kinds, spelled as RejectionKind values (kept as strings: no trio here).
SLOT_BUSY: Final = "slot_busy"
QUEUE_FULL: Final = "queue_full"
SUPERSEDED: Final = "superseded"
REMOVED_FROM_QUEUE: Final = "removed_from_queue"
SHUTTING_DOWN: Final = "shutting_down"
RESOURCE_LIMIT: Final = "resource_limit"

# Effect tags.
ADMIT: Final = "admit"
STOP: Final = "stop"
REJECT: Final = "reject"
JOIN: Final = "join"
DETACH: Final = "detach"
SUBMITTED: Final = "submitted"
TRANSITION: Final = "transition"

Effect = tuple[str, "Entry", Any]


class Entry:
    """One submission as the machine sees it; ``payload`` belongs to the driver."""

    __slots__ = ("followers", "id", "key", "payload", "policy", "seq", "target", "wait")

    def __init__(
        self,
        id: int,
        key: str,
        policy: AdmissionPolicy,
        *,
        wait: bool = False,
        payload: Any = None,
    ) -> None:
        self.id = id
        self.key = key
        self.policy = policy
        self.wait = wait
        self.payload = payload
        self.followers: list[Entry] | None = None  # joiners following this entry
        self.target: Entry | None = None  # for a joiner: the entry it follows
        self.seq = 0  # for held entries: the order in which they were held

    def __repr__(self) -> str:
        return f"Entry({self.id}, {self.key!r}, {self.policy.name})"


class Slot:
    """State of one busy slot."""

    __slots__ = ("held", "key", "owner", "queue", "since", "status")

    def __init__(self, key: str, now: float) -> None:
        self.key = key
        self.status: SlotStatus | None = None
        self.owner: Entry | None = None
        self.queue: deque[Entry] = deque()
        self.held: deque[Entry] = deque()
        self.since = now


class SlotMachine:
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
        self.slots: dict[str, Slot] = {}
        self.pending = 0  # queued entries in every slot (the max_total_pending budget)
        self.held: dict[int, Entry] = {}  # held entries, oldest first
        self._held_slots: dict[str, Slot] = {}  # the slots that have held entries
        self._held_count = 0
        self.joiners: dict[int, Entry] = {}
        self.queued: dict[int, Entry] = {}
        self.closed = False
        self.effects: list[Effect] = []

    # -- queries ------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Held submissions plus joiners: the ``max_waiters`` budget in use."""
        return len(self.held) + len(self.joiners)

    def owner_of(self, key: str) -> Entry | None:
        slot = self.slots.get(key)
        return None if slot is None else slot.owner

    def is_behind(self, entry_id: int, key: str) -> bool:
        """Whether ``entry_id`` waits (queued, held, or joined to such work) behind ``key``.

        A joiner that follows the owner of ``key`` waits behind it too.
        """
        entry = self.queued.get(entry_id) or self.held.get(entry_id)
        if entry is None:
            joiner = self.joiners.get(entry_id)
            if joiner is None or joiner.target is None:
                return False
            target = joiner.target
            if target.key == key and self.owner_of(key) is target:
                return True
            entry = self.queued.get(target.id) or self.held.get(target.id)
            if entry is None:
                return False
        return entry.key == key

    # -- transitions --------------------------------------------------------------------

    def submit(self, entry: Entry, now: float) -> None:
        """Take a new submission in."""
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

    def admitted(self, entry: Entry, accepted: bool, now: float) -> None:
        """The registry's decision on an owner's admission; stale decisions are ignored."""
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
            self.effects.append((STOP, entry, None))

    def exited(self, entry: Entry, now: float) -> None:
        """The owner physically exited and its outcome is committed."""
        slot = self.slots.get(entry.key)
        if slot is None or slot.owner is not entry:
            return
        self._ended(entry)
        self._advance(slot, now)

    def remove(self, entry_id: int, now: float) -> Entry | None:
        """Take queued or held work, or a joiner, out at once; return it if found."""
        entry = self.queued.pop(entry_id, None)
        if entry is not None:
            slot = self.slots[entry.key]
            slot.queue.remove(entry)
            self.pending -= 1
            self._reject(entry, REMOVED_FROM_QUEUE)
            self._place_held(now)
            return entry
        entry = self.held.pop(entry_id, None)
        if entry is not None:
            slot = self.slots[entry.key]
            slot.held.remove(entry)
            if not slot.held:
                del self._held_slots[slot.key]
            self._reject(entry, REMOVED_FROM_QUEUE)
            self._drop_if_empty(slot)
            self._place_held(now)
            return entry
        entry = self.joiners.pop(entry_id, None)
        if entry is not None:
            assert entry.target is not None
            assert entry.target.followers is not None
            entry.target.followers.remove(entry)
            self.effects.append((DETACH, entry, REMOVED_FROM_QUEUE))
            return entry
        return None

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

    def _missing_budget(self, slot: Slot, entry: Entry) -> str | None:
        """The rejection kind of the first full budget ``entry`` needs, or ``None``."""
        if entry.policy is AdmissionPolicy.REPLACE and slot.queue:
            return None  # replacing an existing head needs no budget
        if entry.policy is AdmissionPolicy.QUEUE and len(slot.queue) >= self.max_slot_queue:
            return QUEUE_FULL
        if self.max_total_pending is not None and self.pending >= self.max_total_pending:
            return RESOURCE_LIMIT
        return None

    def _start(self, slot: Slot, entry: Entry, now: float, reason: str) -> None:
        slot.owner = entry
        slot.status = SlotStatus.ADMITTING
        slot.since = now
        self.effects.append((SUBMITTED, entry, reason))
        self.effects.append((ADMIT, entry, None))

    def _place(self, slot: Slot, entry: Entry, now: float) -> None:
        if entry.policy is AdmissionPolicy.REPLACE:
            if slot.queue:
                displaced = slot.queue[0]
                slot.queue[0] = entry
                del self.queued[displaced.id]
                self.queued[entry.id] = entry
                self.effects.append((SUBMITTED, entry, "replacing the queue head"))
                self._reject(displaced, SUPERSEDED)
            else:
                slot.queue.append(entry)
                self.queued[entry.id] = entry
                self.pending += 1
                self.effects.append((SUBMITTED, entry, "queue head, replacing the owner"))
            if slot.status is SlotStatus.RUNNING:
                self._set_status(slot, SlotStatus.TERMINATING, now, "running->terminating")
                assert slot.owner is not None
                self.effects.append((STOP, slot.owner, None))
            elif slot.status is SlotStatus.ADMITTING:
                self._set_status(slot, SlotStatus.TERMINATING, now, "admitting->terminating")
        else:
            slot.queue.append(entry)
            self.queued[entry.id] = entry
            self.pending += 1
            self.effects.append((SUBMITTED, entry, "queued"))

    def _hold(self, slot: Slot, entry: Entry) -> None:
        if self.max_waiters is not None and self.waiting >= self.max_waiters:
            self._reject(entry, RESOURCE_LIMIT)
            return
        slot.held.append(entry)
        self.held[entry.id] = entry
        self._held_slots[slot.key] = slot
        entry.seq = self._held_count
        self._held_count += 1
        self.effects.append((SUBMITTED, entry, "held"))

    def _join(self, slot: Slot, entry: Entry) -> None:
        if self.max_waiters is not None and self.waiting >= self.max_waiters:
            self._reject(entry, RESOURCE_LIMIT)
            return
        target = slot.queue[-1] if slot.queue else slot.owner
        assert target is not None
        entry.target = target
        if target.followers is None:
            target.followers = []
        target.followers.append(entry)
        self.joiners[entry.id] = entry
        self.effects.append((SUBMITTED, entry, f"joined #{int(target.id)}"))
        self.effects.append((JOIN, entry, target))

    def _reject(self, entry: Entry, kind: str) -> None:
        self.effects.append((REJECT, entry, kind))
        self._ended(entry)

    def _ended(self, entry: Entry) -> None:
        """``entry`` will never run (again): release the joiners that follow it."""
        if entry.followers:
            for joiner in entry.followers:
                del self.joiners[joiner.id]
            entry.followers = None

    def _set_status(self, slot: Slot, status: SlotStatus, now: float, reason: str) -> None:
        slot.status = status
        slot.since = now
        assert slot.owner is not None
        self.effects.append((TRANSITION, slot.owner, reason))

    def _advance(self, slot: Slot, now: float) -> None:
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
            self._start(slot, entry, now, "admitting: next in queue")
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
            best: Entry | None = None
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

    def _unhold_head(self, slot: Slot) -> Entry:
        entry = slot.held.popleft()
        del self.held[entry.id]
        if not slot.held:
            del self._held_slots[slot.key]
        return entry

    def _drop_if_empty(self, slot: Slot) -> None:
        if slot.owner is None and not slot.queue and not slot.held:
            self.slots.pop(slot.key, None)
