"""A cluster rate pool at the server's clock, ~1.8e12 ms, with intervals near its float step.

The limit scripts run on a real server with the server's ``TIME`` pinned (their source,
every ``redis.call('TIME')`` replaced by a fixed reply), so several acquisitions happen in
one instant and the Lua arithmetic, doubles in milliseconds, is the server's own. A double
near ``1.8e12`` has a step of ``2**-12`` ms (about ``2.4e-4`` ms): a ``tat`` moved on by
an interval below half of it (a rate of ten million per second) did not move at all, and
one of about 1.4 steps moved by one, so a pool allowed every start of an instant, or more
than its burst.
"""

from __future__ import annotations

import itertools
from typing import Any

import coredis
import pytest
import trio
from conftest import RedisServer
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from trio_taskvisor import RateLimit
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._exceptions import ConfigError

A = "host-a:101:0000000a"
_names = itertools.count()


def pinned(script: scripts.Script, seconds: int, micros: int) -> str:
    """The script's source with the server's ``TIME`` pinned, and every expiry it sets at
    least an hour: the server expires keys on its real clock, which runs on while the
    pinned one stands (a rate pool's key set to expire when its ``tat`` passes, a few ms
    away, would go between two calls of one instant)."""
    assert "redis.call('TIME')" in script.source
    call = f"""local function call(command, ...)
  if command == 'TIME' then return {{'{seconds}', '{micros}'}} end
  if command == 'PEXPIRE' then
    local key, ms = ...
    return redis.call(command, key, math.max(tonumber(ms), 3600000))
  end
  return redis.call(command, ...)
end
"""
    return call + script.source.replace("redis.call(", "call(")


class Pinned:
    """The limit scripts of a fresh namespace, called at a pinned server time."""

    def __init__(self, client: coredis.Redis[str], prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.common = scripts.common_args(prefix, 60.0, 120.0)

    async def call(self, script: scripts.Script, at: tuple[int, int], *args: str) -> Any:
        return await self.client.eval(pinned(script, *at), [], [*self.common, *args])


def ms_of(at: tuple[int, int]) -> float:
    """The scripts' ``now_ms`` (Lua's doubles are Python's floats)."""
    return float(at[0]) * 1000 + float(at[1]) / 1000


@pytest.fixture(scope="module")
def server_url(redis_server_session: RedisServer) -> str:
    server = redis_server_session
    if not server.running:
        server.start()
    if server.paused:
        server.resume()
    return server.url


# intervals (ms) around the float step of the server's clock (2**-12 ms), and any
_INTERVAL_MS = st.one_of(
    st.floats(min_value=1e-7, max_value=4e-3),
    st.integers(1, 32).map(lambda k: k * 2.0**-12 / 4 * 1.0000001),
    st.floats(min_value=1e-7, max_value=1e3),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    interval_ms=_INTERVAL_MS,
    rate=st.integers(1, 10**9),
    burst=st.integers(1, 12),
    seconds=st.integers(1_600_000_000, 2_100_000_000),
    micros=st.integers(0, 999_999),
    later=st.integers(0, 5),
)
@example(interval_ms=1e-4, rate=10_000_000, burst=3, seconds=1_800_000_000, micros=0, later=1)
@example(  # ~1.4 float steps: each tat += interval rounded to one step
    interval_ms=2.0**-12 * 1.4, rate=1, burst=12, seconds=1_800_000_000, micros=1, later=0
)
def test_a_cluster_rate_pool_starts_at_most_its_burst_in_one_instant(
    server_url: str,
    interval_ms: float,
    rate: int,
    burst: int,
    seconds: int,
    micros: int,
    later: int,
) -> None:
    """At one instant of the server's clock a rate pool grants exactly ``burst`` starts
    after an idle stretch, and at most ``burst`` at any later instant, whatever its
    interval; ``cluster_limit`` and the ``slots`` reading (``next_start_ms``) say a
    start waits exactly when an acquisition at that instant waits."""
    try:
        limit = RateLimit("r", rate, per=interval_ms * rate / 1000, burst=burst)
    except ConfigError:
        assume(False)
        raise
    spec = scripts.spec_text("rate", 0, limit.rate, limit.per, limit.burst)
    pairs = f'[["r","{spec}"]]'
    prefix = f"tv:{{precision-{next(_names)}}}:"
    numbers = itertools.count(1)

    async def readings(s: Pinned, at: tuple[int, int]) -> tuple[float, float]:
        """``cluster_limit``'s ms until a start and the ``slots`` reading's (0.0 for a
        pool that ``cluster_limit`` does not know: none yet, or one nobody uses, its last
        start passed)."""
        info = await s.call(scripts.CLUSTER_LIMIT, at, "r")
        fields = await s.client.hgetall(f"{prefix}lp:r")
        reading = fields and scripts.next_start_ms(
            fields["spec"], fields.get("tat"), ms_of(at), fields.get("start"), fields.get("n")
        )
        assert reading is not None
        return (0.0 if info[0] is None else float(info[3])), float(reading or 0.0)

    async def instant(s: Pinned, at: tuple[int, int], most: int) -> int:
        before = await readings(s, at)
        granted, waiting = 0, []
        for _ in range(burst + 1):
            w = f"{A}/{next(numbers)}"
            reply = await s.call(scripts.LIMIT_ACQUIRE, at, A, w, pairs)
            if reply[0] == "granted":
                assert not waiting, "granted after a refusal in the same instant"
                granted += 1
            else:
                assert reply[0] == "waiting", reply
                waiting.append(w)
        assert granted <= most, f"{granted} starts in one instant, the burst is {burst}"
        # what the pool says: a start now exactly when an acquisition at this instant
        # is granted
        assert (before[0] == 0, before[1] == 0.0) == (granted > 0, granted > 0), before
        after = await readings(s, at)
        assert after[0] > 0, after
        assert after[1] > 0.0, after
        for w in waiting:
            await s.call(scripts.LIMIT_WITHDRAW, at, w, '["r"]')
        return granted

    async def main() -> None:
        async with coredis.Redis.from_url(server_url, decode_responses=True) as client:
            s = Pinned(client, prefix)
            try:
                assert await instant(s, (seconds, micros), burst) == burst  # an idle pool's burst
                step = (seconds, micros + later) if micros + later < 10**6 else (seconds + 1, 0)
                assert await instant(s, step, burst) <= burst
                assert await instant(s, step, 0) == 0  # nothing more at the same instant
            finally:
                keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
                if keys:
                    await client.delete(keys)

    trio.run(main)


async def test_a_tat_an_earlier_version_wrote_over_the_state_counts(
    client: coredis.Redis[str],
) -> None:
    """A rolling upgrade: an earlier version reads and writes ``tat`` alone. A ``tat`` it
    moved on (past the ``start`` and ``n`` beside it) is the pool's state, and a pool
    whose ``tat`` it deleted (new settings) is as new; the ``slots`` reading agrees."""
    prefix = "tv:{precision-upgrade}:"
    s = Pinned(client, prefix)
    spec = scripts.spec_text("rate", 0, 10, 1.0, 10)  # an interval of 100 ms, a burst of 10
    pairs = f'[["r","{spec}"]]'
    key = f"{prefix}lp:r"
    t0 = (1_800_000_000, 0)
    try:
        for n in (1, 2):
            assert (await s.call(scripts.LIMIT_ACQUIRE, t0, A, f"{A}/{n}", pairs))[0] == "granted"
        fields = await client.hgetall(key)
        assert (float(fields["start"]), fields["n"]) == (ms_of(t0), "2")
        assert float(fields["tat"]) == ms_of(t0) + 200
        # an earlier version granted 8 more: tat 1 s ahead of t0, start and n as they were
        await client.hset(key, {"tat": repr(ms_of(t0) + 1000)})
        at = (1_800_000_000, 50_000)  # t0 + 50 ms: from start and n, room
        fields = await client.hgetall(key)
        reading = scripts.next_start_ms(
            spec, fields["tat"], ms_of(at), fields["start"], fields["n"]
        )
        assert reading == 50.0  # from the tat: at t0 + 100 ms
        reply = await s.call(scripts.LIMIT_ACQUIRE, at, A, f"{A}/3", pairs)
        assert reply[:3] == ["waiting", reply[1], 50]
        await s.call(scripts.LIMIT_WITHDRAW, at, f"{A}/3", '["r"]')
        # the earlier version took new settings: it deleted the tat alone
        await client.hdel(key, ["tat"])
        reply = await s.call(scripts.LIMIT_ACQUIRE, at, A, f"{A}/4", pairs)
        assert reply[0] == "granted"
        fields = await client.hgetall(key)
        assert (float(fields["start"]), fields["n"]) == (ms_of(at), "1")
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(keys)
