"""Limit pools shared by replicas in separate OS processes, against one real server.

Each replica (``replica.py``) adds plain work that takes a unit of one pool; bodies
record their start and end on the system-wide monotonic clock, and the checks count
from those ledgers: a concurrency pool never has more bodies running at once than its
capacity (also when a holder is killed, or paused until its units expire), and a rate
pool's starts stay within a stated tolerance of its GCRA. Timing bounds are liveness
bounds with at least a 2x margin; waits are for records.
"""

from __future__ import annotations

import time
from typing import Any

from replica_harness import ReplicaProcess, open_replicas

from trio_taskvisor._config import RedisSlotStore

TTL = 1.0  # the store fixture's lease_ttl
CAPACITY_2 = {"name": "exports", "capacity": 2}


def ledger(
    *replicas: ReplicaProcess, cut: dict[str, float] | None = None
) -> list[tuple[float, int]]:
    """``(time, +1 | -1)`` for every body's start and end, in time order (an end before a
    start at the same instant). ``cut``: a replica name -> the time it was killed or
    paused, which ends its running bodies' intervals (a stopped process does no work)."""
    moves: list[tuple[float, int]] = []
    for replica in replicas:
        ends = {r["id"]: r["t"] for r in replica.of("end")}
        stop = (cut or {}).get(replica.name)
        for start in replica.of("start"):
            end = ends.get(start["id"], stop)
            if stop is not None:
                end = stop if end is None else min(end, stop)
            assert end is not None, f"{start['id']} never ended"
            if start["t"] < end:
                moves += [(start["t"], 1), (end, -1)]
    return sorted(moves, key=lambda move: (move[0], move[1]))


def most_at_once(moves: list[tuple[float, int]]) -> int:
    running = peak = 0
    for _, step in moves:
        running += step
        peak = max(peak, running)
    return peak


async def add(replica: ReplicaProcess, wid: str, limit: dict[str, Any], **body: Any) -> None:
    await replica.send("add", id=wid, limit=limit, **body)
    await replica.wait_for("submitted", id=wid)


async def hold_both_units(a: ReplicaProcess, b: ReplicaProcess, c: ReplicaProcess) -> None:
    """``a`` and ``b`` each start gated work holding a unit of the capacity-2 pool; ``c``
    then adds its own (``c-0``), which waits for a unit."""
    await add(a, "a-0", CAPACITY_2, gate=True)
    await a.wait_for("start", id="a-0")
    await add(b, "b-0", CAPACITY_2, gate=True)
    await b.wait_for("start", id="b-0")
    await add(c, "c-0", CAPACITY_2, gate=True)


async def test_a_capacity_2_pool_of_three_replicas_never_has_three_holders(
    store: RedisSlotStore,
) -> None:
    """Three processes each add four attempts of a capacity-2 pool at once: every attempt
    runs, and the ledger never shows three bodies at once (it shows two)."""
    async with open_replicas(store, "a", "b", "c") as replicas:
        for i in range(4):
            for replica in replicas:
                await add(replica, f"{replica.name}-{i}", CAPACITY_2, hold=0.05)
        for replica in replicas:
            for i in range(4):
                await replica.wait_for("outcome", id=f"{replica.name}-{i}")
        kinds = {r["kind"] for replica in replicas for r in replica.of("outcome")}
        assert kinds == {"completed"}
        assert most_at_once(ledger(*replicas)) == 2


async def test_a_paused_holder_loses_its_unit_and_is_forced_on_resume(
    store: RedisSlotStore,
) -> None:
    """SIGSTOP of a holder past ``lease_ttl``: its unit frees and the waiter starts; once
    resumed, the paused attempt is forced at once and ends ``LEASE_LOST`` (the ledger
    ends its body at the pause: a stopped process does no work)."""
    async with open_replicas(store, "a", "b", "c") as replicas:
        a, b, c = replicas
        await hold_both_units(a, b, c)
        paused_at = time.monotonic()
        a.pause()
        try:
            started = await c.wait_for("start", id="c-0")
            assert started["t"] - paused_at < 2 * TTL
        finally:
            resumed_at = time.monotonic()
            a.resume()
        outcome = await a.wait_for("outcome", id="a-0")
        assert outcome["kind"] == "lease_lost"
        assert outcome["reason"] == "limit lease lost: exports"
        ended = await a.wait_for("end", id="a-0")  # the outcome may come first: forced
        assert ended["t"] - resumed_at < TTL
        for replica, wid in ((b, "b-0"), (c, "c-0")):
            await replica.send("release", id=wid)
            await replica.wait_for("outcome", id=wid)
        assert most_at_once(ledger(a, b, c, cut={"a": paused_at})) == 2


async def test_a_rate_pool_of_three_replicas_keeps_to_its_gcra(store: RedisSlotStore) -> None:
    """24 starts of ``10 per second, burst 2`` from three processes: in every window of
    the ledger, starts <= burst + rate * window + 1 (the tolerance: a grant's delivery
    time varies by milliseconds), and the 24 take at least the 2.2 s the GCRA needs."""
    limit = {"name": "partner", "rate": 10, "per": 1.0, "burst": 2}
    async with open_replicas(store, "a", "b", "c") as replicas:
        for i in range(8):
            for replica in replicas:
                await add(replica, f"{replica.name}-{i}", limit)
        for replica in replicas:
            for i in range(8):
                await replica.wait_for("outcome", id=f"{replica.name}-{i}", kind="completed")
        starts = sorted(r["t"] for replica in replicas for r in replica.of("start"))
        assert len(starts) == 24
        for i, first in enumerate(starts):
            for j in range(i, len(starts)):
                window = starts[j] - first
                assert j - i + 1 <= 2 + 10 * window + 1, (i, j, window)
        assert starts[-1] - starts[0] >= (24 - 2) * 0.1 - 0.05


# Last: the killed replica is replaced by a fresh process, which takes seconds to start.
async def test_a_killed_holder_frees_its_unit_when_its_lease_expires(
    store: RedisSlotStore,
) -> None:
    """SIGKILL of a holder: its unit frees within ``lease_ttl`` and the waiter starts;
    the ledger (the dead body ends at the kill) never shows three holders."""
    async with open_replicas(store, "a", "b", "c") as replicas:
        a, b, c = replicas
        await hold_both_units(a, b, c)
        killed_at = time.monotonic()
        a.kill()
        started = await c.wait_for("start", id="c-0")
        assert started["t"] - killed_at < 2 * TTL
        await b.send("release", id="b-0")
        await c.send("release", id="c-0")
        for replica, wid in ((b, "b-0"), (c, "c-0")):  # both bodies' ends are in the ledger
            await replica.wait_for("outcome", id=wid)
        assert most_at_once(ledger(a, b, c, cut={"a": killed_at})) == 2
