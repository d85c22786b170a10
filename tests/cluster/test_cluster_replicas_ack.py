"""``replicas_ack``: every round trip that changes the store waits for replicas.

Against a real primary with two replicas (``--replicaof``), started from the same binary
as the other cluster tests, for this module only. Real clock, short leases; timing
bounds are liveness bounds with at least a 2x margin, waits are for events, outcomes
and reports (a replica's first sync is waited for by polling ``INFO replication``, as
a child process's readiness is).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncGenerator, Iterator, Sequence

import attrs
import coredis
import pytest
import trio
from cluster_helpers import config, gated, open_keeper, quick, replica, start_later
from redis_server import RedisServer, find_server_binary

from trio_taskvisor import (
    ConcurrencyLimit,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStoreUnavailableError,
    Supervisor,
    TaskOutcome,
    TaskSpec,
    open_supervisor,
)
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore
from trio_taskvisor._keeper import WAIT, Call, Owner, Queued, Rejected, StoreRecovered
from trio_taskvisor._redis_client import RedisClient, _RedisConnection
from trio_taskvisor._slots import AdmissionPolicy

TTL = 1.0
A = "ack-a:1:0000000a"
B = "ack-b:1:0000000b"


class Topology:
    """One primary and its replicas; a test may stop, restart or pause replicas (the
    fixture restores them, all online, before the next test)."""

    def __init__(self, binary: str, directory: str) -> None:
        self.primary = RedisServer(binary, directory, ["--repl-diskless-sync-delay", "0"])
        self.primary.start()
        replica_of = ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replicas = [RedisServer(binary, directory, replica_of) for _ in range(2)]
        for server in self.replicas:
            server.start()

    def restore(self) -> None:
        for server in self.replicas:
            if not server.running:
                server.start()
            elif server.paused:
                server.resume()

    def stop(self) -> None:
        for server in [*self.replicas, self.primary]:
            server.stop()


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    binary = find_server_binary()
    assert binary is not None, "the cluster tests need a server binary"
    with tempfile.TemporaryDirectory(prefix="tv-ack-") as directory:
        servers = Topology(binary, directory)
        try:
            yield servers
        finally:
            servers.stop()


async def online(url: str) -> int:
    """How many replicas the server at ``url`` has in sync (``state=online``)."""
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        info = await client.info("replication")
    return sum(
        1 for key, value in info.items() if key.startswith("slave") and value["state"] == "online"
    )


async def until_online(url: str, wanted: int) -> None:
    """Wait (polling, bounded) until the server has ``wanted`` replicas in sync."""
    with trio.fail_after(10):
        # A readiness poll of child processes (no event tells a replica's sync).
        while await online(url) != wanted:  # noqa: ASYNC110
            await trio.sleep(0.02)


async def wait_calls(url: str) -> int:
    """How many WAIT commands the server at ``url`` has run."""
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        stats = await client.info("commandstats")
    wait = stats.get("cmdstat_wait")
    return int(wait["calls"]) if isinstance(wait, dict) else 0


@pytest.fixture
async def primary(topology: Topology) -> AsyncGenerator[RedisServer]:
    """The topology's primary, with both replicas running and in sync."""
    topology.restore()
    await until_online(topology.primary.url, 2)
    async with coredis.Redis.from_url(topology.primary.url, decode_responses=True) as client:
        # Caught up too (a replica resumed after a pause is online but behind): a test's
        # first WAIT then needs only its own writes acknowledged.
        with trio.fail_after(10), client.ensure_replication(replicas=2, timeout_ms=5000):
            await client.set("tv-test-catch-up", "1")
    yield topology.primary
    topology.restore()


def acking(url: str, namespace: str, replicas: int, **fields: float) -> RedisSlotStore:
    # A WAIT of 0.25 s (not lease_ttl / 10): replicas on a loaded test machine can lag
    # 0.1 s; still within a renewal round trip's bound (lease_ttl / 3).
    values: dict[str, float] = {
        "lease_ttl": TTL,
        "connect_timeout": 2.0,
        "replicas_ack_timeout": 0.25,
        **fields,
    }
    return RedisSlotStore(url, namespace=namespace, replicas_ack=replicas, **values)  # type: ignore[arg-type]


# -- the WAIT is in the pipeline ----------------------------------------------------------


async def test_keyed_work_runs_with_replicas_ack_and_waits_for_them(
    primary: RedisServer, namespace: str
) -> None:
    """With replicas_ack=1, keyed work runs as usual, and the round trips that change
    the store run WAIT on the primary (its WAIT count grows with them)."""
    store = acking(primary.url, namespace, 1)
    before = await wait_calls(primary.url)
    async with replica(store) as (sup, _):
        waiters = [
            await sup.submit(ControllerSpec.queue(quick(f"job{i}", i), slot="k")) for i in range(3)
        ]
        assert [(await w.wait()).value for w in waiters] == [0, 1, 2]
    # At least: the first renewal, three grants and three releases (some share a trip).
    assert await wait_calls(primary.url) - before >= 3


async def test_limit_pools_run_with_replicas_ack(primary: RedisServer, namespace: str) -> None:
    """A cluster pool's acquisitions and releases are round trips that change the store:
    with replicas_ack=1 they end with WAIT too, and two supervisors keep the pool's
    capacity between them."""
    store = acking(primary.url, namespace, 1)
    pool = ConcurrencyLimit("acked", 1)
    before = await wait_calls(primary.url)
    running = 0
    most = 0

    async def body(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await trio.sleep(0.01)
        running -= 1
        return i

    async with replica(store) as (one, _), replica(store) as (two, _):
        waiters = [
            await sup.add(TaskSpec.once(f"job{i}", body, i, limits=(pool,)))
            for i, sup in enumerate([one, two, one, two])
        ]
        with trio.fail_after(10):
            assert [(await w.wait()).value for w in waiters] == [0, 1, 2, 3]
    assert most == 1
    assert await wait_calls(primary.url) - before >= 4  # at least the acquisitions


async def test_a_wait_follows_the_calls_sent_again_after_noscript(
    primary: RedisServer, namespace: str
) -> None:
    """After a failover the new primary has no scripts: the calls that met NOSCRIPT are
    sent again, and so is the WAIT that ends the batch, so that it covers them."""
    store = acking(primary.url, namespace, 1)
    async with coredis.Redis.from_url(primary.url, decode_responses=True) as redis:
        await redis.script_flush()
    before = await wait_calls(primary.url)
    submit = scripts.submit_args("k", f"{A}/1", "queue", 10, False)
    async with RedisClient(store, A).connect() as conn:
        replies = await conn.round_trip([(scripts.SUBMIT.name, submit), (WAIT, ("1", "1000"))])
    assert not isinstance(replies[0], Exception)
    assert isinstance(replies[1], int)
    assert replies[1] >= 1
    assert await wait_calls(primary.url) - before == 2  # once in each pipeline


async def test_a_pushed_grant_is_confirmed_by_a_claim(primary: RedisServer, namespace: str) -> None:
    """The server pushes a hand-over's grant before the releaser's WAIT has confirmed
    it: with replicas_ack, the next owner's keeper claims (a round trip ending with its
    own WAIT) before it reports Owner, where without it would start at once."""
    store = acking(primary.url, namespace, 1, lease_ttl=30.0)  # no renewal in the window
    async with open_keeper(store, A) as a, open_keeper(store, B) as b:
        a.keeper.submit("k", 1, AdmissionPolicy.QUEUE, 10, False)
        first = await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, AdmissionPolicy.QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        before = b.keeper.statistics().round_trips
        a.keeper.release("k", 1, TaskOutcome(OutcomeKind.COMPLETED))
        with trio.fail_after(5):
            owner = await b.reports.wait_for(Owner, task_id=1)
        assert owner.token > first.token
        assert b.keeper.statistics().round_trips == before + 1  # the confirming claim


# -- a round trip that replicas do not acknowledge fails ---------------------------------


async def test_a_lost_replica_makes_the_store_unavailable_until_it_is_back(
    topology: Topology, primary: RedisServer, namespace: str
) -> None:
    """replicas_ack=2 and a replica stops while an owner runs: one STORE_UNAVAILABLE,
    the owner ends LEASE_LOST by the usual rule (its renewals no longer count), new
    wait=False work is rejected STORE_UNAVAILABLE; once the replica is back (in sync),
    STORE_RECOVERED, and work runs again."""
    store = acking(primary.url, namespace, 2)
    async with replica(store) as (sup, recorder):
        owner = await sup.submit(ControllerSpec.queue(gated(trio.Event()), slot="k"))
        await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        topology.replicas[1].stop()
        with trio.fail_after(2 * (TTL / 3 + store.ack_timeout)):  # the next renewal's WAIT
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        with trio.fail_after(2 * 0.8 * TTL):
            outcome = await owner.wait()
        assert outcome.kind is OutcomeKind.LEASE_LOST
        assert str(outcome.reason).startswith("lease expired")
        refused = await sup.submit(ControllerSpec.queue(quick("now"), slot="other"))
        assert (await refused.wait()).rejection is RejectionKind.STORE_UNAVAILABLE
        topology.replicas[1].start()
        with trio.fail_after(10):  # the replica's first sync, then a reconnection
            await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
        after = await sup.submit(ControllerSpec.queue(quick("after", 5), slot="k"))
        assert (await after.wait()).value == 5
        assert len(recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)) == 1
        assert len(recorder.of(EventKind.CONTROLLER_STORE_RECOVERED)) == 1


async def test_a_short_connect_timeout_caps_the_default_wait_so_a_shortfall_is_named(
    topology: Topology, primary: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A long lease with a short ``connect_timeout`` (the bound of a request's round
    trip): the default WAIT, ``lease_ttl / 10`` (3 s), is capped at ``connect_timeout /
    2``, so a replica that does not acknowledge makes an outage named as such. Before,
    the keeper cut the round trip at ``connect_timeout``, before its WAIT ended: "it did
    not answer within 1 s", the replicas' shortfall unnamed."""
    store = RedisSlotStore(
        primary.url, namespace=namespace, lease_ttl=30.0, connect_timeout=1.0, replicas_ack=2
    )
    async with replica(store) as (sup, recorder):
        topology.replicas[1].pause()
        await sup.submit(ControllerSpec.queue(quick("now"), slot="k"))
        with trio.fail_after(2 * store.connect_timeout):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        topology.replicas[1].resume()
    warnings = [r.getMessage() for r in caplog.records if "unavailable:" in r.getMessage()]
    assert warnings, caplog.text
    assert warnings[0].endswith("unavailable: needs 2 replicas to acknowledge, 1 did within 0.5 s")


@attrs.define
class PausedOnSubmit:
    """The replica ``pause_on_submit`` pauses, and the primary's reply to that submit."""

    server: RedisServer
    reply: object = None

    def resume(self) -> None:
        self.server.resume()


@pytest.fixture
def pause_on_submit(topology: Topology, monkeypatch: pytest.MonkeyPatch) -> PausedOnSubmit:
    """A replica that is paused (SIGSTOP) just before the first round trip that carries
    a submit is sent: that round trip's writes reach the primary, but not this replica."""
    paused = PausedOnSubmit(topology.replicas[0])
    original = _RedisConnection.round_trip
    armed = True

    async def round_trip(self: _RedisConnection, calls: Sequence[Call]) -> list[object]:
        nonlocal armed
        submits = [i for i, (name, _) in enumerate(calls) if name == scripts.SUBMIT.name]
        if not (armed and submits):
            return await original(self, calls)
        armed = False
        paused.server.pause()
        replies = await original(self, calls)
        paused.reply = replies[submits[0]]
        return replies

    monkeypatch.setattr(_RedisConnection, "round_trip", round_trip)
    return paused


async def test_a_grant_whose_wait_fails_is_not_acted_on(
    primary: RedisServer, namespace: str, pause_on_submit: PausedOnSubmit
) -> None:
    """The primary grants a lease, but a replica does not acknowledge that round trip:
    no Owner is reported (the work would not start), the submit is rejected
    STORE_UNAVAILABLE, and the lease is given back once the store recovers; asked again,
    the slot is granted."""
    store = acking(primary.url, namespace, 2, replicas_ack_timeout=0.05)
    lease_key = f"{store.key_prefix}lease:k"
    async with (
        coredis.Redis.from_url(primary.url, decode_responses=True) as redis,
        open_keeper(store, A) as a,
    ):
        a.keeper.submit("k", 1, AdmissionPolicy.QUEUE, 10, False)
        with trio.fail_after(2 * store.connect_timeout):
            rejected = await a.reports.wait_for(Rejected, task_id=1)
        assert rejected.kind is RejectionKind.STORE_UNAVAILABLE
        assert a.reports.of(Owner) == []
        # Granted there (the keeper may give the lease back at once, in the first round
        # trip of its recovery: that one's writes reach the primary too).
        assert scripts.parse_submit(pause_on_submit.reply).kind == "owner"
        pause_on_submit.resume()
        await a.reports.wait_for(StoreRecovered)
        assert await redis.exists([lease_key]) == 0  # given back
        a.keeper.submit("k", 2, AdmissionPolicy.QUEUE, 10, False)
        assert (await a.reports.wait_for(Owner, task_id=2)).slot == "k"
        assert len(a.reports.of(Owner)) == 1


async def test_held_work_whose_grant_was_not_replicated_runs_once_after(
    primary: RedisServer, namespace: str, pause_on_submit: PausedOnSubmit
) -> None:
    """wait=True work granted in a round trip a replica did not acknowledge does not
    start; it is held, and runs (once) after the store recovered."""
    store = acking(primary.url, namespace, 2, replicas_ack_timeout=0.05)
    starts = 0

    async def body() -> int:
        nonlocal starts
        starts += 1
        await trio.lowlevel.checkpoint()
        return starts

    async with replica(store) as (sup, recorder):
        spec = ControllerSpec.queue(TaskSpec.once("held", body), slot="k", wait=True)
        held = await sup.submit(spec)
        with trio.fail_after(2 * store.connect_timeout):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        assert starts == 0
        assert recorder.of(EventKind.CONTROLLER_LEASE_ACQUIRED) == []
        pause_on_submit.resume()
        outcome = await held.wait()
        assert (outcome.kind, outcome.value, starts) == (OutcomeKind.COMPLETED, 1, 1)
        assert len(recorder.of(EventKind.CONTROLLER_LEASE_ACQUIRED)) == 1


# -- start-up ----------------------------------------------------------------------------


async def test_open_supervisor_waits_for_a_replica_that_connects_within_connect_timeout(
    primary: RedisServer, topology: Topology, namespace: str
) -> None:
    """A replica that connects a moment after the start (it started with the primary):
    ``open_supervisor`` waits for it, within ``connect_timeout``, and starts. It raised
    at once, naming the shortfall."""
    late = topology.replicas[1]
    late.stop()
    await until_online(primary.url, 1)
    store = acking(primary.url, namespace, 2, connect_timeout=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(start_later, late)
        with trio.fail_after(10):
            async with replica(store) as (sup, _):
                assert await sup.run_in_slot("s", trio.lowlevel.checkpoint) is None


async def test_open_supervisor_names_a_shortfall_of_replicas(
    primary: RedisServer, namespace: str
) -> None:
    """A primary with fewer connected replicas than replicas_ack: ``open_supervisor``
    raises ``SlotStoreUnavailableError`` naming the shortfall, and starts nothing."""
    store = acking(primary.url, namespace, 3)
    entered = False
    wanted = r"needs 3 replicas to acknowledge, the primary has 2 connected"
    with pytest.raises(SlotStoreUnavailableError, match=wanted):
        async with open_supervisor(config(store)):
            entered = True
    assert not entered


async def test_a_limited_wait_cancelled_while_its_acquisition_was_unconfirmed_holds_nothing(
    topology: Topology, primary: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The primary grants a ``limited()`` block its unit, but a replica does not
    acknowledge that round trip; the block is cancelled meanwhile. Once the store
    recovers, the unit is given back: the pool holds nothing. Before, the keeper took
    the acquisition for one the server never saw (it asks again once the server
    answers), sent no withdrawal, and the unit stayed held for as long as the process
    kept its units' generation (it holds a unit of another pool)."""
    # A lease_ttl the outage stays well within: the process keeps its units' generation
    # (a longer outage ends it, and every unit of it with it).
    store = acking(primary.url, namespace, 2, replicas_ack_timeout=0.05, lease_ttl=6.0)
    pool = ConcurrencyLimit("unconfirmed", 1)
    paused = topology.replicas[0]
    original = _RedisConnection.round_trip
    armed = True

    async def round_trip(self: _RedisConnection, calls: Sequence[Call]) -> list[object]:
        nonlocal armed
        if armed and any(name == scripts.LIMIT_ACQUIRE.name for name, _ in calls):
            armed = False
            paused.pause()  # the acquisition reaches the primary, not this replica
        return await original(self, calls)

    async def hold(sup: Supervisor, task_status: trio.TaskStatus[None]) -> None:
        # A unit of another pool, held throughout: it keeps the units' generation live.
        async with sup.limited(ConcurrencyLimit("kept", 1)):
            task_status.started()
            await trio.sleep_forever()

    async with replica(store) as (sup, recorder), trio.open_nursery() as nursery:
        await nursery.start(hold, sup)
        monkeypatch.setattr(_RedisConnection, "round_trip", round_trip)
        with trio.move_on_after(0.5) as waited:
            async with sup.limited(pool):
                raise AssertionError("entered while the store was unavailable")  # pragma: no cover
        assert waited.cancelled_caught
        await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        paused.resume()
        with trio.fail_after(10):  # the replica catches up, then the store recovers
            await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
            # The withdrawal goes in the recovery's first round trip or soon after.
            while (await sup.cluster_limit(pool)).held:  # noqa: ASYNC110
                await trio.sleep(0.05)
        info = await sup.cluster_limit(pool)
        assert (info.held, info.holders, info.waiting) == (0, {}, 0)
        nursery.cancel_scope.cancel()
