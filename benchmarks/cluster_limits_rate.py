"""Scenario 10, rows f-h: cluster rate decisions against the ``limits`` library.

One real server (started as the cluster tests start it: ``tests/cluster/redis_server.py``),
one worker process spawned once that runs every job, each job in an event loop of its
own, interleaved round by round after a discarded warm-up round:

* ours: ``CALLERS`` trio tasks in one supervisor with a ``RedisSlotStore``, each
  entering ``async with sup.limited(limit.key(k))`` (an empty body) ``per_caller``
  times, on a ``RateLimit`` so high that it never throttles (every decision is "go",
  none waits): the decision throughput, not the rate. The lease keeper batches the
  callers' requests: one round trip carries many ``limit_acquire`` calls.
* the peer: the ``limits`` library's asyncio API with the same number of asyncio tasks
  each calling ``await limiter.hit(item, k)`` as often, on a limit just as high:
  ``MovingWindowRateLimiter`` (the target's peer), ``FixedWindowRateLimiter`` and
  ``SlidingWindowCounterRateLimiter``. Its coredis storage pins ``coredis<6``, which
  conflicts with ours (``coredis>=6.2``), so it runs on its redis-py storage
  (``RedisStorage(..., implementation="redispy")``); redis-py's asyncio client does
  not run under trio, hence ``asyncio.run``.

Every caller works on a seeded sequence of keys, the same for both (one key, or 1,000).
The clock starts after a warm-up decision per caller (connections opened, scripts
loaded) and stops when the last caller is done; a row's ratio is our time over the
peer's time for the same number of decisions (lower is better: below 1x we are ahead).

Refused decisions: a ``limits`` ``hit()`` that returns ``False`` is a complete decision
(one round trip), and the notes give its throughput on a limit of 1 per hour. Ours has
no refusing call: a ``limited`` block that finds no room waits in the pool's line on
the server until a start is allowed, so at a throttling rate its decisions per second
are the rate itself; that is not measured as a throughput here.

Run it alone (``python benchmarks/cluster_limits_rate.py [--quick]``) or as part of
scenario 10 of ``benchmarks/run.py``. Without ``limits`` or redis-py (the ``bench``
extra) the rows are skipped with a note that still gives our own decisions per second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "tests" / "cluster"))  # redis_server, shared with the tests

from _harness import Plan, Result, Row, Skipped, Target, format_table, serve_jobs  # noqa: E402

SCENARIO = "10"
CALLERS = 50
MANY_KEYS = 1_000
LEASE_TTL = 10.0
JOB_TIMEOUT = 300.0  # seconds the worker may take to answer before the run is abandoned
# Never throttles: a start every microsecond on average, 10,000 at once after a pause.
RATE, BURST = 1_000_000, 10_000
STRATEGIES = {
    "moving": "MovingWindowRateLimiter",
    "fixed": "FixedWindowRateLimiter",
    "sliding": "SlidingWindowCounterRateLimiter",
}


def _keys(caller: int, keys: int, decisions: int) -> list[int]:
    """The keys one caller decides on, the same for every contender."""
    rng = random.Random(caller)
    return [rng.randrange(keys) for _ in range(decisions)]


# -- the jobs (in the worker process) -------------------------------------------------------


Usage = tuple[float, float, float]
"""CPU seconds of this process, CPU seconds of the server, and script calls on the
server (``EVALSHA``), over the timed part of a job."""


def _server_usage(cpu: dict[str, Any], commands: dict[str, Any]) -> tuple[float, float]:
    evalsha = commands.get("cmdstat_evalsha", {"calls": 0})
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), float(evalsha["calls"])


def _usage(before: Usage, after: Usage) -> Usage:
    return (after[0] - before[0], after[1] - before[1], after[2] - before[2])


async def _ours(url: str, namespace: str, keys: int, per_caller: int) -> tuple[float, int, Usage]:
    """Our decisions: seconds for every caller's ``per_caller`` blocks, their count,
    and the CPU and script calls they cost."""
    import coredis

    from trio_taskvisor import ControllerConfig, RateLimit, SupervisorConfig, open_supervisor
    from trio_taskvisor.redis import RedisSlotStore

    store = RedisSlotStore(url, namespace=namespace, lease_ttl=LEASE_TTL, connect_timeout=5.0)
    config = SupervisorConfig(controller=ControllerConfig(slot_store=store))
    limit = RateLimit("bench-rate", RATE, per=1.0, burst=BURST)
    pools = [limit.key(f"k{k}") for k in range(keys)]
    done = 0

    async def usage(client: Any) -> Usage:
        cpu, commands = await client.info("cpu"), await client.info("commandstats")
        return (time.process_time(), *_server_usage(cpu, commands))

    async with (
        coredis.Redis.from_url(url, decode_responses=True) as client,
        open_supervisor(config) as sup,
    ):

        async def caller(sequence: list[int]) -> None:
            nonlocal done
            for key in sequence:
                async with sup.limited(pools[key]):
                    done += 1

        async with trio.open_nursery() as nursery:  # warm-up: one decision per caller
            for c in range(CALLERS):
                nursery.start_soon(caller, [c % keys])
        work = [_keys(c, keys, per_caller) for c in range(CALLERS)]
        done = 0
        before = await usage(client)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for sequence in work:
                nursery.start_soon(caller, sequence)
        elapsed = time.perf_counter() - start
        after = await usage(client)
    return elapsed, done, _usage(before, after)


async def _peer(
    url: str, strategy: str, keys: int, per_caller: int, refuse: bool
) -> tuple[float, int, Usage]:
    """The ``limits`` library's decisions: seconds, how many ``hit()`` allowed, and
    the CPU and script calls they cost."""
    import redis.asyncio as aioredis
    from limits import RateLimitItemPerHour, RateLimitItemPerSecond
    from limits.aio import strategies
    from limits.aio.storage import RedisStorage

    client = aioredis.Redis.from_url(url, decode_responses=True)

    async def usage() -> Usage:
        cpu, commands = await client.info("cpu"), await client.info("commandstats")
        return (time.process_time(), *_server_usage(cpu, commands))

    await client.flushall()
    storage = RedisStorage(f"async+{url}", implementation="redispy")
    limiter = getattr(strategies, STRATEGIES[strategy])(storage)
    item = RateLimitItemPerHour(1) if refuse else RateLimitItemPerSecond(RATE)
    allowed = 0

    async def caller(sequence: list[int]) -> None:
        nonlocal allowed
        for key in sequence:
            if await limiter.hit(item, f"k{key}"):
                allowed += 1

    # Warm-up: one decision per caller at once (a connection each, the scripts loaded).
    await asyncio.gather(*(caller([c % keys]) for c in range(CALLERS)))
    work = [_keys(c, keys, per_caller) for c in range(CALLERS)]
    allowed = 0
    before = await usage()
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for sequence in work:
            group.create_task(caller(sequence))
    elapsed = time.perf_counter() - start
    after = await usage()
    await client.flushall()
    await client.aclose()
    return elapsed, allowed, _usage(before, after)


def _worker(url: str, control: Connection) -> None:
    """The worker process: run jobs until told to stop (``None``)."""

    def run(name: str, args: Any) -> object:
        if name == "ours":
            return trio.run(_ours, url, *args)
        return asyncio.run(_peer(url, *args))

    serve_jobs(control, run)


class Worker:
    """One spawned process that runs every job, one at a time."""

    def __init__(self, url: str) -> None:
        self.control, theirs = multiprocessing.Pipe()
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(target=_worker, args=(url, theirs), daemon=True)
        self.process.start()

    def run(self, name: str, *args: Any) -> tuple[float, int, Usage]:
        self.control.send((name, args))
        if not self.control.poll(JOB_TIMEOUT):
            raise RuntimeError(f"the worker did not answer within {JOB_TIMEOUT:g} s")
        kind, result = self.control.recv()
        if kind == "error":
            raise RuntimeError(f"the worker failed:\n{result}")
        elapsed, count, usage = result
        return elapsed, count, usage

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.control.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


# -- measuring (in the parent) --------------------------------------------------------------

_runs = iter(range(1_000_000))


def measure(url: str, plan: Plan) -> list[Result]:
    """Rows 10f-10h against a running server at ``url``."""
    per_caller = 4 if plan.quick else 200
    rounds, warmup = (1, 1) if plan.quick else (5, 1)
    decisions = CALLERS * per_caller
    peer = all(importlib.util.find_spec(m) is not None for m in ("limits", "redis"))
    jobs: dict[str, tuple[Any, ...]] = {
        "ours 1": ("ours", 1),
        "ours many": ("ours", MANY_KEYS),
    }
    if peer:
        jobs |= {
            "moving 1": ("peer", "moving", 1, per_caller, False),
            "moving many": ("peer", "moving", MANY_KEYS, per_caller, False),
            "fixed 1": ("peer", "fixed", 1, per_caller, False),
            "sliding 1": ("peer", "sliding", 1, per_caller, False),
            "refused 1": ("peer", "moving", 1, per_caller, True),
        }
    samples: dict[str, list[float]] = {name: [] for name in jobs}
    usages: dict[str, list[Usage]] = {name: [] for name in jobs}
    worker = Worker(url)
    try:
        for index in range(warmup + rounds):
            for name, (kind, *args) in jobs.items():
                if kind == "ours":
                    args = [f"bench-rate-{next(_runs)}", args[0], per_caller]
                elapsed, count, usage = worker.run(kind, *args)
                expected = 0 if name.startswith("refused") else decisions
                if count != expected:
                    raise RuntimeError(f"{name}: {count} decisions allowed, expected {expected}")
                if index >= warmup:
                    samples[name].append(elapsed)
                    usages[name].append(usage)
    finally:
        worker.close()

    def rate(name: str) -> str:
        return f"{decisions / statistics.median(samples[name]):,.0f}/s"

    def cost(name: str) -> str:
        client, server, scripts = (
            statistics.median(u[i] for u in usages[name]) / decisions for i in range(3)
        )
        return (
            f"{rate(name)}, CPU {client * 1e6:.0f} us client + {server * 1e6:.0f} us "
            f"server, {scripts:.2f} scripts per decision"
        )

    label = f"rate decisions, {CALLERS} callers"
    if not peer:
        reason = (
            "limits or redis-py is not installed (the bench extra); ours alone: "
            f"{rate('ours 1')} on 1 key, {rate('ours many')} on {MANY_KEYS:,} keys"
        )
        return [Skipped(SCENARIO, f"{label} vs limits", reason)]
    common: dict[str, Any] = {"unit": "us/decision", "per": decisions, "scale": 1e6}
    ahead = Target(1.0, strict=True, text="< 1x (ahead)")

    def row(ours: str, theirs: str, what: str, keys: int, note: str, **extra: Any) -> Row:
        return Row(
            SCENARIO,
            f"{label}, {keys:,} key{'s' if keys > 1 else ''} vs {what}",
            decisions,
            samples[ours],
            samples[theirs],
            baseline_name=f"limits {STRATEGIES[theirs.split()[0]]} hit(), redis-py, asyncio",
            note=f"ours {cost(ours)}; limits {cost(theirs)}{note}",
            **common,
            **extra,
        )

    refused = f"; limits refusing (1 per hour) {cost('refused 1')}"
    return [
        row("ours 1", "moving 1", "moving window", 1, refused, target=ahead),
        row("ours many", "moving many", "moving window", MANY_KEYS, "", target=ahead),
        row("ours 1", "fixed 1", "fixed window", 1, ""),
        row("ours 1", "sliding 1", "sliding window", 1, ""),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from redis_server import running_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if importlib.util.find_spec("coredis") is None:
        results: list[Result] = [Skipped(SCENARIO, "rate decisions", "coredis is not installed")]
    else:
        try:
            with running_server("tv-bench-rate-") as server:
                results = measure(server.url, Plan(quick=args.quick))
        except LookupError as exc:
            results = [Skipped(SCENARIO, "rate decisions", str(exc))]
    print(f"{'quick' if args.quick else 'full'} run, {time.perf_counter() - started:.1f}s")
    print("ratio = ours / baseline per round (lower is better); ours and baseline are medians\n")
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
