"""Limits in one process: ``Supervisor.limited`` blocks and ``limit_snapshot`` (virtual time)."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from trio_taskvisor import (
    ConcurrencyLimit,
    ConfigError,
    DeadlockError,
    LimitView,
    RateLimit,
    Supervisor,
    SupervisorClosedError,
    open_supervisor,
)

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


async def test_known_pools_keep_their_first_settings_for_the_supervisor_life() -> None:
    async with open_supervisor() as sup:
        async with sup.limited(EXPORTS.key("a")):
            pass
        assert sup.limit_snapshot() == ()  # unused pools are forgotten, their settings not
        with pytest.raises(ConfigError, match="'exports' is already known"):
            async with sup.limited(RateLimit("exports", 1)):
                pass
