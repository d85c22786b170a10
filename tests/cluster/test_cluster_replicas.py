"""Cluster slots as a user of several replicas sees them: OS processes, one real server.

Each replica is a separate process (``replica.py``) with its own supervisor and slot
store; bodies record their start and end on the system-wide monotonic clock with their
fence token. The checks are the guarantee itself (no two owners of a slot overlap, fence
tokens strictly increase, the cluster queue is FIFO) and what each failure looks like
(a killed owner, a paused owner, a server restart, a cancelled caller, a shutdown).
Timing bounds are liveness bounds with at least a 2x margin; waits are for records.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import trio
from conftest import RedisServer
from replica_harness import FencedDatabase, Record, ReplicaProcess, close, open_replicas

from trio_taskvisor._config import RedisSlotStore

TTL = 1.0  # the store fixture's lease_ttl


def intervals(*replicas: ReplicaProcess) -> dict[str, list[tuple[float, float, int, str]]]:
    """Per slot: (start, end, token, work id) of every body that ran, by start time."""
    by_slot: dict[str, list[tuple[float, float, int, str]]] = defaultdict(list)
    for replica in replicas:
        ends = {r["id"]: r["t"] for r in replica.of("end")}
        for start in replica.of("start"):
            end = ends[start["id"]]
            by_slot[start["slot"]].append((start["t"], end, start["token"], start["id"]))
    return {slot: sorted(runs) for slot, runs in by_slot.items()}


def assert_one_owner_at_a_time(*replicas: ReplicaProcess) -> None:
    """No two bodies of a slot overlap; each new owner has a higher fence token."""
    for slot, runs in intervals(*replicas).items():
        for before, after in itertools.pairwise(runs):
            assert after[0] >= before[1], f"{slot}: {after[3]} started before {before[3]} ended"
            assert after[2] > before[2], f"{slot}: token of {after[3]} <= {before[3]}'s"


def outcome(replica: ReplicaProcess, wid: str) -> Record:
    return replica.of("outcome", id=wid)[0]


# -- the guarantee -----------------------------------------------------------------------------


async def test_contending_replicas_never_overlap_and_tokens_increase(
    store: RedisSlotStore,
) -> None:
    """Three processes submit to the same two slots at once: every body runs, one at a
    time per slot, each owner with a higher fence token than the one before."""
    async with open_replicas(store, "a", "b", "c") as replicas:
        work = [
            (replica, f"{replica.name}-{slot}-{i}", slot)
            for i in range(4)
            for slot in ("s1", "s2")
            for replica in replicas
        ]
        for replica, wid, slot in work:
            await replica.send("submit", id=wid, slot=slot, wait=True, hold=0.005)
        for replica, wid, _ in work:
            await replica.wait_for("outcome", id=wid)
        assert {outcome(r, wid)["kind"] for r, wid, _ in work} == {"completed"}
        runs = intervals(*replicas)
        assert {slot: len(r) for slot, r in runs.items()} == {"s1": 12, "s2": 12}
        assert_one_owner_at_a_time(*replicas)
        for replica in replicas:  # each owner's lease event carries its token
            tokens = {(e["name"], e["token"]) for e in replica.event("controller_lease_acquired")}
            assert tokens == {(r["id"], r["token"]) for r in replica.of("start")}


async def test_cluster_queue_is_fifo_across_processes(store: RedisSlotStore) -> None:
    """Entries queued from two processes, interleaved, run in the order the server
    accepted them."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("owner", "s", gate=True)
        await a.wait_for("start", id="owner")
        order = [(b, "q1"), (a, "q2"), (a, "q3"), (b, "q4"), (b, "q5"), (a, "q6")]
        for replica, wid in order:
            await replica.submit(wid, "s", hold=0.005)
            await replica.wait_event(
                "controller_submitted", name=wid, reason="queued in the cluster"
            )
        await a.send("release", id="owner")
        for replica, wid in order:
            await replica.wait_for("outcome", id=wid)
        runs = intervals(a, b)["s"]
        assert [wid for *_, wid in runs] == ["owner", *(wid for _, wid in order)]
        assert_one_owner_at_a_time(a, b)


# -- the policies across processes -------------------------------------------------------------


async def test_remote_replace_stops_the_owner_and_supersedes_the_head(
    store: RedisSlotStore,
) -> None:
    """A REPLACE in B stops A's owner through A (one REMOTE_STOP naming B), rejects the
    queue head it displaces SUPERSEDED (A's too), and starts once A's owner has exited,
    with a higher token."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("old", "s", gate=True)
        await a.wait_for("start", id="old")
        await a.submit("head", "s", hold=0.005)
        await a.wait_event("controller_submitted", name="head")
        await b.submit("new", "s", policy="replace", hold=0.005)
        assert (await b.wait_for("outcome", id="new"))["kind"] == "completed"
        assert outcome(a, "old")["kind"] == "cancelled"
        stops = a.event("controller_remote_stop")
        assert [(e["name"], e["reason"]) for e in stops] == [
            ("old", f"stop requested by {b.instance}")
        ]
        head = await a.wait_for("outcome", id="head")
        assert (head["kind"], head["rejection"]) == ("rejected", "superseded")
        assert a.of("start", id="head") == []
        assert [wid for *_, wid in intervals(a, b)["s"]] == ["old", "new"]
        assert_one_owner_at_a_time(a, b)


async def test_join_follows_work_of_another_process(store: RedisSlotStore) -> None:
    """A JOIN in B resolves to the outcome of A's owner, its value carried as JSON."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("owner", "s", gate=True, value="sample")
        task = (await a.wait_for("submitted", id="owner"))["task"]
        await a.wait_for("start", id="owner")
        await b.submit("joiner", "s", policy="join")
        joined = await b.wait_event("controller_submitted", name="joiner")
        assert joined["reason"] == f"joined {a.instance}#{task}"
        await a.send("release", id="owner")
        result = await b.wait_for("outcome", id="joiner")
        # (1, "two", {3: (4.5, None)}) as JSON gives it back: lists, str keys
        assert (result["kind"], result["value"]) == ("completed", [1, "two", {"3": [4.5, None]}])
        assert b.of("start") == []


async def test_join_to_work_of_a_killed_process_resolves_lease_lost(
    store: RedisSlotStore,
) -> None:
    """The followed work's process dies: the joiner resolves LEASE_LOST, naming it."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("owner", "s", gate=True)
        await a.wait_for("start", id="owner")
        await b.submit("joiner", "s", policy="join")
        await b.wait_event("controller_submitted", name="joiner")
        killed = time.monotonic()
        a.kill()
        result = await b.wait_for("outcome", id="joiner")
        assert (result["kind"], result["reason"]) == (
            "lease_lost",
            f"followed work lost: {a.instance}",
        )
        assert result["t"] - killed < 3 * TTL  # the lease expires, then one more renewal


# -- failures --------------------------------------------------------------------------------


async def test_killed_replica_passes_its_slots_on_after_about_lease_ttl(
    store: RedisSlotStore,
) -> None:
    """SIGKILL of A: its lease expires and B's queued work starts within 2 lease_ttl;
    A's queue entry in another slot is skipped, so B's entry behind it runs too."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("a-owner", "s", gate=True)
        await a.wait_for("start", id="a-owner")
        await b.submit("b-next", "s", hold=0.005)
        await b.submit("b-owner", "s2", gate=True)
        await b.wait_for("start", id="b-owner")
        await a.submit("a-queued", "s2", hold=0.005)
        await a.wait_event("controller_submitted", name="a-queued")
        await b.submit("b-behind", "s2", hold=0.005)
        await b.wait_event("controller_submitted", name="b-behind")
        killed = time.monotonic()
        a.kill()
        await b.send("release", id="b-owner")
        started = await b.wait_for("start", id="b-next")
        behind = await b.wait_for("start", id="b-behind")
        assert started["t"] - killed < 2 * TTL
        assert behind["t"] - killed < 2 * TTL
        assert started["token"] > a.of("start", id="a-owner")[0]["token"]
        await b.wait_for("outcome", id="b-next")
        await b.wait_for("outcome", id="b-behind")
        for slot in ("s", "s2"):  # nothing of A is left
            info = await b.cluster_slot(slot)
            assert info["none"] is True, info


async def test_paused_owner_ends_lease_lost_on_resume_and_its_write_is_refused(
    store: RedisSlotStore,
) -> None:
    """SIGSTOP of A: B takes the slot and writes with a higher token; on SIGCONT A's owner
    ends LEASE_LOST at once, and the write it makes as it ends is refused by the fence."""
    db = FencedDatabase()
    async with trio.open_nursery() as nursery:
        await nursery.start(db.serve)
        async with open_replicas(store, "a", "b") as (a, b):
            await a.submit("stale", "s", gate=True, db=db.port)
            await a.wait_for("write", id="stale")
            await b.submit("fresh", "s", gate=True, db=db.port)
            await b.wait_event("controller_submitted", name="fresh")
            a.pause()
            paused = time.monotonic()
            await b.wait_for("write", id="fresh")
            assert time.monotonic() - paused < 2 * TTL
            resumed = time.monotonic()
            a.resume()
            lost = await a.wait_for("outcome", id="stale")
            assert lost["kind"] == "lease_lost"
            assert lost["reason"].startswith("lease expired")
            assert lost["t"] - resumed < TTL / 2  # at once: no renewal needed to notice
            flush = await a.wait_for("write", id="stale", what="flush")
            assert flush["accepted"] is False
            stale_token = a.of("start", id="stale")[0]["token"]
            assert db.highest > stale_token
            assert (stale_token, False) in db.writes("stale")
            await b.send("release", id="fresh")
            await b.wait_for("outcome", id="fresh")
            assert all(accepted for _, accepted in db.writes("fresh"))
            assert_one_owner_at_a_time(b)
        nursery.cancel_scope.cancel(reason="test done")


async def test_paused_replica_loses_its_queue_place_but_not_its_work(
    store: RedisSlotStore,
) -> None:
    """A's queued entry outlives a pause longer than the lease TTL: while A's heartbeat is
    expired, B's entry behind it is served first; on SIGCONT A's entry is placed again, at
    the tail, and runs (FIFO does not survive a lapsed heartbeat; the work does)."""
    async with open_replicas(store, "a", "b") as (a, b):
        await b.submit("owner", "s", gate=True)
        await b.wait_for("start", id="owner")
        await a.submit("a-first", "s", hold=0.005)
        await a.wait_event("controller_submitted", name="a-first")
        await b.submit("b-second", "s", hold=0.005)
        await b.wait_event("controller_submitted", name="b-second")
        a.pause()
        paused = time.monotonic()
        await b.send("release", id="owner")
        second = await b.wait_for("start", id="b-second")
        assert second["t"] - paused < 2 * TTL  # A's heartbeat expired: its entry skipped
        await b.wait_for("outcome", id="b-second")
        a.resume()
        first = await a.wait_for("start", id="a-first")
        assert first["token"] > second["token"]
        assert (await a.wait_for("outcome", id="a-first"))["kind"] == "completed"
        assert_one_owner_at_a_time(a, b)


async def test_server_restart_loses_leases_then_work_resumes_with_higher_tokens(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server stops while A owns the slot and B queues: A's owner ends LEASE_LOST, both
    see the outage; after the restart (all data lost) B's entry is placed again, runs with
    a higher token, and new work of A follows it."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("owner", "s", gate=True)
        first = await a.wait_for("start", id="owner")
        await b.submit("queued", "s", hold=0.005)
        await b.wait_event("controller_submitted", name="queued")
        stopped = time.monotonic()
        redis_server.stop()
        lost = await a.wait_for("outcome", id="owner")
        assert lost["kind"] == "lease_lost"
        assert lost["t"] - stopped < 2 * TTL
        await a.wait_event("controller_store_unavailable")
        await b.wait_event("controller_store_unavailable")
        redis_server.start()
        await a.wait_event("controller_store_recovered")
        await b.wait_event("controller_store_recovered")
        resumed = await b.wait_for("start", id="queued")
        assert resumed["token"] > first["token"]
        await b.wait_for("outcome", id="queued")
        await a.submit("after", "s", hold=0.005)
        after = await a.wait_for("start", id="after")
        assert after["token"] > resumed["token"]
        await a.wait_for("outcome", id="after")
        assert outcome(b, "queued")["kind"] == "completed"
        assert_one_owner_at_a_time(a, b)
        assert len(a.event("controller_store_unavailable")) == 1
        assert len(a.event("controller_store_recovered")) == 1


async def test_quick_server_restart_refuses_the_lease_and_keeps_tokens_increasing(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server restarts at once (a new run_id, every key lost): A's next renewal is
    refused, its owner ends LEASE_LOST, and B's entry (placed again by its renewal) runs
    with a higher token. The two may overlap here: the documented restart window."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("owner", "s", gate=True)
        first = await a.wait_for("start", id="owner")
        await b.submit("queued", "s", hold=0.005)
        await b.wait_event("controller_submitted", name="queued")
        restarted = time.monotonic()
        redis_server.restart()
        lost = await a.wait_for("outcome", id="owner")
        assert lost["kind"] == "lease_lost"
        assert lost["t"] - restarted < 2 * TTL
        resumed = await b.wait_for("start", id="queued")
        assert resumed["token"] > first["token"]
        assert (await b.wait_for("outcome", id="queued"))["kind"] == "completed"
        await a.wait_event("controller_store_recovered")


async def test_network_cut_ends_the_owner_lease_lost_and_work_resumes(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Nothing answers (the server is paused: as a network cut to every replica): A's
    owner ends "lease expired" within 0.8 lease_ttl of its last renewal; once the server
    answers again, B's queued work runs with a higher token."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("owner", "s", gate=True)
        first = await a.wait_for("start", id="owner")
        await b.submit("queued", "s", hold=0.005)
        await b.wait_event("controller_submitted", name="queued")
        redis_server.pause()
        cut = time.monotonic()
        lost = await a.wait_for("outcome", id="owner")
        assert (lost["kind"], lost["reason"][:13]) == ("lease_lost", "lease expired")
        assert lost["t"] - cut < 2 * 0.8 * TTL
        await a.wait_event("controller_store_unavailable")
        redis_server.resume()
        resumed = await b.wait_for("start", id="queued")
        assert resumed["token"] > first["token"]
        assert (await b.wait_for("outcome", id="queued"))["kind"] == "completed"
        assert_one_owner_at_a_time(a, b)


async def test_next_local_owner_waits_for_a_lost_owner_to_exit(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A's owner loses its lease while it cannot stop (blocked in a thread): A's next
    entry of the slot is granted the lease but starts only once the old body has
    physically exited."""
    async with open_replicas(store, "a") as (a,):
        await a.submit("blocked", "s", thread=True)
        first = await a.wait_for("start", id="blocked")
        await a.submit("next", "s", hold=0.005)
        await a.wait_event("controller_submitted", name="next", reason="queued in the cluster")
        redis_server.pause()
        lost = await a.wait_for("outcome", id="blocked")
        assert lost["kind"] == "lease_lost"
        redis_server.resume()
        granted = await a.wait_event("controller_lease_acquired", name="next")
        assert granted["token"] > first["token"]
        assert a.of("end", id="blocked") == []
        assert a.of("start", id="next") == []  # granted, held: the slot is busy locally
        await a.send("release", id="blocked")
        started = await a.wait_for("start", id="next")
        assert started["t"] >= a.of("end", id="blocked")[0]["t"]
        assert (await a.wait_for("outcome", id="next"))["kind"] == "completed"


async def test_remote_replace_waits_for_the_owner_through_its_grace(
    store: RedisSlotStore,
) -> None:
    """A's owner defers cancellation: B's REPLACE waits for A's grace (0.3 s), A forces
    its owner, and B's work starts only after the old body physically ended."""
    async with open_replicas(store, "a", "b", grace=0.3) as (a, b):
        await a.submit("stubborn", "s", gate=True, defer=True)
        await a.wait_for("start", id="stubborn")
        await b.submit("new", "s", policy="replace", hold=0.005)
        await a.wait_event("controller_remote_stop", name="stubborn")
        started = await b.wait_for("start", id="new")
        assert outcome(a, "stubborn")["kind"] == "force_aborted"
        assert started["t"] >= a.of("end", id="stubborn")[0]["t"]
        await b.wait_for("outcome", id="new")
        assert_one_owner_at_a_time(a, b)


async def test_cancelled_acquire_leaves_no_orphan_lease(store: RedisSlotStore) -> None:
    """A caller cancelled while its acquisition is in flight leaves no lease behind: B's
    work on the slot starts at once, not after the lease TTL."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.send("call", id="cancelled", slot="s", gate=True, cancel_in_flight=True)
        await a.wait_for("outcome", id="cancelled", kind="caller_cancelled")
        info = await a.cluster_slot("s")  # after the give-back: it goes first
        assert info["none"] is True, info
        cancelled = time.monotonic()
        await b.submit("next", "s", hold=0.005)
        started = await b.wait_for("start", id="next")
        assert started["t"] - cancelled < TTL / 2


async def test_cancelled_queued_caller_leaves_the_cluster_queue(store: RedisSlotStore) -> None:
    """A caller cancelled while its work is queued behind another process's owner takes
    its entry out of the cluster queue at once."""
    async with open_replicas(store, "a", "b") as (a, b):
        await b.submit("owner", "s", gate=True)
        await b.wait_for("start", id="owner")
        await a.send("call", id="queued", slot="s", hold=0.005)
        await a.wait_event("controller_submitted", slot="s", reason="queued in the cluster")
        assert (await b.cluster_slot("s"))["depth"] == 1
        await a.send("cancel", id="queued")
        await a.wait_for("outcome", id="queued", kind="caller_cancelled")
        info = await a.cluster_slot("s")  # after A's withdrawal: its keeper sends in order
        assert (info["holder"], info["depth"]) == (b.instance, 0)
        await b.send("release", id="owner")
        await b.wait_for("outcome", id="owner")
        assert (await b.cluster_slot("s"))["none"] is True
        assert a.of("start") == []


async def test_shutdown_hands_slots_over_at_once(store: RedisSlotStore) -> None:
    """A shuts down while it owns one slot and queues in another: its owner stops, its
    lease goes to B at once (well before the lease TTL), its queue entry is withdrawn."""
    async with open_replicas(store, "a", "b") as (a, b):
        await a.submit("a-owner", "s", gate=True)
        await a.wait_for("start", id="a-owner")
        await b.submit("b-next", "s", hold=0.005)
        await b.submit("b-owner", "s2", gate=True)
        await b.wait_for("start", id="b-owner")
        await a.submit("a-queued", "s2", hold=0.005)
        await a.wait_event("controller_submitted", name="a-queued")
        await a.send("exit")
        closing = await a.wait_for("closing")
        started = await b.wait_for("start", id="b-next")
        assert started["t"] - closing["t"] < TTL / 2
        await a.wait_for("closed")
        assert outcome(a, "a-owner")["kind"] == "cancelled"
        queued = outcome(a, "a-queued")
        assert (queued["kind"], queued["rejection"]) == ("rejected", "shutting_down")
        info = await b.cluster_slot("s2")
        assert (info["holder"], info["depth"]) == (b.instance, 0)
        await b.send("release", id="b-owner")
        await close(b)
        assert_one_owner_at_a_time(a, b)
