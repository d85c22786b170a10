"""Cluster slot values: the slot store configuration, what the server tells about a slot,
the outcome codec and the lost-lease rule.

Plain values and pure functions: no trio and no coredis here, so ``RedisSlotStore`` can be
built (and validated) where no event loop runs and without the ``redis`` extra, and the
rules below can be property-tested directly. The server side lives in ``_redis_scripts``
and the lease keeper in ``_keeper``.

Decisions the design leaves open:

* ``RedisSlotStore.url`` is checked when the store is built: scheme ``redis`` or
  ``rediss``, a host, an optional port (1 to 65535) and an optional database path
  (``/0``). The query options ``db``, ``username`` and ``password``, and with
  ``rediss`` the ``ssl_*`` options, are passed on to coredis as it documents them; any
  other option is a ``ConfigError`` naming it. Percent-escapes in the user name and
  password are decoded, so a password may contain ``@``, ``:`` or ``/`` as ``%40``,
  ``%3A``, ``%2F``.
* Credentials never show: ``repr()``/``str()`` print the URL with the password (and a
  ``password=`` query parameter, in any case and with any percent-escapes in its name,
  as coredis decodes them) as ``***``. A user part without a ``:`` is masked whole,
  because some clients read ``redis://secret@host`` as a password. Error messages never
  quote the URL: they name the part that is wrong.
* Durations may be ``int`` or ``float`` (stored as ``float``); ``bool`` and other types
  are a ``TypeError``.
* The lost-lease deadline is inclusive: at ``sent + 0.8 * lease_ttl`` exactly the lease
  counts as lost. Deadlines never move backwards (a late reply to an older renewal does
  not shorten them), and a renewal confirmed after the loss does not revive the lease.
* The outcome codec writes one JSON object per outcome; values of any kind are carried
  (normally only ``COMPLETED`` has one). Text that is not such an object raises
  ``ValueError`` on decoding.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
from typing import Any, Final, Protocol, TypeAlias
from urllib.parse import parse_qsl, unquote_plus, urlsplit

import attrs

from ._exceptions import ConfigError
from ._outcome import OutcomeKind, RejectionKind, TaskOutcome

LOST_LEASE_FRACTION: Final = 0.8
"""A lease is lost this fraction of ``lease_ttl`` after its last confirmed send."""

MAX_TRANSFER_CHARS: Final = 2**20
"""The longest encoded value an outcome carries across processes."""

_NOT_TRANSFERABLE: Final = "value not transferable: "
_SCHEMES: Final = ("redis", "rediss")
_MASK: Final = "***"


# -- identifiers ----------------------------------------------------------------------------


def new_instance_id() -> str:
    """Return a new cluster-wide instance id, ``"<host>:<pid>:<8 hex>"``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


_ENTRY_ID: Final = re.compile(r"(.*)/([0-9]+)(?:\.([0-9]+))?", re.DOTALL)


@attrs.frozen
class EntryId:
    """The parts of a server entry id, ``"<instance_id>/<task_id>"`` or, from a held
    submission's second attempt on, ``"<instance_id>/<task_id>.<attempt>"``."""

    instance: str
    task_id: int
    attempt: int

    @property
    def label(self) -> str:
        """``"<instance_id>#<task_id>"``: how events name the work of another process."""
        return f"{self.instance}#{self.task_id}"


def entry_id(instance_id: str, task_id: int, attempt: int = 0) -> str:
    """Return the server-side id of one submission: unique per acquisition.

    The only place entry ids are built (the Lua scripts only split off the instance)."""
    base = f"{instance_id}/{int(task_id)}"  # a TaskId's str() is "#7"
    return f"{base}.{attempt}" if attempt else base


def parse_entry_id(text: str) -> EntryId | None:
    """Return the parts of an entry id, or ``None`` for text that is not one."""
    match = _ENTRY_ID.fullmatch(text)
    if match is None:
        return None
    return EntryId(match[1], int(match[2]), int(match[3] or 0))


def instance_of(text: str) -> str:
    """Return the instance id of a server-side entry id."""
    return text.rpartition("/")[0]


# -- configuration --------------------------------------------------------------------------

_USERINFO: Final = re.compile(r"^(?P<head>[^:/?#]*://)(?P<user>[^/?#]*@)")
_PARAM: Final = re.compile(r"(?P<key>[?&][^=&#]*=)[^&#]*")


def redact_url(url: str) -> str:
    """Return ``url`` with its password (user part and ``password=`` parameter) masked."""

    def mask_user(match: re.Match[str]) -> str:
        name, colon, _ = match["user"][:-1].partition(":")
        # A user part without ":" may be a password to some clients: mask it whole.
        return match["head"] + (f"{name}:{_MASK}@" if colon else f"{_MASK}@")

    def mask_param(match: re.Match[str]) -> str:
        # coredis reads query keys percent-decoded: "pass%77ord=" is a password too.
        key = match["key"]
        return key + _MASK if unquote_plus(key[1:-1]).lower() == "password" else match[0]

    # The user part goes first: it may contain "&" and "=" of its own.
    return _PARAM.sub(mask_param, _USERINFO.sub(mask_user, url, count=1))


_TLS_OPTIONS: Final = frozenset(
    {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_check_hostname", "ssl_keyfile"}
)
_URL_OPTIONS: Final = frozenset({"db", "password", "username"}) | _TLS_OPTIONS


def _check_url(url: object) -> str:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError("url must be a valid redis:// or rediss:// url") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigError(f"url scheme must be 'redis' or 'rediss', got {parts.scheme!r}")
    try:
        port = parts.port
    except ValueError:
        port = 0  # not a number, or out of range
    # The text after the host's last ":" (an IPv6 host is in brackets): what was written.
    written = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    if written and port == 0:  # coredis would connect to 6379 for port 0
        raise ConfigError(f"url port must be a number from 1 to 65535, got {written!r}")
    if not parts.hostname:
        raise ConfigError("url must name a host, as in redis://host:6379/0")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError("url path must be a database number, as in redis://host:6379/0")
    _check_options(parts.query, tls=parts.scheme == "rediss")
    return url


def _check_options(query: str, *, tls: bool) -> None:
    """Refuse query options the store does not support: coredis would ignore unknown
    names silently, and the others (``connect_timeout``, ``client_name``, ``noreply``,
    ...) change settings the lease keeper relies on. Names are decoded as coredis
    decodes them; values are never quoted (one may be a password)."""
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name == "cluster":
            raise ConfigError(
                "url option 'cluster' is not supported: the store runs on one server "
                "(or a managed primary), not on a Redis Cluster"
            )
        if name not in _URL_OPTIONS:
            supported = ", ".join(sorted(_URL_OPTIONS))
            raise ConfigError(f"url option {name!r} is not supported (supported: {supported})")
        if name in _TLS_OPTIONS and not tls:
            raise ConfigError(f"url option {name!r} needs a rediss:// (TLS) url")
        if name == "db" and not value.isdigit():
            raise ConfigError("url option 'db' must be a database number")


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {namespace!r}")
    if not namespace or "{" in namespace or "}" in namespace:
        raise ConfigError(f"namespace must be non-empty, without '{{' or '}}', got {namespace!r}")
    if any(char.isspace() for char in namespace):
        raise ConfigError(f"namespace must not contain whitespace, got {namespace!r}")
    return namespace


def _check_duration(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise ConfigError(f"{what} must be finite and > 0, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{what} must be finite and > 0, got {value!r}")
    return seconds


def _lease_ttl(value: object) -> float:
    return _check_duration("lease_ttl", value)


def _connect_timeout(value: object) -> float:
    return _check_duration("connect_timeout", value)


class SlotStore:
    """A shared server that makes a controller's slots cluster-wide.

    A slot store is a plain configuration value; the supervisor opens the connection.
    """

    __slots__ = ()


@attrs.frozen(repr=False)
class RedisSlotStore(SlotStore):
    """Cluster slots on one Redis (>= 6.2) or Valkey (>= 7.2) server.

    ``url`` is ``redis://[[user]:password@]host[:port][/db]`` or ``rediss://`` (TLS),
    with the query options ``db``, ``username``, ``password``, and with ``rediss`` the
    ``ssl_*`` options (any other option is a ``ConfigError``); ``namespace`` isolates
    one application's slots from another's on the same server; ``lease_ttl`` and
    ``connect_timeout`` are seconds of real time. Building it opens nothing. Its
    ``repr()`` never shows the password (``url`` itself holds it).
    """

    url: str = attrs.field(converter=_check_url)
    """The server's ``redis://`` or ``rediss://`` URL, credentials included; show ``safe_url``."""
    namespace: str = attrs.field(default="taskvisor", kw_only=True, converter=_check_namespace)
    """The application's slot namespace on the server: non-empty, no whitespace, ``{`` or ``}``."""
    lease_ttl: float = attrs.field(default=10.0, kw_only=True, converter=_lease_ttl)
    """Seconds a lease lives on the server without renewal; renewed every ``lease_ttl / 3``."""
    connect_timeout: float = attrs.field(default=5.0, kw_only=True, converter=_connect_timeout)
    """Seconds to reach the server at start (``SlotStoreUnavailableError`` past it).

    Also how long ``cluster_slot``, a request in flight, and shutdown's withdrawals wait for it.
    """

    def __repr__(self) -> str:
        return (
            f"RedisSlotStore({self.safe_url!r}, namespace={self.namespace!r}, "
            f"lease_ttl={self.lease_ttl!r}, connect_timeout={self.connect_timeout!r})"
        )

    __str__ = __repr__

    @property
    def safe_url(self) -> str:
        """The URL with its password masked: the only form of it that may be shown."""
        return redact_url(self.url)

    @property
    def key_prefix(self) -> str:
        """The prefix of every key and channel of this namespace."""
        return "tv:{" + self.namespace + "}:"

    @property
    def keep(self) -> float:
        """How long the server keeps outcomes and markers for other processes (seconds)."""
        return max(60.0, 10.0 * self.lease_ttl)


# -- observing --------------------------------------------------------------------------------


@attrs.frozen
class ClusterSlotInfo:
    """What the server holds for one cluster slot (``Supervisor.cluster_slot``).

    ``holder`` is the ``instance_id`` of the lease holder (``None`` while a hand-over is
    in flight); ``fence_token`` and ``lease_remaining`` (seconds) are ``None`` while
    ``holder`` is. ``queue_depth`` counts live entries only: entries of processes whose
    heartbeat expired are not counted, even before they are pruned.
    """

    slot: str
    """The slot's name."""
    holder: str | None
    """The lease holder's ``instance_id``; ``None`` while a hand-over is in flight."""
    fence_token: int | None
    """The current lease's fence token; ``None`` while ``holder`` is."""
    queue_depth: int
    """Live entries in the slot's cluster queue, from every process."""
    lease_remaining: float | None
    """Seconds of real time until the lease expires unless renewed; ``None`` while ``holder`` is."""


# -- outcomes across processes ----------------------------------------------------------------


# -- reports -------------------------------------------------------------------------------


@attrs.frozen
class Owner:
    """The lease of ``slot`` was granted to ``task_id`` (by its submit, a claim, or seen
    at a renewal after a lost reply); ``token`` is its fence token."""

    slot: str
    task_id: int
    token: int


@attrs.frozen
class Queued:
    """``task_id`` is in the slot's cluster queue; ``displaced`` is the entry id of the
    head a REPLACE displaced (rejected ``SUPERSEDED`` in its own process), if any."""

    slot: str
    task_id: int
    displaced: str | None


@attrs.frozen
class Joined:
    """A JOIN follows ``target`` (an entry id, maybe of this process: then
    ``local_target`` is its task id); ``label`` names the target in events."""

    slot: str
    task_id: int
    target: str
    local_target: int | None
    label: str


@attrs.frozen
class Rejected:
    """``task_id`` was rejected: ``SLOT_BUSY``, ``QUEUE_FULL``, ``SUPERSEDED``,
    ``STORE_UNAVAILABLE``, ``SHUTTING_DOWN`` (or the reason a server marker names)."""

    slot: str
    task_id: int
    kind: RejectionKind


@attrs.frozen
class Full:
    """``wait=True`` work that must be held: the queue is full (submit it again on
    ``Room(slot)``) or the store is unavailable (submit it again on ``StoreRecovered``)."""

    slot: str
    task_id: int
    reason: str


@attrs.frozen
class Room:
    """An entry left the slot's cluster queue, or a renewal passed: held work may retry."""

    slot: str


@attrs.frozen
class RemoteStop:
    """``requester`` (an instance id) asked to stop the owner ``task_id``; once per owner."""

    slot: str
    task_id: int
    requester: str


@attrs.frozen
class LeaseLost:
    """The lease of ``task_id`` is lost; ``reason`` starts with ``"lease refused"`` or
    ``"lease expired"``. The keeper never renews it again; release it after the owner's
    physical exit all the same."""

    slot: str
    task_id: int
    token: int
    reason: str


@attrs.frozen
class FollowedOutcome:
    """The outcome of the work that ``joiner`` follows (see ``follow``)."""

    joiner: int
    outcome: TaskOutcome[Any]


@attrs.frozen
class StoreUnavailable:
    """The server stopped answering (once per outage)."""


@attrs.frozen
class StoreRecovered:
    """The server answers again, renewed and subscribed (once per outage)."""


Report: TypeAlias = (
    Owner
    | Queued
    | Joined
    | Rejected
    | Full
    | Room
    | RemoteStop
    | LeaseLost
    | FollowedOutcome
    | StoreUnavailable
    | StoreRecovered
)

QUEUE_FULL_REASON: Final = "cluster queue is full"
STORE_UNAVAILABLE_REASON: Final = "slot store is unavailable"


class ReportSink(Protocol):
    """Where the keeper sends its reports: the controller's inbox (a memory channel in
    tests). ``send_nowait`` may raise ``trio.WouldBlock``; ``send`` then waits."""

    def send_nowait(self, report: Report, /) -> None: ...

    async def send(self, report: Report, /) -> None: ...


def encode_outcome(outcome: TaskOutcome[Any]) -> str:
    """Encode an outcome for joiners in other processes.

    ``kind``, ``reason``, ``exit_code`` and ``rejection`` are kept, ``error`` is not.
    ``value`` is ``json.dumps(value, allow_nan=False)``; if that raises, or gives more
    than ``2**20`` characters, the value is dropped and ``reason`` says why.
    """
    reason = outcome.reason
    value = "null"
    if outcome.value is not None:
        try:
            value = json.dumps(outcome.value, allow_nan=False)
        except Exception as exc:  # any failure of the user's value: it is not transferable
            value, reason = "null", _NOT_TRANSFERABLE + str(exc)
        else:
            if len(value) > MAX_TRANSFER_CHARS:
                value, reason = "null", _NOT_TRANSFERABLE + "encoded value exceeds 1 MiB"
    head = json.dumps(
        {
            "kind": outcome.kind.value,
            "reason": reason,
            "exit_code": outcome.exit_code,
            "rejection": None if outcome.rejection is None else outcome.rejection.value,
        },
        separators=(",", ":"),
    )
    return f'{head[:-1]},"value":{value}}}'


def decode_outcome(text: str) -> TaskOutcome[Any]:
    """Decode ``encode_outcome``'s text; raise ``ValueError`` for anything else."""
    try:
        data = json.loads(text)
        kind = OutcomeKind(data["kind"])
        rejection = None if data["rejection"] is None else RejectionKind(data["rejection"])
        reason, exit_code, value = data["reason"], data["exit_code"], data["value"]
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"not an encoded outcome ({exc})") from None
    if not (reason is None or isinstance(reason, str)):
        raise ValueError(f"not an encoded outcome (reason {reason!r})")
    if not (exit_code is None or type(exit_code) is int):
        raise ValueError(f"not an encoded outcome (exit_code {exit_code!r})")
    return TaskOutcome(kind, value=value, reason=reason, exit_code=exit_code, rejection=rejection)


# -- the lost-lease rule ------------------------------------------------------------------------


@attrs.define
class LeaseDeadline:
    """When one held lease must count as lost: pure logic, times from any one clock.

    A lease is lost when a renewal is refused, or once ``0.8 * lease_ttl`` has passed
    since the *sending* of its last successful acquisition or renewal: the server set
    the lease's expiry no earlier than that send, so until the deadline the server still
    holds the lease for this owner, whatever the delay of the replies.
    """

    lease_ttl: float
    deadline: float
    lost: str | None = None

    @classmethod
    def acquired(cls, sent_at: float, lease_ttl: float) -> LeaseDeadline:
        """Start the rule for a lease whose acquisition was sent at ``sent_at``."""
        return cls(lease_ttl, sent_at + LOST_LEASE_FRACTION * lease_ttl)

    def renewed(self, sent_at: float) -> None:
        """Record a confirmed renewal that was sent at ``sent_at`` (no effect once lost)."""
        if self.lost is None:
            self.deadline = max(self.deadline, sent_at + LOST_LEASE_FRACTION * self.lease_ttl)

    def refused(self) -> str:
        """Record a refused renewal: the lease is lost now. Return the reason."""
        if self.lost is None:
            self.lost = "lease refused: the server no longer holds it for this owner"
        return self.lost

    def check(self, now: float) -> str | None:
        """Return the reason the lease is lost at ``now``, or ``None`` while it is held."""
        if self.lost is None and now >= self.deadline:
            limit = LOST_LEASE_FRACTION * self.lease_ttl
            self.lost = f"lease expired: no renewal confirmed within {limit:g} s of its sending"
        return self.lost
