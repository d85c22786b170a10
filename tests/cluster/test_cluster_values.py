"""The pure parts of cluster slots (``_slotstore``), property-tested without a server.

* ``LeaseDeadline``: the lease is lost at ``0.8 * lease_ttl`` after the sending of the
  last renewal (or the acquisition) the server confirmed, whatever order the replies
  come in; at once when a renewal is refused; and a lost lease stays lost.
* The outcome codec: ``kind``, ``reason``, ``exit_code`` and ``rejection`` survive,
  ``error`` does not, ``value`` goes through JSON (tuples come back as lists, keys as
  strings); a value JSON refuses, or whose text is longer than 2**20 characters,
  arrives as ``None`` with a ``"value not transferable: ..."`` reason; decoding anything
  else raises ``ValueError``.
* ``RedisSlotStore``: what it accepts, and that the password shows nowhere (``repr``,
  ``str``, ``safe_url``, error messages) for any URL that can carry one.
* The ``renew`` arguments and reply (JSON both ways): every item kind parses, anything
  else raises ``ValueError``.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import quote, unquote, unquote_plus

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trio_taskvisor import ConfigError, OutcomeKind, RejectionKind, TaskOutcome
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore, SentinelTarget, TLSSettings, parse_sentinel_url
from trio_taskvisor._keeper import secrets_of
from trio_taskvisor._redis_scripts import LimitReply, Reply
from trio_taskvisor._slotstore import (
    LOST_LEASE_FRACTION,
    MAX_TRANSFER_CHARS,
    EntryId,
    LeaseDeadline,
    decode_outcome,
    encode_outcome,
    entry_id,
    instance_of,
    parse_entry_id,
)

# -- the lost-lease rule ----------------------------------------------------------------------

ttls = st.floats(min_value=0.01, max_value=1000.0, allow_nan=False)
instants = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@st.composite
def lease_histories(draw: st.DrawFn) -> tuple[float, float, list[tuple[float, str, float]]]:
    """A lease's acquisition send time, and its renewals' replies and the timer checks
    as one timeline: ``(time, "ok" | "refused", sent_at)`` or ``(time, "check", time)``.

    Renewals are sent in order, about every ``ttl / 3``; their replies come back after
    any delay, so they may arrive out of order, late, or after the deadline.
    """
    ttl = draw(ttls)
    acquired = draw(instants)
    events: list[tuple[float, str, float]] = []
    sent = acquired
    for _ in range(draw(st.integers(0, 10))):
        sent += draw(st.floats(0.0, ttl))
        delay = draw(st.floats(0.0, 2 * ttl))
        verdict = draw(st.sampled_from(["ok", "ok", "ok", "ok", "refused"]))
        events.append((sent + delay, verdict, sent))
    for at in draw(st.lists(st.floats(acquired, sent + 2 * ttl), max_size=12)):
        events.append((at, "check", at))
    order = draw(st.permutations(range(len(events))))
    # time order; events at the same instant in a drawn order
    events = [events[i] for i in sorted(order, key=lambda i: (events[i][0], order.index(i)))]
    return ttl, acquired, events


@given(lease_histories())
@settings(max_examples=300)
def test_lease_is_lost_by_the_last_confirmed_send(
    history: tuple[float, float, list[tuple[float, str, float]]],
) -> None:
    """Held while some confirmed send (the acquisition or a renewal) is less than
    0.8 * lease_ttl old at the check; lost at once on a refusal; out-of-order replies
    never pull the deadline back."""
    ttl, acquired, events = history
    rule = LeaseDeadline.acquired(acquired, ttl)
    latest_confirmed = acquired
    expected: str | None = None  # "refused" / "expired" once lost
    for _, what, value in events:
        if what == "check":
            if expected is None and value >= latest_confirmed + LOST_LEASE_FRACTION * ttl:
                expected = "expired"
            reason = rule.check(value)
        elif what == "ok":
            if expected is None:
                latest_confirmed = max(latest_confirmed, value)
            rule.renewed(value)
            reason = rule.lost
        else:
            expected = expected or "refused"
            reason = rule.refused()
        if expected is None:
            assert reason is None
            assert rule.deadline == latest_confirmed + LOST_LEASE_FRACTION * ttl
        else:
            assert reason is not None
            assert reason.startswith(f"lease {expected}")


@given(ttl=ttls, acquired=instants)
def test_deadline_is_inclusive(ttl: float, acquired: float) -> None:
    """The lease is held until just before sent + 0.8 * lease_ttl and lost at it."""
    deadline = acquired + LOST_LEASE_FRACTION * ttl
    rule = LeaseDeadline.acquired(acquired, ttl)
    assert rule.check(math.nextafter(deadline, -math.inf)) is None
    limit = LOST_LEASE_FRACTION * ttl
    assert rule.check(deadline) == (
        f"lease expired: no renewal confirmed within {limit:g} s of its sending"
    )


@given(
    ttl=ttls,
    acquired=instants,
    refused=st.booleans(),
    later=st.lists(st.tuples(st.booleans(), instants), max_size=10),
)
def test_a_lost_lease_is_never_held_again(
    ttl: float, acquired: float, refused: bool, later: list[tuple[bool, float]]
) -> None:
    """After the loss, no renewal (however recent its sending) and no check (however
    early) gives the lease back, and the reason stays the first one."""
    rule = LeaseDeadline.acquired(acquired, ttl)
    lost = rule.refused() if refused else rule.check(acquired + ttl)
    assert lost is not None
    deadline = rule.deadline
    for renew, at in later:
        if renew:
            rule.renewed(at)
            assert rule.deadline == deadline
        else:
            assert rule.check(at) == lost
        assert rule.refused() == lost
        assert rule.lost == lost


# -- the outcome codec -----------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_keys = (
    st.text(max_size=8)
    | st.integers(-1000, 1000)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
)
# JSON-able in Python's sense: tuples and non-str keys allowed (they come back changed)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(json_keys, inner, max_size=4)
    ),
    max_leaves=15,
)


def _circular() -> list[object]:
    loop: list[object] = []
    loop.append(loop)
    return loop


# values json.dumps(..., allow_nan=False) refuses, alone or deep inside JSON-able ones
poison = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.sets(st.integers(), max_size=2),
    st.binary(max_size=4),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.builds(object),
    st.builds(_circular),
    st.dictionaries(st.tuples(st.integers()), st.integers(), min_size=1, max_size=2),
    st.just({math.nan: 1}),
)
untransferable = st.recursive(
    poison,
    lambda inner: (
        st.builds(lambda x, rest: [*rest, x], inner, st.lists(json_values, max_size=2))
        | st.builds(
            lambda x, key, rest: {**rest, key: x},
            inner,
            st.text(max_size=4),
            st.dictionaries(st.text(max_size=4), json_values, max_size=2),
        )
    ),
    max_leaves=4,
)

outcome_fields = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(OutcomeKind),
        "reason": st.none() | st.text(max_size=30),
        "exit_code": st.none() | st.integers(-(2**63), 2**63),
        "rejection": st.none() | st.sampled_from(RejectionKind),
        "error": st.none() | st.builds(ValueError, st.text(max_size=10)),
    }
)


def through_json(value: object) -> object:
    """What a transferable value becomes in another process."""
    return json.loads(json.dumps(value, allow_nan=False))


@given(fields=outcome_fields, value=json_values)
@settings(max_examples=300)
def test_outcome_round_trip_keeps_everything_but_the_error(
    fields: dict[str, Any], value: object
) -> None:
    """kind, reason, exit_code and rejection come back equal; error is None; the value
    comes back as JSON gives it (tuples as lists, keys as strings)."""
    outcome = TaskOutcome(value=value, **fields)
    decoded = decode_outcome(encode_outcome(outcome))
    assert decoded == TaskOutcome(
        fields["kind"],
        value=through_json(value),
        reason=fields["reason"],
        exit_code=fields["exit_code"],
        rejection=fields["rejection"],
    )
    assert decoded.error is None


def test_tuples_and_int_keys_change_on_the_way() -> None:
    """The documented changes: tuples become lists, int keys become strings."""
    outcome = TaskOutcome(OutcomeKind.COMPLETED, value=(1, {2: (3,)}))
    assert decode_outcome(encode_outcome(outcome)).value == [1, {"2": [3]}]


@given(fields=outcome_fields, value=untransferable)
@settings(max_examples=200)
def test_value_json_refuses_is_not_transferred(fields: dict[str, Any], value: object) -> None:
    """A value json.dumps refuses arrives as None, with json's error as the reason; the
    kind (COMPLETED included) and the other fields stay."""
    with pytest.raises((TypeError, ValueError)) as refusal:
        json.dumps(value, allow_nan=False)
    decoded = decode_outcome(encode_outcome(TaskOutcome(value=value, **fields)))
    assert decoded == TaskOutcome(
        fields["kind"],
        reason=f"value not transferable: {refusal.value}",
        exit_code=fields["exit_code"],
        rejection=fields["rejection"],
    )


@given(
    extra=st.integers(-3, 3),
    char=st.sampled_from(["x", "\u00e9", "\U0001f600"]),
    nested=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_value_longer_than_a_mebibyte_is_not_transferred(
    extra: int, char: str, nested: bool
) -> None:
    """The limit is on the encoded text (escapes count): 2**20 characters pass, one
    more does not; the kind stays COMPLETED."""
    width = len(json.dumps(char)) - 2  # "x" -> 1, "\u00e9" -> 6, an emoji -> 12
    overhead = 4 if nested else 2  # ["..."] or "..."
    count = (MAX_TRANSFER_CHARS - overhead) // width + extra
    text = char * count
    value: object = [text] if nested else text
    encoded_length = len(json.dumps(value))
    decoded = decode_outcome(encode_outcome(TaskOutcome(OutcomeKind.COMPLETED, value=value)))
    if encoded_length <= MAX_TRANSFER_CHARS:
        assert decoded == TaskOutcome(OutcomeKind.COMPLETED, value=value)
    else:
        assert decoded == TaskOutcome(
            OutcomeKind.COMPLETED, reason="value not transferable: encoded value exceeds 1 MiB"
        )


encoded_like = st.dictionaries(
    st.sampled_from(["kind", "reason", "exit_code", "rejection", "value"]),
    st.sampled_from([*OutcomeKind, *RejectionKind]).map(lambda k: k.value) | json_values,
).map(json.dumps)


@given(text=st.text(max_size=40) | encoded_like)
@settings(max_examples=300)
def test_decoding_accepts_only_encoded_outcomes(text: str) -> None:
    """Any text decodes to a well-typed outcome or raises ValueError, nothing else."""
    try:
        decoded = decode_outcome(text)
    except ValueError:
        return
    data = json.loads(text)
    assert decoded.kind is OutcomeKind(data["kind"])
    assert decoded.reason is None or isinstance(decoded.reason, str)
    assert decoded.exit_code is None or type(decoded.exit_code) is int
    assert decoded.rejection is None or isinstance(decoded.rejection, RejectionKind)
    assert decoded.error is None
    assert decoded.value == data["value"]


# -- RedisSlotStore ---------------------------------------------------------------------------

# characters a password may carry unescaped in the user part of a URL
RAW_SAFE = "abcXYZ0189-._~!$&'()*+,;=:@"
secrets = st.text(min_size=1, max_size=12)
raw_secrets = st.text(RAW_SAFE, min_size=1, max_size=12).filter(lambda s: s[0] != "@")
names = st.text("abcxyz019-._", min_size=1, max_size=8)


def escaped(text: str) -> str:
    return quote(text, safe="")


def password_keys() -> st.SearchStrategy[str]:
    """``password`` as a query key, with any characters percent-escaped (coredis reads
    query keys decoded; another case is an unsupported option, see ``broken_urls``)."""

    def spell(word: str, escapes: list[bool]) -> str:
        return "".join(f"%{ord(c):02X}" if e else c for c, e in zip(word, escapes, strict=True))

    return st.builds(spell, st.just("password"), st.lists(st.booleans(), min_size=8, max_size=8))


@st.composite
def urls_with_secrets(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """A valid store URL, the URL as it must show (every secret masked), and the
    secrets as written in the URL (with their decoded forms)."""
    scheme = draw(st.sampled_from(["redis", "rediss"]))
    host = draw(st.sampled_from(["127.0.0.1", "localhost", "cache.example.com", "[::1]"]))
    port = draw(st.none() | st.integers(1, 65535))
    db = draw(st.none() | st.integers(0, 15))
    found: list[str] = []
    shown = url = f"{scheme}://"
    form = draw(st.sampled_from(["none", "user:pw", ":pw", "pw", "user"]))
    given: dict[str, str] = {}  # the user part's name and password, as options must repeat them
    if form != "none":
        raw = draw(st.booleans())
        secret = draw(raw_secrets) if raw else draw(secrets)
        written = secret if raw else escaped(secret)
        found += [written, secret]
        given = {"password": secret} if ":" in form else {"username": unquote(written)}
        if form == "user:pw":
            user = draw(names)
            given["username"] = user
            url, shown = f"{url}{user}:{written}@", f"{shown}{user}:***@"
        else:
            if form != ":pw":
                assume(":" not in written)  # a bare user part has no colon
            prefix = ":" if form == ":pw" else ""
            url, shown = f"{url}{prefix}{written}@", f"{shown}{prefix}***@"
    tail = host + ("" if port is None else f":{port}") + ("" if db is None else f"/{db}")
    url, shown = url + tail, shown + tail
    other_keys = ["db", "username"] + (["ssl_cert_reqs"] if scheme == "rediss" else [])
    params = draw(
        st.lists(
            st.tuples(password_keys() | st.sampled_from(other_keys), secrets),
            max_size=3,
            unique_by=lambda param: unquote(param[0]),  # each option once
        )
    )
    for index, (key, value) in enumerate(params):
        sep = "?" if index == 0 else "&"
        if key == "db":
            value = str(len(value) if db is None else db)  # the path's database, if any
        if key == "ssl_cert_reqs":
            value = draw(st.sampled_from(["none", "optional", "required"]))
        value = given.get(unquote(key), value)  # a user part's value, given once
        url += f"{sep}{key}={escaped(value)}"
        if unquote_plus(key).lower() == "password":
            shown += f"{sep}{key}=***"
            found += [escaped(value), value]
        else:
            shown += f"{sep}{key}={escaped(value)}"
    return url, shown, found


@given(urls_with_secrets())
@settings(max_examples=250)
def test_store_never_shows_the_password(case: tuple[str, str, list[str]]) -> None:
    """repr, str and safe_url mask every password (user part, ``password`` query
    parameters however spelt); the URL itself is kept as given."""
    url, shown, found = case
    store = RedisSlotStore(url, namespace="ns")
    assert store.url == url
    assert store.safe_url == shown
    texts = [repr(store), str(store), store.safe_url]
    public = (
        f"RedisSlotStore({shown!r}, namespace='ns', lease_ttl=10.0, connect_timeout=5.0, "
        "replicas_ack=0, replicas_ack_timeout=None)"
    )
    assert repr(store) == public
    for secret in found:
        assume(secret not in public)  # a secret like "1" may be part of the port
        assert not [text for text in texts if secret in text]


@st.composite
def broken_urls(draw: st.DrawFn) -> tuple[str, str, str]:
    """A URL with a password that the store must refuse, the same URL with another
    password, and the password."""
    secret = draw(secrets)
    template = draw(
        st.sampled_from(
            [
                "http://user:{}@host:6379/0",
                "unix://user:{}@/tmp/redis.sock",
                "user:{}@host:6379",
                "redis://user:{}@:6379/0",
                "redis://user:{}@host:6379/zero",
                "redis://user:{}@host:99999/0",
                "rediss://user:{}@host:port/0",
                "redis+tls://user:{}@host/0",
                "redis://user:{}@[::1/0",
                "redis://host:6379/0?PASSWORD={}",
                "redis://host:6379/0?cluster=true&password={}",
                "redis://:{}@host:6379/0?client_name=x",
                "redis://:{}@host:6379/0?ssl_cert_reqs=none",
                "redis://:{}@host:6379/0?db=one",
            ]
        )
    )
    return template.format(escaped(secret)), template.format("placeholder"), secret


@given(broken_urls())
def test_refused_urls_never_quote_the_password(case: tuple[str, str, str]) -> None:
    """A URL the store refuses raises ConfigError whose text names the wrong part only:
    the same text whatever the password."""
    url, placeholder_url, secret = case
    with pytest.raises(ConfigError) as refusal:
        RedisSlotStore(url)
    with pytest.raises(ConfigError) as same:
        RedisSlotStore(placeholder_url)
    assert str(refusal.value) == str(same.value)
    for text in (secret, escaped(secret)):
        assume(text not in repr(same.value))
        assert text not in str(refusal.value)
        assert text not in repr(refusal.value)


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:p\udcff@host:6379/0",
        "redis://host\ud800:6379/0",
        "redis://host:6379/0?username=\udcff",
        "redis+sentinel://user:p\udcff@s1:26379/mymaster",
    ],
)
def test_a_url_that_does_not_encode_is_refused_without_quoting_it(url: str) -> None:
    """A lone surrogate in the URL (``os.fsdecode`` of an argument that is not UTF-8):
    ConfigError at construction, without quoting the URL. Before, such a password said
    the server "could not be reached" (a UnicodeEncodeError) when the store opened."""
    with pytest.raises(ConfigError) as info:
        RedisSlotStore(url)
    assert str(info.value) == (
        "url must encode as UTF-8 to reach the slot store, it holds a lone surrogate "
        "(os.fsdecode makes them of bytes not UTF-8)"
    )


@given(namespace=st.text(max_size=12) | st.text(st.sampled_from("ab{} \ud800\udcff"), max_size=4))
@settings(max_examples=200)
def test_namespace_rule(namespace: str) -> None:
    """A namespace is accepted iff non-empty, without '{', '}' or whitespace, and it
    encodes as UTF-8 (no lone surrogate); it makes the key prefix ``tv:{<namespace>}:``."""
    valid = (
        bool(namespace)
        and not any(c in "{}" or c.isspace() for c in namespace)
        and _encodes(namespace)
    )
    if valid:
        assert RedisSlotStore("redis://h/0", namespace=namespace).key_prefix == (
            "tv:{" + namespace + "}:"
        )
    else:
        with pytest.raises(ConfigError):
            RedisSlotStore("redis://h/0", namespace=namespace)


@given(
    value=st.integers(-5, 10**400)
    | st.floats()
    | st.sampled_from([0.001, 0.0009999, 0.0004, 1e-9, 1e9, 10**9, 1e9 + 1, 10**9 + 1, 1e15])
    | st.booleans()
    | st.none()
    | st.text(max_size=3),
    field=st.sampled_from(["lease_ttl", "connect_timeout"]),
)
@settings(max_examples=200)
def test_duration_rule(value: object, field: str) -> None:
    """Durations: finite numbers > 0 (stored as float), ``lease_ttl`` from 0.001 s (the
    server's keys expire in whole milliseconds: less would be sent as 0, which it
    refuses) to 1e9 s (the longest the scripts count); other numbers are a ConfigError;
    bools and non-numbers a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        with pytest.raises(TypeError):
            RedisSlotStore("redis://h/0", **{field: value})
        return
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    low, high = (0.001, 1e9) if field == "lease_ttl" else (0.0, math.inf)
    if math.isfinite(seconds) and seconds > 0 and low <= seconds <= high:
        store = RedisSlotStore("redis://h/0", **{field: value})
        assert getattr(store, field) == seconds
        assert type(getattr(store, field)) is float
        assert store.keep == max(60.0, 10.0 * store.lease_ttl)
    elif math.isfinite(seconds) and seconds > high:
        rule = r"lease_ttl must be at most 1e9 \(about 31\.7 years: the longest the server's"
        with pytest.raises(ConfigError, match=rule):
            RedisSlotStore("redis://h/0", **{field: value})
    elif math.isfinite(seconds) and seconds > 0:
        rule = r"lease_ttl must be at least 0\.001 \(one millisecond: the server's keys expire"
        with pytest.raises(ConfigError, match=rule):
            RedisSlotStore("redis://h/0", **{field: value})
    else:
        with pytest.raises(ConfigError, match=f"{field} must be finite and > 0"):
            RedisSlotStore("redis://h/0", **{field: value})


@given(value=st.integers(-5, 10**400) | st.floats() | st.booleans() | st.text(max_size=3))
@settings(max_examples=200)
def test_replicas_ack_rule(value: object) -> None:
    """replicas_ack: an int >= 0 (default 0); negative ints are a ConfigError; bools,
    floats and non-numbers a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        with pytest.raises(TypeError, match=r"replicas_ack must be an int, got "):
            RedisSlotStore("redis://h/0", replicas_ack=value)
    elif value < 0:
        with pytest.raises(ConfigError, match=rf"replicas_ack must be >= 0, got {value}$"):
            RedisSlotStore("redis://h/0", replicas_ack=value)
    else:
        assert RedisSlotStore("redis://h/0", replicas_ack=value).replicas_ack == value
    assert RedisSlotStore("redis://h/0").replicas_ack == 0


@given(
    value=st.integers(-5, 10**400)
    | st.floats()
    | st.sampled_from([0.001, 0.0009999, 1e-9, 1e9, 1e9 + 1, 1e16])
    | st.booleans()
    | st.text(max_size=3)
)
@settings(max_examples=200)
def test_replicas_ack_timeout_rule(value: object) -> None:
    """replicas_ack_timeout: a number from 0.001 s (``WAIT n 0`` blocks for ever) to 1e9 s
    (``WAIT`` takes an integer of milliseconds), stored as float; other numbers are a
    ConfigError; bools and non-numbers a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        with pytest.raises(TypeError, match="replicas_ack_timeout must be a number of seconds"):
            RedisSlotStore("redis://h/0", replicas_ack_timeout=value)
        return
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if math.isfinite(seconds) and 0.001 <= seconds <= 1e9:
        store = RedisSlotStore("redis://h/0", replicas_ack_timeout=value)
        assert store.replicas_ack_timeout == store.ack_timeout == seconds
        assert type(store.replicas_ack_timeout) is float
    elif math.isfinite(seconds) and seconds > 1e9:
        rule = r"replicas_ack_timeout must be at most 1e9 \(about 31\.7 years"
        with pytest.raises(ConfigError, match=rule):
            RedisSlotStore("redis://h/0", replicas_ack_timeout=value)
    else:
        rule = r"replicas_ack_timeout must be finite and >= 0\.001 \(one millisecond: WAIT"
        with pytest.raises(ConfigError, match=rule):
            RedisSlotStore("redis://h/0", replicas_ack_timeout=value)


def test_replicas_ack_timeout_defaults_to_a_tenth_of_the_lease() -> None:
    """Without replicas_ack_timeout, a WAIT waits lease_ttl / 10, and follows lease_ttl."""
    store = RedisSlotStore("redis://h/0", lease_ttl=2.0, replicas_ack=1)
    assert (store.replicas_ack_timeout, store.ack_timeout) == (None, 0.2)
    assert attrs.evolve(store, lease_ttl=5.0).ack_timeout == 0.5
    assert "replicas_ack=1, replicas_ack_timeout=None)" in repr(store)


@pytest.mark.parametrize(
    ("fields", "bound"),
    [
        pytest.param({"replicas_ack_timeout": 1.0}, "0.333", id="the-renewal-interval"),
        pytest.param({"replicas_ack_timeout": 0.5}, "0.333", id="past-the-renewal-interval"),
        pytest.param(
            {"replicas_ack_timeout": 0.2, "connect_timeout": 0.2}, "0.333", id="connect-timeout"
        ),
    ],
)
def test_a_replicas_ack_timeout_past_a_round_trips_bound_is_refused(
    fields: dict[str, float], bound: str
) -> None:
    """With replicas_ack, a WAIT longer than the round trip it ends (a renewal's
    lease_ttl / 3, a request's connect_timeout) is a ConfigError: the keeper cut that
    round trip first, and replicas that fell short read as a server that "did not
    answer". Also at attrs.evolve; unchecked while replicas_ack is 0 (unused)."""
    given = fields["replicas_ack_timeout"]
    with pytest.raises(ConfigError) as error:
        RedisSlotStore("redis://h/0", lease_ttl=1.0, replicas_ack=1, **fields)  # type: ignore[arg-type]
    assert str(error.value) == (
        f"replicas_ack_timeout must be less than lease_ttl / 3 ({bound} s, the renewal"
        f" interval) and than connect_timeout ({fields.get('connect_timeout', 5.0)!r} s), got"
        f" {given!r}: a WAIT that long would be cut short by the round trip it ends, and"
        " replicas that fall short would read as a server that did not answer"
    )
    unused = RedisSlotStore("redis://h/0", lease_ttl=1.0, **fields)  # type: ignore[arg-type]
    assert unused.replicas_ack_timeout == given
    with pytest.raises(ConfigError, match="replicas_ack_timeout must be less than"):
        attrs.evolve(unused, replicas_ack=1)
    fits = RedisSlotStore("redis://h/0", lease_ttl=1.0, replicas_ack=1, replicas_ack_timeout=0.3)
    assert fits.ack_timeout == 0.3
    with pytest.raises(ConfigError, match="replicas_ack_timeout must be less than"):
        attrs.evolve(fits, lease_ttl=0.9)


def test_the_default_replicas_ack_timeout_fits_connect_timeout() -> None:
    """The default WAIT, lease_ttl / 10, is at most half of connect_timeout (a request's
    round trip bound): a long lease with a short connect_timeout no longer waits past
    the round trip (it waited 3.5 s in a round trip cut at 1 s)."""
    store = RedisSlotStore("redis://h/0", lease_ttl=35.0, connect_timeout=1.0, replicas_ack=1)
    assert (store.replicas_ack_timeout, store.ack_timeout) == (None, 0.5)
    assert attrs.evolve(store, connect_timeout=10.0).ack_timeout == 3.5


@pytest.mark.parametrize("url", [None, b"redis://h/0", 6379])
def test_url_must_be_text(url: object) -> None:
    """A URL that is not a str is a TypeError."""
    with pytest.raises(TypeError, match="url must be a str"):
        RedisSlotStore(url)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("cluster=true", "url option 'cluster' is not supported: the store runs on one server"),
        ("cluster", "url option 'cluster' is not supported"),
        ("retries=3", r"url option 'retries' is not supported \(supported: db, password, "),
        ("DB=1", "url option 'DB' is not supported"),
        ("connect_timeout=9", "url option 'connect_timeout' is not supported"),
        ("client_name=x", "url option 'client_name' is not supported"),
        ("noreply=true", "url option 'noreply' is not supported"),
        ("db=0&protocol_version=2", "url option 'protocol_version' is not supported"),
        ("ssl_cert_reqs=none", r"url option 'ssl_cert_reqs' needs a rediss:// \(TLS\) url"),
        ("db=x", "url option 'db' must be a database number"),
        ("db=1&db=2", "url option 'db' must be given once"),
        ("password=a&password=b", "url option 'password' must be given once"),
        ("db=1", "url must give its database once: its path and its option 'db' differ"),
    ],
)
def test_unsupported_url_options_are_refused(query: str, named: str) -> None:
    """A query option the store does not pass on (coredis would ignore an unknown one
    silently, and others change what the keeper relies on) is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=named):
        RedisSlotStore(f"redis://h:6379/0?{query}")


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379/2147483648",
        "redis://h:6379/99999999999999999999",
        "redis://h:6379/\uff11",  # a full-width 1
        "redis://h:6379?db=2147483648",
        "redis://h:6379?db=\uff11",
        "redis+sentinel://s:26379/svc/2147483648",
        "redis+sentinel://s:26379/svc/\uff11",
    ],
)
def test_a_database_number_select_cannot_read_is_refused(url: str) -> None:
    """A database number is ASCII digits below 2**31: a larger one failed only at the
    start ("refused the connection: value is out of range"), and a full-width digit was
    read as its ASCII one."""
    with pytest.raises(ConfigError, match=r"a database number,? \(?0 to 2147483647"):
        RedisSlotStore(url)


def test_the_largest_database_number_is_accepted() -> None:
    assert RedisSlotStore("redis://h:6379/2147483647?db=2147483647")
    assert RedisSlotStore("redis+sentinel://s:26379/svc/2147483647")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://u:p@h/0?password=q", "its password once: its user part and its option "),
        ("redis://u:p@h/0?username=v", "its user name once: its user part and its option "),
        ("redis://u@h/0?username=v", "its user name once: its user part and its option "),
        ("redis+sentinel://u:p@s/svc?password=q", "its password once: its user part and "),
        ("redis+sentinel://u:p@s/svc/2?db=3", "its database once: its path and its option "),
    ],
)
def test_a_value_given_twice_must_be_the_same(url: str, message: str) -> None:
    """The user part and the path against the options: coredis took the user part and
    the ``db`` option, the Sentinel parser the user part and the path; two different
    values are refused (the same value twice is accepted)."""
    with pytest.raises(ConfigError) as refusal:
        RedisSlotStore(url)
    assert str(refusal.value).startswith(f"url must give {message}")
    RedisSlotStore("redis://u:p@h/2?password=p&username=u&db=02")


def test_supported_url_options_are_accepted() -> None:
    """``db``, ``username``, ``password``, and with ``rediss`` the ``ssl_*`` options."""
    RedisSlotStore("redis://h/?db=3&username=u&password=p")
    RedisSlotStore("redis://h/3?db=3")  # the same database twice
    tls = "ssl_cert_reqs=required&ssl_ca_certs=/ca.pem&ssl_check_hostname=true"
    RedisSlotStore(f"rediss://h/0?{tls}&ssl_certfile=/c.pem&ssl_keyfile=/k.pem")


@pytest.mark.parametrize(
    ("query", "settings"),
    [
        ("", TLSSettings(verify=True, check_hostname=True)),
        ("ssl_cert_reqs=required", TLSSettings(verify=True, check_hostname=True)),
        ("ssl_cert_reqs=optional", TLSSettings(verify=True, check_hostname=True)),
        ("ssl_check_hostname=False", TLSSettings(verify=True, check_hostname=False)),
        ("ssl_check_hostname=n", TLSSettings(verify=True, check_hostname=False)),
        ("ssl_cert_reqs=none", TLSSettings(verify=False, check_hostname=False)),
        (
            "ssl_cert_reqs=none&ssl_check_hostname=no",
            TLSSettings(verify=False, check_hostname=False),
        ),
        ("ssl_certfile=/both.pem", TLSSettings(certfile="/both.pem")),
        (
            "ssl_ca_certs=/ca&ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
            TLSSettings(ca_certs="/ca", certfile="/c.pem", keyfile="/k.pem"),
        ),
    ],
)
def test_tls_checks_the_certificate_and_the_host_name_by_default(
    query: str, settings: TLSSettings
) -> None:
    """TLS checks the server's certificate and its host name unless told otherwise (as
    trio does; coredis checked no host name), the same for a Sentinel URL."""
    assert RedisSlotStore(f"rediss://h/0?{query}").tls == settings
    assert RedisSlotStore(f"rediss+sentinel://s/svc?{query}").tls == settings
    assert RedisSlotStore("redis://h/0").tls is None
    assert RedisSlotStore("redis+sentinel://s/svc").tls is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("ssl_cert_reqs=bogus", "url option 'ssl_cert_reqs' must be none, optional or required"),
        ("ssl_cert_reqs=REQUIRED", "url option 'ssl_cert_reqs' must be none, optional or "),
        ("ssl_cert_reqs=", "url option 'ssl_cert_reqs' must be none, optional or required"),
        ("ssl_check_hostname=maybe", "url option 'ssl_check_hostname' must be true or false"),
        ("ssl_check_hostname=", "url option 'ssl_check_hostname' must be true or false"),
        (
            "ssl_cert_reqs=none&ssl_check_hostname=true",
            "url option 'ssl_check_hostname' cannot be true with ssl_cert_reqs=none",
        ),
        ("ssl_ca_certs=", "url option 'ssl_ca_certs' must name a file"),
        ("ssl_certfile=", "url option 'ssl_certfile' must name a file"),
        ("ssl_keyfile=/k.pem", "url option 'ssl_keyfile' needs 'ssl_certfile', its certificate"),
        ("ssl_ca_certs=/a&ssl_ca_certs=/b", "url option 'ssl_ca_certs' must be given once"),
    ],
)
def test_bad_tls_options_are_refused_when_the_store_is_built(query: str, message: str) -> None:
    """A TLS option's value is checked when the store is built (a wrong one failed each
    connection as "could not be reached: KeyError", or was read as true)."""
    for url in (f"rediss://h/0?{query}", f"rediss+sentinel://s/svc?{query}"):
        with pytest.raises(ConfigError) as refusal:
            RedisSlotStore(url)
        assert str(refusal.value).startswith(message)


@pytest.mark.parametrize(
    ("netloc", "port"),
    [
        ("h:99999", "99999"),
        ("h:port", "port"),
        ("h:0", "0"),
        ("[::1]:-1", "-1"),
        ("u:p@h:x1", "x1"),
    ],
)
def test_url_error_names_the_bad_port(netloc: str, port: str) -> None:
    """A port that is not a number from 1 to 65535 is named in the error (0 too: coredis
    would connect to 6379 instead)."""
    with pytest.raises(ConfigError) as refusal:
        RedisSlotStore(f"redis://{netloc}/0")
    assert str(refusal.value) == f"url port must be a number from 1 to 65535, got {port!r}"


@pytest.mark.parametrize(
    "url",
    [
        "redis://app:s3cret#x@redis.internal:6379/0",
        "redis://app:s3cret?x@redis.internal:6379/0",
        "redis://app:s3/cret@redis.internal:6379/0",
        "redis://app:1234#x@redis.internal:6379/0",  # the cut part a valid host:port
        "redis://:s3cret#x@redis.internal/0",
        "redis+sentinel://app:s3cret#1@s1:26379/svc/0",
        "rediss+sentinel://app:s3/cret@s1:26379/svc/0",
        # an '@' in the password too: the cut falls after the host the url then names
        "redis://:s3@cret#word@redis.internal:6379/0",
        "redis://:s3@1234#x@redis.internal:6379",
        "redis://u@s3:cret#x@redis.internal:6379",
    ],
)
def test_a_url_cut_by_a_password_that_is_not_percent_encoded_says_so(url: str) -> None:
    """A password holding '#', '?' or '/' cuts the url there: the error says to
    percent-encode it, and quotes none of it. Before, its first part was read as the
    port and named ("got 's3cret'"), or as a host and port to connect to."""
    for build in (RedisSlotStore, parse_sentinel_url):
        if build is parse_sentinel_url and "sentinel" not in url:
            continue
        with pytest.raises(ConfigError, match="url has an '@' after its host") as refusal:
            build(url)
        assert "s3" not in str(refusal.value)
        assert "1234" not in str(refusal.value)


@pytest.mark.parametrize(
    "url",
    [
        "rediss://host:6379/0?ssl_ca_certs=/etc/certs/a@b.pem",  # an option's value
        "redis://:s3@cret@host:6379/0",  # an '@' alone: the host is after the last one
    ],
)
def test_an_at_sign_where_no_password_is_cut_is_accepted(url: str) -> None:
    """An '@' in an option's value, or in a password that has no '#', '?' or '/', is
    no sign of a cut url."""
    assert "host:6379/0" in RedisSlotStore(url).safe_url


# -- Sentinel URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://s1:26380,s2,[::1]:26381/mymaster",
            SentinelTarget(
                sentinels=(("s1", 26380), ("s2", 26379), ("::1", 26381)),
                service="mymaster",
                db=0,
                username=None,
                password=None,
                sentinel_password=None,
                tls=None,
            ),
        ),
        (
            "redis+sentinel://app:p%40ss@s1:1/my%20master/3?sentinel_password=sp",
            SentinelTarget(
                sentinels=(("s1", 1),),
                service="my master",
                db=3,
                username="app",
                password="p@ss",
                sentinel_password="sp",
                tls=None,
            ),
        ),
        (
            "rediss+sentinel://:pw@s1:1/svc/?db=2&ssl_cert_reqs=none&username=u",
            SentinelTarget(
                sentinels=(("s1", 1),),
                service="svc",
                db=2,
                username="u",
                password="pw",
                sentinel_password=None,
                tls=TLSSettings(verify=False, check_hostname=False),
            ),
        ),
    ],
)
def test_sentinel_url_names_sentinels_service_and_credentials(
    url: str, target: SentinelTarget
) -> None:
    """A Sentinel URL lists the sentinels (port 26379 when omitted), the service and
    the database (path, else ``db``, else 0), the data nodes' credentials, and the
    sentinels' own password; a plain URL has no sentinel target."""
    assert RedisSlotStore(url).sentinel == target
    assert RedisSlotStore("redis://h:6379/0").sentinel is None


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://s1:26379", "url must name the monitored service, as in "),
        ("redis+sentinel://s1:26379/", "url must name the monitored service, as in "),
        ("redis+sentinel:///svc", "url must name at least one sentinel, as in "),
        ("redis+sentinel://u:p@/svc", "url must name at least one sentinel, as in "),
        ("redis+sentinel://s1,,s2/svc", "url must name every sentinel as host:port, as in "),
        ("redis+sentinel://:1/svc", "url must name every sentinel as host:port, as in "),
        (
            "redis+sentinel://s1:x/svc",
            "url sentinel port must be a number from 1 to 65535, got 'x'",
        ),
        (
            "redis+sentinel://s1:0/svc",
            "url sentinel port must be a number from 1 to 65535, got '0'",
        ),
        ("redis+sentinel://s1:/svc", "url sentinel port must be a number from 1 to 65535, got ''"),
        (
            "redis+sentinel://s1,s2:65536/svc",
            "url sentinel port must be a number from 1 to 65535, got '65536'",
        ),
        (
            "redis+sentinel://[::1/svc",
            r"url must be a valid redis://, rediss:// or redis\+sentinel",
        ),
        ("redis+sentinel://[::1]x/svc", r"url sentinel host must be host:port or \[ipv6\]:port"),
        ("redis+sentinel://s1/svc/zero", "url path must be /service or /service/db"),
        ("redis+sentinel://s1/svc/0/1", "url path must be /service or /service/db"),
        ("redis+sentinel://secret@s1/svc", r"url user part must be \[user\]:password@"),
        (
            "redis+sentinel://s1/svc?retries=3",
            r"url option 'retries' is not supported \(supported: db, password, sentinel_password,",
        ),
        (
            "redis+sentinel://s1/svc?ssl_cert_reqs=none",
            r"url option 'ssl_cert_reqs' needs a rediss\+sentinel:// \(TLS\) url",
        ),
        (
            "redis://h:6379/0?sentinel_password=x",
            r"url option 'sentinel_password' needs a redis\+sentinel:// \(Sentinel\) url",
        ),
        (
            "sentinel://s1/svc",
            "url scheme must be 'redis', 'rediss', 'redis\\+sentinel' or 'rediss\\+sentinel', "
            "got 'sentinel'",
        ),
    ],
)
def test_bad_sentinel_url_is_named(url: str, message: str) -> None:
    """A Sentinel URL without a service, with a bad port, an empty host list, a bad path
    or an unknown option is a ConfigError naming the part that is wrong."""
    with pytest.raises(ConfigError, match=message):
        RedisSlotStore(url)


@st.composite
def sentinel_urls_with_secrets(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """A valid Sentinel URL, the URL as it must show, and its secrets (as written and
    decoded): the data nodes' password in the user part and the sentinels' own."""
    scheme = draw(st.sampled_from(["redis+sentinel", "rediss+sentinel"]))
    hosts = ",".join(draw(st.lists(st.sampled_from(["s1:26379", "s2", "[::1]:1"]), min_size=1)))
    found: list[str] = []
    url = shown = f"{scheme}://"
    if draw(st.booleans()):
        user = draw(st.sampled_from(["", "app"]))
        secret = draw(secrets)
        found += [escaped(secret), secret]
        url, shown = f"{url}{user}:{escaped(secret)}@", f"{shown}{user}:***@"
    tail = f"{hosts}/svc/0"
    url, shown = url + tail, shown + tail
    if draw(st.booleans()):
        secret = draw(secrets)
        found += [escaped(secret), secret]
        url, shown = f"{url}?sentinel_password={escaped(secret)}", f"{shown}?sentinel_password=***"
    return url, shown, found


@given(sentinel_urls_with_secrets())
@settings(max_examples=100)
def test_sentinel_url_never_shows_a_password(case: tuple[str, str, list[str]]) -> None:
    """repr, str and safe_url mask the data nodes' password and the sentinels' own; the
    keeper's log scrubber knows both."""
    url, shown, found = case
    store = RedisSlotStore(url, namespace="ns")
    assert store.safe_url == shown
    texts = [repr(store), str(store), store.safe_url, repr(store.sentinel)]
    # What the store shows anyway (its class name, the fields): a secret found in the
    # texts of the store as shown (every secret masked) cannot be told from a leak.
    masked = RedisSlotStore(shown, namespace="ns")
    anyway = [repr(masked), str(masked), masked.safe_url, repr(masked.sentinel)]
    for secret in found:
        assume(secret not in shown and not [text for text in anyway if secret in text])
        assert not [text for text in texts if secret in text]
        if secret in url:
            assert secret in secrets_of(url) or unquote(secret) in secrets_of(url)


# -- longer runs (-m slow) ----------------------------------------------------------------------


@pytest.mark.slow
@given(lease_histories())
@settings(max_examples=10_000)
def test_lease_rule_long(history: tuple[float, float, list[tuple[float, str, float]]]) -> None:
    """test_lease_is_lost_by_the_last_confirmed_send, many more histories."""
    test_lease_is_lost_by_the_last_confirmed_send.hypothesis.inner_test(history)


@pytest.mark.slow
@given(fields=outcome_fields, value=json_values | untransferable)
@settings(max_examples=5_000)
def test_outcome_codec_long(fields: dict[str, Any], value: object) -> None:
    """The round trip and the untransferable rule, many more values."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        test_value_json_refuses_is_not_transferred.hypothesis.inner_test(fields, value)
    else:
        test_outcome_round_trip_keeps_everything_but_the_error.hypothesis.inner_test(fields, value)


@pytest.mark.slow
@given(urls_with_secrets())
@settings(max_examples=10_000)
def test_store_never_shows_the_password_long(case: tuple[str, str, list[str]]) -> None:
    """test_store_never_shows_the_password, many more URLs."""
    test_store_never_shows_the_password.hypothesis.inner_test(case)


# -- the renew arguments and reply --------------------------------------------------------------


def test_renew_args_are_one_json_argument() -> None:
    args = scripts.renew_args("i", [("s\n1", "i/1")], [], [("s2", "j/2"), ("s3", "j/3")])
    assert args[0] == "i"
    assert json.loads(args[1]) == [["s\n1", "i/1"], [], ["s2", "j/2", "s3", "j/3"]]


def test_renew_reply_parses_every_item_kind() -> None:
    """Leases and entries come sparse: their count, and the items that are not the
    common one ('' for a lease, ``['queued', 0]`` for an entry) by place, from 1."""
    raw = json.dumps(
        [
            [4, [[2, "k:1:0000000b"], [3, None], [4, ""]]],
            [5, [[1, ["owner", "17"]], [2, ["gone", "superseded"]], [4, ["resubmitted", 1]]]],
            [
                ["out", "{}"],
                ["gone", "queue_timeout"],
                ["live"],
                ["lost"],
                ["foreign", "jn:i/1: WRONGTYPE x"],
                ["foreign_lease", "lease:s: WRONGTYPE x"],
            ],
        ]
    )
    parsed = scripts.parse_renew(raw)
    assert parsed.leases == ("", "k:1:0000000b", None, "")
    assert parsed.entries == (
        Reply("owner", token=17),
        Reply("gone", detail="superseded"),
        Reply("queued"),
        Reply("resubmitted", claimable=True),
        Reply("queued"),
    )
    assert scripts.renew_items(raw)[:2] == [
        ["", "k:1:0000000b", None, ""],
        [["owner", "17"], ["gone", "superseded"], ["queued", 0], ["resubmitted", 1], ["queued", 0]],
    ]
    assert parsed.follows == (
        Reply("out", detail="{}"),
        Reply("gone", detail="queue_timeout"),
        Reply("live"),
        Reply("lost"),
        Reply("foreign", detail="jn:i/1: WRONGTYPE x"),
        Reply("foreign_lease", detail="lease:s: WRONGTYPE x"),
    )
    # the script's empty tables are JSON objects
    queued = (Reply("queued"),) * 2
    assert scripts.parse_renew("[[0,{}],[2,{}],{}]") == scripts.RenewReply((), queued, ())
    # the keys of foreign data no item owns, read as none: a fourth part when any
    raw = '[[0,{}],[0,{}],{},["hb:x: WRONGTYPE x","watch:s: WRONGTYPE x"]]'
    assert scripts.parse_renew(raw).unowned == ("hb:x: WRONGTYPE x", "watch:s: WRONGTYPE x")
    assert scripts.renew_items(raw) == [[], [], []]


@given(
    st.floats(min_value=-1e15, max_value=1e15),
    st.floats(min_value=0, max_value=1e13),
    st.integers(min_value=1, max_value=1000),
    st.floats(min_value=1e-3, max_value=1e9),
)
def test_a_tat_is_capped_at_a_full_burst_ahead(
    tat: float, now: float, burst: int, interval: float
) -> None:
    """A rate pool's ``tat`` more than a full burst ahead of the clock (a clock that
    stepped back) reads as a burst just spent; any other stays as it is."""
    capped = scripts.capped_tat(tat, now, burst, interval)
    assert capped <= tat  # never later than the pool's own
    assert capped - (burst - 1) * interval <= now + interval + 1  # one interval at most
    if tat <= now + burst * interval:  # a tat that GCRA itself can have
        assert capped == tat


def test_a_rate_pools_gcra_state_is_read_from_its_fields_or_an_earlier_versions_tat() -> None:
    """``start`` and ``n`` count while the ``tat`` beside them is the one they make; a
    ``tat`` alone, or one an earlier version moved on (it writes ``tat`` only), is
    ``(tat, 0)``; no ``tat``, a pool never used. The ``slots`` reading follows."""
    now = 1_800_000_000_000.0
    assert scripts.gcra_state(None, repr(now), "2", 0.5) == (-math.inf, 0.0)
    assert scripts.gcra_state(now + 1.0, repr(now), "2", 0.5) == (now, 2.0)
    assert scripts.gcra_state(now + 1.5, repr(now), "2", 0.5) == (now + 1.5, 0.0)
    assert scripts.gcra_state(now + 1.5, None, None, 0.5) == (now + 1.5, 0.0)
    assert scripts.gcra_state(now + 1.5, "x", "2", 0.5) == (now + 1.5, 0.0)
    spec = "rate 2000 per 1.0 burst 2"  # an interval of 0.5 ms
    # two starts at now: the third waits one interval; an earlier version's tat alone
    # (now + 1.0, the same) reads the same
    assert scripts.next_start_ms(spec, repr(now + 1.0), now, repr(now), "2") == 0.5
    assert scripts.next_start_ms(spec, repr(now + 1.0), now) == 0.5
    assert scripts.next_start_ms(spec, repr(now + 1.0), now + 0.5, repr(now), "2") == 0.0
    assert scripts.next_start_ms(spec, None, now, repr(now), "2") == 0.0  # tat deleted


def test_names_not_utf8_in_query_replies_are_shown_escaped() -> None:
    """A holder (or a pool's holder instance) that is not UTF-8: escaped, not a repr."""
    assert scripts.parse_cluster_slot([b"h\xff", "5", 1000, 0]).holder == "h\\xff"
    reply = scripts.parse_cluster_limit(["concurrency 2", [b"i\xfe", 1], 0, None])
    assert reply.holders == {"i\\xfe": 1}


def test_strings_not_utf8_in_submit_claim_and_limit_replies_are_shown_escaped() -> None:
    """A joined target, a ``gone`` reason, a pool's known settings: escaped, as the
    query replies' names are, not the ``repr`` of bytes (``"b'h\\xff/1'"``)."""
    joined = scripts.parse_submit(["joined", b"h\xff:1:x/1", b"h\xff:1:x", 1000])
    assert (joined.detail, joined.holder) == ("h\\xff:1:x/1", "h\\xff:1:x")
    assert scripts.parse_submit(["gone", b"why\xfe"]).detail == "why\\xfe"
    assert scripts.parse_claim(["gone", b"why\xfe"]).detail == "why\\xfe"
    conflict = scripts.parse_limit(["conflict", "p", b"concurrency \xff"])
    assert (conflict.pool, conflict.known) == ("p", "concurrency \\xff")
    foreign = scripts.parse_limit(["foreign", b"p\xff", "lh:p: WRONGTYPE x"])
    assert (foreign.pool, foreign.what) == ("p\\xff", "lh:p: WRONGTYPE x")


def test_renew_reply_with_bytes_not_utf8_keeps_them_as_surrogate_escapes() -> None:
    """A string another client wrote with bytes that are not UTF-8 (the client leaves
    such a reply as bytes): read, its bytes as surrogate escapes."""
    parsed = scripts.parse_renew(b'[[1,[[1,"\xff\xfe"]]],[0,[]],[["out","\xff"]]]')
    assert parsed.leases == ("\udcff\udcfe",)
    assert parsed.follows == (Reply("out", detail="\udcff"),)
    limits = scripts.parse_limit_renew(b'["g\xff", []]')
    assert limits.gen == "g\udcff"


def test_a_generation_not_utf8_reads_the_same_in_acquisition_and_renewal_replies() -> None:
    """An instance's generation that another client wrote with bytes that are not UTF-8:
    an acquisition's reply (granted, waiting) reads it as the renewal's JSON does, with
    surrogate escapes; before, as the ``repr`` of bytes, so the keeper took its units for
    ones of another generation (lost at the next renewal)."""
    renewed = scripts.parse_limit_renew(b'["1\xff", []]').gen
    assert scripts.parse_limit(["granted", b"1\xff"]).gen == renewed == "1\udcff"
    assert scripts.parse_limit(["waiting", b"1\xff", False, []]).gen == renewed


def test_limit_renew_reply_parses_foreign_data_and_the_shorter_shape() -> None:
    """A waiter refused for foreign data, and the holders keys of foreign data that lost
    units were named in (a fourth part, which a reply of three parts lacks)."""
    raw = '["g", [["foreign", "p", "lh:p: WRONGTYPE x"]], ["i/1"], ["lh:p: WRONGTYPE x"]]'
    parsed = scripts.parse_limit_renew(raw)
    assert parsed.waiters == (LimitReply("foreign", pool="p", what="lh:p: WRONGTYPE x"),)
    assert (parsed.lost, parsed.foreign) == (frozenset({"i/1"}), ("lh:p: WRONGTYPE x",))
    assert scripts.parse_limit_renew('["g", {}, {}, {}]').foreign == ()
    assert scripts.parse_limit_renew('["g", {}, {}]').foreign == ()


@pytest.mark.parametrize(
    "raw",
    [
        ["x"],  # not text
        "not json",
        "[[0, []], [0, []]]",
        '[{"a": 1}, [0, []], []]',
        "[[1, [[1, 1]]], [0, []], []]",
        '[[0, []], [1, [[1, ["queued", 2]]]], []]',
        '[[0, []], [1, [[1, ["owner", 17]]]], []]',
        '[[0, []], [1, [[1, [["queued"], 0]]]]], []]',
        '[[0, []], [1, [[1, ["waiting", 0]]]], []]',
        '[[0, []], [0, []], [["live", "x"]]]',
        '[[0, []], [0, []], [["out"]]]',
        '[[0, []], [0, []], ["lost"]]',
        # sparse parts: a count that is no count, a place outside it, a pair that is not
        '[["1", []], [0, []], []]',
        "[[-1, []], [0, []], []]",
        '[[1, [[0, ""]]], [0, []], []]',
        '[[1, [[2, ""]]], [0, []], []]',
        '[[1, [["1", ""]]], [0, []], []]',
        "[[1, [[1]]], [0, []], []]",
        "[[1], [0, []], []]",
        "[[], [0, []], []]",
        '[[1, [[1, "", "x"]]], [0, []], []]',
        '[[1, {"1": ""}], [0, []], []]',
    ],
)
def test_renew_reply_refuses_anything_else(raw: object) -> None:
    with pytest.raises(ValueError, match="unexpected"):
        scripts.parse_renew(raw)


@given(
    st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s),
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=1000),
)
def test_entry_ids_round_trip(instance: str, task_id: int, attempt: int) -> None:
    """An entry id parses back into the parts it was built from."""
    parsed = parse_entry_id(entry_id(instance, task_id, attempt))
    assert parsed == EntryId(instance, task_id, attempt)
    assert parsed.label == f"{instance}#{task_id}"
    assert instance_of(entry_id(instance, task_id, attempt)) == instance


@pytest.mark.parametrize(
    "text", ["", "host:1:ab", "a/", "a/x", "a/1.", "a/1.x", "a/-1", "a/\u00b2"]
)
def test_text_that_is_no_entry_id_parses_to_none(text: str) -> None:
    """Text that is not an entry id is refused, not guessed at."""
    assert parse_entry_id(text) is None
