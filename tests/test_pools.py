"""Limit values, GCRA, and the pure pool table against a model (Hypothesis state machine)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trio_taskvisor import ConfigError, TaskDefaults
from trio_taskvisor._limits import (
    ConcurrencyLimit,
    LimitKey,
    RateLimit,
    check_limits,
    gcra_allowed_at,
    gcra_allows,
    gcra_passed,
    gcra_start,
)
from trio_taskvisor._pools import PERMIT, PoolTable

# -- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: ConcurrencyLimit("", 1), ConfigError, "limit name must be non-empty"),
        (lambda: ConcurrencyLimit("a b", 1), ConfigError, "without whitespace"),
        (lambda: ConcurrencyLimit("a{", 1), ConfigError, "'{' or '}'"),
        (lambda: ConcurrencyLimit(b"a", 1), TypeError, "limit name must be a str"),  # type: ignore[arg-type]
        (lambda: ConcurrencyLimit("a", 0), ConfigError, "capacity must be >= 1, got 0"),
        (lambda: ConcurrencyLimit("a", True), TypeError, "capacity must be an int, got True"),
        (lambda: ConcurrencyLimit("a", 1.0), TypeError, "capacity must be an int"),  # type: ignore[arg-type]
        (lambda: RateLimit("a", 0), ConfigError, "rate must be >= 1, got 0"),
        (lambda: RateLimit("a", 1, burst=0), ConfigError, "burst must be >= 1, got 0"),
        (lambda: RateLimit("a", 1, burst=False), TypeError, "burst must be an int"),
        (lambda: RateLimit("a", 1, per=0), ConfigError, "per must be finite and > 0, got 0"),
        (lambda: RateLimit("a", 1, per=math.inf), ConfigError, "per must be finite"),
        (lambda: RateLimit("a", 1, per=math.nan), ConfigError, "per must be finite"),
        (lambda: RateLimit("a", 1, per=True), TypeError, "per must be a number of seconds"),
        # beyond what the rate maths (and the server's numbers) hold: not at the first use
        (lambda: ConcurrencyLimit("a", 2**53 + 1), ConfigError, "capacity must be at most 2**53"),
        (lambda: RateLimit("a", 10**400), ConfigError, "rate must be at most 2**53"),
        (lambda: RateLimit("a", 1, burst=10**5000), ConfigError, "got an int of 16610 bits"),
        (lambda: RateLimit("a", 1, per=1e308, burst=10), ConfigError, "got inf s"),
        (lambda: RateLimit("a", 1, per=1e308), ConfigError, "span of a full burst) must be"),
        (lambda: RateLimit("a", 1, per=1e305, burst=3), ConfigError, "at most 4.5e+304 s"),
        (lambda: RateLimit("a", 1, per=10**400), ConfigError, "per must be finite and > 0"),
        # an interval that underflows to 0.0 would be no limit at all
        (lambda: RateLimit("a", 2, per=5e-324), ConfigError, "per / rate (the interval"),
        (lambda: RateLimit("a", 2**53, per=1e-310), ConfigError, "which is 0.0"),
        (lambda: ConcurrencyLimit("a", 1).key(""), ConfigError, "limit key must be non-empty"),
        (lambda: ConcurrencyLimit("a", 1).key("}"), ConfigError, "limit key must be non-empty"),
        (lambda: ConcurrencyLimit("a", 1).key(7), TypeError, "limit key must be a str"),  # type: ignore[arg-type]
        (lambda: LimitKey("a", "k"), TypeError, "limit must be a ConcurrencyLimit or a RateLimit"),  # type: ignore[arg-type]
    ],
)
def test_bad_limit_values_raise_at_construction(
    build: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        build()  # type: ignore[operator]


def test_limit_values_are_plain_equal_values() -> None:
    assert RateLimit("p", 100, per=60, burst=10) == RateLimit("p", 100, per=60.0, burst=10)
    assert RateLimit("p", 100, per=60).interval == 0.6
    tenant = ConcurrencyLimit("tenant", 2)
    assert tenant.key("acme") == LimitKey(tenant, "acme")
    assert hash(tenant.key("acme")) == hash(LimitKey(tenant, "acme"))


def test_the_largest_limit_values_keep_the_rate_maths_finite() -> None:
    most = RateLimit("p", 2**53, per=1e9, burst=2**53)
    assert most.interval == 1e9 / 2**53
    anchor, count = gcra_start(*gcra_start(-math.inf, 0, 0.0, most.interval), 0.0, most.interval)
    assert (anchor, count) == (0.0, 2)
    assert gcra_allowed_at(anchor, 2**53, most.interval, most.burst) == most.interval
    slow = RateLimit("p", 1, per=1e297, burst=10**7)  # the span: 1e304
    for now in (0.0, 1e9, 1e300):  # a full burst at now, the furthest GCRA goes
        at = gcra_allowed_at(now, slow.burst, slow.interval, slow.burst)
        assert math.isfinite(at)
        assert gcra_allows(now, slow.burst, at, slow.interval, slow.burst)
    assert ConcurrencyLimit("c", 2**53).capacity == 2**53


def test_limits_option_is_a_tuple_naming_each_pool_once() -> None:
    a = ConcurrencyLimit("a", 1)
    assert check_limits((a, a.key("x"), a.key("y"))) == (a, a.key("x"), a.key("y"))
    with pytest.raises(TypeError, match="limits must be a tuple"):
        check_limits([a])
    with pytest.raises(TypeError, match="a limit must be a ConcurrencyLimit"):
        check_limits((a, "b"))
    with pytest.raises(ConfigError, match=r"each pool once, got a\[x\] twice"):
        check_limits((a.key("x"), ConcurrencyLimit("a", 1).key("x")))


def test_limits_option_names_each_limit_with_one_settings() -> None:
    # Caught where the tuple is built (a spec, TaskDefaults), not at every later add.
    a = ConcurrencyLimit("a", 1)
    with pytest.raises(ConfigError, match="limit 'a' twice with other settings"):
        check_limits((a, ConcurrencyLimit("a", 2).key("k")))
    with pytest.raises(ConfigError, match="limit 'a' twice with other settings"):
        check_limits((a.key("x"), RateLimit("a", 1).key("y")))
    with pytest.raises(ConfigError, match="limit 'a' twice with other settings"):
        TaskDefaults(limits=(a, ConcurrencyLimit("a", 2).key("k")))


# -- GCRA -------------------------------------------------------------------------------------


def test_gcra_spaces_starts_by_the_interval_after_a_burst() -> None:
    """rate 100 per 60 s, burst 10: ten at once, then one every 0.6 s."""
    interval, burst = 0.6, 10
    anchor, count, starts = -math.inf, 0, []
    now = 0.0
    while len(starts) < 13:
        now = max(now, gcra_allowed_at(anchor, count, interval, burst))
        starts.append(now)
        anchor, count = gcra_start(anchor, count, now, interval)
    assert starts[:10] == [0.0] * 10
    assert starts[10:] == pytest.approx([0.6, 1.2, 1.8])


def test_gcra_idle_stretch_restores_the_burst() -> None:
    interval, burst = 1.0, 3
    state = (-math.inf, 0)
    for _ in range(3):
        state = gcra_start(*state, 0.0, interval)
    assert state == (0.0, 3)  # tat: 3.0
    assert gcra_allowed_at(*state, interval, burst) == 1.0
    assert not gcra_passed(*state, 2.5, interval)
    # After tat has passed, the pool is as new: three more at once.
    assert gcra_passed(*state, 3.0, interval)
    assert gcra_start(*state, 3.0, interval) == (3.0, 1)  # tat: 4.0


@given(
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=1, max_value=5),
    st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=40),
)
def test_gcra_never_allows_more_than_burst_plus_rate_in_a_window(
    rate: int, burst: int, gaps: list[float]
) -> None:
    """In any window of length w, at most burst + w * rate / per starts are allowed."""
    interval = 1.0 / rate
    anchor, count, now, starts = -math.inf, 0, 0.0, []
    for gap in gaps:
        now = max(now + gap, gcra_allowed_at(anchor, count, interval, burst))
        starts.append(now)
        anchor, count = gcra_start(anchor, count, now, interval)
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            window = starts[j] - first
            assert j - i + 1 <= burst + window * rate + 1e-6


# -- extreme numbers ---------------------------------------------------------------------------

# Every RateLimit the constructor accepts: rates and bursts up to 2**53, periods from the
# smallest float to 1e20 and past it, at times of a fresh MockClock up to far beyond a
# trio clock's (its offset is up to 2e5 s, plus the uptime).
_RATES = st.one_of(st.integers(1, 1000), st.integers(1, 2**53))
_PERS = st.one_of(
    st.floats(1e-3, 1e3),
    st.floats(5e-324, 1e20),  # (a subnormal bound: subnormals drawn too)
    st.sampled_from([1e20, 1e-20, 1.0, 1e300, 5e-324, 1e-310]),
)
_BURSTS = st.one_of(st.integers(1, 8), st.integers(1, 600))
_NOWS = st.one_of(st.floats(0.0, 1e9), st.floats(0.0, 1e16), st.just(2.0**46))


def _rate_limit(rate: int, per: float, burst: int) -> RateLimit:
    try:
        return RateLimit("r", rate, per=per, burst=burst)
    except ConfigError:  # a full burst's span past what the maths hold: refused
        assume(False)
        raise


@settings(max_examples=300, deadline=None)
@given(_RATES, _PERS, _BURSTS, _NOWS)
@example(488954, 1.0, 549, 33554432.0)  # 550 starts in one instant, before
@example(1, 1e-20, 1, 1000.0)  # an interval below the clock's resolution: no limit
@example(256, 1.0, 1, 2.0**45)  # an interval of half the clock's resolution
def test_a_rate_pool_starts_exactly_a_burst_in_one_instant(
    rate: int, per: float, burst: int, now: float
) -> None:
    """Whatever the numbers, a fresh rate pool grants ``burst`` starts in one instant,
    no more. Before, a ``tat`` summed in floats lost what fell below its last digit: a
    start too many, or no limit at all once the interval was below the clock's
    resolution."""
    limit = _rate_limit(rate, per, burst)
    table = PoolTable()
    idents = table.check([limit])
    requests = [table.acquire(idents, now) for _ in range(min(burst, 600) + 2)]
    table.poll(now)
    granted = sum(request.granted for request in requests)
    assert granted == min(burst, len(requests))


@settings(max_examples=300, deadline=None)
@given(_RATES, _PERS, st.integers(1, 4), _NOWS, st.integers(1, 12))
@example(1, 1e20, 1, 0.0, 2)
@example(1, 1e20, 1, 1e5, 2)
@example(1, 1e-20, 1, 1e5, 5)
@example(2**53, 1.0, 3, 1e9, 6)
def test_every_rate_wakeup_grants_and_spaces_starts_by_the_interval(
    rate: int, per: float, burst: int, now: float, waiters: int
) -> None:
    """A waiter woken at ``next_wakeup`` is granted (a wake-up that grants nothing would
    spin the registry's loop), each wake-up is later than the last, and no more starts
    come in any window than GCRA allows, counted in exact arithmetic: ``burst`` plus the
    window over the interval, give or take the clock's last digits."""
    limit = _rate_limit(rate, per, burst)
    table = PoolTable()
    idents = table.check([limit])
    requests = [table.acquire(idents, now) for _ in range(burst + waiters)]
    starts = [now] * sum(request.granted for request in requests)
    while len(starts) < len(requests):
        wakeup = table.next_wakeup(now)
        assert now < wakeup < math.inf
        before = sum(request.granted for request in requests)
        table.poll(wakeup)
        after = sum(request.granted for request in requests)
        assert after > before  # no wake-up in vain
        starts += [wakeup] * (after - before)
        now = wakeup
    assert all(request.granted for request in requests)
    interval = Fraction(limit.interval)  # per / rate as a float: the limit's interval
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            window = Fraction(starts[j]) - Fraction(first)
            # the clock's last digits: one float step at each end, relative 2**-50 at most
            slack = Fraction(math.ulp(starts[j])) * 2 + window / 2**50
            assert (j - i + 1 - burst) * interval <= window + slack


def test_a_period_of_1e20_waits_1e20_seconds() -> None:
    """``per=1e20``: the second start comes 1e20 s after the first, not a float sooner."""
    table = PoolTable()
    idents = table.check([RateLimit("r", 1, per=1e20)])
    assert table.acquire(idents, 0.0).granted
    waiting = table.acquire(idents, 0.0)
    assert not waiting.granted
    assert table.next_wakeup(0.0) == 1e20
    table.poll(math.nextafter(1e20, 0.0))
    assert not waiting.granted
    table.poll(1e20)
    assert waiting.granted


# -- the table --------------------------------------------------------------------------------


def test_all_at_once_and_oldest_that_fits_first() -> None:
    a, b = ConcurrencyLimit("a", 1), ConcurrencyLimit("b", 1)
    table = PoolTable()
    ids_a, ids_b = table.check((a,)), table.check((b,))
    ids_ab = table.check((a, b))
    holder_a = table.acquire(ids_a, 0.0, "holds a")
    assert holder_a.granted
    both = table.acquire(ids_ab, 0.0, "needs a and b")
    assert not both.granted
    # b is free: the waiter for a and b holds nothing of it, so a request for b alone fits.
    only_b = table.acquire(ids_b, 0.0, "needs b")
    assert only_b.granted
    table.release(holder_a, 1.0)
    assert table.granted == []  # a is free, but b is not: nothing is taken piecemeal
    table.release(only_b, 2.0)
    assert [r.payload for r in table.granted] == ["needs a and b"]


def test_the_permit_is_a_pool_every_task_request_takes() -> None:
    exports = ConcurrencyLimit("exports", 4)
    table = PoolTable(max_concurrent=1)
    ids = table.check((exports,))
    first = table.acquire(ids, 0.0, permit=True)
    second = table.acquire(ids, 0.0, permit=True)
    block = table.acquire(ids, 0.0)  # a limited block takes no permit
    assert (first.granted, second.granted, block.granted) == (True, False, True)
    assert table.without_room(second, 0.0) == ()  # waiting for the permit only
    assert PERMIT not in [row[0] for row in table.usage()]
    table.release(first, 1.0)
    assert table.granted == [second]


def test_a_known_name_with_other_settings_is_refused() -> None:
    table = PoolTable()
    table.check((ConcurrencyLimit("x", 2),))
    with pytest.raises(ConfigError, match="limit 'x' is already known with other settings"):
        table.check((ConcurrencyLimit("x", 3),))
    with pytest.raises(ConfigError, match="already known"):
        table.check((RateLimit("x", 2).key("k"),))
    with pytest.raises(ConfigError, match="already known"):
        table.check((RateLimit("y", 1), RateLimit("y", 2)))
    assert table.settings("y") is None  # nothing learnt from a call that conflicts
    assert table.check((ConcurrencyLimit("x", 2).key("k"),)) == (("x", "k"),)


def test_rate_waiter_is_woken_when_the_clock_allows_it() -> None:
    partner = RateLimit("partner", 2, per=1.0)  # one start every 0.5 s
    table = PoolTable()
    ids = table.check((partner,))
    assert table.acquire(ids, 0.0).granted
    waiting = table.acquire(ids, 0.0)
    assert table.next_wakeup(0.0) == 0.5
    assert table.without_room(waiting, 0.0) == ("partner",)
    table.poll(0.25)
    assert table.granted == []
    table.poll(0.5)
    assert table.granted == [waiting]
    assert table.next_wakeup(0.5) == math.inf


def test_a_rate_waiter_blocked_by_another_pool_is_granted_when_that_pool_frees() -> None:
    """The wake-up is re-armed by either pool's change (a prototype hung here)."""
    rate, conc = RateLimit("r", 1, per=1.0), ConcurrencyLimit("c", 1)
    table = PoolTable()
    ids_r, ids_c, ids_rc = table.check((rate,)), table.check((conc,)), table.check((rate, conc))
    holder = table.acquire(ids_c, 0.0)
    table.acquire(ids_r, 0.0)  # spends the start: next at 1.0
    both = table.acquire(ids_rc, 0.0)
    assert table.next_wakeup(0.0) == 1.0
    table.poll(1.0)  # the rate allows it, but c is full
    assert table.granted == []
    assert table.next_wakeup(1.0) == math.inf  # c's release wakes it
    table.release(holder, 3.0)
    assert table.granted == [both]


def test_keyed_pools_are_forgotten_when_unused() -> None:
    table = PoolTable()
    tenant = ConcurrencyLimit("tenant", 1)
    partner = RateLimit("partner", 10, per=1.0)
    for i in range(100):
        ids = table.check((tenant.key(f"t{i}"), partner.key(f"t{i}")))
        table.release(table.acquire(ids, float(i)), float(i))
    assert table.usage() == []
    # The tenant pools go at once; the partner pools, whose tat was still ahead, by the
    # sweeps: never more than twice the pools in use.
    assert len(table._pools) <= 2  # pyright: ignore[reportPrivateUsage]
    held = table.acquire(table.check((tenant.key("x"),)), 100.0)
    assert table.usage() == [(("tenant", "x"), 1, 0)]
    table.release(held, 100.0)


# -- the model ------------------------------------------------------------------------------

POOLS = {
    "c1": ConcurrencyLimit("c1", 1),
    "c2": ConcurrencyLimit("c2", 2),
    "r1": RateLimit("r1", 2, per=1.0),
    "r2": RateLimit("r2", 1, per=0.5, burst=3),
    # Keyed pools are forgotten when unused (and swept): the model never forgets.
    "kc": ConcurrencyLimit("kc", 1).key("x"),
    "kr": RateLimit("kr", 1, per=1.0).key("y"),
}


def limit_of(name: str) -> ConcurrencyLimit | RateLimit:
    pool = POOLS[name]
    return pool.limit if isinstance(pool, LimitKey) else pool


class Model:
    """The rules read plainly: after every step, grant the oldest waiter that fits, repeat."""

    def __init__(self, max_concurrent: int | None) -> None:
        self.max_concurrent = max_concurrent
        self.held: dict[str, int] = dict.fromkeys(POOLS, 0)
        self.permits = 0
        # GCRA as _limits states it: tat = anchor + count * interval.
        self.anchor: dict[str, float] = dict.fromkeys(POOLS, -math.inf)
        self.count: dict[str, int] = dict.fromkeys(POOLS, 0)
        self.waiting: list[tuple[int, tuple[str, ...], bool]] = []
        self.granted: list[int] = []

    def room(self, name: str, now: float) -> bool:
        limit = limit_of(name)
        if isinstance(limit, RateLimit):
            interval = limit.per / limit.rate
            spent = self.count[name] - limit.burst + 1
            return spent <= 0 or now - self.anchor[name] >= spent * interval
        return self.held[name] < limit.capacity

    def fits(self, names: tuple[str, ...], permit: bool, now: float) -> bool:
        permit_ok = not permit or self.max_concurrent is None or self.permits < self.max_concurrent
        return permit_ok and all(self.room(n, now) for n in names)

    def take(self, names: tuple[str, ...], permit: bool, now: float) -> None:
        if permit and self.max_concurrent is not None:
            self.permits += 1
        for name in names:
            limit = limit_of(name)
            if isinstance(limit, RateLimit):
                interval = limit.per / limit.rate
                if self.count[name] and now - self.anchor[name] < self.count[name] * interval:
                    self.count[name] += 1
                else:
                    self.anchor[name], self.count[name] = now, 1
            else:
                self.held[name] += 1

    def settle(self, now: float) -> list[int]:
        out = []
        progress = True
        while progress:
            progress = False
            for entry in self.waiting:
                seq, names, permit = entry
                if self.fits(names, permit, now):
                    self.take(names, permit, now)
                    self.waiting.remove(entry)
                    out.append(seq)
                    progress = True
                    break
        return out


class PoolTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.table = PoolTable()
        self.model = Model(None)
        self.requests: dict[int, object] = {}
        self.names: dict[int, tuple[str, ...]] = {}
        self.permit_of: dict[int, bool] = {}
        self.holding: list[int] = []
        self.fast = 0  # permits held through the fast path

    @initialize(max_concurrent=st.one_of(st.none(), st.integers(min_value=1, max_value=3)))
    def start(self, max_concurrent: int | None) -> None:
        self.table = PoolTable(max_concurrent)
        self.model = Model(max_concurrent)

    def collect(self) -> None:
        expected = self.model.settle(self.now)
        got = [r.seq for r in self.table.granted]  # type: ignore[attr-defined]
        self.table.granted.clear()
        assert got == expected
        for seq in got:
            self.holding.append(seq)

    @rule(
        names=st.lists(st.sampled_from(sorted(POOLS)), unique=True, max_size=3).map(tuple),
        permit=st.booleans(),
    )
    def acquire(self, names: tuple[str, ...], permit: bool) -> None:
        # The table first grants what the clock allows; so does the model.
        expected_before = self.model.settle(self.now)
        ids = self.table.check(tuple(POOLS[n] for n in names))
        if not names and permit and self.model.max_concurrent is not None:
            # The fast path for the permit alone: no request unless it must wait.
            fits = self.model.fits(names, permit, self.now)
            taken = self.table.take_permit()
            if not taken:  # full, or the clock may have let a rate waiter fit first
                request = self.table.acquire(ids, self.now, permit=True)
                taken = request.granted
                if not taken:
                    self.requests[request.seq] = request
                    self.names[request.seq] = names
                    self.permit_of[request.seq] = permit
                    self.collect_before(expected_before)
                    assert not fits
                    self.model.waiting.append((request.seq, names, permit))
                    return
                self.requests[request.seq] = request
                self.names[request.seq] = names
                self.permit_of[request.seq] = permit
                self.collect_before(expected_before)
                assert fits
                self.model.take(names, permit, self.now)
                self.holding.append(request.seq)
                return
            self.collect_before(expected_before)
            assert taken == fits
            if taken:
                self.model.take(names, permit, self.now)
                self.fast += 1
                return
        request = self.table.acquire(ids, self.now, permit=permit)
        self.collect_before(expected_before)
        seq = request.seq
        self.requests[seq] = request
        self.names[seq] = names
        self.permit_of[seq] = permit
        if self.model.fits(names, permit, self.now):
            self.model.take(names, permit, self.now)
            assert request.granted
            self.holding.append(seq)
        else:
            assert not request.granted
            self.model.waiting.append((seq, names, permit))

    def collect_before(self, expected: list[int]) -> None:
        got = [r.seq for r in self.table.granted]
        self.table.granted.clear()
        assert got == expected
        self.holding.extend(got)

    @precondition(lambda self: self.fast)
    @rule()
    def release_fast_permit(self) -> None:
        self.fast -= 1
        self.model.permits -= 1
        if self.table.release_permit():
            self.table.settle_permit(self.now)
        self.collect()

    @precondition(lambda self: self.holding)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.holding))
        self.holding.remove(seq)
        for name in self.names[seq]:
            if isinstance(limit_of(name), ConcurrencyLimit):
                self.model.held[name] -= 1
        if self.permit_of[seq] and self.model.max_concurrent is not None:
            self.model.permits -= 1
        self.table.release(self.requests[seq], self.now)  # type: ignore[arg-type]
        self.collect()

    @precondition(lambda self: self.model.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.model.waiting))
        self.model.waiting.remove(entry)
        self.table.cancel(self.requests[entry[0]], self.now)  # type: ignore[arg-type]
        self.collect()

    @rule(dt=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.table.poll(self.now)
        self.collect()

    @rule()
    def advance_to_wakeup(self) -> None:
        wakeup = self.table.next_wakeup(self.now)
        if wakeup != math.inf:
            assert wakeup > self.now
            self.now = wakeup
            self.table.poll(self.now)
            self.collect()

    @invariant()
    def at_rest_no_waiter_fits_and_views_agree(self) -> None:
        for _, names, permit in self.model.waiting:
            assert not self.model.fits(names, permit, self.now)
        held = {ident[0]: h for ident, h, _ in self.table.usage()}
        for name in POOLS:
            limit = limit_of(name)
            expected = self.model.held[name] if isinstance(limit, ConcurrencyLimit) else 0
            assert held.get(name, 0) == expected
        assert self.table.permit_in_use == self.model.permits
        waiting = {ident[0]: w for ident, _, w in self.table.usage()}
        for name in POOLS:
            count = sum(1 for _, names, _ in self.model.waiting if name in names)
            assert waiting.get(name, 0) == count


TestPoolTableMachine = PoolTableMachine.TestCase
TestPoolTableMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
