"""The lease keeper: all server I/O of a supervisor that has a slot store.

One ``LeaseKeeper`` per supervisor runs as one trio task (``await nursery.start(keeper.run)``)
with a nursery of its own: the connection holder, the subscription to this process's
channel, the timers and the I/O loop. The controller never awaits
it: its requests (``submit``, ``withdraw``, ``release``, ``follow``, ``unfollow``,
``stop_owner``) are synchronous calls that queue the request and wake the I/O loop, and
the results come back as *reports* (frozen values of ``_slotstore``) on the ``ReportSink``
the keeper was given. Only ``query`` (``Supervisor.cluster_slot``) is awaited, and the
answer to a ``stop_owner`` request (``cancel_slot`` of a remote owner).

The I/O loop sends everything that is pending in one pipeline (one round trip) and one
pipeline at a time: requests that arrive meanwhile go together in the next one. While
the loop waits for work, a request it owes the server (a release, a withdrawal, ...)
writes that pipeline at once, in the caller's task, and the loop reads its replies. The
renewal (every ``lease_ttl / 3``) is one script call for every lease, queue entry and
followed entry of the process, and reads the server's ``run_id`` in the same round trip.

Invariants:

* Every submit is resolved exactly once, with a report, within ``connect_timeout`` of
  the call: by its reply, or by the failure or the timeout of its round trip (then
  ``Rejected(STORE_UNAVAILABLE)``, or ``Full`` when ``wait=True``). An error reply that
  is no refusal (foreign data in the namespace, a server out of memory) is
  ``Rejected(STORE_UNAVAILABLE)`` with the error as its reason, even when ``wait=True``:
  it is no outage, so no recovery would ever ask held work again. So is an entry a
  renewal finds behind foreign data (its slot's lease or queue key, or its own ``gone``
  key, of another type: it is withdrawn, its marker naming the key for its joiners, a
  withdrawal that reads those keys as none), or whose own claim's grant meets it (its
  slot's fence key: the script takes it out of its queue for good), and an owner whose
  lease key is foreign data loses it (``LeaseLost``, naming the key and the error); the
  other slots renew on.
  A joiner of another process's work ends as that work does then (rejected, or
  ``LEASE_LOST`` for a lost lease, naming the key), and one whose followed entry's
  ``out`` or ``jn`` key is foreign data is rejected so. Foreign data that a renewal
  reads but no item of it owns (another process's heartbeat or a slot's watch key; in a
  limit renewal, keys of other pools, groups and processes that a settle meets) is read
  as none and logged at ERROR with the key, and so is such a key that a submit, a claim,
  a release, a withdrawal or a stored outcome reads (another process's heartbeat, a
  slot's watch key, an entry's joiners key; a heartbeat that is no lease TTL too: the
  grant lasts this process's ``lease_ttl``), and
  any that a limit release or withdrawal reads, or that a limit acquisition's settle
  meets in another pool, group or process; a limit waiter whose pool's or own key is
  foreign data is refused alone. A submit that may have reached the server without its
  reply reaching us, or whose script failed half-way (a script keeps what it wrote), is
  withdrawn (its queue entry and any lease it took) in the next successful round trip.
* Withdrawals, releases, stored outcomes and stop requests are sent until the server
  acknowledges them (or the keeper closes); they are idempotent. A withdrawal, a
  release, a stored outcome, a limit release or a limit withdrawal that the server
  answers with an error (a script that failed: it keeps what it wrote) is sent again
  with each renewal, not at once (no spin), until it works, and once more in the drain
  (``_owed``, one path for all five; a stop request's waiter learns of the error
  instead). Before, it was dropped: a limit release's units stayed held while the
  process lived (one unit fewer in the pool for every replica), and a slot's release
  or withdrawal that failed before its hand-over left the slot free with its queue
  waiting, until the head's own claim, as did a stored outcome that failed before it
  told the joiners. A limit acquisition answered with an error is withdrawn, as a
  submit is: its script may have granted it before it failed, and nobody would
  release that grant. Not a waiter's poll (an acquisition sent again) whose error
  comes after a push granted it: its units are held, and released as any others.
* A lease is reported lost (``LeaseLost``) when a renewal refuses it, or at
  ``0.8 * lease_ttl`` after the sending of its last confirmed acquisition or renewal,
  by a local timer that fires whether or not the server answers (``LeaseDeadline``);
  after that the keeper never renews it again.
* ``StoreUnavailable`` and ``StoreRecovered`` alternate, once per outage. An outage
  starts with the first failed round trip, or with a round trip whose renewal (or any
  call) the server refused as such (permissions, unknown commands, a Redis Cluster
  node, a read-only replica: an error reply is no reply), or with the loss of the
  subscription, or when a renewal shows a restarted server (a new ``run_id``: the
  subscription did not survive it). It ends once a fresh connection renewed (without
  an error reply) and subscribed again.
* With ``replicas_ack = n > 0``, every round trip that may change the store ends with
  ``WAIT n``; one that fewer than ``n`` replicas acknowledged is handled exactly as a
  failed round trip (an outage; no reply in it is acted on: a submit's grant is given
  back and the submit answered as failed, a claimed entry stays queued until a renewal
  that replicas acknowledged tells its lease, a renewal does not count), because a
  failover could lose its writes.
  Every fresh connection first checks that ``n`` replicas are connected.
* No ``trio.Cancelled`` of the keeper's own scopes and no exception group of the
  client library leaves the keeper: failures of the server or of the client are
  contained, logged (never with credentials) and handled as outages.

Decisions the design leaves open:

* A fresh connection (the start's, and each reconnection's) first tries every command
  the scripts call, as the store's user, on scratch keys (``scripts.PROBE``): a user
  without one is refused at start, and a permission taken away later keeps the store
  unavailable (an outage, with its backoff) until it is back, rather than letting a
  connection count as recovered that fails every call needing it.
* ``Owner`` may be reported for a slot whose previous local owner lost its lease and is
  still physically running: the controller holds the new owner until that exit (its
  lease is renewed meanwhile, so no other process can take the slot).
* ``RemoteStop`` is reported for a stop requested by this very process too (a REPLACE
  of its own owner goes through the server like any other).
* A hand-over is pushed: the server gives a released lease to the next live head and
  sends its process the grant, which the keeper reports as ``Owner`` without a round
  trip. That lease's deadline counts from the sending of the last round trip that
  found the entry still queued (the grant came later). A claim confirms the grant
  instead (the server then extends the lease) for an entry a renewal re-submitted (the
  message may be of a grant of its earlier place).
* Any grant (a reply, a pushed message) that comes so late that its lease would count
  as lost within a renewal interval (a paused or slow server: a lease counts from its
  request's sending) is not acted on: its entry stays queued (reported ``Queued`` if it
  was a submission's) and a claim confirms the grant with a fresh deadline. Limit units
  granted so late wait as their request's waiter for a renewal to confirm them. Acted
  on, the work would end ``LEASE_LOST`` as it started, and a ``limited`` block get
  ``LeaseLostError`` as it entered (a grant that replicas did not acknowledge is not
  acted on either: docs/design.md, "Outages").
* A message about a slot (a grant, a wake-up) that arrives before the reply of the
  round trip that queued this process's entry there (the subscription is another
  connection) is kept until that reply, then acted on.
* A joiner whose target looks lost is resolved ``LEASE_LOST`` only when a renewal at
  least ``lease_ttl / 3`` later still finds no outcome (the target's process may store
  one meanwhile: each check registers the joiner again, so a release after a server
  restart still asks for the outcome).
* At start, a failure that may pass by itself is tried again with the reconnection's
  backoff until ``connect_timeout``: nothing listens on the port yet (nor on the
  sentinels'), the connection drops, the server is at its ``maxclients`` or takes no
  call for now (``LOADING``, ``BUSY``, ...), too few replicas are connected for
  ``replicas_ack``. Then the error names the last failure. A refusal of the store's
  settings (credentials, permissions, the database, TLS, the protocol, the commands, a
  service the sentinels do not know) raises at once: waiting would not change it, and
  a heartbeat the start's renewal wrote is deleted (the subscription came after it).
  ``connect_timeout`` bounds the start (docs/howto-replicas.md); trying again within
  it is this module's choice: the start raised at the first failure, so a replica that
  started alongside its server, or during the server's restart, failed in
  milliseconds.
* ``limit_query`` (``sup.cluster_limit``) of a pool the cluster uses with other
  settings raises the ``ConfigError`` an acquisition gets: its answer would be about
  that other pool (the server checks a pool's settings at every acquisition:
  docs/howto-limits.md, "Settings are checked by the server"). A pool that only dead
  processes held or waited for is not in use: the server answers it as one without
  settings, as an acquisition with other settings is granted then.
* A renewal that shows a new ``run_id`` (a failover, a restart) makes the next one a
  limit *rebase*: it names every unit this process holds, which the server moves to a
  new generation with the waiters it names (and their grants this process has not
  heard of yet), so units this process gave back that the new server still counts (a
  release the old one did not pass on) die with the old generation rather than count
  as held while this process lives; a unit the new server lacks is lost
  (``limit_lost``). Without it, such a server admitted one holder of a capacity-2 pool
  while a replica lived on, and no push would ever reach a unit it held. Until the
  rebase's answer, a reply with another generation loses nothing (after two changes
  of server, a copy's may be an older one that still holds this process's units). A
  waiter granted by a push while a renewal is on the wire takes the generation of that
  renewal's answer for it (a rebase's new one).
* Every limit renewal names the units this process holds (pool by pool, each request by
  its number: a process may hold thousands; waiters are named as before), and the
  server answers with those it no longer holds (a holders key evicted, deleted or
  overwritten: ``_redis_scripts``): each is lost then (``limit_lost``), as a slot
  lease whose key went is at the next renewal, so the pool holds more than its
  capacity for at most one renewal interval. The server has given back that request's
  units in its other pools already: no release follows. Before, the server's answer
  said nothing of them: their holders ran on uncounted, never told, while other
  processes took the units. Not while a rebase is due (a new server's answer: the
  rebase tells).
* Reconnection backs off from ``lease_ttl / 24`` (the first retry is immediate, unless
  the previous outage ended less than ``lease_ttl / 3`` ago: then the backoff goes on
  where it stopped, at least ``lease_ttl / 24``), doubling, capped at ``lease_ttl / 3``;
  every attempt uses a fresh client.
* ``SlotStoreUnavailableError`` names the last error the client reported (what the
  server was asked, and how it refused), chained as ``__cause__``; without one (the
  server stayed silent) it says "did not answer within N s", as does the WARNING that
  starts the outage (N: the round trip's bound). The client's own bounds (connecting, a
  subscription's confirmation) are half of ``connect_timeout``, so its error arrives
  before the keeper's bound.
* An owner's lease deadline is also checked when its outcome is committed
  (``lease_lost``), so a body that returns in the instant of the loss ends
  ``LEASE_LOST``, whichever of it and the deadline timer trio runs first.
* A release (any obligation) that finds the I/O loop idle writes its round trip in the
  caller's task (``_send_now``; the connection's ``send_nowait``, where the socket
  allows), not at the loop's next step: the task that awaited the owner's outcome wakes
  in the same scheduler pass as the loop, trio picks their order at random, and when
  it ran first the release waited for its work and carried its next submit, which the
  server ran before the grant left (benchmark 10, the hand-over rows: p50 about 0.2 ms
  lower). A submit still waits for the loop: submits arriving together share a round
  trip (benchmark 10, the 3x50 rows).
* An obligation sent again for an error (above) has no cap on its tries, and is not
  dropped once it seems moot: a cap would leak for ever what it had not done (units
  held while the process lives: a pool with less room for every replica), and a lease
  that expired meanwhile leaves a release its other work (the outcome that joiners of
  other processes wait for, the hand-over to the next head: an expiry publishes
  nothing), a withdrawal its marker (which refuses a late submit of the entry) and the
  entry's removal from its queue (where it would be granted). A lasting error costs one
  call per renewal and item. Its error is logged at ERROR the first time, naming the
  item, and again only when it changes (else at DEBUG: it would log at every
  renewal), and once the item worked, that at INFO ("worked, after N failed tries").
* A limit renewal the server answers with an error (no refusal: a script error) is no
  outage: the slots' renewal in the same round trip worked, and an outage would stop
  their work. It is not acted on, as a renewal in an outage: its units are not renewed
  (lost at ``0.8 * lease_ttl`` after their last renewal), its waiters wait, and the
  next renewal makes it again, as each does. Its error is logged by the rule of an
  obligation sent again. Before, it was logged at ERROR at every renewal.
* At ``close`` pending submits are rejected ``SHUTTING_DOWN`` and no new lease is taken;
  leases still held are not released (their owners may still run): they expire
  ``lease_ttl`` after their last renewal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol, TypeAlias, assert_never, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs
import trio

from . import _redis_scripts as scripts
from ._config import RedisSlotStore
from ._exceptions import ConfigError, SlotStoreUnavailableError
from ._limits import ConcurrencyLimit, Limit, PoolId, pool_label
from ._logging import log
from ._outcome import OutcomeKind, RejectionKind, TaskOutcome, rejected_outcome
from ._slotstore import (
    LOST_LEASE_FRACTION,
    QUEUE_FULL_REASON,
    STORE_UNAVAILABLE_REASON,
    ClusterSlotInfo,
    FollowedOutcome,
    Full,
    Joined,
    LeaseDeadline,
    LeaseLost,
    Owner,
    Queued,
    Rejected,
    RemoteStop,
    Report,
    ReportSink,
    Room,
    StoreRecovered,
    StoreUnavailable,
    decode_outcome,
    encode_outcome,
    entry_id,
    instance_of,
    parse_entry_id,
)
from ._spec import AdmissionPolicy

# An Enum member's ``value`` is a Python-level descriptor call in CPython 3.11; a submit
# reads it once per call (benchmark 10, the 3x50 callers rows).
_POLICY_VALUES: Final = {policy: policy.value for policy in AdmissionPolicy}


@attrs.frozen
class KeeperStatistics:
    """Counters of one keeper (for tests and benchmarks)."""

    round_trips: int
    available: bool
    leases: int
    queued: int
    follows: int


# -- the connection seam -------------------------------------------------------------------

Call: TypeAlias = tuple[str, scripts.Args]
"""One call of a round trip: a script name with its own arguments, or ``RUN_ID``/``BYE``."""

RUN_ID: Final = "run_id"
"""The call that reads the server's ``run_id`` (its reply is the id, a ``str``)."""

BYE: Final = "bye"
"""The call that deletes this process's heartbeat (``args`` = the instance id)."""

WAIT: Final = "wait"
"""The call that waits for replicas to acknowledge the round trip's writes (``args`` =
the replicas wanted and the timeout in ms; its reply is the number that acknowledged).
It ends a pipeline: never inside a script or ``MULTI``, where it does not wait."""

REPLICAS: Final = "replicas"
"""The call that reads how many replicas the server has connected and in sync (an int)."""


class ReplicaShortfall(Exception):
    """Fewer replicas than ``replicas_ack`` are connected, or acknowledged a round trip
    (the keeper's own error: the server answered, without enough replicas behind it)."""


class Connection(Protocol):
    """One session with the server, as the keeper uses it (a seam: tests give fakes)."""

    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        """Send ``calls`` in one pipeline; return one reply per call, in order.

        A call that fails on the server has an ``Exception`` as its reply; a broken
        connection raises. Not bounded by itself: the keeper bounds every call.
        """
        ...

    def send_nowait(self, calls: Sequence[Call]) -> bool:
        """Start the round trip of ``calls`` now, in the caller's task, when the socket of
        the round trips is open and takes the bytes without waiting; return whether it
        did (``False``: nothing was written, ``round_trip`` sends them). Its replies are
        ``replies(calls)``, before any other call."""
        ...

    async def replies(self, calls: Sequence[Call]) -> list[object]:
        """The replies of ``calls``, whose round trip ``send_nowait`` started, as
        ``round_trip`` returns them (with the rest of the bytes written first)."""
        ...

    async def subscribe(
        self, channel: str, deliver: Callable[[str], None], subscribed: Callable[[], None]
    ) -> None:
        """Subscribe to ``channel``, call ``subscribed()`` once the server confirmed it,
        then ``deliver`` every message; return or raise when the subscription ends."""
        ...


class ServerClient(Protocol):
    """The server's client library, as the keeper uses it (``_redis_client.RedisClient``
    over coredis; the keeper itself imports no client library)."""

    def connect(self) -> AbstractAsyncContextManager[Connection]:
        """Open one fresh ``Connection``; the keeper opens one after every outage."""
        ...

    def refuses_calls(self, error: Exception) -> bool:
        """Whether an error reply refuses the keeper's calls as such (permissions, a
        Redis Cluster node, a read-only replica, unknown commands), not one call's data."""
        ...

    def refusal(self, error: Exception, asked: str) -> str:
        """What went wrong, from the client's ``error`` (``asked``: what the server was
        asked): what the server refused, or why it was not reached."""
        ...

    def may_pass(self, error: Exception) -> bool:
        """Whether a failure may pass by itself (no connection, a server that takes no
        call for now), not a refusal of the store's settings."""
        ...


# -- what the keeper tracks ------------------------------------------------------------------


@attrs.define(eq=False)
class _Lease:
    slot: str
    task_id: int
    token: int
    rule: LeaseDeadline
    stop_reported: bool = False


@attrs.define(eq=False)
class _Submit:
    slot: str
    task_id: int
    policy: AdmissionPolicy
    max_queue: int
    wait: bool
    deadline: float
    sent: bool = False
    resolved: bool = False


@attrs.define(eq=False)
class _Follow:
    slot: str
    target: str
    lost_since: float | None = None


# Obligations name server entry ids: a withdrawal must reach the attempt it withdraws.
# Compared by identity (``eq=False``): one the server answered with an error is known
# by its object until it works (``LeaseKeeper._failing``).
@attrs.frozen(eq=False)
class _Withdraw:
    slot: str
    eid: str
    reason: str


@attrs.frozen(eq=False)
class _Release:
    slot: str
    eid: str
    outcome: TaskOutcome[Any]


@attrs.frozen(eq=False)
class _StoreOutcome:
    eid: str
    text: str


@attrs.define(eq=False)
class _StopOwner:
    """A stop asked of the holder of ``slot``'s lease; its waiter learns the lease's fence
    token (``None``: no lease) once the server has answered."""

    slot: str
    timeout: float
    where: str
    done: trio.Event = attrs.Factory(trio.Event)
    token: int | None = None
    failed: bool = False

    async def wait(self) -> int | None:
        """Wait for the server's answer (a checkpoint); raise ``SlotStoreUnavailableError``
        if it does not come within ``timeout`` (the request is still sent afterwards)."""
        with trio.move_on_after(self.timeout):
            await self.done.wait()
            if not self.failed:
                return self.token
        raise SlotStoreUnavailableError(
            f"slot store {self.where} did not answer within {self.timeout!r} s"
        )


@attrs.frozen(eq=False)
class _LimitRelease:
    w: str
    pools: tuple[str, ...]
    withdraw: bool  # limit_withdraw (it may not have been granted) rather than release


_Obligation: TypeAlias = _Withdraw | _Release | _StoreOutcome | _StopOwner | _LimitRelease
_Owed: TypeAlias = _Withdraw | _Release | _StoreOutcome | _LimitRelease
"""The obligations sent again with each renewal when the server answers one with an
error (a ``_StopOwner``'s waiter learns of the error instead)."""


@attrs.define(eq=False)
class _Failing:
    """An item the server answered with an error, sent (or made) again with each renewal
    until it works: its last error (described) and how many sends failed."""

    error: str
    tries: int = 1


@attrs.define(eq=False)
class _LimitRequest:
    """One acquisition of limit units (an attempt's or a block's), as the keeper tracks it."""

    rid: int
    w: str  # the request's id on the server
    pools: tuple[tuple[str, str], ...]  # (pool id, settings) on the wire
    group: frozenset[str]  # its pool ids: the server's group of waiters for them
    sent: bool = False  # an acquisition is in flight or was answered
    # An acquisition was sent once: the server may hold it (a round trip that failed,
    # a replicas_ack WAIT that fell short, may have run it), so a release is owed.
    reached: bool = False
    state: str = "new"  # new, waiting, held, lost
    gen: str | None = None  # the generation it was granted in
    retry_at: float = math.inf  # when to ask again (a rate pool allows a start)
    waiting_reported: bool = False
    # Only rate pools: once granted it holds nothing (the start is spent), so it is
    # forgotten then: no release round trip, and no unit to lose.
    rate_only: bool = False


@attrs.frozen
class _LimitAcquire:
    request: _LimitRequest


@attrs.frozen
class _LimitRenewal:
    waiters: tuple[_LimitRequest, ...]
    units: tuple[_LimitRequest, ...]  # the units it names (held)
    rebase: bool = False  # a rebase: it moves them


@attrs.define(eq=False)
class _LimitQuery:
    pool: str
    done: trio.Event = attrs.Factory(trio.Event)
    result: scripts.PoolReply | None = None
    failed: bool = False
    error: tuple[str, Exception] | None = None
    abandoned: bool = False


class LimitSink(Protocol):
    """Who learns what became of the keeper's limit requests (the registry's units).

    Called from the keeper's tasks, synchronously; never blocks.
    """

    def limit_granted(self, rid: int) -> None:
        """The request's units are held now (a concurrency unit until released)."""

    def limit_waiting(self, rid: int, blocked: tuple[PoolId, ...]) -> None:
        """The request waits on the server; ``blocked``: its pools without room."""

    def limit_refused(self, rid: int, error: ConfigError | SlotStoreUnavailableError) -> None:
        """Nothing is held, nor will be: the server knows a pool with other settings
        (``ConfigError``), or answered the request with an error."""

    def limit_lost(self, rid: int) -> None:
        """The request's units could not be renewed in time: they count as lost."""


def _wire_pool(ident: PoolId) -> str:
    return scripts.pool_wire_id(*ident)


def _pool_of(wire: str) -> PoolId:
    name, space, key = wire.partition(" ")
    return (name, key if space else None)


def _spec_of(limit: Limit) -> str:
    if isinstance(limit, ConcurrencyLimit):
        return scripts.spec_text("concurrency", limit.capacity, 0, 0.0, 0)
    return scripts.spec_text("rate", 0, limit.rate, limit.per, limit.burst)


def _other_settings(pool: str, known: str, ours: str) -> ConfigError:
    """The server knows ``pool`` (its wire id) with the settings ``known``, not ``ours``."""
    return ConfigError(
        f"limit {pool_label(_pool_of(pool))!r} is used across the cluster "
        f"with other settings: {known}, got {ours}"
    )


@attrs.define(eq=False)
class _Query:
    slot: str
    done: trio.Event = attrs.Factory(trio.Event)
    result: ClusterSlotInfo | None = None
    failed: bool = False
    error: tuple[str, Exception] | None = None  # the server's refusal, if it answered
    abandoned: bool = False


@attrs.frozen
class _Claim:
    slot: str
    task_id: int


@attrs.frozen
class _Renewal:
    leases: tuple[_Lease, ...]
    queued: tuple[tuple[str, int], ...]
    follows: tuple[tuple[int, _Follow], ...]


@attrs.frozen
class _Bye:
    pass


@attrs.frozen
class _Wait:
    """The ``WAIT`` that ends a round trip which changes the store."""

    replicas: int
    timeout: float


_Part: TypeAlias = (
    str
    | _Renewal
    | _Obligation
    | _Claim
    | _Submit
    | _Query
    | _Bye
    | _LimitAcquire
    | _LimitRenewal
    | _LimitQuery
    | _Wait
)


class _Batch:
    """The calls of one round trip, with what each call is for."""

    __slots__ = ("calls", "parts", "renews")

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.parts: list[_Part] = []
        self.renews = False

    def add(self, part: _Part, call: Call) -> None:
        self.parts.append(part)
        self.calls.append(call)

    def seal(self, replicas: int, timeout: float) -> None:
        """End the batch with a ``WAIT`` for ``replicas`` if any call in it may change
        the store. Reads (the ``run_id``, queries of slots and pools) need none, and
        neither does the goodbye alone: a heartbeat lost in a failover expires by itself."""
        if replicas and any(
            not isinstance(p, str | _Query | _LimitQuery | _Bye) for p in self.parts
        ):
            ms = max(1, round(timeout * 1000))
            self.add(_Wait(replicas, timeout), (WAIT, (str(replicas), str(ms))))


class _Wakeup:
    """A flag one task waits on: ``set`` wakes it, or makes its next ``wait`` return."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


def _rejection_kind(reason: str) -> RejectionKind:
    try:
        return RejectionKind(reason)
    except ValueError:
        return RejectionKind.STORE_UNAVAILABLE


def _gone(marker: str) -> tuple[RejectionKind, str | None]:
    """The rejection and reason of an entry's ``gone`` marker: a ``RejectionKind`` value,
    or ``<value>: <reason>`` (a withdrawal of an entry refused for foreign data names the
    key, so that the entry's joiners end as the entry did). Earlier versions read the
    second as ``STORE_UNAVAILABLE``, as any marker they do not know."""
    kind, said, reason = marker.partition(": ")
    if not said:
        return _rejection_kind(marker), None
    return _rejection_kind(kind), reason or None


# -- the keeper ---------------------------------------------------------------------------------


class LeaseKeeper:
    """All server I/O of one supervisor's cluster slots; see the module docstring.

    ``task_id`` arguments are the local ``TaskId`` values; the keeper builds the server's
    entry ids from them and ``instance_id`` (``_slotstore.entry_id``). Build it anywhere;
    run it with ``await nursery.start(keeper.run)``; stop it with ``await keeper.aclose()``.
    """

    def __init__(
        self,
        store: RedisSlotStore,
        instance_id: str,
        reports: ReportSink,
        client: ServerClient,
    ) -> None:
        self.store = store
        self.instance_id = instance_id
        self._reports = reports
        self._client = client
        self._channel = f"{store.key_prefix}ch:{instance_id}"
        self._interval = store.lease_ttl / 3
        # what the server holds for this process, as far as the keeper knows
        self._leases: dict[int, _Lease] = {}
        # slot -> entries, oldest first -> when the last round trip that found the entry
        # queued was sent (no later than any grant of it since), or None once a renewal
        # re-submitted it (a grant message may then be of its earlier place) or a grant
        # came too late to trust (each grant is confirmed by a claim)
        self._queued: dict[str, dict[int, float | None]] = {}
        self._queued_slot: dict[int, str] = {}
        self._follows: dict[int, _Follow] = {}
        self._watched: set[str] = set()
        self._attempts: dict[int, int] = {}  # entries on their second or later attempt
        self._lost: dict[int, str] = {}  # entries whose lease was lost, until released
        # work to send
        self._submits: dict[int, _Submit] = {}  # unresolved, in arrival order
        self._obligations: deque[_Obligation] = deque()
        self._claims: dict[int, str] = {}
        # Slots woken while a submit to them was in flight: the message (on the
        # subscription's connection) can overtake the reply that queues the entry.
        self._early_wakes: set[str] = set()
        self._early_grants: dict[int, int] = {}  # task id -> token, likewise
        self._retry_at: dict[str, float] = {}
        self._queries: list[_Query] = []
        self._renew_now = False
        self._next_renewal = -math.inf
        # connection state
        self._conn: Connection | None = None
        self._conn_scope: trio.CancelScope | None = None
        self._sub_scope: trio.CancelScope | None = None
        self._run_id: str | None = None
        self._available = False
        self._started = False
        self._closing = False
        self._running = False
        self._stopped = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._io_scope: trio.CancelScope | None = None
        self._cut = False  # cut_drain() ended the drain
        self._io_wakeup = _Wakeup()
        # The I/O loop waits for work (connected, not closing): a request may start its
        # round trip at once, in the caller's task (``_send_now``), leaving the batch
        # in ``_ready`` (and whether it was written) for the loop to finish.
        self._idle = False
        self._ready: tuple[_Batch, float, bool] | None = None
        self._timer_wakeup = _Wakeup()
        # When the timer task wakes next on its own (-inf: it has not looked yet).
        self._timers_at = -math.inf
        self._round_trips = 0
        self._quiet = False  # failures after the first of an outage log at DEBUG
        # What the server was asked and the client's error, of the last connection
        # attempt (or call) that failed with one: named by SlotStoreUnavailableError.
        self._error: tuple[str, Exception] | None = None
        self._backoff = 0.0  # the pause before the next reconnection attempt
        self._recovered_at = -math.inf
        self._secrets = secrets_of(store.url)
        # limit pools: requests by their local id, and by their server id
        self.limit_sink: LimitSink | None = None
        self._limits: dict[int, _LimitRequest] = {}
        self._limit_ids: dict[str, int] = {}
        self._limit_numbers = 0
        self._limit_queries: list[_LimitQuery] = []
        # The live generation of this process's units, and the sending time of the last
        # round trip whose reply showed it: every unit of it is held until
        # ``0.8 * lease_ttl`` after that sending (the server renewed it no earlier).
        self._gen: str | None = None
        self._gen_at = -math.inf
        # The server changed (a new run_id): the next renewal moves the units this
        # process holds to a new generation, so units it gave back that the new server
        # still counts (a failover, a restart from an older copy) die with the old one.
        self._limit_rebase = False
        # Obligations that the server answered with an error (a script that failed,
        # keeping what it wrote): sent again with the next renewal, not at once.
        self._owed: list[_Owed] = []
        # What failed so, until it works (the limit renewal by its script's name): its
        # error is logged at ERROR once, and again only when it changes.
        self._failing: dict[_Owed | str, _Failing] = {}

    def __repr__(self) -> str:
        return f"<LeaseKeeper {self.instance_id} {self.store!r}>"

    def statistics(self) -> KeeperStatistics:
        """Counters: round trips so far, availability, what is tracked."""
        return KeeperStatistics(
            self._round_trips,
            self._available,
            len(self._leases),
            len(self._queued_slot),
            len(self._follows),
        )

    # -- requests (never block) ---------------------------------------------------------------

    def submit(
        self, slot: str, task_id: int, policy: AdmissionPolicy, max_queue: int, wait: bool
    ) -> None:
        """Ask the server to place ``entry`` in ``slot``: one report answers it
        (``Owner``, ``Queued``, ``Joined``, ``Rejected`` or ``Full``) within
        ``connect_timeout``. While the store is unavailable, at once."""
        if self._closing:
            self._reject(slot, task_id, RejectionKind.SHUTTING_DOWN)
            return
        if not self._available:
            self._report(self._failure_report(slot, task_id, wait))
            return
        deadline = trio.current_time() + self.store.connect_timeout
        self._submits[task_id] = _Submit(slot, task_id, policy, max_queue, wait, deadline)
        self._wake_timers(deadline)
        self._io_wakeup.set()

    def withdraw(self, slot: str, task_id: int, reason: RejectionKind) -> None:
        """Take ``task_id`` out of the cluster (its queue entry, or a lease it holds), for
        ``reason``; no report. Sent until the server acknowledges it."""
        submit = self._submits.pop(task_id, None)
        if submit is not None:
            self._resolve_submit(submit)
            if not submit.sent:
                return  # the server never saw it
        self._dequeue(task_id)
        self._claims.pop(task_id, None)
        self._leases.pop(task_id, None)
        self._lost.pop(task_id, None)
        self._oblige(_Withdraw(slot, self._eid(task_id), reason.value))
        self._attempts.pop(task_id, None)

    def release(self, slot: str, task_id: int, outcome: TaskOutcome[Any]) -> None:
        """Give back the lease of ``entry`` after its owner physically exited (also after
        ``LeaseLost``); ``outcome`` is encoded only if other processes follow it."""
        self._leases.pop(task_id, None)
        self._lost.pop(task_id, None)
        self._oblige(_Release(slot, self._eid(task_id), outcome))
        self._attempts.pop(task_id, None)

    def follow(self, joiner: int, slot: str, target: str) -> None:
        """Report ``FollowedOutcome(joiner, ...)`` once ``target`` (an entry id of another
        process) has an outcome, or is lost."""
        self._follows[joiner] = _Follow(slot, target)
        self._renew_now = True  # the target may have ended before this call
        self._io_wakeup.set()

    def unfollow(self, joiner: int) -> None:
        """Stop following for ``joiner``; no report."""
        self._follows.pop(joiner, None)

    def lease_lost(self, task_id: int) -> str | None:
        """Why the lease of ``entry`` counts as lost now, or ``None`` while it is held (or
        ``entry`` has none). Checks the lease's deadline at the call, so the answer holds
        even before the timer that reports ``LeaseLost`` has run; a loss found here is
        reported too. Never blocks."""
        lease = self._leases.get(task_id)
        if lease is None:
            return self._lost.get(task_id)
        reason = lease.rule.check(trio.current_time())
        if reason is not None:
            self._lose(lease, reason)
        return reason

    def stop_owner(self, slot: str) -> _StopOwner:
        """Ask the process holding ``slot``'s lease to stop its owner (once per lease), as
        a REPLACE does; sent until the server acknowledges it. ``await request.wait()``
        gives the fence token of the lease asked to stop (``None``: the slot had none)."""
        request = _StopOwner(slot, self.store.connect_timeout, self.store.safe_url)
        if self._stopped.is_set():
            request.failed = True
            request.done.set()
        else:
            self._oblige(request)
        return request

    # -- limit pools (the registry's units; never block) ----------------------------------------

    def limit_acquire(self, rid: int, pools: tuple[tuple[PoolId, Limit], ...]) -> None:
        """Ask for one unit of every pool at once; the ``limit_sink`` learns the answer.

        Sent in the next round trip, and again after an outage (the acquisition is
        idempotent) until answered; while the store is unavailable, nothing is granted.
        """
        self._limit_numbers += 1
        w = f"{self.instance_id}/l{self._limit_numbers}"
        wire = tuple((_wire_pool(ident), _spec_of(limit)) for ident, limit in pools)
        rate_only = not any(isinstance(limit, ConcurrencyLimit) for _, limit in pools)
        group = frozenset(pid for pid, _ in wire)
        self._limits[rid] = _LimitRequest(rid, w, wire, group, rate_only=rate_only)
        self._limit_ids[w] = rid
        self._io_wakeup.set()

    def limit_release(self, rid: int) -> None:
        """Give back a request's units (or withdraw it while it waits); no report. Sent
        until the server acknowledges it."""
        request = self._limits.get(rid)
        if request is None:
            return
        self._limit_forget(request)
        if request.reached:
            pools = tuple(pid for pid, _ in request.pools)
            self._oblige(_LimitRelease(request.w, pools, request.state != "held"))

    async def limit_query(self, ident: PoolId, limit: Limit) -> scripts.PoolReply:
        """Ask the server about one pool of ``limit``; wait for the answer (always a
        checkpoint).

        Raises ``SlotStoreUnavailableError`` when the server does not answer within
        ``connect_timeout``, ``ConfigError`` when the cluster uses the pool with other
        settings (its answer would be about another pool than the one asked about).
        """
        if self._closing or not self._running:
            await trio.lowlevel.checkpoint()
            raise SlotStoreUnavailableError(f"slot store {self.store.safe_url} is closed")
        query = _LimitQuery(_wire_pool(ident))
        self._limit_queries.append(query)
        self._io_wakeup.set()
        with trio.move_on_after(self.store.connect_timeout):
            await query.done.wait()
            reply = query.result
            if not query.failed and reply is not None:
                ours = _spec_of(limit)
                if reply.spec is not None and reply.spec != ours:
                    raise _other_settings(query.pool, reply.spec, ours)
                return reply
        query.abandoned = True
        error = query.error or (None if self._available else self._error)
        message, cause = self._unavailable(error)
        raise SlotStoreUnavailableError(message) from cause

    def _limit_batch(self, batch: _Batch, *, renew: bool) -> None:
        """Add the limit calls: the renewal's (with the slots' renewal), acquisitions."""
        if renew and self._limits:
            waiters = tuple(r for r in self._limits.values() if r.state == "waiting")
            items = [(r.w, r.pools) for r in waiters]
            units = {
                r: tuple(pid for pid, spec in r.pools if spec.startswith("concurrency"))
                for r in self._limits.values()
                if r.state == "held"
            }
            # the server's keys of the pools this process holds units of live on with
            # them, and the server says which units it no longer counts (lost)
            held: dict[str, list[str]] = {}
            for r, pids in units.items():
                for pid in pids:
                    held.setdefault(pid, []).append(r.w)
            rebase = None
            if self._limit_rebase:
                rebase = [(r.w, pids) for r, pids in units.items()]
            args = scripts.limit_renew_args(self.instance_id, items, held.items(), rebase)
            renewal = _LimitRenewal(waiters, tuple(units), rebase is not None)
            batch.add(renewal, (scripts.LIMIT_RENEW.name, args))
        if not self._closing:
            now = trio.current_time()
            asked = [request for request in self._limits.values() if not request.sent]
            asked += [r for r in self._pollers() if r.sent and now >= r.retry_at]
            for request in asked:
                request.sent = request.reached = True
                request.retry_at = math.inf
                args = scripts.limit_acquire_args(self.instance_id, request.w, request.pools)
                batch.add(_LimitAcquire(request), (scripts.LIMIT_ACQUIRE.name, args))
        for query in self._limit_queries:
            batch.add(query, (scripts.CLUSTER_LIMIT.name, (query.pool,)))
        self._limit_queries.clear()

    def _limit_reply(self, request: _LimitRequest, reply: scripts.LimitReply) -> None:
        if self._limits.get(request.rid) is not request or request.state in ("held", "lost"):
            return  # released meanwhile, or already granted by a message
        sink = self.limit_sink
        match reply.kind:
            case "granted":
                late = not request.rate_only and self._too_late(self._gen_at)
                if reply.gen != self._gen or late:
                    # Learn when its generation was renewed: the renewal asks again for
                    # it as a waiter, and its answer comes with a fresh deadline.
                    request.state = "waiting"
                    self._renew_now = True
                    self._io_wakeup.set()
                    return
                if request.rate_only:
                    self._limit_forget(request)
                else:
                    request.state, request.gen = "held", reply.gen
                    self._wake_timers()
                if sink is not None:
                    sink.limit_granted(request.rid)
            case "waiting":
                request.state = "waiting"
                if reply.retry is not None:
                    request.retry_at = trio.current_time() + reply.retry + 0.001
                    self._wake_timers()
                if not request.waiting_reported and sink is not None:
                    request.waiting_reported = True
                    sink.limit_waiting(request.rid, tuple(map(_pool_of, reply.blocked)))
            case "conflict":
                self._limit_forget(request)
                if sink is not None:
                    pool = str(reply.pool)
                    ours = next(spec for pid, spec in request.pools if pid == pool)
                    sink.limit_refused(request.rid, _other_settings(pool, str(reply.known), ours))
            case "gone":
                pass  # withdrawn: the registry no longer waits for it
            case "foreign":
                # a renewal's waiter of a pool whose holders key is foreign data: refused,
                # as an acquisition the server answers with an error is
                self._limit_forget(request)
                why = self._foreign_at(str(reply.what))
                log(logging.ERROR, "slot store limit renewal of a waiter refused: %s", why)
                if sink is not None:
                    labels = ", ".join(repr(pool_label(_pool_of(pid))) for pid, _ in request.pools)
                    message = (
                        f"slot store {self.store.safe_url} refused the units of {labels}: {why}"
                    )
                    sink.limit_refused(request.rid, SlotStoreUnavailableError(message))

    def _limit_gen(self, gen: str | None, sent_at: float) -> None:
        """A reply showed the live generation of this process's units (``None``: none).
        Not while a rebase is due: a new server's may be another (after two changes of
        server, a copy's may be an older one), and the rebase tells which units it
        holds."""
        if gen is None or self._limit_rebase:
            return
        if gen != self._gen:
            self._gen, self._gen_at = gen, sent_at
            for request in list(self._limits.values()):
                if request.state == "held" and request.gen != gen:
                    self._limit_lose(request)  # its generation expired on the server
        else:
            self._gen_at = max(self._gen_at, sent_at)
        self._wake_timers()

    def _limit_lose(self, request: _LimitRequest) -> None:
        request.state = "lost"
        if self.limit_sink is not None:
            self.limit_sink.limit_lost(request.rid)

    def _limit_forget(self, request: _LimitRequest) -> None:
        """Forget ``request`` (given back, refused, or its rate pools' start granted);
        one that waited has the timers look again: the next oldest of its pools polls
        (``_pollers``)."""
        del self._limits[request.rid]
        del self._limit_ids[request.w]
        if request.state == "waiting":
            self._wake_timers()

    def _pollers(self) -> Iterator[_LimitRequest]:
        """The waiters that ask again when their rate pool allows a start (a poll): the
        oldest of each set of pools. Only the head of the server's group of waiters for
        a set of pools can be granted, and a poll grants whoever of the group is first
        across the cluster: a poll of each waiter was a round trip each that granted
        nothing more (with N waiters, N calls per start)."""
        polled: set[frozenset[str]] = set()
        for request in self._limits.values():
            if request.state == "waiting" and request.group not in polled:
                polled.add(request.group)
                yield request

    def _limit_timers(self, now: float) -> float:
        """Lose units whose generation was not renewed in time; ask again for waiters
        whose rate pool allows a start. Return the next time to look."""
        next_at = math.inf
        deadline = self._gen_at + LOST_LEASE_FRACTION * self.store.lease_ttl
        for request in list(self._limits.values()):
            if request.state == "held":
                if now >= deadline:
                    self._limit_lose(request)
                else:
                    next_at = min(next_at, deadline)
        for request in self._pollers():
            if now >= request.retry_at:
                self._io_wakeup.set()
            elif request.retry_at < math.inf:
                next_at = min(next_at, request.retry_at)
        return next_at

    async def query(self, slot: str) -> ClusterSlotInfo | None:
        """Ask the server about ``slot``; wait for the answer (always a checkpoint).

        ``None`` when the slot has no lease and no live entry. Raises
        ``SlotStoreUnavailableError`` when the server does not answer within
        ``connect_timeout`` (the keeper waits for a reconnection meanwhile).
        """
        if self._closing or not self._running:
            await trio.lowlevel.checkpoint()
            raise SlotStoreUnavailableError(f"slot store {self.store.safe_url} is closed")
        query = _Query(slot)
        self._queries.append(query)
        self._io_wakeup.set()
        with trio.move_on_after(self.store.connect_timeout):
            await query.done.wait()
            if not query.failed:
                return query.result
        query.abandoned = True
        error = query.error or (None if self._available else self._error)
        message, cause = self._unavailable(error)
        raise SlotStoreUnavailableError(message) from cause

    def close(self) -> None:
        """Start the drain: pending submits are rejected ``SHUTTING_DOWN``, obligations
        are flushed, the heartbeat deleted, the connection closed. Never blocks."""
        if self._closing:
            return
        self._closing = True
        for submit in list(self._submits.values()):
            self._resolve_submit(submit)
            if submit.sent:
                self._oblige(_Withdraw(submit.slot, self._eid(submit.task_id), "shutting_down"))
            self._reject(submit.slot, submit.task_id, RejectionKind.SHUTTING_DOWN)
        self._claims.clear()
        self._retry_at.clear()
        self._obligations.extend(self._owed)  # once more, in the drain
        self._owed.clear()
        if self._io_scope is not None:
            drain_deadline = trio.current_time() + self.store.connect_timeout
            self._io_scope.deadline = min(self._io_scope.deadline, drain_deadline)
            if not self._available:
                # The shutdown's one wait a user could not account for.
                log(
                    logging.WARNING,
                    "slot store %s is unavailable: the shutdown waits up to %g s "
                    "(connect_timeout) for it to take back the leases and units of this "
                    "process; what it does not take back expires within lease_ttl",
                    self.store.safe_url,
                    self.store.connect_timeout,
                )
        self._io_wakeup.set()

    def cut_drain(self) -> None:
        """Stop the drain ``close()`` began, now (a signal during it): the server is not
        waited for. Leases and units this process did not give back yet expire on the
        server within ``lease_ttl``, as after a crash. Before the drain, nothing: the
        owners' releases, which come as they exit, are still sent."""
        scope = self._io_scope
        if self._closing and self._running and scope is not None and not scope.cancel_called:
            log(
                logging.WARNING,
                "slot store %s: the shutdown was forced before the store was told: leases "
                "and units this process did not give back expire within lease_ttl",
                self.store.safe_url,
            )
            self._cut = True
            scope.cancel(reason="the shutdown was forced")

    async def aclose(self) -> None:
        """``close()``, then wait until the keeper has stopped: at most
        ``connect_timeout`` for the server, plus the connection's teardown. Shielded."""
        self.close()
        with trio.CancelScope(shield=True):
            if self._running:
                await self._stopped.wait()
            else:
                await trio.lowlevel.checkpoint()

    # -- the task ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, renew (the first heartbeat) and subscribe within ``connect_timeout``,
        else raise ``SlotStoreUnavailableError``; then report ``started`` and keep the
        leases until ``close()``'s drain ends."""
        if self._running or self._stopped.is_set():
            raise RuntimeError("a LeaseKeeper runs once")
        self._running = True
        connected = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                with trio.move_on_after(self.store.connect_timeout):
                    connected = await self._first_connect()
                if connected:
                    self._available = self._started = True
                    self._quiet = False
                    nursery.start_soon(self._timers)
                    task_status.started()
                    with trio.CancelScope() as self._io_scope:
                        if self._closing:  # closed before it started
                            self._io_scope.deadline = (
                                trio.current_time() + self.store.connect_timeout
                            )
                        await self._io_loop()
                    if self._io_scope.cancelled_caught and not self._cut:
                        log(
                            logging.WARNING,
                            "slot store %s did not take back the leases and units of this "
                            "process within %g s (connect_timeout) of the shutdown: they "
                            "expire within lease_ttl",
                            self.store.safe_url,
                            self.store.connect_timeout,
                        )
                nursery.cancel_scope.cancel(reason="lease keeper stopped")
        finally:
            self._running = False
            self._available = False
            for obligation in self._obligations:
                if isinstance(obligation, _StopOwner):  # never sent: its waiter learns it
                    obligation.failed = True
                    obligation.done.set()
            self._stopped.set()
        if not connected:
            message, cause = self._unavailable(self._error)
            raise SlotStoreUnavailableError(message) from cause

    def _unavailable(self, error: tuple[str, Exception] | None) -> tuple[str, Exception | None]:
        """The text of a ``SlotStoreUnavailableError``, and its cause: what the server
        refused and the client's error, or silence (no error) for ``connect_timeout``."""
        url = self.store.safe_url
        if error is None:
            return f"slot store {url} did not answer within {self.store.connect_timeout!r} s", None
        asked, exc = error
        if isinstance(exc, ReplicaShortfall):
            return f"slot store {url} {exc}", None
        what = self._client.refusal(exc, asked)
        return f"slot store {url} {what}: {self._describe(exc)}", exc

    async def _io_loop(self) -> None:
        bye_sent = False
        while True:
            if self._ready is not None:
                batch, sent_at, written = self._ready
                self._ready = None
                await self._round_trip(batch, self._bound(batch, sent_at), sent_at, written)
                continue
            if not self._available:
                if self._closing and not self._obligations:
                    return  # nothing to flush; the heartbeat expires by itself
                await self._recover()
                continue
            now = trio.current_time()
            batch = self._take_batch(renew=self._renew_now or now >= self._next_renewal)
            if self._closing and not self._obligations and not bye_sent:
                batch.add(_Bye(), (BYE, (self.instance_id,)))
                bye_sent = True
            if batch.calls:
                await self._send(batch, self._bound(batch, now))
                continue
            if self._closing:
                return
            self._idle = True
            try:
                with trio.move_on_at(self._next_renewal):
                    await self._io_wakeup.wait()
            finally:
                self._idle = False

    def _send_now(self) -> None:
        """The I/O loop waits for work: start its next round trip here, in the caller's
        task. Woken, the loop would send it only at its next step, after whatever else
        that scheduler pass runs first (in a releasing process, the task that awaited
        the owner's outcome, often with a submit to add): benchmark 10, the hand-over
        rows. The loop reads the replies; renewals, an outage and the drain stay its."""
        conn, now = self._conn, trio.current_time()
        if (
            conn is None
            or not self._available
            or self._closing
            or self._renew_now
            or now >= self._next_renewal
        ):
            return
        self._idle = False
        batch = self._take_batch(renew=False)
        batch.seal(self.store.replicas_ack, self.store.ack_timeout)
        self._ready = (batch, now, conn.send_nowait(batch.calls))

    def _take_batch(self, *, renew: bool) -> _Batch:
        batch = _Batch()
        if renew:
            self._renew_now = False
            batch.renews = True
            renewal = _Renewal(
                tuple(self._leases.values()),
                tuple((slot, e) for slot, task_ids in self._queued.items() for e in task_ids),
                tuple(self._follows.items()),
            )
            batch.add(RUN_ID, (RUN_ID, ()))
            args = scripts.renew_args(
                self.instance_id,
                [(lease.slot, self._eid(lease.task_id)) for lease in renewal.leases],
                [(slot, self._eid(e)) for slot, e in renewal.queued],
                [(follow.slot, follow.target) for _, follow in renewal.follows],
            )
            batch.add(renewal, (scripts.RENEW.name, args))
            for owed in self._owed:  # what the server answered with an error: again
                batch.add(owed, self._obligation_call(owed))
            self._owed.clear()
        while self._obligations:
            obligation = self._obligations.popleft()
            batch.add(obligation, self._obligation_call(obligation))
        if not self._closing:
            for task_id, slot in self._claims.items():
                batch.add(_Claim(slot, task_id), (scripts.CLAIM.name, (slot, self._eid(task_id))))
            self._claims.clear()
            for submit in self._submits.values():
                if not submit.sent:
                    submit.sent = True
                    args = scripts.submit_args(
                        submit.slot,
                        self._eid(submit.task_id),
                        _POLICY_VALUES[submit.policy],
                        submit.max_queue,
                        submit.wait,
                    )
                    batch.add(submit, (scripts.SUBMIT.name, args))
        for query in self._queries:
            batch.add(query, (scripts.CLUSTER_SLOT.name, (query.slot,)))
        self._queries.clear()
        self._limit_batch(batch, renew=renew)
        return batch

    def _obligation_call(self, obligation: _Obligation) -> Call:
        match obligation:
            case _Withdraw(slot, eid, reason):
                return (scripts.WITHDRAW.name, (slot, eid, reason))
            case _Release(slot, eid, _):
                return (scripts.RELEASE.name, (slot, eid, ""))
            case _StoreOutcome(eid, text):
                return (scripts.STORE_OUTCOME.name, (eid, text))
            case _StopOwner():
                return (scripts.STOP_OWNER.name, (obligation.slot, self.instance_id))
            case _LimitRelease(w, pools, withdraw):
                script = scripts.LIMIT_WITHDRAW if withdraw else scripts.LIMIT_RELEASE
                return (script.name, scripts.limit_release_args(w, pools))

    def _bound(self, batch: _Batch, now: float) -> float:
        """How long a round trip may take before it counts as failed: ``connect_timeout``
        for requests, a probe's ``lease_ttl / 3`` for a renewal, or longer while the
        earliest lease deadline is further away."""
        bound = self.store.connect_timeout
        if batch.renews:
            earliest = min((lease.rule.deadline for lease in self._leases.values()), default=now)
            bound = min(bound, max(self._interval, earliest - now))
        return bound

    async def _send(self, batch: _Batch, bound: float) -> bool:
        """Run one round trip of ``batch``, bounded; handle its replies or its failure.
        Return whether it worked: replies came, and the server did not refuse the
        renewal or the scripts (an error reply to them is a failure, not a reply)."""
        batch.seal(self.store.replicas_ack, self.store.ack_timeout)
        return await self._round_trip(batch, bound, trio.current_time(), written=False)

    async def _round_trip(self, batch: _Batch, bound: float, sent_at: float, written: bool) -> bool:
        """``_send`` of a sealed batch, sent at ``sent_at`` (``written``: its round trip
        was started by ``send_nowait``)."""
        conn = self._conn
        self._round_trips += 1
        replies: list[object] | None = None
        why = "a round trip failed"
        if conn is not None:
            with trio.move_on_after(bound) as scope:
                try:
                    if written:
                        replies = await conn.replies(batch.calls)
                    else:
                        replies = await conn.round_trip(batch.calls)
                except BaseException as exc:
                    self._contain(exc, "a round trip to the slot store failed", "the connection")
            if scope.cancelled_caught:
                why = f"it did not answer within {bound:.3g} s"  # 0.000333, not 0.0
        if replies is None or len(replies) != len(batch.calls):
            self._batch_failed(batch, why)
            return False
        return self._batch_done(batch, replies, sent_at)

    # -- replies ------------------------------------------------------------------------------

    def _batch_done(self, batch: _Batch, replies: list[object], sent_at: float) -> bool:
        """Handle the replies; return ``False`` when the server refused the renewal, or
        refused the scripts: then the batch is handled as a failed round trip (an
        outage; the obligations are sent again), and ``self._error`` names the refusal."""
        for part, reply in zip(batch.parts, replies, strict=True):
            if isinstance(reply, Exception) and (
                isinstance(part, str | _Renewal | _Wait) or self._client.refuses_calls(reply)
            ):
                asked = _asked(part)
                self._error = (asked, reply)
                if not self._available:  # while reconnecting: logged as any failed attempt
                    self._log_failure(f"the slot store refused {asked}", reply)
                self._batch_failed(batch, f"it refused {asked}: {self._describe(reply)}")
                return False
        wait = batch.parts[-1]
        if isinstance(wait, _Wait) and cast("int", replies[-1]) < wait.replicas:
            # Not replicated: a failover could lose every write of this round trip, so
            # none of its replies is acted on (grants are given back, renewals do not
            # count) as if the round trip had failed.
            shortfall = ReplicaShortfall(
                f"needs {wait.replicas} replicas to acknowledge, {replies[-1]} did within "
                f"{wait.timeout!r} s"
            )
            self._error = (_asked(wait), shortfall)
            if not self._available:
                self._log_failure("the slot store's replicas fell short", shortfall)
            self._batch_failed(batch, str(shortfall))
            return False
        restarted = False
        for part, reply in zip(batch.parts, replies, strict=True):
            if isinstance(reply, Exception):
                self._call_failed(part, reply)
                continue
            if self._failing and isinstance(part, _Owed):
                self._worked(part)
            if isinstance(
                part, _Submit | _Claim | _Release | _Withdraw | _StoreOutcome | _LimitAcquire
            ) and scripts.read_unowned(reply):
                reply = self._read_as_none(part, reply)
            match part:  # the parts of most batches first (benchmark 10, the 3x50 callers)
                case _Submit():
                    if not part.resolved:
                        self._submitted(part, scripts.parse_submit(reply), sent_at)
                case _Release(_, eid, outcome):
                    refused = scripts.release_refusal(reply)
                    if refused is not None:
                        why = self._foreign_at(refused)
                        log(logging.ERROR, "slot store release of %s refused: %s", eid, why)
                    if scripts.parse_release(reply) == "need_outcome":
                        self._oblige(_StoreOutcome(eid, encode_outcome(outcome)))
                case str():  # RUN_ID
                    restarted = self._run_id is not None and reply != self._run_id
                    self._run_id = str(reply)
                    if restarted and self._gen is not None:
                        self._limit_rebase = self._renew_now = True
                case _Renewal():
                    self._renewed(part, scripts.parse_renew(reply), sent_at)
                case _StopOwner():
                    part.token = scripts.parse_stop_owner(reply)
                    part.done.set()
                case _LimitRelease(w):
                    for what in scripts.limit_release_unowned(reply):
                        why = self._foreign_at(what)
                        log(
                            logging.ERROR, "slot store limit release of %s read as none: %s", w, why
                        )
                case _Withdraw() | _StoreOutcome() | _Bye() | _Wait():
                    pass
                case _LimitAcquire(request):
                    reply_ = scripts.parse_limit(reply)
                    self._limit_gen(reply_.gen, sent_at)
                    self._limit_reply(request, reply_)
                case _LimitRenewal(waiters, units, rebase):
                    if self._failing:
                        self._worked(scripts.LIMIT_RENEW.name)
                    renewed = scripts.parse_limit_renew(reply)
                    for what in renewed.foreign:
                        why = self._foreign_at(what)
                        log(logging.ERROR, "slot store limit renewal: units lost to %s", why)
                    named = {*renewed.foreign, *(item.what for item in renewed.waiters)}
                    for what in dict.fromkeys(renewed.unowned):
                        if what not in named:  # (no waiter of its own was refused for it)
                            why = self._foreign_at(what)
                            log(logging.ERROR, "slot store limit renewal read as none: %s", why)
                    if rebase:
                        self._limit_rebase = False
                        for request in units:  # moved to the new generation
                            if request.w not in renewed.lost and request.state == "held":
                                request.gen = renewed.gen
                    elif not self._limit_rebase:  # (a new server's answer tells nothing)
                        for request in units:
                            if request.w in renewed.lost and request.state == "held":
                                self._limit_lose(request)  # the server no longer counts it
                    for request in units:
                        if request.w in renewed.lost:
                            request.reached = False  # the script gave back its units
                    for request, item in zip(waiters, renewed.waiters, strict=True):
                        if request.state == "held" and item.kind == "granted":
                            # granted by a push while this was on the wire: the server
                            # holds it in the generation of this answer (a rebase's)
                            request.gen = item.gen
                    self._limit_gen(renewed.gen, sent_at)
                    for request, item in zip(waiters, renewed.waiters, strict=True):
                        self._limit_reply(request, item)
                case _LimitQuery():
                    if not part.abandoned:
                        part.result = scripts.parse_cluster_limit(reply)
                        part.done.set()
                case _Claim(slot, task_id):
                    self._claimed(slot, task_id, scripts.parse_claim(reply), sent_at)
                case _Query():
                    if not part.abandoned:
                        part.result = self._slot_info(part.slot, reply)
                        part.done.set()
        if restarted and self._available:
            # The server lost this process's subscription with its state: open it again.
            self._mark_unavailable("the slot store restarted")
        return True

    def _read_as_none(
        self,
        part: _Submit | _Claim | _Release | _Withdraw | _StoreOutcome | _LimitAcquire,
        raw: object,
    ) -> object:
        """Log each key of foreign data that a script read as none (another process's
        heartbeat, a slot's watch key, an entry's joiners key; in an acquisition's
        settle, another pool's, group's or process's key: no item of the call owns it);
        return the script's own reply."""
        reply, unowned = scripts.reads_unowned(raw)
        if isinstance(part, _LimitAcquire):
            asked = f"limit acquisition of {part.request.w}"
        elif isinstance(part, _StoreOutcome):
            asked = f"outcome of {part.eid}"
        else:
            asked = f"{type(part).__name__.lstrip('_').lower()} of slot {part.slot!r}"
        for what in unowned:
            log(logging.ERROR, "slot store %s read as none: %s", asked, self._foreign_at(what))
        return reply

    def _call_failed(self, part: _Part, error: Exception) -> None:
        """A call the server answered with an error that is not a refusal (a bug, or
        foreign data in the namespace): the call's work is handled as failed, without an
        outage (refusals are handled by ``_batch_done``)."""
        described = self._describe(error)
        match part:
            case _Withdraw() | _Release() | _StoreOutcome() | _LimitRelease():
                # What it had not done stays undone while this process lives, else (units
                # held, a slot's lease not handed over, joiners not told): sent again with
                # the next renewal (every lease_ttl / 3: no spin), until it works.
                if self._closing:  # the drain's last try: the rest expires on the server
                    self._failed(part, described, "the shutdown does not send it again")
                    self._failing.pop(part, None)
                else:
                    self._owed.append(part)
                    self._failed(part, described, "sent again with each renewal until it works")
                return
            case _LimitRenewal():
                # As in an outage: units it did not renew are lost at their deadline, and
                # waiters wait; the next renewal asks again (as it would anyway).
                then = "made again with each renewal; meanwhile units are lost at their "
                then += "deadline and waiters wait, as while the store is unavailable"
                self._failed(scripts.LIMIT_RENEW.name, described, then)
                return
            case _:
                pass
        log(logging.ERROR, "slot store call failed (%s): %s", type(part).__name__, described)
        match part:
            case _Submit() if not part.resolved:
                self._fail_submit(part, f"slot store call failed: {described}")
            case _Query() | _LimitQuery() if not part.abandoned:
                part.failed = True
                part.error = ("the query", error)
                part.done.set()
            case _LimitAcquire(request) if (
                self._limits.get(request.rid) is request and request.state != "held"
            ):
                # (Not a waiter's poll whose error comes after a push granted it: its
                # units are held, and its block or attempt runs; refused, it was withdrawn
                # on the server while it ran, and its pool had room for one more.)
                self._limit_forget(request)
                # The script may have granted it before it failed (it keeps what it
                # wrote), and nobody would release that grant: withdraw it.
                pools = tuple(pid for pid, _ in request.pools)
                self._oblige(_LimitRelease(request.w, pools, withdraw=True))
                if self.limit_sink is not None:
                    labels = ", ".join(repr(pool_label(_pool_of(pid))) for pid, _ in request.pools)
                    message, _ = self._unavailable((f"the units of {labels}", error))
                    refusal = SlotStoreUnavailableError(message)
                    refusal.__cause__ = error
                    self.limit_sink.limit_refused(request.rid, refusal)
            case _StopOwner():
                part.failed = True
                part.done.set()
            case _:
                pass

    def _failed(self, item: _Owed | str, error: str, then: str) -> None:
        """``item`` (an obligation, or the limit renewal by its script's name) failed with
        ``error`` (described); ``then`` says what follows. Logged at ERROR the first time
        and when its error changes, else at DEBUG: a lasting error would log at every
        renewal."""
        failing = self._failing.get(item)
        if failing is None:
            self._failing[item] = _Failing(error)
        else:
            failing.tries += 1
            if failing.error == error:
                what, tries = _named(item), failing.tries
                log(logging.DEBUG, "slot store %s failed again (try %d): %s", what, tries, error)
                return
            failing.error = error
        log(logging.ERROR, "slot store %s failed: %s (%s)", _named(item), error, then)

    def _worked(self, item: _Owed | str) -> None:
        """``item`` worked: say so if it had failed (``_failed``)."""
        failing = self._failing.pop(item, None)
        if failing is not None:
            tries = f"{failing.tries} failed {'try' if failing.tries == 1 else 'tries'}"
            log(logging.INFO, "slot store %s worked, after %s", _named(item), tries)

    def _renewed(self, renewal: _Renewal, reply: scripts.RenewReply, sent_at: float) -> None:
        self._next_renewal = sent_at + self._interval
        for what in reply.unowned:
            # no item owns the key: the renewal read it as none and went on
            log(logging.ERROR, "slot store renewal read as none: %s", self._foreign_at(what))
        for lease, stop in zip(renewal.leases, reply.leases, strict=True):
            if self._leases.get(lease.task_id) is not lease:
                continue  # released or lost meanwhile
            if not isinstance(stop, str):
                why = None if stop is None else self._foreign(lease.slot, stop.what)
                self._lose(lease, lease.rule.refused(why))
                continue
            lease.rule.renewed(sent_at)
            if stop and not lease.stop_reported:
                lease.stop_reported = True
                self._report(RemoteStop(lease.slot, lease.task_id, stop))
        for (slot, task_id), item in zip(renewal.queued, reply.entries, strict=True):
            if self._queued_slot.get(task_id) != slot:
                continue  # withdrawn or granted meanwhile
            kind = item.kind
            match kind:
                case "owner":
                    self._dequeue(task_id)
                    self._own(slot, task_id, item.token, sent_at)
                case "gone":
                    self._dequeue(task_id)
                    self._reject(slot, task_id, *_gone(str(item.detail)))
                case "foreign":
                    # As an error reply to its submit: rejected, no outage; and withdrawn
                    # (the withdrawal reads the slot's lease or queue key of foreign data
                    # as none), its marker naming the key for its joiners. Not withdrawn,
                    # it stayed in the server's queue while this process lived.
                    self._dequeue(task_id)
                    why = self._foreign(slot, str(item.detail))
                    gone = f"{RejectionKind.STORE_UNAVAILABLE.value}: {why}"
                    self._oblige(_Withdraw(slot, self._eid(task_id), gone))
                    self._reject(slot, task_id, RejectionKind.STORE_UNAVAILABLE, why)
                case "queued" | "resubmitted":
                    entries = self._queued[slot]
                    if kind == "resubmitted":
                        entries[task_id] = None
                    elif entries[task_id] is not None:
                        entries[task_id] = sent_at
                    if item.claimable:
                        self._claim(slot, task_id)
                case _:
                    assert_never(kind)
        for (joiner, follow), answer in zip(renewal.follows, reply.follows, strict=True):
            if self._follows.get(joiner) is not follow:
                continue
            follow_kind = answer.kind
            match follow_kind:
                case "out":
                    self._followed(joiner, self._decode(follow, str(answer.detail)))
                case "gone":
                    self._followed(joiner, rejected_outcome(*_gone(str(answer.detail))))
                case "live":
                    follow.lost_since = None
                case "lost":
                    if follow.lost_since is None:
                        follow.lost_since = sent_at
                    elif sent_at - follow.lost_since >= self._interval:
                        reason = f"followed work lost: {instance_of(follow.target)}"
                        self._followed(joiner, TaskOutcome(OutcomeKind.LEASE_LOST, reason=reason))
                case "foreign":
                    # as its entry's own renewal refuses it (or this follow's key): rejected
                    why = self._foreign(follow.slot, str(answer.detail))
                    self._followed(joiner, rejected_outcome(RejectionKind.STORE_UNAVAILABLE, why))
                case "foreign_lease":
                    # as its owner's renewal refuses the lease: lost, for the same cause
                    why = self._foreign(follow.slot, str(answer.detail))
                    reason = f"lease refused: {why}"
                    self._followed(joiner, TaskOutcome(OutcomeKind.LEASE_LOST, reason=reason))
                case _:
                    assert_never(follow_kind)
        for slot in sorted(self._watched):
            self._report(Room(slot))
        self._watched.clear()

    def _submitted(
        self, submit: _Submit, reply: scripts.Reply[scripts.SubmitKind], sent_at: float
    ) -> None:
        woken = submit.slot in self._early_wakes
        early = self._early_grants.pop(submit.task_id, None)
        self._resolve_submit(submit)
        slot, task_id = submit.slot, submit.task_id
        kind = reply.kind
        match kind:
            case "owner":
                if not self._own(slot, task_id, reply.token, sent_at):  # late: claimed
                    self._report(Queued(slot, task_id, reply.detail))
                self._displaced(slot, reply.detail)
            case "queued":
                self._enqueue(slot, task_id, sent_at)
                self._retry(slot, reply.retry)
                self._report(Queued(slot, task_id, reply.detail))
                self._displaced(slot, reply.detail)
                if early is not None:
                    self._take_grant(slot, task_id, early)
                elif woken:
                    self._claim_oldest(slot)
            case "busy":
                self._reject(slot, task_id, RejectionKind.SLOT_BUSY)
            case "full":
                if submit.wait:
                    self._watched.add(slot)
                    self._report(Full(slot, task_id, QUEUE_FULL_REASON))
                else:
                    self._reject(slot, task_id, RejectionKind.QUEUE_FULL)
            case "joined":
                self._report(self._joined(slot, task_id, str(reply.detail)))
            case "gone":  # a withdrawal of this very entry got there first
                self._reject(slot, task_id, *_gone(str(reply.detail)))
            case _:
                assert_never(kind)

    def _claimed(
        self, slot: str, task_id: int, reply: scripts.Reply[scripts.ClaimKind], sent_at: float
    ) -> None:
        if self._queued_slot.get(task_id) != slot:
            return  # withdrawn meanwhile; the withdrawal gives back what the claim took
        kind = reply.kind
        match kind:
            case "owner":
                self._dequeue(task_id)
                self._own(slot, task_id, reply.token, sent_at)
            case "gone":
                self._dequeue(task_id)
                self._reject(slot, task_id, *_gone(str(reply.detail)))
            case "missing":
                self._renew_now = True  # the renewal puts it back at the tail
            case "wait":
                self._retry(slot, reply.retry)
            case "foreign":
                # refused, out of its queue for good (its grant met foreign data at the
                # slot's key): as a renewal's refusal, rejected, no outage
                self._dequeue(task_id)
                why = self._foreign_at(str(reply.detail))
                log(logging.ERROR, "slot store claim of slot %r refused: %s", slot, why)
                self._reject(slot, task_id, RejectionKind.STORE_UNAVAILABLE, why)
            case _:
                assert_never(kind)

    def _slot_info(self, slot: str, reply: object) -> ClusterSlotInfo | None:
        parsed = scripts.parse_cluster_slot(reply)
        if parsed.holder is None and parsed.live_entries == 0:
            return None
        return ClusterSlotInfo(
            slot, parsed.holder, parsed.token, parsed.live_entries, parsed.remaining
        )

    def _decode(self, follow: _Follow, text: str) -> TaskOutcome[Any]:
        try:
            return decode_outcome(text)
        except ValueError as exc:
            reason = f"followed work lost: {instance_of(follow.target)} ({exc})"
            return TaskOutcome(OutcomeKind.LEASE_LOST, reason=reason)

    # -- failures -------------------------------------------------------------------------------

    def _batch_failed(self, batch: _Batch, why: str) -> None:
        requeue: list[_Obligation] = []
        for part in batch.parts:
            match part:
                case _Submit() if not part.resolved:
                    self._fail_submit(part)
                case _Withdraw() | _Release() | _StoreOutcome() | _StopOwner() | _LimitRelease():
                    requeue.append(part)
                case _Query() if not part.abandoned:
                    self._queries.append(part)  # it may still be answered after a reconnect
                case _LimitQuery() if not part.abandoned:
                    self._limit_queries.append(part)
                case _LimitAcquire(request) if request.state == "new":
                    request.sent = False  # asked again once the server answers
                case _:
                    pass  # renewals and claims are made again; leases run on their timers
        self._obligations.extendleft(reversed(requeue))
        self._mark_unavailable(why)

    def _fail_submit(self, submit: _Submit, error: str | None = None) -> None:
        """Resolve a submit that got no reply, or (``error``) an error reply: it may have
        reached the server (a script that fails half-way keeps what it wrote), so its
        entry is withdrawn in the next successful round trip."""
        self._resolve_submit(submit)
        if submit.sent:
            self._oblige(_Withdraw(submit.slot, self._eid(submit.task_id), "store_unavailable"))
            if submit.wait and error is None:
                # Held work comes back with the same TaskId: its next attempt needs an
                # id the withdrawal's marker does not refuse.
                self._attempts[submit.task_id] = self._attempts.get(submit.task_id, 0) + 1
        self._report(self._failure_report(submit.slot, submit.task_id, submit.wait, error))

    def _failure_report(
        self, slot: str, task_id: int, wait: bool, error: str | None = None
    ) -> Report:
        """An error reply rejects even ``wait=True`` work, with the error as its reason:
        it is no outage, so no recovery would ever ask it again."""
        if error is None and wait:
            return Full(slot, task_id, STORE_UNAVAILABLE_REASON)
        return Rejected(slot, task_id, RejectionKind.STORE_UNAVAILABLE, error)

    def _mark_unavailable(self, why: str) -> None:
        if not self._available:
            return
        self._available = False
        log(logging.WARNING, "slot store %s unavailable: %s", self.store.safe_url, why)
        for submit in list(self._submits.values()):
            if not submit.sent:
                self._fail_submit(submit)
        self._claims.clear()
        if self._started:
            self._report(StoreUnavailable())
        self._io_wakeup.set()

    async def _recover(self) -> None:
        """Reconnect until a fresh connection renewed and subscribed (then report
        ``StoreRecovered``), backing off up to ``lease_ttl / 3``.

        The first attempt is immediate unless the last outage ended less than
        ``lease_ttl / 3`` ago: then the backoff goes on where it stopped (a second
        failover soon after the first waits no longer than the first's last pause),
        but never less than ``lease_ttl / 24``, so a server that fails every connection,
        or every call, soon after accepting it is never retried without a pause.
        """
        if trio.current_time() - self._recovered_at >= self._interval:
            self._backoff = 0.0
        else:
            self._backoff = max(self._backoff, self._interval / 8)
        while not self._available:
            if self._backoff:
                await trio.sleep(self._backoff)
            with trio.move_on_after(self.store.connect_timeout):
                if await self._connect(self._interval):
                    self._available = True
                    self._error = None
                    self._recovered_at = trio.current_time()
                    # Only the outage's end makes failures warn again: a reconnection's
                    # renewal may work while its subscription is refused.
                    self._quiet = False
                    log(logging.INFO, "slot store %s recovered", self.store.safe_url)
                    self._report(StoreRecovered())
                    return
            self._back_off()

    def _back_off(self) -> None:
        """A connection attempt failed: the next waits longer (``lease_ttl / 24``,
        doubling, capped at ``lease_ttl / 3``), and its failures log at DEBUG."""
        self._quiet = True
        self._backoff = min(self._interval, max(self._interval / 8, 2 * self._backoff))

    async def _first_connect(self) -> bool:
        """Connect at start (the caller bounds it by ``connect_timeout``): a failure
        that may pass by itself (nothing listens yet, a server that loads its data set,
        too few replicas connected) is tried again with the reconnection's backoff;
        any other ends the start at once. ``self._error`` keeps the last failure: the
        attempt under way at ``connect_timeout`` may only have been cut short (a check
        of the replicas as it answered), not met silence."""
        while not await self._connect(self.store.connect_timeout):
            if self._error is None:
                return False
            error = self._error[1]
            if not isinstance(error, ReplicaShortfall) and not self._client.may_pass(error):
                await self._goodbye()
                return False
            self._back_off()
            await trio.sleep(self._backoff)
        return True

    async def _goodbye(self) -> None:
        """A start that failed after its renewal (the subscription refused) wrote this
        process's heartbeat: delete it, so that no other process, nor the ``slots``
        command, counts this one as live for ``lease_ttl``. Best effort: its error is
        not the start's."""
        if self._conn is None:
            return
        with trio.move_on_after(self.store.connect_timeout), contextlib.suppress(Exception):
            await self._conn.round_trip([(BYE, (self.instance_id,))])

    async def _connect(self, bound: float) -> bool:
        """Open a fresh connection, renew on it, subscribe; return whether all worked
        (``self._error`` names the failure when the client reported one; it keeps the
        outage's last named failure until a connection works, so a query that times out
        during an attempt still names the cause)."""
        self._drop_connection()
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._conn_scope = scope
        self._conn = await self._nursery.start(self._hold, scope)
        if self._conn is None:
            return False
        if self.store.replicas_ack and not await self._enough_replicas(self._conn, bound):
            return False
        if not await self._commands_allowed(self._conn, bound):
            return False
        if not await self._send(self._take_batch(renew=True), bound):
            return False
        scope = trio.CancelScope()
        self._sub_scope = scope
        with trio.move_on_after(bound):
            if await self._nursery.start(self._subscription, self._conn, scope):
                if self._queued:
                    # A grant pushed between the renewal and the subscription was not
                    # heard: renew once more at once rather than a renewal interval on.
                    self._renew_now = True
                return True
        scope.cancel(reason="the subscription was not confirmed in time")
        return False

    async def _enough_replicas(self, conn: Connection, bound: float) -> bool:
        """Whether the server has ``replicas_ack`` replicas connected, asked before
        anything is written on a fresh connection (``self._error`` names a shortfall):
        otherwise every round trip's ``WAIT`` would fail after its full timeout."""
        replies = await self._alone(conn, (REPLICAS, ()), bound)
        if replies is None:
            return False
        (reply,) = replies
        wanted = self.store.replicas_ack
        if isinstance(reply, Exception):
            self._error = ("the INFO command", reply)
            self._log_failure("the slot store refused the INFO command", reply)
            return False
        if cast("int", reply) < wanted:
            shortfall = ReplicaShortfall(
                f"needs {wanted} replicas to acknowledge, the primary has {reply} connected"
            )
            self._error = ("the INFO command", shortfall)
            self._log_failure("the slot store's replicas fall short", shortfall)
            return False
        return True

    async def _commands_allowed(self, conn: Connection, bound: float) -> bool:
        """Whether the server runs every command the scripts call for this user, asked
        on a fresh connection before anything is written (``scripts.PROBE``): a user
        without one the renewal does not call (an ACL that leaves out ``HSET``, say)
        would pass it, and then fail every call that needs it, for ever."""
        replies = await self._alone(conn, (scripts.PROBE.name, (self.instance_id,)), bound)
        if replies is None:
            return False
        (reply,) = replies
        if isinstance(reply, Exception):
            self._error = ("the lease scripts", reply)
            self._log_failure("the slot store refused the lease scripts", reply)
            return False
        return True

    async def _alone(self, conn: Connection, call: Call, bound: float) -> list[object] | None:
        """The reply to ``call`` sent alone on ``conn``, as a list of one; ``None`` when
        none came within ``bound``."""
        replies: list[object] | None = None
        with trio.move_on_after(bound):
            try:
                replies = await conn.round_trip([call])
            except BaseException as exc:
                self._contain(exc, "a round trip to the slot store failed", "the connection")
        return replies if replies is not None and len(replies) == 1 else None

    def _drop_connection(self) -> None:
        for scope in (self._sub_scope, self._conn_scope):
            if scope is not None:
                scope.cancel(reason="the lease keeper drops this connection")
        self._sub_scope = self._conn_scope = None
        self._conn = None

    async def _hold(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[Connection | None]
    ) -> None:
        """Hold one connection open until ``scope`` is cancelled (or it breaks)."""
        started = False
        with scope:
            try:
                async with self._client.connect() as conn:
                    task_status.started(conn)
                    started = True
                    await trio.sleep_forever()
            except BaseException as exc:
                self._contain(exc, "the slot store client stopped", "the connection")
        if not started:
            task_status.started(None)
        elif not scope.cancel_called:
            self._mark_unavailable("the client stopped")

    async def _subscription(
        self,
        conn: Connection,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[bool],
    ) -> None:
        """Deliver this process's messages until ``scope`` is cancelled (or it breaks)."""
        subscribed = False

        def confirmed() -> None:
            nonlocal subscribed
            subscribed = True
            task_status.started(True)

        with scope:
            try:
                await conn.subscribe(self._channel, self._on_message, confirmed)
            except BaseException as exc:
                self._contain(exc, "the slot store subscription ended", "the subscription")
        if not subscribed:
            task_status.started(False)
        elif not scope.cancel_called:
            self._mark_unavailable("the subscription ended")

    def _contain(self, exc: BaseException, what: str, asked: str) -> None:
        """Log the ``Exception`` parts of ``exc`` and keep the first as ``self._error``
        (``asked``: what the server was asked); re-raise the rest (``Cancelled`` and
        other ``BaseException``s), so no error of the client library leaves the keeper."""
        if isinstance(exc, BaseExceptionGroup):
            group = cast("BaseExceptionGroup[BaseException]", exc)
            errors, rest = group.split(Exception)
            if errors is not None:
                self._record(asked, first_leaf(errors))
                self._log_failure(what, errors)
            if rest is not None:
                raise rest from None
        elif isinstance(exc, Exception):
            self._record(asked, exc)
            self._log_failure(what, exc)
        else:
            raise exc

    def _record(self, asked: str, exc: Exception) -> None:
        """Keep ``exc`` as the failure to name, unless the keeper is cancelling this task
        (coredis turns a cancelled connection attempt into an error of its own)."""
        if trio.current_effective_deadline() != -math.inf:
            self._error = (asked, exc)

    def _log_failure(self, what: str, exc: BaseException) -> None:
        # DEBUG after an outage's first failure, at close, and for what the keeper's own
        # cancellation of a connection causes (a dropped connection's subscription).
        quiet = self._quiet or self._closing or trio.current_effective_deadline() == -math.inf
        level = logging.DEBUG if quiet else logging.WARNING
        log(level, "%s: %s", what, self._describe(exc))

    def _describe(self, exc: BaseException) -> str:
        """``exc``'s text without credentials (a group: its leaves)."""
        return describe(exc, self._secrets)

    # -- timers and messages ---------------------------------------------------------------------

    async def _timers(self) -> None:
        """Fire lease deadlines, submit deadlines and claim retries on time."""
        while True:
            self._timers_at = self._fire_timers(trio.current_time())
            with trio.move_on_at(self._timers_at):
                await self._timer_wakeup.wait()

    def _wake_timers(self, at: float = -math.inf) -> None:
        """Have the timer task look again, unless it wakes by ``at`` anyway: a new
        deadline no earlier than the one it waits for is seen when that one fires (a
        lease's or a submission's, which mostly come in their order, costs no pass)."""
        if at < self._timers_at:
            self._timer_wakeup.set()

    def _fire_timers(self, now: float) -> float:
        next_at = math.inf
        for lease in list(self._leases.values()):
            reason = lease.rule.check(now)
            if reason is not None:
                self._lose(lease, reason)
            else:
                next_at = min(next_at, lease.rule.deadline)
        for submit in list(self._submits.values()):
            if now >= submit.deadline:
                self._fail_submit(submit)
            else:
                next_at = min(next_at, submit.deadline)
        for slot, at in list(self._retry_at.items()):
            if now >= at:
                del self._retry_at[slot]
                self._claim_oldest(slot)
            else:
                next_at = min(next_at, at)
        return min(next_at, self._limit_timers(now))

    def _on_message(self, text: str) -> None:
        try:
            message = json.loads(text)
            kind = message[0]
        except (ValueError, TypeError, IndexError, KeyError):
            log(logging.DEBUG, "ignored a malformed slot store message: %r", text[:200])
            return
        match message:
            case ["grant", str(slot), str(eid), str(token), *_] if token.isdigit():
                self._granted(slot, eid, int(token))
            case ["wake", str(slot)]:  # from earlier versions of the scripts
                self._claim_oldest(slot)
            case ["room", str(slot)] if slot in self._watched:
                self._watched.discard(slot)
                self._report(Room(slot))
            case ["stop", str(slot), str(eid), str(requester)]:
                lease = self._leases.get(self._own_task(eid))
                if lease is not None and lease.slot == slot and not lease.stop_reported:
                    lease.stop_reported = True
                    self._report(RemoteStop(slot, lease.task_id, requester))
            case ["superseded", str(slot), str(eid)]:
                self._displaced(slot, eid)
            case ["limit", str(w), str(gen)]:
                request = self._limits.get(self._limit_ids.get(w, -1))
                if request is None or request.state not in ("new", "waiting"):
                    return
                if self.store.replicas_ack:  # acted on once a renewal's WAIT confirms it
                    self._renew_now = True
                    self._io_wakeup.set()
                else:
                    self._limit_reply(request, scripts.LimitReply("granted", gen=gen))
            case ["done", str(eid)]:
                if any(follow.target == eid for follow in self._follows.values()):
                    self._renew_now = True
                    self._io_wakeup.set()
            case _:
                log(logging.DEBUG, "ignored a slot store message of kind %r", kind)

    # -- bookkeeping -------------------------------------------------------------------------

    def _eid(self, task_id: int) -> str:
        """The entry id of the current attempt of ``task_id``."""
        return entry_id(self.instance_id, task_id, self._attempts.get(task_id, 0))

    def _own_task(self, eid: str) -> int:
        """The task id of ``eid`` if it is the current attempt of this process, else -1."""
        parsed = parse_entry_id(eid)
        if parsed is None or parsed.instance != self.instance_id:
            return -1
        return parsed.task_id if self._eid(parsed.task_id) == eid else -1

    def _joined(self, slot: str, task_id: int, target: str) -> Joined:
        """The ``Joined`` report: ``target`` with its task id when it is this process's."""
        parsed = parse_entry_id(target)
        local = parsed is not None and parsed.instance == self.instance_id
        return Joined(
            slot,
            task_id,
            target,
            parsed.task_id if local and parsed is not None else None,
            target if parsed is None else parsed.label,
        )

    def _own(self, slot: str, task_id: int, token: int | None, sent_at: float) -> bool:
        """``task_id`` was granted ``slot``'s lease by a round trip sent at ``sent_at``:
        its work starts. Unless the grant comes late (a paused or slow server): its lease
        would count as lost within a renewal interval, or already does, and the work would
        end ``LEASE_LOST`` as it starts. It stays queued here, and a claim confirms the
        grant with a fresh deadline (or finds it gone). Return whether it was owned."""
        assert token is not None
        if self._too_late(sent_at):
            self._enqueue(slot, task_id, None)
            self._claim(slot, task_id)
            return False
        rule = LeaseDeadline.acquired(sent_at, self.store.lease_ttl)
        self._leases[task_id] = _Lease(slot, task_id, token, rule)
        self._wake_timers(rule.deadline)
        self._report(Owner(slot, task_id, token))
        return True

    def _too_late(self, sent_at: float) -> bool:
        """Whether a lease (or units) whose last confirmation was sent at ``sent_at``
        counts as lost within a renewal interval, or already does: a grant that comes
        so late (a paused or slow server) is confirmed before it is acted on."""
        margin = LOST_LEASE_FRACTION * self.store.lease_ttl - self._interval
        return sent_at + margin < trio.current_time()

    def _lose(self, lease: _Lease, reason: str) -> None:
        if self._leases.get(lease.task_id) is lease:
            del self._leases[lease.task_id]
            self._lost[lease.task_id] = reason
            self._report(LeaseLost(lease.slot, lease.task_id, lease.token, reason))

    def _displaced(self, slot: str, eid: str | None) -> None:
        if eid is None:
            return
        task_id = self._own_task(eid)
        if self._queued_slot.get(task_id) == slot:
            self._dequeue(task_id)
            self._reject(slot, task_id, RejectionKind.SUPERSEDED)

    def _reject(
        self, slot: str, task_id: int, kind: RejectionKind, reason: str | None = None
    ) -> None:
        self._attempts.pop(task_id, None)  # a rejected entry never comes back
        self._report(Rejected(slot, task_id, kind, reason))

    def _foreign(self, slot: str, what: str) -> str:
        """Log a renewal item refused for foreign data; return why, to name it."""
        why = self._foreign_at(what)
        log(logging.ERROR, "slot store renewal of slot %r refused: %s", slot, why)
        return why

    def _foreign_at(self, what: str) -> str:
        """Why, for foreign data at ``what`` (a key after the prefix, and the server's
        error, as the scripts name it)."""
        return f"foreign data in the slot store at {self.store.key_prefix}{what}"

    def _followed(self, joiner: int, outcome: TaskOutcome[Any]) -> None:
        del self._follows[joiner]
        self._report(FollowedOutcome(joiner, outcome))

    def _enqueue(self, slot: str, task_id: int, since: float | None) -> None:
        self._queued.setdefault(slot, {})[task_id] = since
        self._queued_slot[task_id] = slot

    def _dequeue(self, task_id: int) -> None:
        slot = self._queued_slot.pop(task_id, None)
        if slot is not None:
            entries = self._queued[slot]
            del entries[task_id]
            if not entries:
                del self._queued[slot]

    def _claim_oldest(self, slot: str) -> None:
        if self._closing:
            return
        entries = self._queued.get(slot)
        if entries:
            self._claim(slot, next(iter(entries)))
        elif any(submit.sent and submit.slot == slot for submit in self._submits.values()):
            # The wake-up overtook the reply that queues our entry: keep it until then.
            self._early_wakes.add(slot)

    def _granted(self, slot: str, eid: str, token: int) -> None:
        """The server handed ``slot``'s lease to ``eid`` (its owner gave it back) and
        pushed the grant: start it without a claim. A duplicate or late message finds
        the work owned already (a missed one is found by the next claim or renewal,
        which answer ``owner``). A grant for an entry of this process that is neither
        queued, asked for nor owned here is given back at once: one withdrawn meanwhile
        is withdrawn again (the script is idempotent), and one this process no longer
        knows (a failover, or a restart from an older copy, kept it and lost what
        became of it) held its slot until the lease expired, and every claim after."""
        if self._closing:
            return
        task_id = self._own_task(eid)
        if task_id >= 0:
            if self._queued_slot.get(task_id) == slot:
                self._take_grant(slot, task_id, token)
                return
            submit = self._submits.get(task_id)
            if submit is not None and submit.sent and submit.slot == slot:
                # The message overtook the reply that queues the entry: keep it until then.
                self._early_grants[task_id] = token
                return
            lease = self._leases.get(task_id)
            if lease is not None and lease.slot == slot:
                return  # owned already
        else:
            parsed = parse_entry_id(eid)
            if parsed is None or parsed.instance != self.instance_id:
                return
        self._oblige(_Withdraw(slot, eid, RejectionKind.STORE_UNAVAILABLE.value))

    def _take_grant(self, slot: str, task_id: int, token: int) -> None:
        """Own the pushed grant of queued ``task_id``, or confirm it by a claim (see the
        module docstring). Its lease deadline runs from the sending of the last round
        trip that found the entry queued: the server granted the lease after that, so it
        holds the lease at least ``lease_ttl`` from then."""
        since = self._queued[slot][task_id]
        if since is None or self.store.replicas_ack:
            # Re-submitted by a renewal (the message may be of a grant of its earlier
            # place), or with replicas_ack, where the message was published before the
            # grant's WAIT (the claim's own WAIT confirms that replicas hold it). A
            # claim confirms the grant with a fresh deadline, or finds it gone (the entry
            # then goes to the tail).
            self._claim(slot, task_id)
            return
        self._dequeue(task_id)
        self._claims.pop(task_id, None)
        self._own(slot, task_id, token, since)

    def _claim(self, slot: str, task_id: int) -> None:
        self._claims[task_id] = slot
        self._io_wakeup.set()

    def _retry(self, slot: str, retry: float | None) -> None:
        """Claim again once the lease (or the head's heartbeat) has expired on the
        server: expiries publish no wake-up."""
        if retry is None or self._closing:
            return
        at = trio.current_time() + retry + 0.002  # just past the server's expiry
        self._retry_at[slot] = min(self._retry_at.get(slot, math.inf), at)
        self._wake_timers(at)

    def _resolve_submit(self, submit: _Submit) -> None:
        submit.resolved = True
        self._early_wakes.discard(submit.slot)
        self._early_grants.pop(submit.task_id, None)
        if self._submits.get(submit.task_id) is submit:
            del self._submits[submit.task_id]

    def _oblige(self, obligation: _Obligation) -> None:
        self._obligations.append(obligation)
        self._io_wakeup.set()
        if self._idle:
            self._send_now()

    # -- reports ------------------------------------------------------------------------------

    def _report(self, report: Report) -> None:
        """Send a report; the sink takes every report at once (the controller's inbox)."""
        # Not contextlib.suppress: a report per acquisition (benchmark 10, 3x50 callers).
        try:  # noqa: SIM105
            self._reports.send_nowait(report)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # raised only once nobody reads reports


def describe(exc: BaseException, secrets: Sequence[str]) -> str:
    """``exc``'s text without ``secrets`` (a group: its leaves), with the error the client
    wrapped (coredis wraps the OS's error)."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = cast("BaseExceptionGroup[BaseException]", exc).exceptions
        text = "; ".join(describe(leaf, secrets) for leaf in leaves)
    else:
        text = _text(exc)
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, BaseExceptionGroup):
            text += f" ({_text(cause)})"
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _text(exc: BaseException) -> str:
    """``"Type: message"``, or the type alone for an empty message."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def first_leaf(group: BaseExceptionGroup[Exception]) -> Exception:
    """The first exception of a group that is not itself a group."""
    first = group.exceptions[0]
    if isinstance(first, BaseExceptionGroup):
        return first_leaf(first)
    return first


def _named(item: _Owed | str) -> str:
    """An obligation (or the limit renewal, by its script's name), for log records."""
    match item:
        case _Release(slot, eid, _):
            return f"release of {eid} in slot {slot!r}"
        case _Withdraw(slot, eid, _):
            return f"withdrawal of {eid} from slot {slot!r}"
        case _StoreOutcome(eid, _):
            return f"outcome of {eid}"
        case _LimitRelease(w, _, withdraw):
            return f"limit {'withdrawal' if withdraw else 'release'} of {w}"
        case str():
            return "limit renewal"
        case _:
            assert_never(item)


def _asked(part: _Part) -> str:
    """What a call of a round trip asked of the server, for error messages."""
    match part:
        case str():
            return "the INFO command"
        case _Bye():
            return "the DEL command"
        case _Wait():
            return "the WAIT command"
        case (
            _Renewal()
            | _LimitRelease()
            | _Withdraw()
            | _Release()
            | _StoreOutcome()
            | _StopOwner()
            | _Claim()
            | _Submit()
            | _Query()
        ):
            return "the lease scripts"
        case _LimitAcquire() | _LimitRenewal() | _LimitQuery():
            return "the limit scripts"
        case _:
            assert_never(part)


def secrets_of(url: str) -> tuple[str, ...]:
    """The passwords of ``url`` (its user part's, and a ``password`` or
    ``sentinel_password`` option's), raw and decoded, to scrub from any text we log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    found = [parts.netloc.rpartition("@")[0].partition(":")[2]]
    found += [
        value
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if name in {"password", "sentinel_password"}
    ]
    return tuple({form for secret in found if secret for form in (secret, unquote(secret))})
