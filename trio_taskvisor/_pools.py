"""Limit pools of one process: which waiter gets which units, and when. Pure logic.

No trio here. A ``PoolTable`` holds the pools a supervisor knows (the ``max_concurrent``
permit among them, as the concurrency pool ``PERMIT``), their units, and the requests
waiting for them. Its driver (the registry) asks for units with ``acquire``, gives them
back with ``release``, withdraws a request with ``cancel`` and calls ``poll`` at
``next_wakeup`` (when a rate pool allows its next start); every call that can grant
appends the requests it granted to ``granted``, for the driver to start them.

The rules (each checked by the property tests against a model):

* **All at once.** A request takes one unit of each of its pools in one step, or none:
  it never holds some while it waits for others.
* **Oldest first among those that fit.** When units free, or a rate pool allows a start,
  the oldest waiting request whose every pool has room is granted first, then the next
  oldest that still fits, and so on. A request waiting for a full pool never blocks one
  that needs other pools; among requests that need the same pools, FIFO. Age is the
  order of ``acquire`` calls. There is no reservation: a request that needs several
  pools can wait behind a stream of requests that need one of them.
* **At rest, no waiter fits.** After every call, no waiting request has room in every
  pool at the time of that call. So a new request is granted at once exactly when its
  pools all have room: no older waiter can want the same units.

Only a pool whose room grew can make a waiter fit, so a change looks only at the waiters
of the pools it changed (each pool keeps its waiters in age order), and stops scanning a
pool once it is full. Rate pools change with time: ``poll(now)`` grants what the passing
of time allowed, and every call first does the same for ``now``, so a request never
overtakes an older one whose start the clock has already allowed.

Decisions the design leaves open:

* A keyed pool (``limit.key(k)``: keys are often tenants, without bound) is forgotten
  once nothing holds or waits for it and, for a rate pool, once its ``tat`` has passed
  (it then behaves exactly as a new pool); a bare limit's pool, one per name, is kept.
  Settings are kept for the table's life, by name: a limit of a known name with other
  settings is a ``ConfigError`` at ``check``.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Final

from ._exceptions import ConfigError
from ._limits import (
    ConcurrencyLimit,
    Limit,
    Pool,
    PoolId,
    RateLimit,
    gcra_allowed_at,
    gcra_allows,
    gcra_passed,
    gcra_start,
    pool_label,
    pool_parts,
)

PERMIT: Final[PoolId] = ("", None)
"""The ``max_concurrent`` permit's pool (no limit's name is empty)."""


class _Pool:
    """One pool's state: a concurrency pool's units held, or a rate pool's GCRA state
    (``anchor``, ``count``: see ``_limits``)."""

    __slots__ = (
        "anchor",
        "burst",
        "capacity",
        "count",
        "held",
        "ident",
        "interval",
        "rate",
        "waiters",
    )

    def __init__(self, ident: PoolId, limit: Limit | None, capacity: int = 0) -> None:
        self.ident = ident
        self.rate = isinstance(limit, RateLimit)
        self.capacity = limit.capacity if isinstance(limit, ConcurrencyLimit) else capacity
        self.interval = limit.interval if isinstance(limit, RateLimit) else 0.0
        self.burst = limit.burst if isinstance(limit, RateLimit) else 1
        self.held = 0
        self.anchor = -math.inf
        self.count = 0
        # Waiting requests by sequence number, in age order. An OrderedDict: waiters leave
        # from the front, and a dict's iteration would first pass over every slot they
        # left (O(waiters) per release until the dict is resized; benchmark row 11).
        self.waiters: OrderedDict[int, Request] = OrderedDict()

    def has_room(self, now: float) -> bool:
        if self.rate:
            return gcra_allows(self.anchor, self.count, now, self.interval, self.burst)
        return self.held < self.capacity

    def take(self, now: float) -> None:
        if self.rate:
            self.anchor, self.count = gcra_start(self.anchor, self.count, now, self.interval)
        else:
            self.held += 1

    def allowed_at(self) -> float:
        return gcra_allowed_at(self.anchor, self.count, self.interval, self.burst)


class Request:
    """One attempt's or block's request for units of its pools, granted all at once."""

    __slots__ = ("granted", "payload", "pools", "seq")

    def __init__(self, pools: tuple[_Pool, ...], seq: int, payload: object) -> None:
        self.pools = pools
        self.seq = seq
        self.payload = payload
        """The driver's object (the record or the block); the table never looks at it."""
        self.granted = False

    @property
    def idents(self) -> tuple[PoolId, ...]:
        """The pools this request takes units of."""
        return tuple(pool.ident for pool in self.pools)


def _age(request: Request) -> int:
    return request.seq


def _merged(first: Iterable[Request], second: Iterable[Request]) -> Iterator[Request]:
    """Two pools' waiters (each in age order) in age order, a request of both once:
    ``heapq.merge`` for two, without its heap (benchmark row 11)."""
    a, b = iter(first), iter(second)
    x, y = next(a, None), next(b, None)
    while x is not None and y is not None:
        if x is y:  # a request of both pools (a task's, with the permit): once
            yield x
            x, y = next(a, None), next(b, None)
        elif x.seq < y.seq:
            yield x
            x = next(a, None)
        else:
            yield y
            y = next(b, None)
    if x is not None:
        yield x
        yield from a
    elif y is not None:
        yield y
        yield from b


class PoolTable:
    """The pools of one supervisor, and the requests waiting for their units."""

    __slots__ = (
        "_created",
        "_next_seq",
        "_pools",
        "_settings",
        "granted",
        "permit",
        "rate_waiting",
    )

    def __init__(self, max_concurrent: int | None = None) -> None:
        self._settings: dict[str, Limit] = {}
        self._pools: dict[PoolId, _Pool] = {}
        self.permit = None if max_concurrent is None else _Pool(PERMIT, None, max_concurrent)
        """The ``max_concurrent`` permit's pool (``held``, ``capacity``), for fast paths."""
        self.rate_waiting: set[_Pool] = set()
        """Rate pools with waiters: the only pools the clock can change."""
        self._next_seq = 0
        self._created = 0  # pools made since the last sweep
        self.granted: list[Request] = []
        """Requests granted by the last calls, oldest first, for the driver to take."""

    # -- settings ---------------------------------------------------------------------------

    def check(self, pools: Iterable[Pool]) -> tuple[PoolId, ...]:
        """Learn the settings of ``pools``; ``ConfigError`` if a known name has others.

        The first settings of a name stay for the table's life. Nothing is learnt when
        any of ``pools`` conflicts.
        """
        idents: list[PoolId] = []
        new: dict[str, Limit] = {}
        for pool in pools:
            limit, key = pool_parts(pool)
            known = self._settings.get(limit.name, new.get(limit.name))
            if known is None:
                new[limit.name] = limit
            elif known != limit:
                raise ConfigError(
                    f"limit {limit.name!r} is already known with other settings: "
                    f"{known!r}, got {limit!r}"
                )
            idents.append((limit.name, key))
        self._settings.update(new)
        return tuple(idents)

    # -- requests ---------------------------------------------------------------------------

    def acquire(
        self, idents: Iterable[PoolId], now: float, payload: object = None, *, permit: bool = False
    ) -> Request:
        """Ask for one unit of each pool in ``idents`` (and the permit, if ``permit``).

        The request is granted at once (``request.granted``) when every pool has room,
        else it waits. The names must have been ``check``-ed.
        """
        if self.rate_waiting:
            self._settle([], now)
        known = self._pools
        pools = [known.get(ident) or self._pool(ident) for ident in idents]
        if permit and self.permit is not None:
            pools.insert(0, self.permit)
        request = Request(tuple(pools), self._next_seq, payload)
        self._next_seq += 1
        for pool in pools:
            if not pool.has_room(now):
                break
        else:
            for pool in pools:
                pool.take(now)
            request.granted = True
        if not request.granted:
            for pool in pools:
                pool.waiters[request.seq] = request
                if pool.rate:
                    self.rate_waiting.add(pool)
        if self._created and self._created >= len(known):
            self._sweep(now)
        return request

    def take_permit(self) -> bool:
        """Take the permit alone now, the fast path of ``acquire((), now, permit=True)``.

        ``False`` when it has no room, or when rate pools have waiters (the clock may
        have let one of them fit first): then ``acquire`` with the time. No ``Request``
        is made; give the permit back with ``release_permit``. At rest no waiter fits,
        so no older waiter can want a permit that has room.
        """
        permit = self.permit
        assert permit is not None
        if permit.held < permit.capacity and not self.rate_waiting:
            permit.held += 1
            return True
        return False

    def release_permit(self) -> bool:
        """Give back a permit taken with ``take_permit``; whether to ``settle`` now.

        ``True`` when a waiter may fit now: then call ``settle_permit`` with the time.
        """
        permit = self.permit
        assert permit is not None
        permit.held -= 1
        return bool(permit.waiters or self.rate_waiting)

    def settle_permit(self, now: float) -> None:
        """Grant what a permit given back by ``release_permit`` (and the clock) let fit."""
        assert self.permit is not None
        self._settle([self.permit], now)

    def cancel(self, request: Request, now: float) -> None:
        """Withdraw a waiting request (it holds nothing); a granted one is unchanged."""
        if request.granted:
            return
        for pool in request.pools:
            del pool.waiters[request.seq]
            if pool.rate and not pool.waiters:
                self.rate_waiting.discard(pool)
            self._forget(pool, now)

    def release(self, request: Request, now: float) -> None:
        """Give back a granted request's concurrency units (its starts stay spent)."""
        assert request.granted
        changed: list[_Pool] = []
        for pool in request.pools:
            if not pool.rate:
                pool.held -= 1
                if pool.waiters:
                    changed.append(pool)
                elif pool.ident[1] is not None and not pool.held:
                    self._forget(pool, now)
        if changed or self.rate_waiting:
            self._settle(changed, now)

    def poll(self, now: float) -> None:
        """Grant what the clock allows by ``now`` in rate pools with waiters."""
        self._settle([], now)

    def next_wakeup(self, now: float) -> float:
        """When ``poll`` may grant next: the earliest later start a rate pool allows.

        ``math.inf`` when no rate pool has waiters. A rate pool that already allows a
        start but whose waiters wait for other pools is woken by those pools' changes.
        """
        times = [pool.allowed_at() for pool in self.rate_waiting]
        later = [t for t in times if t > now]
        return min(later, default=math.inf)

    def without_room(self, request: Request, now: float) -> tuple[str, ...]:
        """The labels of the request's limit pools that have no room at ``now``."""
        return tuple(
            pool_label(pool.ident)
            for pool in request.pools
            if pool is not self.permit and not pool.has_room(now)
        )

    # -- views ------------------------------------------------------------------------------

    @property
    def permit_in_use(self) -> int:
        """Permits held (0 without ``max_concurrent``)."""
        return 0 if self.permit is None else self.permit.held

    def permit_waiters(self) -> list[object]:
        """The payloads of requests waiting with the permit among their pools, oldest first."""
        return [] if self.permit is None else [r.payload for r in self.permit.waiters.values()]

    def settings(self, name: str) -> Limit | None:
        """The settings the table knows for the limit ``name``."""
        return self._settings.get(name)

    def usage(self) -> list[tuple[PoolId, int, int]]:
        """``(pool, held, waiting)`` of every limit pool with holders or waiters, sorted.

        A rate pool holds nothing: its ``held`` is 0.
        """
        rows = [
            (ident, pool.held, len(pool.waiters))
            for ident, pool in self._pools.items()
            if pool.held or pool.waiters
        ]
        rows.sort(key=lambda row: (row[0][0], row[0][1] or ""))
        return rows

    # -- internals --------------------------------------------------------------------------

    def _pool(self, ident: PoolId) -> _Pool:
        pool = self._pools.get(ident)
        if pool is None:
            pool = self._pools[ident] = _Pool(ident, self._settings[ident[0]])
            self._created += 1
        return pool

    def _sweep(self, now: float) -> None:
        # Rate pools used last by a request that was granted at once are forgotten only
        # by a sweep: one per as many new pools as there are pools, so pools nothing
        # uses cost amortized O(1) and never outnumber the live ones twice.
        self._created = 0
        for pool in list(self._pools.values()):
            self._forget(pool, now)

    def _forget(self, pool: _Pool, now: float) -> None:
        # Only a keyed pool is forgotten (keys are often tenants: unbounded); a bare
        # limit's pool is one per name.
        if pool.ident[1] is None or pool.held or pool.waiters:
            return
        if pool.rate and not gcra_passed(pool.anchor, pool.count, now, pool.interval):
            return
        # A granted request keeps its rate pools after they were forgotten; a new pool of
        # the same identity may have been made since.
        if self._pools.get(pool.ident) is pool:
            del self._pools[pool.ident]

    def _settle(self, changed: list[_Pool], now: float) -> None:
        """Grant what ``changed`` pools and the clock's allowed starts make fit."""
        due = [pool for pool in self.rate_waiting if pool.allowed_at() <= now]
        if due:
            changed = changed + [pool for pool in due if pool not in changed]
        if changed:
            self._grant(changed, now)

    def _grant(self, changed: list[_Pool], now: float) -> None:
        """Grant, oldest first, the waiters of ``changed`` pools that now fit.

        The waiters are read lazily, in age order (each pool's are in it already: merged
        when several pools changed), and only until no changed pool has room: a release
        that one waiter fills again reads one or two, not every waiter (it used to copy
        them all, and sort them when the permit and a pool changed together: O(waiters)
        per release). Granted waiters leave their pools after the reading.
        """
        waiting = [pool.waiters.values() for pool in changed]
        if len(waiting) == 1:
            candidates: Iterable[Request] = waiting[0]
        elif len(waiting) == 2:
            candidates = _merged(*waiting)  # the permit and one pool: a release's usual
        else:
            candidates = heapq.merge(*waiting, key=_age)
        granted = self.granted
        first = len(granted)
        for request in candidates:
            if not any(pool.has_room(now) for pool in changed):
                break
            # A request of several changed pools comes once per pool: granted once.
            if not request.granted and all(pool.has_room(now) for pool in request.pools):
                for pool in request.pools:
                    pool.take(now)
                request.granted = True
                granted.append(request)
        for request in granted[first:]:
            for pool in request.pools:
                del pool.waiters[request.seq]
                if pool.rate and not pool.waiters:
                    self.rate_waiting.discard(pool)
        for pool in changed:
            self._forget(pool, now)
