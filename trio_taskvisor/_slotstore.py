"""The lease protocol's values: entry ids, what the server tells about a slot, the
keeper's reports, the outcome codec and the lost-lease rule.

Plain values and pure functions: no trio and no coredis here, so the rules below can be
property-tested directly. The store's configuration (``RedisSlotStore``) is in
``_config``, the server side in ``_redis_scripts``, the lease keeper in ``_keeper``.

Decisions the design leaves open:

* The lost-lease deadline is inclusive: at ``sent + 0.8 * lease_ttl`` exactly the lease
  counts as lost. Deadlines never move backwards (a late reply to an older renewal does
  not shorten them), and a renewal confirmed after the loss does not revive the lease.
* The outcome codec writes one JSON object per outcome; values of any kind are carried
  (normally only ``COMPLETED`` has one). Text that is not such an object raises
  ``ValueError`` on decoding.
* Entry ids are built (``entry_id``) and parsed (``parse_entry_id``) here only; the Lua
  scripts only split off the instance.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
from typing import Any, Final, Protocol, TypeAlias

import attrs

from ._exceptions import error_text
from ._outcome import OutcomeKind, RejectionKind, TaskOutcome

LOST_LEASE_FRACTION: Final = 0.8
"""A lease is lost this fraction of ``lease_ttl`` after its last confirmed send."""

MAX_TRANSFER_CHARS: Final = 2**20
"""The longest encoded value an outcome carries across processes."""

_NOT_TRANSFERABLE: Final = "value not transferable: "


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


def stored_integer(text: str | None) -> int | None:
    """Return ``text`` as the integer the server keeps (``INCR``'s range: ASCII digits,
    below 2**63), or ``None`` for anything else: no text, no number, or a number out of
    that range (written by something else, even of thousands of digits, which ``int``
    refuses and a float cannot hold)."""
    if text is None or len(text) > _INTEGER_DIGITS or not (text.isascii() and text.isdecimal()):
        return None
    value = int(text)
    return value if value < 2**63 else None


_INTEGER_DIGITS: Final = len(str(2**63 - 1))


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
    ``STORE_UNAVAILABLE``, ``SHUTTING_DOWN`` (or the reason a server marker names);
    ``reason`` replaces the kind's usual words (the server's error for a call it
    answered with one)."""

    slot: str
    task_id: int
    kind: RejectionKind
    reason: str | None = None


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
    """Where the keeper sends its reports: the controller's inbox, which takes every
    report at once (an unbounded memory channel in tests)."""

    def send_nowait(self, report: Report, /) -> None: ...


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
            value, reason = "null", _NOT_TRANSFERABLE + error_text(exc)
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

    def refused(self, why: str | None = None) -> str:
        """Record a refused renewal (``why``: other than the server no longer holding
        the lease): the lease is lost now. Return the reason."""
        if self.lost is None:
            self.lost = f"lease refused: {why or 'the server no longer holds it for this owner'}"
        return self.lost

    def check(self, now: float) -> str | None:
        """Return the reason the lease is lost at ``now``, or ``None`` while it is held."""
        if self.lost is None and now >= self.deadline:
            limit = LOST_LEASE_FRACTION * self.lease_ttl
            self.lost = f"lease expired: no renewal confirmed within {limit:g} s of its sending"
        return self.lost
