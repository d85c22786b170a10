"""``python -m trio_taskvisor slots URL``: what a slot store holds, read only.

For operators of a service whose replicas share cluster slots: every slot with its lease
holder's instance, fence token, lease time left and cluster queue (entries in order, each
with its instance); every live instance (heartbeat time left, the ``lease_ttl`` it runs
with, slots owned, entries queued, limit units held); every limit pool in use (its kind,
units held and by whom, live waiters, and a rate pool's time until its next start).

* By default one snapshot is printed as text: on a terminal, fitted to its width (names
  and queues cut with ``…``, every row shown, as ``ps`` cuts its lines), into a pipe
  whole (before, a terminal wrapped each long row in the middle of its queue); ``--json``
  prints it as one JSON document
  (``to_json``: top-level keys ``slots``, ``instances``, ``pools``); ``--watch`` redraws
  it every ``REFRESH`` seconds (or, after a read that took long, ``PACE`` times that
  read's time) until Ctrl+C, live with ``rich`` when it is installed and stdout is a
  terminal (fitted to the terminal: 80x24 and up), else by clearing the screen and
  printing again (into a pipe: frame after frame, whole). While watching, a failed read
  leaves the last view (its title says when it was read) with the cause under the
  title, and the next refresh tries again.
* A terminal without cursor control (``TERM=dumb``, or ``unknown``: Emacs's shell, some
  CI logs) gets neither: rich's live view draws nothing there (a blank screen until
  Ctrl+C), and clearing the screen takes escapes it does not know. It gets frame after
  frame, each fitted to its size, a blank line between them, and no escape at all.
* Ctrl+C ends the watch with exit status 0, and so does SIGTERM (``timeout``, a
  terminal multiplexer closing a pane): both leave the terminal as they found it (its
  echo on, rich's cursor shown). A watch is no service that a signal stopped, whose
  status says so (the demo's 130 and 143): it is an operator's view, and ending it is
  how it ends.
* It reads with plain commands only: ``SCAN`` for the namespace's keys, then one
  ``MULTI``/``EXEC`` of ``HMGET``, ``PTTL``, ``LRANGE`` and ``GET`` (one consistent
  snapshot of the leases, queues and heartbeats it found), and ``PTTL`` and ``GET`` of
  the heartbeats of instances that the queues name but the scan did not find; for limit
  pools, one ``MULTI``/``EXEC`` of ``TIME``, ``HMGET``, ``HGETALL`` and ``ZRANGE``, then
  ``GET`` and ``HGET`` of the generations that tell live holders and waiters from dead
  ones. It never writes, loads no script and sets no client name: a user with read
  permissions (and ``MULTI``/``EXEC``, and ``TIME``, which is in ``@fast``, not in
  ``@read``) is enough: ``docs/howto-replicas.md`` gives the ACL rules, and a test runs
  the command as a user of exactly those.
* Names (slots, instances, tasks, pools, keys) come from the server, written by any
  process that reaches it: the text shows each character that does not print (a line
  break, a tab, a terminal's escape) as ``repr`` does (``_shown``), so that no name
  breaks the table or drives the terminal; the JSON document keeps them as they are.
  Names are measured and cut in terminal columns (``_cells``: a CJK character or an
  emoji takes two, a combining mark none), so that the columns stay in line and no
  line outgrows the terminal.
* What something else wrote into the namespace does not stop the view: names that
  are not UTF-8 are read as surrogate escapes (shown ``\\xff``, in the JSON document as
  they are); keys of a kind this version does not write (``WRONGTYPE``) read as
  missing and are named under the title, and so are limit pools whose settings or
  ``tat`` are none this version writes ("skipped 1 malformed key: ..."); a fence token
  or a heartbeat's ``lease_ttl`` that is no number the server keeps (text, or a number
  beyond 64 bits: ``stored_integer``) is none (``-``). Before, each failed the whole
  read ("could not be reached"), or the command (a number of 400 digits overflowed a
  float, one of 5,000 is more than ``int`` reads). An error of the reading itself,
  once the server answered, says so ("answered what the command could not read"),
  never "could not be reached".
* The URL and the namespace are checked exactly as ``RedisSlotStore`` checks them (a
  store is built from them), and only its redacted form (``safe_url``) is ever shown.
  When the store cannot be read (a bad URL, a server that is down or silent, refused
  credentials, ...) it prints one line on stderr naming the cause, as
  ``SlotStoreUnavailableError`` does, and exits with status 2; also without coredis
  (the ``redis`` extra). That line quotes what the server answered (an error reply's
  text, the first bytes of another protocol): it is shown as names are (``_shown``),
  as the watch's line of the cause is, so that no server drives the terminal.

The keys it reads (prefix ``tv:{<namespace>}:``): ``lease:<slot>`` (a hash: ``entry``,
``token``, ``stop``; its expiry is the lease's), ``q:<slot>`` (a list of entries, head
first), ``hb:<instance>`` (a process's heartbeat: its ``lease_ttl`` in ms, ``1`` from
earlier versions, which says nothing; its expiry is the heartbeat's). Replicas may run
with different ``lease_ttl`` values during a rolling change of it: the view shows each
one's, and says so under the instances' rule while they differ. An entry is
``"<instance>/<task id>"``; a queued entry is live while its instance's heartbeat exists.
The snapshot's parts are plain values (``ClusterView``) and the text is built by pure
functions (``render``), so both are tested without a server.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sys
import time
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from .. import ConfigError, SlotStoreUnavailableError
from .._slotstore import instance_of, stored_integer
from . import drop_stdout

if TYPE_CHECKING:
    from rich.console import RenderableType

    from ..redis import RedisSlotStore

REFRESH: Final = 0.5  # seconds between two reads of --watch, at least
PACE: Final = 4  # --watch waits this many times a read's duration before the next
REDIS_EXTRA: Final = "the slots command needs the redis extra: pip install 'trio_taskvisor[redis]'"

# -- the snapshot -------------------------------------------------------------------------------


@attrs.frozen
class QueuedEntry:
    """One entry of a slot's cluster queue."""

    entry: str
    """The server's entry id, ``"<instance>/<task id>"``."""
    instance: str
    """The instance that queued it."""
    live: bool
    """Whether its instance's heartbeat exists (a dead one's entries are skipped)."""


@attrs.frozen
class SlotRow:
    """One cluster slot: its lease (if any) and its cluster queue."""

    slot: str
    holder: str | None
    """The lease holder's instance; ``None`` while nobody holds the lease."""
    entry: str | None
    """The lease holder's entry id; ``None`` while nobody holds the lease."""
    fence_token: int | None
    """The lease's fence token; ``None`` while nobody holds the lease."""
    lease_remaining: float | None
    """Seconds until the lease expires unless renewed; ``None`` while nobody holds it."""
    stop_requested_by: str | None
    """The instance that asked the holder to stop (a REPLACE), if one did."""
    queue: tuple[QueuedEntry, ...]
    """The cluster queue, head first."""


@attrs.frozen
class InstanceRow:
    """One live instance (a process whose heartbeat exists)."""

    instance: str
    heartbeat_remaining: float | None
    """Seconds until its heartbeat expires unless renewed (``None``: it never expires)."""
    slots_owned: tuple[str, ...]
    """The slots whose lease it holds, sorted (numbers in names by value)."""
    queued: int
    """Its entries in cluster queues."""
    units_held: int
    """Units of limit pools it holds."""
    lease_ttl: float | None = None
    """The ``lease_ttl`` it runs with, in seconds, as its heartbeat says (``None``: a
    heartbeat of earlier versions, which does not say)."""


@attrs.frozen
class PoolRow:
    """One limit pool on the server (its settings are kept while it is in use)."""

    name: str
    key: str | None
    kind: str
    """``"concurrency"`` or ``"rate"``."""
    held: int
    holders: tuple[tuple[str, int], ...]
    """``(instance, units)`` pairs, sorted by instance."""
    waiting: int
    next_start_in: float | None
    """A rate pool's seconds until a start is allowed (0.0 if now); ``None`` otherwise."""


@attrs.frozen
class ClusterView:
    """What one namespace of a store held at one moment."""

    slots: tuple[SlotRow, ...]
    """Slots with a lease or a queue, sorted by name (numbers in names by value)."""
    instances: tuple[InstanceRow, ...]
    """Live instances, sorted by id (numbers in ids by value)."""
    pools: tuple[PoolRow, ...] = ()
    """Limit pools, sorted by name and key."""
    skipped: tuple[str, ...] = ()
    """Keys of the namespace of a kind this version does not write (written by
    something else), read as missing (not in the JSON document, whose keys are fixed)."""
    malformed: tuple[str, ...] = ()
    """Keys of the namespace whose values this version does not write (a limit pool's
    settings, written by something else), read as missing (not in the JSON document)."""


def _seconds(pttl_ms: int) -> float | None:
    """A ``PTTL`` reply (milliseconds; -1: no expiry) as seconds."""
    return None if pttl_ms < 0 else pttl_ms / 1000


def _natural(text: str) -> tuple[tuple[int, tuple[int, str, str] | str], ...]:
    """A sort key that orders the numbers in names by value ("t:2" before "t:10").

    A number is a run of decimal digits as ``_DIGITS`` finds them (any script's: "٣"),
    not what ``str.isdigit`` also takes ("²", which is no number ``int`` reads), and of
    any length: its value is compared by its digits, not by ``int`` (which refuses more
    than 4,300)."""
    return tuple(
        (0, _value(part)) if part.isdecimal() else (1, part) for part in _DIGITS.split(text)
    )


def _value(digits: str) -> tuple[int, str, str]:
    """A run of decimal digits as a key that orders by value (then by the digits as
    written: "01" after "1")."""
    plain = digits if digits.isascii() else "".join(str(unicodedata.decimal(c)) for c in digits)
    significant = plain.lstrip("0")
    return len(significant), significant, digits


_DIGITS: Final = re.compile(r"(\d+)")


def assemble(
    leases: Mapping[str, tuple[str | None, str | None, str | None, int]],
    queues: Mapping[str, Sequence[str]],
    heartbeats: Mapping[str, int],
    pools: Mapping[str, tuple[str, Sequence[str], int, float | None]] | None = None,
    lease_ttls: Mapping[str, int] | None = None,
    skipped: Sequence[str] = (),
    malformed: Sequence[str] = (),
) -> ClusterView:
    """Build the view from what the server held: ``leases`` (slot: entry, token, stop,
    ``PTTL``), ``queues`` (slot: entries, head first), ``heartbeats`` (live instance:
    ``PTTL``), ``pools`` (pool id: settings, a live holder's instance per unit, live
    waiters, a rate pool's ms until a start) and ``lease_ttls`` (live instance: the
    ``lease_ttl`` in ms its heartbeat holds, if it says); ``skipped``: keys of another
    kind, and ``malformed``: keys of values this version does not write, read as
    missing. A lease without an entry (gone between the scan and the read) is no lease;
    a fence token that is no number the server keeps (written by something else: text,
    or thousands of digits) is none.
    """
    ttls = lease_ttls or {}
    rows: list[PoolRow] = []
    units: dict[str, int] = {}
    for pid, (spec, holders, waiting, next_ms) in (pools or {}).items():
        name, space, key = pid.partition(" ")
        counts: dict[str, int] = {}
        for instance in holders:
            counts[instance] = counts.get(instance, 0) + 1
            units[instance] = units.get(instance, 0) + 1
        rows.append(
            PoolRow(
                name=name,
                key=key if space else None,
                kind=spec.partition(" ")[0],
                held=len(holders),
                holders=tuple(sorted(counts.items(), key=lambda item: _natural(item[0]))),
                waiting=waiting,
                next_start_in=None if next_ms is None else next_ms / 1000,
            )
        )
    rows.sort(key=lambda row: (row.name, row.key or ""))
    held = {slot: lease for slot, lease in leases.items() if lease[0] is not None}
    slots: list[SlotRow] = []
    for slot in sorted(held.keys() | {slot for slot, q in queues.items() if q}, key=_natural):
        entry, token, stop, pttl = held.get(slot, (None, None, None, -2))
        queue = tuple(
            QueuedEntry(e, instance_of(e), instance_of(e) in heartbeats)
            for e in queues.get(slot, ())
        )
        slots.append(
            SlotRow(
                slot=slot,
                holder=None if entry is None else instance_of(entry),
                entry=entry,
                fence_token=stored_integer(token),
                lease_remaining=None if entry is None else _seconds(pttl),
                stop_requested_by=stop,
                queue=queue,
            )
        )
    owned: dict[str, list[str]] = {}
    queued: dict[str, int] = {}
    for s in slots:  # in one pass: a namespace may hold 100,000 slots
        if s.holder is not None:
            owned.setdefault(s.holder, []).append(s.slot)
        for q in s.queue:
            queued[q.instance] = queued.get(q.instance, 0) + 1
    instances = tuple(
        InstanceRow(
            instance=instance,
            heartbeat_remaining=_seconds(pttl),
            slots_owned=tuple(owned.get(instance, ())),
            queued=queued.get(instance, 0),
            units_held=units.get(instance, 0),
            lease_ttl=ttls[instance] / 1000 if instance in ttls else None,
        )
        for instance, pttl in sorted(heartbeats.items(), key=lambda item: _natural(item[0]))
    )
    return ClusterView(tuple(slots), instances, tuple(rows), tuple(skipped), tuple(malformed))


def to_json(view: ClusterView) -> dict[str, Any]:
    """The view as one JSON-ready document: ``slots``, ``instances``, ``pools``; a time
    that is no finite number (a view built by hand) is ``None``, so the document is
    JSON as its standard has it (no ``Infinity``, no ``NaN``)."""
    return {
        "slots": [
            {
                "slot": s.slot,
                "holder": s.holder,
                "entry": s.entry,
                "fence_token": s.fence_token,
                "lease_remaining": _finite(s.lease_remaining),
                "stop_requested_by": s.stop_requested_by,
                "queue": [
                    {"entry": q.entry, "instance": q.instance, "live": q.live} for q in s.queue
                ],
            }
            for s in view.slots
        ],
        "instances": [
            {
                "instance": i.instance,
                "heartbeat_remaining": _finite(i.heartbeat_remaining),
                "slots_owned": list(i.slots_owned),
                "queued": i.queued,
                "units_held": i.units_held,
                "lease_ttl": _finite(i.lease_ttl),
            }
            for i in view.instances
        ],
        "pools": [
            {
                "name": p.name,
                "key": p.key,
                "kind": p.kind,
                "held": p.held,
                "holders": dict(p.holders),
                "waiting": p.waiting,
                "next_start_in": _finite(p.next_start_in),
            }
            for p in view.pools
        ],
    }


def _finite(seconds: float | None) -> float | None:
    return seconds if seconds is not None and math.isfinite(seconds) else None


# -- the text ----------------------------------------------------------------------------------
#
# Instances are long ("host:pid:hex"): the slot rows name them by a number ("2/17": the
# second instance of the instances section, its task #17), and the instances section lists
# each number's instance. Instances that a slot names but whose heartbeat is gone are
# numbered after the live ones and listed with the heartbeat "gone".

Line = tuple[str, str]
"""One line of text and its kind: ``title``, ``error``, ``rule``, ``head``, ``row``, ``note``."""

_LEASE_W: Final = 7
_TOKEN_W: Final = 16  # the scripts' tokens: microseconds since 1970; a longer one widens it


def _shown(text: str) -> str:
    """``text`` as plain text on one line: each character that does not print (a line
    break, a tab, the escape that starts a terminal's control sequence, a byte that is
    not UTF-8, ...) as its escape, as ``repr`` shows it (``\\n``, ``\\x1b``, ``\\xff``).
    Names come from the server, as any process that can reach it wrote them: they must
    not break the table or drive the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    """A character that does not print, as ``repr`` shows it; a byte that was not UTF-8
    (read as a surrogate escape) as ``\\xff``."""
    if "\udc80" <= char <= "\udcff":
        return f"\\x{ord(char) - 0xDC00:02x}"
    return repr(char)[1:-1]


def _cells(text: str) -> int:
    """The terminal columns ``text`` takes: two for a wide or full-width character (CJK,
    most emoji), none for a combining mark or a format character, one for the others
    (as ``wcwidth`` counts them, from the ``unicodedata`` tables)."""
    if text.isascii():
        return len(text)
    return sum(map(_char_cells, text))


def _char_cells(char: str) -> int:
    if unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _head(text: str, cells: int) -> str:
    """The longest start of ``text`` in at most ``cells`` columns."""
    taken = 0
    for end, char in enumerate(text):
        taken += _char_cells(char)
        if taken > cells:
            return text[:end]
    return text


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, its end replaced by ``…`` if cut."""
    if _cells(text) <= width:
        return text
    return _head(text, max(0, width - 1)) + "…"


def _cut_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, its middle replaced by ``…`` if cut: names
    often differ only at their end ("tenant:12", "host:pid:8f3a...")."""
    if _cells(text) <= width:
        return text
    head = _head(text, (width - 1) // 2)
    tail = _head(text[::-1], width - 1 - _cells(head))[::-1]
    return head + "…" + tail


def _pad(text: str, width: int) -> str:
    """``text`` filled with spaces to ``width`` columns."""
    return text + " " * (width - _cells(text))


def _time(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _labels(view: ClusterView) -> dict[str, int]:
    """Each instance's number: live instances first (sorted), then dead ones named."""
    labels = {row.instance: n for n, row in enumerate(view.instances, 1)}
    named: set[str] = set()
    for s in view.slots:
        if s.holder is not None:
            named.add(s.holder)
        named.update(q.instance for q in s.queue)
    for instance in sorted(named - labels.keys(), key=_natural):
        labels[instance] = len(labels) + 1
    return labels


def _entry_label(entry: str, labels: Mapping[str, int]) -> str:
    instance, _, task = entry.rpartition("/")
    return f"{labels[instance]}/{_shown(task)}"


def _queue_text(s: SlotRow, labels: Mapping[str, int]) -> str:
    if not s.queue:
        return "-"
    return " ".join(_entry_label(q.entry, labels) + ("" if q.live else "†") for q in s.queue)


def _fit(rows: list[Line], budget: int, what: str) -> list[Line]:
    """At most ``budget`` rows: the first ones, and a last that counts the rest."""
    if len(rows) <= budget:
        return rows
    shown = max(0, budget - 1)
    return [*rows[:shown], ("note", f"  … {len(rows) - shown} more {what}")]


def _budgets(room: int, slots: int, instances: int, pools: int) -> tuple[int, int, int]:
    """Rows for each section out of ``room``: all when they fit; else pools take at most
    a sixth, instances at most a third of the rest (but what the slots leave), slots the
    rest (each section at least one row)."""
    if slots + instances + pools <= room:
        return slots, instances, pools
    pool_rows = min(pools, max(1, room // 6))
    rest = room - pool_rows
    instance_rows = min(instances, max(1, rest // 3))
    slot_rows = max(1, rest - instance_rows)
    if slots < slot_rows:
        slot_rows = slots
        instance_rows = min(instances, max(1, rest - slots))
    return slot_rows, instance_rows, pool_rows


def _row(*cells: tuple[str, int]) -> str:
    """Cells cut to their widths, two spaces apart (a width of 0: the cell as it is)."""
    return "  ".join(text if w == 0 else _pad(_cut(text, w), w) for text, w in cells).rstrip()


def _name(text: str, width: int) -> tuple[str, int]:
    """A name's cell: cut in the middle to ``width``."""
    return _cut_middle(text, width), width


def render(
    view: ClusterView,
    *,
    title: str,
    hint: str = "",
    error: str | None = None,
    width: int | None = None,
    height: int | None = None,
) -> list[Line]:
    """The view as lines of text under ``title``, fitted to ``width`` x ``height``
    (``None``: unbounded, nothing is cut). ``hint`` ends the title line, never cut (the
    title is); ``error``, if any, is the next line.

    Slot names, instances and queues are cut with ``…`` to the width (the numbers and
    times never are); when the rows do not fit the height, each section shows its first
    rows and counts the others.
    """
    labels = _labels(view)
    live = {i.instance: i for i in view.instances}

    # Slots: SLOT  HOLDER  FENCE TOKEN  LEASE  QUEUE (the queue takes what is left).
    holders = ["-" if s.entry is None else _entry_label(s.entry, labels) for s in view.slots]
    queues = [f"{len(s.queue)}: {_queue_text(s, labels)}" if s.queue else "-" for s in view.slots]
    leases = [_time(s.lease_remaining) + ("!" if s.stop_requested_by else "") for s in view.slots]
    slot_names = [_shown(s.slot) for s in view.slots]
    slot_w = max([4, *map(_cells, slot_names)])
    holder_w = max([6, *map(_cells, holders)])
    if width is not None:
        slot_w = min(slot_w, 20 + max(0, width - 80) // 2)
    tokens = ["-" if s.fence_token is None else str(s.fence_token) for s in view.slots]
    token_w = max([_TOKEN_W, *map(len, tokens)])  # up to 19 digits, never cut
    fixed_w = slot_w + holder_w + token_w + _LEASE_W + 8
    queue_w = 0 if width is None else max(8, width - fixed_w)
    slot_head = _row(
        ("SLOT", slot_w),
        ("HOLDER", holder_w),
        ("FENCE TOKEN", token_w),
        ("LEASE", _LEASE_W),
        ("QUEUE (head first)", 0),
    )
    slot_rows: list[Line] = [
        (
            "row",
            _row(
                _name(slot, slot_w),
                (holder, holder_w),
                (token, token_w),
                (lease, _LEASE_W),
                (queue, queue_w),
            ),
        )
        for slot, holder, token, lease, queue in zip(
            slot_names, holders, tokens, leases, queues, strict=True
        )
    ]

    # Instances: #  INSTANCE  HEARTBEAT  LEASE TTL  OWNS  QUEUED  UNITS, numbered as the
    # slots name them.
    number_w = len(str(len(labels))) if labels else 1
    instance_w = max([8, *(_cells(_shown(name)) for name in labels)])
    if width is not None:
        instance_w = min(instance_w, max(12, width - (number_w + 9 + 9 + 5 + 6 + 5 + 12)))

    def instance_row(name: str, n: int) -> str:
        i = live.get(name)
        if i is None:
            return _row((str(n), number_w), _name(_shown(name), instance_w), ("gone", 9))
        return _row(
            (str(n), number_w),
            _name(_shown(name), instance_w),
            (_time(i.heartbeat_remaining), 9),
            ("-" if i.lease_ttl is None else f"{i.lease_ttl:g} s", 9),
            (str(len(i.slots_owned)), 5),
            (str(i.queued), 6),
            (str(i.units_held), 5),
        )

    instance_head = _row(
        ("#", number_w),
        ("INSTANCE", instance_w),
        ("HEARTBEAT", 9),
        ("LEASE TTL", 9),
        ("OWNS", 5),
        ("QUEUED", 6),
        ("UNITS", 5),
    )
    instance_rows: list[Line] = [
        ("row", instance_row(name, n)) for name, n in sorted(labels.items(), key=_second)
    ]

    # Limit pools: POOL  KIND  HELD  WAITING  NEXT START.
    names = [_shown(p.name if p.key is None else f"{p.name}[{p.key}]") for p in view.pools]
    pool_w = max([4, *map(_cells, names)])
    if width is not None:
        pool_w = min(pool_w, max(8, width - (11 + 5 + 7 + 10 + 8)))
    pool_head = _row(("POOL", pool_w), ("KIND", 11), ("HELD", 5), ("WAITING", 7), ("NEXT START", 0))
    pool_rows: list[Line] = [
        (
            "row",
            _row(
                _name(name, pool_w),
                (p.kind, 11),
                (str(p.held), 5),
                (str(p.waiting), 7),
                (_time(p.next_start_in), 0),
            ),
        )
        for p, name in zip(view.pools, names, strict=True)
    ]

    budgets = (len(slot_rows), len(instance_rows), len(pool_rows))
    if height is not None:
        # The title, the error and the skipped keys (two lines), three rules and three heads (or
        # "none") are always shown.
        notes = (error is not None) + bool(view.skipped) + bool(view.malformed)
        budgets = _budgets(max(3, height - 7 - notes), *budgets)
    held = sum(s.holder is not None for s in view.slots)
    queued = sum(len(s.queue) for s in view.slots)
    slot_rule = f"slots: {len(view.slots)}, {held} held, {queued} queued"
    # The legend: the marks shown first, then how entries are named, as far as they fit.
    legend: list[str] = []
    if any(s.stop_requested_by for s in view.slots):
        legend.append("! = stop asked")
    if any(not q.live for s in view.slots for q in s.queue):
        legend.append("† = instance gone")
    if view.slots:
        legend.append("n/t = instance n, task t")
    shown: list[str] = []
    for part in legend:
        if width is None or _cells(slot_rule) + 3 + len("; ".join([*shown, part])) <= width:
            shown.append(part)
    if shown:
        slot_rule += "   " + "; ".join(shown)
    gone = len(labels) - len(view.instances)
    instance_rule = f"instances: {len(view.instances)} live" + (
        f", {gone} gone (named by slots)" if gone else ""
    )
    if len({i.lease_ttl for i in view.instances if i.lease_ttl is not None}) > 1:
        instance_rule += "   lease_ttl differs (a rolling change?)"
    if hint:
        room = None if width is None else max(0, width - _cells(hint) - 2)
        title = (title if room is None else _pad(_cut(title, room), room)) + "  " + hint
    lines: list[Line] = [("title", title)]
    if error is not None:
        lines.append(("error", _shown(error)))
    for keys, kind in ((view.skipped, "{} of another kind"), (view.malformed, "malformed {}")):
        if keys:
            what = kind.format("key" if len(keys) == 1 else "keys")
            lines.append(("error", f"skipped {len(keys)} {what}: {', '.join(map(_shown, keys))}"))
    sections = (
        (slot_rule, slot_head, slot_rows),
        (instance_rule, instance_head, instance_rows),
        (f"limit pools: {len(view.pools)}", pool_head, pool_rows),
    )
    for (rule, head, rows), budget, what in zip(
        sections, budgets, ("slots", "instances", "pools"), strict=True
    ):
        lines.append(("rule", rule))
        if rows:
            lines.append(("head", head))
            lines.extend(_fit(rows, budget, what))
        elif what == "slots" and not (view.instances or view.pools):
            # Nothing at all: most often another namespace than the replicas' one.
            lines.append(("note", "  none: nothing in this namespace (see --namespace)"))
        else:
            lines.append(("note", "  none on the server" if what == "pools" else "  none"))
    if width is not None:
        lines = [(kind, _cut(text, width)) for kind, text in lines]
    if height is not None:
        lines = lines[:height]
    return lines


def _second(item: tuple[str, int]) -> int:
    return item[1]


# -- reading -------------------------------------------------------------------------------------


async def read_cluster(store: RedisSlotStore) -> ClusterView:
    """Read what ``store``'s namespace holds, writing nothing (a checkpoint).

    Bounded by ``store.connect_timeout``; raises ``SlotStoreUnavailableError`` naming
    the cause when the server cannot be read (``_redis_client.read_namespace``).
    """
    from .._redis_client import read_namespace  # imports coredis: the redis extra

    namespace = await read_namespace(store)
    pools = {
        pid: (p.spec, p.holders, p.waiting, p.next_start_ms) for pid, p in namespace.pools.items()
    }
    return assemble(
        namespace.leases,
        namespace.queues,
        namespace.heartbeats,
        pools,
        namespace.lease_ttls,
        namespace.skipped,
        namespace.malformed,
    )


# -- showing ---------------------------------------------------------------------------------------


def _title(store: RedisSlotStore, read_at: float, cells: int | None = None) -> str:
    """What is shown, and when it was read (wall clock, local time), in at most
    ``cells`` columns (``None``: unbounded): a long namespace or URL is cut before the
    time is, which tells how old the view is when a read fails."""
    stamp = time.strftime("%H:%M:%S", time.localtime(read_at))
    what = _shown(f"slots of {store.namespace!r} at {store.safe_url}")
    read = f"  read at {stamp}"
    if cells is not None:
        what = _cut(what, max(0, cells - len(read)))
    return what + read


def _text_of(lines: Iterable[Line]) -> str:
    return "\n".join(text for _, text in lines)


_STYLES: Final = {
    "title": "bold",
    "error": "bold red",
    "rule": "bold cyan",
    "head": "dim",
    "row": "",
    "note": "dim",
}
_HINT: Final = "Ctrl+C: quit"


def _rich_frame(lines: Iterable[Line]) -> RenderableType:
    from rich.text import Text

    frame = Text(no_wrap=True, overflow="ellipsis")
    for n, (kind, text) in enumerate(lines):
        if n:
            frame.append("\n")
        frame.append(text, style=_STYLES[kind])
    return frame


class _Watch:
    """The last successful read of a watch, and the error of the last read if it failed
    (the frame then shows the last view, read at the time its title says)."""

    def __init__(self, store: RedisSlotStore, view: ClusterView, read_at: float) -> None:
        self.store = store
        self.view = view
        self.read_at = read_at
        self.error: str | None = None
        self._failing_since: float | None = None
        self.pause = REFRESH
        """Seconds until the next read: ``PACE`` times the last successful read's, at least
        ``REFRESH`` (a read of a large namespace is one long ``EXEC`` on the server: 50,000
        slots, about 130 ms, during which it serves nothing else). After a failed read,
        ``REFRESH``: the view shows the recovery soon (a read that timed out took
        ``connect_timeout`` of the server's silence, and cost it nothing)."""

    async def read(self) -> None:
        started = trio.current_time()
        try:
            self.view = await read_cluster(self.store)
        except SlotStoreUnavailableError as exc:
            self.pause = REFRESH
            if self._failing_since is None:
                self._failing_since = time.time()
            since = time.strftime("%H:%M:%S", time.localtime(self._failing_since))
            # The title shows the URL: the cause is what fits next to it.
            cause = str(exc).removeprefix(f"slot store {self.store.safe_url} ")
            self.error = f"UNAVAILABLE since {since}: {cause}"
        else:
            self.read_at, self.error, self._failing_since = time.time(), None, None
            self.pause = max(REFRESH, PACE * (trio.current_time() - started))

    def lines(self, width: int | None, height: int | None) -> list[Line]:
        room = None if width is None else width - _cells(_HINT) - 2  # as render leaves it
        title = _title(self.store, self.read_at, room)
        return render(
            self.view, title=title, hint=_HINT, error=self.error, width=width, height=height
        )


async def _watch_rich(watch: _Watch) -> None:
    from rich.console import Console
    from rich.live import Live

    from .demo import no_echo

    console = Console()
    with no_echo(), Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            size = console.size
            # One line short of the terminal: the last frame stays whole above the prompt.
            live.update(_rich_frame(watch.lines(size.width, size.height - 1)), refresh=True)
            await trio.sleep(watch.pause)
            await watch.read()


async def _watch_plain(watch: _Watch) -> None:
    from .demo import no_echo

    terminal = sys.stdout.isatty()
    redraw = terminal and not _dumb_terminal()
    with no_echo():
        while True:
            if terminal:
                size = shutil.get_terminal_size()
                text = _text_of(watch.lines(size.columns, size.lines - 1))
                if redraw:  # home and clear the screen, then the frame: a plain redraw
                    print("\x1b[H\x1b[2J" + text, flush=True)
                else:  # no cursor control: frame after frame, a blank line between
                    print(text + "\n", flush=True)
            else:
                print(_text_of(watch.lines(None, None)) + "\n", flush=True)
            await trio.sleep(watch.pause)
            await watch.read()


async def run(store: RedisSlotStore, *, watch: bool, as_json: bool, live: bool) -> None:
    """Print one snapshot (text or JSON), or watch until cancelled or SIGTERM (``live``:
    with rich).

    The first read's ``SlotStoreUnavailableError`` propagates, watching or not.
    """
    view = await read_cluster(store)
    read_at = time.time()
    if as_json:
        print(json.dumps(to_json(view), indent=2, allow_nan=False))
    elif not watch:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        print(_text_of(render(view, title=_title(store, read_at, width), width=width)))
    else:
        draw = _watch_rich if live else _watch_plain
        async with trio.open_nursery() as nursery:
            await nursery.start(_end_on_sigterm, nursery.cancel_scope)
            await draw(_Watch(store, view, read_at))


async def _end_on_sigterm(
    scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Cancel ``scope`` (the watch) at the first SIGTERM: the watch ends as at Ctrl+C,
    its terminal restored (by default SIGTERM ended the process at once, its echo off)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel(reason="SIGTERM ends the watch")
            return


def _dumb_terminal() -> bool:
    """Whether ``TERM`` names a terminal without cursor control, as rich tells one
    (``dumb``: Emacs's shell, some CI logs; ``unknown``), where its live view draws
    nothing."""
    return os.environ.get("TERM", "").lower() in ("dumb", "unknown")


def _live_available() -> bool:
    try:
        import rich  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        return False
    return True


def main(
    url: str, *, namespace: str = "taskvisor", watch: bool = False, as_json: bool = False
) -> int:
    """Run the command; the exit status: 0, or 2 after a one-line error on stderr.

    Ctrl+C or SIGTERM ends ``--watch`` with status 0 (watching ends no other way).
    """
    try:
        from ..redis import RedisSlotStore
    except ImportError:
        print(f"error: {REDIS_EXTRA}", file=sys.stderr)
        return 2
    try:
        store = RedisSlotStore(url, namespace=namespace)
    except ConfigError as exc:
        print(f"error: {_shown(str(exc))}", file=sys.stderr)
        return 2
    live = watch and not as_json and sys.stdout.isatty() and not _dumb_terminal()
    live = live and _live_available()
    try:
        try:
            trio.run(lambda: run(store, watch=watch, as_json=as_json, live=live))
        except BaseExceptionGroup as group:
            if group.split((KeyboardInterrupt, BrokenPipeError))[1] is not None:
                raise
            if group.subgroup(KeyboardInterrupt) is not None:
                # Ctrl+C during a read: it arrived inside the client's task group.
                raise KeyboardInterrupt from None
            raise BrokenPipeError from None  # a frame's write, in the watch's nursery
    except SlotStoreUnavailableError as exc:
        # Its cause may quote the server's error text: shown as names are.
        print(f"error: {_shown(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not watch:
            raise
    except BrokenPipeError:  # the reader of stdout went away (as ``| head`` does)
        drop_stdout()
    return 0
