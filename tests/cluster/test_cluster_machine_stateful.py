"""The cluster slot machine under random keeper reports: a Hypothesis state machine.

No server and no trio. The test plays the lease keeper (a small model of what the
server holds for this process: the asked submissions, the queued ones, one lease per
slot) and the registry, and feeds the machine only reports the keeper could send: an
answer per asked submission, grants of queued work while the slot's lease is free
(claimed, or handed over by the server and pushed: reported when the message arrives,
or never when the work was withdrawn meanwhile, whose withdrawal frees the lease),
lost leases, stop requests, room, outages, outcomes of followed work. After every step
it checks the local machine's invariants (the structures agree, held work is FIFO, the
budgets hold, deadlines are kept, every submission ends at most once) and the cluster
ones (at most one lease-holding owner per slot in this process); at the end it drains
and checks that every submission ended exactly once.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trio_taskvisor._clusterslots import (
    Ask,
    ClusterSlotMachine,
    Follow,
    FollowerDone,
    GiveBack,
    LoseLease,
    LostUnstarted,
    Release,
    Unfollow,
    Withdraw,
)
from trio_taskvisor._outcome import OutcomeKind, RejectionKind, TaskOutcome
from trio_taskvisor._slots import Admit, Detach, Entry, Join, Reject, Stop
from trio_taskvisor._slotstore import (
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
from trio_taskvisor._spec import AdmissionPolicy

KEYS = ("a", "b", "c")
QUEUING = (AdmissionPolicy.QUEUE, AdmissionPolicy.REPLACE)  # the store queues only these
POLICIES = tuple(AdmissionPolicy)
OTHER = "other:2:0000000b"
ENDS = ("reject", "admit", "join", "follow", "lost")  # the ways a submission is placed or ends
STORE_REJECTIONS = (
    RejectionKind.SLOT_BUSY,
    RejectionKind.QUEUE_FULL,
    RejectionKind.SUPERSEDED,
    RejectionKind.STORE_UNAVAILABLE,
)


class ClusterMachineModel(RuleBasedStateMachine):
    """``ClusterSlotMachine`` driven as the controller drives it, by a model keeper."""

    def __init__(self) -> None:
        super().__init__()
        self.m: ClusterSlotMachine[None] | None = None
        self.ids = itertools.count(1)
        self.now = 0.0
        self.entries: dict[int, Entry[None]] = {}
        self.log: dict[int, list[str]] = {}
        # the keeper's view of the server
        self.asked: dict[int, Entry[None]] = {}  # submissions awaiting their answer
        self.queued: dict[int, Entry[None]] = {}  # in the cluster queue
        self.lease: dict[str, int] = {}  # slot -> the task id holding its lease
        self.pushed: dict[int, Entry[None]] = {}  # granted on the server, message on its way
        self.lost: set[int] = set()  # owners whose lease was reported lost
        self.follows: dict[int, Entry[None]] = {}  # joiners of remote work
        self.reasons: dict[int, str] = {}  # rejections reported with words of their own
        self.available = True
        # the registry
        self.awaiting: set[int] = set()
        self.accepted: set[int] = set()
        self.closed = False

    @initialize(
        max_slot_queue=st.integers(1, 3),
        max_total_pending=st.none() | st.integers(1, 4),
        max_slots=st.none() | st.integers(1, 3),
        max_waiters=st.none() | st.integers(1, 4),
    )
    def setup(
        self,
        max_slot_queue: int,
        max_total_pending: int | None,
        max_slots: int | None,
        max_waiters: int | None,
    ) -> None:
        self.m = ClusterSlotMachine(
            max_slot_queue=max_slot_queue,
            max_total_pending=max_total_pending,
            max_slots=max_slots,
            max_waiters=max_waiters,
        )

    @property
    def machine(self) -> ClusterSlotMachine[None]:
        assert self.m is not None
        return self.m

    # -- carrying out what the machine asks ----------------------------------------------

    def drain(self) -> None:
        """Carry out effects, then requests to the keeper, as the controller does."""
        m = self.machine
        while m.effects or m.extra:
            effects, m.effects = m.effects, []
            for effect in effects:
                match effect:
                    case Admit(entry):
                        self.log[entry.id].append("admit")
                        self.awaiting.add(entry.id)
                    case Reject(entry, _, reason):
                        self.log[entry.id].append("reject")
                        assert reason == self.reasons.pop(entry.id, None)
                    case Join(entry, _):
                        self.log[entry.id].append("join")
                    case Detach(entry, _):
                        self.log[entry.id].append("detach")
                    case Stop(entry):
                        self.log[entry.id].append("stop")
                    case _:
                        pass  # Submitted, Transition, RemoveRequested: observability
            extra, m.extra = m.extra, []
            for request in extra:
                match request:
                    case Ask(entry):
                        self.asked[entry.id] = entry
                    case Withdraw(entry, _):
                        self.give_back(entry.key, entry.id)
                    case Release(entry):
                        self.give_back(entry.key, entry.id)
                    case LoseLease(entry, _):
                        self.log[entry.id].append("forced")
                    case LostUnstarted(entry, _):
                        self.log[entry.id].append("lost")
                    case Follow(entry, _):
                        self.log[entry.id].append("follow")
                        self.follows[entry.id] = entry
                    case Unfollow(entry):
                        del self.follows[entry.id]

    def give_back(self, key: str, task_id: int) -> None:
        """A withdrawal or release reached the server: it holds nothing of ``task_id``."""
        self.asked.pop(task_id, None)
        self.queued.pop(task_id, None)
        self.pushed.pop(task_id, None)  # the keeper ignores the message that comes later
        if self.lease.get(key) == task_id:
            del self.lease[key]

    def report(self, report: Report) -> None:
        notice = self.machine.report(report, self.now)
        match notice:
            case GiveBack(slot, task_id):
                self.give_back(slot, task_id)
            case FollowerDone(entry, _):
                self.log[entry.id].append("followed")
            case _:
                pass  # events and fence tokens
        self.drain()

    def grantable(self, key: str) -> bool:
        """Whether the server may give ``key``'s lease to this process's work now: when
        no work of this process holds it (a next owner granted while a lost owner still
        runs, which lost its own lease too, is replaced by a later grant, and ends
        ``LEASE_LOST`` without running)."""
        return key not in self.lease

    def grant(self, entry: Entry[None]) -> None:
        self.lease[entry.key] = entry.id
        self.report(Owner(entry.key, entry.id, 100 + entry.id))

    @staticmethod
    def pick(items: dict[int, Entry[None]], index: int) -> Entry[None] | None:
        if not items:
            return None
        return list(items.values())[index % len(items)]

    # -- callers ------------------------------------------------------------------------------

    @rule(
        key=st.sampled_from(KEYS),
        policy=st.sampled_from(POLICIES),
        wait=st.booleans(),
        timeout=st.none() | st.none() | st.sampled_from([0.0, 2.0, 5.0]),
    )
    def submit(self, key: str, policy: AdmissionPolicy, wait: bool, timeout: float | None) -> None:
        task_id = next(self.ids)
        entry: Entry[None] = Entry(task_id, key, policy, wait=wait, timeout=timeout)
        entry.deadline = self.now + timeout if timeout is not None else entry.deadline
        self.entries[task_id] = entry
        self.log[task_id] = []
        self.machine.submit(entry, self.now)  # as the controller's _take_in does
        if timeout is not None:
            self.machine.track_deadline(entry, self.now)
        self.drain()

    @rule(index=st.integers(0, 31), go=st.integers(0, 2))
    def remove(self, index: int, go: int) -> None:
        if self.entries and go == 0:
            self.machine.remove(list(self.entries)[index % len(self.entries)], self.now)
            self.drain()

    @rule(key=st.sampled_from(KEYS), go=st.integers(0, 3))
    def cancel_slot(self, key: str, go: int) -> None:
        if go == 0:
            self.machine.withdraw_slot(key, self.now)
            self.drain()

    @rule()
    def time_passes(self) -> None:
        self.now += 1.0
        self.machine.expire(self.now)
        self.drain()

    @rule(go=st.integers(0, 29))
    def close(self, go: int) -> None:
        if go == 0 and not self.closed:
            self.closed = True
            self.machine.close()
            self.drain()

    # -- the keeper's reports -------------------------------------------------------------

    @precondition(lambda self: bool(self.asked))
    @rule(
        index=st.integers(0, 15),
        answer=st.integers(0, 7),
        kind=st.sampled_from(STORE_REJECTIONS),
        local=st.booleans(),
        error=st.booleans(),
    )
    def answer_ask(
        self, index: int, answer: int, kind: RejectionKind, local: bool, error: bool
    ) -> None:
        """The keeper answers one asked submission with one of the answers the server
        may give it (the lease only while it is free, a queue only for QUEUE and
        REPLACE, a join only for JOIN, ``Full`` only for wait-mode work), or (``error``)
        rejects it with the server's error as its reason: the reason reaches the
        rejection."""
        entry = self.pick(self.asked, index)
        if entry is None:
            return
        key, task_id = entry.key, entry.id
        answers = ["rejected"]
        if self.grantable(key) and not self.queued_in(key):
            answers += ["owner", "owner"]
        if entry.policy in QUEUING:
            answers += ["queued", "queued"]
        if entry.policy is AdmissionPolicy.JOIN:
            answers += ["joined", "joined"]
        if entry.wait:
            answers += ["full", "full"]
        del self.asked[task_id]
        match answers[answer % len(answers)]:
            case "owner":
                self.grant(entry)
            case "queued":
                self.queued[task_id] = entry
                self.report(Queued(key, task_id, None))
            case "joined":
                holder = self.lease.get(key)
                if local and holder is not None:
                    target = f"me:1:0000000a/{holder}"
                    self.report(Joined(key, task_id, target, holder, f"me:1:0000000a#{holder}"))
                else:
                    self.report(Joined(key, task_id, f"{OTHER}/9", None, f"{OTHER}#9"))
            case "full":
                self.report(Full(key, task_id, "cluster queue is full"))
            case _ if error:
                self.reasons[task_id] = "slot store call failed: WrongTypeError: ..."
                self.report(
                    Rejected(key, task_id, RejectionKind.STORE_UNAVAILABLE, self.reasons[task_id])
                )
            case _:
                self.report(Rejected(key, task_id, kind))

    def queued_in(self, key: str) -> bool:
        return any(e.key == key for e in self.queued.values())

    @precondition(lambda self: bool(self.queued))
    @rule(index=st.integers(0, 15))
    def grant_queued(self, index: int) -> None:
        """The head of a slot's cluster queue takes the free lease (a claim)."""
        entry = self.pick(self.queued, index)
        if entry is None or not self.grantable(entry.key):
            return
        head = next(e for e in self.queued.values() if e.key == entry.key)
        del self.queued[head.id]
        self.grant(head)

    @precondition(lambda self: bool(self.queued))
    @rule(index=st.integers(0, 15))
    def hand_over(self, index: int) -> None:
        """The server hands the free lease to the head of a slot's cluster queue (a
        release gave it back) and pushes the grant; the message is on its way."""
        entry = self.pick(self.queued, index)
        if entry is None or not self.grantable(entry.key):
            return
        head = next(e for e in self.queued.values() if e.key == entry.key)
        del self.queued[head.id]
        self.lease[head.key] = head.id
        self.pushed[head.id] = head

    @precondition(lambda self: bool(self.pushed))
    @rule(index=st.integers(0, 15))
    def grant_arrives(self, index: int) -> None:
        """A pushed grant's message arrives (or the next claim or renewal finds it)."""
        entry = self.pick(self.pushed, index)
        if entry is not None:
            del self.pushed[entry.id]
            self.report(Owner(entry.key, entry.id, 100 + entry.id))

    @precondition(lambda self: bool(self.queued))
    @rule(index=st.integers(0, 15))
    def supersede_queued(self, index: int) -> None:
        """Another process's REPLACE displaced queued work (its head)."""
        entry = self.pick(self.queued, index)
        if entry is not None:
            del self.queued[entry.id]
            self.report(Rejected(entry.key, entry.id, RejectionKind.SUPERSEDED))

    @precondition(lambda self: bool(self.lease))
    @rule(index=st.integers(0, 3))
    def lose_lease(self, index: int) -> None:
        key = sorted(self.lease)[index % len(self.lease)]
        if self.lease[key] in self.pushed:
            return  # the keeper keeps no deadline for a grant it has not heard of
        task_id = self.lease.pop(key, None)
        if task_id is not None:
            self.lost.add(task_id)
            self.report(LeaseLost(key, task_id, 100 + task_id, "lease expired"))

    @precondition(lambda self: bool(self.lease))
    @rule(index=st.integers(0, 3), mine=st.booleans())
    def remote_stop(self, index: int, mine: bool) -> None:
        key = sorted(self.lease)[index % len(self.lease)]
        task_id = self.lease.get(key)
        if task_id is not None and task_id not in self.pushed:
            self.report(RemoteStop(key, task_id, "me:1:0000000a" if mine else OTHER))

    @rule(key=st.sampled_from(KEYS), go=st.integers(0, 2))
    def room(self, key: str, go: int) -> None:
        if go == 0:
            self.report(Room(key))

    @rule(go=st.integers(0, 3))
    def outage(self, go: int) -> None:
        if go:
            return
        self.available = not self.available
        self.report(StoreRecovered() if self.available else StoreUnavailable())

    @precondition(lambda self: bool(self.follows))
    @rule(index=st.integers(0, 15))
    def followed_outcome(self, index: int) -> None:
        entry = self.pick(self.follows, index)
        if entry is not None:
            del self.follows[entry.id]
            self.report(FollowedOutcome(entry.id, TaskOutcome(OutcomeKind.COMPLETED)))

    # -- the registry -----------------------------------------------------------------------

    @precondition(lambda self: bool(self.awaiting))
    @rule(index=st.integers(0, 15), accept=st.booleans())
    def decide(self, index: int, accept: bool) -> None:
        if self.awaiting:
            task_id = sorted(self.awaiting)[index % len(self.awaiting)]
            self.awaiting.discard(task_id)
            if accept:
                self.accepted.add(task_id)
            self.machine.admitted(self.entries[task_id], accept, self.now)
            self.drain()

    @precondition(lambda self: bool(self.accepted))
    @rule(index=st.integers(0, 15))
    def exit(self, index: int) -> None:
        if self.accepted:
            task_id = sorted(self.accepted)[index % len(self.accepted)]
            self.accepted.discard(task_id)
            self.machine.exited(self.entries[task_id], self.now)
            self.drain()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        if self.m is None:
            return
        self.structures_agree()
        self.one_lease_holder_per_slot()
        self.held_work_is_fifo()
        self.budgets_hold()
        self.deadlines_are_kept()
        self.every_submission_ends_at_most_once()

    def structures_agree(self) -> None:
        m = self.machine
        assert m.queued == {e.id: e for s in m.slots.values() for e in s.queue}
        assert m.pending == len(m.queued)
        assert m.held == {e.id: e for s in m.slots.values() for e in s.held}
        assert m.asking == {e.id: e for s in m.slots.values() for e in (s.asking or {}).values()}
        owners = [s.owner.id for s in m.slots.values() if s.owner is not None]
        granted = [s.granted.id for s in m.slots.values() if s.granted is not None]
        places = [*owners, *granted, *m.queued, *m.held, *m.asking, *m.joiners]
        assert len(places) == len(set(places)), "a submission is in two places"
        for key, slot in m.slots.items():
            assert slot.key == key
            assert all(e.key == key for e in [*slot.queue, *slot.held])
            has_work = slot.owner or slot.queue or slot.held or slot.asking or slot.granted
            assert has_work, f"slot {key!r} is kept without work"
            assert slot.status is not None, f"slot {key!r} has work but no status"

    def one_lease_holder_per_slot(self) -> None:
        """At most one owner per slot whose lease is held: a second one only when the
        first lost its lease and still runs."""
        m = self.machine
        for key, slot in m.slots.items():
            holders = [
                e for e in (slot.owner, slot.granted) if e is not None and e.id not in self.lost
            ]
            assert len(holders) <= 1, f"slot {key!r} has two lease holders: {holders}"
            if slot.granted is not None:
                assert slot.owner is not None
                assert slot.owner.id in self.lost
        for task_id, entry in m.owners.items():
            assert entry.id == task_id

    def held_work_is_fifo(self) -> None:
        for key, slot in self.machine.slots.items():
            seqs = [e.seq for e in slot.held]
            assert seqs == sorted(seqs), f"held work of {key!r} out of order"
            assert all(e.wait for e in slot.held)

    def budgets_hold(self) -> None:
        m = self.machine
        assert m.max_slots is None or len(m.slots) <= m.max_slots
        assert m.max_total_pending is None or m.pending <= m.max_total_pending
        assert m.max_waiters is None or m.waiting <= m.max_waiters

    def deadlines_are_kept(self) -> None:
        m = self.machine
        for entry in [*m.queued.values(), *m.held.values()]:
            assert entry.deadline > self.now, f"{entry} still waits past its deadline"

    def every_submission_ends_at_most_once(self) -> None:
        for task_id, tags in self.log.items():
            ends = [tag for tag in tags if tag in ENDS]
            assert len(ends) <= 1, f"#{task_id}: {tags}"
            if "follow" in tags:
                assert tags.count("followed") + tags.count("detach") <= 1, f"#{task_id}: {tags}"

    def teardown(self) -> None:
        """Drain: close, let every owner be decided and exit; each submission then ended
        exactly once, and the keeper was told to give back everything."""
        if self.m is None:
            return
        m = self.machine
        if not self.closed:
            self.closed = True
            m.close()
            self.drain()
        assert (m.asking, m.queued, m.held) == ({}, {}, {})
        while self.awaiting or self.accepted:
            for _ in sorted(self.awaiting):
                self.decide(0, True)
            for _ in sorted(self.accepted):
                self.exit(0)
        assert m.slots == {}
        assert self.follows == {}
        assert self.asked == self.queued == self.pushed == {}
        assert self.lease == {}, "a lease was never given back"
        for task_id, tags in self.log.items():
            ends = [tag for tag in tags if tag in ENDS]
            assert len(ends) == 1, f"#{task_id} ended {len(ends)} times: {tags}"
            if ends == ["follow"]:
                assert tags.count("followed") + tags.count("detach") == 1, f"#{task_id}: {tags}"


ClusterMachineModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
test_cluster_slot_machine = ClusterMachineModel.TestCase
