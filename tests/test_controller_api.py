"""The controller's surface: its config and spec values, intake (``submit``,
``submit_nowait``, ``prepare_submission``), slots on added and submitted work, the snapshot
and the release of idle controller state, controller events, and ``wait_idle`` with
controller work. (The controller calls on a supervisor without one: ``test_bad_input.py``.)

Policies have their own files (``test_policy_*.py``), as do budgets and wait mode
(``test_budgets_and_held_work.py``), stopping controller work (``test_controller_stops.py``)
and keyed calls (``test_keyed_calls.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    AdmissionPolicy,
    ConfigError,
    ControllerConfig,
    ControllerSnapshot,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    Supervisor,
    SupervisorClosedError,
    SupervisorConfig,
    TaskId,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

from helpers import (
    controller_state,
    drop,
    job,
    join,
    nothing,
    once,
    queue,
    replace,
    supervisor,
    winding_down,
)

# -- configuration and specs ---------------------------------------------------------------


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


@pytest.mark.parametrize("bad", [0, -1])
def test_controller_queue_capacity_below_one_raises_config_error(bad: int) -> None:
    """ControllerConfig(queue_capacity <= 0) raises ConfigError."""
    with pytest.raises(ConfigError, match="queue_capacity"):
        ControllerConfig(queue_capacity=bad)


@pytest.mark.parametrize("field", ["max_slot_queue", "max_waiters", "max_total_pending"])
def test_negative_controller_budget_raises_config_error(field: str) -> None:
    """A negative controller budget raises ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        ControllerConfig(**{field: -1})


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


def test_controller_zero_budgets_are_valid() -> None:
    """max_slot_queue=0 and max_waiters=0 are accepted."""
    config = ControllerConfig(max_slot_queue=0, max_waiters=0)
    assert (config.max_slot_queue, config.max_waiters) == (0, 0)


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


# -- add bypasses the controller, slots are visible ----------------------------------------


async def test_added_work_has_no_slot(autojump_clock: trio.abc.Clock) -> None:
    """Work added with add has slot None in TaskInfo, TaskContext and events."""
    recorder = EventRecorder()
    seen: list[str | None] = []

    async def body() -> None:
        seen.append(current_context().slot)
        await trio.sleep_forever()

    async with supervisor(recorder, controller=ControllerConfig()) as sup:
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

    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        waiter = await sup.submit(queue("t", body, slot="k"))
        await trio.testing.wait_all_tasks_blocked()
        assert [(info.name, info.slot) for info in sup.list()] == [("t", "k")]
    assert seen == ["k"]
    assert {e.slot for e in recorder.events if e.task_id == waiter.id} == {"k"}


# -- intake --------------------------------------------------------------------------------


async def test_submit_returns_at_intake(autojump_clock: trio.abc.Clock) -> None:
    """submit returns before admission: the waiter is pending, the body has not started."""
    started: list[float] = []

    async def body() -> None:
        started.append(trio.current_time())

    async with supervisor(controller=ControllerConfig()) as sup:
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
    async with supervisor(queue_capacity=1) as sup:
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
    async with supervisor(queue_capacity=1) as sup:
        await trio.testing.wait_all_tasks_blocked()
        first = sup.submit_nowait(queue("a", trio.sleep, 1, slot="a"))
        second = sup.submit_nowait(queue("b", trio.sleep, 1, slot="b"))
        with pytest.raises(trio.WouldBlock):
            sup.submit_nowait(queue("c", trio.sleep, 1, slot="c"))
        await sup.wait_idle()
        assert trio.current_time() == 1.0
        assert first.outcome_nowait().is_success
        assert second.outcome_nowait().is_success


# -- prepared submissions ------------------------------------------------------------------


async def test_prepare_submission_allocates_id_first(autojump_clock: trio.abc.Clock) -> None:
    """prepare_submission allocates the TaskId now; submit returns a waiter with that id."""
    async with supervisor(controller=ControllerConfig()) as sup:
        prepared = sup.prepare_submission(queue("a", nothing))
        later = sup.submit_nowait(queue("b", nothing, slot="other"))
        assert isinstance(prepared.id, TaskId)
        assert prepared.id < later.id
        waiter = await prepared.submit()
        assert waiter.id == prepared.id
        assert (await waiter.wait()).is_success


async def test_prepare_submission_exposes_its_request(autojump_clock: trio.abc.Clock) -> None:
    """``PreparedSubmission.request`` is the ``ControllerSpec`` it will submit."""
    async with supervisor(controller=ControllerConfig()) as sup:
        request = queue("a", nothing)
        prepared = sup.prepare_submission(request)
        assert prepared.request is request
        waiter = await prepared.submit()
        assert waiter.name == prepared.request.task.name


async def test_prepare_submission_reserves_and_publishes_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A prepared submission takes no slot, no budget and publishes no event."""
    recorder = EventRecorder()
    async with supervisor(recorder, max_slots=1) as sup:
        sup.prepare_submission(queue("a", slot="a"))
        await sup.wait_idle()
        assert sup.controller_snapshot().slots == ()
        other = await sup.submit(queue("b", trio.sleep, 1, slot="b"))
        assert (await other.wait()).is_success
        assert recorder.kinds(EventKind.CONTROLLER_SUBMITTED) == [EventKind.CONTROLLER_SUBMITTED]


async def test_prepared_submission_submits_once(autojump_clock: trio.abc.Clock) -> None:
    """A second submit of a prepared submission raises RuntimeError."""
    async with supervisor(controller=ControllerConfig()) as sup:
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

    async with supervisor(controller=ControllerConfig()) as sup:
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
    async with supervisor(controller=ControllerConfig()) as sup:
        prepared = sup.prepare_submission(queue("a"))
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            await prepared.submit()
        with pytest.raises(SupervisorClosedError):
            prepared.submit_nowait()


# -- the snapshot and idle state -----------------------------------------------------------


async def test_running_slot_snapshot(autojump_clock: trio.abc.Clock) -> None:
    """An admitted owner shows as RUNNING with its id."""
    async with supervisor(controller=ControllerConfig()) as sup:
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


async def test_snapshot_slots_are_sorted(autojump_clock: trio.abc.Clock) -> None:
    """controller_snapshot lists slots sorted by name."""
    async with supervisor(controller=ControllerConfig()) as sup:
        for slot in ("b", "c", "a"):
            await sup.submit(queue(slot, slot=slot))
        await trio.testing.wait_all_tasks_blocked()
        assert [view.slot for view in sup.controller_snapshot().slots] == ["a", "b", "c"]


async def test_snapshot_counts_queue_and_waiting(autojump_clock: trio.abc.Clock) -> None:
    """queue_depth excludes the owner; waiting counts held submissions; total_queued sums queues."""
    async with supervisor(max_slot_queue=2) as sup:
        await sup.submit(queue("a", slot="a"))
        await sup.submit(queue("a2", slot="a"))
        await sup.submit(queue("a3", slot="a"))
        await sup.submit(queue("a4", slot="a", wait=True))
        await sup.submit(queue("b", slot="b"))
        await sup.submit(queue("b2", slot="b"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        assert [(v.slot, v.queue_depth, v.waiting) for v in snapshot.slots] == [
            ("a", 2, 1),
            ("b", 1, 0),
        ]
        assert (snapshot.running_count, snapshot.total_queued) == (2, 3)


async def test_slot_view_waiting_counts_held_work(autojump_clock: Any) -> None:
    """SlotView.waiting counts the held submissions of the slot, not its queue."""
    async with supervisor(max_slot_queue=1) as sup:
        await sup.submit(queue("owner", job, 1.0, slot="s"))
        await sup.submit(queue("queued", job, 1.0, slot="s"))
        await sup.submit(queue("held-1", job, 1.0, slot="s", wait=True))
        await sup.submit(queue("held-2", job, 1.0, slot="s", wait=True))
        await trio.testing.wait_all_tasks_blocked()
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.queue_depth, view.waiting) == (1, 2)


async def test_snapshot_status_for_is_exact(autojump_clock: trio.abc.Clock) -> None:
    """status_for is the time since the last status change."""
    async with supervisor(controller=ControllerConfig()) as sup:
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
    async with supervisor(controller=ControllerConfig()) as sup:
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
    async with supervisor(controller=ControllerConfig()) as sup:
        owner = await sup.submit(queue("a", slot="a"))
        await trio.testing.wait_all_tasks_blocked()
        snapshot = sup.controller_snapshot()
        view = snapshot.slot("a")
        assert view is not None
        assert (view.slot, view.owner_id) == ("a", owner.id)
        assert snapshot.slot("missing") is None


async def test_idle_slot_vanishes_from_snapshot(autojump_clock: trio.abc.Clock) -> None:
    """A slot with no owner, queue or held work is dropped from the snapshot."""
    async with supervisor(controller=ControllerConfig()) as sup:
        a = await sup.submit(queue("a", trio.sleep, 1, slot="a"))
        await sup.submit(queue("b", trio.sleep, 2, slot="b"))
        await a.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert [v.slot for v in sup.controller_snapshot().slots] == ["b"]
        await sup.wait_idle()
        assert sup.controller_snapshot().slots == ()


async def test_settled_slots_release_all_controller_state(autojump_clock: Any) -> None:
    """Once every slot's work settles, no slot, queue, held or joiner state remains."""
    async with supervisor(max_slot_queue=1) as sup:
        for k in range(10):
            slot = f"s{k}"
            await sup.submit(queue(f"{slot}-owner", job, 1.0, slot=slot))
            await sup.submit(queue(f"{slot}-queued", job, 1.0, slot=slot))
            await sup.submit(join(f"{slot}-joiner", job, 1.0, slot=slot))
            held = await sup.submit(queue(f"{slot}-held", job, 1.0, slot=slot, wait=True))
            await sup.submit(queue(f"{slot}-held-2", job, 1.0, slot=slot, wait=True))
            if k % 2:
                await sup.remove(held.id)
        await sup.wait_idle()
        assert trio.current_time() == 4.0  # owner, queued, held, held-2 in even slots
        assert sup.controller_snapshot().slots == ()
        machine = controller_state(sup)
        assert (machine.slots, machine.queued, machine.held, machine.joiners) == ({}, {}, {}, {})
        assert machine.pending == 0


# -- events --------------------------------------------------------------------------------


async def test_controller_events_carry_identity(autojump_clock: trio.abc.Clock) -> None:
    """Controller events (submitted, rejected, slot transition) carry task_id, name, slot."""
    recorder = EventRecorder()
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
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
    async with supervisor(recorder, controller=ControllerConfig()) as sup:
        await sup.submit(queue("owner"))
        dropped = await sup.submit(drop("dropped"))
        await dropped.wait()
    (event,) = recorder.of(EventKind.CONTROLLER_REJECTED)
    assert event.rejection is RejectionKind.SLOT_BUSY


# -- wait_idle -----------------------------------------------------------------------------


async def test_wait_idle_waits_for_queued_work(autojump_clock: trio.abc.Clock) -> None:
    """wait_idle returns only after queued controller work ran."""
    async with supervisor(controller=ControllerConfig()) as sup:
        await sup.submit(queue("a", trio.sleep, 1))
        queued = await sup.submit(queue("b", trio.sleep, 2))
        await sup.wait_idle()
        assert trio.current_time() == 3.0
        assert queued.outcome_nowait().is_success


async def test_wait_idle_waits_for_submissions_in_the_command_channel(
    autojump_clock: Any,
) -> None:
    """wait_idle does not return while submissions still sit in the controller channel."""
    async with supervisor(controller=ControllerConfig()) as sup:
        waiters = [sup.submit_nowait(queue(f"w{i}", job, 1.0, slot="s")) for i in range(3)]
        await sup.wait_idle()
        assert trio.current_time() == 3.0
        assert [w.outcome_nowait().kind for w in waiters] == [OutcomeKind.COMPLETED] * 3


async def test_wait_idle_waits_for_held_work(autojump_clock: trio.abc.Clock) -> None:
    """wait_idle counts held (wait-mode) submissions."""
    async with supervisor(max_slot_queue=0) as sup:
        await sup.submit(queue("a", trio.sleep, 1))
        held = await sup.submit(queue("b", trio.sleep, 1, wait=True))
        await sup.wait_idle()
        assert trio.current_time() == 2.0
        assert held.outcome_nowait().is_success


def test_the_snapshot_answers_after_the_supervisors_run() -> None:
    """After the trio run, ``controller_snapshot()`` is the empty snapshot, as
    ``statistics()`` and ``list()`` answer then too. Before, it raised trio's bare "must
    be called from async context"."""

    async def main() -> Supervisor:
        async with open_supervisor(SupervisorConfig(controller=ControllerConfig())) as sup:
            await sup.run_in_slot("s", trio.sleep, 1.0)
        return sup

    sup = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sup.controller_snapshot() == ControllerSnapshot(
        slots=(), running_count=0, total_queued=0
    )
    assert (sup.statistics().registered, sup.list()) == (0, ())
