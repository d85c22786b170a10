"""Random operation sequences against the limit scripts and a Python model of them.

``LimitModel`` is the server side of cluster limits in executable form: one method per
script (``limit_acquire``, ``limit_release``, ``limit_withdraw``, ``limit_renew``,
``cluster_limit``), plain data, its clock an input. The state machine sends the same
random operations to the model and to the real scripts (through the helper thread of
``test_cluster_model``), with three instances: new acquisitions over two concurrency
pools, a keyed one and a rate pool, in mixed sets (one set also in another order; some
with conflicting settings), acquisitions sent again (a replay, or a waiter's poll; one
granted in a generation that expired since is asked for anew), releases, withdrawals (of
waiting, granted and unsent requests), renewals, rebases (a renewal after a change of
server, naming units the instance holds, and released ones that stand for units the new
server lacks), killing an instance (its units' lease deleted, as its expiry would), the
server dropping a pool's holders or one holder (an eviction, a clean-up script: the
renewals name the units their instance holds, and one dropped is lost), the clock
moving on, and queries. After every step it compares the reply, the live state on
the server (holders, waiters in order, settings of pools in use, every key with an
expiry) and the grant messages each instance received, and checks:

* a concurrency pool never has more live holders than its capacity, and a rate pool
  never more than its burst of starts ahead of the clock. The model's clock moves only
  by ``advance``, in half intervals of the rate pool (half an hour each), and the step
  moves the pool's ``tat`` and ``start`` on the server back as much, which is the same
  to GCRA; the real clock's seconds during an example never decide a comparison;
* all at once: a request holds a unit of every concurrency pool it asked for, or none;
* oldest that fits, as the scripts have seen the room: a group (the waiters of one pool
  set) is parked on one of its pools, and a parked-on pool has room only if the clock
  (``advance``) or a dead holder (``kill``) made it since a script last settled that
  pool (the model's ``unseen``); so after a step no live waiter of a pool the step
  changed fits, unless its group is parked on such a pool.

Generations (the server's ``TIME`` when an instance's units' lease is made) are bound
to the model's symbolic ones on first sight, per instance; a new one never repeats.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from conftest import RedisServer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from test_cluster_model import INSTANCES, Server

from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore

CAP1, CAP2, KEYED, RATE = "c1", "c2", "k tenant-a", "r"
SPECS = {
    CAP1: "concurrency 1",
    CAP2: "concurrency 2",
    KEYED: "concurrency 1",
    RATE: "rate 1 per 3600.0 burst 2",
}
OTHER_SPEC = "concurrency 3"  # a conflict with CAP1's settings
HALF = 1_800_000.0  # half of RATE's interval (ms): the step of the model's clock
# mixed pool sets, one set in two orders (one group on the server)
POOL_SETS = [
    (CAP1,),
    (CAP2,),
    (CAP1, CAP2),
    (CAP2, CAP1),
    (CAP2, KEYED),
    (CAP1, CAP2, KEYED),
    (RATE,),
    (CAP2, RATE),
    (RATE, CAP1),
    (KEYED,),
]


@attrs.define
class Waiter:
    pools: tuple[str, ...]
    gen: int
    seq: int


@attrs.define
class Pool:
    spec: str
    # A rate pool's GCRA ``tat``, in half intervals after the model's "now" (None: -inf).
    # The model's clock stands still but for ``advance``: the real one moves by seconds
    # during an example, far less than half an interval, so a comparison the model makes
    # with whole half intervals has the same answer on the server.
    tat: int | None = None

    @property
    def capacity(self) -> int | None:
        kind, _, value = self.spec.partition(" ")
        return int(value) if kind == "concurrency" else None

    @property
    def burst(self) -> int:
        return int(self.spec.rsplit(" ", 1)[1])


class LimitModel:
    """The limit scripts as their docstrings state them; generations are ints."""

    def __init__(self) -> None:
        self.gen: dict[str, int] = {}  # instance -> live generation
        self.gens = itertools.count(1)
        self.pools: dict[str, Pool] = {}
        self.holders: dict[str, dict[str, int]] = {}  # pool -> request -> generation
        self.waiters: dict[str, Waiter] = {}
        self.marker: dict[str, int | str] = {}  # lx: the grant's generation, or "gone"
        self.seq = 0
        self.sent: list[tuple[str, list[Any]]] = []
        # group (its pool ids, sorted) -> the pool it is parked on (every waiting group)
        self.park: dict[tuple[str, ...], str] = {}
        # pools whose room the clock or an expiry may have made since their last settle
        self.unseen: set[str] = set()

    # -- reading ----------------------------------------------------------------------------

    @staticmethod
    def instance(w: str) -> str:
        return w.rsplit("/", 1)[0]

    def live_gen(self, w: str, gen: int) -> bool:
        return self.gen.get(self.instance(w)) == gen

    def held(self, pid: str) -> int:
        return sum(1 for w, g in self.holders.get(pid, {}).items() if self.live_gen(w, g))

    def has_room(self, pid: str) -> bool:
        pool = self.pools[pid]
        if pool.capacity is None:
            return pool.tat is None or pool.tat - 2 * (pool.burst - 1) <= 0
        return self.held(pid) < pool.capacity

    def line(self, pid: str) -> list[str]:
        """The requests waiting in a pool, dead ones included, in acceptance order."""
        waiting = [w for w, waiter in self.waiters.items() if pid in waiter.pools]
        return sorted(waiting, key=lambda w: self.waiters[w].seq)

    def live_line(self, pid: str) -> list[str]:
        return [w for w in self.line(pid) if self.live_gen(w, self.waiters[w].gen)]

    @staticmethod
    def group(pools: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(pools))

    def members(self, gid: tuple[str, ...]) -> list[str]:
        """A group's waiters, dead ones included, in acceptance order."""
        waiting = [w for w, waiter in self.waiters.items() if self.group(waiter.pools) == gid]
        return sorted(waiting, key=lambda w: self.waiters[w].seq)

    def head_seq(self, gid: tuple[str, ...]) -> int:
        return self.waiters[self.members(gid)[0]].seq

    def parked(self, pid: str) -> list[tuple[str, ...]]:
        """The groups parked on a pool, in their heads' order."""
        return sorted((g for g, p in self.park.items() if p == pid), key=self.head_seq)

    def blocker(self, gid: tuple[str, ...]) -> str | None:
        return next((pid for pid in gid if not self.has_room(pid)), None)

    def in_use(self, pid: str) -> bool:
        pool = self.pools.get(pid)
        if pool is None:
            return False
        ahead = pool.tat is not None and pool.tat > 0
        return self.held(pid) > 0 or ahead or bool(self.live_line(pid))

    # -- the scripts' parts -----------------------------------------------------------------

    def my_gen(self, me: str) -> int:
        if me not in self.gen:
            self.gen[me] = next(self.gens)
        return self.gen[me]

    def take(self, pid: str, w: str, g: int) -> None:
        pool = self.pools[pid]
        if pool.capacity is None:
            pool.tat = max(0 if pool.tat is None else pool.tat, 0) + 2
        else:
            self.holders.setdefault(pid, {})[w] = g

    def grant(self, w: str, pids: tuple[str, ...], g: int) -> int:
        for pid in pids:
            self.take(pid, w, g)
        self.marker[w] = g
        return g

    def add_waiter(self, w: str, waiter: Waiter) -> None:
        """At the tail of its group; the group is (re)parked on the pool without room
        with the fewest groups parked (the first of those, sorted)."""
        self.waiters[w] = waiter
        gid = self.group(waiter.pools)
        self.park.pop(gid, None)
        blocked = [pid for pid in gid if not self.has_room(pid)]
        counts = {pid: len(self.parked(pid)) for pid in blocked}
        self.park[gid] = min(blocked, key=lambda pid: counts[pid]) if blocked else gid[0]

    def drop_waiter(self, w: str) -> None:
        waiter = self.waiters.pop(w, None)
        if waiter is not None:
            gid = self.group(waiter.pools)
            if not self.members(gid):
                del self.park[gid]

    def oldest_fitting(self, pid: str, before: int | None) -> tuple[tuple[str, ...], int] | None:
        """The oldest group parked on ``pid`` (which has room) with its head older than
        ``before`` whose every pool has room; a group read and blocked by another pool
        is parked on that pool (the first without room, sorted)."""
        for gid in self.parked(pid):
            seq = self.head_seq(gid)
            if before is not None and seq >= before:
                return None
            blocker = self.blocker(gid)
            if blocker is None:
                return gid, seq
            self.park[gid] = blocker
        return None

    def settle(self, changed: tuple[str, ...]) -> None:
        while True:
            best: tuple[str, ...] | None = None
            best_seq: int | None = None
            for pid in changed:
                if pid in self.pools and self.has_room(pid):
                    found = self.oldest_fitting(pid, best_seq)
                    if found is not None:
                        best, best_seq = found
            if best is None:
                break
            w = self.members(best)[0]
            waiter = self.waiters[w]
            self.drop_waiter(w)  # a dead instance's waiter is skipped for good
            if self.live_gen(w, waiter.gen):
                self.grant(w, waiter.pools, waiter.gen)
                self.sent.append((self.instance(w), ["limit", w, waiter.gen]))
        self.unseen.difference_update(changed)
        self.check_parking()
        # oldest that fits, at rest: a live waiter of a changed pool that fits is parked
        # on a pool whose room no script has seen yet
        for pid in changed:
            for w in self.live_line(pid):
                pools = self.waiters[w].pools
                if all(self.has_room(p) for p in pools):
                    assert self.park[self.group(pools)] in self.unseen, w

    def check_parking(self) -> None:
        """Every waiting group is parked on one of its pools, which has no room unless
        the clock or an expiry made it since that pool's last settle."""
        groups = {self.group(waiter.pools) for waiter in self.waiters.values()}
        assert set(self.park) == groups, (self.park, groups)
        for gid, pid in self.park.items():
            assert pid in gid, (gid, pid)
            assert pid in self.unseen or not self.has_room(pid), (gid, pid)

    def acquire(self, me: str, w: str, pairs: list[tuple[str, str]]) -> list[Any]:
        marker = self.marker.get(w)
        if marker == "gone":
            return ["gone"]
        g = self.my_gen(me)
        if marker == g:
            return ["granted", g]
        self.marker.pop(w, None)  # granted in a generation that expired: asked for anew
        pids = tuple(pid for pid, _ in pairs)
        existing = self.waiters.get(w)
        waiting = existing is not None and existing.gen == g
        if existing is not None and not waiting:
            self.drop_waiter(w)  # accepted in an expired generation: back at the tail
        if not waiting:
            for pid, spec in pairs:
                pool = self.pools.get(pid)
                if pool is not None and pool.spec != spec and self.in_use(pid):
                    return ["conflict", pid, pool.spec]
            for pid, spec in pairs:
                pool = self.pools.get(pid)
                if pool is None or pool.spec != spec:
                    self.pools[pid] = Pool(spec)
        self.settle(pids)
        if waiting and w not in self.waiters:
            return ["granted", g]
        blocked = [pid for pid in pids if not self.has_room(pid)]
        if not blocked:
            self.drop_waiter(w)
            return ["granted", self.grant(w, pids, g)]
        if not waiting:
            self.seq += 1
            self.add_waiter(w, Waiter(pids, g, self.seq))
        rate_blocked = any(self.pools[pid].capacity is None for pid in blocked)
        return ["waiting", g, rate_blocked, blocked]

    def release(self, w: str, pids: tuple[str, ...]) -> None:
        for pid in pids:
            self.holders.get(pid, {}).pop(w, None)
        self.settle(pids)

    # -- the scripts ------------------------------------------------------------------------

    def limit_acquire(self, me: str, w: str, pairs: list[tuple[str, str]]) -> list[Any]:
        self.sent = []
        return self.acquire(me, w, pairs)

    def limit_release(self, w: str, pids: tuple[str, ...]) -> str:
        self.sent = []
        self.release(w, pids)
        return "ok"

    def limit_withdraw(self, w: str, pids: tuple[str, ...]) -> str:
        self.sent = []
        marker = self.marker.get(w)
        self.marker[w] = "gone"
        if marker is not None and marker != "gone":
            self.release(w, pids)
        self.drop_waiter(w)
        return "ok"

    def limit_renew(
        self,
        me: str,
        waiters: list[tuple[str, list[tuple[str, str]]]],
        held: list[tuple[str, list[str]]],
        rebase: list[tuple[str, tuple[str, ...]]] | None = None,
    ) -> list[Any]:
        self.sent = []
        units = rebase or []
        old = self.gen.get(me) if rebase is not None else None  # the live one moves
        moving = old is not None
        if moving:  # a new generation: the old one's units not named die with it
            named = {w for w, _ in units} | {w for w, _ in waiters if self.marker.get(w) == old}
            for pid, holders in self.holders.items():
                if any(self.live_gen(w, gen) and w not in named for w, gen in holders.items()):
                    self.unseen.add(pid)
            del self.gen[me]
        g = self.my_gen(me)
        lost: list[tuple[str, tuple[str, ...]]] = []
        for w, pids in units:
            kept = True
            for pid in pids:
                holders = self.holders.get(pid, {})
                if moving and holders.get(w) == old:
                    holders[w] = g
                elif holders.get(w) != g:
                    kept = False
            if kept:
                self.marker[w] = g
            else:
                lost.append((w, pids))
        if rebase is None:  # every unit named is held in g, or lost (in the order named)
            missing = [w for pid, ws in held for w in ws if self.holders.get(pid, {}).get(w) != g]
            for w in dict.fromkeys(missing):
                lost.append((w, tuple(pid for pid, ws in held if w in ws)))
        if moving:
            for w, pairs in waiters:
                waiter = self.waiters.get(w)
                if self.marker.get(w) == old:  # granted, its process not told yet
                    for pid, _ in pairs:
                        holders = self.holders.get(pid, {})
                        if holders.get(w) == old:
                            holders[w] = g
                    self.marker[w] = g
                elif waiter is not None and waiter.gen == old:
                    waiter.gen = g
        for w, pids in lost:  # once every unit and waiter moved
            self.release(w, pids)
        items = [self.acquire(me, w, pairs) for w, pairs in waiters]
        return [g, items, [w for w, _ in lost]]

    def cluster_limit(self, pid: str) -> list[Any]:
        if not self.in_use(pid):
            return [None, {}, 0, None]
        pool = self.pools[pid]
        holders: dict[str, int] = {}
        for w, g in self.holders.get(pid, {}).items():
            if self.live_gen(w, g):
                holders[self.instance(w)] = holders.get(self.instance(w), 0) + 1
        return [pool.spec, holders, len(self.live_line(pid)), pool.capacity is None]

    def kill(self, instance: str) -> None:
        """The instance's units' lease expires: its units are free, though no script
        has seen it yet."""
        for pid, holders in self.holders.items():
            if any(
                self.live_gen(w, g) and self.instance(w) == instance for w, g in holders.items()
            ):
                self.unseen.add(pid)
        self.gen.pop(instance, None)
        self.sent = []

    def evict(self, pid: str, w: str | None) -> None:
        """The server drops a pool's holders key (``w`` None: evicted, deleted by a
        clean-up script) or one holder's entry: its room is there, though no script
        has seen it yet."""
        holders = self.holders.get(pid, {})
        dropped = list(holders) if w is None else [w]
        if any(self.live_gen(x, holders[x]) for x in dropped if x in holders):
            self.unseen.add(pid)
        for x in dropped:
            holders.pop(x, None)
        self.sent = []

    def advance(self, halves: int) -> None:
        """The clock moves on by ``halves`` half intervals of the rate pool."""
        for pid, pool in self.pools.items():
            if pool.tat is not None:
                pool.tat -= halves
                self.unseen.add(pid)
        self.sent = []


@attrs.define
class Request:
    instance: str
    w: str
    pools: tuple[str, ...]
    specs: tuple[str, ...]
    # unsent, waiting, granted, dropped (granted; the server dropped an entry of its
    # units: lost at its next renewal), released, withdrawn, refused, lost
    status: str = "unsent"

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(zip(self.pools, self.specs, strict=True))

    @property
    def concurrency_pools(self) -> tuple[str, ...]:
        """The pools it holds a unit of once granted (as the keeper names them)."""
        return tuple(pid for pid, spec in self.pairs if spec.startswith("concurrency"))


class LimitMachine(RuleBasedStateMachine):
    """The model and the real limit scripts, side by side; see the module docstring."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.server = server
        self.model = LimitModel()
        self.requests: list[Request] = []
        self.numbers = itertools.count(1)
        self.real_gen: dict[tuple[str, int], str] = {}  # (instance, model gen) -> server's
        self.seen_gens: set[tuple[str, str]] = set()
        server.flushall()

    # -- driving both sides -------------------------------------------------------------------

    def send(self, name: str, args: tuple[str, ...], *model_args: Any) -> Any:
        expected = getattr(self.model, name)(*model_args)
        observed = self.server.call(getattr(scripts, name.upper()), args)
        reply = observed.reply
        if name == "limit_renew":
            parsed = scripts.parse_limit_renew(reply)
            self.bind(model_args[0], expected[0], parsed.gen)
            for want, got in zip(expected[1], parsed.waiters, strict=True):
                self.match_limit(model_args[0], want, got)
            assert len(expected[1]) == len(parsed.waiters)
            assert parsed.lost == frozenset(expected[2]), (expected, parsed)
        elif name == "limit_acquire":
            self.match_limit(model_args[0], expected, scripts.parse_limit(reply))
        elif name == "cluster_limit":
            got = scripts.parse_cluster_limit(reply)
            spec, holders, waiting, rate = expected
            assert (got.holders, got.waiting, got.spec) == (holders, waiting, spec), (expected, got)
            if spec is not None:
                assert (got.next_start is not None) == rate
        else:
            assert reply == expected
        self.compare_state(observed)
        return expected

    def bind(self, instance: str, model_gen: int, real: str) -> None:
        key = (instance, model_gen)
        if key in self.real_gen:
            assert self.real_gen[key] == real, (key, real)
        else:
            assert (instance, real) not in self.seen_gens, "a generation came back"
            self.real_gen[key] = real
            self.seen_gens.add((instance, real))

    def match_limit(self, instance: str, expected: list[Any], got: scripts.LimitReply) -> None:
        assert got.kind == expected[0], (expected, got)
        match expected:
            case ["granted", gen]:
                self.bind(instance, gen, str(got.gen))
            case ["waiting", gen, rate_blocked, blocked]:
                self.bind(instance, gen, str(got.gen))
                assert list(got.blocked) == blocked, (expected, got)
                assert (got.retry is not None) == rate_blocked, (expected, got)
            case ["conflict", pid, known]:
                assert (got.pool, got.known) == (pid, known)
            case ["gone"]:
                pass
            case _:
                raise AssertionError(expected)

    def compare_state(self, observed: Any) -> None:
        keys: dict[str, Any] = observed.keys
        model = self.model
        # nothing the limit scripts write stays for ever
        for key, ttl in observed.pttl.items():
            if key.startswith(("lp:", "lh:", "lq:", "lk:", "lg:", "lw:", "lx:", "lu:", "lseq")):
                assert ttl > 0, (key, ttl)
        real_gens = {
            instance: keys.get(f"lu:{instance}")
            for instance in INSTANCES
            if f"lu:{instance}" in keys
        }
        assert set(real_gens) == set(model.gen)
        for instance, g in model.gen.items():
            self.bind(instance, g, str(real_gens[instance]))
        for pid, pool in model.pools.items():
            lh = keys.get(f"lh:{pid}", {})
            live = {w for w, g in lh.items() if real_gens.get(model.instance(w)) == g}
            want = {w for w, g in model.holders.get(pid, {}).items() if model.live_gen(w, g)}
            assert live == want, (pid, live, want)
            if pool.capacity is not None:
                assert len(live) <= pool.capacity
            else:  # never more than burst starts ahead
                assert pool.tat is None or pool.tat <= 2 * pool.burst
            real_line = self.pool_line(pid) if f"lq:{pid}" in keys else []
            real_live = [
                w
                for w in real_line
                if keys.get(f"lw:{w}", {}).get("gen") == real_gens.get(model.instance(w))
            ]
            assert real_live == model.live_line(pid), (pid, real_live, model.live_line(pid))
            if model.in_use(pid):
                assert keys.get(f"lp:{pid}", {}).get("spec") == pool.spec
        assert self.parking() == model.park, (self.parking(), model.park)
        # all at once: a granted request holds every concurrency pool it asked for (its
        # marker is gone only once a replay found its generation expired: asked anew)
        for request in self.requests:
            if request.status == "granted":
                marker = model.marker.get(request.w)
                assert marker != "gone"
                if marker is None:
                    continue
                for pid in request.pools:
                    if model.pools[pid].capacity is not None and model.live_gen(
                        request.w, int(marker)
                    ):
                        assert request.w in keys.get(f"lh:{pid}", {})
        expected: dict[str, list[list[Any]]] = {i: [] for i in INSTANCES}
        for instance, message in model.sent:
            expected[instance].append(message)
        for instance, messages in observed.messages.items():
            want = expected[instance]
            assert len(messages) == len(want), (instance, messages, want)
            for got, msg in zip(messages, want, strict=True):
                assert got[:2] == msg[:2], (got, msg)
                self.bind(instance, msg[2], got[2])
                request = self.find(msg[1])
                if request.status == "waiting":
                    request.status = "granted"

    def pool_line(self, pid: str) -> list[str]:
        """A pool's waiters on the server, in acceptance order: the merge of its groups'
        lines. Checks the index on the way: each group of the pool includes the pool and
        is scored by its head."""
        prefix = self.server.prefix

        async def read() -> list[tuple[float, str]]:
            client = self.server.client
            line: list[tuple[float, str]] = []
            groups = await client.zrange(f"{prefix}lq:{pid}", 0, -1, withscores=True)
            for gid, score in groups:  # type: ignore[misc]
                assert pid in json.loads(gid), (pid, gid)
                members = await client.zrange(f"{prefix}lg:{gid}", 0, -1, withscores=True)
                assert members, (pid, gid)
                assert members[0][1] == score, (pid, gid, members, score)  # type: ignore[index]
                line.extend((s, w) for w, s in members)  # type: ignore[misc]
            return sorted(line)

        return [w for _, w in self.server._run(read)]

    def parking(self) -> dict[tuple[str, ...], str]:
        """Where the server parks each group; checks that a group is parked once, on one
        of its pools, scored by its head."""
        prefix = self.server.prefix

        async def read() -> dict[tuple[str, ...], str]:
            client = self.server.client
            park: dict[tuple[str, ...], str] = {}
            for pid in sorted(self.model.pools):
                groups = await client.zrange(f"{prefix}lk:{pid}", 0, -1, withscores=True)
                for gid, score in groups:  # type: ignore[misc]
                    key = tuple(json.loads(gid))
                    assert pid in key, (pid, gid)
                    assert key not in park, (gid, park[key], pid)
                    head = await client.zrange(f"{prefix}lg:{gid}", 0, 0, withscores=True)
                    assert head, (pid, gid)
                    assert head[0][1] == score, (pid, gid, head, score)  # type: ignore[index]
                    park[key] = pid
            return park

        return self.server._run(read)

    def find(self, w: str) -> Request:
        return next(r for r in self.requests if r.w == w)

    # -- rules ------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        for instance in INSTANCES:
            self.renew_instance(instance)

    @rule(data=st.data())
    def acquire_new(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(INSTANCES))
        pools = data.draw(st.sampled_from(POOL_SETS))
        specs = tuple(SPECS[pid] for pid in pools)
        if CAP1 in pools and data.draw(st.integers(0, 9)) == 0:
            specs = tuple(OTHER_SPEC if pid == CAP1 else SPECS[pid] for pid in pools)
        request = Request(instance, f"{instance}/{next(self.numbers)}", pools, specs)
        self.requests.append(request)
        if data.draw(st.integers(0, 9)) == 0:
            return  # stays unsent: a withdrawal may overtake it
        self.acquire(request)

    def acquire(self, request: Request) -> None:
        args = scripts.limit_acquire_args(request.instance, request.w, request.pairs)
        reply = self.send("limit_acquire", args, request.instance, request.w, request.pairs)
        self.update(request, reply)

    def update(self, request: Request, reply: list[Any]) -> None:
        match reply[0]:
            case "granted":
                if request.status in ("unsent", "waiting"):
                    request.status = "granted"
            case "waiting":
                request.status = "waiting"
            case "conflict":
                request.status = "refused"
            case "gone":
                pass

    def new(self, instance: str, *pools: str) -> Request:
        """A new request, sent (for the replayed cases below)."""
        specs = tuple(SPECS.get(pid, "concurrency 1") for pid in pools)
        request = Request(instance, f"{instance}/{next(self.numbers)}", pools, specs)
        self.requests.append(request)
        self.acquire(request)
        return request

    def release_request(self, request: Request) -> None:
        request.status = "released"
        args = scripts.limit_release_args(request.w, request.pools)
        self.send("limit_release", args, request.w, request.pools)

    @rule(data=st.data())
    def acquire_again(self, data: st.DataObject) -> None:
        sent = [r for r in self.requests if r.status != "unsent"]
        if sent:
            self.acquire(data.draw(st.sampled_from(sent)))

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        held = [r for r in self.requests if r.status in ("granted", "dropped", "released")]
        if held:
            request = data.draw(st.sampled_from(held))
            args = scripts.limit_release_args(request.w, request.pools)
            request.status = "released"
            self.send("limit_release", args, request.w, request.pools)

    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        statuses = ("unsent", "waiting", "granted", "dropped", "lost")
        live = [r for r in self.requests if r.status in statuses]
        if live:
            request = data.draw(st.sampled_from(live))
            args = scripts.limit_release_args(request.w, request.pools)
            request.status = "withdrawn"
            self.send("limit_withdraw", args, request.w, request.pools)

    @rule(instance=st.sampled_from(INSTANCES))
    def renew(self, instance: str) -> None:
        self.renew_instance(instance)

    def renew_instance(
        self,
        instance: str,
        named: list[Request] | None = None,
        unheard: list[Request] = [],  # noqa: B006 (never changed)
    ) -> None:
        """A renewal naming the units the instance holds (its granted requests); with
        ``named``, a rebase naming those requests' units instead; ``unheard``: granted
        requests named as waiters (their process has not heard of the grant)."""
        waiting = [r for r in self.requests if r.instance == instance and r.status == "waiting"]
        waiting += unheard
        pairs = [(r.w, r.pairs) for r in waiting]
        if named is None:
            mine = [r for r in self.requests if r.instance == instance]
            units = [r for r in mine if r.status in ("granted", "dropped")]
        else:
            units = named
        per_unit = [(r.w, r.concurrency_pools) for r in units]
        held: dict[str, list[str]] = {}
        for w, pids in per_unit:
            for pid in pids:
                held.setdefault(pid, []).append(w)
        rebase = None if named is None else per_unit
        args = scripts.limit_renew_args(instance, pairs, held.items(), rebase)
        reply = self.send("limit_renew", args, instance, pairs, list(held.items()), rebase)
        for request, item in zip(waiting, reply[1], strict=True):
            self.update(request, item)
        for request in units:
            if request.w in reply[2]:
                request.status = "lost"

    @rule(instance=st.sampled_from(INSTANCES), data=st.data())
    def rebase(self, instance: str, data: st.DataObject) -> None:
        """A rebase after a change of server: the units the instance holds (as it
        believes: a released one named too stands for one the new server lacks), and as
        waiters some granted ones whose grant it has not heard of. Sent again (its reply
        lost), it names units already moved."""
        mine = [r for r in self.requests if r.instance == instance]
        granted = [r for r in mine if r.status == "granted"]
        unheard = data.draw(st.lists(st.sampled_from(granted), unique_by=id)) if granted else []
        named_ = ("granted", "dropped", "released")
        candidates = [r for r in mine if r.status in named_ and r not in unheard]
        named = data.draw(st.lists(st.sampled_from(candidates), unique_by=id)) if candidates else []
        self.renew_instance(instance, named, unheard)

    @rule(instance=st.sampled_from(INSTANCES))
    def kill(self, instance: str) -> None:
        self.model.kill(instance)
        server = self.server

        async def step() -> Any:
            await server.client.delete([f"{server.prefix}lu:{instance}"])
            return await server._observe(None)

        self.compare_state(server._run(step))

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """The server drops a concurrency pool's holders key (eviction, a clean-up
        script), or one live holder's entry: the units' requests are lost at their
        instance's next renewal."""
        model = self.model
        live = {
            pid: sorted(w for w, g in holders.items() if model.live_gen(w, g))
            for pid, holders in model.holders.items()
        }
        pids = sorted(pid for pid, ws in live.items() if ws)
        if not pids:
            return
        pid = data.draw(st.sampled_from(pids))
        self.drop(pid, data.draw(st.none() | st.sampled_from(live[pid])))

    def drop(self, pid: str, entry: str | None) -> None:
        """The server drops the holders of ``pid`` (``entry`` None) or one holder's entry."""
        dropped = set(self.model.holders.get(pid, {})) if entry is None else {entry}
        self.model.evict(pid, entry)
        for request in self.requests:
            if request.status == "granted" and request.w in dropped:
                request.status = "dropped"
        server = self.server

        async def step() -> Any:
            key = f"{server.prefix}lh:{pid}"
            if entry is None:
                await server.client.delete([key])
            else:
                await server.client.hdel(key, [entry])
            return await server._observe(None)

        self.compare_state(server._run(step))

    @rule(halves=st.integers(1, 3))
    def advance(self, halves: int) -> None:
        """Move the rate pool's clock on: its ``tat`` and ``start`` on the server move back
        as much."""
        self.model.advance(halves)
        server = self.server

        async def step() -> Any:
            key = f"{server.prefix}lp:{RATE}"
            tat, start = await server.client.hmget(key, ["tat", "start"])
            if tat is not None:
                moved = {"tat": repr(float(tat) - halves * HALF)}
                if start is not None:  # (else an earlier version's tat alone)
                    moved["start"] = repr(float(start) - halves * HALF)
                await server.client.hset(key, moved)
            return await server._observe(None)

        self.compare_state(server._run(step))

    @rule(pid=st.sampled_from(sorted(SPECS)))
    def cluster_limit(self, pid: str) -> None:
        self.model.sent = []
        self.send("cluster_limit", (pid,), pid)


# -- the tests --------------------------------------------------------------------------------


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[Server]:
    store = RedisSlotStore(redis_server.url, namespace="limits-model", lease_ttl=60.0)
    with Server(redis_server.url, store) as running:
        yield running


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_limit_scripts_follow_the_model(server: Server) -> None:
    """Random operation sequences: the limit scripts do what the model says, step by step."""
    run_state_machine_as_test(lambda: LimitMachine(server), settings=SETTINGS)


@pytest.mark.slow
def test_limit_scripts_follow_the_model_long(server: Server) -> None:
    """The same, with many more and longer sequences."""
    run_state_machine_as_test(
        lambda: LimitMachine(server),
        settings=settings(SETTINGS, max_examples=800, stateful_step_count=80),
    )


# -- replayed cases: parking, step by step ---------------------------------------------------

A, B, C = INSTANCES


@pytest.fixture
def machine(server: Server) -> LimitMachine:
    machine = LimitMachine(server)
    machine.start()
    return machine


def parked_on(machine: LimitMachine, request: Request) -> str:
    return machine.model.park[LimitModel.group(request.pools)]


def test_a_group_is_reparked_twice(machine: LimitMachine) -> None:
    """Each release moves the group on to the next pool that blocks it; the last grants."""
    h1 = machine.new(A, CAP1)
    h2, h3 = machine.new(A, CAP2), machine.new(A, CAP2)
    h4 = machine.new(A, KEYED)
    w = machine.new(B, CAP1, CAP2, KEYED)
    assert w.status == "waiting"
    assert parked_on(machine, w) == CAP1  # all blocked, none parked: the first
    machine.release_request(h1)
    assert (w.status, parked_on(machine, w)) == ("waiting", CAP2)
    machine.release_request(h2)
    assert (w.status, parked_on(machine, w)) == ("waiting", KEYED)
    assert h3.status == "granted"
    machine.release_request(h4)
    assert w.status == "granted"
    assert machine.model.park == {}


def test_a_pool_freed_by_a_dead_holder(machine: LimitMachine) -> None:
    """A dead holder's room is seen when a script settles its pool: until then a younger
    waiter may take another pool the parked group needs; the waiter's renewal finds it."""
    machine.new(A, KEYED)
    machine.new(B, CAP2)
    w = machine.new(C, CAP2, KEYED)
    assert (w.status, parked_on(machine, w)) == ("waiting", KEYED)
    machine.kill(A)  # KEYED has room now; nobody has seen it
    younger = machine.new(B, CAP2)
    assert younger.status == "granted"
    assert w.status == "waiting"
    machine.release_request(younger)  # CAP2 settles: w is parked on KEYED, not read
    assert w.status == "waiting"
    machine.renew_instance(C)  # the renewal settles w's pools: KEYED's room is seen
    assert w.status == "granted"


def test_a_rate_pools_clock_moves_under_a_parked_group(machine: LimitMachine) -> None:
    """The clock's room is seen when the waiter asks again (its reply said when)."""
    machine.new(A, RATE)
    machine.new(A, RATE)  # burst 2: RATE is full for one interval
    w = machine.new(B, RATE, CAP1)
    assert (w.status, parked_on(machine, w)) == ("waiting", RATE)
    machine.advance(2)  # one interval on: RATE allows a start
    younger = machine.new(C, CAP1)
    assert younger.status == "granted"
    machine.release_request(younger)  # CAP1 settles: w is parked on RATE, not read
    assert w.status == "waiting"
    machine.acquire(w)  # the retry
    assert w.status == "granted"


def test_distinct_pool_sets_blocked_by_their_tenants(machine: LimitMachine) -> None:
    """Benchmark case d in small: every waiter needs CAP1 and its own full tenant pool. A
    release of CAP1 moves the one group parked on it to its tenant, and the next reads
    none; a tenant's release grants its waiter."""
    tenants = [f"t tenant-{k}" for k in range(4)]
    holder = machine.new(A, CAP1)
    tenant_holders = [machine.new(A, t) for t in tenants]
    waiters = [machine.new(B, CAP1, t) for t in tenants]
    assert [parked_on(machine, w) for w in waiters] == [CAP1, *tenants[1:]]
    machine.release_request(holder)
    assert [parked_on(machine, w) for w in waiters] == tenants
    holder = machine.new(A, CAP1)
    assert holder.status == "granted"  # nobody waits for CAP1 alone, nobody fits
    machine.release_request(holder)
    assert [parked_on(machine, w) for w in waiters] == tenants
    machine.release_request(tenant_holders[2])
    assert [w.status for w in waiters] == ["waiting", "waiting", "granted", "waiting"]


def test_a_unit_whose_holders_the_server_dropped_is_lost_at_its_renewal(
    machine: LimitMachine,
) -> None:
    """The server drops a pool's holders (an eviction): the unit is lost at its
    instance's next renewal, and its unit of another pool is given back at once (a
    waiter for that pool is granted)."""
    unit = machine.new(A, CAP1, CAP2)
    machine.new(C, CAP2)
    w = machine.new(B, CAP2)
    assert (unit.status, w.status) == ("granted", "waiting")
    machine.drop(CAP1, None)
    assert unit.status == "dropped"
    machine.renew_instance(C)  # another instance's renewal: nothing of A's is lost
    assert (unit.status, w.status) == ("dropped", "waiting")
    machine.renew_instance(A)
    assert (unit.status, w.status) == ("lost", "granted")


def test_a_holder_entry_the_server_dropped_loses_that_unit_only(machine: LimitMachine) -> None:
    """One holder's entry dropped (a clean-up script): that unit is lost at its
    instance's next renewal, the instance's other unit of the pool stays held."""
    first, second = machine.new(A, CAP2), machine.new(A, CAP2)
    machine.drop(CAP2, first.w)
    machine.renew_instance(A)
    assert (first.status, second.status) == ("lost", "granted")


def test_two_lost_units_of_one_pool_both_give_their_room(machine: LimitMachine) -> None:
    """A renewal finds two of its units of one pool lost (their holders key evicted, then
    another pool's): the second's room is counted too, and the waiter it fits is
    granted. The script counted a pool's holders once per call: after the first loss
    gave the pool back its room, the second's HDEL left the count as it was, and the
    waiter waited for its own renewal (found by the long run of the model)."""

    def new(instance: str, *pools: str, other: bool = False) -> Request:
        specs = tuple(OTHER_SPEC if other and pid == CAP1 else SPECS[pid] for pid in pools)
        request = Request(instance, f"{instance}/{next(machine.numbers)}", pools, specs)
        machine.requests.append(request)
        machine.acquire(request)
        return request

    new(A, CAP2)
    machine.drop(CAP2, None)  # the first unit's entry goes
    new(A, CAP1, CAP2, other=True)
    new(A, CAP2)
    machine.drop(CAP1, None)  # the second unit's entry in CAP1 goes
    waiter = new(B, CAP1, CAP2, other=True)
    assert waiter.status == "waiting"
    machine.renew_instance(A)  # both lost: CAP2 has room for the waiter
    assert waiter.status == "granted"
