"""``python -m trio_taskvisor slots URL`` against real servers (real clock).

The command runs as a child process, as an operator runs it: against two supervisors
holding and queueing work in one namespace (``--json``, checked field by field);
against a namespace the scripts filled with long-lived keys (a stop asked, an entry of a
dead instance), on a server of its own, where every key and value, and the server's
count of changes, are compared before and after it ran (it writes nothing), also as a
user that may only read; against a server that is down and with a wrong password (exit
status 2, one line on stderr naming the cause); and with ``--watch`` in tmux panes of
80x24 and 120x40 (with ``rich``) and 80x24 (without it), ended by Ctrl+C.

tmux is part of the project's machines (``/usr/bin/tmux``); without it the watch tests
fail and say so, rather than passing without having looked.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import coredis
import pytest
import trio
from cluster_helpers import Scripts, entry, gated, replica, tcp_server
from redis_server import RedisServer, free_port, running_server
from tmux import EXIT, tmux_server

from trio_taskvisor import (
    ConcurrencyLimit,
    ControllerSpec,
    EventKind,
    RateLimit,
    SlotStoreUnavailableError,
)
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._redis_client import read_namespace
from trio_taskvisor.redis import RedisSlotStore

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
RUN = 30.0  # seconds: the bound of one run of the command (it takes well under 2 s)
A, B, C = "host-a:11:aaaaaaaa", "host-b:22:bbbbbbbb", "host-c:33:cccccccc"
USER, PASSWORD = "tv-reader", "reader-pw"


async def slots_command(*args: str) -> tuple[int, str, str]:
    """Run ``python -m trio_taskvisor slots ARGS``: its status, stdout and stderr."""
    with trio.fail_after(RUN):
        result = await trio.run_process(
            [sys.executable, "-m", "trio_taskvisor", "slots", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=ENV,
            cwd=ROOT,
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def instances_by_id(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["instance"]: row for row in document["instances"]}


def without_times(out: str) -> dict[str, Any]:
    """The JSON document without the times left (they change from one read to the next)."""
    document = json.loads(out)
    for row in document["slots"]:
        del row["lease_remaining"]
    for row in document["instances"]:
        del row["heartbeat_remaining"]
    for row in document["pools"]:
        del row["next_start_in"]
    return document


# -- a live cluster ------------------------------------------------------------------------------


async def test_json_shows_two_supervisors_holding_and_queueing(store: RedisSlotStore) -> None:
    """A holds s:1 (B, then A, queued behind it), B holds s:2: every slot, entry,
    instance and count as the supervisors and ``cluster_slot`` know them. B runs with
    twice A's ``lease_ttl`` (a rolling change of it): each instance shows its own."""
    gate = trio.Event()
    slow = attrs.evolve(store, lease_ttl=2 * store.lease_ttl)
    async with replica(store) as (a, rec_a), replica(slow) as (b, rec_b):
        a_owner = await a.submit(ControllerSpec.queue(gated(gate), slot="s:1"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=a_owner.id)
        b_owner = await b.submit(ControllerSpec.queue(gated(gate), slot="s:2"))
        await rec_b.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=b_owner.id)
        b_queued = await b.submit(ControllerSpec.queue(gated(gate), slot="s:1"))
        await rec_b.wait_for(
            EventKind.CONTROLLER_SUBMITTED, task_id=b_queued.id, reason="queued in the cluster"
        )
        a_queued = await a.submit(ControllerSpec.queue(gated(gate), slot="s:1"))
        await rec_a.wait_for(
            EventKind.CONTROLLER_SUBMITTED, task_id=a_queued.id, reason="queued in the cluster"
        )
        s1, s2 = await a.cluster_slot("s:1"), await a.cluster_slot("s:2")
        status, out, err = await slots_command(store.url, "--namespace", store.namespace, "--json")
        gate.set()
    assert (status, err) == (0, ""), err
    assert s1 is not None
    assert s2 is not None
    document = json.loads(out)
    assert list(document) == ["slots", "instances", "pools"]
    ia, ib = a.instance_id, b.instance_id
    first, second = document["slots"]
    assert first.pop("lease_remaining") <= store.lease_ttl
    assert first == {
        "slot": "s:1",
        "holder": ia,
        "entry": entry(ia, int(a_owner.id)),
        "fence_token": s1.fence_token,
        "stop_requested_by": None,
        "queue": [
            {"entry": entry(ib, int(b_queued.id)), "instance": ib, "live": True},
            {"entry": entry(ia, int(a_queued.id)), "instance": ia, "live": True},
        ],
    }
    assert 0 < second.pop("lease_remaining") <= slow.lease_ttl
    assert second == {
        "slot": "s:2",
        "holder": ib,
        "entry": entry(ib, int(b_owner.id)),
        "fence_token": s2.fence_token,
        "stop_requested_by": None,
        "queue": [],
    }
    instances = instances_by_id(document)
    assert sorted(instances) == sorted([ia, ib])
    for instance, owned, queued, lease_ttl in (
        (ia, ["s:1"], 1, store.lease_ttl),
        (ib, ["s:2"], 1, slow.lease_ttl),
    ):
        row = instances[instance]
        assert 0 < row.pop("heartbeat_remaining") <= lease_ttl
        assert row == {
            "instance": instance,
            "slots_owned": owned,
            "queued": queued,
            "units_held": 0,
            "lease_ttl": lease_ttl,
        }
    assert document["pools"] == []


# -- it writes nothing -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quiet_server() -> Iterator[RedisServer]:
    """A server of this module's own: nothing else writes to it (its change count is ours)."""
    with running_server() as server:
        yield server


async def fill(client: coredis.Redis[str], store: RedisSlotStore) -> None:
    """Through the scripts: A holds s:1, with B and then C (dead) queued; B holds s:2,
    which A asked to stop (a REPLACE: A heads its queue). B's heartbeat is of an earlier
    version (``1``: it does not say its lease_ttl). Everything lives a minute."""
    scripts = Scripts(client, store)
    await scripts.heartbeat(A, B, C)
    await scripts.submit("s:1", entry(A, 1))
    await scripts.submit("s:1", entry(B, 2))
    await scripts.submit("s:1", entry(C, 3))
    await scripts.submit("s:2", entry(B, 4))
    await scripts.submit("s:2", entry(A, 5), "replace")
    await scripts.kill(C)
    await client.set(f"{store.key_prefix}hb:{B}", "1", px=60_000)


async def dump(client: coredis.Redis[str]) -> dict[str, tuple[str, object, bool]]:
    """Every key of the server: its type, value, and whether it expires."""
    keys: list[str] = []
    cursor = 0
    while True:
        cursor, batch = await client.scan(cursor, count=1000)
        keys.extend(batch)
        if cursor == 0:
            break
    found: dict[str, tuple[str, object, bool]] = {}
    for key in sorted(keys):
        kind = await client.type(key)
        value: object
        if kind == "string":
            value = await client.get(key)
        elif kind == "hash":
            value = dict(await client.hgetall(key))
        elif kind == "list":
            value = list(await client.lrange(key, 0, -1))
        elif kind == "set":
            value = sorted(await client.smembers(key))
        else:
            value = kind
        found[key] = (kind, value, await client.pttl(key) >= 0)
    return found


async def changes(client: coredis.Redis[str]) -> int:
    """The server's count of changes to its data since its start (no save is made)."""
    return int((await client.info("persistence"))["rdb_changes_since_last_save"])


async def test_it_writes_nothing(quiet_server: RedisServer, namespace: str) -> None:
    """Every key, type, value and expiry of the server, and its count of changes, are
    the same after the command ran; it read the stop marker and the dead entry."""
    store = RedisSlotStore(quiet_server.url, namespace=namespace, lease_ttl=60.0)
    async with coredis.Redis.from_url(quiet_server.url, decode_responses=True) as client:
        await fill(client, store)
        before, changed = await dump(client), await changes(client)
        status, out, err = await slots_command(quiet_server.url, "--namespace", namespace)
        status_json, out_json, _ = await slots_command(
            quiet_server.url, "--namespace", namespace, "--json"
        )
        assert await dump(client) == before
        assert await changes(client) == changed
    assert (status, status_json, err) == (0, 0, "")
    assert "slots: 2, 2 held, 3 queued" in out
    assert re.search(r"^s:2 +2/4 +\d{16} +\d+\.\d s!", out, re.MULTILINE), out
    slots = {row["slot"]: row for row in json.loads(out_json)["slots"]}
    assert slots["s:2"]["stop_requested_by"] == A
    assert [q["entry"] for q in slots["s:2"]["queue"]] == [entry(A, 5)]
    assert [(q["instance"], q["live"]) for q in slots["s:1"]["queue"]] == [(B, True), (C, False)]
    instances = instances_by_id(json.loads(out_json))
    assert sorted(instances) == [A, B]
    assert (instances[A]["lease_ttl"], instances[B]["lease_ttl"]) == (60.0, None)


def documented_acl() -> list[str]:
    """The rules of the ACL user that the how-to recommends for the command."""
    text = (ROOT / "docs" / "howto-replicas.md").read_text()
    (line,) = re.findall(r"^ACL SETUSER ops (.*)$", text, re.MULTILINE)
    return line.split()


async def test_a_user_who_may_only_read_can_run_it(
    quiet_server: RedisServer, namespace: str
) -> None:
    """An ACL user with the rules the how-to recommends (read commands, ``MULTI``/
    ``EXEC``, ``TIME``): the same document, of a namespace with limit pools. Before, the
    rules lacked ``TIME``, which the read of limit pools sends: "refused the read
    commands to this user"."""
    store = RedisSlotStore(quiet_server.url, namespace=namespace, lease_ttl=60.0)
    async with coredis.Redis.from_url(quiet_server.url, decode_responses=True) as client:
        await fill(client, store)
        rate = scripts.spec_text("rate", 0, 1, 60.0, 1)
        pools = [("exports acme", "concurrency 2"), ("partner", rate)]
        acquire = scripts.limit_acquire_args(A, entry(A, 9), pools)
        await Scripts(client, store).call(scripts.LIMIT_ACQUIRE, *acquire)
        rules = documented_acl()
        assert rules[:2] == ["on", ">secret"]
        await client.acl_setuser(USER, "on", f">{PASSWORD}", *rules[2:])
        reader = f"redis://{USER}:{PASSWORD}@127.0.0.1:{quiet_server.port}/0"
        as_reader = await slots_command(reader, "--namespace", namespace, "--json")
        as_default = await slots_command(quiet_server.url, "--namespace", namespace, "--json")
    assert as_reader[0] == 0, as_reader[2]
    assert without_times(as_reader[1]) == without_times(as_default[1])
    pools_read = json.loads(as_reader[1])["pools"]
    assert [(p["name"], p["key"], p["held"]) for p in pools_read] == [
        ("exports", "acme", 1),
        ("partner", None, 0),
    ]


async def test_a_user_who_may_not_run_a_read_command_is_told_so(
    quiet_server: RedisServer, namespace: str
) -> None:
    """A user without ``PTTL``: status 2, the ACL refusal named (not the transaction's
    ``EXECABORT`` that it causes)."""
    store = RedisSlotStore(quiet_server.url, namespace=namespace, lease_ttl=60.0)
    async with coredis.Redis.from_url(quiet_server.url, decode_responses=True) as client:
        await fill(client, store)
        rules = ("on", f">{PASSWORD}", "~*", "&*", "-@all", "+@read", "+@connection")
        await client.acl_setuser(USER, *rules, "+multi", "+exec", "-pttl")
        reader = f"redis://{USER}:{PASSWORD}@127.0.0.1:{quiet_server.port}/0"
        status, out, err = await slots_command(reader, "--namespace", namespace)
    assert (status, out) == (2, "")
    assert err.endswith(
        "refused the read commands to this user (an ACL permission is missing): "
        f"AuthorizationError: User {USER} has no permissions to run the 'pttl' command\n"
    ), err
    assert PASSWORD not in err


async def test_a_namespace_with_pattern_characters_reads_only_its_own_keys(
    redis_server: RedisServer, client: coredis.Redis[str], namespace: str
) -> None:
    """``*``, ``?``, ``[`` are valid in a namespace: keys of a namespace they would
    match as a pattern ("aXb" for "a*b") are not read."""
    ours, other = f"{namespace}-a*?[b]", f"{namespace}-aXY[b]"
    for name, instance in ((ours, A), (other, B)):
        scripts = Scripts(client, RedisSlotStore(redis_server.url, namespace=name, lease_ttl=60.0))
        await scripts.heartbeat(instance)
        await scripts.submit(f"s-{instance}", entry(instance, 1))
    status, out, err = await slots_command(redis_server.url, "--namespace", ours, "--json")
    assert (status, err) == (0, ""), err
    document = json.loads(out)
    assert [row["slot"] for row in document["slots"]] == [f"s-{A}"]
    assert list(instances_by_id(document)) == [A]


async def test_keys_that_are_not_utf8_or_of_another_kind_are_shown_or_skipped(
    redis_server: RedisServer, client: coredis.Redis[str], namespace: str
) -> None:
    """Keys that something else wrote into the namespace: names that are not UTF-8 are
    shown with their bytes escaped (``\\xff``), keys of another kind are skipped and
    named, and the rest is shown. Before, either made the whole read fail ("could not be
    reached: TypeError", "refused the read commands: WrongTypeError")."""
    scripts = Scripts(client, RedisSlotStore(redis_server.url, namespace=namespace, lease_ttl=60.0))
    await scripts.heartbeat(A)
    await scripts.submit("ours", entry(A, 1))
    prefix = f"tv:{{{namespace}}}:".encode()
    await client.hset(prefix + b"lease:bin\xff", {"entry": f"{A}/2".encode(), "token": "7"})
    await client.pexpire(prefix + b"lease:bin\xff", 60_000)
    await client.rpush(prefix + b"q:bin\xff", [b"host\xfe:1:x/3"])
    await client.set(prefix + b"lease:a-string", "not a hash")
    await client.hset(prefix + b"q:a-hash", {"not": "a list"})
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace)
    assert (status, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[1] == (
        f"skipped 2 keys of another kind: tv:{{{namespace}}}:lease:a-string, "
        f"tv:{{{namespace}}}:q:a-hash"
    )
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("bin", "ours"))}
    assert rows["bin\\xff"][1:3] == ["1/2", "7"]
    assert rows["bin\\xff"][-1] == "2/3†"  # host\xfe:1:x, whose heartbeat is not there
    assert rows["ours"][1] == "1/1"
    assert "host\\xfe:1:x" in out
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace, "--json")
    assert (status, err) == (0, ""), err
    slots = {row["slot"]: row for row in json.loads(out)["slots"]}
    assert slots["bin\udcff"]["fence_token"] == 7  # the bytes as surrogate escapes
    assert slots.keys() == {"bin\udcff", "ours"}


async def test_a_heartbeat_of_another_kind_is_no_live_instance(
    redis_server: RedisServer, client: coredis.Redis[str], namespace: str
) -> None:
    """A heartbeat key that is a hash (written by something else): skipped and named,
    and its instance reads as one without a heartbeat (its queued entry is not live).
    Before, it was both skipped and shown as a live instance (its ``PTTL`` says the key
    exists)."""
    prefix = f"tv:{{{namespace}}}:"
    await client.hset(f"{prefix}hb:{B}", {"not": "a heartbeat"})
    await client.rpush(f"{prefix}q:s", [entry(B, 1)])
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace, "--json")
    assert (status, err) == (0, ""), err
    document = json.loads(out)
    assert document["instances"] == []
    assert document["slots"][0]["queue"] == [{"entry": entry(B, 1), "instance": B, "live": False}]
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace)
    assert out.splitlines()[1] == f"skipped 1 key of another kind: {prefix}hb:{B}"
    assert "instances: 0 live, 1 gone (named by slots)" in out


MALFORMED_POOLS = {
    "no-rate": ("rate garbage", None),
    "rate-0": ("rate 0 per 60 burst 3", None),
    "per-x": ("rate 10 per x burst 3", None),
    "tat-xx": ("rate 10 per 60.0 burst 3", "xx"),
    "tat-inf": ("rate 10 per 60.0 burst 3", "inf"),
    "no-kind": ("\x1b[2Jwhat", None),
}


async def test_malformed_limit_pools_are_skipped_and_named(
    redis_server: RedisServer, client: coredis.Redis[str], namespace: str
) -> None:
    """Limit pools written by hand with settings or a ``tat`` that this version does not
    write are skipped and named under the title; the rest shows (a slot named "10²" too).
    Before, any one of them failed the whole read as "could not be reached" (status 2;
    under ``--watch``, UNAVAILABLE for as long as the pool stayed)."""
    scripts = Scripts(client, RedisSlotStore(redis_server.url, namespace=namespace, lease_ttl=60.0))
    await scripts.heartbeat(A)
    await scripts.submit("area:10²", entry(A, 1))
    prefix = f"tv:{{{namespace}}}:"
    for name, (spec, tat) in MALFORMED_POOLS.items():
        await client.hset(
            f"{prefix}lp:{name}", {"spec": spec, **({} if tat is None else {"tat": tat})}
        )
    await client.hset(f"{prefix}lp:good", {"spec": "rate 10 per 60.0 burst 3", "tat": "1"})
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace)
    assert (status, err) == (0, ""), err
    lines = out.splitlines()
    named = ", ".join(f"{prefix}lp:{name}" for name in sorted(MALFORMED_POOLS))
    assert lines[1] == f"skipped {len(MALFORMED_POOLS)} malformed keys: {named}"
    assert re.search(r"^area:10² +1/1 +\d{16} ", out, re.MULTILINE), out
    assert re.search(r"^good +rate +0 +0 +0\.0 s$", out, re.MULTILINE), out
    assert "limit pools: 1" in out
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace, "--json")
    assert (status, err) == (0, ""), err
    assert [pool["name"] for pool in json.loads(out)["pools"]] == ["good"]


async def test_an_error_of_the_reading_is_not_an_unreachable_server(
    redis_server: RedisServer,
    client: coredis.Redis[str],
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error that is neither the client's nor the server's, raised while the replies
    are read (a fault of the reading, here put into it): "answered what the command
    could not read", the error named. Before, it read "could not be reached"."""

    def fault(*_: object) -> float:
        raise KeyError("a fault of the reading")

    monkeypatch.setattr(scripts, "next_start_ms", fault)
    await client.hset(f"tv:{{{namespace}}}:lp:pool", {"spec": "concurrency 1"})
    store = RedisSlotStore(redis_server.url, namespace=namespace)
    with pytest.raises(SlotStoreUnavailableError) as caught:
        await read_namespace(store)
    assert str(caught.value) == (
        f"slot store {redis_server.url} answered what the command could not read: "
        "KeyError: 'a fault of the reading'"
    )


async def test_numbers_written_by_hand_beyond_the_servers_are_none(
    redis_server: RedisServer, client: coredis.Redis[str], namespace: str
) -> None:
    """A fence token of 5,000 digits and heartbeats that hold 400 and 5,000 digits
    (written by hand): shown as ``-`` (``null``), the rest as it is. Before, the token
    and the 400 digits were a traceback (ValueError: ``int``'s limit; OverflowError),
    the 5,000 digits of a heartbeat "could not be reached"."""
    prefix = f"tv:{{{namespace}}}:"
    await client.set(f"{prefix}hb:{A}", "60000", px=60_000)
    await client.set(f"{prefix}hb:{B}", "9" * 400, px=60_000)
    await client.set(f"{prefix}hb:{C}", "9" * 5000, px=60_000)
    await client.hset(f"{prefix}lease:huge", {"entry": f"{A}/1", "token": "9" * 5000})
    await client.pexpire(f"{prefix}lease:huge", 60_000)
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace)
    assert (status, err) == (0, ""), err
    assert re.search(r"^huge +1/1 +- +\d+\.\d s +-$", out, re.MULTILINE), out
    for n, instance in enumerate((A, B, C), 1):
        ttl = "60 s" if instance == A else "-"
        assert re.search(rf"^{n} +{instance} +\d+\.\d s +{ttl} ", out, re.MULTILINE), out
    status, out, err = await slots_command(redis_server.url, "--namespace", namespace, "--json")
    assert (status, err) == (0, ""), err
    document = json.loads(out)
    assert document["slots"][0]["fence_token"] is None
    ttls = {row["instance"]: row["lease_ttl"] for row in document["instances"]}
    assert ttls == {A: 60.0, B: None, C: None}


# -- when the store cannot be read ----------------------------------------------------------------


async def test_a_server_that_is_down_exits_2() -> None:
    """Nothing listens on the port: one line on stderr, naming it, status 2."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    status, out, err = await slots_command(url)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(f"error: slot store {url} could not be reached: ConnectionError: ")


async def test_a_silent_server_exits_2_after_connect_timeout() -> None:
    """A server that accepts connections and never answers: "did not answer within
    5.0 s" (the store's default ``connect_timeout``), status 2."""
    async with tcp_server(None) as port:
        url = f"redis://127.0.0.1:{port}/0"
        status, out, err = await slots_command(url)
    assert (status, out) == (2, "")
    assert err == f"error: slot store {url} did not answer within 5.0 s\n"


async def test_a_server_of_another_protocol_exits_2() -> None:
    """A server of another protocol that answers without a CRLF and closes (Python's
    ``http.server`` answers a page so): named as ``open_supervisor`` names it, "did not
    answer in the Redis protocol", where it read "could not be reached"."""
    async with tcp_server(b"<!DOCTYPE HTML>\n<p>Error code: 400</p>") as port:
        url = f"redis://127.0.0.1:{port}/0"
        status, out, err = await slots_command(url)
    assert (status, out) == (2, "")
    assert err.startswith(
        f"error: slot store {url} did not answer in the Redis protocol (is it a Redis"
        " server?): InvalidResponse: the server closed the connection after b'<!DOCTYPE"
    ), err


async def test_a_servers_error_text_does_not_drive_the_terminal() -> None:
    """A server whose error reply holds a terminal's escapes and a bell: the line on
    stderr shows them escaped, as the watch shows the cause. Before, they reached the
    terminal as they were."""
    async with tcp_server(b"-ERR \x1b[31mred\x1b[0m and \x07bell\r\n") as port:
        url = f"redis://127.0.0.1:{port}/0"
        status, out, err = await slots_command(url)
    assert (status, out) == (2, "")
    assert err == (
        f"error: slot store {url} refused the connection: "
        "ResponseError: \\x1b[31mred\\x1b[0m and \\x07bell\n"
    ), err


async def test_tls_to_a_plain_server_is_named(redis_server: RedisServer) -> None:
    """``rediss://`` to a server without TLS: named as ``open_supervisor`` names it, "did
    not complete the TLS handshake in time (does the server speak TLS?)", status 2.
    Before, it read "could not be reached"."""
    url = f"rediss://127.0.0.1:{redis_server.port}/0"
    status, out, err = await slots_command(url)
    assert (status, out) == (2, "")
    assert err.startswith(
        f"error: slot store {url} did not complete the TLS handshake in time (does the"
        " server speak TLS?): ConnectionError: "
    ), err


async def test_a_slow_read_is_bounded_by_silence_not_by_its_length() -> None:
    """The read waits ``connect_timeout`` for each of the server's bytes, not for the
    whole read: a server that sends its reply to ``SCAN`` a byte at a time, 0.1 s apart
    (1.5 s in all), is read with ``connect_timeout=0.5`` (a large namespace takes as long
    as its replies take to read; the whole read used to be bounded, and a namespace of
    50,000 slots failed with "did not answer within 5.0 s")."""
    hello = b"%1\r\n+server\r\n+valkey\r\n"
    scan = b"*2\r\n$1\r\n0\r\n*0\r\n"  # cursor 0, no keys: an empty namespace

    async def trickle(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # HELLO
        await stream.send_all(hello)
        await stream.receive_some(65536)  # SCAN
        for byte in scan:
            await trio.sleep(0.1)
            await stream.send_all(bytes([byte]))
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), trickle, 0
        )
        port = listeners[0].socket.getsockname()[1]
        store = RedisSlotStore(f"redis://127.0.0.1:{port}/0", connect_timeout=0.5)
        started = time.monotonic()
        with trio.fail_after(10):
            namespace = await read_namespace(store)
        assert time.monotonic() - started >= 1.4
        nursery.cancel_scope.cancel(reason="the slow server is no longer needed")
    assert (namespace.leases, namespace.queues, namespace.heartbeats) == ({}, {}, {})


async def test_wrong_credentials_exit_2(
    redis_server: RedisServer, client: coredis.Redis[str]
) -> None:
    """A wrong password: "refused the credentials", the password never shown."""
    await client.acl_setuser(USER, "on", f">{PASSWORD}", "~*", "&*", "+@all")
    url = f"redis://{USER}:not-{PASSWORD}@127.0.0.1:{redis_server.port}/0"
    status, out, err = await slots_command(url)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    masked = f"redis://{USER}:***@127.0.0.1:{redis_server.port}/0"
    assert err.startswith(f"error: slot store {masked} refused the credentials: ")
    assert PASSWORD not in err


async def test_a_missing_password_is_named_exit_2() -> None:
    """A server that asks for a password the URL lacks: one line that says so."""
    with running_server("tv-pw-") as server:
        async with coredis.Redis.from_url(server.url) as admin:
            await admin.config_set({"requirepass": PASSWORD})
        status, out, err = await slots_command(server.url)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(
        f"error: slot store {server.url} asks for a password, and the URL gives none"
        " (:PASSWORD@ before the host): AuthenticationRequiredError: "
    )


async def test_watch_shows_an_outage_and_goes_on(
    redis_server: RedisServer, store: RedisSlotStore
) -> None:
    """Watching (stdout a pipe: frame after frame), a server that stops is named under
    the title (the last view stays), and the frames go on without it once the server is
    back; SIGINT ends the watch with status 0."""
    args = ["-m", "trio_taskvisor", "slots", store.url, "--namespace", store.namespace]
    with trio.fail_after(RUN):
        process = await trio.lowlevel.open_process(
            [sys.executable, *args, "--watch"], stdout=subprocess.PIPE, env=ENV, cwd=ROOT
        )
        stdout = process.stdout
        assert stdout is not None
        seen = ""

        async def wait_for(pattern: str) -> None:
            """Read until ``pattern`` shows; forget what was read up to its end."""
            nonlocal seen
            while (found := re.search(pattern, seen, re.MULTILINE)) is None:
                chunk = await stdout.receive_some()
                assert chunk, f"the watch ended early:\n{seen}"
                seen += chunk.decode()
            seen = seen[found.end() :]

        try:
            await wait_for(r"Ctrl\+C: quit\nslots: 0, 0 held, 0 queued")
            redis_server.stop()
            await wait_for(
                r"^UNAVAILABLE since \d\d:\d\d:\d\d: could not be reached: ConnectionError: "
            )
            redis_server.start()
            await wait_for(r"Ctrl\+C: quit\nslots: 0")
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0
        finally:
            process.kill()
            await process.wait()
            await stdout.aclose()


# -- --watch in terminals -------------------------------------------------------------------------

WATCH_TIMEOUT = 30.0


@attrs.define
class Pane:
    """One tmux pane running ``slots --watch``: a screen it drew, and how it ended."""

    name: str
    width: int
    height: int
    rich: bool = True
    drawn: str = ""  # a screen that showed both slots and both live instances
    final: str = ""  # the screen once the command had exited
    status: int | None = None


def _lines(screen: str) -> list[str]:
    return screen.rstrip("\n").split("\n")


@pytest.fixture(scope="module")
def panes(redis_server_session: RedisServer) -> Iterator[dict[str, Pane]]:
    """Fill a namespace, watch it in three panes until both slots and both live
    instances show, then Ctrl+C each and wait for its exit status."""
    url, namespace = redis_server_session.url, f"watch-{uuid.uuid4().hex[:8]}"

    async def setup() -> None:
        store = RedisSlotStore(url, namespace=namespace, lease_ttl=60.0)
        async with coredis.Redis.from_url(url, decode_responses=True) as client:
            await fill(client, store)

    trio.run(setup)
    wanted = [Pane("narrow", 80, 24), Pane("mid", 120, 40), Pane("plain", 80, 24, rich=False)]
    watch = [sys.executable, "-m", "trio_taskvisor", "slots", url, "--namespace", namespace]
    with tmux_server("the slots command's watch in tmux panes") as tmux:
        for pane in wanted:
            args = [*watch, "--watch"]
            if not pane.rich:
                code = (
                    "import sys; sys.modules['rich'] = None; "
                    "from trio_taskvisor.__main__ import main; sys.exit(main(sys.argv[1:]))"
                )
                args = [sys.executable, "-c", code, *args[3:]]
            tmux.start(pane.name, pane.width, pane.height, args, env=ENV, cwd=ROOT)
        deadline = time.monotonic() + WATCH_TIMEOUT
        while any(p.status is None for p in wanted) and time.monotonic() < deadline:
            for pane in wanted:
                if pane.status is not None:
                    continue
                screen = tmux.screen(pane.name)
                exited = EXIT.search(screen)
                if exited is not None:
                    pane.final, pane.status = screen, int(exited.group(1))
                elif not pane.drawn and all(text in screen for text in ("s:1 ", "s:2 ", A, B)):
                    pane.drawn = screen
                    tmux.send(pane.name, "C-c")
            time.sleep(0.1)  # polling another process's terminal, not a settle wait
        for pane in wanted:
            if pane.status is None:  # what it showed instead, for the failure
                pane.final = tmux.screen(pane.name)
        yield {pane.name: pane for pane in wanted}


@pytest.mark.parametrize("name", ["narrow", "mid", "plain"])
def test_watch_shows_the_slots_within_the_terminal(panes: dict[str, Pane], name: str) -> None:
    """Title, every section, both slots and the instances, no line wider than the pane
    and no frame taller (one line spare)."""
    pane = panes[name]
    assert pane.drawn, f"{name}: never showed the slots\n{pane.final}"
    lines = _lines(pane.drawn)
    assert len(lines) < pane.height, f"{name}: {len(lines)} lines\n{pane.drawn}"
    for line in lines:
        assert len(line) <= pane.width, f"{name}: {len(line)} columns: {line!r}"
    assert lines[0].startswith("slots of 'watch-"), pane.drawn
    assert lines[0].endswith("Ctrl+C: quit"), pane.drawn
    assert lines[1].startswith("slots: 2, 2 held, 3 queued   ! = stop asked; † = instance gone")
    assert re.search(r"^s:1 +1/1 +\d{16} +\d+\.\d s +2: 2/2 3/3†$", pane.drawn, re.MULTILINE)
    assert re.search(r"^s:2 +2/4 +\d{16} +\d+\.\d s! +1: 1/5$", pane.drawn, re.MULTILINE)
    assert "instances: 2 live, 1 gone (named by slots)" in pane.drawn
    assert re.search(rf"^3 +{C} +gone$", pane.drawn, re.MULTILINE)
    assert "limit pools: 0" in pane.drawn


@pytest.mark.parametrize("name", ["narrow", "mid", "plain"])
def test_ctrl_c_ends_the_watch_with_0(panes: dict[str, Pane], name: str) -> None:
    """Ctrl+C: status 0, no traceback, no echoed ^C, the last frame left on screen."""
    pane = panes[name]
    assert pane.status == 0, f"{name}: exit status {pane.status}\n{pane.final}"
    assert "Traceback" not in pane.final, pane.final
    assert "^C" not in pane.final, pane.final
    assert "limit pools: 0" in pane.final


@attrs.define
class PtyRun:
    """What ``slots --watch`` wrote to a pseudo-terminal, how it ended, and the
    terminal's echo after it ended."""

    output: bytes
    status: int
    echo: bool


def watch_in_a_pty(url: str, namespace: str, term: str, end: Callable[[int], None]) -> PtyRun:
    """Run ``slots URL --watch`` on a pseudo-terminal of 80x24 (``TERM=term``) until its
    first frame shows, then ``end(pid)``; read until it exits."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    args = [sys.executable, "-m", "trio_taskvisor", "slots", url, "--namespace", namespace]
    env = {**ENV, "TERM": term, "LINES": "24", "COLUMNS": "80"}
    process = subprocess.Popen(
        [*args, "--watch"], stdin=terminal, stdout=terminal, stderr=terminal, env=env, cwd=ROOT
    )
    output, ended = b"", False
    deadline = time.monotonic() + WATCH_TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.1)
            if ready:
                try:
                    output += os.read(controller, 65536)
                except OSError:  # the terminal's other end closed (Linux: EIO)
                    break
            if not ended and b"limit pools: 0" in output:
                end(process.pid)
                ended = True
            if ended and process.poll() is not None and not ready:
                break
        status = process.wait(timeout=WATCH_TIMEOUT) if ended else -1  # -1: never shown
        echo = bool(termios.tcgetattr(terminal)[3] & termios.ECHO)
    finally:
        process.kill()
        process.wait()
        os.close(controller)
        os.close(terminal)
    assert ended, f"the watch never showed its frame:\n{output.decode(errors='replace')}"
    return PtyRun(output, status, echo)


def test_sigterm_ends_the_watch_as_ctrl_c_does(redis_server: RedisServer, namespace: str) -> None:
    """SIGTERM (``timeout``, a pane closed) ends ``--watch`` with status 0, the
    terminal's echo on again and its cursor shown, as Ctrl+C does. Before, the signal
    ended the process at once (status -15): the terminal was left without echo and
    without a cursor."""
    run = watch_in_a_pty(
        redis_server.url, namespace, "xterm", lambda pid: os.kill(pid, signal.SIGTERM)
    )
    assert (run.status, run.echo) == (0, True), run.output.decode(errors="replace")
    assert b"Traceback" not in run.output
    hidden = run.output.rindex(b"\x1b[?25l")  # rich hides the cursor while it draws
    assert b"\x1b[?25h" in run.output[hidden:]  # and shows it again


def test_a_watch_whose_reader_goes_away_ends_quietly(
    redis_server: RedisServer, namespace: str
) -> None:
    """``slots --watch | head -3``: once the reader has gone, the next frame's write
    ends the watch with status 0 and nothing on stderr, as a one-shot read does. Before,
    it ended with status 1 and a traceback (the write failed inside trio's nursery, an
    exception group the command did not look into)."""
    args = ["-m", "trio_taskvisor", "slots", redis_server.url, "--namespace", namespace]
    process = subprocess.Popen(
        [sys.executable, *args, "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=ROOT,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    assert process.stdout.readline().startswith(b"slots of ")  # the first frame
    process.stdout.close()  # the reader goes away
    with process.stderr:
        try:
            status = process.wait(timeout=10)  # the next frame, a second on (a wide margin)
        finally:
            process.kill()
        assert (status, process.stderr.read()) == (0, b"")


def test_a_dumb_terminal_gets_frame_after_frame_without_escapes(
    redis_server: RedisServer, namespace: str
) -> None:
    """``TERM=dumb`` (a terminal without cursor control): frames that show, fitted to
    the terminal, one after another, and not one escape. Before, rich's live view drew
    nothing there: a blank screen until Ctrl+C."""
    run = watch_in_a_pty(
        redis_server.url, namespace, "dumb", lambda pid: os.kill(pid, signal.SIGTERM)
    )
    text = run.output.decode()
    assert run.status == 0, text
    assert "\x1b" not in text
    frames = [frame for frame in text.split("\r\n\r\n") if "limit pools: 0" in frame]
    assert frames, text
    lines = frames[0].strip("\r\n").split("\r\n")
    assert lines[0].startswith(f"slots of '{namespace[:20]}")
    assert re.search(r"  read at \d\d:\d\d:\d\d  Ctrl\+C: quit$", lines[0]), lines[0]
    assert len(lines) < 24, lines
    assert all(len(line) <= 80 for line in lines), lines


async def test_json_shows_limit_pools_with_their_holders_and_waiters(
    store: RedisSlotStore,
) -> None:
    """A capacity-1 pool held by one supervisor with the other's block waiting, and a
    spent rate pool: ``pools`` shows each with its holders, waiters and next start, and
    the holder's ``units_held`` counts its unit."""
    exports = ConcurrencyLimit("exports", 1).key("acme")
    partner = RateLimit("partner", 1, per=60.0)
    async with replica(store) as (a, _), replica(store) as (b, _):
        async with a.limited(partner):
            pass
        held, done = trio.Event(), trio.Event()

        async def hold_in_a() -> None:
            async with a.limited(exports):
                held.set()
                await done.wait()

        async def wait_in_b() -> None:
            await held.wait()
            async with b.limited(exports):
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_in_a)
            nursery.start_soon(wait_in_b)
            await held.wait()
            with trio.fail_after(2 * store.lease_ttl):
                # the server's state: no event tells when b's request reached it
                while not (await a.cluster_limit(exports)).waiting:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            status, out, err = await slots_command(
                store.url, "--namespace", store.namespace, "--json"
            )
            done.set()
    assert (status, err) == (0, ""), err
    document = json.loads(out)
    first, second = document["pools"]
    assert first == {
        "name": "exports",
        "key": "acme",
        "kind": "concurrency",
        "held": 1,
        "holders": {a.instance_id: 1},
        "waiting": 1,
        "next_start_in": None,
    }
    assert (second["name"], second["kind"], second["held"], second["waiting"]) == (
        "partner",
        "rate",
        0,
        0,
    )
    assert 50.0 < second["next_start_in"] <= 60.0
    assert instances_by_id(document)[a.instance_id]["units_held"] == 1
