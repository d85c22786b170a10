"""The coredis adapter: the only module that imports ``coredis`` and ``anyio``.

It implements the lease keeper's seam (``_keeper.ServerClient`` and
``_keeper.Connection``) and classifies the client's errors (what the server refused, or
why it could not be reached). The keeper's logic imports without the ``redis`` extra;
the supervisor builds a ``RedisClient`` and hands it to the keeper. ``read_namespace``
reads what a namespace holds for the ``slots`` command, with plain read commands only.

Decisions:

* The keeper's round trips and its subscription go over trio sockets of their own,
  read in the keeper's tasks; coredis gives what they need to open (the
  address or the sentinels' primary, credentials, TLS context, client name), its RESP3
  parser and its error classes. Through coredis's connections each command took a pass
  of its writer task, each reply one of its reader task, and each pushed message two
  of the reader and one of its pub/sub task; on an idle machine every pass is a cold
  task step, and a hand-over waited for all of them (benchmark 10, the hand-over and
  3x50 rows).
* A round trip the keeper starts in the caller's task (``send_nowait``, while its loop
  is idle) is written with the OS's ``write`` on the socket, which is non-blocking: trio
  writes only in async calls. Whatever the socket does not take at once is written
  before the replies are read. A TLS stream, a full or broken socket, or a platform
  where a socket is not a file (Windows) write nothing there: the keeper's loop sends
  the round trip as usual.
* Consecutive calls of a submit or a release in a round trip go as one call of the
  script's grouped form (``scripts.GROUPED``), which answers each call as its own
  call would, an error too: the server runs one ``EVALSHA`` for the submits of a
  round trip instead of one each (benchmark 10, the 3x50 callers rows). A single call
  goes as it is, so a hand-over's release costs the server nothing more.
* No retry policy anywhere: a broken connection or subscription ends (the keeper opens
  a fresh connection), never reconnects silently to a server that lost the state. The
  one exception is a round-trip socket the server closed while it was idle (its
  timeout, a kill), found when nothing comes back: once more on a fresh socket, as a
  connection pool would.
* A ``NOSCRIPT`` reply (the server lost its script cache in a restart) loads every
  script and sends again only the calls that did not run.
* A subscription that has carried nothing for a renewal interval (``lease_ttl / 3``)
  sends a ``PING`` on its socket, and ends when nothing answers within
  ``connect_timeout`` (any reply counts, an error too): the keeper then opens a fresh
  connection, as for any subscription that ended. A subscription is idle most of the
  time, and its connection can die without a reset (a NAT's or a load balancer's idle
  timeout, a firewall that forgot it): it waited for ever, and every hand-over to the
  process, and every stop of its owners another process asked for, waited for the
  next renewal to find it, with nothing logged.
* The client's own bounds (connecting with TCP and TLS, a subscription's confirmation)
  are half the keeper's ``connect_timeout``, so their errors arrive within the keeper's
  bound; a server that accepts a connection and says nothing is the keeper's to time
  out ("did not answer").
* A plain URL that names a sentinel (its ``HELLO`` answers ``mode sentinel``) is refused
  as such when a socket opens ("is a sentinel, not a data node: name the primary, or
  the sentinels as redis+sentinel://..."), at start and in the slots command, as a
  Sentinel URL that names a server is. It read as the sentinel's refusal of the first
  command the store sent ("refused the lease scripts as unknown commands: unknown
  command 'EVALSHA', ..."; the slots command's 'SCAN'; with a database, 'SELECT').
* With a Sentinel URL each socket asks the sentinels for the primary when it opens
  (and the primary confirms its role with ``ROLE``); since the keeper opens a fresh
  connection after every failed round trip, a failover (even to a frozen primary,
  which would keep a reused client waiting) is followed like a restart of the server.
  When no primary is found the error says why: the sentinels refused the credentials
  (their own password is the URL's ``sentinel_password``) or the ``SENTINEL`` command to
  this user (an ACL; the next sentinel is asked first), no sentinel answered (the
  first sentinel's error chained), or the sentinels that answered know no such service.
  Credentials the primary refuses say "its primary": with two passwords in one URL, the
  error tells which one is wrong.
* A server that asks for a password the URL does not give says so ("asks for a
  password, and the URL gives none"), not that it refused credentials never sent.
* A socket that the server resets as it opens, before the handshake's answer, is a
  dropped connection (``OpeningResetError``, a coredis ``ConnectionError``): the start
  tries it again until ``connect_timeout``, as a server that closes it, and names it
  "reset the connection as it opened", with the ``maxclients`` it may be (a server at
  its limit whose error reply the reset overtook, or a proxy at its own). It was trio's
  ``BrokenResourceError``, which the start raised at the first reset, in milliseconds,
  as "could not be reached". A reset can say no more: the error only guesses at why.
"""

from __future__ import annotations

import itertools
import math
import os
import ssl
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from operator import itemgetter
from typing import Any, cast

import anyio
import anyio.abc
import attrs
import coredis
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from coredis.connection import (
    SentinelManagedConnection,
    TCPConnection,
    TCPLocation,
)
from coredis.constants.resp import DataType
from coredis.exceptions import (
    AuthenticationError,
    AuthenticationRequiredError,
    AuthorizationError,
    BusyLoadingError,
    InvalidResponse,
    NoScriptError,
    PrimaryNotFoundError,
    ProtocolError,
    ReadOnlyError,
    RedisClusterError,
    RedisError,
    ResponseError,
    StalePrimaryError,
    UnknownCommandError,
    WrongTypeError,
)
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.parser import NotEnoughData, Parser
from coredis.pool import SentinelConnectionPool
from coredis.retry import NoRetryPolicy

from . import _redis_scripts as scripts
from ._config import RedisSlotStore, TLSSettings
from ._exceptions import SlotStoreUnavailableError
from ._keeper import (
    BYE,
    REPLICAS,
    RUN_ID,
    WAIT,
    Call,
    Connection,
    describe,
    first_leaf,
    secrets_of,
)
from ._slotstore import instance_of, stored_integer


class _RedisConnection:
    """A ``Connection`` over sockets of its own, read in the keeper's tasks.

    The coredis client of the connection gives the server's address (under Sentinel,
    the primary the sentinels name when a socket opens), the credentials, the TLS
    context and the client name; its RESP3 parser reads the replies, an error reply as
    coredis's exception for it. The sockets themselves are ours: coredis passes every
    command through its writer task and every reply through its reader task, and a
    hand-over waits for each of those passes in the releasing process (its round trip)
    and in the next owner's (the pushed grant): benchmark 10, hand-over rows.

    Round trips go one at a time (the keeper's; ``send_nowait`` may start one in the
    caller's task, then ``replies`` finishes it), on one socket from the first to the
    last; the subscription has its own. An error reply is its call's reply; any other
    error (a broken or closed socket) is raised, and a round trip that did not finish
    (an error, a cancellation) closes its socket: the keeper opens a fresh
    ``Connection`` after a failed round trip.
    """

    def __init__(self, client: coredis.Redis[str], store: RedisSlotStore) -> None:
        self._client = client
        self._store = store
        common = scripts.common_args(store.key_prefix, store.lease_ttl, store.keep)
        # Each script's call starts the same way (EVALSHA, its sha, no keys, the common
        # arguments): packed once, which halves the packing of a submit (benchmark 10,
        # the 3x50 callers rows).
        self._evalsha = {
            script.name: _head(b"EVALSHA", script.sha, "0", *common) for script in scripts.SCRIPTS
        }
        self._wire: _Wire | None = None

    async def close(self) -> None:
        """Close the round trips' socket."""
        wire, self._wire = self._wire, None
        if wire is not None:
            await trio.aclose_forcefully(wire.stream)

    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        return await self._answered(calls, await self._call(calls))

    def send_nowait(self, calls: Sequence[Call]) -> bool:
        wire = self._wire
        return wire is not None and wire.send_nowait(self._commands(calls)[0])

    async def replies(self, calls: Sequence[Call]) -> list[object]:
        return await self._answered(calls, await self._call(calls, written=True))

    async def _call(self, calls: Sequence[Call], written: bool = False) -> list[object]:
        """``_send`` of ``calls`` (see ``_commands``): a reply per call, an error reply
        as its exception; any other error is raised."""
        commands, spans = self._commands(calls)
        replies = await self._send(commands, written)
        if len(spans) != len(calls):
            spread: list[object] = []
            for reply, span in zip(replies, spans, strict=True):
                if span == 1:
                    spread.append(reply)
                elif isinstance(reply, list):
                    spread += cast("list[object]", reply)
                else:  # the grouped call's own error (NOSCRIPT, a refusal) is each call's
                    spread += [reply] * span
            replies = spread
        for reply in replies:
            if isinstance(reply, BaseException) and not isinstance(reply, ResponseError):
                raise reply
        return replies

    async def _answered(self, calls: Sequence[Call], replies: list[object]) -> list[object]:
        """``replies`` to ``calls`` as ``round_trip`` returns them: the calls the server
        refused with NOSCRIPT sent again, the ``INFO`` replies read."""
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            # The server lost its script cache (a restart): load every script and send
            # again only the calls that did not run (a NOSCRIPT call changed nothing).
            load = _head(b"SCRIPT", "LOAD")
            loads = [(load, (script.source,)) for script in scripts.SCRIPTS]
            for reply in await self._send(loads):
                if isinstance(reply, BaseException):
                    raise reply
            # The WAIT that ends the batch must follow the calls sent again, too.
            missing += [i for i, (name, _) in enumerate(calls) if name == WAIT]
            again = await self._call([calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for i, (name, _) in enumerate(calls):
            info = replies[i]
            if name == RUN_ID and isinstance(info, str):
                replies[i] = _info_field(info, "run_id")
            elif name == REPLICAS and isinstance(info, str):
                replies[i] = _online_replicas(info)
        return replies

    def _commands(self, calls: Sequence[Call]) -> tuple[list[_Command], list[int]]:
        """The commands of ``calls``, and how many calls each one carries: consecutive
        calls of a script in ``scripts.GROUPED`` go as calls of its grouped form, up to
        ``scripts.GROUP_SIZE`` in each."""
        if len(calls) == 1:  # a hand-over's release, sent alone: the shortest way
            return [self._command(*calls[0])], [1]
        commands: list[_Command] = []
        spans: list[int] = []
        for name, run in itertools.groupby(calls, key=_name):
            grouped = scripts.GROUPED.get(name)
            if grouped is None:
                for _, args in run:
                    commands.append(self._command(name, args))
                    spans.append(1)
                continue
            argss = [args for _, args in run]
            for at in range(0, len(argss), scripts.GROUP_SIZE):
                group = argss[at : at + scripts.GROUP_SIZE]
                if len(group) > 1 and all(len(args) == grouped.arity for args in group):
                    head = self._evalsha[grouped.script.name]
                    commands.append((head, tuple(itertools.chain(*group))))
                    spans.append(len(group))
                else:
                    commands += [self._command(name, args) for args in group]
                    spans += [1] * len(group)
        return commands, spans

    def _command(self, name: str, args: scripts.Args) -> _Command:
        if name == RUN_ID:
            return (_INFO, ("server",))
        if name == BYE:
            return (_DEL, (f"{self._store.key_prefix}hb:{args[0]}",))
        if name == WAIT:
            return (_WAIT, args)
        if name == REPLICAS:
            return (_INFO, ("replication",))
        return (self._evalsha[name], args)

    async def _send(self, commands: Sequence[_Command], written: bool = False) -> list[object]:
        """Send ``commands`` in one write (``written``: ``send_nowait`` wrote them);
        their replies (see the class docstring)."""
        wire = self._wire
        reused = wire is not None
        if wire is None:
            written = False  # not on this socket
            wire = self._wire = await open_wire(self._client, self._store)
        try:
            try:
                if written:
                    replies = await wire.answers(len(commands))
                else:
                    replies = await wire.call(commands)
            except (RedisConnectionError, OSError, trio.BrokenResourceError):
                if not reused or wire.received:
                    raise
                # Nothing came back on a socket opened for an earlier round trip: the
                # server closed it while it was idle (its timeout, a kill). Once more,
                # on a fresh socket, as a pool would (the scripts' replays are safe).
                await self.close()
                wire = self._wire = await open_wire(self._client, self._store)
                replies = await wire.call(commands)
        except BaseException:
            await self.close()  # where the next reply would start is unknown
            raise
        return replies

    async def subscribe(
        self, channel: str, deliver: Callable[[str], None], subscribed: Callable[[], None]
    ) -> None:
        # A socket of its own, to the node the sentinels name at this moment: if that
        # is not the round trips' node, the next round trip fails and the keeper opens
        # a fresh connection and subscription. No reconnection here: a broken
        # subscription ends.
        wire = await open_wire(self._client, self._store, (_head(b"SUBSCRIBE"), (channel,)))
        # A subscription is idle most of the time, and a connection that dies without a
        # word (a NAT's or a load balancer's idle timeout, a firewall that drops its
        # state) would leave it waiting for ever: every hand-over to this process would
        # wait for a renewal to find it. After a renewal interval without a message it
        # asks the server with a PING; no answer within ``connect_timeout`` ends it.
        idle, bound = self._store.lease_ttl / 3, self._store.connect_timeout
        async with wire.stream:
            subscribed()
            while True:
                kind, value = await _heard(wire, idle, bound)
                if kind == DataType.PUSH and cast("list[object]", value)[0] == "message":
                    # (bytes that are not UTF-8, in a name another client wrote: as
                    # surrogate escapes, as the scripts' JSON replies read them)
                    message = cast("list[object]", value)[2]
                    if isinstance(message, bytes):
                        message = message.decode("utf-8", "surrogateescape")
                    deliver(str(message))


async def open_wire(client: coredis.Redis[str], store: RedisSlotStore, *setup: _Command) -> _Wire:
    """A socket to ``client``'s server (a sentinel's primary confirming its role), past
    its handshake (``HELLO`` with the client's credentials and name, ``SELECT``) and
    the ``setup`` commands; bounded by ``_client_timeout``. The keeper's connection and
    the slots command's reads open theirs here."""
    pool = client.connection_pool
    options = pool.connection_kwargs
    hello = ["3"]
    username, password = options.get("username"), options.get("password")
    if username or password:
        hello += ["AUTH", username or "default", password or ""]
    if (name := options.get("client_name")) is not None:
        hello += ["SETNAME", name]
    commands: list[_Command] = [(_head(b"HELLO"), tuple(hello))]
    if db := options.get("db"):
        commands.append((_head(b"SELECT"), (str(db),)))
    location: TCPLocation
    role_at: int | None = None  # where the ROLE reply is, under Sentinel
    if isinstance(pool, SentinelConnectionPool):
        role_at = len(commands)
        commands.append((_head(b"ROLE"), ()))
        location = await pool.get_primary_location()  # bounded per sentinel
    else:
        location = cast("TCPLocation", pool.location)
    timeout = _client_timeout(store)
    try:
        with trio.fail_after(timeout):
            wire = _Wire(await _open_stream(location, options.get("ssl_context")))
    except trio.TooSlowError:
        # As coredis's own connection errors: its ConnectionError, the cause chained.
        late = TimeoutError(f"{timeout:g} s passed")
        raise RedisConnectionError(f"no connection to {location} in time") from late
    except (OSError, trio.BrokenResourceError) as exc:
        # trio's BrokenResourceError of a failed TLS handshake says nothing itself.
        cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else None
        raise RedisConnectionError(f"no connection to {location}") from (cause or exc)
    try:
        # A silent server is the keeper's to time out ("did not answer"); only a
        # subscription's confirmation has the client's own bound.
        with trio.fail_after(timeout if setup else math.inf):
            replies = await wire.call([*commands, *setup], handshake=True)
        _check_handshake(replies, role_at, location)
    except BaseException as exc:
        await trio.aclose_forcefully(wire.stream)
        if isinstance(exc, trio.TooSlowError):
            raise TimeoutError(f"no confirmation within {timeout:g} s") from None
        reset = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
        if isinstance(reset, ConnectionError):  # the OS's: a reset, a broken pipe
            raise OpeningResetError(f"{location} reset the connection as it opened") from reset
        raise
    return wire


class OpeningResetError(RedisConnectionError):
    """The server (or a proxy in front of it) accepted a new socket, then reset it
    before it answered the handshake: a dropped connection, which may pass by itself
    (a server at its ``maxclients`` whose error reply the reset overtook, a proxy's own
    limit of clients)."""


_name = itemgetter(0)

_Head = tuple[int, bytes]
"""A command's name and any fixed arguments: how many, and packed."""
_Command = tuple[_Head, tuple[str, ...]]
"""A command: its head, and the rest of its arguments."""


async def _heard(wire: _Wire, idle: float, bound: float) -> tuple[DataType, object]:
    """The subscription's next message; after ``idle`` seconds without one, a ``PING``,
    whose answer (or a message before it) must come within ``bound`` seconds."""
    with trio.move_on_after(idle):
        return await wire.next()
    with trio.move_on_after(bound):
        await wire.stream.send_all(_packed([_PING_COMMAND]))
        return await wire.next()
    raise RedisConnectionError(f"the subscription did not answer a PING within {bound!r} s")


class SentinelAddressError(ResponseError):
    """A plain URL names a sentinel (its ``HELLO`` says ``mode sentinel``): it has no
    data and knows none of the store's commands."""


def _check_handshake(replies: list[object], role_at: int | None, location: TCPLocation) -> None:
    """Raise the first error reply of a new socket's handshake, ``SentinelAddressError``
    when a plain URL's server is a sentinel, or ``StalePrimaryError`` when the ``ROLE``
    reply at ``role_at`` is not a primary's."""
    hello = replies[0]  # before a SELECT's error: a sentinel knows no SELECT
    if (
        role_at is None
        and isinstance(hello, dict)
        and cast("dict[object, object]", hello).get("mode") == "sentinel"
    ):
        raise SentinelAddressError(f"{location} answers as a sentinel")
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    if role_at is not None:
        role = cast("list[object]", replies[role_at])[0]
        if role != "master":
            raise StalePrimaryError(f"the primary at {location} reports a role of {role!r}")


async def _open_stream(location: TCPLocation, context: ssl.SSLContext | None) -> trio.abc.Stream:
    """A TCP stream to ``location``, over TLS (handshake done) when ``context`` is set."""
    stream = await trio.open_tcp_stream(location.host, location.port)
    if context is None:
        return stream
    tls = trio.SSLStream(stream, context, server_hostname=location.host)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise
    return tls


def _packed(commands: Sequence[_Command], errors: str = "strict") -> bytes:
    return b"".join([_pack(head, args, errors) for head, args in commands])


def _bulk(args: Iterable[str], errors: str = "strict") -> bytes:
    """``args`` as the Redis protocol's bulk strings (``errors``: of their encoding)."""
    out: list[bytes] = []
    for arg in args:
        data = arg.encode("utf-8", errors)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _head(name: bytes, *fixed: str) -> _Head:
    """The head of the commands ``name`` whose arguments start with ``fixed``."""
    return (1 + len(fixed), b"$%d\r\n%s\r\n%s" % (len(name), name, _bulk(fixed)))


def _pack(head: _Head, args: tuple[str, ...], errors: str = "strict") -> bytes:
    """One command in the Redis protocol (an array of bulk strings)."""
    count, packed = head
    return b"*%d\r\n%s%s" % (count + len(args), packed, _bulk(args, errors))


def _decoded(value: object) -> object:
    """``value`` (a reply) with the strings the parser left as bytes (not UTF-8) as text,
    their bytes as surrogate escapes (``_packed`` with the same errors gives them back)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, list):
        return [_decoded(item) for item in cast("list[object]", value)]
    if isinstance(value, dict):
        items = cast("dict[object, object]", value).items()
        return {_decoded(key): _decoded(item) for key, item in items}
    return value


_INFO, _DEL, _WAIT = _head(b"INFO"), _head(b"DEL"), _head(b"WAIT")
_PING_COMMAND: _Command = (_head(b"PING"), ())
# the slots command's reads
_MULTI, _EXEC, _SCAN, _TIME = _head(b"MULTI"), _head(b"EXEC"), _head(b"SCAN"), _head(b"TIME")
_GET, _HGET, _HMGET, _HGETALL = _head(b"GET"), _head(b"HGET"), _head(b"HMGET"), _head(b"HGETALL")
_PTTL, _LRANGE, _ZRANGE = _head(b"PTTL"), _head(b"LRANGE"), _head(b"ZRANGE")
_MARKERS = frozenset(map(int, DataType))
"""The first bytes of the Redis protocol's replies (RESP3's type markers)."""


class _Wire:
    """One stream to the server and the replies read from it, parsed by coredis's
    parser (RESP3; strings decoded; an error reply is coredis's exception for it)."""

    __slots__ = ("_head", "_parser", "_unsent", "errors", "received", "silence", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._parser = Parser()
        self._unsent = b""  # what ``send_nowait`` left for ``answers`` to write
        self._head = b""  # the first bytes the server sent
        self.received = False
        """Whether anything came back since the last ``call`` (or ``send_nowait``) began."""
        self.silence = math.inf
        """Seconds a write or a read may wait for the server before ``TooSlowError`` (the
        slots command's bound; the keeper bounds its round trips itself)."""
        self.errors = "strict"
        """How strings that are not UTF-8 pass: ``strict`` (the keeper's, which writes
        only UTF-8: they stay bytes), or ``surrogateescape`` (the slots command's, reading
        what any process wrote: replies' and commands' strings carry them as text)."""

    async def call(self, commands: Sequence[_Command], *, handshake: bool = False) -> list[object]:
        """Send ``commands`` in one write; their replies, in order (a subscription's
        confirmation is its ``SUBSCRIBE``'s reply). ``handshake``: a new socket's first
        commands, whose error reply names the failure if the server then closes it."""
        self.received = False
        if self.silence == math.inf:  # the keeper's: no scope per round trip
            await self.stream.send_all(_packed(commands, self.errors))
        else:
            with trio.fail_after(self.silence):
                await self.stream.send_all(_packed(commands, self.errors))
        return await self._replies(len(commands), handshake)

    def send_nowait(self, commands: Sequence[_Command]) -> bool:
        """Write ``commands`` now if the stream is a plain socket that takes some of the
        bytes without waiting (``answers`` writes the rest); whether it did. A TLS
        stream, a full or broken socket: nothing is written."""
        if not isinstance(self.stream, trio.SocketStream):
            return False
        data = _packed(commands, self.errors)
        try:
            # trio writes to a socket only in async calls: the OS's write to the (non-
            # blocking) socket is the same write, without the scheduler's pass after it.
            written = os.write(self.stream.socket.fileno(), data)
        except OSError:  # full, broken, or a platform where a socket is no file
            return False
        self.received = False
        self._unsent = data[written:]
        return True

    async def answers(self, count: int) -> list[object]:
        """The replies of the ``count`` commands ``send_nowait`` wrote."""
        unsent, self._unsent = self._unsent, b""
        if unsent:
            await self.stream.send_all(unsent)
        return await self._replies(count)

    async def _replies(self, count: int, handshake: bool = False) -> list[object]:
        replies: list[object] = []
        try:
            while len(replies) < count:
                kind, value = await self.next()
                if kind != DataType.PUSH or cast("list[object]", value)[0] == "subscribe":
                    replies.append(value)
        except RedisConnectionError as closed:
            # A server that answers a new socket's handshake with an error and closes
            # (at ``maxclients``) said why: that error is the failure, as on coredis's
            # connections. (An error reply to a round trip's call is that call's.)
            said = next((r for r in replies if isinstance(r, Exception)), None)
            if said is None or not handshake:
                raise
            raise said from closed
        return replies

    async def next(self) -> tuple[DataType, object]:
        """The next reply or pushed message: its RESP type and its value."""
        while True:
            reply = self._parser.parse(decode=True, encoding="utf-8")
            if not isinstance(reply, NotEnoughData):
                kind, value = cast("tuple[DataType, object]", reply)
                return kind, value if self.errors == "strict" else _decoded(value)
            if self.silence == math.inf:
                data = await self.stream.receive_some(65536)
            else:
                with trio.fail_after(self.silence):
                    data = await self.stream.receive_some(65536)
            if not data:
                if self._parser.can_read() and self._head[0] not in _MARKERS:
                    # Bytes that make no reply are left, and the server's first answer
                    # did not start as a Redis reply does: a server of another protocol
                    # answered (often with no CRLF, which the parser waits for).
                    raise InvalidResponse(f"the server closed the connection after {self._head!r}")
                raise RedisConnectionError("the server closed the connection")
            if not self._head:
                self._head = bytes(data[:24])
            self.received = True
            self._parser.feed(bytes(data))


def _info_field(info: str, field: str) -> str:
    """One field of an ``INFO`` reply's text (``"None"`` when it has none)."""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return value
    return "None"


def _online_replicas(info: str) -> int:
    """The replicas ``INFO replication`` shows connected and in sync (``state=online``):
    the only ones a ``WAIT`` can count (one still loading its first copy cannot)."""
    count = 0
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.startswith("slave") and "state=online" in value.split(","):
            count += 1
    return count


class _TCPConnection(TCPConnection):
    """coredis's TCP connection, with its buffers closed however its ``run`` ends.

    coredis 6.9 opens its memory streams in the constructor and closes them only if the
    connection was established: every failed attempt (a server that is down, a refused
    handshake) left six of them to the garbage collector, one ``ResourceWarning`` each,
    for every reconnection attempt of an outage (errors under ``-W error``).
    """

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await super().run(task_status=task_status)
        finally:
            for value in list(vars(self).values()):
                if isinstance(value, MemoryObjectSendStream | MemoryObjectReceiveStream):
                    value.close()


class _PrimaryConnection(_TCPConnection, SentinelManagedConnection):
    """A connection to the primary a sentinel named (it checks its role), closing its
    buffers: the sentinel pool builds its connections itself, past ``connection_class``."""


class _PrimaryPool(SentinelConnectionPool):
    """The sentinel pool, building ``_PrimaryConnection``s."""

    async def _construct_connection(self) -> SentinelManagedConnection:
        location = await self.get_primary_location()
        return _PrimaryConnection(
            location, self.service_name, self.is_primary, **self.connection_kwargs
        )


class NoPrimaryError(PrimaryNotFoundError):
    """The sentinels named no primary for the service; ``why`` says what they answered,
    ``passes`` whether it may pass by itself (no sentinel could be connected to)."""

    def __init__(self, message: str, why: str, *, passes: bool = False) -> None:
        super().__init__(message)
        self.why = why
        self.passes = passes


class _Sentinel(coredis.Sentinel[str]):
    """coredis's ``Sentinel``, whose failure to find a primary says why: the sentinels
    refused the credentials or, to this user, the ``SENTINEL`` command, or knew no such
    command (a server that is no sentinel; the first refusal chained), no sentinel
    answered (the first one's error chained), or those that answered know no service of
    that name (coredis raises the refusals themselves, read as the primary's, and says
    "No primary found" for the other two)."""

    async def discover_primary(self, service_name: str) -> tuple[str, int]:
        errors: list[Exception] = []
        for index, sentinel in enumerate(self.sentinels):
            try:
                address = await sentinel.sentinel_get_master_addr_by_name(service_name)
            except (
                RedisConnectionError,
                TimeoutError,
                AuthenticationError,
                AuthorizationError,
                UnknownCommandError,  # a server that is no sentinel
            ) as exc:
                errors.append(exc)  # the next sentinel may take the credentials
                continue
            if address:
                # The sentinel that answered is asked first next time, as coredis does.
                self.sentinels.insert(0, self.sentinels.pop(index))
                return str(address[0]), int(address[1])
        where = ", ".join(str(s.connection_pool.location) for s in self.sentinels)
        refusals = (
            (
                AuthenticationError,
                "the credentials",
                " (their own password is the URL's sentinel_password)",
            ),
            (
                AuthorizationError,
                "the SENTINEL command",
                " to this user (an ACL permission is missing)",
            ),
            (
                UnknownCommandError,
                "the SENTINEL command",
                " as unknown (is the address a sentinel's? the URL names the sentinels, not"
                " the primary)",
            ),
        )
        for kind, what, why in refusals:
            refused = [exc for exc in errors if isinstance(exc, kind)]
            if refused:
                raise NoPrimaryError(
                    f"the sentinels refused {what} ({where})",
                    f"could not ask its sentinels: they refused {what}{why}",
                ) from refused[0]
        if len(errors) == len(self.sentinels):
            raise NoPrimaryError(
                f"no sentinel answered ({where})",
                "could not reach any sentinel",
                passes=all(_may_pass(exc) for exc in errors),
            ) from errors[0]
        raise NoPrimaryError(
            f"the sentinels that answered know no service {service_name!r} ({where})",
            f"found no service {service_name!r} at its sentinels (is the name right?)",
        )


def _client_timeout(store: RedisSlotStore) -> float:
    """The client's own bound on connecting (TCP and TLS) and on a subscription's
    confirmation: half the keeper's, so that its error (a TLS handshake a plain server
    never answers, a subscription an ACL refuses) arrives within the keeper's bound and
    names the cause, instead of the keeper's "did not answer"."""
    return store.connect_timeout / 2


class RedisClient:
    """The keeper's ``ServerClient`` over coredis: opens a fresh client of ``store`` per
    connection, and says what the client's errors mean."""

    __slots__ = ("_instance_id", "_store")

    def __init__(self, store: RedisSlotStore, instance_id: str) -> None:
        self._store = store
        self._instance_id = instance_id

    @asynccontextmanager
    async def connect(self) -> AsyncGenerator[Connection]:
        """Open one ``Connection`` on a fresh coredis client (under Sentinel, one that
        asks the sentinels for the primary); close its sockets after."""
        async with open_client(self._store, f"taskvisor:{self._instance_id}") as client:
            connection = _RedisConnection(client, self._store)
            try:
                yield connection
            finally:
                await connection.close()

    def refuses_calls(self, error: Exception) -> bool:
        """Whether an error reply refuses the keeper's calls as such (permissions, a
        Redis Cluster node, a read-only replica, unknown commands), not one call's data."""
        return _refuses_calls(error)

    def refusal(self, error: Exception, asked: str) -> str:
        """Say what went wrong from the client's ``error`` (``asked``: what the server
        was asked when it failed)."""
        return _refusal(error, asked, self._store)

    def may_pass(self, error: Exception) -> bool:
        """Whether a failure may pass by itself (see ``_may_pass``)."""
        return _may_pass(error)


@asynccontextmanager
async def open_client(
    store: RedisSlotStore, client_name: str | None = None
) -> AsyncGenerator[coredis.Redis[str]]:
    """A fresh coredis client of ``store``, without retries, bounded by
    ``_client_timeout``: of its one server, or of the primary its sentinels name when
    a connection opens. Closed at the end of the block."""
    target = store.sentinel
    tls = _tls_context(store.tls if target is None else target.tls)
    if target is None:
        client: coredis.Redis[str] = coredis.Redis.from_url(
            store.url,
            decode_responses=True,
            decode_components=True,
            retry_policy=NoRetryPolicy(),
            connect_timeout=_client_timeout(store),
            client_name=client_name,
            ssl_context=tls,
        )
        client.connection_pool.connection_class = _TCPConnection
        async with client:
            yield client
        return
    # Each sentinel gets its share of the client's bound, for connecting and for its
    # answer: a sentinel that is down or frozen must leave time to ask the others.
    share = _client_timeout(store) / len(target.sentinels)
    sentinel = _Sentinel(
        [TCPLocation(host, port) for host, port in target.sentinels],
        sentinel_kwargs={
            "connect_timeout": share,
            "stream_timeout": share,
            "password": target.sentinel_password,
            "ssl_context": tls,
        },
        decode_responses=True,
        retry_policy=NoRetryPolicy(),
        connect_timeout=_client_timeout(store),
        username=target.username,
        password=target.password,
        db=target.db,
        ssl_context=tls,
        client_name=client_name,
    )
    for node in sentinel.sentinels:
        node.connection_pool.connection_class = _TCPConnection
    async with sentinel:
        primary = sentinel.primary_for(target.service, connection_pool_class=_PrimaryPool)
        async with primary:
            yield primary


class TLSFileError(Exception):
    """A file a TLS option names could not be loaded (the error chained)."""

    def __init__(self, option: str, path: str) -> None:
        super().__init__(f"{option}={path}")
        self.option = option


def _tls_context(settings: TLSSettings | None) -> ssl.SSLContext | None:
    """The TLS context of a ``rediss`` URL's checked ``ssl_*`` options (``None``: no
    TLS), for the data nodes and the sentinels alike; its files are read here."""
    if settings is None:
        return None
    context = ssl.create_default_context()
    context.check_hostname = settings.check_hostname
    context.verify_mode = ssl.CERT_REQUIRED if settings.verify else ssl.CERT_NONE
    files = (("ssl_ca_certs", settings.ca_certs), ("ssl_certfile", settings.certfile))
    for option, path in files:
        if path is None:
            continue
        try:
            if option == "ssl_certfile":
                context.load_cert_chain(path, settings.keyfile)
            elif os.path.isdir(path):
                context.load_verify_locations(capath=path)
            else:
                context.load_verify_locations(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            raise TLSFileError(option, path) from exc
    return context


def _refuses_calls(error: Exception) -> bool:
    """Whether an error reply refuses the keeper's calls as such (permissions, a Redis
    Cluster node, a read-only replica, unknown commands, a server that takes no call
    for now), not one call's data."""
    return (
        _acl_refusal(error)
        or isinstance(
            error, AuthenticationError | RedisClusterError | ReadOnlyError | UnknownCommandError
        )
        or _takes_no_call_for_now(error)
    )


def _takes_no_call_for_now(error: Exception) -> bool:
    """Whether the server refused a call only for now, whatever the call (``_FOR_NOW``)."""
    return isinstance(error, BusyLoadingError) or (
        isinstance(error, ResponseError) and str(error).startswith(_FOR_NOW)
    )


_FOR_NOW = ("BUSY ", "MASTERDOWN ", "NOREPLICAS ", "OOM ")
"""The error codes of a server that takes no call for now, whatever the call: another
client's script or function runs past ``busy-reply-threshold``, a replica lost its
primary, too few replicas for ``min-replicas-to-write``, ``maxmemory`` reached (coredis
keeps these codes in the text; ``LOADING``, a restart that reads its data set, is its
``BusyLoadingError``). Each call of a round trip gets it: an outage, as a refusal is,
where it failed the calls one by one (a submit rejected, a release dropped)."""


def _may_pass(error: Exception) -> bool:
    """Whether a failure may pass by itself: no connection (nothing listens yet, a
    dropped connection, a server at its ``maxclients``; no sentinel either), a server
    that takes no call for now, a primary that is no longer one; not a refusal of the
    store's settings (credentials, permissions, the database, TLS, the protocol, the
    commands, a service the sentinels do not know) nor silence."""
    if isinstance(error, NoPrimaryError):
        return error.passes
    if _takes_no_call_for_now(error) or isinstance(error, StalePrimaryError):
        return True
    return isinstance(error, RedisConnectionError) and not any(
        isinstance(link, ProtocolError | ssl.SSLError | TimeoutError | TLSFileError)
        for link in _chain(error)
    )


def _acl_refusal(error: Exception) -> bool:
    """Whether the server refused a command to this user: ``NOPERM``, or a command or a
    key a script uses ("ACL failure in script: ... no permissions ..." or "... No
    permissions to access a key")."""
    return isinstance(error, AuthorizationError) or (
        isinstance(error, ResponseError) and "no permissions" in str(error).lower()
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (or contexts), nearest first."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _refusal(exc: Exception, asked: str, store: RedisSlotStore) -> str:
    """Say what went wrong from the client's error ``exc`` (``asked``: what the server
    of ``store`` was asked when it failed): what the server refused, or why it was not a
    Redis server, or why it could not be reached."""
    tls = store.url.startswith("rediss")
    if isinstance(exc, NoPrimaryError):
        if tls and any(isinstance(link, TimeoutError) for link in _chain(exc)):
            return f"{exc.why} (no TLS handshake completed in time: do they speak TLS?)"
        return exc.why
    if isinstance(exc, TLSFileError):
        return f"could not load the file of its url option {exc.option!r}"
    if isinstance(exc, StalePrimaryError):
        return "named a primary that is no longer one (a failover in progress?)"
    if isinstance(exc, SentinelAddressError):
        return (
            "is a sentinel, not a data node: name the primary, or the sentinels as"
            " redis+sentinel://host:port/service"
        )
    chain = _chain(exc)
    timed_out = any(isinstance(link, TimeoutError) for link in chain)
    if tls and timed_out and asked == "the connection":
        return "did not complete the TLS handshake in time (does the server speak TLS?)"
    if any(isinstance(link, ssl.SSLCertVerificationError) for link in chain):
        return "failed the TLS handshake: its certificate did not pass the checks"
    if any(isinstance(link, ssl.SSLError) for link in chain):
        return "failed the TLS handshake"
    if timed_out and asked == "the subscription":
        return "did not confirm the subscription to this process's channel in time"
    if isinstance(exc, AuthenticationRequiredError):  # no AUTH sent: the URL has no password
        what = "asks for a password, and the URL gives none (:PASSWORD@ before the host)"
        return what if store.sentinel is None else f"could not use its primary: it {what}"
    if isinstance(exc, AuthenticationError) and store.sentinel is not None:
        return "could not use its primary: it refused the credentials (the URL's user and password)"
    if isinstance(exc, AuthenticationError):
        return "refused the credentials"
    if isinstance(exc, BusyLoadingError):
        return f"refused {asked} while it loads its data set"
    if _acl_refusal(exc):
        return f"refused {asked} to this user (an ACL permission is missing)"
    if isinstance(exc, RedisClusterError):
        return f"refused {asked}: it is a Redis Cluster node, which the store does not support"
    if isinstance(exc, ReadOnlyError):
        return f"refused {asked}: it is a read-only replica (the URL must name the primary)"
    if isinstance(exc, ResponseError):
        if "DB index" in str(exc):
            return "refused the database number"
        if isinstance(exc, UnknownCommandError) or "unknown command" in str(exc).lower():
            return f"refused {asked} as unknown commands"
        return f"refused {asked}"
    if isinstance(exc, InvalidResponse | ProtocolError):
        return "did not answer in the Redis protocol (is it a Redis server?)"
    if any("max number of clients" in str(link) for link in chain):
        return "refused the connection: it has as many clients as its maxclients allows"
    if isinstance(exc, OpeningResetError):
        return (
            "reset the connection as it opened (a server at its maxclients, or a proxy in"
            " front of it at its own limit of clients, may refuse a client so)"
        )
    return "could not be reached"


# -- reading a namespace (the slots command) -------------------------------------------------

_SCAN_COUNT = 1000

Lease = tuple[str | None, str | None, str | None, int]
"""A lease hash's ``entry``, ``token`` and ``stop``, and its time left (``PTTL``, ms)."""


@attrs.frozen
class Namespace:
    """What a namespace holds at one moment, as the server has it (no interpretation)."""

    leases: dict[str, Lease]
    """Slot -> its lease (entry id, fence token, stop requester, ms left)."""
    queues: dict[str, list[str]]
    """Slot -> its cluster queue's entry ids, head first."""
    heartbeats: dict[str, int]
    """Instance -> ms left of its heartbeat (live instances only)."""
    pools: dict[str, PoolState] = attrs.field(factory=dict[str, "PoolState"])
    """Pool id (``name`` or ``"name key"``) -> what the server holds for the limit pool."""
    lease_ttls: dict[str, int] = attrs.field(factory=dict[str, int])
    """Live instance -> the ``lease_ttl`` it runs with, in ms, as its heartbeat says
    (a heartbeat of earlier versions, ``1``, says nothing: not in here)."""
    skipped: list[str] = attrs.field(factory=list[str])
    """Keys of the namespace of another kind than this version writes (``WRONGTYPE``:
    written by something else), read as missing."""
    malformed: list[str] = attrs.field(factory=list[str])
    """Keys of the namespace of the kind this version writes but with values it does not
    write (a limit pool's settings or ``tat``: written by something else), read as
    missing."""


@attrs.frozen
class PoolState:
    """One limit pool as the server holds it: its settings, its live holders' instances
    (one per unit), its live waiters' count and a rate pool's ms until a start."""

    spec: str
    holders: list[str]
    waiting: int
    next_start_ms: float | None


async def read_namespace(store: RedisSlotStore) -> Namespace:
    """Read the leases, queues and heartbeats of ``store``'s namespace (a checkpoint).

    Plain read commands only (``SCAN``, then one ``MULTI``/``EXEC`` of ``HMGET``, ``PTTL``,
    ``LRANGE`` and ``GET``), on a socket of its own as the keeper's (coredis's commands
    cost about four times as much to build and read, and a namespace of 50,000 slots took
    5 s): no script is loaded, nothing is written, no client name is set. Bounded by
    ``store.connect_timeout`` of silence: connecting and the handshake within it, then
    each wait for the server's bytes (so a large namespace takes as long as its replies
    take to read); raises ``SlotStoreUnavailableError`` naming the cause (chained) when
    the server cannot be read: as ``open_supervisor`` names it while connecting ("the
    connection": "did not complete the TLS handshake in time" too), then what the server
    refused of "the read commands", or, once it answered, an error that is neither the
    client's nor the server's as what the command "could not read" (never "could not be
    reached").
    """
    error: Exception | None = None
    connected = False
    try:
        async with open_client(store) as client:
            with trio.fail_after(store.connect_timeout):
                wire = await open_wire(client, store)
            connected = True
            try:
                wire.silence = store.connect_timeout
                wire.errors = "surrogateescape"  # names any process wrote, not UTF-8 too
                return await _read(wire, store.key_prefix)
            finally:
                await trio.aclose_forcefully(wire.stream)
    except Exception as exc:
        error = (
            first_leaf(cast("ExceptionGroup[Exception]", exc))
            if isinstance(exc, ExceptionGroup)
            else exc
        )
    url = store.safe_url
    if isinstance(error, trio.TooSlowError):
        raise SlotStoreUnavailableError(
            f"slot store {url} did not answer within {store.connect_timeout!r} s"
        )
    if connected and not isinstance(error, _CLIENT_ERRORS):
        what = "answered what the command could not read"
    else:
        # Before the handshake completed, the connection failed: named as the keeper
        # names it (a TLS handshake a plain server does not answer, say).
        what = _refusal(error, "the read commands" if connected else "the connection", store)
    raise SlotStoreUnavailableError(
        f"slot store {url} {what}: {describe(error, secrets_of(store.url))}"
    ) from error


_CLIENT_ERRORS = (
    RedisError,
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
)
"""The errors of the client and the server (what they refused, a connection lost or
silent); another error, once the server answered, is the reading's."""


async def _ask(wire: _Wire, skipped: list[str], *commands: _Command) -> list[Any]:
    """The replies to ``commands`` (a ``MULTI``/``EXEC``'s: those of ``EXEC``); raise the
    first error reply (in a transaction, a command refused as it was queued comes before
    the ``EXECABORT`` it causes), except ``WRONGTYPE``: its key, of a kind this version
    does not write, reads as missing, and goes into ``skipped``."""
    replies: list[Any] = await wire.call(commands)
    if commands and commands[0][0] == _MULTI:
        _raise_first(replies)
        replies, commands = replies[-1], commands[1:-1]
    for index, ((head, args), reply) in enumerate(zip(commands, replies, strict=True)):
        if isinstance(reply, WrongTypeError) and head in _MISSING:
            replies[index] = _MISSING[head](args)
            skipped.append(args[0])
    _raise_first(replies)
    return replies


_MISSING: dict[_Head, Callable[[tuple[str, ...]], object]] = {
    _HMGET: lambda args: [None] * (len(args) - 1),
    _LRANGE: lambda _: [],
    _ZRANGE: lambda _: [],
    _HGETALL: lambda _: {},
    _GET: lambda _: None,
    _HGET: lambda _: None,
}
"""What each read command answers for a missing key."""


def _raise_first(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply


def _in_one(commands: list[_Command]) -> list[_Command]:
    """``commands`` in one ``MULTI``/``EXEC``: the same moment of the server."""
    return [(_MULTI, ()), *commands, (_EXEC, ())]


async def _scan(wire: _Wire, prefix: str) -> list[str]:
    """Every key of the namespace (a key that exists for the whole scan is in it)."""
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
    keys: list[str] = []
    cursor = "0"
    while True:
        ((cursor, batch),) = await _ask(
            wire, [], (_SCAN, (cursor, "MATCH", pattern, "COUNT", str(_SCAN_COUNT)))
        )
        keys.extend(batch)
        if cursor == "0":
            return keys


async def _read(wire: _Wire, prefix: str) -> Namespace:
    keys = await _scan(wire, prefix)
    skipped: list[str] = []
    lease_slots = sorted({k[len(prefix) + 6 :] for k in keys if k.startswith(prefix + "lease:")})
    queue_slots = sorted({k[len(prefix) + 2 :] for k in keys if k.startswith(prefix + "q:")})
    instances = sorted({k[len(prefix) + 3 :] for k in keys if k.startswith(prefix + "hb:")})
    replies: list[Any] = []
    if keys:
        # One transaction: the leases, queues and heartbeats of the same moment.
        commands: list[_Command] = []
        for slot in lease_slots:
            key = f"{prefix}lease:{slot}"
            commands += [(_HMGET, (key, "entry", "token", "stop")), (_PTTL, (key,))]
        commands += [(_LRANGE, (f"{prefix}q:{slot}", "0", "-1")) for slot in queue_slots]
        commands += _heartbeat_reads(prefix, instances)
        replies = await _ask(wire, skipped, *_in_one(commands))
    at = iter(replies)
    leases: dict[str, Lease] = {}
    for slot in lease_slots:
        entry, token, stop = next(at)
        leases[slot] = (entry, token, stop, int(next(at)))
    queues = {slot: [str(e) for e in next(at)] for slot in queue_slots}
    heartbeats: dict[str, int] = {}
    lease_ttls: dict[str, int] = {}
    _heartbeats(instances, at, heartbeats, lease_ttls)
    malformed: list[str] = []
    pools = await _read_pools(wire, prefix, keys, skipped, malformed)
    named = {instance_of(e) for q in queues.values() for e in q}
    named.update(instance_of(lease[0]) for lease in leases.values() if lease[0] is not None)
    # Instances that started after the scan: their heartbeat, read now.
    unknown = sorted(named - set(instances))
    if unknown:
        replies = await _ask(wire, skipped, *_heartbeat_reads(prefix, unknown))
        _heartbeats(unknown, iter(replies), heartbeats, lease_ttls)
    for key in skipped:  # a heartbeat of another kind is none (its PTTL said it exists)
        if key.startswith(prefix + "hb:"):
            heartbeats.pop(key[len(prefix) + 3 :], None)
            lease_ttls.pop(key[len(prefix) + 3 :], None)
    return Namespace(leases, queues, heartbeats, pools, lease_ttls, sorted(set(skipped)), malformed)


def _heartbeat_reads(prefix: str, instances: Iterable[str]) -> list[_Command]:
    """The ``PTTL`` and ``GET`` of each instance's heartbeat, as ``_heartbeats`` takes them."""
    return [(cmd, (f"{prefix}hb:{instance}",)) for instance in instances for cmd in (_PTTL, _GET)]


def _heartbeats(
    instances: Iterable[str],
    replies: Iterator[Any],
    heartbeats: dict[str, int],
    lease_ttls: dict[str, int],
) -> None:
    """Take each instance's ``PTTL`` and ``GET`` of its heartbeat from ``replies``; an
    instance whose heartbeat is gone (``PTTL`` -2) is left out, a value that is no
    ``lease_ttl`` (``stored_integer``) says nothing."""
    for instance in instances:
        pttl, held = int(next(replies)), next(replies)
        if pttl == -2:
            continue
        heartbeats[instance] = pttl
        lease_ttl = stored_integer(held) if isinstance(held, str) else None
        if lease_ttl is not None and held != "1":
            lease_ttls[instance] = lease_ttl


async def _read_pools(
    wire: _Wire, prefix: str, keys: list[str], skipped: list[str], malformed: list[str]
) -> dict[str, PoolState]:
    """The limit pools (keys ``lp:``, ``lh:``, ``lq:``, ``lg:``, ``lw:``, ``lu:``): a holder
    or a waiter is live while its instance's units' key holds the generation it carries;
    a pool's waiters are those of the groups (pool sets) in its ``lq:`` index. A pool
    whose settings or GCRA state are none this version writes (``scripts.next_start_ms``)
    is left out, its ``lp:`` key put into ``malformed``."""
    pool_ids = sorted({k[len(prefix) + 3 :] for k in keys if k.startswith(prefix + "lp:")})
    if not pool_ids:
        return {}
    commands: list[_Command] = [(_TIME, ())]
    for pid in pool_ids:
        commands += [
            (_HMGET, (f"{prefix}lp:{pid}", "spec", "tat", "start", "n")),
            (_HGETALL, (f"{prefix}lh:{pid}",)),
            (_ZRANGE, (f"{prefix}lq:{pid}", "0", "-1")),
        ]
    results = await _ask(wire, skipped, *_in_one(commands))
    seconds, micros = results[0]
    now_ms = int(seconds) * 1000 + int(micros) / 1000
    groups = sorted({str(g) for k in range(len(pool_ids)) for g in results[3 + 3 * k]})
    lines = await _ask(
        wire, skipped, *((_ZRANGE, (f"{prefix}lg:{group}", "0", "-1")) for group in groups)
    )
    members = {g: [str(w) for w in ws] for g, ws in zip(groups, lines, strict=True)}
    raw: list[tuple[str, list[str | None], dict[str, str], list[str]]] = []
    for k, pid in enumerate(pool_ids):
        spec_tat, held, pool_groups = results[1 + 3 * k : 4 + 3 * k]
        line = [w for g in pool_groups for w in members[str(g)]]
        raw.append((pid, list(spec_tat), {str(h): str(g) for h, g in held.items()}, line))
    waiters = sorted({w for _, _, _, line in raw for w in line})
    instances = sorted(
        {instance_of(h) for _, _, held, _ in raw for h in held} | {instance_of(w) for w in waiters}
    )
    replies = await _ask(
        wire,
        skipped,
        *((_GET, (f"{prefix}lu:{instance}",)) for instance in instances),
        *((_HGET, (f"{prefix}lw:{w}", "gen")) for w in waiters),
    )
    gens: dict[str, str | None] = dict(zip(instances, replies[: len(instances)], strict=True))
    waiter_gens: dict[str, str | None] = dict(zip(waiters, replies[len(instances) :], strict=True))
    pools: dict[str, PoolState] = {}
    for pid, (spec, tat, start, count), held, line in raw:
        if spec is None:
            continue
        holders = sorted(instance_of(h) for h, g in held.items() if gens.get(instance_of(h)) == g)
        waiting = sum(1 for w in line if gens.get(instance_of(w)) == waiter_gens.get(w))
        try:
            next_ms = scripts.next_start_ms(spec, tat, now_ms, start, count)
        except ValueError:
            malformed.append(f"{prefix}lp:{pid}")
            continue
        pools[pid] = PoolState(spec, holders, waiting, next_ms)
    return pools
