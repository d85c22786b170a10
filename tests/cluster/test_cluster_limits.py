"""Limit pools across the cluster, through the public API: supervisors with a slot store
in this process (each its own instance), against the real server (real clock).

Timing bounds are liveness bounds with at least a 2x margin; waits are for events and
outcomes. The tests with OS processes (a shared pool under SIGKILL and SIGSTOP) are in
``test_cluster_limit_replicas``.
"""

from __future__ import annotations

import logging

import attrs
import coredis
import pytest
import trio
from cluster_helpers import (
    FAILED_BY_THE_PROXY,
    Scripts,
    config,
    failing_proxy,
    replica,
)
from conftest import RedisServer

from trio_taskvisor import (
    ConcurrencyLimit,
    ConfigError,
    ControllerSpec,
    EventKind,
    LeaseLostError,
    OutcomeKind,
    RateLimit,
    SlotStoreUnavailableError,
    Supervisor,
    TaskSpec,
    TaskState,
    TaskWaiter,
    open_supervisor,
)
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._redis_client import read_namespace
from trio_taskvisor.redis import RedisSlotStore

TTL = 1.0


def held_by(
    gate: trio.Event, name: str, pool: object, started: trio.Event | None = None
) -> TaskSpec:
    """``once`` work holding ``pool`` (a tuple: each of its pools) until ``gate`` is set
    (``started``: set on entry)."""

    async def body() -> None:
        if started is not None:
            started.set()
        await gate.wait()

    return TaskSpec.once(name, body, limits=pool if isinstance(pool, tuple) else (pool,))


@attrs.define
class BlockUntilLost:
    """A ``limited`` block held until its units are lost: ``entered`` is set inside it,
    ``lost`` once ``LeaseLostError`` ended it (kept in ``errors``)."""

    entered: trio.Event = attrs.field(factory=trio.Event)
    lost: trio.Event = attrs.field(factory=trio.Event)
    errors: list[BaseException] = attrs.field(factory=list)

    async def hold(self, sup: Supervisor, *pools: ConcurrencyLimit | RateLimit) -> None:
        try:
            async with sup.limited(*pools):
                self.entered.set()
                await trio.sleep_forever()
        except LeaseLostError as exc:
            self.errors.append(exc)
            self.lost.set()


def said(caplog: pytest.LogCaptureFixture, level: int, text: str = "") -> list[str]:
    """The messages of the records at ``level`` that hold ``text``."""
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


async def test_a_pool_holds_across_supervisors(store: RedisSlotStore) -> None:
    """A capacity-1 pool used by two instances: the second waits (``LIMIT_WAITING``,
    ``WAITING``) until the first's attempt exits, then starts (``LIMIT_ACQUIRED``)."""
    exports = ConcurrencyLimit("exports", 1)
    gate_a, gate_b = trio.Event(), trio.Event()
    async with replica(store) as (a, _), replica(store) as (b, recorder_b):
        started = trio.Event()
        waiter_a = await a.add(held_by(gate_a, "a", exports, started))
        with trio.fail_after(2 * TTL):
            await started.wait()
        waiter_b = await b.add(held_by(gate_b, "b", exports))
        with trio.fail_after(2 * TTL):
            event = await recorder_b.wait_for(EventKind.LIMIT_WAITING)
        assert event.reason == "waiting for exports"
        assert b.statistics().waiting_for_permit == 1
        assert [info.state for info in b.list()] == [TaskState.WAITING]
        info = await a.cluster_limit(exports)
        assert (info.held, info.holders, info.waiting) == (1, {a.instance_id: 1}, 1)
        assert info.next_start_in is None
        gate_a.set()
        assert (await waiter_a.wait()).kind is OutcomeKind.COMPLETED
        with trio.fail_after(2 * TTL):
            acquired = await recorder_b.wait_for(EventKind.LIMIT_ACQUIRED)
        assert acquired.reason == "exports"
        info = await a.cluster_limit(exports)
        assert (info.held, info.holders, info.waiting) == (1, {b.instance_id: 1}, 0)
        gate_b.set()
        assert (await waiter_b.wait()).kind is OutcomeKind.COMPLETED
        info = await b.cluster_limit(exports)
        assert (info.held, info.holders, info.waiting) == (0, {}, 0)


async def test_limited_blocks_share_a_pool_across_supervisors(store: RedisSlotStore) -> None:
    """A ``limited`` block of another instance waits for the holder's block to exit."""
    pool = ConcurrencyLimit("blocks", 1).key("tenant-a")
    order: list[str] = []
    async with replica(store) as (a, _), replica(store) as (b, _):
        entered = trio.Event()
        leave = trio.Event()

        async def first() -> None:
            async with a.limited(pool):
                order.append("a in")
                entered.set()
                await leave.wait()
                order.append("a out")

        async def second() -> None:
            await entered.wait()
            async with b.limited(pool):
                order.append("b in")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
            await entered.wait()
            with trio.fail_after(2 * TTL):
                # the server's state: no event tells when b's request has reached it
                while not (await a.cluster_limit(pool)).waiting:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert [v.waiting for v in b.limit_snapshot()] == [1]
            leave.set()
    assert order == ["a in", "a out", "b in"]


async def test_other_settings_across_the_cluster_end_the_task_fatal(
    store: RedisSlotStore,
) -> None:
    """The server keeps a pool's first settings while it is in use: another instance's
    attempt with other settings ends ``FATAL`` with a ``ConfigError``; a block raises it."""
    gate = trio.Event()
    async with replica(store) as (a, _), replica(store) as (b, _):
        started = trio.Event()
        waiter_a = await a.add(held_by(gate, "a", ConcurrencyLimit("shared", 2), started))
        with trio.fail_after(2 * TTL):
            await started.wait()
        waiter_b = await b.add(held_by(gate, "b", ConcurrencyLimit("shared", 3)))
        with trio.fail_after(2 * TTL):
            outcome = await waiter_b.wait()
        assert outcome.kind is OutcomeKind.FATAL
        assert isinstance(outcome.error, ConfigError)
        assert str(outcome.error) == (
            "limit 'shared' is used across the cluster with other settings: "
            "concurrency 2, got concurrency 3"
        )
        with pytest.raises(ConfigError, match="other settings"):
            async with b.limited(ConcurrencyLimit("shared", 3)):
                pass  # pragma: no cover
        gate.set()
        assert (await waiter_a.wait()).kind is OutcomeKind.COMPLETED


async def test_an_error_reply_to_an_acquisition_ends_the_task_fatal_naming_it(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """The server answers an acquisition with an error (foreign data: the pool's key is
    a string): the task ends ``FATAL`` with a ``SlotStoreUnavailableError`` that names
    the units asked for and the server's error (its ``__cause__``), and a block raises
    it. It used to read as a settings conflict ("... with other settings: an error:
    WrongTypeError ..., got these", a ``ConfigError``)."""
    await client.set(f"{store.key_prefix}lp:foreign", "not a hash")
    limit = ConcurrencyLimit("foreign", 2)
    async with replica(store) as (sup, _):
        waiter = await sup.add(TaskSpec.once("t", trio.lowlevel.checkpoint, limits=(limit,)))
        with trio.fail_after(2 * TTL):
            outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FATAL
        assert isinstance(outcome.error, SlotStoreUnavailableError)
        assert str(outcome.error).startswith(
            f"slot store {store.safe_url} refused the units of 'foreign': WrongTypeError: "
        )
        assert isinstance(outcome.error.__cause__, coredis.exceptions.WrongTypeError)
        with pytest.raises(SlotStoreUnavailableError, match="refused the units of 'foreign'"):
            async with sup.limited(limit):
                pass  # pragma: no cover
        other = await sup.add(TaskSpec.once("other", trio.lowlevel.checkpoint))
        assert (await other.wait()).kind is OutcomeKind.COMPLETED


async def test_an_acquisition_that_fails_after_its_grant_is_withdrawn(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """The pool's waiting groups key holds foreign data, which the acquisition reads only
    after it granted the unit (a script keeps what it wrote before an error): the task
    ends ``FATAL``, and its keeper withdraws the request, so the unit it never heard of
    is given back. Before, the unit stayed held while the process lived (a pool of 1
    with no room, for every replica)."""
    await client.set(f"{store.key_prefix}lq:halfway", "not a zset")
    limit = ConcurrencyLimit("halfway", 1)
    holders = f"{store.key_prefix}lh:halfway"
    async with replica(store) as (sup, _):
        waiter = await sup.add(TaskSpec.once("t", trio.lowlevel.checkpoint, limits=(limit,)))
        with trio.fail_after(2 * TTL):
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.FATAL
            while await client.hlen(holders):  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_a_release_gives_back_every_unit_past_foreign_data_and_logs_it(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A task holds units of ``first`` and ``second`` when ``first``'s settings key is
    overwritten with foreign data: its release reads that key as none, gives back the
    unit of ``second`` and the keeper logs the key at ERROR. Before, the release failed
    at the key, before it gave back the unit of ``second``, and was never sent again:
    the unit stayed held while the process lived."""
    first, second = ConcurrencyLimit("first", 2), ConcurrencyLimit("second", 1)
    gate, started = trio.Event(), trio.Event()
    key = f"{store.key_prefix}lp:first"
    async with replica(store) as (sup, _):
        waiter = await sup.add(held_by(gate, "t", (first, second), started))
        with trio.fail_after(2 * TTL):
            await started.wait()
        await client.delete([key])
        await client.set(key, "not a hash")
        gate.set()
        with trio.fail_after(2 * TTL):
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
            while await client.hlen(f"{store.key_prefix}lh:second"):  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert any(
            r.levelno == logging.ERROR
            and "slot store limit release of" in r.getMessage()
            and f"read as none: foreign data in the slot store at {key}: WRONGTYPE"
            in r.getMessage()
            for r in caplog.records
        )
        await client.delete([key])


async def test_an_acquisition_reads_another_process_key_of_foreign_data_as_none(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Another process, C, waits for pools ``s`` and ``zf``, both held by a process whose
    units then died; ``zf``'s settings key is overwritten with foreign data. A block of
    this process asks for ``s``: its acquisition settles ``s``, meets C's group, reads
    ``zf``'s key as none (no room there: C waits on) and is granted, and the keeper logs
    the key at ERROR. Before, the acquisition failed: the block raised
    ``SlotStoreUnavailableError`` for another process's key."""
    other = Scripts(client, store)
    dead, c = "host-a:1:0000000a", "host-c:3:0000000c"
    pools = [("s", "concurrency 1"), ("zf", "concurrency 1")]
    for w, instance in ((f"{dead}/1", dead), (f"{c}/1", c)):
        await other.call(scripts.LIMIT_ACQUIRE, *scripts.limit_acquire_args(instance, w, pools))
    await client.delete([f"{store.key_prefix}lu:{dead}"])
    key = f"{store.key_prefix}lp:zf"
    await client.delete([key])
    await client.set(key, "foreign")
    async with replica(store) as (sup, _):
        with trio.fail_after(2 * TTL):
            async with sup.limited(ConcurrencyLimit("s", 1)):
                holders = await client.hgetall(f"{store.key_prefix}lh:s")
                assert [h.split("/")[0] for h in holders] == [sup.instance_id]
    assert any(
        r.levelno == logging.ERROR
        and "slot store limit acquisition of" in r.getMessage()
        and f"read as none: foreign data in the slot store at {key}: WRONGTYPE" in r.getMessage()
        for r in caplog.records
    )
    await client.delete([key])


async def test_a_poll_answered_with_an_error_after_a_pushed_grant_keeps_the_units(
    store: RedisSlotStore, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A block waits for a concurrency pool and a rate pool; when the rate pool allows a
    start it asks again (a poll), and the server answers that poll with an error only
    after another process's release granted the block its units by a push (the block
    entered). The units stay held: the error is logged, and the pool counts the block
    until it exits. Before, the failed poll refused the granted request and withdrew
    it on the server: the pool had room for another holder while the block ran on."""
    conc, rate = ConcurrencyLimit("polled", 1), RateLimit("polled-rate", 1, per=TTL)
    async with (
        failing_proxy(redis_server.port, hold=True) as proxy,
        replica(proxy.store(store)) as (b, _),
        replica(store) as (a, _),
    ):
        a_in, a_out, b_in, b_out = trio.Event(), trio.Event(), trio.Event(), trio.Event()

        async def first() -> None:
            async with a.limited(conc, rate):  # holds conc, spends the rate's start
                a_in.set()
                await a_out.wait()

        async def second() -> None:
            await a_in.wait()
            async with b.limited(conc, rate):
                b_in.set()
                await b_out.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
            with trio.fail_after(2 * TTL):
                while not (await a.cluster_limit(conc)).waiting:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            proxy.failing.add(scripts.LIMIT_ACQUIRE.sha)
            with trio.fail_after(3 * TTL):
                await proxy.failed.wait()  # the poll, once the rate pool allows a start
            a_out.set()  # its release grants b by a push
            with trio.fail_after(2 * TTL):
                await b_in.wait()
            proxy.release.set()  # then the poll's error
            with trio.fail_after(2 * TTL):
                while not said(caplog, logging.ERROR):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await trio.sleep(TTL)  # three renewals
            info = await a.cluster_limit(conc)
            assert (info.held, info.holders) == (1, {b.instance_id: 1})
            b_out.set()
        with trio.fail_after(2 * TTL):
            while (await a.cluster_limit(conc)).held:  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_waiters_of_a_rate_pool_ask_again_once_per_start(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Thirty blocks of one process wait for a rate pool of 30 starts a second. Each
    asks the server once; then, each time the pool allows a start, only the oldest
    asks again (only the oldest waiter of a set of pools can be granted, and its call
    grants whoever is first across the cluster): about three calls per block. Before,
    every waiter asked again at every start, 480 calls for 30 starts, growing with the
    square of the waiters (1,000 of them on a pool of 10 a second: 10,000 calls a
    second)."""
    n, rate = 30, RateLimit("herd", 30)
    entered = 0

    async def block() -> None:
        nonlocal entered
        async with sup.limited(rate):
            entered += 1

    async with (
        failing_proxy(redis_server.port) as proxy,
        replica(proxy.store(store)) as (sup, _),
    ):
        with trio.fail_after(4 * TTL):  # 30 starts at 30 a second: 1 s
            async with trio.open_nursery() as nursery:
                for _ in range(n):
                    nursery.start_soon(block)
        assert entered == n
        assert proxy.calls[scripts.LIMIT_ACQUIRE.sha] <= 4 * n


async def test_a_release_the_server_answers_with_an_error_is_sent_again(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task holds units of ``first`` and ``second``; the server answers its release
    with an error that is no foreign data (a proxy fails the script, as a command the
    user may no longer run would). The keeper logs the error at ERROR and sends the
    release again with each renewal (every ``lease_ttl / 3``), logging its failures again
    at DEBUG only: once the server takes it, the release works, and the keeper logs at
    INFO that it did. Before, a release answered with an error was never sent again: what
    it had not done stayed undone while the process lived; then it was, logged at ERROR
    each time."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    first, second = ConcurrencyLimit("first", 2), ConcurrencyLimit("second", 1)
    gate, started = trio.Event(), trio.Event()
    holders = f"{store.key_prefix}lh:second"
    async with (
        failing_proxy(redis_server.port) as proxy,
        replica(proxy.store(store)) as (sup, _),
    ):
        waiter = await sup.add(held_by(gate, "t", (first, second), started))
        with trio.fail_after(2 * TTL):
            await started.wait()
        proxy.failing.add(scripts.LIMIT_RELEASE.sha)
        gate.set()
        with trio.fail_after(2 * TTL):
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
            while not said(caplog, logging.ERROR):  # noqa: ASYNC110
                await trio.sleep(0.01)
        await trio.sleep(TTL)  # three renewals sent it again
        (error,) = said(caplog, logging.ERROR)
        assert error.startswith("slot store limit release of ")
        assert f" failed: ResponseError: {FAILED_BY_THE_PROXY}" in error
        assert error.endswith("(sent again with each renewal until it works)")
        assert len(said(caplog, logging.DEBUG, "slot store limit release of ")) >= 2
        assert await client.hlen(holders) == 1
        proxy.failing.clear()
        with trio.fail_after(2 * TTL):
            while not said(caplog, logging.INFO, "slot store limit release of "):  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert (await sup.cluster_limit(second)).held == 0
        assert len(said(caplog, logging.ERROR)) == 1


async def test_a_limit_renewal_the_server_answers_with_an_error_is_logged_once(
    store: RedisSlotStore, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica ``b`` holds the one unit of ``solo``, and a task of ``a`` waits for it;
    the server answers ``a``'s limit renewals with an error that is no foreign data (a
    proxy fails the script, as a command the user may no longer run would). No outage:
    the waiter waits, as while the store is unavailable, and each renewal makes the call
    again; the keeper logs the error at ERROR once, at DEBUG after. Once the server takes
    it, the next renewal works (logged at INFO), and the waiter starts when ``b`` gives
    its unit back. Before, the error was logged at ERROR at every renewal (three times a
    second here), for as long as it lasted."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    pool, gate, started = ConcurrencyLimit("solo", 1), trio.Event(), trio.Event()

    async with (
        failing_proxy(redis_server.port) as proxy,
        replica(proxy.store(store)) as (a, recorder_a),
        replica(store) as (b, _),
    ):
        holder = await b.add(held_by(gate, "holder", pool, started))
        with trio.fail_after(2 * TTL):
            await started.wait()
        waiter = await a.add(TaskSpec.once("w", trio.lowlevel.checkpoint, limits=(pool,)))
        with trio.fail_after(2 * TTL):
            await recorder_a.wait_for(EventKind.LIMIT_WAITING)
        proxy.failing.add(scripts.LIMIT_RENEW.sha)
        with trio.fail_after(2 * TTL):
            while not said(caplog, logging.ERROR):  # noqa: ASYNC110
                await trio.sleep(0.01)
        await trio.sleep(TTL)  # three renewals more
        (error,) = said(caplog, logging.ERROR)
        assert error.startswith(
            f"slot store limit renewal failed: ResponseError: {FAILED_BY_THE_PROXY}"
        )
        assert error.endswith(
            "(made again with each renewal; meanwhile units are lost at their deadline "
            "and waiters wait, as while the store is unavailable)"
        )
        assert len(said(caplog, logging.DEBUG, "slot store limit renewal failed again")) >= 2
        assert [info.state for info in a.list()] == [TaskState.WAITING]
        assert recorder_a.of(EventKind.CONTROLLER_STORE_UNAVAILABLE) == []
        proxy.failing.clear()
        with trio.fail_after(2 * TTL):
            while not said(caplog, logging.INFO, "slot store limit renewal worked, after"):  # noqa: ASYNC110
                await trio.sleep(0.01)
        gate.set()
        with trio.fail_after(2 * TTL):
            assert (await holder.wait()).kind is OutcomeKind.COMPLETED
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        assert len(said(caplog, logging.ERROR)) == 1


async def test_a_pool_holds_its_capacity_across_different_lease_ttls(
    store: RedisSlotStore,
) -> None:
    """A rolling change of ``lease_ttl``: a replica of 10 s holds one unit of a pool of 2
    (renewed every 3.3 s); one of 1 s takes and gives back the other, which renews the
    pool's keys for twice the longest lease in use, not for its own 2 s. Then its two
    next attempts still take turns. (The keys used to expire 2 s after that release,
    the long holder's unit with them, and both attempts ran beside it: 3 holders.)"""
    pool, gate = ConcurrencyLimit("rolling", 2), trio.Event()
    running: set[str] = set()
    most = 0

    def hold(name: str, seconds: float) -> TaskSpec:
        async def body() -> None:
            nonlocal most
            running.add(name)
            most = max(most, len(running))
            try:
                await trio.sleep(seconds)
            finally:
                running.discard(name)

        return TaskSpec.once(name, body, limits=(pool,))

    long, short = attrs.evolve(store, lease_ttl=10.0), attrs.evolve(store, lease_ttl=1.0)
    async with replica(long) as (a, _), replica(short) as (b, _):
        started = trio.Event()
        holder = await a.add(held_by(gate, "holder", pool, started))
        with trio.fail_after(2 * TTL):
            await started.wait()
        running.add("holder")
        with trio.fail_after(2 * TTL):
            assert (await (await b.add(hold("brief", 0.0))).wait()).kind is OutcomeKind.COMPLETED
        await trio.sleep(2.5)  # past 2 s (the short lease, twice), before 3.3 s
        waiters = [await b.add(hold(name, 0.5)) for name in ("b1", "b2")]
        with trio.fail_after(2 * (0.5 + 0.5)):
            for waiter in waiters:
                assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        gate.set()
        assert (await holder.wait()).kind is OutcomeKind.COMPLETED
    assert most == 2


async def test_a_rate_pool_counts_starts_of_every_instance(store: RedisSlotStore) -> None:
    """Two starts of a ``burst=2`` pool, one per instance, spend it: ``next_start_in``
    is then about one interval, and a third start waits for it."""
    rate = RateLimit("partner", 1, per=2.0, burst=2)
    async with replica(store) as (a, _), replica(store) as (b, _):
        async with a.limited(rate):
            pass
        async with b.limited(rate):
            pass
        info = await a.cluster_limit(rate)
        assert (info.held, info.holders) == (0, {})
        assert info.next_start_in is not None
        assert 0.5 < info.next_start_in <= 2.0
        start = trio.current_time()
        with trio.fail_after(4.0):
            async with a.limited(rate):
                pass
        assert trio.current_time() - start >= info.next_start_in - 0.2


async def test_a_rate_block_holds_nothing_to_lose(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A rate pool's unit is a start, spent on entry: a block on rate pools only holds
    nothing, so a process that cannot renew past ``0.8 * lease_ttl`` loses nothing
    (a concurrency unit would be lost: ``LeaseLostError``), and its exit sends no
    release."""
    rate = RateLimit("spent", 100, per=1.0, burst=10)
    async with replica(store) as (sup, _):
        async with sup.limited(rate):
            redis_server.pause()
            try:
                await trio.sleep(1.5 * TTL)  # the outage itself: past 0.8 * lease_ttl
            finally:
                redis_server.resume()
        with trio.fail_after(2 * TTL):
            info = await sup.cluster_limit(rate)
        assert (info.held, info.holders, info.waiting) == (0, {}, 0)


async def test_a_lost_unit_ends_the_task_lease_lost(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A unit that cannot be renewed for ``0.8 * lease_ttl`` is lost: the attempt is
    forced at once and the task ends ``LEASE_LOST``; a block gets ``LeaseLostError``."""
    pool = ConcurrencyLimit("fragile", 2)
    async with replica(store) as (sup, _):
        started = trio.Event()

        async def body() -> None:
            started.set()
            await trio.sleep_forever()

        waiter = await sup.add(TaskSpec.once("held", body, limits=(pool,)))
        await started.wait()
        block = BlockUntilLost()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(block.hold, sup, pool)
            with trio.fail_after(2 * TTL):
                await block.entered.wait()
            assert sup.limit_snapshot()[0].held == 2
            redis_server.pause()
            try:
                with trio.fail_after(3 * TTL):
                    outcome = await waiter.wait()
            finally:
                redis_server.resume()
        assert outcome.kind is OutcomeKind.LEASE_LOST
        assert outcome.reason == "limit lease lost: fragile"
        assert [str(e) for e in block.errors] == ["limit lease lost: fragile"]


async def slot_owner_holding(
    sup: Supervisor, *pools: ConcurrencyLimit | RateLimit
) -> TaskWaiter[None]:
    """The waiter of the owner of slot ``s``, started, holding a unit of each of
    ``pools``, until it is stopped."""
    started = trio.Event()

    async def body() -> None:
        started.set()
        await trio.sleep_forever()

    spec = TaskSpec.once("owner", body, limits=pools)
    waiter = await sup.submit(ControllerSpec.queue(spec, slot="s"))
    await started.wait()
    return waiter


async def test_a_lost_unit_names_the_cause_and_only_the_pools_that_held_one(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server pauses past ``0.8 * lease_ttl``: a slot owner holding units loses its
    slot's lease with them, and ends ``LEASE_LOST`` naming that ("lease expired ..."), as
    every lost slot owner does; a block's ``LeaseLostError`` names the concurrency pool
    only (a rate pool's start holds nothing to lose). Before, the owner's reason could
    be the units' ("limit lease lost: ..."), and it named the rate pool too."""
    conc, rate = ConcurrencyLimit("conc", 2), RateLimit("rate", 100)
    async with replica(store) as (sup, _):
        waiter = await slot_owner_holding(sup, conc, rate)
        block = BlockUntilLost()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(block.hold, sup, conc, rate)
            with trio.fail_after(2 * TTL):
                await block.entered.wait()
            redis_server.pause()
            try:
                with trio.fail_after(3 * TTL):
                    outcome = await waiter.wait()
                    await block.lost.wait()
            finally:
                redis_server.resume()
        assert outcome.kind is OutcomeKind.LEASE_LOST
        assert str(outcome.reason).startswith("lease expired"), outcome.reason
        assert [str(e) for e in block.errors] == ["limit lease lost: conc"]


async def test_a_slot_owner_whose_server_lost_everything_names_its_slot_lease(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """The server comes back empty (``FLUSHALL``) under a slot owner holding units: its
    next renewal finds both gone, and the owner ends ``LEASE_LOST`` naming its slot's
    lease ("lease refused ..."), as every slot owner whose lease is refused does.
    Before, it named the units ("limit lease lost: conc, rate") in every run."""
    async with replica(store) as (sup, _):
        waiter = await slot_owner_holding(sup, ConcurrencyLimit("conc", 2), RateLimit("rate", 100))
        await client.flushall()
        with trio.fail_after(2 * TTL):  # the next renewal, at lease_ttl / 3
            outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.LEASE_LOST
    assert str(outcome.reason).startswith("lease refused"), outcome.reason


@pytest.mark.parametrize("how", ["deleted", "foreign"])
async def test_a_unit_whose_holder_entry_the_server_dropped_is_lost_at_the_next_renewal(
    store: RedisSlotStore, client: coredis.Redis[str], how: str
) -> None:
    """The pool's holders key is deleted (evicted, a clean-up script) or overwritten with
    foreign data while an attempt and a block hold its units: both are lost at the next
    renewal (``LEASE_LOST``, ``LeaseLostError``), as a deleted slot lease is, and a unit
    of another pool held alongside stays held (the renewal goes on). Before, they ran on
    untold, uncounted: another instance took the units too (a capacity of 2 held by
    three), and ``cluster_limit`` said ``held=0``."""
    conc, other = ConcurrencyLimit("conc", 2), ConcurrencyLimit("other", 1)
    async with replica(store) as (a, _), replica(store) as (b, _):
        waiter = await a.add(held_by(trio.Event(), "held", conc, started := trio.Event()))
        kept = await a.add(held_by(trio.Event(), "kept", other, kept_started := trio.Event()))
        block = BlockUntilLost()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(block.hold, a, conc)
            with trio.fail_after(2 * TTL):
                await started.wait()
                await kept_started.wait()
                await block.entered.wait()
            key = f"{store.key_prefix}lh:conc"
            assert await client.hlen(key) == 2
            await client.delete([key])
            if how == "foreign":
                await client.set(key, "not a hash")
            else:  # the server no longer counts them: another instance takes the units
                other_started = trio.Event()
                await b.add(held_by(trio.Event(), "b", conc, other_started))
                with trio.fail_after(2 * TTL):
                    await other_started.wait()
            with trio.fail_after(2 * TTL):  # the next renewal, at lease_ttl / 3
                outcome = await waiter.wait()
                await block.lost.wait()
        assert outcome.kind is OutcomeKind.LEASE_LOST
        assert outcome.reason == "limit lease lost: conc"
        assert [str(e) for e in block.errors] == ["limit lease lost: conc"]
        if how == "deleted":
            info = await a.cluster_limit(conc)
            assert (info.held, info.holders) == (1, {b.instance_id: 1})
        await trio.sleep(TTL)  # past the deadline of a unit whose renewals failed
        assert not kept.done
        info = await a.cluster_limit(other)
        assert (info.held, info.holders) == (1, {a.instance_id: 1})
        await a.remove("kept")


async def test_a_waiter_of_a_pool_whose_holders_key_is_foreign_data_is_refused_alone(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The pool's holders key is overwritten with foreign data while this process holds
    its unit, has an attempt and a block waiting in it, and holds a unit of another
    pool: the next renewal loses the held unit (logged naming the key), refuses both
    waiters (the attempt ends ``FATAL`` and the block raises, each with a
    ``SlotStoreUnavailableError`` naming the key and the server's ``WRONGTYPE`` error),
    and the other pool's unit stays held. Before, the renewal asked for the waiters
    again, and the whole renewal failed, every renewal: the unit of the other pool was
    lost too, and the waiters waited on."""
    conc, other = ConcurrencyLimit("conc", 1), ConcurrencyLimit("other", 1)
    key = f"{store.key_prefix}lh:conc"
    refused = f"refused the units of 'conc': foreign data in the slot store at {key}: WRONGTYPE"
    errors: list[BaseException] = []

    async def block(sup: Supervisor) -> None:
        try:
            async with sup.limited(conc):
                pass  # pragma: no cover
        except SlotStoreUnavailableError as exc:
            errors.append(exc)

    async with replica(store) as (a, recorder):
        held = await a.add(held_by(trio.Event(), "held", conc, started := trio.Event()))
        kept = await a.add(held_by(trio.Event(), "kept", other, kept_started := trio.Event()))
        with trio.fail_after(2 * TTL):
            await started.wait()
            await kept_started.wait()
        waiting = await a.add(TaskSpec.once("waiting", trio.lowlevel.checkpoint, limits=(conc,)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(block, a)
            with trio.fail_after(2 * TTL):
                while (await a.cluster_limit(conc)).waiting < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await client.delete([key])
            await client.set(key, "not a hash")
            with trio.fail_after(2 * TTL):  # the next renewal, at lease_ttl / 3
                lost = await held.wait()
                outcome = await waiting.wait()
        assert lost.kind is OutcomeKind.LEASE_LOST
        assert outcome.kind is OutcomeKind.FATAL
        assert isinstance(outcome.error, SlotStoreUnavailableError)
        assert f"slot store {store.safe_url} {refused}" in str(outcome.error)
        assert [type(e) for e in errors] == [SlotStoreUnavailableError]
        assert refused in str(errors[0])
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            f"units lost to foreign data in the slot store at {key}: WRONGTYPE" in m
            for m in messages
        )
        await trio.sleep(TTL)  # past the deadline of a unit whose renewals failed
        assert not kept.done
        info = await a.cluster_limit(other)
        assert (info.held, info.holders) == (1, {a.instance_id: 1})
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([key])
        await a.remove("kept")


@pytest.mark.parametrize("kind", ["lp", "lq", "lk", "lg"])
async def test_a_waiter_whose_pools_keys_are_foreign_data_is_refused_alone(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Foreign data at a key of the pool an attempt waits in (its settings, its waiting
    or parked groups) or of the attempt's group, while this process holds the pool's
    unit and one of another pool: the next renewal refuses the attempt alone (``FATAL``,
    a ``SlotStoreUnavailableError`` naming the key and the server's ``WRONGTYPE``
    error, logged once); both units stay held, no outage. Before, every renewal of the
    process failed while it waited: its units were lost, and the attempt waited on."""
    conc, other = ConcurrencyLimit("conc", 1), ConcurrencyLimit("other", 1)
    named = 'lg:["conc"]' if kind == "lg" else f"{kind}:conc"
    key = f"{store.key_prefix}{named}"
    async with replica(store) as (a, recorder):
        held = await a.add(held_by(gate := trio.Event(), "held", conc, started := trio.Event()))
        kept = await a.add(held_by(trio.Event(), "kept", other, kept_started := trio.Event()))
        with trio.fail_after(2 * TTL):
            await started.wait()
            await kept_started.wait()
        waiting = await a.add(TaskSpec.once("waiting", trio.lowlevel.checkpoint, limits=(conc,)))
        with trio.fail_after(2 * TTL):
            while (await a.cluster_limit(conc)).waiting < 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        await client.delete([key])
        await client.set(key, "foreign")
        with trio.fail_after(2 * TTL):  # the next renewal, at lease_ttl / 3
            outcome = await waiting.wait()
        assert outcome.kind is OutcomeKind.FATAL
        assert isinstance(outcome.error, SlotStoreUnavailableError)
        refused = f"refused the units of 'conc': foreign data in the slot store at {key}: "
        assert f"{refused}WRONGTYPE" in str(outcome.error)
        await trio.sleep(TTL)  # past the deadline of a unit whose renewals failed
        assert not held.done
        assert not kept.done
        messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert [m for m in messages if key in m and m.startswith("slot store limit")] == [
            f"slot store limit renewal of a waiter refused: foreign data in the slot store "
            f"at {key}: WRONGTYPE Operation against a key holding the wrong kind of value"
        ]
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([key])
        gate.set()
        await a.remove("kept")


async def test_cluster_limit_needs_a_slot_store() -> None:
    """Without a slot store ``cluster_limit`` raises ``ConfigError``."""
    async with open_supervisor() as sup:
        with pytest.raises(ConfigError, match="needs a slot store"):
            await sup.cluster_limit(ConcurrencyLimit("x", 1))


async def test_cluster_limit_of_a_pool_used_with_other_settings_raises(
    store: RedisSlotStore,
) -> None:
    """``cluster_limit`` of a pool the cluster uses with other settings raises the
    ``ConfigError`` an acquisition gets: the answer would be about another pool (a
    concurrency pool asked about as a rate pool read "nothing held, a start allowed
    now"). With the same settings, or for a pool nobody uses, it answers."""
    gate = trio.Event()
    shared = ConcurrencyLimit("shared", 2)
    async with replica(store) as (a, _), replica(store) as (b, _):
        started = trio.Event()
        waiter = await a.add(held_by(gate, "a", shared, started))
        with trio.fail_after(2 * TTL):
            await started.wait()
            for other, ours in [
                (ConcurrencyLimit("shared", 3), "concurrency 3"),
                (RateLimit("shared", 10), "rate 10 per 1.0 burst 1"),
            ]:
                with pytest.raises(ConfigError) as info:
                    await b.cluster_limit(other)
                assert str(info.value) == (
                    "limit 'shared' is used across the cluster with other settings: "
                    f"concurrency 2, got {ours}"
                )
            assert (await b.cluster_limit(shared)).held == 1
            assert (await b.cluster_limit(RateLimit("unused", 10))).next_start_in == 0.0
        gate.set()
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED


async def test_cluster_limit_of_a_pool_only_dead_processes_used_answers_with_new_settings(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A pool whose holder and waiter died (their generation expired, as a killed
    replica's does, before any script saw it) is not in use: ``cluster_limit`` with
    other settings answers (nothing held, nobody waiting), as a block with them is
    granted. Before, it raised ``ConfigError`` ("... is used across the cluster with
    other settings: concurrency 1, ...") until the pool's keys expired (up to ``2 *
    lease_ttl``), while ``limited()`` with those settings entered at once."""
    s = Scripts(client, store)
    dead = "vm:1:dead"
    pairs = [("old", scripts.spec_text("concurrency", 1, 0, 0.0, 0))]
    for n in (1, 2):  # a holder, and a waiter behind it
        await s.call(
            scripts.LIMIT_ACQUIRE, *scripts.limit_acquire_args(dead, f"{dead}/l{n}", pairs)
        )
    await client.delete([f"{store.key_prefix}lu:{dead}"])  # its lease expired
    bigger = ConcurrencyLimit("old", 3)
    async with replica(store) as (sup, _):
        with trio.fail_after(2 * TTL):
            info = await sup.cluster_limit(bigger)
            assert (info.held, info.holders, info.waiting) == (0, {}, 0)
            async with sup.limited(bigger):
                info = await sup.cluster_limit(bigger)
                assert (info.held, info.holders) == (1, {sup.instance_id: 1})


async def test_cluster_limit_raises_during_an_outage(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """While the server does not answer, ``cluster_limit`` raises
    ``SlotStoreUnavailableError`` (after ``connect_timeout``)."""
    async with open_supervisor(config(store)) as sup:
        redis_server.pause()
        try:
            with pytest.raises(SlotStoreUnavailableError):
                await sup.cluster_limit(ConcurrencyLimit("x", 1))
        finally:
            redis_server.resume()


async def test_waiters_wait_through_an_outage(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """While the server does not answer nothing is granted: a block asked for meanwhile
    waits, and enters once the server answers again; nothing is held afterwards."""
    pool = ConcurrencyLimit("outage", 1)
    async with replica(store) as (sup, recorder):
        entered = trio.Event()

        async def block() -> None:
            async with sup.limited(pool):
                entered.set()

        redis_server.pause()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(block)
                with trio.fail_after(3 * TTL):
                    await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
                assert not entered.is_set()
                redis_server.resume()
                with trio.fail_after(4 * TTL):
                    await entered.wait()
        finally:
            redis_server.resume()
        info = await sup.cluster_limit(pool)
        assert (info.held, info.waiting) == (0, 0)


async def test_units_granted_too_late_to_trust_are_confirmed_first(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server pauses (SIGSTOP) while a block's and an attempt's acquisitions are on
    the wire, longer than units may go unconfirmed (``0.8 * lease_ttl``), then grants
    them: units count from their request's sending, so these are as good as lost. A
    renewal confirms them first; then the block and the attempt run to their end (the
    block got ``LeaseLostError`` at once before, and the attempt ended ``LEASE_LOST``)."""
    pool = ConcurrencyLimit("late", 2)
    async with replica(store) as (sup, _):
        ran: list[str] = []

        async def work(name: str) -> str:
            await trio.sleep(TTL / 5)  # real time: the lost units would be forced here
            ran.append(name)
            return name

        async def block() -> None:
            async with sup.limited(pool):
                await work("block")

        redis_server.pause()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(block)
                waiter = await sup.add(TaskSpec.once("attempt", work, "attempt", limits=(pool,)))
                await trio.sleep(1.5 * TTL)  # real time, past 0.8 * TTL
                redis_server.resume()
                with trio.fail_after(4 * TTL):
                    outcome = await waiter.wait()
            assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, "attempt")
        finally:
            redis_server.resume()
        assert sorted(ran) == ["attempt", "block"]
        info = await sup.cluster_limit(pool)
        assert (info.held, info.waiting) == (0, 0)


async def test_an_attempt_waiting_in_a_block_at_shutdown_ends_cancelled(
    store: RedisSlotStore,
) -> None:
    """A critical attempt waiting in a ``limited`` block for a cluster pool when its
    supervisor shuts down ends ``CANCELLED`` (the shutdown's stop, as for the attempt),
    not ``FAILED`` with ``SupervisorClosedError`` (which would fail the shutdown), and
    its request leaves the pool's line."""
    pool = ConcurrencyLimit("block-at-shutdown", 1)
    gate = trio.Event()
    async with replica(store) as (a, _):
        started = trio.Event()
        holder = await a.add(held_by(gate, "a", pool, started))
        await started.wait()
        async with replica(store) as (b, _):

            async def body() -> None:
                async with b.limited(pool):
                    pytest.fail("entered while the pool was held")

            waiter = await b.add(TaskSpec.once("b", body, critical=True))
            with trio.fail_after(2 * TTL):
                # the server's state: no event tells when b's request has reached it
                while not (await a.cluster_limit(pool)).waiting:  # noqa: ASYNC110
                    await trio.sleep(0.01)
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        with trio.fail_after(2 * TTL):
            while (await a.cluster_limit(pool)).waiting:  # noqa: ASYNC110
                await trio.sleep(0.01)
        gate.set()
        assert (await holder.wait()).kind is OutcomeKind.COMPLETED


async def test_a_stop_while_waiting_withdraws_the_request(store: RedisSlotStore) -> None:
    """A task removed while it waits for a cluster pool ends ``CANCELLED`` and leaves
    the pool's line on the server."""
    pool = ConcurrencyLimit("stops", 1)
    gate = trio.Event()
    async with replica(store) as (a, _), replica(store) as (b, recorder_b):
        started = trio.Event()
        holder = await a.add(held_by(gate, "a", pool, started))
        await started.wait()
        waiter = await b.add(held_by(gate, "b", pool))
        with trio.fail_after(2 * TTL):
            await recorder_b.wait_for(EventKind.LIMIT_WAITING)
        await b.remove("b")
        assert (await waiter.wait()).kind is OutcomeKind.CANCELLED
        with trio.fail_after(2 * TTL):
            # the withdrawal rides the keeper's next batch: no event tells it landed
            while (await a.cluster_limit(pool)).waiting:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert b.limit_snapshot() == ()
        gate.set()
        assert (await holder.wait()).kind is OutcomeKind.COMPLETED


async def test_a_slot_owner_waiting_for_a_pool_whose_lease_is_lost_leaves_the_line(
    store: RedisSlotStore, client: coredis.Redis[str], namespace: str
) -> None:
    """A slot owner waiting for a cluster pool whose slot lease is lost ends
    ``LEASE_LOST`` and takes its request out of the pool's line at once. Before, the
    request stayed in the line (the pool counted it waiting) until the holder let go; it
    was granted then, ``LIMIT_ACQUIRED`` came after the task had ended, and until then
    the supervisor's shutdown waited, whatever its grace."""
    pool = ConcurrencyLimit("owners", 1)
    gate = trio.Event()
    async with replica(store) as (a, _), replica(store) as (b, recorder_b):
        started = trio.Event()
        holder = await a.add(held_by(gate, "holder", pool, started))
        await started.wait()
        try:
            spec = TaskSpec.once("owner", trio.sleep_forever, limits=(pool,))
            waiter = await b.submit(ControllerSpec.queue(spec, slot="s"))
            with trio.fail_after(2 * TTL):
                await recorder_b.wait_for(EventKind.LIMIT_WAITING)
            await client.delete([f"tv:{{{namespace}}}:lease:s"])
            with trio.fail_after(2 * TTL):  # the next renewal, at lease_ttl / 3
                outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.LEASE_LOST
            with trio.fail_after(2 * TTL):
                # the withdrawal rides the keeper's next batch: no event tells it landed
                while (await a.cluster_limit(pool)).waiting:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert b.limit_snapshot() == ()
            with trio.fail_after(2 * TTL):
                await b.shutdown()
        finally:
            gate.set()
        assert (await holder.wait()).kind is OutcomeKind.COMPLETED
    assert recorder_b.kinds(EventKind.LIMIT_ACQUIRED) == []


async def test_a_long_held_unit_keeps_its_pool_on_the_server(
    redis_server: RedisServer, namespace: str
) -> None:
    """A unit held for longer than the pool's keys live unrenewed (``2 * lease_ttl``)
    still counts: the holder's renewals keep its pool's keys, so another instance waits."""
    ttl = 0.5
    store = RedisSlotStore(redis_server.url, namespace=namespace, lease_ttl=ttl)
    exports = ConcurrencyLimit("exports", 1)
    gate, started = trio.Event(), trio.Event()
    async with replica(store) as (a, _), replica(store) as (b, recorder_b):
        holder = await a.add(held_by(gate, "a", exports, started))
        with trio.fail_after(2 * ttl):
            await started.wait()
        await trio.sleep(2 * 2 * ttl)  # twice the keys' unrenewed life
        waiter = await b.add(held_by(trio.Event(), "b", exports))
        with trio.fail_after(2 * ttl):
            await recorder_b.wait_for(EventKind.LIMIT_WAITING)
        info = await b.cluster_limit(exports)
        assert (info.held, info.holders) == (1, {a.instance_id: 1})
        gate.set()
        assert (await holder.wait()).kind is OutcomeKind.COMPLETED
        with trio.fail_after(2 * ttl):
            await recorder_b.wait_for(EventKind.LIMIT_ACQUIRED)
        await b.remove("b")
        await waiter.wait()


async def test_a_block_that_outlives_its_supervisor_loses_its_units(
    store: RedisSlotStore,
) -> None:
    """A block of another nursery still holding a cluster unit when its supervisor's
    shutdown ends gets ``LeaseLostError`` then: nothing renews the unit any more, and
    another instance takes it once its lease expires. Before, the block ran on, and the
    other instance entered while it was still inside (a capacity of 1 held twice)."""
    pool = ConcurrencyLimit("outlived", 1)
    order: list[str] = []
    async with replica(store) as (b, _), trio.open_nursery() as nursery:
        entered = trio.Event()

        async def first(sup: Supervisor) -> None:
            try:
                async with sup.limited(pool):
                    order.append("a in")
                    entered.set()
                    await trio.sleep(4 * TTL)
                order.append("a out")
            except LeaseLostError as exc:
                order.append(f"a: {exc}")

        async with replica(store) as (a, _):
            nursery.start_soon(first, a)
            await entered.wait()
        closed_at = trio.current_time()
        async with b.limited(pool):
            order.append("b in")
            assert trio.current_time() - closed_at < 2 * TTL
    assert order == [
        "a in",
        "a: limit lease lost: outlived (the supervisor's shutdown ended during the block)",
        "b in",
    ]


@pytest.mark.parametrize(
    ("rate", "per", "burst"),
    [(1, 1e15, 1), (1, 1e300, 1), (1, 1.4e304, 3), (100, 1e306, 1), (100, 1e306, 2)],
)
async def test_a_rate_pool_of_a_very_long_period_waits_and_says_how_long(
    store: RedisSlotStore, rate: int, per: float, burst: int
) -> None:
    """A rate pool whose next start is further away than the server's numbers print
    (``per`` finite, as the contract allows) allows its burst, then waits, and
    ``next_start_in`` says about 31.7 years (the longest the scripts count). Before,
    ``per=1e15`` crashed the supervisor (the waiter's renewal reply read ``1e+18``, which
    the keeper could not parse) and ``per=1e300`` was refused by the server ("value is
    not an integer or out of range") at every acquisition. The third case is a full
    burst's span just under the bound ``RateLimit`` checks (about 4.5e304 s): a span
    past about 1.8e305 s (accepted before, up to 4.5e307) overflowed the server's
    numbers in milliseconds, and every start was allowed; the last two, a ``per`` that
    overflowed there alone (``per * 1000``): every start allowed with a burst of 2, and
    with 1 a wait polled every millisecond and renewals the server failed."""
    pool = RateLimit("far", rate, per=per, burst=burst)
    async with replica(store) as (sup, _):
        for _ in range(burst):
            async with sup.limited(pool):
                pass
        with trio.move_on_after(2 * TTL) as waited:  # two renewals of the waiting block
            async with sup.limited(pool):
                pytest.fail("a start past the burst within the period")
        assert waited.cancelled_caught
        info = await sup.cluster_limit(pool)
        assert (info.held, info.waiting, info.next_start_in) == (0, 0, 1e9)


async def test_a_server_clock_that_stepped_back_holds_a_rate_pool_back_one_interval(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A rate pool's ``tat`` an hour ahead of the server's clock, as a clock that
    stepped back leaves it (a failover to a node whose clock is behind; a clock set
    back): the next start waits one interval, as after a burst just spent, and
    ``cluster_limit`` and the ``slots`` view say so. Before, every start waited for the
    hour."""
    pool = RateLimit("stepped", 10, per=1.0)  # an interval of 100 ms, a burst of 1
    ahead = int((await client.time()).timestamp() * 1000) + 3_600_000
    key = f"{store.key_prefix}lp:stepped"
    await client.hset(key, {"spec": "rate 10 per 1.0 burst 1", "tat": str(ahead)})
    await client.pexpire(key, 3_600_000)
    async with replica(store) as (sup, _):
        info = await sup.cluster_limit(pool)
        assert info.next_start_in is not None
        assert 0.0 < info.next_start_in <= 0.1
        (state,) = (await read_namespace(store)).pools.values()
        assert state.next_start_ms is not None
        assert 0.0 < state.next_start_ms <= 100.0
        with trio.fail_after(2 * TTL):
            async with sup.limited(pool):
                pass


async def test_the_longest_lease_runs_slots_and_both_kinds_of_pool(store: RedisSlotStore) -> None:
    """``lease_ttl=1e9`` (the longest allowed, about 31.7 years) runs a slot, a
    concurrency block and a rate block. Before the bound, 1e15 was accepted and then
    every limit's units were refused ("value is not an integer or out of range": the
    expiries in milliseconds reached the server with an exponent), and 1e18 the lease
    scripts themselves."""
    longest = attrs.evolve(store, lease_ttl=1e9)
    async with replica(longest) as (sup, _):
        owned = await sup.submit(ControllerSpec.queue(TaskSpec.once("w", trio.sleep, 0), slot="k"))
        assert (await owned.wait()).kind is OutcomeKind.COMPLETED
        async with sup.limited(ConcurrencyLimit("long-c", 1), RateLimit("long-r", 1, per=60.0)):
            info = await sup.cluster_limit(ConcurrencyLimit("long-c", 1))
            assert (info.held, info.waiting) == (1, 0)
    with pytest.raises(ConfigError, match=r"lease_ttl must be at most 1e9 \(about 31\.7 years"):
        attrs.evolve(store, lease_ttl=1e15)
