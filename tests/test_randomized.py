"""Randomized operation sequences against a real supervisor, in virtual time.

Hypothesis draws a small configuration (grace, budgets, capacities) and a sequence of
operations: ``add`` / ``add_nowait`` / ``add_batch`` / ``remove`` / ``cancel`` (by id and
by name) / ``submit`` and ``submit_nowait`` with every policy, ``wait`` and a
``queue_timeout`` / ``run_in_slot`` (in a background task, possibly cancelled) /
``cancel_slot`` and ``wait_slot_idle`` / advancing time / shutdown (inline or in the
background) / ``wait_idle``. Task bodies succeed, fail, raise
``FatalError`` or ``TaskCancelled``, hang, defer cancellation, ignore it (their own
shield), swallow it and return late, or make a keyed call themselves (into their own
slot that must raise ``DeadlockError``); any of them may carry an attempt timeout and a
restart policy. Two property tests share the harness: one over the whole API, one
focused on two contended slots; a ``slow`` variant runs many more, longer sequences.

Each example runs with ``trio.run(..., clock=MockClock(autojump_threshold=0))`` and a
trio ``Instrument`` that checks the supervisor's observable state after every task
step, so invariants hold "at every instant", not just between operations:

* at most one body per slot and per name runs at any time (each body counts itself
  in and out, ``finally`` included, so a force-aborted body that runs on still counts),
  and a body running in a slot is that slot's owner in ``controller_snapshot()``;
* budgets are never exceeded (slot queues, ``max_total_pending``, ``max_slots``,
  ``max_waiters``, ``max_registered_tasks``, ``max_concurrent``);
* ``list()``, ``alive_snapshot()``, ``statistics()`` and ``controller_snapshot()`` agree
  with each other and with the bodies actually running;
* every accepted submission ends with exactly one outcome, consistent with what its
  body did; a refused or rejected submission's body never runs, and no body starts
  after its outcome was committed; its placement is set and agrees with the outcome;
* QUEUE work of one slot starts in submission order (for submissions whose order the
  test knows: those of the main task; concurrent callers race for intake);
* ``cancel()`` returns only once the outcome is committed; one claim per stop;
* with events (no drops): one ``TASK_ADDED`` and one ``TASK_FINISHED`` per registered
  task agreeing with its outcome, one terminal event per attempt (but none for an
  attempt still running when its task was forced), one attempt per body, nothing after
  ``TASK_REMOVED`` but one ``FORCED_TASK_EXITED`` per forced task, ``CANCELLED`` within
  grace and ``FORCE_ABORTED`` at the deadline;
* after shutdown nothing is registered, alive, pending or tracked.

Operations are small frozen values with short reprs, so a failing example shrinks to a
readable script; ``run_case(config, ops)`` replays one (trio's scheduler is seeded by
Hypothesis inside ``@given``, so examples are reproducible there).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    DeadlockError,
    EventKind,
    FatalError,
    GraceExceededError,
    OutcomeError,
    OutcomeKind,
    Placement,
    RejectionKind,
    ResourceLimitError,
    SlotStatus,
    Supervisor,
    SupervisorClosedError,
    SupervisorConfig,
    TaskCancelled,
    TaskContext,
    TaskFailure,
    TaskId,
    TaskNameInUseError,
    TaskOutcome,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

# -- the vocabulary ------------------------------------------------------------------------

NAMES = ("a", "b", "c")
SUBMIT_NAMES = ("p", "q", "a")  # "a" may clash with added work
SLOTS = ("s1", "s2")
BODIES = ("ok", "fail", "fatal", "hang", "defer", "ignore", "late", "quit", "nest")
RESTARTS = ("once", "retry", "periodic")
POLICIES = tuple(AdmissionPolicy)
BACKOFF = BackoffPolicy.constant(0.5)
ATTEMPT_ENDS = frozenset(
    {
        EventKind.ATTEMPT_SUCCEEDED,
        EventKind.ATTEMPT_FAILED,
        EventKind.ATTEMPT_TIMED_OUT,
        EventKind.ATTEMPT_CANCELLED,
    }
)
# Virtual seconds: bounds every example, so a hang fails with TooSlowError instead.
TIME_LIMIT = 1000.0


@attrs.frozen(repr=False)
class Work:
    """What one task does: its body, a duration, its restart policy and timeout."""

    body: str = "ok"
    dur: float = 0.5
    restart: str = "once"
    timeout: float | None = None

    def __repr__(self) -> str:
        text = f"{self.body}({self.dur})"
        if self.restart != "once":
            text += f"/{self.restart}"
        if self.timeout is not None:
            text += f"/t{self.timeout}"
        return text


@attrs.frozen(repr=False)
class Config:
    """The supervisor configuration of one example."""

    grace: float = 1.0
    max_concurrent: int | None = None
    max_registered_tasks: int | None = None
    command_capacity: int = 64
    queue_capacity: int = 64
    max_slot_queue: int = 2
    max_total_pending: int | None = None
    max_slots: int | None = None
    max_waiters: int | None = None
    events: bool = False

    def __repr__(self) -> str:
        fields = [
            f"{a.name}={getattr(self, a.name)!r}"
            for a in attrs.fields(Config)
            if getattr(self, a.name) != a.default
        ]
        return f"Config({', '.join(fields)})"

    def build(self) -> SupervisorConfig:
        return SupervisorConfig(
            grace=self.grace,
            max_concurrent=self.max_concurrent,
            max_registered_tasks=self.max_registered_tasks,
            command_capacity=self.command_capacity,
            random=random.Random(0),
            controller=ControllerConfig(
                queue_capacity=self.queue_capacity,
                max_slot_queue=self.max_slot_queue,
                max_total_pending=self.max_total_pending,
                max_slots=self.max_slots,
                max_waiters=self.max_waiters,
            ),
        )


@attrs.frozen(repr=False)
class Ref:
    """The ``index``-th waiter obtained so far (``w0``, ``w1``, ...), as a stop target.

    Taken modulo the number of waiters obtained; no waiter yet makes the op a no-op.
    """

    index: int

    def __repr__(self) -> str:
        return f"w{self.index}"


Target = Ref | str


@attrs.frozen
class Add:
    name: str
    work: Work
    nowait: bool = False


@attrs.frozen
class AddBatch:
    items: tuple[tuple[str, Work], ...]


@attrs.frozen
class Submit:
    name: str
    slot: str | None
    policy: AdmissionPolicy
    work: Work
    wait: bool = False
    nowait: bool = False
    queue_timeout: float | None = None


@attrs.frozen
class CancelSlot:
    slot: str
    background: bool = False


@attrs.frozen
class WaitSlotIdle:
    """``wait_slot_idle(slot)``, bounded: when it returns, the slot may hold nothing."""

    slot: str


@attrs.frozen
class RunInSlot:
    slot: str
    policy: AdmissionPolicy
    work: Work
    cancel_after: float | None = None


@attrs.frozen
class Remove:
    target: Target


@attrs.frozen
class Cancel:
    target: Target
    background: bool = False


@attrs.frozen
class Sleep:
    seconds: float


@attrs.frozen
class Shutdown:
    background: bool = False


@attrs.frozen
class Spawn:
    """Run an intake operation in a background task, concurrently with what follows."""

    op: Add | AddBatch | Submit


@attrs.frozen
class WaitIdle:
    """``wait_idle()``, bounded: when it returns, nothing may be registered or held."""


Op = (
    Add
    | AddBatch
    | Submit
    | RunInSlot
    | Remove
    | Cancel
    | CancelSlot
    | WaitSlotIdle
    | Sleep
    | Shutdown
    | WaitIdle
    | Spawn
)
queue_timeouts = st.sampled_from((None, None, None, 1.0, 0.0, 2.5))

# -- strategies (first choices are the simplest: they are what examples shrink to) --------

durations = st.sampled_from((0.5, 0.0, 1.0, 3.0))
works = st.builds(
    Work,
    body=st.sampled_from(BODIES),
    dur=durations,
    restart=st.sampled_from(RESTARTS),
    timeout=st.sampled_from((None, 1.5)),
)
finite_works = st.builds(
    Work,
    body=st.sampled_from(
        ("ok", "fail", "ok", "fatal", "defer", "ignore", "late", "quit", "nest", "hang")
    ),
    dur=durations,
    restart=st.sampled_from(("once", "retry", "once", "periodic")),
    timeout=st.sampled_from((None, 1.5)),
)
call_works = st.builds(
    Work, body=st.sampled_from(BODIES), dur=durations, timeout=st.sampled_from((None, 1.5))
)
names = st.sampled_from(NAMES)
refs = st.builds(Ref, st.integers(0, 3))
targets = st.one_of(refs, refs, names)


@st.composite
def submits(draw: st.DrawFn) -> Submit:
    policy = draw(st.sampled_from(POLICIES))
    has_wait = policy in (AdmissionPolicy.QUEUE, AdmissionPolicy.REPLACE)
    return Submit(
        name=draw(st.sampled_from(SUBMIT_NAMES)),
        slot=draw(st.sampled_from(("s1", "s1", "s2", None))),
        policy=policy,
        work=draw(works),
        wait=draw(st.booleans()) if has_wait else False,
        nowait=draw(st.booleans()),
        queue_timeout=draw(queue_timeouts) if has_wait else None,
    )


batch_item = st.tuples(st.sampled_from(("b", "c", "d")), works)
batch_items = st.lists(batch_item, min_size=1, max_size=3)
ops = st.one_of(
    st.builds(Add, names, works, st.booleans()),
    st.builds(Add, names, works, st.booleans()),
    submits(),
    submits(),
    submits(),
    submits(),
    st.builds(Sleep, st.sampled_from((0.5, 0.0, 1.0, 2.0, 5.0))),
    st.builds(Remove, targets),
    st.builds(Cancel, targets, st.booleans()),
    st.builds(
        RunInSlot,
        st.sampled_from(SLOTS),
        st.sampled_from(POLICIES),
        call_works,
        st.sampled_from((None, 0.5, 2.0)),
    ),
    st.builds(
        AddBatch,
        # Mostly distinct names: a repeated name rejects the whole batch.
        st.one_of(
            st.lists(batch_item, min_size=1, max_size=3, unique_by=lambda item: item[0]),
            batch_items,
        ).map(tuple),
    ),
    st.just(WaitIdle()),
    st.builds(Spawn, st.one_of(st.builds(Add, names, works), submits())),
    st.builds(CancelSlot, st.sampled_from(SLOTS), st.booleans()),
    st.builds(WaitSlotIdle, st.sampled_from(SLOTS)),
)


@st.composite
def keyed_submits(draw: st.DrawFn) -> Submit:
    """Submissions to two contended slots, mostly QUEUE work that ends by itself."""
    policy = draw(st.sampled_from((AdmissionPolicy.QUEUE, *POLICIES)))
    has_wait = policy in (AdmissionPolicy.QUEUE, AdmissionPolicy.REPLACE)
    return Submit(
        name=draw(st.sampled_from(("p", "q", "r"))),
        slot=draw(st.sampled_from(SLOTS)),
        policy=policy,
        work=draw(finite_works),
        wait=draw(st.booleans()) if has_wait else False,
        nowait=draw(st.booleans()),
        queue_timeout=draw(queue_timeouts) if has_wait else None,
    )


keyed_ops = st.one_of(
    keyed_submits(),
    keyed_submits(),
    keyed_submits(),
    keyed_submits(),
    st.builds(Spawn, keyed_submits()),
    st.builds(Sleep, st.sampled_from((0.5, 0.0, 1.0, 3.0))),
    st.builds(Remove, refs),
    st.builds(Cancel, refs, st.booleans()),
    st.builds(
        RunInSlot,
        st.sampled_from(SLOTS),
        st.sampled_from(POLICIES),
        call_works,
        st.sampled_from((None, 0.5, 2.0)),
    ),
    st.builds(CancelSlot, st.sampled_from(SLOTS), st.booleans()),
    st.builds(WaitSlotIdle, st.sampled_from(SLOTS)),
)


short_works = st.builds(
    Work,
    body=st.sampled_from(("ok", "fail", "quit", "defer")),
    dur=st.sampled_from((0.5, 1.0)),
)
queue_ops = st.one_of(
    st.builds(
        Submit,
        name=st.sampled_from(("p", "q", "r")),
        slot=st.sampled_from(SLOTS),
        policy=st.just(AdmissionPolicy.QUEUE),
        work=short_works,
        wait=st.booleans(),
        nowait=st.booleans(),
    ),
    st.builds(Sleep, st.sampled_from((0.5, 0.0, 1.0))),
    st.builds(Remove, refs),
)


@st.composite
def scripts(draw: st.DrawFn, max_size: int, ops: st.SearchStrategy[Op] = ops) -> list[Op]:
    """Operations, with at most one explicit shutdown, usually near the end.

    Drawn as a few concatenated lists: one list averages only ~5 elements, and each
    part can still shrink to nothing.
    """
    part = max(1, max_size // 3)
    script = [op for _ in range(3) for op in draw(st.lists(ops, max_size=part))]
    if draw(st.booleans()):
        at = max(0, len(script) - draw(st.integers(0, 5)))
        script.insert(at, Shutdown(draw(st.booleans())))
    return script


configs = st.builds(
    Config,
    grace=st.sampled_from((1.0, 0.0, 2.5)),
    max_concurrent=st.sampled_from((None, None, 1, 2)),
    max_registered_tasks=st.sampled_from((None, None, 2, 4)),
    command_capacity=st.sampled_from((64, 64, 1, 2)),
    queue_capacity=st.sampled_from((64, 64, 1, 2)),
    max_slot_queue=st.sampled_from((2, 2, 0, 1)),
    max_total_pending=st.sampled_from((None, None, 2, 1, 0)),
    max_slots=st.sampled_from((None, None, None, 3, 2, 1)),
    max_waiters=st.sampled_from((None, None, 2, 1, 0)),
    events=st.booleans(),
)

# -- the harness -------------------------------------------------------------------------


@attrs.define(eq=False)
class Sub:
    """One submission the test made, and what it observed about it."""

    token: int
    how: str  # add, add_nowait, batch, submit, submit_nowait, run_in_slot
    name: str | None
    slot: str | None  # controller slot; None for work added with add()
    policy: AdmissionPolicy | None
    work: Work
    waiter: TaskWaiter | None = None
    id: TaskId | None = None
    refused: bool = False  # the call raised (or never happened): the body must never run
    entered: bool = False
    returned: bool = False
    attempts: int = 0  # bodies entered
    withdrawn: bool = False  # a run_in_slot caller was cancelled and returned
    claims: int = 0  # True results of remove/cancel by id
    # Submitted by the main task: its intake order is the order of the operations.
    ordered: bool = True
    results: list[object] = attrs.Factory(list)  # run_in_slot: what the call ended with


class Violation(AssertionError):
    pass


class Harness:
    """The test's model of one run, and the invariant checks."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.sup: Supervisor | None = None
        self.nursery: trio.Nursery | None = None
        self.recorder = EventRecorder(queue_capacity=100_000) if config.events else None
        self.violations: list[str] = []
        self.tokens = itertools.count()
        self.subs: dict[int, Sub] = {}
        self.by_id: dict[TaskId, Sub] = {}
        self.refs: list[Sub] = []  # subs with a waiter, in the order they were obtained
        self.resolutions: dict[TaskId, list[TaskOutcome]] = defaultdict(list)
        self.body_by_name: Counter[str] = Counter()
        self.body_by_slot: Counter[str] = Counter()
        self.slot_body: dict[str, TaskId] = {}
        self.starts: dict[str, list[Sub]] = defaultdict(list)
        self.closing = False
        self.calls_in_flight = 0  # background intake calls not returned yet
        self.in_flight: Counter[str] = Counter()  # names of add/submit calls not returned yet
        self.shutdown_results: list[tuple[str, ...] | None] = []
        self.log: list[str] = []  # reprs of the operations applied so far

    # -- recording ---------------------------------------------------------------------

    def expect(self, condition: bool, message: str) -> None:
        if not condition and len(self.violations) < 20:
            # Where: virtual time, and the operation being applied (0-based).
            now = trio.current_time()
            self.violations.append(f"t={now:g} op {len(self.log) - 1}: {message}")

    def raise_violations(self) -> None:
        if self.violations:
            raise Violation("\n".join(self.violations))

    @contextmanager
    def flying(self, *names: str) -> Iterator[None]:
        """Mark an add/submit call in flight: its task may be listed before it returns."""
        self.in_flight.update(names)
        try:
            yield
        finally:
            self.in_flight.subtract(names)

    def new_sub(
        self,
        how: str,
        name: str | None,
        slot: str | None,
        policy: Any,
        work: Work,
        *,
        ordered: bool = True,
    ) -> Sub:
        sub = Sub(next(self.tokens), how, name, slot, policy, work, ordered=ordered)
        self.subs[sub.token] = sub
        return sub

    def accepted(self, sub: Sub, waiter: TaskWaiter) -> None:
        assert self.nursery is not None
        sub.waiter = waiter
        self.expect(sub.id in (None, waiter.id), f"{waiter} returned for body {sub.id}")
        sub.id = waiter.id
        known = self.by_id.get(waiter.id, sub)
        self.expect(known is sub, f"TaskId {waiter.id} handed out twice")
        self.by_id[waiter.id] = sub
        self.refs.append(sub)
        self.nursery.start_soon(self._watch, sub)

    async def _watch(self, sub: Sub) -> None:
        assert sub.waiter is not None
        outcome = await sub.waiter.wait()
        self.resolutions[sub.waiter.id].append(outcome)

    def spec(self, name: str, work: Work, sub: Sub) -> TaskSpec:
        args = (task_body, self, sub.token)
        if work.restart == "once":
            return TaskSpec.once(name, *args, timeout=work.timeout)
        if work.restart == "retry":
            return TaskSpec.restartable(
                name, *args, timeout=work.timeout, max_retries=1, backoff=BACKOFF
            )
        return TaskSpec.periodic(
            name, 1.0, *args, timeout=work.timeout, max_retries=1, backoff=BACKOFF
        )

    # -- bodies ------------------------------------------------------------------------

    def enter(self, token: int) -> None:
        ctx = current_context()
        sub = self.subs[token]
        where = f"body {ctx.name!r} ({ctx.id}, attempt {ctx.attempt})"
        self.expect(not sub.refused, f"{where} runs, but its submission was refused")
        # The actor checks for a stop in the same step in which it calls the body.
        self.expect(not ctx.cancel_requested, f"{where} began after a stop request")
        self.expect(not sub.withdrawn, f"{where} runs after its run_in_slot caller withdrew it")
        if sub.id is None:
            sub.id = ctx.id
            self.by_id[ctx.id] = sub
        self.expect(sub.id == ctx.id, f"{where} runs under the TaskId of {sub.id}")
        if sub.waiter is not None:
            try:
                outcome = sub.waiter.outcome_nowait()
            except trio.WouldBlock:
                pass
            else:
                self.expect(False, f"{where} starts after its outcome {outcome} was committed")
        expected_slot = sub.slot
        self.expect(ctx.slot == expected_slot, f"{where} sees slot {ctx.slot!r}")
        if not sub.entered:
            sub.entered = True
            if ctx.slot is not None:
                self.starts[ctx.slot].append(sub)
        sub.attempts += 1
        self.body_by_name[ctx.name] += 1
        self.expect(self.body_by_name[ctx.name] <= 1, f"two bodies named {ctx.name!r} run")
        if ctx.slot is not None:
            self.body_by_slot[ctx.slot] += 1
            self.expect(self.body_by_slot[ctx.slot] <= 1, f"two bodies own slot {ctx.slot!r}")
            self.slot_body[ctx.slot] = ctx.id

    def exit(self, name: str, slot: str | None) -> None:
        self.body_by_name[name] -= 1
        if slot is not None:
            self.body_by_slot[slot] -= 1

    # -- invariants at every instant -------------------------------------------------------

    def check_state(self) -> None:
        sup = self.sup
        assert sup is not None
        cfg = self.config
        infos = sup.list()
        alive = sup.alive_snapshot()
        stats = sup.statistics()
        snap = sup.controller_snapshot()
        expect = self.expect

        ids = [info.id for info in infos]
        listed = [info.name for info in infos]
        expect(ids == sorted(ids), f"list() not sorted by id: {ids}")
        expect(len(set(ids)) == len(ids), f"list() repeats an id: {ids}")
        expect(len(set(listed)) == len(listed), f"list() repeats a name: {listed}")
        expect(stats.registered == len(infos), f"registered={stats.registered}, list()={infos}")
        expect(stats.alive == len(alive), f"alive={stats.alive}, alive_snapshot()={alive}")
        expect(
            stats.running_attempts == len(alive),
            f"running_attempts={stats.running_attempts}, alive_snapshot()={alive}",
        )
        running = tuple(sorted(n for n, count in self.body_by_name.items() if count > 0))
        expect(alive == running, f"alive_snapshot()={alive}, bodies running: {running}")
        for info in infos:
            sub = self.by_id.get(info.id)
            if sub is None:
                # Unknown ids: run_in_slot work (auto-named) before its body starts, or
                # work whose add/submit call has not returned its waiter yet.
                expect(
                    info.name.startswith("task_body#") or self.in_flight[info.name] > 0,
                    f"list() shows unknown task {info}",
                )
                continue
            expect(not sub.refused, f"list() shows refused submission {info}")
            expect(info.slot == sub.slot, f"list() shows {info} for slot {sub.slot!r}")
            if sub.waiter is not None:
                expect(
                    not _resolved(sub.waiter),
                    f"list() shows {info}, whose outcome is already committed",
                )
            if info.state is TaskState.RUNNING:
                expect(info.name in alive, f"{info} is RUNNING but not alive")
            elif info.state is not TaskState.STOPPING:
                expect(info.name not in alive, f"{info} is alive")
            expect(info.attempt == sub.attempts, f"{info}, but {sub.attempts} bodies entered")
        if cfg.max_registered_tasks is not None:
            reserved = set(listed) | set(alive)
            expect(
                len(reserved) <= cfg.max_registered_tasks,
                f"{len(reserved)} names reserved, limit {cfg.max_registered_tasks}",
            )
        if cfg.max_concurrent is not None:
            expect(
                len(alive) <= cfg.max_concurrent,
                f"{len(alive)} attempts alive, max_concurrent={cfg.max_concurrent}",
            )
        # No upper bound from list(): a task forced (committed) in its permit wait counts
        # as waiting until its actor runs again.
        expect(
            stats.waiting_for_permit >= 0
            and (cfg.max_concurrent is not None or stats.waiting_for_permit == 0),
            f"waiting_for_permit={stats.waiting_for_permit}, list()={infos}",
        )

        slots = [view.slot for view in snap.slots]
        expect(slots == sorted(slots), f"snapshot slots not sorted: {slots}")
        depth = sum(view.queue_depth for view in snap.slots)
        expect(snap.total_queued == depth, f"total_queued={snap.total_queued}, depths={depth}")
        running_count = sum(1 for view in snap.slots if view.status is SlotStatus.RUNNING)
        expect(snap.running_count == running_count, f"running_count wrong: {snap}")
        if cfg.max_total_pending is not None:
            expect(
                snap.total_queued <= cfg.max_total_pending,
                f"total_queued={snap.total_queued} > {cfg.max_total_pending}",
            )
        if cfg.max_slots is not None:
            expect(len(snap.slots) <= cfg.max_slots, f"{len(snap.slots)} slots tracked: {snap}")
        if cfg.max_waiters is not None:
            held = sum(view.waiting for view in snap.slots)
            expect(held <= cfg.max_waiters, f"{held} held > max_waiters: {snap}")
        for view in snap.slots:
            # A REPLACE head ignores max_slot_queue, but only ever adds one to an empty queue.
            expect(
                view.queue_depth <= max(cfg.max_slot_queue, 1),
                f"slot {view.slot!r} queue_depth {view.queue_depth}",
            )
            # A tracked slot always has an owner: an idle slot starts its next work at
            # once, and a slot with nothing left is dropped from the state.
            expect(
                isinstance(view.status, SlotStatus) and isinstance(view.owner_id, int),
                f"slot without an owner kept in state: {view}",
            )
            expect(view.status_for >= 0, f"negative status_for: {view}")
        for slot, count in self.body_by_slot.items():
            if count > 0:
                owned = snap.slot(slot)
                owner = None if owned is None else owned.owner_id
                expect(
                    owner == self.slot_body[slot],
                    f"body {self.slot_body[slot]} runs in slot {slot!r} owned by {owner}",
                )

    # -- invariants at the end ---------------------------------------------------------------

    def check_after_shutdown(self, sup: Supervisor) -> None:
        expect = self.expect
        stats = sup.statistics()
        expect(sup.list() == (), f"tasks still listed after shutdown: {sup.list()}")
        expect(sup.alive_snapshot() == (), f"alive after shutdown: {sup.alive_snapshot()}")
        expect(stats.registered == 0, f"registered after shutdown: {stats}")
        expect(stats.running_attempts == 0, f"attempts after shutdown: {stats}")
        snap = sup.controller_snapshot()
        expect(snap.slots == (), f"slot state after shutdown: {snap}")
        expect(snap.total_queued == 0, f"queued after shutdown: {snap}")
        leftover = {k: v for k, v in self.body_by_name.items() if v}
        expect(not leftover, f"bodies still running after shutdown: {leftover}")
        for sub in self.refs:
            assert sub.waiter is not None
            expect(_resolved(sub.waiter), f"waiter {sub.waiter} pending after shutdown")

    def check_final(self) -> None:
        expect = self.expect
        for sub in self.subs.values():
            self._check_outcome(sub)
        for sub in self.refs:
            assert sub.waiter is not None
            seen = self.resolutions[sub.waiter.id]
            expect(len(seen) == 1, f"{sub.waiter} resolved {len(seen)} times: {seen}")
            if seen and _resolved(sub.waiter):
                expect(seen[0] is sub.waiter.outcome_nowait(), f"{sub.waiter} changed outcome")
        results = set(self.shutdown_results)
        expect(len(results) <= 1, f"shutdown callers got different results: {results}")
        # FIFO per slot: QUEUE work that ran started in submission order. Only the main
        # task's submissions have a known order: concurrent run_in_slot callers race
        # for intake (the controller's fast path), whatever their TaskIds.
        for slot, subs in self.starts.items():
            queued = [
                int(s.id or 0) for s in subs if s.policy is AdmissionPolicy.QUEUE and s.ordered
            ]
            expect(queued == sorted(queued), f"slot {slot!r} started QUEUE work as {queued}")
        if self.recorder is not None:
            self._check_events()

    def _check_outcome(self, sub: Sub) -> None:
        expect = self.expect
        if sub.how == "run_in_slot":
            expect(len(sub.results) == 1, f"run_in_slot {sub.token} ended {sub.results}")
            if not sub.results:
                return
            result = sub.results[0]
            if isinstance(result, TaskOutcome):
                outcome = result
                expect(not outcome.is_success, f"OutcomeError for a success: {outcome}")
            elif result in ("refused", "cancelled"):
                return
            else:
                outcome = TaskOutcome(OutcomeKind.COMPLETED, value=result)
        elif sub.waiter is None:
            expect(sub.refused, f"submission {sub} has no waiter but was not refused")
            expect(not sub.entered, f"refused submission {sub} ran")
            return
        else:
            if not _resolved(sub.waiter):
                return  # reported by check_after_shutdown
            outcome = sub.waiter.outcome_nowait()
        where = f"{sub.how} {sub.name or ''} {sub.id} {sub.work!r}: {outcome}"
        kind = outcome.kind
        expect(kind is not OutcomeKind.PANICKED, where)
        if sub.waiter is not None:
            self._check_placement(sub, sub.waiter.placement, outcome, where)
        expect((kind is OutcomeKind.REJECTED) == (outcome.rejection is not None), where)
        if kind is OutcomeKind.REJECTED:
            expect(not sub.entered, f"REJECTED but the body ran: {where}")
        if sub.how in ("add", "batch"):
            expect(kind is not OutcomeKind.REJECTED, f"add returned a rejected waiter: {where}")
        if sub.claims:
            expect(
                kind in (OutcomeKind.CANCELLED, OutcomeKind.FORCE_ABORTED)
                or outcome.rejection is RejectionKind.REMOVED_FROM_QUEUE,
                f"a stop was claimed, yet {where}",
            )
        expect(sub.claims <= 1, f"{sub.claims} callers claimed the stop of {where}")
        follower = sub.policy is AdmissionPolicy.JOIN and not sub.entered
        if follower:
            if kind is OutcomeKind.COMPLETED:
                value = outcome.value
                expect(
                    isinstance(value, tuple) and self.subs[value[1]].slot == sub.slot,
                    f"joiner completed with a value from elsewhere: {where}",
                )
            return
        if not sub.entered:
            expect(
                kind in (OutcomeKind.REJECTED, OutcomeKind.CANCELLED, OutcomeKind.FORCE_ABORTED),
                f"the body never ran, yet {where}",
            )
            return
        work = sub.work
        if kind is OutcomeKind.COMPLETED:
            expect(outcome.value == ("v", sub.token), f"wrong value: {where}")
            expect(work.restart != "periodic", f"periodic work completed: {where}")
            expect(sub.returned, f"COMPLETED but no attempt returned: {where}")
        elif kind is OutcomeKind.FATAL:
            expect(
                work.body == "fatal" and isinstance(outcome.error, FatalError), f"bad FATAL {where}"
            )
        elif kind is OutcomeKind.FAILED:
            expect(
                (work.body == "fail" and isinstance(outcome.error, TaskFailure))
                or (work.timeout is not None and isinstance(outcome.error, TimeoutError)),
                f"bad FAILED {where}",
            )

    def _check_placement(
        self, sub: Sub, placement: Placement | None, outcome: TaskOutcome, where: str
    ) -> None:
        """A resolved waiter has its placement, and it agrees with what happened."""
        expect = self.expect
        expect(placement is not None, f"resolved without a placement: {where}")
        if placement is Placement.REJECTED:
            expect(outcome.kind is OutcomeKind.REJECTED, f"placed REJECTED: {where}")
            expect(not sub.entered, f"placed REJECTED, yet the body ran: {where}")
        elif placement is Placement.JOINED:
            expect(sub.policy is AdmissionPolicy.JOIN, f"JOINED but not a JOIN: {where}")
            expect(not sub.entered, f"a joiner's body ran: {where}")
        if sub.how in ("add", "add_nowait", "batch") and outcome.kind is not OutcomeKind.REJECTED:
            expect(placement is Placement.OWNER, f"added work placed {placement}: {where}")
        if outcome.rejection in (RejectionKind.SLOT_BUSY, RejectionKind.QUEUE_FULL):
            expect(placement is Placement.REJECTED, f"rejected at intake, placed {placement}")
        if outcome.rejection is RejectionKind.SUPERSEDED:
            # A joiner of the displaced head shares its outcome and stays JOINED.
            expected = Placement.JOINED if sub.policy is AdmissionPolicy.JOIN else Placement.QUEUED
            expect(placement is expected, f"superseded, placed {placement}: {where}")

    def _check_events(self) -> None:
        assert self.recorder is not None
        assert self.sup is not None
        stats = self.sup.statistics()
        if stats.events_dropped:
            return  # events are best-effort; nothing to check when some were dropped
        expect = self.expect
        events = self.recorder.events
        seqs = [e.seq for e in events]
        expect(seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "event seq out of order")
        finished: dict[int, list[Any]] = defaultdict(list)
        added: Counter[int] = Counter()
        starting: Counter[int] = Counter()
        ended: Counter[int] = Counter()
        forced_exits: Counter[int] = Counter()
        removed: set[int] = set()
        first_seq: dict[tuple[EventKind, int], int] = {}
        for event in events:
            if event.task_id is None:
                continue
            task_id = int(event.task_id)
            first_seq.setdefault((event.kind, task_id), event.seq)
            if task_id in removed:
                # A task's events end with TASK_REMOVED, but for one FORCED_TASK_EXITED.
                expect(
                    event.kind is EventKind.FORCED_TASK_EXITED,
                    f"{task_id}: {event.kind.name} after TASK_REMOVED",
                )
            if event.kind is EventKind.TASK_FINISHED:
                finished[task_id].append(event)
            elif event.kind is EventKind.TASK_REMOVED:
                removed.add(task_id)
            elif event.kind is EventKind.FORCED_TASK_EXITED:
                forced_exits[task_id] += 1
            elif event.kind is EventKind.TASK_ADDED:
                added[task_id] += 1
            elif event.kind is EventKind.ATTEMPT_STARTING:
                starting[task_id] += 1
            elif event.kind in ATTEMPT_ENDS:
                ended[task_id] += 1
        for task_id, count in added.items():
            expect(count == 1, f"TASK_ADDED {count} times for {task_id}")
            expect(len(finished[task_id]) == 1, f"{task_id} added, finished {finished[task_id]}")
            forced = finished[task_id][0].outcome is OutcomeKind.FORCE_ABORTED
            # Every forced task has exited after the shutdown: one FORCED_TASK_EXITED each.
            expect(
                forced_exits[task_id] == int(forced),
                f"{task_id}: {forced_exits[task_id]} FORCED_TASK_EXITED, forced={forced}",
            )
        for task_id, count in starting.items():
            # Every attempt ends with exactly one terminal event, except a forced one still
            # running at the force (its events ended with TASK_REMOVED); no attempt starts
            # before its task was added.
            expect(
                ended[task_id] == count or (forced_exits[task_id] and ended[task_id] == count - 1),
                f"{task_id}: {count} attempts, {ended[task_id]} ends",
            )
            expect(
                first_seq.get((EventKind.TASK_ADDED, task_id), math.inf)
                < first_seq[(EventKind.ATTEMPT_STARTING, task_id)],
                f"{task_id} started an attempt before TASK_ADDED",
            )
            sub = self.by_id.get(TaskId(task_id))
            if sub is not None:
                expect(
                    sub.attempts == count,
                    f"{task_id}: {count} ATTEMPT_STARTING, {sub.attempts} bodies",
                )
        self._check_stop_timing(events, finished)
        for task_id, evs in finished.items():
            expect(added[task_id] == 1, f"{task_id} finished but never added")
            sub = self.by_id.get(TaskId(task_id))
            if sub is None or sub.waiter is None or not _resolved(sub.waiter):
                continue
            outcome = sub.waiter.outcome_nowait()
            event = evs[0]
            expect(
                event.outcome is outcome.kind
                and event.reason == outcome.reason
                and event.exit_code == outcome.exit_code,
                f"TASK_FINISHED {event} disagrees with {outcome}",
            )
        for sub in self.refs:
            assert sub.waiter is not None
            assert sub.id is not None
            if not _resolved(sub.waiter):
                continue
            outcome = sub.waiter.outcome_nowait()
            if outcome.kind is OutcomeKind.REJECTED:
                expect(not finished.get(sub.id), f"rejected {sub.waiter} got TASK_FINISHED")
            elif not finished.get(sub.id):
                # Only a joiner ends without being registered: it shares another's outcome.
                expect(
                    sub.policy is AdmissionPolicy.JOIN and not sub.entered,
                    f"{sub.waiter} ended {outcome} without TASK_FINISHED",
                )

    def _check_stop_timing(self, events: list[Any], finished: dict[int, list[Any]]) -> None:
        """Soft stop, grace, force: CANCELLED within grace, FORCE_ABORTED at the deadline."""
        expect = self.expect
        grace = self.config.grace
        shutdown = [e.time for e in events if e.kind is EventKind.SHUTDOWN_REQUESTED]
        removes: dict[int, list[float]] = defaultdict(list)
        for event in events:
            if event.kind is EventKind.TASK_REMOVE_REQUESTED and event.task_id is not None:
                removes[int(event.task_id)].append(event.time)
        for task_id, evs in finished.items():
            done = evs[0]
            starts = sum(
                1
                for e in events
                if e.seq < done.seq
                and e.task_id == task_id
                and e.kind is EventKind.ATTEMPT_STARTING
            )
            end_times = [
                e.time
                for e in events
                if e.seq < done.seq and e.task_id == task_id and e.kind in ATTEMPT_ENDS
            ]
            in_progress = starts - len(end_times)
            where = f"{done.name!r} ({task_id}) {done.outcome} at t={done.time:g}"
            asked = removes.get(task_id)
            if done.outcome is OutcomeKind.FORCE_ABORTED:
                expect(asked is not None, f"{where} without a stop request")
                if asked:
                    expect(done.time >= asked[0] + grace - 1e-9, f"{where}, asked at {asked}")
                if grace > 0:
                    # An attempt still ran at the deadline (or ended at that very instant:
                    # a tie between the exit and the force, either outcome is right).
                    expect(
                        in_progress == 1 or (bool(end_times) and end_times[-1] == done.time),
                        f"{where} with {in_progress} attempts in progress",
                    )
            else:
                # Every other outcome is committed once the last attempt has ended.
                expect(in_progress == 0, f"{where} with {in_progress} attempts in progress")
                if done.outcome is OutcomeKind.CANCELLED and asked:
                    latest = max([asked[-1], *(t for t in shutdown if t <= done.time)])
                    expect(done.time <= latest + grace + 1e-9, f"{where}, asked at {asked}")


def _resolved(waiter: TaskWaiter) -> bool:
    try:
        waiter.outcome_nowait()
    except trio.WouldBlock:
        return False
    return True


async def task_body(h: Harness, token: int) -> object:
    """A task body that does what ``Work`` says and counts itself in and out."""
    work = h.subs[token].work
    ctx = current_context()
    name, slot = ctx.name, ctx.slot
    h.enter(token)
    try:
        body = work.body
        if body == "ok":
            await trio.sleep(work.dur)
        elif body == "fail":
            await trio.sleep(work.dur)
            raise TaskFailure("boom", exit_code=3)
        elif body == "fatal":
            await trio.sleep(work.dur)
            raise FatalError("fatal", exit_code=4)
        elif body == "hang":
            await trio.sleep_forever()
        elif body == "defer":
            with ctx.defer_cancel():
                await trio.sleep(work.dur)
            await trio.lowlevel.checkpoint()
        elif body == "ignore":
            with trio.CancelScope(shield=True):
                await trio.sleep(work.dur)
            await trio.lowlevel.checkpoint()
        elif body == "late":
            try:
                await trio.sleep(work.dur)
            except trio.Cancelled:
                # Swallow the stop (or the timeout) and return late, after a cleanup.
                with trio.CancelScope(shield=True):
                    await trio.sleep(work.dur)
        elif body == "quit":
            await trio.sleep(work.dur)
            raise TaskCancelled("quit")
        else:
            assert body == "nest"
            await _nested_call(h, ctx, work)
        h.subs[token].returned = True
        return ("v", token)
    finally:
        h.exit(name, slot)


async def _nested_call(h: Harness, ctx: TaskContext, work: Work) -> None:
    """Make a keyed call from inside a body.

    Into the body's own slot it must raise ``DeadlockError`` (or be rejected); into
    another slot it is an ordinary call, unless it closes a cycle through permits.
    """
    slot = ctx.slot or "s2"
    inner = h.new_sub(
        "run_in_slot", None, slot, AdmissionPolicy.QUEUE, Work("ok", work.dur), ordered=False
    )
    try:
        value = await ctx.supervisor.run_in_slot(slot, task_body, h, inner.token)
    except DeadlockError as exc:
        # Into its own slot the call always closes a cycle; into another slot (from
        # added work) only through permits: every permit held by a body blocked in a
        # call while the call's work waits for one.
        permits = h.config.max_concurrent is not None and "waits for a permit" in str(exc)
        h.expect(
            slot == ctx.slot or permits, f"DeadlockError for a call from {ctx} into slot {slot!r}"
        )
        inner.withdrawn = True
        inner.results.append("refused")
    except OutcomeError as exc:
        inner.results.append(exc.outcome)
    except SupervisorClosedError:
        inner.refused = not inner.entered
        inner.results.append("refused")
    except trio.Cancelled:
        inner.withdrawn = True
        inner.results.append("cancelled")
        raise
    else:
        h.expect(slot != ctx.slot, f"{ctx} ran a call queued behind its own slot")
        h.expect(value == ("v", inner.token), f"nested call returned {value!r}")
        inner.results.append(value)


class StateChecker(trio.abc.Instrument):
    """Check the harness invariants after every task step."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        h = self.h
        if h.sup is None or h.violations:
            return
        try:
            h.check_state()
        except Exception as exc:  # pragma: no cover - reported as a violation
            h.violations.append(f"state check crashed: {exc!r}")


# -- running operations --------------------------------------------------------------------


async def apply(h: Harness, sup: Supervisor, op: Op, *, ordered: bool = True) -> None:
    """Run one operation, checking what its call returned."""
    assert h.nursery is not None
    closing = h.closing
    if isinstance(op, Spawn):
        h.calls_in_flight += 1
        h.nursery.start_soon(_spawned, h, sup, op.op)
        return
    intake_ok = "intake succeeded after shutdown began"
    if isinstance(op, Add):
        sub = h.new_sub("add_nowait" if op.nowait else "add", op.name, None, None, op.work)
        spec = h.spec(op.name, op.work, sub)
        try:
            if op.nowait:
                waiter = sup.add_nowait(spec)
            else:
                with h.flying(op.name):
                    waiter = await sup.add(spec)
        except (trio.WouldBlock, TaskNameInUseError, ResourceLimitError, SupervisorClosedError):
            sub.refused = True
        else:
            h.expect(not closing, f"{op}: {intake_ok}")
            h.accepted(sub, waiter)
            if not op.nowait:
                h.expect(
                    any(info.id == waiter.id for info in sup.list()) or _resolved(waiter),
                    f"{op}: add returned, but {waiter} is not registered",
                )
    elif isinstance(op, AddBatch):
        subs = [h.new_sub("batch", name, None, None, work) for name, work in op.items]
        specs = [h.spec(name, work, sub) for (name, work), sub in zip(op.items, subs, strict=True)]
        try:
            with h.flying(*(name for name, _ in op.items)):
                waiters = await sup.add_batch(specs)
        except (TaskNameInUseError, ResourceLimitError, SupervisorClosedError) as exc:
            for sub in subs:
                sub.refused = True
            if isinstance(exc, TaskNameInUseError):
                h.expect(exc.name in {name for name, _ in op.items}, f"{op}: raised {exc!r}")
        else:
            h.expect(not closing, f"{op}: {intake_ok}")
            for sub, waiter in zip(subs, waiters, strict=True):
                h.accepted(sub, waiter)
    elif isinstance(op, Submit):
        how = "submit_nowait" if op.nowait else "submit"
        slot = op.name if op.slot is None else op.slot
        sub = h.new_sub(how, op.name, slot, op.policy, op.work, ordered=ordered)
        request = ControllerSpec(
            h.spec(op.name, op.work, sub),
            op.policy,
            op.slot,
            op.wait,
            queue_timeout=op.queue_timeout,
        )
        try:
            if op.nowait:
                waiter = sup.submit_nowait(request)
            else:
                with h.flying(op.name):
                    waiter = await sup.submit(request)
        except (trio.WouldBlock, SupervisorClosedError):
            sub.refused = True
        else:
            h.expect(not closing, f"{op}: {intake_ok}")
            h.accepted(sub, waiter)
    elif isinstance(op, RunInSlot):
        sub = h.new_sub("run_in_slot", None, op.slot, op.policy, op.work, ordered=False)
        h.calls_in_flight += 1
        h.nursery.start_soon(_call_in_slot, h, sup, op, sub)
    elif isinstance(op, Remove | Cancel):
        target: TaskId | str
        sub_target: Sub | None = None
        if isinstance(op.target, Ref):
            if not h.refs:
                return
            sub_target = h.refs[op.target.index % len(h.refs)]
            assert sub_target.id is not None
            target = sub_target.id
        else:
            target = op.target
        if isinstance(op, Remove):
            claimed = await sup.remove(target)
            if sub_target is not None and claimed:
                sub_target.claims += 1
        elif op.background:
            h.nursery.start_soon(_cancel, h, sup, target, sub_target)
        else:
            await _cancel(h, sup, target, sub_target)
    elif isinstance(op, CancelSlot):
        if op.background:
            h.nursery.start_soon(_cancel_slot, h, sup, op.slot)
        else:
            await _cancel_slot(h, sup, op.slot)
    elif isinstance(op, WaitSlotIdle):
        quiet = not h.calls_in_flight
        with trio.move_on_after(3.0) as scope:
            await sup.wait_slot_idle(op.slot)
        if not scope.cancelled_caught and quiet:
            view = sup.controller_snapshot().slot(op.slot)
            h.expect(view is None, f"wait_slot_idle({op.slot!r}) returned with {view}")
    elif isinstance(op, Sleep):
        await trio.sleep(op.seconds)
    elif isinstance(op, WaitIdle):
        # Background intake calls may submit again as soon as it returns: check only
        # when none was in flight (only this task starts them).
        quiet = not h.calls_in_flight
        with trio.move_on_after(3.0) as scope:
            await sup.wait_idle()
        if not scope.cancelled_caught and quiet:
            stats = sup.statistics()
            h.expect(
                sup.list() == () and stats.alive == 0 and sup.controller_snapshot().slots == (),
                f"wait_idle() returned with {sup.list()}, {stats}, {sup.controller_snapshot()}",
            )
    else:
        assert isinstance(op, Shutdown)
        if op.background:
            h.nursery.start_soon(_shutdown, h, sup)
        else:
            await _shutdown(h, sup)
            h.check_after_shutdown(sup)


async def _spawned(h: Harness, sup: Supervisor, op: Op) -> None:
    try:
        await apply(h, sup, op, ordered=False)
    finally:
        h.calls_in_flight -= 1


async def _cancel(h: Harness, sup: Supervisor, target: TaskId | str, sub: Sub | None) -> None:
    claimed = await sup.cancel(target)
    if sub is not None:
        assert sub.waiter is not None
        if claimed:
            sub.claims += 1
        h.expect(_resolved(sub.waiter), f"cancel({target}) returned, but {sub.waiter} is pending")


async def _cancel_slot(h: Harness, sup: Supervisor, slot: str) -> None:
    """cancel_slot: on return, what it withdrew and the owner it stopped have outcomes."""
    assert h.sup is not None
    before = sup.controller_snapshot().slot(slot)
    count = await sup.cancel_slot(slot)
    h.expect(count >= 0, f"cancel_slot({slot!r}) returned {count}")
    if before is not None and count:
        owner = h.by_id.get(before.owner_id)
        if owner is not None and owner.waiter is not None:
            h.expect(
                _resolved(owner.waiter),
                f"cancel_slot({slot!r}) returned, but the owner {owner.waiter} is pending",
            )


async def _shutdown(h: Harness, sup: Supervisor) -> None:
    h.closing = True
    try:
        await sup.shutdown()
    except GraceExceededError as exc:
        h.shutdown_results.append(exc.stuck)
    else:
        h.shutdown_results.append(None)


async def _call_in_slot(h: Harness, sup: Supervisor, op: RunInSlot, sub: Sub) -> None:
    closing = h.closing
    try:
        await _call_in_slot_inner(h, sup, op, sub, closing)
    finally:
        h.calls_in_flight -= 1


async def _call_in_slot_inner(
    h: Harness, sup: Supervisor, op: RunInSlot, sub: Sub, closing: bool
) -> None:
    scope = trio.CancelScope() if op.cancel_after is None else trio.move_on_after(op.cancel_after)
    try:
        with scope:
            value = await sup.run_in_slot(
                op.slot, task_body, h, sub.token, policy=op.policy, timeout=op.work.timeout
            )
            h.expect(not closing, f"{op}: intake succeeded after shutdown began")
            sub.results.append(value)
            if op.policy is not AdmissionPolicy.JOIN:
                h.expect(value == ("v", sub.token), f"{op} returned {value!r}")
    except OutcomeError as exc:
        sub.results.append(exc.outcome)
    except SupervisorClosedError:
        sub.refused = not sub.entered
        sub.results.append("refused")
    if scope.cancelled_caught:
        sub.withdrawn = True
        sub.results.append("cancelled")
        if sub.id is not None:
            h.expect(
                all(info.id != sub.id for info in sup.list()),
                f"{op}: the cancelled caller left {sub.id} registered",
            )


async def _main(h: Harness, operations: Sequence[Op]) -> None:
    with trio.fail_after(TIME_LIMIT):
        async with trio.open_nursery() as nursery:
            h.nursery = nursery
            sup: Supervisor | None = None
            try:
                async with open_supervisor(
                    h.config.build(), subscribers=() if h.recorder is None else (h.recorder,)
                ) as sup:
                    h.sup = sup
                    for op in operations:
                        h.log.append(repr(op))
                        await apply(h, sup, op)
                        h.raise_violations()
                    h.closing = True
            except GraceExceededError as exc:
                h.shutdown_results.append(exc.stuck)
            else:
                h.shutdown_results.append(None)
            assert sup is not None
            h.check_after_shutdown(sup)
            h.raise_violations()
    h.check_final()
    h.raise_violations()


def run_case(config: Config, operations: Sequence[Op]) -> Harness:
    """Run one example deterministically; raise ``Violation`` on a broken invariant."""
    h = Harness(config)
    trio.run(
        _main,
        h,
        operations,
        clock=trio.testing.MockClock(autojump_threshold=0),
        instruments=[StateChecker(h)],
    )
    return h


# -- the property tests ---------------------------------------------------------------------

op_lists = scripts(max_size=25)


@settings(max_examples=900, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, operations=op_lists)
def test_random_operation_sequences(config: Config, operations: list[Op]) -> None:
    """Every invariant holds at every step, whatever the operations and budgets."""
    run_case(config, operations)


@settings(max_examples=900, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, operations=scripts(max_size=25, ops=keyed_ops))
def test_random_keyed_sequences(config: Config, operations: list[Op]) -> None:
    """The same invariants, with the operations focused on two contended slots."""
    run_case(config, operations)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, operations=scripts(max_size=25, ops=queue_ops))
def test_random_queue_order(config: Config, operations: list[Op]) -> None:
    """The same invariants, on QUEUE work alone: FIFO per slot under every budget."""
    run_case(config, operations)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=configs,
    operations=st.one_of(
        scripts(max_size=60),
        scripts(max_size=60, ops=keyed_ops),
        scripts(max_size=60, ops=queue_ops),
    ),
)
def test_random_operation_sequences_long(config: Config, operations: list[Op]) -> None:
    """The same properties, with many more and longer sequences."""
    run_case(config, operations)


# -- examples the harness must handle (guards against a vacuous model) ---------------------


def test_harness_sees_every_kind_of_outcome() -> None:
    """A hand-written script reaches success, failure, fatal, timeout, stop and force."""
    ops_: list[Op] = [
        Add("a", Work("ok", 0.5)),
        Add("b", Work("fail", 0.5, "retry")),
        Add("c", Work("fatal", 0.5)),
        Submit("x", "s1", AdmissionPolicy.QUEUE, Work("hang", timeout=1.5)),
        Submit("y", "s1", AdmissionPolicy.QUEUE, Work("ignore", 3.0)),
        Submit("z", "s1", AdmissionPolicy.JOIN, Work()),
        Sleep(2.0),
        Cancel(Ref(4)),
        Sleep(5.0),
    ]
    h = run_case(Config(grace=1.0), ops_)
    kinds = {sub.waiter.outcome_nowait().kind for sub in h.refs if sub.waiter is not None}
    assert kinds == {
        OutcomeKind.COMPLETED,
        OutcomeKind.FAILED,
        OutcomeKind.FATAL,
        OutcomeKind.FORCE_ABORTED,
    }
    assert [s.id for s in h.starts["s1"]] == [h.refs[3].id, h.refs[4].id]


# -- regressions found by the randomized tests ----------------------------------------------


async def test_regression_no_attempt_after_forced_stop_before_first_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A body never starts after its outcome was committed.

    Shrunk from ``Config(grace=0.0), [Submit('a', 's1', QUEUE, ok(0.5))]`` then shutdown:
    with ``grace=0`` the stop forced the task (``FORCE_ABORTED``, waiter resolved) before
    its actor took its first step, and the actor then began an attempt anyway. Here the
    add and the stop reach the registry in one batch, so the order is deterministic.
    """
    ran: list[str] = []

    async def body() -> None:
        ran.append("body")
        await trio.sleep(0.5)

    async with open_supervisor(SupervisorConfig(grace=0.0)) as sup:
        waiter = sup.add_nowait(TaskSpec.once("a", body))
        assert await sup.remove("a")
        outcome = await waiter.wait()
        await trio.sleep(1.0)
    assert outcome.kind is OutcomeKind.FORCE_ABORTED
    assert ran == []


@pytest.mark.parametrize("max_concurrent", [None, 1])
async def test_regression_no_attempt_after_stop_before_first_step(
    autojump_clock: trio.testing.MockClock, max_concurrent: int | None
) -> None:
    """A stop requested before the first attempt began ends the task with no attempt.

    Without ``max_concurrent`` the actor used to begin the attempt regardless (the body
    ran up to its first checkpoint); a permit wait already ended it ``CANCELLED``.
    """
    ran: list[str] = []
    recorder = EventRecorder()

    async def body() -> None:
        ran.append("body")
        await trio.sleep(0.5)

    config = SupervisorConfig(grace=1.0, max_concurrent=max_concurrent)
    async with open_supervisor(config, subscribers=[recorder]) as sup:
        waiter = sup.add_nowait(TaskSpec.once("a", body))
        assert await sup.remove("a")
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.CANCELLED
    assert ran == []
    assert recorder.kinds(EventKind.ATTEMPT_STARTING) == []


@settings(max_examples=100, deadline=None)
@given(schedule=st.random_module())
def test_regression_wait_idle_waits_for_a_rejection_in_flight(schedule: object) -> None:
    """``wait_idle()`` does not return while a slot's owner is still admitting.

    Found by ``test_random_operation_sequences``: the registry, busy with ``w0``'s stop,
    queued the admission of the third submission (by then the owner of ``s1``), then
    rejected it (its name was still in use). Until the controller's loop took that
    decision in, the slot stayed ``ADMITTING`` with an owner neither loop counted, and
    ``wait_idle()`` could return in between. ``schedule`` seeds trio's scheduler: the
    window opens in a few orders of the tasks only.
    """
    q = Work("ok", 0.5)
    run_case(
        Config(events=True),
        [
            Submit("q", "s2", AdmissionPolicy.QUEUE, q, nowait=True),
            Cancel(Ref(0), background=True),
            Submit("q", "s1", AdmissionPolicy.QUEUE, q),
            Submit("q", "s1", AdmissionPolicy.DROP_IF_RUNNING, q),
            WaitIdle(),
        ],
    )
