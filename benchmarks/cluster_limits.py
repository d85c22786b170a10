"""Server time of a limit pool's release with 10,000 waiters in the namespace.

It starts its own server, as the cluster tests do (``tests/cluster/redis_server.py``),
and calls the limit scripts directly (no keeper, no supervisor). Pool ``A`` has
capacity 1 and one holder; 10,000 requests wait. A sample is one ``limit_release`` of
``A``'s holder, timed by the server itself (``INFO commandstats``, reset before each: the
script's own run, no round trip). After a release that granted nobody, a new request
takes ``A`` again (not timed). The rows:

a  every waiter needs only ``A``: the freed pool's first waiter fits.
b  every waiter also needs ``B``, which is full: nobody fits.
c  a mix: 5,000 waiters blocked elsewhere (``A+B``, ``A+T<j>`` for 50 full tenant pools,
   ``A+C`` with ``C`` full), then 5,000 that need only ``A``: the oldest of those fits.
d  every waiter needs ``A`` and its own full tenant pool (10,000 distinct pool sets):
   the worst case of an index by pool set alone. Each set is parked on a pool that
   blocks it (all but the first on its tenant's; the first moves there at the first
   release), so a release of ``A`` reads at most one of them.

The target is <= 1 ms per release. Run it alone: ``python benchmarks/cluster_limits.py
[--quick]``. It never asserts a speed; it raises only when a reply is wrong.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent / "tests" / "cluster"))  # redis_server, shared with the tests

from redis_server import running_server  # noqa: E402

WAITERS = 10_000
LEASE_TTL = 600.0  # nothing expires during a run
CAP1 = "concurrency 1"
BIG = "concurrency 1000000"


def _mix() -> Iterator[list[str]]:
    blocked = [["A", "B"], *(["A", f"T {j}"] for j in range(50)), ["A", "C"]]
    for k in range(WAITERS // 2):
        yield blocked[k % len(blocked)]
    for _ in range(WAITERS - WAITERS // 2):
        yield ["A"]


CASES: dict[str, tuple[str, Any]] = {
    "a": ("first waiter fits", lambda: (["A"] for _ in range(WAITERS))),
    "b": ("all also need a full pool", lambda: (["A", "B"] for _ in range(WAITERS))),
    "c": ("a mix (5,000 blocked, 52 pool sets)", _mix),
    "d": (
        "10,000 distinct pool sets, all blocked",
        lambda: (["A", f"T {k}"] for k in range(WAITERS)),
    ),
}


async def measure_case(url: str, case: str, releases: int) -> list[float]:
    """Server time (us) of ``releases`` releases of ``A`` in one case."""
    import coredis

    from trio_taskvisor import _redis_scripts as scripts

    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        await client.flushall()
        common = scripts.common_args(f"tv:{{bench-{case}}}:", LEASE_TTL, 2 * LEASE_TTL)

        async def call(script: scripts.Script, *args: str) -> Any:
            return await client.evalsha(script.sha, [], [*common, *args])

        for script in scripts.SCRIPTS:
            await client.script_load(script.source)

        def spec(pid: str) -> str:
            return CAP1 if pid in ("A", "B", "C") or pid.startswith("T ") else BIG

        async def acquire(w: str, pids: Sequence[str]) -> scripts.LimitReply:
            pairs = [(pid, spec(pid)) for pid in pids]
            return scripts.parse_limit(
                await call(scripts.LIMIT_ACQUIRE, *scripts.limit_acquire_args("i1", w, pairs))
            )

        # the holders: A's, and one of every other pool so that it is full
        assert (await acquire("i1/hA0", ["A"])).kind == "granted"
        others = {pid for pids in CASES[case][1]() for pid in pids} - {"A"}
        for pid in sorted(others):
            assert (await acquire(f"i1/h{pid}", [pid])).kind == "granted"
        replies: list[object] = []
        waiting = list(CASES[case][1]())
        for start in range(0, len(waiting), 500):
            async with client.pipeline(transaction=False) as pipe:
                for k in range(start, min(start + 500, len(waiting))):
                    pairs = [(pid, spec(pid)) for pid in waiting[k]]
                    args = scripts.limit_acquire_args("i1", f"i1/w{k}", pairs)
                    pipe.evalsha(scripts.LIMIT_ACQUIRE.sha, [], [*common, *args])
            replies.extend(pipe.results or ())
        assert all(scripts.parse_limit(r).kind == "waiting" for r in replies)

        samples: list[float] = []
        holder = "i1/hA0"
        for n in range(releases):
            await client.config_resetstat()
            await call(scripts.LIMIT_RELEASE, *scripts.limit_release_args(holder, ["A"]))
            stats = await client.info("commandstats")
            samples.append(float(stats["cmdstat_evalsha"]["usec"]))  # type: ignore[index]
            holders = await client.hkeys(f"tv:{{bench-{case}}}:lh:A")
            if holders:  # a waiter was granted: it is A's holder now
                (holder,) = holders
            else:
                holder = f"i1/hA{n + 1}"
                assert (await acquire(holder, ["A"])).kind == "granted"
        return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer releases")
    parser.add_argument("--only", action="append", choices=sorted(CASES), help="run one case")
    args = parser.parse_args(argv)
    releases = 20 if args.quick else 200
    with running_server(prefix="tv-bench-limits-") as server:
        header = f"{'case':<48} {'n':>5} {'p50 us':>8} {'p99 us':>8} {'max us':>8}"
        print(f"{WAITERS} waiters; server time per release (INFO commandstats); target <= 1000 us")
        print(header)
        print("-" * len(header))
        for case in args.only or sorted(CASES):
            samples = sorted(trio.run(measure_case, server.url, case, releases))
            p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
            label = f"{case}  {CASES[case][0]}"
            print(
                f"{label:<48} {len(samples):>5} {statistics.median(samples):>8.0f} "
                f"{p99:>8.0f} {samples[-1]:>8.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
