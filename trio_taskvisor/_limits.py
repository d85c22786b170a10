"""Limit values and the rate maths: ``ConcurrencyLimit``, ``RateLimit``, ``LimitKey``, GCRA.

Plain values and pure functions, no trio. A *limit* is a named pool that tasks name in
their spec (``TaskSpec(limits=...)``) or that a block of code takes
(``Supervisor.limited``): a ``ConcurrencyLimit`` caps how many hold a unit at once, a
``RateLimit`` caps how many start per period. ``limit.key(k)`` is one pool per key, each
with the limit's settings; a bare limit is one pool whose key is ``None``.

A rate pool is GCRA, the generic cell rate algorithm: its state is its *theoretical
arrival time* ``tat`` (none for a pool never used). With ``interval = per / rate``::

    allowed at t     when  t >= tat - (burst - 1) * interval
    after a start    tat = max(tat, t) + interval

so starts are spaced ``interval`` apart on average and up to ``burst`` may start at once
after an idle stretch. In this process ``tat`` is kept as ``anchor + count * interval``:
``anchor`` the time of the start that began the pool's busy stretch (a start when
``tat`` had passed), ``count`` the starts since. ``gcra_allows`` is the rule above as
``t - anchor >= (count - burst + 1) * interval``, ``gcra_start`` the state after a start,
``gcra_allowed_at`` the earliest time a start is allowed and ``gcra_passed`` whether
``tat`` has passed (the pool is as a new one).

Why not ``tat`` itself (the slot store's scripts keep the same state on the server:
see ``_redis_scripts``): a float ``tat`` added ``interval`` once per start loses what
falls below its last digit. At ``now = 2**25`` s (a trio clock counts from the
machine's uptime, plus an offset: about a year), a rate of 488 954 per second with a
burst of 549 allowed 550 starts in one instant; and an interval below the clock's
resolution (``rate=2**53``, ``per=1e-20``) did not move ``tat`` at all: every start in
the instant was allowed, the limit was no limit.
Counted from an anchor, the rounding is one subtraction and one product, never summed:
in one instant a pool allows at most ``burst`` starts (exactly ``burst`` after an idle
stretch) whatever the numbers, and ``gcra_allowed_at`` is the first float time that
``gcra_allows`` accepts (a later one when ``anchor + span`` rounds down), so a waiter
woken then is granted, and no driver spins on a wake-up that grants nothing. With an
interval below the clock's resolution, a spent burst waits for the clock's next
representable time, which then allows as many starts as that step holds intervals.

Decisions the design leaves open:

* Two limits are the same pool's settings when they are equal values: same kind, name,
  capacity, or rate, ``per`` and ``burst``. ``per`` may be an ``int`` or a ``float`` and
  is stored as a ``float``, so ``per=60`` and ``per=60.0`` are the same settings.
* A pool's identity is ``(name, key)``; a ``LimitKey`` compares by its limit and key.
* ``capacity``, ``rate`` and ``burst`` are at most ``2**53``, and a full burst's span
  ``burst * per / rate`` at most a quarter of the largest float in milliseconds (about
  ``4.5e304`` s; ``ConfigError`` at construction): past that, ``per / rate`` or the span
  does not fit a float (``OverflowError`` at the first use, after the task was
  registered; or a ``tat`` that becomes infinite and never allows a start again), or
  the server's numbers (Lua's, doubles, in milliseconds: there a span past about
  ``1.8e305`` s allowed every start) and the ``slots`` command's reading no longer
  count exactly. A ``per`` far beyond what the server's replies carry (``1e300``) stays
  allowed: the scripts clamp those.
* ``per / rate`` must be ``> 0`` as a float (``ConfigError``): ``RateLimit("a", 2,
  per=5e-324)`` has an interval that underflows to ``0.0``, which allowed every start
  (no limit at all). Any positive interval works, however small (see above).
* A ``limits`` tuple that names one limit with two settings (``a`` and ``a2.key(k)``
  with another capacity) raises ``ConfigError`` where the tuple is checked (the spec,
  ``TaskDefaults``), not at each call that would then bring the conflict.
"""

from __future__ import annotations

import math
import sys
from typing import Final, Literal, TypeAlias

import attrs

from ._exceptions import ConfigError
from ._policies import positive_seconds


def _check_name(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"limit name must be a str, got {value!r}")
    if not value or "{" in value or "}" in value or any(c.isspace() for c in value):
        raise ConfigError(
            f"limit name must be non-empty, without whitespace, '{{' or '}}', got {value!r}"
        )
    return value


def _check_capacity(value: object) -> int:
    return _positive_int("capacity", value)


def _check_rate(value: object) -> int:
    return _positive_int("rate", value)


def _check_burst(value: object) -> int:
    return _positive_int("burst", value)


_MOST: Final = 2**53  # the largest integers a float (and the server's Lua number) holds exactly


def _positive_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 1:
        raise ConfigError(f"{what} must be >= 1, got {value!r}")
    if value > _MOST:
        raise ConfigError(
            f"{what} must be at most 2**53 (the largest integers the rate maths and the "
            # (not its digits: an int past 4300 of them has no repr)
            f"server's numbers hold exactly), got an int of {value.bit_length()} bits"
        )
    return value


def _check_per(value: object) -> float:
    return positive_seconds("per", value)


# A tat a full burst ahead, plus the clock, in the server's milliseconds.
_LONGEST_SPAN: Final = sys.float_info.max / 4 / 1000


def _check_key(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"limit key must be a str, got {value!r}")
    if not value or "{" in value or "}" in value:
        raise ConfigError(f"limit key must be non-empty, without '{{' or '}}', got {value!r}")
    return value


@attrs.frozen
class ConcurrencyLimit:
    """A pool of ``capacity`` units: at most ``capacity`` attempts or blocks hold one at once.

    An attempt that names it holds one unit from its start until it physically exits; a
    ``limited`` block holds one until the block exits.
    """

    name: str = attrs.field(converter=_check_name)
    """The pool's name: non-empty, without whitespace, ``{`` or ``}``."""
    capacity: int = attrs.field(converter=_check_capacity)
    """How many units the pool has (each key's pool, for ``key()``): an ``int``, from 1
    to ``2**53``."""

    def key(self, key: str) -> LimitKey:
        """One pool of this limit per ``key`` (a tenant, a partner), each with ``capacity``."""
        return LimitKey(self, key)


@attrs.frozen
class RateLimit:
    """A pool of starts: at most ``rate`` starts per ``per`` seconds, ``burst`` at once.

    GCRA: starts are spaced ``per / rate`` seconds apart on average, and up to ``burst``
    may start together after an idle stretch. An attempt or a ``limited`` block spends
    one start when it begins; it holds nothing afterwards.
    """

    name: str = attrs.field(converter=_check_name)
    """The pool's name: non-empty, without whitespace, ``{`` or ``}``."""
    rate: int = attrs.field(converter=_check_rate)
    """How many starts per ``per`` seconds: an ``int``, from 1 to ``2**53``."""
    per: float = attrs.field(default=1.0, kw_only=True, converter=_check_per)
    """The period of ``rate``, in seconds: finite and ``> 0`` (and ``burst * per / rate``
    at most about ``4.5e304``)."""
    burst: int = attrs.field(default=1, kw_only=True, converter=_check_burst)
    """How many starts may happen at once after an idle stretch: an ``int``, from 1 to
    ``2**53``."""

    def __attrs_post_init__(self) -> None:
        if not self.interval > 0.0:
            raise ConfigError(
                f"per / rate (the interval between starts) must be > 0 as a float, got "
                f"per={self.per!r} / rate={self.rate!r}, which is 0.0: no limit at all"
            )
        span = self.burst * self.interval
        if not span <= _LONGEST_SPAN:
            raise ConfigError(
                f"burst * per / rate (the span of a full burst) must be at most "
                f"{_LONGEST_SPAN:.2g} s, for the rate maths to stay finite, got {span:.3g} s"
            )

    @property
    def interval(self) -> float:
        """The spacing of starts, ``per / rate`` seconds."""
        return self.per / self.rate

    def key(self, key: str) -> LimitKey:
        """One pool of this limit per ``key`` (a tenant, a partner), each with the rate."""
        return LimitKey(self, key)


Limit: TypeAlias = ConcurrencyLimit | RateLimit


def _check_limit(value: object) -> Limit:
    if not isinstance(value, ConcurrencyLimit | RateLimit):
        raise TypeError(f"limit must be a ConcurrencyLimit or a RateLimit, got {value!r}")
    return value


@attrs.frozen
class LimitKey:
    """One pool of a limit per key: ``limit.key("acme")``."""

    limit: Limit = attrs.field(converter=_check_limit)
    """The limit whose settings the pool has."""
    key: str = attrs.field(converter=_check_key)
    """The key: non-empty, without ``{`` or ``}``."""


Pool: TypeAlias = ConcurrencyLimit | RateLimit | LimitKey
"""What a spec's ``limits`` and ``Supervisor.limited`` take: a limit or one key's pool."""

PoolId: TypeAlias = tuple[str, str | None]
"""A pool's identity: its limit's name and its key (``None`` for a bare limit)."""


def pool_parts(pool: object) -> tuple[Limit, str | None]:
    """Split a pool into its limit and its key; ``TypeError`` for anything else."""
    if isinstance(pool, LimitKey):
        return pool.limit, pool.key
    if isinstance(pool, ConcurrencyLimit | RateLimit):
        return pool, None
    raise TypeError(f"a limit must be a ConcurrencyLimit, a RateLimit or a LimitKey, got {pool!r}")


def check_limits(value: object) -> tuple[Pool, ...]:
    """Validate a ``limits`` option: a tuple of pools, each pool at most once, each limit
    with one settings (two would conflict at the first call that brings them)."""
    if type(value) is not tuple:
        raise TypeError(f"limits must be a tuple of limits, got {value!r}")
    items: tuple[object, ...] = value  # pyright: ignore[reportUnknownVariableType]
    seen: set[PoolId] = set()
    settings: dict[str, Limit] = {}
    for item in items:
        limit, key = pool_parts(item)
        ident = (limit.name, key)
        if ident in seen:
            raise ConfigError(f"limits must name each pool once, got {pool_label(ident)} twice")
        seen.add(ident)
        first = settings.setdefault(limit.name, limit)
        if first != limit:
            raise ConfigError(
                f"limits name limit {limit.name!r} twice with other settings: {first!r} and "
                f"{limit!r}"
            )
    return items  # type: ignore[return-value]


def is_concurrency(pool: Pool) -> bool:
    """Whether ``pool`` is a concurrency pool (it holds units; a rate pool holds none)."""
    limit = pool.limit if isinstance(pool, LimitKey) else pool
    return isinstance(limit, ConcurrencyLimit)


def pool_label(ident: PoolId) -> str:
    """How messages name a pool: ``name`` or ``name[key]``."""
    name, key = ident
    return name if key is None else f"{name}[{key}]"


# -- GCRA ------------------------------------------------------------------------------------


def gcra_allows(anchor: float, count: int, now: float, interval: float, burst: int) -> bool:
    """Whether a rate pool whose state is ``(anchor, count)`` allows a start at ``now``
    (``now`` no earlier than ``anchor``; ``count == 0`` for a pool never used)."""
    return count < burst or now - anchor >= (count - burst + 1) * interval


def gcra_start(anchor: float, count: int, now: float, interval: float) -> tuple[float, int]:
    """The state after a start at ``now`` (which must be allowed)."""
    if count and now - anchor < count * interval:
        return anchor, count + 1  # tat has not passed: it moves on by one interval
    return now, 1  # a new busy stretch: tat = now + interval


def gcra_allowed_at(anchor: float, count: int, interval: float, burst: int) -> float:
    """The earliest time ``gcra_allows`` accepts: ``-inf`` while fewer than ``burst``
    starts were counted (a start is allowed at any time from ``anchor``)."""
    if count < burst:
        return -math.inf
    span = (count - burst + 1) * interval
    at = anchor + span
    while at - anchor < span:  # rounded down: the next float is the first allowed
        at = math.nextafter(at, math.inf)
    return at


def gcra_passed(anchor: float, count: int, now: float, interval: float) -> bool:
    """Whether the pool's ``tat`` has passed by ``now``: it then behaves as a new pool."""
    return not count or now - anchor >= count * interval


@attrs.frozen
class LimitView:
    """One pool as this process sees it now (``Supervisor.limit_snapshot()``)."""

    name: str
    """The limit's name."""
    key: str | None
    """The pool's key, or ``None`` for a bare limit."""
    kind: Literal["concurrency", "rate"]
    """``"concurrency"`` for a ``ConcurrencyLimit``, ``"rate"`` for a ``RateLimit``."""
    held: int
    """Units held in this process (always 0 for a rate pool: it holds nothing)."""
    waiting: int
    """Attempts and ``limited`` blocks of this process waiting for the pool."""
    capacity: int | None = None
    """A concurrency pool's capacity; ``None`` for a rate pool."""
    rate: int | None = None
    """A rate pool's starts per ``per``; ``None`` for a concurrency pool."""
    per: float | None = None
    """A rate pool's period in seconds; ``None`` for a concurrency pool."""
    burst: int | None = None
    """A rate pool's burst; ``None`` for a concurrency pool."""


@attrs.frozen
class ClusterLimitInfo:
    """What the slot store's server holds for one pool (``Supervisor.cluster_limit``).

    Holders and waiters of processes whose units' lease expired are not counted.
    """

    held: int
    """Units held cluster-wide (always 0 for a rate pool: it holds nothing)."""
    holders: dict[str, int]
    """Units held per process: ``{instance_id: units}`` (empty for a rate pool)."""
    waiting: int
    """Attempts and ``limited`` blocks waiting for the pool, cluster-wide."""
    next_start_in: float | None
    """A rate pool's seconds until it allows a start (0.0 if now); ``None`` for a
    concurrency pool. At most ``1e9`` (about 31.7 years, the longest the server's
    scripts count; a ``per`` that long is the only way past it)."""


def limit_view(limit: Limit, key: str | None, held: int, waiting: int) -> LimitView:
    """The ``LimitView`` of one pool of ``limit``."""
    if isinstance(limit, ConcurrencyLimit):
        return LimitView(limit.name, key, "concurrency", held, waiting, capacity=limit.capacity)
    return LimitView(
        limit.name, key, "rate", 0, waiting, rate=limit.rate, per=limit.per, burst=limit.burst
    )
