"""Limits in one process: ``Supervisor.limited`` blocks and ``limit_snapshot`` (virtual time)."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ConcurrencyLimit,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    CriticalTaskError,
    DeadlockError,
    EventKind,
    FatalError,
    LimitView,
    OutcomeKind,
    Placement,
    RateLimit,
    Supervisor,
    SupervisorClosedError,
    SupervisorConfig,
    TaskDefaults,
    TaskSpec,
    TaskState,
    open_supervisor,
)
from trio_taskvisor.testing import EventRecorder

EXPORTS = ConcurrencyLimit("exports", 2)
PARTNER = RateLimit("partner", 2, per=1.0)  # one start every 0.5 s


async def _hold(
    sup: Supervisor,
    log: list[tuple[str, float]],
    name: str,
    *pools: ConcurrencyLimit | RateLimit,
    for_: float = 1.0,
) -> None:
    async with sup.limited(*pools):
        log.append((name, trio.current_time()))
        await trio.sleep(for_)


async def test_a_concurrency_pool_admits_capacity_blocks_at_once(autojump_clock: object) -> None:
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        for name in "abc":
            nursery.start_soon(_hold, sup, log, name, EXPORTS)
            await trio.testing.wait_all_tasks_blocked()
    assert log == [("a", 0.0), ("b", 0.0), ("c", 1.0)]


async def test_a_rate_pool_spaces_starts_by_its_interval(autojump_clock: object) -> None:
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        for name in "abcd":
            nursery.start_soon(_hold, sup, log, name, PARTNER)
            await trio.testing.wait_all_tasks_blocked()
    assert log == [("a", 0.0), ("b", 0.5), ("c", 1.0), ("d", 1.5)]


async def test_a_burst_starts_at_once_after_an_idle_stretch(autojump_clock: object) -> None:
    burst = RateLimit("burst", 1, per=1.0, burst=3)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        for name in "abcd":
            nursery.start_soon(_hold, sup, log, name, burst)
        await trio.testing.wait_all_tasks_blocked()
    assert [t for _, t in log] == [0.0, 0.0, 0.0, 1.0]


async def test_all_at_once_a_waiter_holds_nothing_meanwhile(autojump_clock: object) -> None:
    """The block for a and b waits for b without holding a: a block for a enters."""
    a, b = ConcurrencyLimit("a", 1), ConcurrencyLimit("b", 1)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        nursery.start_soon(_hold, sup, log, "b-holder", b)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, sup, log, "a-and-b", a, b)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, sup, log, "a-only", a)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.limit_snapshot() == (
            LimitView("a", None, "concurrency", 1, 1, capacity=1),
            LimitView("b", None, "concurrency", 1, 1, capacity=1),
        )
    # a-only leaves a at 1.0, when b frees too: a-and-b then takes both.
    assert log == [("b-holder", 0.0), ("a-only", 0.0), ("a-and-b", 1.0)]


async def test_oldest_waiter_that_fits_goes_first(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        for name in ("first", "second", "third"):
            nursery.start_soon(_hold, sup, log, name, one)
            await trio.testing.wait_all_tasks_blocked()
    assert log == [("first", 0.0), ("second", 1.0), ("third", 2.0)]


@pytest.mark.parametrize(("conc_for", "expected"), [(3.0, 3.0), (1.0, 2.0)])
async def test_a_block_waiting_for_a_rate_and_a_full_pool_starts_when_both_allow(
    autojump_clock: object, conc_for: float, expected: float
) -> None:
    """Its wake-up follows both pools' changes, whichever comes last (a prototype hung)."""
    rate, conc = RateLimit("r", 1, per=2.0), ConcurrencyLimit("c", 1)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        nursery.start_soon(_hold, sup, log, "rate", rate)  # next start allowed at 2.0
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(functools.partial(_hold, sup, log, "conc", conc, for_=conc_for))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, sup, log, "both", rate, conc)
    assert log == [("rate", 0.0), ("conc", 0.0), ("both", expected)]


async def test_cancelled_while_waiting_holds_nothing(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        nursery.start_soon(_hold, sup, log, "holder", one)
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.5):
            async with sup.limited(one):
                pytest.fail("entered a full pool")
        assert sup.limit_snapshot() == (LimitView("one", None, "concurrency", 1, 0, capacity=1),)
        nursery.start_soon(_hold, sup, log, "next", one)
    assert log == [("holder", 0.0), ("next", 1.0)]
    assert sup.limit_snapshot() == ()


async def test_a_rate_start_is_spent_on_entry_and_holds_nothing(autojump_clock: object) -> None:
    async with open_supervisor() as sup:
        async with sup.limited(PARTNER):
            assert sup.limit_snapshot() == ()  # a rate pool holds nothing
        async with sup.limited(PARTNER):
            assert trio.current_time() == 0.5


async def test_limited_is_a_checkpoint_when_it_does_not_wait() -> None:
    async with open_supervisor() as sup:
        with trio.testing.assert_checkpoints():
            async with sup.limited(EXPORTS):
                pass


async def test_asking_again_for_a_held_concurrency_pool_is_a_deadlock() -> None:
    async with open_supervisor() as sup, sup.limited(EXPORTS.key("acme")):
        with pytest.raises(DeadlockError, match=r"exports\[acme\], which this task already"):
            async with sup.limited(EXPORTS.key("acme")):
                pass
        # Another key's pool, and a rate pool, are fine.
        async with sup.limited(EXPORTS.key("other"), PARTNER), sup.limited(PARTNER):
            pass


@pytest.mark.parametrize(
    ("pools", "error", "message"),
    [
        ((), TypeError, r"limited\(\) takes at least one pool"),
        ((EXPORTS, EXPORTS), ConfigError, "each pool once, got exports twice"),
        (("exports",), TypeError, "a limit must be a ConcurrencyLimit"),
        ((ConcurrencyLimit("exports", 3),), ConfigError, "already known with other settings"),
    ],
)
async def test_bad_pools_raise_at_the_call(
    pools: tuple[object, ...], error: type[Exception], message: str
) -> None:
    async with open_supervisor() as sup:
        async with sup.limited(EXPORTS):
            pass
        with pytest.raises(error, match=message):
            async with sup.limited(*pools):  # type: ignore[arg-type]
                pass


async def test_limited_after_shutdown_began_raises_closed() -> None:
    async with open_supervisor() as sup:
        await sup.shutdown()
        with pytest.raises(SupervisorClosedError):
            async with sup.limited(EXPORTS):
                pass


async def test_a_block_waiting_when_shutdown_begins_raises_closed(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    raised: list[BaseException] = []

    async def waiter(sup: Supervisor) -> None:
        try:
            async with sup.limited(one):
                pytest.fail("entered after the shutdown began")
        except SupervisorClosedError as exc:
            raised.append(exc)
            assert trio.current_time() == 0.0

    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        nursery.start_soon(_hold, sup, [], "holder", one)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, sup)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(sup.shutdown)
    assert len(raised) == 1


async def test_an_attempt_waiting_in_a_block_when_shutdown_begins_ends_cancelled(
    autojump_clock: object,
) -> None:
    # The shutdown's stop reaches the block as it reaches the attempt: CANCELLED, not a
    # SupervisorClosedError that fails the task (and, for a critical one, the shutdown).
    one = ConcurrencyLimit("one", 1)
    entered: list[str] = []

    async def worker(name: str) -> None:
        async with sup.limited(one):
            entered.append(name)
            await trio.sleep_forever()

    async with open_supervisor() as sup:
        holder = await sup.add(TaskSpec.once("holder", worker, "holder"))
        await trio.testing.wait_all_tasks_blocked()
        critical = await sup.add(TaskSpec.once("critical", worker, "critical", critical=True))
        retried = await sup.add(TaskSpec.restartable("retried", worker, "retried"))
        await trio.testing.wait_all_tasks_blocked()
    assert entered == ["holder"]
    for handle in (holder, critical, retried):
        outcome = handle.outcome_nowait()
        assert outcome is not None
        assert outcome.kind is OutcomeKind.CANCELLED, (handle.name, outcome)
    assert trio.current_time() == 0.0


@pytest.mark.parametrize("through", ["limit", "max_concurrent"])
async def test_units_a_failing_critical_task_gives_back_start_nothing(
    autojump_clock: object, through: str
) -> None:
    # The critical task's exit gives its unit (or permit) back and begins the shutdown:
    # the task waiting for it ends CANCELLED, its body never run. Before, it was granted
    # the unit first and its body started during the shutdown (a card charged), then ended
    # CANCELLED at its first checkpoint, or COMPLETED if it reached none.
    one = ConcurrencyLimit("one", 1)
    ran: list[float] = []

    async def sync() -> None:
        await trio.sleep(1.0)
        raise FatalError("database gone")

    async def charge() -> None:
        ran.append(trio.current_time())

    limits = (one,) if through == "limit" else ()
    max_concurrent = 1 if through == "max_concurrent" else None
    recorder = EventRecorder()
    config = SupervisorConfig(max_concurrent=max_concurrent, log_failures=False)
    with pytest.raises(CriticalTaskError):  # noqa: PT012
        async with open_supervisor(config, subscribers=[recorder]) as sup:
            await sup.add(TaskSpec.once("sync", sync, critical=True, limits=limits))
            waiter = await sup.add(TaskSpec.once("charge", charge, limits=limits))
            await trio.sleep_forever()
    assert ran == []
    assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
    assert recorder.kinds(EventKind.ATTEMPT_STARTING) == [EventKind.ATTEMPT_STARTING]
    assert trio.current_time() == 1.0


@pytest.mark.parametrize("shielded", [False, True])
async def test_an_attempt_entering_a_block_after_shutdown_began_ends_cancelled(
    autojump_clock: object, shielded: bool
) -> None:
    # Woken as the supervisor's block ends, its attempt next runs once the shutdown has
    # begun: the block waits for the shutdown's stop, which ends it with the attempt
    # (CANCELLED). Before, it raised SupervisorClosedError: the task ended FAILED, and a
    # critical one turned the clean exit into CriticalTaskError. A shielded block, which
    # the stop cannot end, raises it once the stops were asked (no wait for ever), into
    # the stopped attempt.
    one = ConcurrencyLimit("one", 1)
    go = trio.Event()

    async def worker() -> None:
        await go.wait()
        with trio.CancelScope(shield=shielded):
            async with sup.limited(one):
                pytest.fail("entered after the shutdown began")

    async with open_supervisor() as sup:
        critical = await sup.add(TaskSpec.once("critical", worker, critical=True))
        await trio.testing.wait_all_tasks_blocked()
        go.set()
    outcome = critical.outcome_nowait()
    assert outcome is not None
    assert outcome.kind is OutcomeKind.CANCELLED, outcome
    assert trio.current_time() == 0.0


async def test_a_block_in_a_task_an_attempt_spawned_outside_it_still_raises_closed(
    autojump_clock: object,
) -> None:
    # Its context names the attempt, but the attempt's stop does not reach it: it is
    # refused as any outside block is, once the stops have been asked (no wait for ever).
    one = ConcurrencyLimit("one", 1)
    raised: list[tuple[BaseException, float]] = []

    async def outside(sup: Supervisor) -> None:
        try:
            async with sup.limited(one):
                pytest.fail("entered after the shutdown began")
        except SupervisorClosedError as exc:
            raised.append((exc, trio.current_time()))

    async with trio.open_nursery() as nursery:

        async def spawner() -> None:
            nursery.start_soon(outside, sup)
            await trio.sleep_forever()

        async with open_supervisor() as sup:
            nursery.start_soon(functools.partial(_hold, sup, [], "holder", one, for_=10.0))
            await trio.testing.wait_all_tasks_blocked()
            await sup.add(TaskSpec.once("spawner", spawner))
            await trio.testing.wait_all_tasks_blocked()
    assert [(type(exc), at) for exc, at in raised] == [(SupervisorClosedError, 0.0)]


async def test_known_pools_keep_their_first_settings_for_the_supervisor_life() -> None:
    async with open_supervisor() as sup:
        async with sup.limited(EXPORTS.key("a")):
            pass
        assert sup.limit_snapshot() == ()  # unused pools are forgotten, their settings not
        with pytest.raises(ConfigError, match="'exports' is already known"):
            async with sup.limited(RateLimit("exports", 1)):
                pass


# -- attempts -----------------------------------------------------------------------------------


async def _work(log: list[tuple[str, float]], name: str, seconds: float = 1.0) -> None:
    log.append((name, trio.current_time()))
    await trio.sleep(seconds)


async def test_every_attempt_takes_its_limits_before_it_starts(autojump_clock: object) -> None:
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup:
        for name in "abc":
            await sup.add(TaskSpec.once(name, _work, log, name, limits=(EXPORTS,)))
        await sup.wait_idle()
    assert log == [("a", 0.0), ("b", 0.0), ("c", 1.0)]


async def test_a_waiting_task_is_waiting_not_alive_and_its_timeout_not_begun(
    autojump_clock: object,
) -> None:
    one = ConcurrencyLimit("one", 1)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup:
        await sup.add(TaskSpec.once("a", _work, log, "a", 5.0, limits=(one,)))
        waiter = await sup.add(TaskSpec.once("b", _work, log, "b", limits=(one,), timeout=2.0))
        await trio.testing.wait_all_tasks_blocked()
        assert [info.state for info in sup.list()] == [TaskState.RUNNING, TaskState.WAITING]
        assert sup.statistics().waiting_for_permit == 1
        assert not sup.is_alive("b")
        assert sup.limit_snapshot() == (LimitView("one", None, "concurrency", 1, 1, capacity=1),)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.COMPLETED  # its 2 s timeout began at 5.0
    assert log == [("a", 0.0), ("b", 5.0)]


async def test_retries_and_periodic_runs_take_their_limits_each_time(
    autojump_clock: object,
) -> None:
    starts: list[float] = []

    async def tick() -> None:
        starts.append(trio.current_time())
        if len(starts) == 4:
            raise FatalError("enough")

    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.periodic("tick", 0.0, tick, limits=(PARTNER,)))
        await waiter.wait()
    assert starts == [0.0, 0.5, 1.0, 1.5]


async def test_a_stop_while_waiting_ends_cancelled_holding_nothing(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    log: list[tuple[str, float]] = []
    async with open_supervisor() as sup:
        await sup.add(TaskSpec.once("a", _work, log, "a", limits=(one,)))
        waiter = await sup.add(TaskSpec.once("b", _work, log, "b", limits=(one,)))
        assert await sup.remove("b")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        assert sup.limit_snapshot() == (LimitView("one", None, "concurrency", 1, 0, capacity=1),)
        await sup.wait_idle()
    assert log == [("a", 0.0)]


async def test_waiting_attempts_end_cancelled_at_shutdown(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        await sup.add(TaskSpec.once("a", trio.sleep_forever, limits=(one,)))
        waiter = await sup.add(TaskSpec.once("b", trio.sleep_forever, limits=(one,)))
    assert waiter.outcome_nowait().kind is OutcomeKind.CANCELLED


async def test_a_forced_attempt_keeps_its_unit_until_it_exits(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    log: list[tuple[str, float]] = []

    async def stubborn() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(10.0)

    async with open_supervisor(SupervisorConfig(grace=1.0)) as sup:
        await sup.add(TaskSpec.once("stubborn", stubborn, limits=(one,)))
        await sup.add(TaskSpec.once("next", _work, log, "next", limits=(one,)))
        await sup.remove("stubborn")  # forced at 1.0, exits at 10.0
        await sup.wait_idle()
    assert log == [("next", 10.0)]


async def test_limits_inherit_from_the_defaults_and_bad_settings_raise_at_add() -> None:
    defaults = TaskDefaults(limits=(EXPORTS,))
    async with open_supervisor(SupervisorConfig(task_defaults=defaults)) as sup:
        await sup.add(TaskSpec.once("a", trio.sleep_forever))
        assert sup.limit_snapshot()[0].held == 1
        with pytest.raises(ConfigError, match="'exports' is already known"):
            await sup.add(TaskSpec.once("b", trio.sleep_forever, limits=(RateLimit("exports", 1),)))
        assert [info.name for info in sup.list()] == ["a"]
        await sup.cancel("a")


@pytest.mark.parametrize(
    ("limits", "error", "message"),
    [
        ([EXPORTS], TypeError, "limits must be a tuple"),
        ((EXPORTS, EXPORTS), ConfigError, "each pool once"),
        (("exports",), TypeError, "a limit must be a ConcurrencyLimit"),
    ],
)
def test_bad_limits_options_raise_at_construction(
    limits: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        TaskSpec.once("x", trio.sleep_forever, limits=limits)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        TaskDefaults(limits=limits)  # type: ignore[arg-type]


async def test_limit_events_only_for_attempts_that_waited_for_a_pool(
    autojump_clock: object,
) -> None:
    one = ConcurrencyLimit("one", 1)
    recorder = EventRecorder()
    config = SupervisorConfig(max_concurrent=1)
    async with open_supervisor(config, subscribers=[recorder]) as sup:
        await sup.add(TaskSpec.once("a", trio.sleep, 1.0, limits=(one,)))
        await sup.add(TaskSpec.once("b", trio.sleep, 1.0, limits=(one, PARTNER.key("k"))))
        await sup.add(TaskSpec.once("permit-only", trio.sleep, 1.0))
        await sup.wait_idle()
    waiting = recorder.of(EventKind.LIMIT_WAITING)
    assert [(e.name, e.reason) for e in waiting] == [("b", "waiting for one")]
    acquired = recorder.of(EventKind.LIMIT_ACQUIRED)
    assert [(e.name, e.reason, e.time) for e in acquired] == [("b", "one, partner[k]", 1.0)]


async def test_a_wait_begun_without_a_subscriber_publishes_no_limit_events(
    autojump_clock: object,
) -> None:
    """A stream opened while an attempt waits for a pool sees no LIMIT_ACQUIRED for it
    (nor its LIMIT_WAITING, published before): the pair is for a subscriber there when
    the wait began."""
    one = ConcurrencyLimit("one", 1)
    async with open_supervisor() as sup:
        await sup.add(TaskSpec.once("a", trio.sleep, 1.0, limits=(one,)))
        waiter = await sup.add(TaskSpec.once("b", trio.sleep, 1.0, limits=(one,)))
        kinds: list[EventKind] = []
        async with sup.events() as stream:
            async for event in stream:  # until b is gone
                kinds.append(event.kind)
                if event.kind is EventKind.TASK_REMOVED and event.name == "b":
                    break
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        assert EventKind.ATTEMPT_STARTING in kinds  # b's start was seen
        assert EventKind.LIMIT_ACQUIRED not in kinds


async def test_a_slot_owner_waiting_for_its_limits_keeps_the_slot(autojump_clock: object) -> None:
    one = ConcurrencyLimit("one", 1)
    log: list[tuple[str, float]] = []
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config) as sup:
        await sup.add(TaskSpec.once("holder", _work, log, "holder", 3.0, limits=(one,)))
        first = ControllerSpec.queue(
            TaskSpec.once("first", _work, log, "first", limits=(one,)), slot="s"
        )
        await sup.submit(first)
        second = ControllerSpec.queue(TaskSpec.once("second", _work, log, "second"), slot="s")
        waiter = await sup.submit(second)
        assert waiter.placement is Placement.QUEUED
        await sup.wait_idle()
    assert log == [("holder", 0.0), ("first", 3.0), ("second", 4.0)]


async def test_run_in_slot_takes_limits_as_a_task_option(autojump_clock: object) -> None:
    config = SupervisorConfig(controller=ControllerConfig())
    async with open_supervisor(config) as sup:
        starts = []

        async def call(i: int) -> int:
            starts.append(trio.current_time())
            return i

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(
                    functools.partial(sup.run_in_slot, f"s{i}", call, i, limits=(PARTNER,))
                )
    assert starts == [0.0, 0.5, 1.0]


ONE = ConcurrencyLimit("one", 1)


async def test_work_started_in_a_limited_block_does_not_hold_its_pools(
    autojump_clock: object,
) -> None:
    """Supervised work added in a block, and a child task spawned in it, inherit the
    block's context but hold none of its units: their own ``limited`` waits for the
    unit (here until the block ends at 1.0) instead of raising ``DeadlockError``. (Both
    used to raise "which this task already holds": the context carried the block's
    pools into them.)"""
    started: list[tuple[str, float]] = []

    async def body(sup: Supervisor, who: str) -> None:
        async with sup.limited(ONE):
            started.append((who, trio.current_time()))

    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        async with sup.limited(ONE):
            waiter = await sup.add(TaskSpec.once("added", body, sup, "added"))
            nursery.start_soon(body, sup, "child")
            await trio.sleep(1.0)
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert sorted(started) == [("added", 1.0), ("child", 1.0)]


async def test_another_supervisors_block_holds_none_of_this_ones_pools() -> None:
    """Each supervisor has its own pools: a block of one inside a block of the other, on
    a limit of the same name, holds a unit of each (it used to raise DeadlockError),
    while the same supervisor's nested block still does."""
    async with open_supervisor() as a, open_supervisor() as b, a.limited(ONE), b.limited(ONE):
        assert [p.held for p in a.limit_snapshot()] == [1]
        assert [p.held for p in b.limit_snapshot()] == [1]
        with pytest.raises(DeadlockError, match="one, which this task already holds"):
            async with a.limited(ONE):
                pass


@pytest.mark.parametrize("in_child", [False, True])
async def test_limited_inside_an_attempt_holding_the_pool_is_a_deadlock(in_child: bool) -> None:
    """Also in a child task the attempt spawned: unlike a block's, an attempt's units
    cover the tasks it spawns (they are held until it physically exits). The error
    names the attempt that holds the pool, not the child."""

    async def body(sup: Supervisor) -> None:
        if in_child:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(limited, sup)
        else:
            await limited(sup)

    async def limited(sup: Supervisor) -> None:
        async with sup.limited(EXPORTS):
            pass

    async with open_supervisor() as sup:
        waiter = await sup.add(TaskSpec.once("x", body, sup, limits=(EXPORTS,)))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED
    error = outcome.error
    if in_child:
        assert isinstance(error, ExceptionGroup)
        [error] = error.exceptions
    assert isinstance(error, DeadlockError)
    assert "exports, which the current attempt of task 'x' already holds" in str(error)


@pytest.mark.parametrize("waiter", ["attempt", "block"])
async def test_a_rate_waiter_granted_by_another_acquisition_starts_then(
    autojump_clock: trio.testing.MockClock, waiter: str
) -> None:
    """A rate pool's waiter whose start falls due is granted by the next acquisition of
    any pool, if that comes before the supervisor's own timer: it starts at once. Before,
    the grant was made and not delivered: the waiter started when some unit was next
    given back (here, when the other block exited), or never; a block cancelled
    meanwhile kept its units for good, and the next release crashed the supervisor."""
    rate, other = RateLimit("r", 1, per=1.0), ConcurrencyLimit("other", 1)
    started: list[float] = []

    async def body() -> None:
        started.append(trio.current_time())

    async def block(sup: Supervisor) -> None:
        async with sup.limited(rate):
            started.append(trio.current_time())

    async with open_supervisor() as sup, trio.open_nursery() as nursery:
        async with sup.limited(rate):  # spends the start: the next is due at 1.0
            pass
        if waiter == "attempt":
            await sup.add(TaskSpec.once("x", body, limits=(rate,)))
        else:
            nursery.start_soon(block, sup)
        await trio.testing.wait_all_tasks_blocked()
        autojump_clock.jump(1.0)  # the next acquisition runs before the timer does
        async with sup.limited(other):
            await trio.sleep(5.0)
    assert started == [1.0]
    assert sup.limit_snapshot() == ()
