"""Configuration values and every validator: ``SupervisorConfig``, ``ControllerConfig``,
``TaskDefaults``, and the slot store's ``RedisSlotStore`` (built and validated where no
event loop runs, without the ``redis`` extra).

Values are attrs frozen classes validated at construction, so bad input fails at the call
that gave it. One message style everywhere: ``"<what> must be <rule>, got <value!r>"``;
wrong *types* raise ``TypeError``, wrong *values* raise ``ConfigError``.

Decisions the design leaves open:

* Durations are finite-or-infinite numbers ``>= 0`` (``bool`` is not a number anywhere
  in the API: ``TypeError``; NaN is a ``ConfigError`` that says it is not finite);
  ints too large for a float raise ``ConfigError``. ``grace`` may be ``math.inf``
  (never force).
* ``timeout=math.inf`` is normalised to ``None`` like ``timeout=0``.
* ``healthy_after=math.inf`` and ``retry_budget=math.inf`` are normalised to ``None``
  (never healthy, no budget); ``0`` is a ``ConfigError`` for both (they must be > 0).
* ``RedisSlotStore.url`` is checked when the store is built: scheme ``redis`` or
  ``rediss``, a host, an optional port (1 to 65535) and an optional database path
  (``/0``: ASCII digits, below ``2**31``, which the server's ``SELECT`` reads; a
  larger number failed only at the start, as "refused the connection", and a
  full-width digit was read as its ASCII one). The query options ``db``, ``username``
  and ``password`` are passed on to coredis as it documents them; any other option is
  a ``ConfigError`` naming it, and so is an option given twice (coredis reads the
  first, a Sentinel URL read the last) or a value given in the URL's body and as an
  option that differ: the path's database and ``db``, the user part's name or password
  and ``username`` or ``password`` (coredis took the ``db`` option and the user part,
  the Sentinel parser the path and the user part; the same value twice is accepted).
  Percent-escapes in the user name and password are decoded, so a password may contain
  ``@``, ``:`` or ``/`` as ``%40``, ``%3A``, ``%2F``.
* TLS (``rediss``, ``rediss+sentinel``) checks the server as trio and browsers do: its
  certificate against the system's CAs (or ``ssl_ca_certs``, a file or a directory)
  and its host name against the certificate (coredis checks no host name unless
  ``ssl_check_hostname`` says so, and accepted any certificate a trusted CA issued,
  for any name). ``ssl_check_hostname=false`` turns the name check off,
  ``ssl_cert_reqs=none`` both. The options' values are checked when the store is built
  (``ssl_cert_reqs``: ``none``, ``optional`` or ``required``; ``ssl_check_hostname``:
  a boolean word; ``ssl_keyfile`` only with ``ssl_certfile``; ``ssl_certfile`` alone is
  a file holding the key too): before, a wrong value failed each connection ("could
  not be reached: KeyError") or was read as true, and a lone ``ssl_certfile`` was
  ignored. The files are read when a socket opens; one that cannot be read is named.
* A Sentinel URL, ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``
  (``rediss+sentinel://`` for TLS to the sentinels and the data nodes), is parsed here
  into a ``SentinelTarget``: one or more sentinels (an omitted port is Sentinel's
  26379), the service name (percent-escapes decoded; required), the database (default
  0). The user part is the data nodes' credentials; ``sentinel_password`` (query) is the
  sentinels' own. Its options: ``sentinel_password``, ``db``, ``username``,
  ``password``, and with TLS the ``ssl_*`` options (for both kinds of node).
* Credentials never show: ``repr()``/``str()`` print the URL with the password (and a
  ``password=`` or ``sentinel_password=`` query parameter, in any case and with any
  percent-escapes in its name, as coredis decodes them) as ``***``. A user part
  without a ``:`` is masked whole, because some clients read ``redis://secret@host``
  as a password (a Sentinel URL refuses it). Error messages never quote the URL: they
  name the part that is wrong.
* ``RedisSlotStore``'s durations may be ``int`` or ``float`` (stored as ``float``) and
  must be finite and > 0; ``bool`` and other types are a ``TypeError``.
  ``lease_ttl`` must be at least 0.001 s (the server's keys expire in whole
  milliseconds: less would be sent as 0, which the server refuses), and
  ``replicas_ack_timeout`` too (``WAIT n 0`` would block for ever); both are sent
  rounded to whole milliseconds. Both are at most 1e9 s (about 31.7 years), the longest
  the scripts count (a bound besides "finite and > 0"): a ``lease_ttl`` of 1e15 made the server
  refuse every limit's units, and 1e18 the lease scripts themselves ("value
  is not an integer or out of range": their expiries in milliseconds, printed with an
  exponent), and a ``replicas_ack_timeout`` past 9.2e15 does not fit ``WAIT``'s
  integer. A ``replicas_ack_timeout`` of ``None`` stays ``None`` (the field says what
  was given) and ``ack_timeout`` gives the effective value, ``lease_ttl / 10``, so that
  ``attrs.evolve`` of ``lease_ttl`` moves it too.
* With ``replicas_ack > 0``, ``replicas_ack_timeout`` must be less than ``lease_ttl / 3``
  and than ``connect_timeout`` (``ConfigError`` at construction and at
  ``attrs.evolve``), and the default ``lease_ttl / 10`` is at most ``connect_timeout /
  2``. A ``WAIT`` ends a round trip that the keeper bounds by ``connect_timeout``, and a
  renewal's by the renewal interval (``lease_ttl / 3``) or its earliest lease deadline
  if later: a longer ``WAIT`` never took effect, the keeper cut the round trip first,
  and replicas that fell short read as a server that "did not answer within 0.466 s"
  instead of "needs 2 replicas to acknowledge, 1 did within 0.25 s", its connection
  dropped. Refused rather than shortened: a value the user gave is not silently
  changed; the default follows whichever bound is shorter. Unchecked while
  ``replicas_ack`` is 0, where the value is unused.
* Strings sent to the slot store's server must encode as UTF-8 (``check_sendable``): the
  url (never quoted) and the namespace at construction; with a slot store, slots and
  limit names and keys at the call that brings them (``ConfigError``). A lone surrogate
  (``os.fsdecode`` of a file name that is not UTF-8) does not: before, a slot with one
  made the store unavailable to every caller, and a limit with one was refused at each
  acquisition. Without a slot store nothing is sent, and such strings work as any other.
* ``retry_on`` takes exception classes (``BaseException`` subclasses) in a ``tuple``;
  anything else, a bare class or a list included, is a ``TypeError``.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from typing import Any, Final, TypeAlias
from urllib.parse import SplitResult, parse_qsl, unquote, unquote_plus, urlsplit

import attrs

from ._exceptions import ConfigError
from ._limits import Pool, check_limits
from ._policies import BackoffPolicy, RestartLimit, RestartPolicy, positive_seconds

_SCHEMES: Final = ("redis", "rediss")
_SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
_SENTINEL_PORT: Final = 26379
_SECRET_OPTIONS: Final = frozenset({"password", "sentinel_password"})
_MASK: Final = "***"
# -- the slot store --------------------------------------------------------------------------

_USERINFO: Final = re.compile(r"^(?P<head>[^:/?#]*://)(?P<user>[^/?#]*@)")
_PARAM: Final = re.compile(r"(?P<key>[?&][^=&#]*=)[^&#]*")


def redact_url(url: str) -> str:
    """Return ``url`` with its passwords (user part, ``password=`` and
    ``sentinel_password=`` parameters) masked."""

    def mask_user(match: re.Match[str]) -> str:
        name, colon, _ = match["user"][:-1].partition(":")
        # A user part without ":" may be a password to some clients: mask it whole.
        return match["head"] + (f"{name}:{_MASK}@" if colon else f"{_MASK}@")

    def mask_param(match: re.Match[str]) -> str:
        # coredis reads query keys percent-decoded: "pass%77ord=" is a password too.
        key = match["key"]
        secret = unquote_plus(key[1:-1]).lower() in _SECRET_OPTIONS
        return key + _MASK if secret else match[0]

    # The user part goes first: it may contain "&" and "=" of its own.
    return _PARAM.sub(mask_param, _USERINFO.sub(mask_user, url, count=1))


_TLS_OPTIONS: Final = frozenset(
    {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_check_hostname", "ssl_keyfile"}
)
_URL_OPTIONS: Final = frozenset({"db", "password", "username"}) | _TLS_OPTIONS
_SENTINEL_URL_OPTIONS: Final = _URL_OPTIONS | {"sentinel_password"}


def _database(text: str) -> bool:
    """Whether ``text`` is a database number the server's ``SELECT`` reads."""
    return text.isascii() and text.isdigit() and int(text) < 2**31


def _check_url(url: object) -> str:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    check_sendable("url", url, secret=True)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(
            "url must be a valid redis://, rediss:// or redis+sentinel:// url"
        ) from None
    if parts.scheme in _SENTINEL_SCHEMES:
        parse_sentinel_url(url)  # which checks it is not cut, as below
        return url
    _check_not_cut(parts)
    if parts.scheme not in _SCHEMES:
        raise ConfigError(
            "url scheme must be 'redis', 'rediss', 'redis+sentinel' or 'rediss+sentinel', "
            f"got {parts.scheme!r}"
        )
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
    if db and not _database(db):
        raise ConfigError(
            "url path must be a database number (0 to 2147483647), as in redis://host:6379/0"
        )
    options = _check_options(parts.query, tls=parts.scheme == "rediss")
    userinfo = parts.netloc.rpartition("@")[0]
    name, colon, secret = userinfo.partition(":")
    _check_given_once(options, db, unquote(name), unquote(secret) if colon else None)
    if parts.scheme == "rediss":
        _tls_settings(options)
    return url


def _check_options(query: str, *, tls: bool, sentinel: bool = False) -> dict[str, str]:
    """Refuse query options the store does not support: coredis would ignore unknown
    names silently, and the others (``connect_timeout``, ``client_name``, ``noreply``,
    ...) change settings the lease keeper relies on. Names are decoded as coredis
    decodes them; values are never quoted (one may be a password), and each option is
    given once. Return the options."""
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in options:
            raise ConfigError(f"url option {name!r} must be given once")
        if name == "cluster":
            raise ConfigError(
                "url option 'cluster' is not supported: the store runs on one server "
                "(or a managed primary), not on a Redis Cluster"
            )
        if name == "sentinel_password" and not sentinel:
            raise ConfigError(
                "url option 'sentinel_password' needs a redis+sentinel:// (Sentinel) url"
            )
        supported = _SENTINEL_URL_OPTIONS if sentinel else _URL_OPTIONS
        if name not in supported:
            named = ", ".join(sorted(supported))
            raise ConfigError(f"url option {name!r} is not supported (supported: {named})")
        if name in _TLS_OPTIONS and not tls:
            needs = "rediss+sentinel://" if sentinel else "rediss://"
            raise ConfigError(f"url option {name!r} needs a {needs} (TLS) url")
        if name == "db" and not _database(value):
            raise ConfigError("url option 'db' must be a database number (0 to 2147483647)")
        options[name] = value
    return options


def _check_given_once(
    options: dict[str, str], db: str, username: str | None, password: str | None
) -> None:
    """What the URL gives both in its body (the path's database, the user part) and as
    an option must be the same: coredis and the Sentinel parser would each take one."""
    given = (
        ("db", "database", "path", db),
        ("username", "user name", "user part", username),
        ("password", "password", "user part", password),
    )
    for name, what, where, value in given:
        option = options.get(name)
        if not value or not option:
            continue
        if value != option and not (name == "db" and int(value) == int(option)):
            raise ConfigError(
                f"url must give its {what} once: its {where} and its option {name!r} differ"
            )


@attrs.frozen
class TLSSettings:
    """How a TLS URL's sockets check the server: its ``ssl_*`` options, checked (the
    files are read when a socket opens)."""

    verify: bool = True
    """Check the server's certificate (``ssl_cert_reqs`` other than ``none``)."""
    check_hostname: bool = True
    """Check the certificate names the host (``ssl_check_hostname``; default: ``verify``)."""
    ca_certs: str | None = None
    """A file or directory of CA certificates to trust, besides the system's."""
    certfile: str | None = None
    """This client's certificate (with its key, unless ``keyfile``)."""
    keyfile: str | None = None
    """The key of ``certfile``."""


_CERT_REQS: Final = ("none", "optional", "required")
_BOOLEAN_WORDS: Final = {
    word: value
    for words, value in (("1 t true y yes", True), ("0 f false n no", False))
    for word in words.split()
}


def _tls_settings(options: dict[str, str]) -> TLSSettings:
    """The checked ``ssl_*`` options of a TLS URL, or a ``ConfigError`` naming one."""
    cert_reqs = options.get("ssl_cert_reqs", "optional")
    if cert_reqs not in _CERT_REQS:
        raise ConfigError("url option 'ssl_cert_reqs' must be none, optional or required")
    verify = cert_reqs != "none"
    check_hostname: bool | None = verify
    if "ssl_check_hostname" in options:
        check_hostname = _BOOLEAN_WORDS.get(options["ssl_check_hostname"].lower())
        if check_hostname is None:
            raise ConfigError("url option 'ssl_check_hostname' must be true or false")
        if check_hostname and not verify:
            raise ConfigError(
                "url option 'ssl_check_hostname' cannot be true with ssl_cert_reqs=none "
                "(no certificate is checked)"
            )
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if name in options and not options[name]:
            raise ConfigError(f"url option {name!r} must name a file")
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        raise ConfigError("url option 'ssl_keyfile' needs 'ssl_certfile', its certificate")
    return TLSSettings(
        verify=verify,
        check_hostname=bool(check_hostname),
        ca_certs=options.get("ssl_ca_certs"),
        certfile=options.get("ssl_certfile"),
        keyfile=options.get("ssl_keyfile"),
    )


@attrs.frozen
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the sentinels to ask, the service they
    monitor, and how to talk to the primary they name (a plain value; it holds the
    passwords, so it is never shown)."""

    sentinels: tuple[tuple[str, int], ...]
    """The sentinels' ``(host, port)``, in the URL's order."""
    service: str
    """The monitored service (Sentinel's master name)."""
    db: int
    """The database number on the primary."""
    username: str | None = attrs.field(repr=False)
    """The data nodes' user name (the URL's user part, else the ``username`` option)."""
    password: str | None = attrs.field(repr=False)
    """The data nodes' password (the URL's user part, else the ``password`` option)."""
    sentinel_password: str | None = attrs.field(repr=False)
    """The sentinels' own password (the ``sentinel_password`` option)."""
    tls: TLSSettings | None
    """TLS to the sentinels and the data nodes (``rediss+sentinel``), else ``None``."""


def _sentinel_address(text: str) -> tuple[str, int]:
    """One ``host[:port]`` of a sentinel list (an IPv6 host in brackets)."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError("url sentinel host must be host:port or [ipv6]:port")
        colon, written = rest[:1], rest[1:]
    else:
        host, colon, written = text.partition(":")
    if not host:
        raise ConfigError(
            "url must name every sentinel as host:port, as in "
            "redis+sentinel://s1:26379,s2:26379/mymaster/0"
        )
    if not colon:
        return unquote(host), _SENTINEL_PORT
    if not (written.isascii() and written.isdigit()) or not 1 <= int(written) <= 65535:
        raise ConfigError(f"url sentinel port must be a number from 1 to 65535, got {written!r}")
    return unquote(host), int(written)


def _check_not_cut(parts: SplitResult) -> None:
    """An ``@`` after the host: a user name or password holding ``/``, ``?`` or ``#``
    that is not percent-encoded cut the url there, and its first part would be read as
    a host and port (and quoted by the errors about them, or shown by the store's
    ``repr``). Such an ``@`` is in the fragment, in the path (a database number, or a
    Sentinel service: encode an ``@`` in its name), or in the query before its first
    ``=`` (an option's value, a file's path, may hold one)."""
    query = parts.query.partition("=")[0]
    if "@" in parts.fragment or "@" in parts.path or "@" in query:
        raise ConfigError(
            "url has an '@' after its host: percent-encode a user name or password "
            "that holds '/', '?' or '#' (as %2F, %3F, %23), and any other '@' (%40)"
        )


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse a ``redis+sentinel://`` or ``rediss+sentinel://`` URL, or raise a
    ``ConfigError`` naming the part that is wrong (never quoting a password)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError("url must be a valid redis+sentinel:// url") from None
    _check_not_cut(parts)
    if parts.scheme not in _SENTINEL_SCHEMES:
        raise ConfigError(
            f"url scheme must be 'redis+sentinel' or 'rediss+sentinel', got {parts.scheme!r}"
        )
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ConfigError(
            "url must name at least one sentinel, as in redis+sentinel://s1:26379/mymaster/0"
        )
    sentinels = tuple(_sentinel_address(host) for host in hosts.split(","))
    path = parts.path.split("/")[1:] if parts.path else []
    if not path or not path[0]:
        raise ConfigError(
            "url must name the monitored service, as in redis+sentinel://s1:26379/mymaster/0"
        )
    if len(path) > 2 or (len(path) == 2 and path[1] and not _database(path[1])):
        raise ConfigError(
            "url path must be /service or /service/db (a database number, 0 to 2147483647),"
            " as in redis+sentinel://s1:26379/mymaster/0"
        )
    tls = parts.scheme == "rediss+sentinel"
    options = _check_options(parts.query, tls=tls, sentinel=True)
    username = password = None
    if at:
        name, colon, secret = userinfo.partition(":")
        if not colon:
            # Some clients read redis://secret@host as a password, others as a user.
            raise ConfigError("url user part must be [user]:password@ (with a ':')")
        username, password = unquote(name) or None, unquote(secret) or None
    db = path[1] if len(path) == 2 and path[1] else ""
    _check_given_once(options, db, username, password)
    db = db or options.get("db", "0")
    return SentinelTarget(
        sentinels=sentinels,
        service=unquote(path[0]),
        db=int(db),
        username=username or options.get("username") or None,
        password=password or options.get("password") or None,
        sentinel_password=options.get("sentinel_password") or None,
        tls=_tls_settings(options) if tls else None,
    )


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {namespace!r}")
    if not namespace or "{" in namespace or "}" in namespace:
        raise ConfigError(f"namespace must be non-empty, without '{{' or '}}', got {namespace!r}")
    if any(char.isspace() for char in namespace):
        raise ConfigError(f"namespace must not contain whitespace, got {namespace!r}")
    check_sendable("namespace", namespace)
    return namespace


def check_sendable(what: str, value: str, *, secret: bool = False) -> None:
    """``ConfigError`` unless ``value`` encodes as UTF-8, as every string sent to the slot
    store's server must: a lone surrogate (``os.fsdecode`` of a file name that is not
    UTF-8 makes them) does not. A ``secret`` value (a url) is not quoted."""
    if value.isascii():
        return
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        if secret:
            shown = "it holds a lone surrogate (os.fsdecode makes them of bytes not UTF-8)"
        else:
            shown = f"got {value!r} (a lone surrogate at index {exc.start})"
        raise ConfigError(f"{what} must encode as UTF-8 to reach the slot store, {shown}") from None


_ONE_MS: Final = 0.001  # the server's unit: shorter durations would be sent as 0
_LONGEST: Final = 1e9  # seconds: the scripts count waits and expiries up to 1e12 ms
_LONGEST_RULE: Final = "at most 1e9 (about 31.7 years: the longest the server's scripts count)"


def _lease_ttl(value: object) -> float:
    seconds = positive_seconds("lease_ttl", value)
    if seconds < _ONE_MS:
        raise ConfigError(
            "lease_ttl must be at least 0.001 (one millisecond: the server's keys expire "
            f"in whole milliseconds), got {value!r}"
        )
    if seconds > _LONGEST:
        raise ConfigError(f"lease_ttl must be {_LONGEST_RULE}, got {value!r}")
    return seconds


def _connect_timeout(value: object) -> float:
    return positive_seconds("connect_timeout", value)


def _replicas_ack(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"replicas_ack must be an int, got {value!r}")
    if value < 0:
        raise ConfigError(f"replicas_ack must be >= 0, got {value!r}")
    return value


def _replicas_ack_timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"replicas_ack_timeout must be a number of seconds or None, got {value!r}")
    rule = "finite and >= 0.001 (one millisecond: WAIT with 0 ms blocks for ever)"
    try:
        seconds = float(value)
    except OverflowError:
        raise ConfigError(f"replicas_ack_timeout must be {rule}, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < _ONE_MS:
        raise ConfigError(f"replicas_ack_timeout must be {rule}, got {value!r}")
    if seconds > _LONGEST:
        raise ConfigError(f"replicas_ack_timeout must be {_LONGEST_RULE}, got {value!r}")
    return seconds


class SlotStore:
    """A shared server that makes a controller's slots cluster-wide.

    A slot store is a plain configuration value; the supervisor opens the connection.
    """

    __slots__ = ()


@attrs.frozen(repr=False)
class RedisSlotStore(SlotStore):
    """Cluster slots on one Redis (>= 6.2) or Valkey (>= 7.2) server, or on the primary
    that Sentinel names.

    ``url`` is ``redis://[[user]:password@]host[:port][/db]`` or ``rediss://`` (TLS),
    with the query options ``db``, ``username``, ``password``, and with ``rediss`` the
    ``ssl_*`` options (any other option is a ``ConfigError``; TLS checks the server's
    certificate and its host name unless they say otherwise); or, for a primary under
    Sentinel, ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``
    (``rediss+sentinel://`` for TLS), with ``sentinel_password`` for the sentinels' own
    password: the primary is asked of the sentinels at every connection. ``namespace``
    isolates one application's slots from another's on the same server; ``lease_ttl`` and
    ``connect_timeout`` are seconds of real time. With ``replicas_ack = n > 0`` every
    round trip that changes the store waits for ``n`` replicas to acknowledge it (at
    most ``replicas_ack_timeout``), so that a grant acted on survives the failure of the
    primary. Building it opens nothing. Its ``repr()`` never shows the password (``url``
    itself holds it).
    """

    url: str = attrs.field(converter=_check_url)
    """The server's URL (or its sentinels'), credentials included; show ``safe_url``."""
    namespace: str = attrs.field(default="taskvisor", kw_only=True, converter=_check_namespace)
    """The application's slot namespace on the server: non-empty, no whitespace, ``{`` or ``}``."""
    lease_ttl: float = attrs.field(default=10.0, kw_only=True, converter=_lease_ttl)
    """Seconds a lease lives on the server without renewal; renewed every ``lease_ttl / 3``.
    From 0.001 (the server's keys expire in whole milliseconds) to 1e9 (about 31.7 years)."""
    connect_timeout: float = attrs.field(default=5.0, kw_only=True, converter=_connect_timeout)
    """Seconds to reach the server at start (``SlotStoreUnavailableError`` past it).

    Also how long ``cluster_slot``, a request in flight, and shutdown's withdrawals wait for it.
    """
    replicas_ack: int = attrs.field(default=0, kw_only=True, converter=_replicas_ack)
    """Replicas that must acknowledge every round trip that changes the store (``>= 0``).

    ``0`` (default): no wait; a failover of the server may lose the latest grants. With
    ``n > 0`` each such round trip ends with ``WAIT n``; one that fewer than ``n``
    replicas acknowledge in time counts as failed (the store is unavailable until one
    reaches ``n`` again), and ``open_supervisor`` refuses a primary with fewer than ``n``
    connected replicas. Run one replica more than ``n`` to keep working through a
    failover (the new primary has one replica fewer).
    """
    replicas_ack_timeout: float | None = attrs.field(
        default=None, kw_only=True, converter=_replicas_ack_timeout
    )
    """Seconds one ``WAIT`` waits for the replicas (``0.001`` to ``1e9``); ``None``:
    ``lease_ttl / 10``, at most ``connect_timeout / 2`` (see ``ack_timeout``). Unused
    while ``replicas_ack`` is 0; with ``replicas_ack > 0`` it must be less than
    ``lease_ttl / 3`` (the renewal interval) and than ``connect_timeout``, the bounds of
    the round trips its ``WAIT`` ends (``ConfigError``)."""

    def __attrs_post_init__(self) -> None:
        timeout = self.replicas_ack_timeout
        if not self.replicas_ack or timeout is None:
            return
        interval = self.lease_ttl / 3
        if timeout >= interval or timeout >= self.connect_timeout:
            raise ConfigError(
                f"replicas_ack_timeout must be less than lease_ttl / 3 ({interval:.3g} s, the "
                f"renewal interval) and than connect_timeout ({self.connect_timeout!r} s), "
                f"got {timeout!r}: a WAIT that long would be cut short by the round trip it "
                "ends, and replicas that fall short would read as a server that did not answer"
            )

    def __repr__(self) -> str:
        return (
            f"RedisSlotStore({self.safe_url!r}, namespace={self.namespace!r}, "
            f"lease_ttl={self.lease_ttl!r}, connect_timeout={self.connect_timeout!r}, "
            f"replicas_ack={self.replicas_ack!r}, "
            f"replicas_ack_timeout={self.replicas_ack_timeout!r})"
        )

    __str__ = __repr__

    @property
    def safe_url(self) -> str:
        """The URL with its password masked: the only form of it that may be shown."""
        return redact_url(self.url)

    @property
    def ack_timeout(self) -> float:
        """Seconds one ``WAIT`` waits: ``replicas_ack_timeout``, else ``lease_ttl / 10``
        (at most ``connect_timeout / 2``)."""
        if self.replicas_ack_timeout is None:
            return min(self.lease_ttl / 10, self.connect_timeout / 2)
        return self.replicas_ack_timeout

    @property
    def sentinel(self) -> SentinelTarget | None:
        """The sentinels, service and credentials of a Sentinel URL; ``None`` for one server."""
        if urlsplit(self.url).scheme in _SENTINEL_SCHEMES:
            return parse_sentinel_url(self.url)
        return None

    @property
    def tls(self) -> TLSSettings | None:
        """How its sockets check the server over TLS; ``None`` without TLS."""
        target = self.sentinel
        if target is not None:
            return target.tls
        parts = urlsplit(self.url)
        if parts.scheme != "rediss":
            return None
        return _tls_settings(_check_options(parts.query, tls=True))

    @property
    def key_prefix(self) -> str:
        """The prefix of every key and channel of this namespace."""
        return "tv:{" + self.namespace + "}:"

    @property
    def keep(self) -> float:
        """How long the server keeps outcomes and markers for other processes (seconds)."""
        return max(60.0, 10.0 * self.lease_ttl)


# -- validators ---------------------------------------------------------------------------


def check_type(what: str, value: object, cls: type, *, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a ``cls`` (or ``None`` when ``optional``)."""
    if not isinstance(value, cls) and not (optional and value is None):
        suffix = " or None" if optional else ""
        article = "an" if cls.__name__[0] in "AEIOUaeiou" else "a"
        raise TypeError(f"{what} must be {article} {cls.__name__}{suffix}, got {value!r}")


def check_duration(what: str, value: object) -> float:
    """Validate a duration in seconds: a finite-or-infinite number ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise ConfigError(f"{what} must fit in a float, got {value!r}: too large") from None
    if math.isnan(seconds):
        raise ConfigError(f"{what} must be >= 0 and finite (or math.inf), got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{what} must be >= 0, got {value!r}")
    return seconds


def check_count(what: str, value: object, *, minimum: int, optional: bool = True) -> int | None:
    """Validate a count or limit: an ``int >= minimum``, or ``None`` when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{what} must be {kind}, got {value!r}")
    if value < minimum:
        rule = f">= {minimum} or None" if optional else f">= {minimum}"
        raise ConfigError(f"{what} must be {rule}, got {value!r}")
    return value


def check_capacity(what: str, value: object) -> int:
    """Validate a channel capacity: an ``int >= 1``."""
    capacity = check_count(what, value, minimum=1, optional=False)
    assert capacity is not None
    return capacity


def normalize_timeout(value: object) -> float | None:
    """Validate an attempt timeout; ``0`` and ``inf`` mean no timeout (``None``)."""
    if value is None:
        return None
    seconds = check_duration("timeout", value)
    return None if seconds == 0 or math.isinf(seconds) else seconds


def check_max_retries(value: object) -> int | None:
    """Validate ``max_retries``: ``None`` (unlimited) or an ``int >= 1``."""
    if value == 0 and not isinstance(value, bool):
        raise ConfigError("max_retries must be >= 1 or None, got 0; use TaskSpec.once instead")
    return check_count("max_retries", value, minimum=1)


def check_positive_seconds(what: str, value: object) -> float | None:
    """Validate ``healthy_after`` / ``retry_budget``: ``None`` or seconds ``> 0``.

    ``inf`` means ``None``.
    """
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and not value > 0:
        raise ConfigError(f"{what} must be > 0 or None, got {value!r}")  # NaN too
    seconds = check_duration(what, value)
    return None if math.isinf(seconds) else seconds


def normalize_healthy_after(value: object) -> float | None:
    """Validate ``healthy_after``: ``None`` or seconds ``> 0``."""
    return check_positive_seconds("healthy_after", value)


def normalize_retry_budget(value: object) -> float | None:
    """Validate ``retry_budget``: ``None`` or seconds ``> 0``."""
    return check_positive_seconds("retry_budget", value)


def check_retry_on(value: object) -> tuple[type[BaseException], ...] | None:
    """Validate ``retry_on``: ``None`` or a non-empty tuple of exception classes."""
    if value is None:
        return None
    if type(value) is not tuple:
        raise TypeError(f"retry_on must be a tuple of exception classes or None, got {value!r}")
    items: tuple[object, ...] = value  # pyright: ignore[reportUnknownVariableType]
    if not items:
        raise ConfigError("retry_on must name at least one exception class, got ()")
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"retry_on must hold exception classes, got {item!r} in {value!r}")
    return items  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


def check_critical(value: object) -> bool:
    """Validate ``critical``: a ``bool`` (``TypeError`` otherwise, ``0`` and ``1`` too)."""
    check_type("critical", value, bool)
    return value  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


def check_restart_limit(value: object) -> RestartLimit | None:
    """Validate ``restart_limit``: ``None`` or a ``RestartLimit``."""
    check_type("restart_limit", value, RestartLimit, optional=True)
    return value  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


_Validator: TypeAlias = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _validator(check: Callable[[str, Any], object]) -> _Validator:
    """An attrs validator calling ``check(field name, value)``."""

    def validate(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        check(attribute.name, value)

    return validate


def _count(*, minimum: int, optional: bool = True) -> _Validator:
    return _validator(
        lambda what, value: check_count(what, value, minimum=minimum, optional=optional)
    )


def _instance(cls: type, *, optional: bool = False) -> _Validator:
    return _validator(lambda what, value: check_type(what, value, cls, optional=optional))


_DURATION: Final = _validator(check_duration)
_CAPACITY: Final = _validator(check_capacity)


def _check_slot_store(value: object) -> None:
    if value is not None and not isinstance(value, SlotStore):
        raise ConfigError(
            f"slot_store must be a slot store (trio_taskvisor.redis.RedisSlotStore) or None, "
            f"got {value!r}"
        )


# -- values ---------------------------------------------------------------------------------


@attrs.frozen
class TaskDefaults:
    """Supervisor-wide values for ``TaskSpec`` options left as ``INHERIT``."""

    restart: RestartPolicy = attrs.field(
        default=RestartPolicy.ON_FAILURE, validator=_instance(RestartPolicy)
    )
    """The restart policy of tasks that inherit it."""
    backoff: BackoffPolicy = attrs.field(factory=BackoffPolicy, validator=_instance(BackoffPolicy))
    """The backoff policy of tasks that inherit it."""
    timeout: float | None = attrs.field(default=None, converter=normalize_timeout)
    """The attempt timeout in seconds of tasks that inherit it; ``None``: no limit."""
    max_retries: int | None = attrs.field(default=None, converter=check_max_retries)
    """The retry limit of tasks that inherit it; ``None``: unlimited."""
    healthy_after: float | None = attrs.field(default=None, converter=normalize_healthy_after)
    """Seconds after which an attempt counts as healthy; ``None``: never."""
    restart_limit: RestartLimit | None = attrs.field(default=None, converter=check_restart_limit)
    """The restart intensity limit of tasks that inherit it; ``None``: no limit."""
    retry_on: tuple[type[BaseException], ...] | None = attrs.field(
        default=None, converter=check_retry_on
    )
    """The exception classes worth a retry; ``None``: every ``Exception``."""
    retry_budget: float | None = attrs.field(default=None, converter=normalize_retry_budget)
    """Seconds from a streak's first failure in which retries may start; ``None``: no budget."""
    critical: bool = attrs.field(default=False, validator=_instance(bool))
    """Whether a task's final failure shuts the supervisor down (``CriticalTaskError``)."""
    limits: tuple[Pool, ...] = attrs.field(default=(), converter=check_limits)
    """The limit pools of tasks that inherit them; ``()``: none."""


@attrs.frozen
class ControllerConfig:
    """Budgets of the keyed controller; ``None`` means unlimited where allowed."""

    queue_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    """The size of the controller's bounded command channel; ``>= 1``."""
    max_slot_queue: int = attrs.field(default=100, validator=_count(minimum=0, optional=False))
    """The most entries queued in one slot behind its owner; REPLACE ignores it."""
    max_total_pending: int | None = attrs.field(default=1024, validator=_count(minimum=0))
    """The most queued entries over all slots; ``None``: unlimited."""
    max_slots: int | None = attrs.field(default=1024, validator=_count(minimum=1))
    """The most slots tracked at once (past it, ``RESOURCE_LIMIT``); ``None``: unlimited."""
    max_waiters: int | None = attrs.field(default=1024, validator=_count(minimum=0))
    """The most ``wait=True`` submissions held, joiners included; ``None``: unlimited."""
    slot_store: SlotStore | None = attrs.field(
        default=None, validator=_validator(lambda what, value: _check_slot_store(value))
    )
    """A ``RedisSlotStore`` makes every slot cluster-wide; ``None``: slots are in-process."""


@attrs.frozen
class SupervisorConfig:
    """Settings of one supervisor; invalid values raise ``ConfigError``.

    ``grace`` may be ``math.inf`` (never force); capacities must be ``>= 1``.
    ``log_failures`` (default ``True``) writes final ``FAILED``, ``FATAL`` and
    ``PANICKED`` outcomes (ERROR, with the error as ``exc_info``) and the first failed
    attempt of each failure streak (WARNING) to the ``trio_taskvisor`` logger, unless a
    ``LoggingSubscriber`` is subscribed.
    """

    grace: float = attrs.field(default=60.0, validator=_DURATION)
    """Seconds from a stop request (a task's or shutdown's) until it is forced; ``inf``: never."""
    subscriber_shutdown_timeout: float = attrs.field(default=5.0, validator=_DURATION)
    """Seconds to drain subscriber queues at shutdown, once every task has exited."""
    max_concurrent: int | None = attrs.field(default=None, validator=_count(minimum=1))
    """The most attempts running at once (FIFO permits); ``None``: unlimited."""
    max_registered_tasks: int | None = attrs.field(default=1024, validator=_count(minimum=1))
    """The most registered and stopping tasks (forced ones until they exit); ``None``: unlimited."""
    command_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    """The size of the registry's bounded command channel."""
    bus_capacity: int = attrs.field(default=1024, validator=_CAPACITY)
    """The size of the bounded event bus channel."""
    task_defaults: TaskDefaults = attrs.field(
        factory=TaskDefaults, validator=_instance(TaskDefaults)
    )
    """The values of ``TaskSpec`` options left as ``INHERIT``."""
    controller: ControllerConfig | None = attrs.field(
        default=None, validator=_instance(ControllerConfig, optional=True)
    )
    """Installs the keyed controller with these budgets; ``None``: no controller."""
    random: random.Random = attrs.field(
        factory=random.Random, eq=False, validator=_instance(random.Random)
    )
    """The source of backoff jitter; seed it for reproducible delays."""
    log_failures: bool = attrs.field(default=True, validator=_instance(bool))
    """Log final failures and each streak's first failed attempt to ``trio_taskvisor``."""
