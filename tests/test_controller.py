"""The keyed controller in virtual time: one owner per slot, queue / replace / drop."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    NoControllerError,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    Supervisor,
    SupervisorClosedError,
    SupervisorConfig,
    TaskId,
    TaskOutcome,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor._outcome import rejected_outcome
from trio_taskvisor.testing import EventRecorder

TRANSITION = EventKind.CONTROLLER_SLOT_TRANSITION
ATTEMPT_KINDS = (
    EventKind.ATTEMPT_STARTING,
    EventKind.ATTEMPT_SUCCEEDED,
    EventKind.ATTEMPT_FAILED,
    EventKind.ATTEMPT_TIMED_OUT,
    EventKind.ATTEMPT_CANCELLED,
)


@asynccontextmanager
async def supervisor(
    recorder: EventRecorder | None = None, **config: Any
) -> AsyncIterator[Supervisor]:
    """Open a supervisor with a controller (``grace=5`` unless given)."""
    config.setdefault("grace", 5.0)
    config.setdefault("controller", ControllerConfig())
    subscribers = () if recorder is None else (recorder,)
    async with open_supervisor(SupervisorConfig(**config), subscribers=subscribers) as sup:
        yield sup


async def forever() -> None:
    await trio.sleep_forever()


async def nothing() -> None:
    pass


async def winding_down(seconds: float) -> None:
    """Finish ``seconds`` of work a stop may not interrupt, then stop at a checkpoint."""
    with current_context().defer_cancel():
        await trio.sleep(seconds)
    await trio.sleep_forever()


async def stubborn(seconds: float) -> None:
    """Ignore every cancellation for ``seconds`` (a shield of its own)."""
    with trio.CancelScope(shield=True):
        await trio.sleep(seconds)


def once(name: str, fn: Any = forever, *args: Any) -> TaskSpec:
    return TaskSpec.once(name, fn, *args)


def queue(name: str, fn: Any = forever, *args: Any, slot: str = "k") -> ControllerSpec:
    return ControllerSpec.queue(once(name, fn, *args), slot=slot)


def replace(name: str, fn: Any = forever, *args: Any, slot: str = "k") -> ControllerSpec:
    return ControllerSpec.replace(once(name, fn, *args), slot=slot)


def drop(name: str, fn: Any = forever, *args: Any, slot: str = "k") -> ControllerSpec:
    return ControllerSpec.drop_if_running(once(name, fn, *args), slot=slot)


def rejected(kind: RejectionKind) -> TaskOutcome:
    return rejected_outcome(kind)


def trail(recorder: EventRecorder, waiter: TaskWaiter, *, attempts: bool = True) -> list[str]:
    """One task's events in order: kind names, and slot transitions by their reason."""
    return [
        str(e.reason) if e.kind is TRANSITION else e.kind.name
        for e in recorder.events
        if e.task_id == waiter.id and (attempts or e.kind not in ATTEMPT_KINDS)
    ]


def starts(recorder: EventRecorder, waiter: TaskWaiter) -> list[float]:
    """Times of the ``ATTEMPT_STARTING`` events of one task."""
    return [e.time for e in recorder.of(EventKind.ATTEMPT_STARTING, task_id=waiter.id)]


def stall_registry(sup: Supervisor) -> None:
    """Keep controller admissions ADMITTING until the registry's loop takes them.

    When the registry is idle, the controller admits an owner directly (nothing is
    queued before it) and the owner is RUNNING at once. Reporting the registry as busy
    makes the controller queue every admission behind the registry's channel, as it
    does under load, so the owner stays ADMITTING while the controller takes the next
    buffered submission in.
    """
    registry = sup._registry  # pyright: ignore[reportPrivateUsage]

    class Stalled:
        """The registry's inbox, reporting itself busy."""

        def __init__(self, inbox: Any) -> None:
            self._inbox = inbox

        def idle(self) -> bool:
            return False

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inbox, name)

    registry._inbox = Stalled(registry._inbox)  # type: ignore[assignment]  # pyright: ignore[reportPrivateUsage]


class Occupancy:
    """Counts the bodies running in each slot at once, and the peaks."""

    def __init__(self) -> None:
        self.active: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.total_peak = 0

    async def run(self, seconds: float) -> None:
        slot = current_context().slot
        assert slot is not None
        self.active[slot] += 1
        self.total += 1
        self.peak[slot] = max(self.peak[slot], self.active[slot])
        self.total_peak = max(self.total_peak, self.total)
        try:
            await trio.sleep(seconds)
        finally:
            self.active[slot] -= 1
            self.total -= 1


# -- configuration and specs -----------------------------------------------------------


def test_controller_config_defaults() -> None:
    """ControllerConfig has the documented defaults."""
    config = ControllerConfig()
    assert (
        config.queue_capacity,
        config.max_slot_queue,
        config.max_total_pending,
        config.max_slots,
        config.max_waiters,
    ) == (1024, 100, 1024, 1024, 1024)


@pytest.mark.parametrize(
    "options",
    [
        {"queue_capacity": 0},
        {"queue_capacity": -1},
        {"max_slot_queue": -1},
        {"max_total_pending": -1},
        {"max_waiters": -1},
    ],
)
def test_controller_config_rejects_invalid_values(options: dict[str, Any]) -> None:
    """Capacities of 0 or less and negative limits raise ConfigError."""
    with pytest.raises(ConfigError):
        ControllerConfig(**options)


@pytest.mark.parametrize(
    "options",
    [
        {"max_slot_queue": 0},
        {"max_waiters": 0},
        {"max_total_pending": None},
        {"max_slots": None},
        {"max_waiters": None},
    ],
)
def test_controller_config_accepts_zero_and_unlimited(options: dict[str, Any]) -> None:
    """Zero max_slot_queue / max_waiters are valid; pending, slot, waiter limits accept None."""
    config = ControllerConfig(**options)
    for field, value in options.items():
        assert getattr(config, field) == value


def test_controller_config_max_slot_queue_is_not_optional() -> None:
    """max_slot_queue is an int >= 0: None is refused."""
    with pytest.raises(TypeError, match="max_slot_queue"):
        ControllerConfig(max_slot_queue=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("constructor", "policy"),
    [
        (ControllerSpec.queue, AdmissionPolicy.QUEUE),
        (ControllerSpec.replace, AdmissionPolicy.REPLACE),
        (ControllerSpec.drop_if_running, AdmissionPolicy.DROP_IF_RUNNING),
        (ControllerSpec.join, AdmissionPolicy.JOIN),
    ],
)
def test_controller_spec_constructors_set_policy_and_slot(constructor: Any, policy: Any) -> None:
    """Each named constructor sets its policy, the slot, and wait=False."""
    task = once("t")
    spec = constructor(task, slot="s")
    assert (spec.task, spec.policy, spec.slot, spec.wait) == (task, policy, "s", False)


@pytest.mark.parametrize("constructor", [ControllerSpec.queue, ControllerSpec.replace])
def test_controller_spec_wait_mode_constructors(constructor: Any) -> None:
    """queue() and replace() accept wait=True."""
    assert constructor(once("t"), wait=True).wait is True


def test_controller_spec_defaults() -> None:
    """A bare ControllerSpec queues, has no slot and does not wait."""
    spec = ControllerSpec(once("t"))
    assert (spec.policy, spec.slot, spec.wait) == (AdmissionPolicy.QUEUE, None, False)


def test_slot_name_defaults_to_task_name() -> None:
    """slot_name is the task name when no slot is given."""
    assert ControllerSpec.queue(once("t")).slot_name == "t"


def test_slot_name_is_the_slot_when_given() -> None:
    """slot_name is the slot when one is given."""
    assert ControllerSpec.queue(once("t"), slot="s").slot_name == "s"


def test_controller_spec_rejects_non_task_spec() -> None:
    """A task that is not a TaskSpec raises TypeError."""
    with pytest.raises(TypeError, match="TaskSpec"):
        ControllerSpec.queue("t")  # type: ignore[arg-type]


@pytest.mark.parametrize("slot", [["k"], 7, b"k"])
def test_controller_spec_rejects_non_str_slot(slot: Any) -> None:
    """A slot that is not a str (unhashable, int, bytes) raises TypeError."""
    with pytest.raises(TypeError, match="slot"):
        ControllerSpec.queue(once("t"), slot=slot)


def test_controller_spec_rejects_empty_slot() -> None:
    """An empty slot raises ConfigError."""
    with pytest.raises(ConfigError, match="slot"):
        ControllerSpec.queue(once("t"), slot="")


@pytest.mark.parametrize("policy", [AdmissionPolicy.JOIN, AdmissionPolicy.DROP_IF_RUNNING])
def test_controller_spec_rejects_wait_without_wait_mode(policy: AdmissionPolicy) -> None:
    """JOIN and DROP_IF_RUNNING have no wait mode: wait=True raises ConfigError."""
    with pytest.raises(ConfigError, match=policy.name):
        ControllerSpec(once("t"), policy, "k", wait=True)


# -- without a controller ------------------------------------------------------------------


async def test_submit_without_controller_raises() -> None:
    """submit needs a controller."""
    async with open_supervisor() as sup:
        with pytest.raises(NoControllerError):
            await sup.submit(queue("t"))


async def test_submit_nowait_without_controller_raises() -> None:
    """submit_nowait needs a controller."""
    async with open_supervisor() as sup:
        with pytest.raises(NoControllerError):
            sup.submit_nowait(queue("t"))


async def test_prepare_submission_without_controller_raises() -> None:
    """prepare_submission needs a controller."""
    async with open_supervisor() as sup:
        with pytest.raises(NoControllerError):
            sup.prepare_submission(queue("t"))


async def test_controller_snapshot_without_controller_raises() -> None:
    """controller_snapshot needs a controller."""
    async with open_supervisor() as sup:
        with pytest.raises(NoControllerError):
            sup.controller_snapshot()


# -- add bypasses the controller, slots are visible -------------------------------------


async def test_added_work_has_no_slot(autojump_clock: trio.abc.Clock) -> None:
    """Work added with add has slot None in TaskInfo, TaskContext and events."""
    recorder = EventRecorder()
    seen: list[str | None] = []

    async def body() -> None:
        seen.append(current_context().slot)
        await trio.sleep_forever()

    async with supervisor(recorder) as sup:
        waiter = await sup.add(once("t", body))
        await trio.testing.wait_all_tasks_blocked()
        assert [info.slot for info in sup.list()] == [None]
        assert sup.controller_snapshot().slots == ()
    assert seen == [None]
    assert {e.slot for e in recorder.events if e.task_id == waiter.id} == {None}


async def test_controller_work_carries_its_slot(autojump_clock: trio.abc.Clock) -> None:
    """Controller work has its slot in TaskInfo, TaskContext and every event."""
    recorder = EventRecorder()
    seen: list[str | None] = []

    async def body() -> None:
        seen.append(current_context().slot)
        await trio.sleep_forever()

    async with supervisor(recorder) as sup:
        waiter = await sup.submit(queue("t", body, slot="k"))
        await trio.testing.wait_all_tasks_blocked()
        assert [(info.name, info.slot) for info in sup.list()] == [("t", "k")]
    assert seen == ["k"]
    assert {e.slot for e in recorder.events if e.task_id == waiter.id} == {"k"}


# -- intake ----------------------------------------------------------------------------------


async def test_submit_returns_at_intake(autojump_clock: trio.abc.Clock) -> None:
    """submit returns before admission: the waiter is pending, the body has not started."""
    started: list[float] = []

    async def body() -> None:
        started.append(trio.current_time())

    async with supervisor() as sup:
        waiter = await sup.submit(queue("t", body))
        with pytest.raises(trio.WouldBlock):
            waiter.outcome_nowait()
        assert started == []
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert started == [0.0]


async def test_submit_nowait_raises_would_block_when_channel_full(
    autojump_clock: trio.abc.Clock,
) -> None:
    """With queue_capacity=1 and the loop waiting, the third submit_nowait would block."""
    async with supervisor(controller=ControllerConfig(queue_capacity=1)) as sup:
        await trio.testing.wait_all_tasks_blocked()
        sup.submit_nowait(queue("a", slot="a"))  # handed straight to the waiting loop
        sup.submit_nowait(queue("b", slot="b"))  # fills the channel
        with pytest.raises(trio.WouldBlock):
            sup.submit_nowait(queue("c", slot="c"))
        await trio.testing.wait_all_tasks_blocked()
        assert [view.slot for view in sup.controller_snapshot().slots] == ["a", "b"]


async def test_would_block_submission_leaves_nothing_pending(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A submission refused with WouldBlock does not keep wait_idle waiting."""
    async with supervisor(controller=ControllerConfig(queue_capacity=1)) as sup:
        await trio.testing.wait_all_tasks_blocked()
        first = sup.submit_nowait(queue("a", trio.sleep, 1, slot="a"))
        second = sup.submit_nowait(queue("b", trio.sleep, 1, slot="b"))
        with pytest.raises(trio.WouldBlock):
            sup.submit_nowait(queue("c", trio.sleep, 1, slot="c"))
        await sup.wait_idle()
        assert trio.current_time() == 1.0
        assert first.outcome_nowait().is_success
        assert second.outcome_nowait().is_success


async def test_prepare_submission_allocates_id_first(autojump_clock: trio.abc.Clock) -> None:
    """prepare_submission allocates the TaskId now; submit returns a waiter with that id."""
    async with supervisor() as sup:
        prepared = sup.prepare_submission(queue("a", nothing))
        later = sup.submit_nowait(queue("b", nothing, slot="other"))
        assert isinstance(prepared.id, TaskId)
        assert prepared.id < later.id
        waiter = await prepared.submit()
        assert waiter.id == prepared.id
        assert (await waiter.wait()).is_success


async def test_prepare_submission_reserves_and_publishes_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A prepared submission takes no slot, no budget and publishes no event."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig(max_slots=1)) as sup:
        sup.prepare_submission(queue("a", slot="a"))
        await sup.wait_idle()
        assert sup.controller_snapshot().slots == ()
        other = await sup.submit(queue("b", trio.sleep, 1, slot="b"))
        assert (await other.wait()).is_success
        assert recorder.kinds(EventKind.CONTROLLER_SUBMITTED) == [EventKind.CONTROLLER_SUBMITTED]


async def test_prepared_submission_submits_once(autojump_clock: trio.abc.Clock) -> None:
    """A second submit of a prepared submission raises RuntimeError."""
    async with supervisor() as sup:
        prepared = sup.prepare_submission(queue("a"))
        await prepared.submit()
        with pytest.raises(RuntimeError, match="already submitted"):
            await prepared.submit()


async def test_prepared_submission_nowait_submits_once(autojump_clock: trio.abc.Clock) -> None:
    """A second submit_nowait raises RuntimeError and does not submit the work again."""
    started: list[float] = []

    async def body() -> None:
        started.append(trio.current_time())
        await trio.sleep(1)

    async with supervisor() as sup:
        prepared = sup.prepare_submission(queue("a", body))
        waiter = prepared.submit_nowait()
        with pytest.raises(RuntimeError, match="already submitted"):
            prepared.submit_nowait()
        assert (await waiter.wait()).is_success
        await sup.wait_idle()
        assert sup.controller_snapshot().slots == ()
    assert started == [0.0]


async def test_prepared_submission_after_shutdown_raises_closed(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Submitting a prepared submission after shutdown began raises SupervisorClosedError."""
    async with supervisor() as sup:
        prepared = sup.prepare_submission(queue("a"))
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            await prepared.submit()
        with pytest.raises(SupervisorClosedError):
            prepared.submit_nowait()


# -- the slot state table ------------------------------------------------------------------


async def test_idle_slot_admits_then_runs(autojump_clock: trio.abc.Clock) -> None:
    """An idle slot goes ADMITTING then RUNNING, with the exact event sequence."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        waiter = await sup.submit(queue("a", trio.sleep, 1))
        assert (await waiter.wait()).is_success
    assert trail(recorder, waiter) == [
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "ATTEMPT_SUCCEEDED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_running_slot_snapshot(autojump_clock: trio.abc.Clock) -> None:
    """An admitted owner shows as RUNNING with its id."""
    async with supervisor() as sup:
        waiter = await sup.submit(queue("a"))
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth, view.waiting) == (
            SlotStatus.RUNNING,
            waiter.id,
            0,
            0,
        )


async def test_queue_runs_fifo_with_exact_start_times(autojump_clock: trio.abc.Clock) -> None:
    """Queued work of one slot runs in submission order, each after the previous ended."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        a = await sup.submit(queue("a", trio.sleep, 1))
        b = await sup.submit(queue("b", trio.sleep, 2))
        c = await sup.submit(queue("c", trio.sleep, 1))
        assert (await c.wait()).is_success
        assert trio.current_time() == 4.0
    assert [starts(recorder, w) for w in (a, b, c)] == [[0.0], [1.0], [3.0]]
    assert trail(recorder, b) == [
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "ATTEMPT_SUCCEEDED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_replace_stops_running_owner(autojump_clock: trio.abc.Clock) -> None:
    """REPLACE on RUNNING: running->terminating, the owner ends CANCELLED."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(replace("new"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 2.0
    assert trail(recorder, owner) == [
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "running->terminating",
        "TASK_REMOVE_REQUESTED",
        "ATTEMPT_CANCELLED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_replacement_starts_after_owner_exits(autojump_clock: trio.abc.Clock) -> None:
    """The replacement is admitted only once the owner physically exited."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.submit(replace("new"))
        await trio.sleep(3)
    assert starts(recorder, new) == [2.0]
    assert trail(recorder, new) == [
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "admitting->running",
        "ATTEMPT_STARTING",
        "TASK_REMOVE_REQUESTED",
        "ATTEMPT_CANCELLED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]


async def test_terminating_snapshot_counts_replacement_head(
    autojump_clock: trio.abc.Clock,
) -> None:
    """While the owner winds down the slot is TERMINATING; queue_depth counts the replacement."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(replace("new"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        view = snapshot.slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (
            SlotStatus.TERMINATING,
            owner.id,
            1,
        )
        assert (snapshot.running_count, snapshot.total_queued) == (0, 1)


async def test_replace_while_admitting_stops_owner_on_acceptance(
    autojump_clock: trio.abc.Clock,
) -> None:
    """REPLACE while ADMITTING: admitting->terminating; the owner is stopped once accepted."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await trio.testing.wait_all_tasks_blocked()
        stall_registry(sup)
        owner = sup.submit_nowait(queue("owner"))
        new = sup.submit_nowait(replace("new"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id) == (SlotStatus.RUNNING, new.id)
    assert trail(recorder, owner, attempts=False) == [
        "CONTROLLER_SUBMITTED",
        "admitting->terminating",
        "TASK_ADD_REQUESTED",
        "TASK_ADDED",
        "TASK_REMOVE_REQUESTED",
        "TASK_FINISHED",
        "TASK_REMOVED",
    ]
    assert recorder.of(TRANSITION, task_id=owner.id, reason="admitting->running") == []


async def test_two_nowait_submissions_replace_admitted_owner(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Two submit_nowait calls in a row (QUEUE then REPLACE) leave only the replacement running."""
    async with supervisor() as sup:
        owner = sup.submit_nowait(queue("owner"))
        new = sup.submit_nowait(replace("new"))
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (SlotStatus.RUNNING, new.id, 0)


async def test_rejected_admitting_owner_after_replace_goes_to_next(
    autojump_clock: trio.abc.Clock,
) -> None:
    """ADMITTING -> TERMINATING, then a registry rejection: no removal, the slot goes on."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.add(once("dup"))
        await trio.testing.wait_all_tasks_blocked()
        stall_registry(sup)
        owner = sup.submit_nowait(queue("dup", slot="k"))
        new = sup.submit_nowait(replace("new"))
        assert await owner.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id) == (SlotStatus.RUNNING, new.id)
    assert trail(recorder, owner) == [
        "CONTROLLER_SUBMITTED",
        "admitting->terminating",
        "TASK_ADD_REQUESTED",
        "TASK_ADD_FAILED",
    ]


async def test_replace_while_terminating_supersedes_head(autojump_clock: trio.abc.Clock) -> None:
    """Another REPLACE while TERMINATING rejects the head SUPERSEDED and stops nothing more."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        first = await sup.submit(replace("first", trio.sleep, 1))
        second = await sup.submit(replace("second", trio.sleep, 1))
        assert await first.wait() == rejected(RejectionKind.SUPERSEDED)
        assert trio.current_time() == 0.0
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (
            SlotStatus.TERMINATING,
            owner.id,
            1,
        )
        assert (await second.wait()).is_success
        assert trio.current_time() == 3.0
    assert [e.reason for e in recorder.of(TRANSITION, task_id=owner.id)] == [
        "admitting->running",
        "running->terminating",
    ]
    assert len(recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=owner.id)) == 1
    assert trail(recorder, first) == ["CONTROLLER_SUBMITTED", "CONTROLLER_REJECTED"]


async def test_replace_keeps_queue_tail(autojump_clock: trio.abc.Clock) -> None:
    """REPLACE swaps the queue head and keeps the FIFO tail behind the replacement."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        head = await sup.submit(queue("head", trio.sleep, 1))
        tail = await sup.submit(queue("tail", trio.sleep, 1))
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert (await tail.wait()).is_success
        assert trio.current_time() == 4.0
    assert head.outcome_nowait() == rejected(RejectionKind.SUPERSEDED)
    assert starts(recorder, new) == [2.0]
    assert starts(recorder, tail) == [3.0]


async def test_replace_ignores_max_slot_queue(autojump_clock: trio.abc.Clock) -> None:
    """REPLACE is placed even when max_slot_queue=0 leaves no room to QUEUE."""
    async with supervisor(controller=ControllerConfig(max_slot_queue=0)) as sup:
        await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        queued = await sup.submit(queue("queued"))
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert await queued.wait() == rejected(RejectionKind.QUEUE_FULL)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 1
        assert (await new.wait()).is_success
        assert trio.current_time() == 3.0


async def test_drop_if_running_rejects_slot_busy(autojump_clock: trio.abc.Clock) -> None:
    """DROP_IF_RUNNING on a busy slot is rejected SLOT_BUSY; owner and queue are untouched."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        owner = await sup.submit(queue("owner"))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(queue("queued"))
        await trio.testing.wait_all_tasks_blocked()
        before = sup.controller_snapshot()
        dropped = await sup.submit(drop("dropped"))
        assert await dropped.wait() == rejected(RejectionKind.SLOT_BUSY)
        assert sup.controller_snapshot() == before
        with pytest.raises(trio.WouldBlock):
            owner.outcome_nowait()
    assert trail(recorder, dropped) == ["CONTROLLER_REJECTED"]


async def test_drop_if_running_runs_on_idle_slot(autojump_clock: trio.abc.Clock) -> None:
    """DROP_IF_RUNNING on an idle slot starts at once."""
    async with supervisor() as sup:
        waiter = await sup.submit(drop("a", trio.sleep, 1))
        assert (await waiter.wait()).is_success
        assert trio.current_time() == 1.0


async def test_registry_rejection_of_queued_work(autojump_clock: trio.abc.Clock) -> None:
    """A duplicate name is rejected by the registry (TASK_ADD_FAILED, no CONTROLLER_REJECTED)."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.add(once("dup"))
        await sup.submit(queue("owner", trio.sleep, 1))
        dup = await sup.submit(queue("dup"))
        assert await dup.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        assert trio.current_time() == 1.0
    assert trail(recorder, dup) == [
        "CONTROLLER_SUBMITTED",
        "CONTROLLER_SUBMITTED",
        "TASK_ADD_REQUESTED",
        "TASK_ADD_FAILED",
    ]
    (failed,) = recorder.of(EventKind.TASK_ADD_FAILED, task_id=dup.id)
    assert (failed.slot, failed.rejection) == ("k", RejectionKind.ALREADY_EXISTS)


async def test_registry_rejection_moves_slot_to_next_item(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After a registry rejection the slot admits its next queued item at once."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.add(once("dup"))
        await sup.submit(queue("owner", trio.sleep, 1))
        await sup.submit(queue("dup"))
        after = await sup.submit(queue("after", trio.sleep, 1))
        assert (await after.wait()).is_success
        assert trio.current_time() == 2.0
    assert starts(recorder, after) == [1.0]


async def test_registry_rejection_on_idle_slot_leaves_no_slot(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A rejected first owner leaves the slot idle, so it vanishes from the snapshot."""
    async with supervisor() as sup:
        await sup.add(once("dup"))
        waiter = await sup.submit(queue("dup", slot="k"))
        assert await waiter.wait() == rejected(RejectionKind.ALREADY_EXISTS)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.controller_snapshot().slots == ()


async def test_remove_owner_by_id_keeps_status(autojump_clock: trio.abc.Clock) -> None:
    """remove(owner id) stops the owner but the slot stays RUNNING until it exits."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.sleep(1)
        assert await sup.remove(owner.id) is True
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.status_for) == (SlotStatus.RUNNING, owner.id, 1.0)
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 2.0


async def test_cancel_owner_by_id_keeps_status(autojump_clock: trio.abc.Clock) -> None:
    """While cancel(owner id) waits, the slot stays RUNNING; on exit it advances."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        nxt = await sup.submit(queue("next"))
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.cancel, owner.id)
            await trio.testing.wait_all_tasks_blocked()
            view = sup.controller_snapshot().slot("k")
            assert view is not None
            assert (view.status, view.owner_id) == (SlotStatus.RUNNING, owner.id)
        assert trio.current_time() == 2.0
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (SlotStatus.RUNNING, nxt.id, 0)


async def test_stopping_owner_keeps_queued_replacement(autojump_clock: trio.abc.Clock) -> None:
    """Removing a replaced owner does not purge the replacement queued behind it."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert await sup.remove(owner.id) is False  # already stopping (replaced)
        assert (await new.wait()).is_success
        assert trio.current_time() == 3.0


async def test_replacement_waits_for_late_exit_of_forced_owner(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A forced owner that exits late keeps the slot: the replacement starts at its exit."""
    recorder = EventRecorder()
    async with supervisor(recorder, grace=5.0) as sup:
        owner = await sup.submit(queue("owner", stubborn, 10))
        await trio.testing.wait_all_tasks_blocked()
        new = await sup.submit(replace("new", trio.sleep, 1))
        assert (await owner.wait()).kind is OutcomeKind.FORCE_ABORTED
        assert trio.current_time() == 5.0
        await trio.sleep(2)
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth) == (
            SlotStatus.TERMINATING,
            owner.id,
            1,
        )
        assert (await new.wait()).is_success
        assert trio.current_time() == 11.0
    assert starts(recorder, new) == [10.0]


# -- budgets ---------------------------------------------------------------------------------


async def test_full_slot_queue_rejects_queue_full(autojump_clock: trio.abc.Clock) -> None:
    """QUEUE past max_slot_queue is rejected QUEUE_FULL."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig(max_slot_queue=1)) as sup:
        await sup.submit(queue("owner"))
        await sup.submit(queue("queued"))
        full = await sup.submit(queue("full"))
        assert await full.wait() == rejected(RejectionKind.QUEUE_FULL)
    (event,) = recorder.of(EventKind.CONTROLLER_REJECTED, task_id=full.id)
    assert event.rejection is RejectionKind.QUEUE_FULL


async def test_total_pending_rejects_resource_limit(autojump_clock: trio.abc.Clock) -> None:
    """Queueing past max_total_pending (across slots) is rejected RESOURCE_LIMIT."""
    async with supervisor(controller=ControllerConfig(max_total_pending=1)) as sup:
        await sup.submit(queue("a", slot="a"))
        await sup.submit(queue("b", slot="b"))
        await sup.submit(queue("a2", slot="a"))
        over = await sup.submit(queue("b2", slot="b"))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_replace_creating_head_needs_pending_unit(autojump_clock: trio.abc.Clock) -> None:
    """A REPLACE that creates a queue head needs a pending unit; replacing a head does not."""
    async with supervisor(controller=ControllerConfig(max_total_pending=1)) as sup:
        await sup.submit(queue("a", winding_down, 2, slot="a"))
        await sup.submit(queue("b", winding_down, 2, slot="b"))
        await trio.testing.wait_all_tasks_blocked()
        head = await sup.submit(replace("a2", slot="a"))
        over = await sup.submit(replace("b2", slot="b"))
        again = await sup.submit(replace("a3", slot="a"))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)
        assert await head.wait() == rejected(RejectionKind.SUPERSEDED)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("a")
        assert view is not None
        assert view.queue_depth == 1
        with pytest.raises(trio.WouldBlock):
            again.outcome_nowait()


async def test_new_slot_past_max_slots_rejects_resource_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A submission for a new slot past max_slots is rejected RESOURCE_LIMIT."""
    async with supervisor(controller=ControllerConfig(max_slots=1)) as sup:
        await sup.submit(queue("a", slot="a"))
        over = await sup.submit(queue("b", slot="b"))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_new_slot_past_max_slots_rejected_even_with_wait(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A new slot past max_slots is rejected RESOURCE_LIMIT even with wait=True."""
    async with supervisor(controller=ControllerConfig(max_slots=1)) as sup:
        await sup.submit(queue("a", slot="a"))
        over = await sup.submit(ControllerSpec.queue(once("b"), slot="b", wait=True))
        assert await over.wait() == rejected(RejectionKind.RESOURCE_LIMIT)


async def test_existing_slot_accepts_work_at_max_slots(autojump_clock: trio.abc.Clock) -> None:
    """max_slots limits new slots only: a tracked slot still queues."""
    async with supervisor(controller=ControllerConfig(max_slots=1)) as sup:
        await sup.submit(queue("a", trio.sleep, 1, slot="a"))
        second = await sup.submit(queue("a2", trio.sleep, 1, slot="a"))
        assert (await second.wait()).is_success
        assert trio.current_time() == 2.0


# -- identity operations ---------------------------------------------------------------------


async def test_remove_queued_by_id_rejects_at_once(autojump_clock: trio.abc.Clock) -> None:
    """remove(id) of queued work returns True and resolves REMOVED_FROM_QUEUE at once."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued"))
        assert await sup.remove(queued.id) is True
        assert queued.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        assert trio.current_time() == 0.0
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 0
    (event,) = recorder.of(EventKind.CONTROLLER_REJECTED, task_id=queued.id)
    assert event.rejection is RejectionKind.REMOVED_FROM_QUEUE


async def test_cancel_queued_by_id_returns_at_once(autojump_clock: trio.abc.Clock) -> None:
    """cancel(id) of queued work returns True at once, resolved REMOVED_FROM_QUEUE."""
    async with supervisor() as sup:
        await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued"))
        assert await sup.cancel(queued.id) is True
        assert trio.current_time() == 0.0
        assert queued.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)


async def test_remove_queued_by_name_is_false(autojump_clock: trio.abc.Clock) -> None:
    """Name targets see registered work only: remove("queued-name") is False, work stays queued."""
    async with supervisor() as sup:
        await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued-name"))
        assert await sup.remove("queued-name") is False
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.queue_depth == 1
        with pytest.raises(trio.WouldBlock):
            queued.outcome_nowait()


async def test_remove_owner_by_name_works(autojump_clock: trio.abc.Clock) -> None:
    """A registered owner is a name target like any task."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("owner"))
        await trio.testing.wait_all_tasks_blocked()
        assert await sup.remove("owner") is True
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED


async def test_remove_right_after_submit_nowait_sees_queued_work(
    autojump_clock: trio.abc.Clock,
) -> None:
    """remove(id) just after submit_nowait is ordered after it: the queued work is removed."""
    async with supervisor() as sup:
        await sup.submit(queue("owner"))
        queued = sup.submit_nowait(queue("queued"))
        assert await sup.remove(queued.id) is True
        assert queued.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)


async def test_remove_right_after_submit_nowait_stops_new_owner(
    autojump_clock: trio.abc.Clock,
) -> None:
    """remove(id) just after submit_nowait on an idle slot stops the admitted owner."""
    async with supervisor() as sup:
        owner = sup.submit_nowait(queue("owner"))
        assert await sup.remove(owner.id) is True
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert trio.current_time() == 0.0


async def test_remove_held_by_id_rejects_at_once(autojump_clock: trio.abc.Clock) -> None:
    """Held (wait-mode) work removed by id resolves REMOVED_FROM_QUEUE."""
    async with supervisor(controller=ControllerConfig(max_slot_queue=0)) as sup:
        await sup.submit(queue("owner"))
        held = await sup.submit(ControllerSpec.queue(once("held"), slot="k", wait=True))
        assert await sup.remove(held.id) is True
        assert held.outcome_nowait() == rejected(RejectionKind.REMOVED_FROM_QUEUE)
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert view.waiting == 0


@pytest.mark.parametrize("how", ["queued", "held", "joiner"])
async def test_regression_removing_controller_work_publishes_remove_requested_first(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    """Removing queued, held or joined work by id: TASK_REMOVE_REQUESTED, then the rejection."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig(max_slot_queue=1)) as sup:
        await sup.submit(queue("owner"))
        await sup.submit(queue("queued-0"))
        request = {
            "queued": ControllerSpec.queue(once("target"), slot="k2"),
            "held": ControllerSpec.queue(once("target"), slot="k", wait=True),
            "joiner": ControllerSpec.join(once("target"), slot="k"),
        }[how]
        if how == "queued":
            await sup.submit(queue("owner-2", slot="k2"))
        target = await sup.submit(request)
        assert await sup.remove(target.id) is True
        await trio.testing.wait_all_tasks_blocked()
    kinds = [
        (e.kind, e.rejection)
        for e in recorder.events
        if e.task_id == target.id and e.kind is not EventKind.CONTROLLER_SUBMITTED
    ]
    assert kinds == [
        (EventKind.TASK_REMOVE_REQUESTED, None),
        (EventKind.CONTROLLER_REJECTED, RejectionKind.REMOVED_FROM_QUEUE),
    ]
    [requested] = recorder.of(EventKind.TASK_REMOVE_REQUESTED, task_id=target.id)
    assert (requested.name, requested.slot) == ("target", "k2" if how == "queued" else "k")


# -- the snapshot ------------------------------------------------------------------------------


async def test_snapshot_slots_are_sorted(autojump_clock: trio.abc.Clock) -> None:
    """controller_snapshot lists slots sorted by name."""
    async with supervisor() as sup:
        for slot in ("b", "c", "a"):
            await sup.submit(queue(slot, slot=slot))
        await trio.testing.wait_all_tasks_blocked()
        assert [view.slot for view in sup.controller_snapshot().slots] == ["a", "b", "c"]


async def test_snapshot_counts_queue_and_waiting(autojump_clock: trio.abc.Clock) -> None:
    """queue_depth excludes the owner; waiting counts held submissions; total_queued sums queues."""
    async with supervisor(controller=ControllerConfig(max_slot_queue=2)) as sup:
        await sup.submit(queue("a", slot="a"))
        await sup.submit(queue("a2", slot="a"))
        await sup.submit(queue("a3", slot="a"))
        await sup.submit(ControllerSpec.queue(once("a4"), slot="a", wait=True))
        await sup.submit(queue("b", slot="b"))
        await sup.submit(queue("b2", slot="b"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        assert [(v.slot, v.queue_depth, v.waiting) for v in snapshot.slots] == [
            ("a", 2, 1),
            ("b", 1, 0),
        ]
        assert (snapshot.running_count, snapshot.total_queued) == (2, 3)


async def test_snapshot_status_for_is_exact(autojump_clock: trio.abc.Clock) -> None:
    """status_for is the time since the last status change."""
    async with supervisor() as sup:
        await sup.submit(queue("owner", winding_down, 5))
        await trio.sleep(3)
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.status_for) == (SlotStatus.RUNNING, 3.0)
        await sup.submit(replace("new"))
        await trio.sleep(1)
        view = sup.controller_snapshot().slot("k")
        assert view is not None
        assert (view.status, view.status_for) == (SlotStatus.TERMINATING, 1.0)


async def test_snapshot_running_count_counts_running_slots_only(
    autojump_clock: trio.abc.Clock,
) -> None:
    """running_count counts RUNNING slots, not TERMINATING ones."""
    async with supervisor() as sup:
        await sup.submit(queue("a", winding_down, 2, slot="a"))
        await sup.submit(queue("b", slot="b"))
        await trio.testing.wait_all_tasks_blocked()
        await sup.submit(replace("a2", slot="a"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        assert [v.status for v in snapshot.slots] == [SlotStatus.TERMINATING, SlotStatus.RUNNING]
        assert snapshot.running_count == 1


async def test_snapshot_slot_lookup(autojump_clock: trio.abc.Clock) -> None:
    """slot(name) returns that slot's view, or None for an untracked slot."""
    async with supervisor() as sup:
        owner = await sup.submit(queue("a", slot="a"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        view = snapshot.slot("a")
        assert view is not None
        assert (view.slot, view.owner_id) == ("a", owner.id)
        assert snapshot.slot("missing") is None


async def test_idle_slot_vanishes_from_snapshot(autojump_clock: trio.abc.Clock) -> None:
    """A slot with no owner, queue or held work is dropped from the snapshot."""
    async with supervisor() as sup:
        a = await sup.submit(queue("a", trio.sleep, 1, slot="a"))
        await sup.submit(queue("b", trio.sleep, 2, slot="b"))
        await a.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert [v.slot for v in sup.controller_snapshot().slots] == ["b"]
        await sup.wait_idle()
        assert sup.controller_snapshot().slots == ()


# -- events ----------------------------------------------------------------------------------


async def test_controller_events_carry_identity(autojump_clock: trio.abc.Clock) -> None:
    """Controller events (submitted, rejected, slot transition) carry task_id, name, slot."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        owner = await sup.submit(queue("owner", slot="s"))
        await trio.testing.wait_all_tasks_blocked()
        dropped = await sup.submit(drop("dropped", slot="s"))
        await dropped.wait()
    kinds = (
        EventKind.CONTROLLER_SUBMITTED,
        EventKind.CONTROLLER_REJECTED,
        EventKind.CONTROLLER_SLOT_TRANSITION,
    )
    assert [(e.kind, e.task_id, e.name, e.slot) for e in recorder.events if e.kind in kinds] == [
        (EventKind.CONTROLLER_SUBMITTED, owner.id, "owner", "s"),
        (EventKind.CONTROLLER_SLOT_TRANSITION, owner.id, "owner", "s"),
        (EventKind.CONTROLLER_REJECTED, dropped.id, "dropped", "s"),
    ]


async def test_controller_rejected_event_carries_rejection(
    autojump_clock: trio.abc.Clock,
) -> None:
    """CONTROLLER_REJECTED carries the rejection kind."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        await sup.submit(queue("owner"))
        dropped = await sup.submit(drop("dropped"))
        await dropped.wait()
    (event,) = recorder.of(EventKind.CONTROLLER_REJECTED)
    assert event.rejection is RejectionKind.SLOT_BUSY


# -- shutdown --------------------------------------------------------------------------------


async def test_submit_after_shutdown_raises_closed(autojump_clock: trio.abc.Clock) -> None:
    """After shutdown began, submit and submit_nowait raise SupervisorClosedError."""
    async with supervisor() as sup:
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            await sup.submit(queue("a"))
        with pytest.raises(SupervisorClosedError):
            sup.submit_nowait(queue("b"))


async def test_shutdown_rejects_queued_and_held_work(autojump_clock: trio.abc.Clock) -> None:
    """Shutdown stops the owner and rejects queued and held work SHUTTING_DOWN."""
    async with supervisor(controller=ControllerConfig(max_slot_queue=1)) as sup:
        owner = await sup.submit(queue("owner"))
        queued = await sup.submit(queue("queued"))
        held = await sup.submit(ControllerSpec.queue(once("held"), slot="k", wait=True))
        await trio.testing.wait_all_tasks_blocked()
    assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert queued.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)
    assert held.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)


async def test_shutdown_rejects_work_still_in_channel(autojump_clock: trio.abc.Clock) -> None:
    """Work still in the controller's channel when shutdown begins is rejected SHUTTING_DOWN."""
    async with supervisor() as sup:
        await sup.submit(queue("owner"))
        await trio.testing.wait_all_tasks_blocked()
        pending = sup.submit_nowait(queue("pending"))
        await sup.shutdown()
    assert pending.outcome_nowait() == rejected(RejectionKind.SHUTTING_DOWN)


async def test_queues_never_advance_after_shutdown(autojump_clock: trio.abc.Clock) -> None:
    """Queued work behind an owner that exits during shutdown is never admitted."""
    recorder = EventRecorder()
    async with supervisor(recorder) as sup:
        owner = await sup.submit(queue("owner", winding_down, 2))
        queued = await sup.submit(queue("queued"))
        await trio.testing.wait_all_tasks_blocked()
    assert owner.outcome_nowait().kind is OutcomeKind.CANCELLED
    assert trail(recorder, queued) == ["CONTROLLER_SUBMITTED", "CONTROLLER_REJECTED"]
    assert trio.current_time() == 2.0


async def test_shutdown_resolves_every_waiter_and_leaves_no_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    """After the block, every waiter is resolved and no supervisor task is left."""
    living = trio.lowlevel.current_statistics().tasks_living
    waiters: list[TaskWaiter] = []
    async with supervisor(controller=ControllerConfig(max_slot_queue=2)) as sup:
        for slot in ("a", "b", "c"):
            waiters.append(await sup.submit(queue(f"{slot}0", slot=slot)))
            waiters.append(await sup.submit(queue(f"{slot}1", slot=slot)))
            waiters.append(await sup.submit(replace(f"{slot}2", slot=slot)))
            waiters.append(await sup.submit(ControllerSpec.queue(once(f"{slot}3"), slot=slot)))
            waiters.append(
                await sup.submit(ControllerSpec.queue(once(f"{slot}4"), slot=slot, wait=True))
            )
        waiters.append(sup.submit_nowait(queue("d0", slot="d")))
    assert trio.current_time() == 0.0
    assert all(w.outcome_nowait().kind is not None for w in waiters)
    assert trio.lowlevel.current_statistics().tasks_living == living


# -- storms ----------------------------------------------------------------------------------


async def test_replace_storm_keeps_one_owner(autojump_clock: trio.abc.Clock) -> None:
    """200 REPLACEs into one slot: one owner at a time, only the last completes."""
    occupancy = Occupancy()
    async with supervisor() as sup:
        waiters: list[TaskWaiter] = []
        for i in range(200):
            waiters.append(await sup.submit(replace(f"r{i}", occupancy.run, 1)))
            if i % 7 == 0:
                await trio.testing.wait_all_tasks_blocked()
        await sup.wait_idle()
    outcomes = [w.outcome_nowait() for w in waiters]
    assert outcomes[-1].is_success
    assert all(
        o.kind is OutcomeKind.CANCELLED or o == rejected(RejectionKind.SUPERSEDED)
        for o in outcomes[:-1]
    )
    assert occupancy.peak["k"] == 1


async def test_nowait_replace_storm_keeps_one_owner(autojump_clock: trio.abc.Clock) -> None:
    """200 REPLACEs sent without yielding: one owner at a time, only the last completes."""
    occupancy = Occupancy()
    async with supervisor() as sup:
        waiters = [sup.submit_nowait(replace(f"r{i}", occupancy.run, 1)) for i in range(200)]
        await sup.wait_idle()
        assert trio.current_time() == 1.0
    outcomes = [w.outcome_nowait() for w in waiters]
    assert outcomes[-1].is_success
    assert all(
        o.kind is OutcomeKind.CANCELLED or o == rejected(RejectionKind.SUPERSEDED)
        for o in outcomes[:-1]
    )
    assert occupancy.peak["k"] == 1


async def test_drop_if_running_storm_runs_first_only(autojump_clock: trio.abc.Clock) -> None:
    """200 DROP_IF_RUNNINGs into one slot: the first runs, every other is SLOT_BUSY."""
    occupancy = Occupancy()
    async with supervisor() as sup:
        waiters = [sup.submit_nowait(drop(f"d{i}", occupancy.run, 1)) for i in range(200)]
        await sup.wait_idle()
        assert trio.current_time() == 1.0
    assert waiters[0].outcome_nowait().is_success
    assert {w.outcome_nowait() for w in waiters[1:]} == {rejected(RejectionKind.SLOT_BUSY)}
    assert occupancy.peak["k"] == 1


async def test_many_slots_share_max_concurrent(autojump_clock: trio.abc.Clock) -> None:
    """300 slots at once with max_concurrent=8 run 8 at a time and all complete."""
    occupancy = Occupancy()
    async with supervisor(max_concurrent=8) as sup:
        waiters = [
            sup.submit_nowait(queue(f"t{i}", occupancy.run, 1, slot=f"s{i}")) for i in range(300)
        ]
        await sup.wait_idle()
        assert trio.current_time() == 38.0
    assert all(w.outcome_nowait().is_success for w in waiters)
    assert occupancy.total_peak == 8
    assert max(occupancy.peak.values()) == 1


# -- wait_idle -------------------------------------------------------------------------------


async def test_wait_idle_waits_for_queued_work(autojump_clock: trio.abc.Clock) -> None:
    """wait_idle returns only after queued controller work ran."""
    async with supervisor() as sup:
        await sup.submit(queue("a", trio.sleep, 1))
        queued = await sup.submit(queue("b", trio.sleep, 2))
        await sup.wait_idle()
        assert trio.current_time() == 3.0
        assert queued.outcome_nowait().is_success


async def test_wait_idle_waits_for_work_in_channel(autojump_clock: trio.abc.Clock) -> None:
    """wait_idle counts a submission still in the controller's channel."""
    async with supervisor() as sup:
        waiter = sup.submit_nowait(queue("a", trio.sleep, 1))
        await sup.wait_idle()
        assert trio.current_time() == 1.0
        assert waiter.outcome_nowait().is_success


async def test_wait_idle_waits_for_held_work(autojump_clock: trio.abc.Clock) -> None:
    """wait_idle counts held (wait-mode) submissions."""
    async with supervisor(controller=ControllerConfig(max_slot_queue=0)) as sup:
        await sup.submit(queue("a", trio.sleep, 1))
        held = await sup.submit(ControllerSpec.queue(once("b", trio.sleep, 1), slot="k", wait=True))
        await sup.wait_idle()
        assert trio.current_time() == 2.0
        assert held.outcome_nowait().is_success
