"""The Supervisor's intake and observation methods: add, add_nowait, add_batch, list,
alive_snapshot, statistics, wait_idle and config.

That every async method is a checkpoint is tested in ``test_checkpoints.py``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_taskvisor import (
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    Placement,
    RejectionKind,
    ResourceLimitError,
    Supervisor,
    SupervisorConfig,
    SupervisorStatistics,
    TaskFailure,
    TaskId,
    TaskNameInUseError,
    TaskSpec,
    TaskState,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

from helpers import before_registry_reply, once, returns_done


async def always_fails() -> None:
    raise TaskFailure("nope")


async def defers_stop_for_10s() -> None:
    with current_context().defer_cancel():
        await trio.sleep(10)


def info_of(sup: Supervisor, name: str) -> tuple[TaskState, int]:
    [info] = [i for i in sup.list() if i.name == name]
    return info.state, info.attempt


def add_failures(recorder: EventRecorder) -> list[tuple[str | None, RejectionKind | None]]:
    return [(e.name, e.rejection) for e in recorder.of(EventKind.TASK_ADD_FAILED)]


# -- add -----------------------------------------------------------------------------------


async def test_add_returns_the_waiter_of_a_registered_task(autojump_clock: Any) -> None:
    """On return from add the task is registered and its waiter is still pending."""
    async with open_supervisor() as sup:
        waiter = await sup.add(once("t"))
        assert isinstance(waiter, TaskWaiter)
        assert waiter.name == "t"
        assert [(i.id, i.name) for i in sup.list()] == [(waiter.id, "t")]
        with pytest.raises(trio.WouldBlock):
            waiter.outcome_nowait()


async def test_waiter_dir_shows_only_public_names(autojump_clock: Any) -> None:
    """dir() of a waiter lists the public TaskWaiter's names, none of the record's."""
    public = {name for name in dir(TaskWaiter) if not name.startswith("_")}
    async with open_supervisor(SupervisorConfig(controller=ControllerConfig())) as sup:
        added = await sup.add(once("t", returns_done))
        submitted = await sup.submit(ControllerSpec.queue(once("u", returns_done), slot="s"))
        for waiter in (added, submitted):
            names = dir(waiter)
            assert {name for name in names if not name.startswith("_")} == public
            assert not {"stop_scope", "forced", "fn", "args", "entry", "supervisor"} & set(names)
            assert not [name for name in names if name.startswith("_") and not name.endswith("__")]
            await waiter.wait()


async def test_add_returns_before_the_body_starts_in_any_task_order(autojump_clock: Any) -> None:
    """The direct add decides before its checkpoint, yet its body starts only after add
    returned, whatever order trio runs the tasks of one step in (it varies them)."""
    started: list[str] = []

    async def body(name: str) -> None:
        started.append(name)

    async with open_supervisor() as sup:
        for i in range(32):
            waiter = await sup.add(TaskSpec.once(f"t{i}", body, f"t{i}"))
            assert f"t{i}" not in started
            assert waiter.placement is Placement.OWNER
        await sup.wait_idle()  # no attempt begins once the shutdown has begun
    assert sorted(started) == sorted(f"t{i}" for i in range(32))


async def test_no_attempt_begins_once_the_shutdown_has_begun(autojump_clock: Any) -> None:
    """A task added as the block ends, its first attempt not yet begun, ends
    ``CANCELLED`` without beginning one: the shutdown's stop is decided as it begins,
    as ``remove`` right after ``add`` begins none. Before, its body started during the
    shutdown: one without a checkpoint ran to its end (``COMPLETED``)."""
    started: list[float] = []

    async def body() -> None:
        started.append(trio.current_time())

    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("t", body))
    assert started == []
    assert (await waiter.wait()).kind is OutcomeKind.CANCELLED


async def test_task_ids_strictly_increase_and_are_never_reused(autojump_clock: Any) -> None:
    """Every add allocates a new, larger TaskId, also when a name is reused."""
    async with open_supervisor() as sup:
        first = await sup.add(once("t", returns_done))
        await first.wait()
        again = await sup.add(once("t", returns_done))
        other = await sup.add(once("u", returns_done))
    assert all(isinstance(w.id, TaskId) for w in (first, again, other))
    assert first.id < again.id < other.id


def test_task_id_is_an_int_shown_with_a_hash() -> None:
    """TaskId is an int subclass whose str is '#<n>'."""
    assert isinstance(TaskId(7), int)
    assert TaskId(7) == 7
    assert str(TaskId(7)) == "#7"


async def test_add_duplicate_name_raises_task_name_in_use(autojump_clock: Any) -> None:
    """Adding a registered name raises TaskNameInUseError carrying the name."""
    async with open_supervisor() as sup:
        await sup.add(once("t"))
        with pytest.raises(TaskNameInUseError) as info:
            await sup.add(once("t", returns_done))
    assert info.value.name == "t"


async def test_add_name_of_a_stopping_task_raises_task_name_in_use(autojump_clock: Any) -> None:
    """A task that is stopping but not ended still holds its name."""
    async with open_supervisor() as sup:
        await sup.add(once("t", defers_stop_for_10s))
        await trio.testing.wait_all_tasks_blocked()
        assert await sup.remove("t")
        assert info_of(sup, "t")[0] is TaskState.STOPPING
        with pytest.raises(TaskNameInUseError):
            await sup.add(once("t", returns_done))


async def test_force_aborted_task_still_running_keeps_its_name(autojump_clock: Any) -> None:
    """A forced task that has not physically exited still holds its name, then frees it."""

    async def own_shield() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(10)

    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        waiter = await sup.add(once("t", own_shield))
        await trio.testing.wait_all_tasks_blocked()
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
        with pytest.raises(TaskNameInUseError):
            await sup.add(once("t", returns_done))
        await sup.wait_idle()
        assert (await (await sup.add(once("t", returns_done))).wait()).is_success


async def test_stopping_task_counts_against_max_registered_tasks(autojump_clock: Any) -> None:
    """A stopping task still takes a unit of max_registered_tasks."""
    async with open_supervisor(SupervisorConfig(max_registered_tasks=1)) as sup:
        await sup.add(once("old", defers_stop_for_10s))
        await trio.testing.wait_all_tasks_blocked()
        await sup.remove("old")
        with pytest.raises(ResourceLimitError):
            await sup.add(once("new", returns_done))


async def test_name_is_reusable_once_the_task_ended(autojump_clock: Any) -> None:
    """After a task's waiter resolved its name can be added again."""
    async with open_supervisor() as sup:
        await (await sup.add(once("t", returns_done))).wait()
        again = await sup.add(once("t"))
        assert [i.id for i in sup.list()] == [again.id]


async def test_add_over_max_registered_tasks_raises_resource_limit(autojump_clock: Any) -> None:
    """add past max_registered_tasks raises ResourceLimitError(resource, limit)."""
    async with open_supervisor(SupervisorConfig(max_registered_tasks=2)) as sup:
        await sup.add(once("a"))
        await sup.add(once("b"))
        with pytest.raises(ResourceLimitError) as info:
            await sup.add(once("c"))
        assert [i.name for i in sup.list()] == ["a", "b"]
    assert (info.value.resource, info.value.limit) == ("max_registered_tasks", 2)


async def test_cancelling_add_after_acceptance_does_not_undo_it(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while awaiting the registry's decision leaves the task added."""
    ran = trio.Event()

    async def body() -> None:
        ran.set()

    scope = trio.CancelScope()
    returned: list[TaskWaiter] = []
    async with open_supervisor() as sup:
        # A command in flight keeps add() off its fast path: it goes through the channel.
        sup.add_nowait(once("filler", returns_done))
        # The command is on the channel then: cancel the caller before it hears back.
        before_registry_reply(monkeypatch, scope.cancel)
        with scope:
            returned.append(await sup.add(once("t", body)))
        monkeypatch.undo()
        assert scope.cancelled_caught
        assert returned == []
        with trio.fail_after(1):
            await ran.wait()


# -- add_nowait ----------------------------------------------------------------------------


async def test_add_nowait_duplicate_resolves_rejected_already_exists(
    autojump_clock: Any,
) -> None:
    """A duplicate add_nowait resolves its waiter REJECTED(ALREADY_EXISTS)."""
    async with open_supervisor() as sup:
        await sup.add(once("t"))
        outcome = await sup.add_nowait(once("t", returns_done)).wait()
    assert (outcome.kind, outcome.rejection) == (OutcomeKind.REJECTED, RejectionKind.ALREADY_EXISTS)


async def test_add_nowait_over_limit_resolves_rejected_resource_limit(
    autojump_clock: Any,
) -> None:
    """add_nowait past max_registered_tasks resolves its waiter REJECTED(RESOURCE_LIMIT)."""
    async with open_supervisor(SupervisorConfig(max_registered_tasks=1)) as sup:
        await sup.add(once("a"))
        outcome = await sup.add_nowait(once("b", returns_done)).wait()
    assert (outcome.kind, outcome.rejection) == (OutcomeKind.REJECTED, RejectionKind.RESOURCE_LIMIT)


async def test_rejection_reasons_are_fixed_texts_per_kind(autojump_clock: Any) -> None:
    """Each rejection kind has one fixed, non-empty reason that does not vary by task."""
    async with open_supervisor(SupervisorConfig(max_registered_tasks=2)) as sup:
        await sup.add(once("a"))
        await sup.add(once("b"))
        waiters = [sup.add_nowait(once(name, returns_done)) for name in ("a", "b", "c", "d")]
        dup_a, dup_b, over_c, over_d = [(await w.wait()).reason for w in waiters]
    assert dup_a == dup_b
    assert over_c == over_d
    assert dup_a != over_c
    assert isinstance(dup_a, str)
    assert isinstance(over_c, str)
    assert dup_a
    assert over_c
    assert "'a'" not in dup_a
    assert "'c'" not in over_c


async def test_add_nowait_raises_would_block_when_the_command_channel_is_full(
    autojump_clock: Any,
) -> None:
    """With command_capacity=1, add_nowait raises trio.WouldBlock once the channel is full."""
    async with open_supervisor(SupervisorConfig(command_capacity=1)) as sup:
        await trio.testing.wait_all_tasks_blocked()
        # The first command goes straight to the waiting registry, the second fills the
        # one-slot buffer; nothing yields in between.
        sup.add_nowait(once("a"))
        sup.add_nowait(once("b"))
        with pytest.raises(trio.WouldBlock):
            sup.add_nowait(once("c"))


async def test_add_nowait_that_would_block_registers_nothing(autojump_clock: Any) -> None:
    """An add_nowait refused with WouldBlock leaves no task and no in-flight work behind."""
    async with open_supervisor(SupervisorConfig(command_capacity=1)) as sup:
        await trio.testing.wait_all_tasks_blocked()
        sup.add_nowait(once("a", returns_done))
        sup.add_nowait(once("b", returns_done))
        with pytest.raises(trio.WouldBlock):
            sup.add_nowait(once("c", returns_done))
        t0 = trio.current_time()
        await sup.wait_idle()
        assert (trio.current_time(), sup.list()) == (t0, ())


# -- add_batch -----------------------------------------------------------------------------


async def test_add_batch_registers_every_item(autojump_clock: Any) -> None:
    """An accepted batch returns one waiter per item, all registered, in order."""
    async with open_supervisor() as sup:
        waiters = await sup.add_batch([once(n) for n in "abc"])
        assert [w.name for w in waiters] == ["a", "b", "c"]
        assert [(i.id, i.name) for i in sup.list()] == [(w.id, w.name) for w in waiters]


async def test_add_batch_duplicate_within_the_batch_rejects_every_item(
    autojump_clock: Any,
) -> None:
    """A repeated name rejects the whole batch: first copy BATCH_REJECTED, later ALREADY_EXISTS."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        with pytest.raises(TaskNameInUseError) as info:
            await sup.add_batch([once(n) for n in "abac"])
        assert sup.list() == ()
    assert info.value.name == "a"
    assert add_failures(recorder) == [
        ("a", RejectionKind.BATCH_REJECTED),
        ("b", RejectionKind.BATCH_REJECTED),
        ("a", RejectionKind.ALREADY_EXISTS),
        ("c", RejectionKind.BATCH_REJECTED),
    ]


async def test_add_batch_duplicate_of_a_registered_name_rejects_every_item(
    autojump_clock: Any,
) -> None:
    """A batch item clashing with a registered task rejects the batch; innocents BATCH_REJECTED."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        await sup.add(once("r"))
        with pytest.raises(TaskNameInUseError) as info:
            await sup.add_batch([once("a"), once("r"), once("b")])
        assert [i.name for i in sup.list()] == ["r"]
    assert info.value.name == "r"
    assert add_failures(recorder) == [
        ("a", RejectionKind.BATCH_REJECTED),
        ("r", RejectionKind.ALREADY_EXISTS),
        ("b", RejectionKind.BATCH_REJECTED),
    ]


async def test_add_batch_error_names_the_first_conflicting_item(autojump_clock: Any) -> None:
    """With several clashes, TaskNameInUseError names the first one in batch order."""
    async with open_supervisor() as sup:
        await sup.add(once("r1"))
        await sup.add(once("r2"))
        with pytest.raises(TaskNameInUseError) as info:
            await sup.add_batch([once("a"), once("r2"), once("r1")])
    assert info.value.name == "r2"


async def test_rejected_batch_runs_no_body(autojump_clock: Any) -> None:
    """No body of a rejected batch ever runs."""
    ran: list[str] = []

    async def body() -> None:
        ran.append(current_context().name)

    async with open_supervisor() as sup:
        with pytest.raises(TaskNameInUseError):
            await sup.add_batch([once("x", body), once("y", body), once("x", body)])
        await sup.wait_idle()
        await trio.testing.wait_all_tasks_blocked()
    assert ran == []


async def test_add_batch_over_limit_raises_resource_limit_for_every_item(
    autojump_clock: Any,
) -> None:
    """A batch past max_registered_tasks raises ResourceLimitError; each item RESOURCE_LIMIT."""
    recorder = EventRecorder()
    config = SupervisorConfig(max_registered_tasks=3)
    async with open_supervisor(config, subscribers=[recorder]) as sup:
        await sup.add(once("r"))
        with pytest.raises(ResourceLimitError) as info:
            await sup.add_batch([once(n) for n in "abc"])
        assert [i.name for i in sup.list()] == ["r"]
    assert (info.value.resource, info.value.limit) == ("max_registered_tasks", 3)
    assert add_failures(recorder) == [(n, RejectionKind.RESOURCE_LIMIT) for n in "abc"]


async def test_batch_bodies_start_after_every_item_is_registered(autojump_clock: Any) -> None:
    """Every body of an accepted batch sees the whole batch registered when it starts."""
    seen: list[list[str]] = []

    async with open_supervisor() as sup:

        async def body() -> None:
            seen.append([i.name for i in sup.list()])
            await trio.sleep(1)

        for waiter in await sup.add_batch([once(n, body) for n in "abc"]):
            await waiter.wait()
    assert seen == [["a", "b", "c"]] * 3


# -- list, alive, statistics ---------------------------------------------------------------


async def test_list_is_sorted_by_id_with_task_info_fields(autojump_clock: Any) -> None:
    """list() gives TaskInfo(id, name, slot, state, attempt) sorted by id, not by name."""
    async with open_supervisor() as sup:
        b = await sup.add(once("b"))
        a = await sup.add(once("a"))
        await trio.testing.wait_all_tasks_blocked()
        infos = [(i.id, i.name, i.slot, i.state, i.attempt) for i in sup.list()]
    assert infos == [
        (b.id, "b", None, TaskState.RUNNING, 1),
        (a.id, "a", None, TaskState.RUNNING, 1),
    ]


async def test_list_reports_a_task_waiting_for_a_permit(autojump_clock: Any) -> None:
    """A task waiting for a max_concurrent permit is WAITING, with no attempt yet."""
    async with open_supervisor(SupervisorConfig(max_concurrent=1)) as sup:
        await sup.add(once("holder"))
        await sup.add(once("queued"))
        await trio.testing.wait_all_tasks_blocked()
        assert info_of(sup, "queued") == (TaskState.WAITING, 0)


async def test_list_reports_a_task_in_backoff(autojump_clock: Any) -> None:
    """A task sleeping between attempts is BACKOFF."""
    spec = TaskSpec.restartable("t", always_fails, backoff=BackoffPolicy.constant(10.0))
    async with open_supervisor() as sup:
        await sup.add(spec)
        await trio.testing.wait_all_tasks_blocked()
        assert info_of(sup, "t") == (TaskState.BACKOFF, 1)


async def test_list_reports_a_stopping_task(autojump_clock: Any) -> None:
    """A task whose stop was requested but that has not ended is STOPPING."""
    async with open_supervisor() as sup:
        await sup.add(once("t", defers_stop_for_10s))
        await trio.testing.wait_all_tasks_blocked()
        await sup.remove("t")
        assert info_of(sup, "t") == (TaskState.STOPPING, 1)


async def test_list_excludes_ended_tasks(autojump_clock: Any) -> None:
    """A task whose outcome is committed is no longer listed."""
    async with open_supervisor() as sup:
        await (await sup.add(once("t", returns_done))).wait()
        assert sup.list() == ()


def test_task_state_values() -> None:
    """TaskState has exactly WAITING, RUNNING, BACKOFF and STOPPING."""
    assert {s.name for s in TaskState} == {"WAITING", "RUNNING", "BACKOFF", "STOPPING"}


async def test_alive_snapshot_lists_running_attempts_sorted_by_name(
    autojump_clock: Any,
) -> None:
    """alive_snapshot() names tasks with an attempt in progress, sorted; backoff is not alive."""
    spec = TaskSpec.restartable("resting", always_fails, backoff=BackoffPolicy.constant(10.0))
    async with open_supervisor() as sup:
        await sup.add(once("zeta"))
        await sup.add(spec)
        await sup.add(once("alpha"))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.alive_snapshot() == ("alpha", "zeta")


async def test_waiting_for_a_permit_is_not_alive(autojump_clock: Any) -> None:
    """A task waiting for a concurrency permit is not alive."""
    async with open_supervisor(SupervisorConfig(max_concurrent=1)) as sup:
        await sup.add(once("holder"))
        await sup.add(once("queued"))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.alive_snapshot() == ("holder",)


async def test_is_alive_only_while_an_attempt_runs(autojump_clock: Any) -> None:
    """is_alive(name) is true for a running attempt, false in backoff or for unknown names."""
    spec = TaskSpec.restartable("resting", always_fails, backoff=BackoffPolicy.constant(10.0))
    async with open_supervisor() as sup:
        await sup.add(once("running"))
        await sup.add(spec)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.is_alive("running")
        assert not sup.is_alive("resting")
        assert not sup.is_alive("unknown")


def test_statistics_fields() -> None:
    """SupervisorStatistics has the documented counters."""
    assert [f.name for f in attrs.fields(SupervisorStatistics)] == [
        "registered",
        "running_attempts",
        "alive",
        "waiting_for_permit",
        "events_published",
        "events_dropped",
        "subscriber_dropped",
        "forced_alive",
    ]


async def test_statistics_count_tasks_attempts_and_permit_waits(autojump_clock: Any) -> None:
    """statistics() counts registered tasks, running attempts, alive and permit waiters."""
    async with open_supervisor(SupervisorConfig(max_concurrent=1)) as sup:
        await sup.add(once("holder"))
        await sup.add(once("queued"))
        await trio.testing.wait_all_tasks_blocked()
        stats = sup.statistics()
    assert (stats.registered, stats.running_attempts, stats.alive, stats.waiting_for_permit) == (
        2,
        1,
        1,
        1,
    )


async def test_statistics_count_published_events(autojump_clock: Any) -> None:
    """events_published counts the events built; nothing dropped with room everywhere."""
    recorder = EventRecorder()
    async with open_supervisor(subscribers=[recorder]) as sup:
        await (await sup.add(once("t", returns_done))).wait()
        await trio.testing.wait_all_tasks_blocked()
        stats = sup.statistics()
        assert len(recorder.events) == 6
    assert (stats.events_published, stats.events_dropped) == (6, 0)
    assert dict(stats.subscriber_dropped) == {"EventRecorder": 0}


# -- wait_idle -----------------------------------------------------------------------------


async def test_wait_idle_returns_at_once_when_idle(autojump_clock: Any) -> None:
    """wait_idle() on an idle supervisor returns without time passing."""
    async with open_supervisor() as sup:
        t0 = trio.current_time()
        await sup.wait_idle()
        assert trio.current_time() == t0


async def test_wait_idle_waits_for_an_in_flight_add_nowait(autojump_clock: Any) -> None:
    """wait_idle() counts an add_nowait command not yet processed by the registry."""
    async with open_supervisor() as sup:
        waiter = sup.add_nowait(once("t", returns_done))
        await sup.wait_idle()
        assert waiter.outcome_nowait().kind is OutcomeKind.COMPLETED


async def test_wait_idle_waits_for_running_tasks(autojump_clock: Any) -> None:
    """wait_idle() returns when the last running task has ended."""

    async def naps() -> None:
        await trio.sleep(5)

    async with open_supervisor() as sup:
        t0 = trio.current_time()
        await sup.add(once("short", returns_done))
        await sup.add(once("long", naps))
        await sup.wait_idle()
        assert trio.current_time() == t0 + 5


async def test_wait_idle_waits_for_a_forced_task_still_running(autojump_clock: Any) -> None:
    """A force-aborted task that keeps running keeps the supervisor busy until it exits."""

    async def own_shield() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(10)

    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        t0 = trio.current_time()
        waiter = await sup.add(once("t", own_shield))
        await trio.testing.wait_all_tasks_blocked()
        await sup.remove("t")
        assert (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
        assert trio.current_time() == t0 + 1
        await sup.wait_idle()
        assert trio.current_time() == t0 + 10


# -- config --------------------------------------------------------------------------------


async def test_config_property_is_the_given_config(autojump_clock: Any) -> None:
    """Supervisor.config is the SupervisorConfig passed to open_supervisor."""
    config = SupervisorConfig(grace=3.0, max_concurrent=2)
    async with open_supervisor(config) as sup:
        assert sup.config is config


async def test_config_defaults_without_a_config(autojump_clock: Any) -> None:
    """open_supervisor() without a config runs with SupervisorConfig() defaults."""
    async with open_supervisor() as sup:
        assert sup.config == SupervisorConfig()
        assert (sup.config.grace, sup.config.max_registered_tasks) == (60.0, 1024)
