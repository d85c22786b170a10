"""Limit units across a change of their instance's generation, at the keeper: real
server, real clock, a fake registry (``Sink``) reading what becomes of each request.

Timing bounds are liveness bounds with at least a 2x margin; waits are for the sink's
records or the server's keys, never sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import coredis
import pytest
import trio
from cluster_helpers import Scripts, open_keeper
from conftest import RedisServer
from test_cluster_keeper import Listening, Rewrite, Wrapping, with_ttl

from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore
from trio_taskvisor._keeper import Call, Connection, StoreRecovered
from trio_taskvisor._limits import ConcurrencyLimit
from trio_taskvisor._redis_client import RedisClient

A, B, C = "keeper-a:1:0000000a", "keeper-b:2:0000000b", "keeper-c:3:0000000c"
POOL = (("p", None), ConcurrencyLimit("p", 2))
POOL_1 = (("p", None), ConcurrencyLimit("p", 1))


class Sink:
    """A ``LimitSink`` that records what it learns, as (kind, rid)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self._changed = trio.Event()

    def _add(self, kind: str, rid: int) -> None:
        self.seen.append((kind, rid))
        self._changed.set()
        self._changed = trio.Event()

    def limit_granted(self, rid: int) -> None:
        self._add("granted", rid)

    def limit_waiting(self, rid: int, blocked: object) -> None:
        self._add("waiting", rid)

    def limit_refused(self, rid: int, error: object) -> None:
        self._add("refused", rid)

    def limit_lost(self, rid: int) -> None:
        self._add("lost", rid)

    async def wait_for(self, kind: str, rid: int) -> None:
        while (kind, rid) not in self.seen:
            await self._changed.wait()


def limit_messages_lost(text: str) -> list[str]:
    return [] if json.loads(text)[0] == "limit" else [text]


async def test_a_grant_in_a_generation_that_expired_is_asked_for_anew(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A waiter granted while its process heard nothing (its message lost), whose
    generation then expired: the renewal that asks for it again gets it in the new
    generation. Before, the server answered with the old grant for ever, and the keeper
    asked again at once, round trip after round trip (a spin)."""
    pool = (("p", None), ConcurrencyLimit("p", 1))
    sink_a, sink_b = Sink(), Sink()
    async with (
        open_keeper(store, A) as a,
        open_keeper(store, B, client=Rewrite(store, B, limit_messages_lost)) as b,
    ):
        a.keeper.limit_sink, b.keeper.limit_sink = sink_a, sink_b
        a.keeper.limit_acquire(1, (pool,))
        await sink_a.wait_for("granted", 1)
        b.keeper.limit_acquire(1, (pool,))
        await sink_b.wait_for("waiting", 1)
        a.keeper.limit_release(1)  # grants B's request: its message is lost
        with trio.fail_after(2 * store.lease_ttl):
            while await client.get(f"{store.key_prefix}lx:{B}/l1") is None:  # noqa: ASYNC110
                await trio.sleep(0.01)
        await client.delete([f"{store.key_prefix}lu:{B}"])  # as its expiry would
        with trio.fail_after(2 * store.lease_ttl):  # its next renewal, at lease_ttl / 3
            await sink_b.wait_for("granted", 1)
        calls = await script_calls(client)
        await trio.sleep(store.lease_ttl)  # real time: a spin would call the server here
        assert await script_calls(client) - calls < 40  # renewals: about 6


async def script_calls(client: coredis.Redis[str]) -> int:
    """How many scripts the server ran so far."""
    stats = await client.info("commandstats")
    names = ("cmdstat_evalsha", "cmdstat_eval")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in names)


@pytest.fixture
def copied(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The test server, whose ``restart`` loads the copy its last ``SAVE`` wrote (removed
    afterwards: other tests restart it empty)."""
    yield redis_server
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(redis_server.directory, "dump.rdb"))


async def test_units_given_back_before_a_restart_from_an_older_copy_stay_given_back(
    store: RedisSlotStore, client: coredis.Redis[str], copied: RedisServer
) -> None:
    """The server restarts from a copy taken while a process held two units of a
    capacity-2 pool, one of which it has given back since (a failover loses such a
    release too): once the keeper sees the new server, it moves the unit it holds to a
    new generation, and the other dies with the old one. Another process then gets a
    unit at once; the unit still held is not lost. Before, the given-back unit counted
    as held for as long as the process lived, and the other process waited."""
    store = with_ttl(store, 3.0)
    sink_a, sink_b = Sink(), Sink()
    async with open_keeper(store, A) as a:
        a.keeper.limit_sink = sink_a
        for rid in (1, 2):
            a.keeper.limit_acquire(rid, (POOL,))
            await sink_a.wait_for("granted", rid)
        await client.save()
        a.keeper.limit_release(2)
        with trio.fail_after(2 * store.lease_ttl):
            while await client.hlen(f"{store.key_prefix}lh:p") != 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        copied.restart()  # from the copy: unit 2 held there
        await a.reports.wait_for(StoreRecovered)
        async with open_keeper(store, B) as b:
            b.keeper.limit_sink = sink_b
            b.keeper.limit_acquire(1, (POOL,))
            with trio.fail_after(2 * store.lease_ttl):
                await sink_b.wait_for("granted", 1)
        assert ("lost", 1) not in sink_a.seen


async def test_a_unit_the_server_came_back_without_is_lost(
    store: RedisSlotStore, client: coredis.Redis[str], copied: RedisServer
) -> None:
    """The server restarts from a copy taken before a process's second unit was
    granted: once the keeper sees the new server, that unit is lost (its holder is told,
    as of any lost unit), and the first, in the copy, is kept. Before, the process went
    on holding a unit the server did not count: with another process's, three units
    of a capacity-2 pool ran."""
    store = with_ttl(store, 3.0)
    sink = Sink()
    async with open_keeper(store, A) as a:
        a.keeper.limit_sink = sink
        a.keeper.limit_acquire(1, (POOL,))
        await sink.wait_for("granted", 1)
        await client.save()
        a.keeper.limit_acquire(2, (POOL,))
        await sink.wait_for("granted", 2)
        copied.restart()  # from the copy: only unit 1 held there
        with trio.fail_after(2 * store.lease_ttl):
            await sink.wait_for("lost", 2)
        assert ("lost", 1) not in sink.seen
        assert await client.hlen(f"{store.key_prefix}lh:p") == 1


async def test_waiters_keep_their_place_through_a_rebase_made_once(
    store: RedisSlotStore, client: coredis.Redis[str], copied: RedisServer
) -> None:
    """A process that only waits when the server restarts from a copy rebases once (a
    new generation, then no other) and its waiter keeps its place: the first unit given
    back goes to it, not to a later waiter of another process."""
    store = with_ttl(store, 3.0)
    sink_a, sink_b, sink_c = Sink(), Sink(), Sink()
    lu_b = f"{store.key_prefix}lu:{B}"
    async with open_keeper(store, A) as a, open_keeper(store, B) as b:
        a.keeper.limit_sink, b.keeper.limit_sink = sink_a, sink_b
        for rid in (1, 2):
            a.keeper.limit_acquire(rid, (POOL,))
            await sink_a.wait_for("granted", rid)
        b.keeper.limit_acquire(1, (POOL,))
        await sink_b.wait_for("waiting", 1)
        await client.save()
        before = await client.get(lu_b)
        copied.restart()
        await b.reports.wait_for(StoreRecovered)
        with trio.fail_after(2 * store.lease_ttl):
            while await client.get(lu_b) == before:  # noqa: ASYNC110
                await trio.sleep(0.01)
        rebased = await client.get(lu_b)
        async with open_keeper(store, C) as c:
            c.keeper.limit_sink = sink_c
            c.keeper.limit_acquire(1, (POOL,))
            await sink_c.wait_for("waiting", 1)
            a.keeper.limit_release(1)
            with trio.fail_after(2 * store.lease_ttl):
                await sink_b.wait_for("granted", 1)
            assert ("granted", 1) not in sink_c.seen
        await trio.sleep(store.lease_ttl)  # real time: three more renewals of B
        assert await client.get(lu_b) == rebased


class GrantInFlight(Wrapping):
    """A ``ServerClient`` whose next rebase (a ``limit_renew`` with its seventh argument)
    first runs ``before`` on the server (which grants a waiter of this process), then
    holds its reply until the grant's push has been delivered to the keeper: the push
    overtakes the rebase."""

    def __init__(self, store: RedisSlotStore, instance_id: str, before: Callable[[], Any]) -> None:
        super().__init__(store, instance_id)
        self.before = before
        self.pushed = trio.Event()
        self.done = False

    def wrap(self, conn: Connection) -> Connection:
        return _GrantInFlightConnection(conn, self)


class _GrantInFlightConnection(Listening[GrantInFlight]):
    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        hook = self._hook
        rebase = any(name == "limit_renew" and len(args) == 4 for name, args in calls)
        if not rebase or hook.done:
            return await self._conn.round_trip(calls)
        hook.done = True
        await hook.before()
        replies = await self._conn.round_trip(calls)
        await hook.pushed.wait()
        return replies

    def heard(self, text: str) -> None:
        if json.loads(text)[0] == "limit":
            self._hook.pushed.set()


async def test_a_grant_pushed_while_the_rebase_is_on_the_wire_is_kept(
    store: RedisSlotStore, client: coredis.Redis[str], copied: RedisServer
) -> None:
    """After a restart from a copy, B's rebase names its waiting request; just before it
    runs, A's unit is given back and B's request granted (in the old generation), and
    the push reaches B's keeper before the rebase's reply. B's unit is held, and kept:
    the rebase moved it to the new generation. Before, the rebase's new generation made
    the keeper take the freshly pushed grant for a lost unit (``limit_lost``)."""
    store = with_ttl(store, 3.0)
    s = Scripts(client, store)

    async def release_a() -> None:
        await s.call(scripts.LIMIT_RELEASE, *scripts.limit_release_args(f"{A}/l1", ["p"]))

    sink_a, sink_b = Sink(), Sink()
    hook = GrantInFlight(store, B, release_a)
    async with open_keeper(store, A) as a, open_keeper(store, B, client=hook) as b:
        a.keeper.limit_sink, b.keeper.limit_sink = sink_a, sink_b
        a.keeper.limit_acquire(1, (POOL_1,))
        await sink_a.wait_for("granted", 1)
        b.keeper.limit_acquire(1, (POOL_1,))
        await sink_b.wait_for("waiting", 1)
        await client.save()
        copied.restart()
        with trio.fail_after(2 * store.lease_ttl):
            await sink_b.wait_for("granted", 1)
        with trio.move_on_after(store.lease_ttl):  # real time: three renewals of B
            await sink_b.wait_for("lost", 1)
        assert sink_b.seen == [("waiting", 1), ("granted", 1)]
        gen = await client.get(f"{store.key_prefix}lu:{B}")
        assert await client.hgetall(f"{store.key_prefix}lh:p") == {f"{B}/l1": gen}


async def test_a_unit_held_through_two_changes_of_server_is_kept(
    store: RedisSlotStore, client: coredis.Redis[str], copied: RedisServer
) -> None:
    """The server restarts from a copy, the keeper rebases its unit (a new generation),
    then the server restarts again from that older copy, which holds the unit in the
    generation before: the unit is still this process's there, and the second rebase
    keeps it. Before, the first reply from the older copy showed a generation other
    than the one the keeper knew, and it took every unit it held for lost."""
    store = with_ttl(store, 6.0)
    sink = Sink()
    dump = os.path.join(copied.directory, "dump.rdb")
    lu = f"{store.key_prefix}lu:{A}"
    async with open_keeper(store, A) as a:
        a.keeper.limit_sink = sink
        a.keeper.limit_acquire(1, (POOL,))
        await sink.wait_for("granted", 1)
        first = await client.get(lu)
        await client.save()
        older = trio.Path(dump + ".older")
        await older.write_bytes(await trio.Path(dump).read_bytes())
        copied.restart()
        with trio.fail_after(2 * store.lease_ttl):  # the rebase: a new generation
            while await client.get(lu) in (first, None):  # noqa: ASYNC110
                await trio.sleep(0.01)
        await trio.Path(dump).write_bytes(await older.read_bytes())
        await older.unlink()
        copied.restart()  # the older copy: the unit in the first generation
        with trio.fail_after(2 * store.lease_ttl):
            while await client.get(lu) in (first, None):  # noqa: ASYNC110
                await trio.sleep(0.01)
        with trio.move_on_after(store.lease_ttl / 2):  # real time: a renewal of A
            await sink.wait_for("lost", 1)
        assert sink.seen == [("granted", 1)]
        gen = await client.get(lu)
        assert await client.hgetall(f"{store.key_prefix}lh:p") == {f"{A}/l1": gen}


async def test_a_generation_not_utf8_reads_the_same_in_grants_and_renewals(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """An instance's generation (``lu:<instance>``) that another client wrote with bytes
    that are not UTF-8: an acquisition's reply, a renewal's and a grant's message read
    it as the same text, so the units held keep their generation. Before, the
    acquisition's reply read it as the ``repr`` of bytes (``"b'1\\xff'"``) and the
    renewal with surrogate escapes: at the first renewal every unit held was lost, and
    each grant after it was taken for one of an expired generation."""
    sink = Sink()
    key = f"{store.key_prefix}lu:{A}"
    async with coredis.Redis.from_url(redis_server.url, decode_responses=False) as raw:
        await raw.set(key, b"1\xff", px=60_000)
        async with open_keeper(store, A) as a:
            a.keeper.limit_sink = sink
            a.keeper.limit_acquire(1, (POOL,))
            with trio.fail_after(2 * store.lease_ttl):
                await sink.wait_for("granted", 1)
            await trio.sleep(store.lease_ttl)  # renewals, every lease_ttl / 3
            a.keeper.limit_acquire(2, (POOL,))
            with trio.fail_after(2 * store.lease_ttl):
                await sink.wait_for("granted", 2)
            await trio.sleep(store.lease_ttl)
            assert [kind for kind, _ in sink.seen] == ["granted", "granted"], sink.seen
        assert await raw.get(key) is None or await raw.get(key) == b"1\xff"


async def test_a_message_not_utf8_is_delivered_with_surrogate_escapes(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A grant's message (``["limit", w, gen]``) of a generation that is not UTF-8
    reaches the keeper as JSON text, its bytes as surrogate escapes (as the renewal reads
    the generation). Before, it came as the ``repr`` of bytes, which is no JSON: the
    grant was ignored until the next renewal."""
    heard: list[str] = []
    channel = f"{store.key_prefix}ch:{A}"
    async with (
        RedisClient(store, A).connect() as conn,
        coredis.Redis.from_url(redis_server.url, decode_responses=False) as raw,
        trio.open_nursery() as nursery,
    ):
        subscribed = trio.Event()
        nursery.start_soon(conn.subscribe, channel, heard.append, subscribed.set)
        with trio.fail_after(5):
            await subscribed.wait()
            await raw.publish(channel, b'["limit","' + A.encode() + b'/l1","1\xff"]')
            while not heard:  # noqa: ASYNC110
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert [json.loads(text) for text in heard] == [["limit", f"{A}/l1", "1\udcff"]]
