"""The slot store's error paths against real servers and real sockets (real clock).

A server that answers but refuses something (the scripts, the credentials, the database
number, TLS, the Redis protocol itself) is named in ``SlotStoreUnavailableError`` with
the client's error as ``__cause__``; "did not answer within N s" is only for a server
that stays silent. A refusal that starts while the supervisor runs is one outage with
capped backoff, never a loop without a pause; so is a server that takes no call for now
(``BUSY`` while another client's script runs, ``LOADING``, ``OOM``, ...). A lease lost
in the instant its owner's body returns still ends the owner ``LEASE_LOST``.

Timing bounds are liveness bounds with wide margins; every wait is bounded by
``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import coredis
import coredis.exceptions
import pytest
import trio
import trio.testing
from cluster_helpers import (
    Reports,
    child,
    config,
    gated,
    open_keeper,
    quick,
    read_line,
    refused_start,
    replica,
    start_later,
    tcp_proxy,
    tcp_server,
)
from redis_server import RedisServer, free_port, running_server

from trio_taskvisor import (
    AdmissionPolicy,
    ConcurrencyLimit,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeError,
    OutcomeKind,
    Placement,
    RateLimit,
    RejectionKind,
    SlotStoreUnavailableError,
    Supervisor,
    SupervisorConfig,
    TaskOutcome,
    TaskSpec,
    open_supervisor,
)
from trio_taskvisor._keeper import LeaseLost, Owner
from trio_taskvisor._redis_client import (
    NoPrimaryError,
    OpeningResetError,
    RedisClient,
    _head,
    _Wire,
    open_client,
    open_wire,
)
from trio_taskvisor.redis import RedisSlotStore
from trio_taskvisor.testing import EventRecorder

from helpers import invoke, nothing

TTL = 1.0
USER, PASSWORD = "tv-acl", "acl-pw"


def store_at(store: RedisSlotStore, url: str, connect_timeout: float = 1.0) -> RedisSlotStore:
    return RedisSlotStore(
        url, namespace=store.namespace, lease_ttl=TTL, connect_timeout=connect_timeout
    )


async def set_user(client: coredis.Redis[str], *rules: str) -> None:
    await client.acl_setuser(USER, "on", f">{PASSWORD}", "~*", "&*", *rules)


def outages(recorder: EventRecorder) -> tuple[int, int]:
    """How many ``CONTROLLER_STORE_UNAVAILABLE`` and ``CONTROLLER_STORE_RECOVERED``."""
    return (
        len(recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)),
        len(recorder.of(EventKind.CONTROLLER_STORE_RECOVERED)),
    )


def user_url(server: RedisServer, password: str = PASSWORD) -> str:
    return f"redis://{USER}:{password}@127.0.0.1:{server.port}/0"


async def sleep_forever() -> None:
    await trio.sleep_forever()


# -- refused scripts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "asked"),
    [("-@scripting", "the lease scripts"), ("-subscribe", "the subscription")],
)
async def test_open_supervisor_raises_when_the_scripts_or_the_subscription_are_refused(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    rule: str,
    asked: str,
) -> None:
    """A user the server lets PING but not run scripts (an ACL without ``+@scripting``),
    or not subscribe (``-subscribe``): ``open_supervisor`` raises at once, naming what
    was refused; the block never runs. No heartbeat of the process is left: its
    renewal, which came before the refused subscription, wrote one, and the ``slots``
    command counted the process live for ``lease_ttl``."""
    await set_user(client, "+@all", rule)
    started = time.monotonic()
    error = await refused_start(store_at(store, user_url(redis_server)))
    assert time.monotonic() - started < 1.0  # an answer, not a timeout
    assert f"refused {asked} to this user (an ACL permission is missing)" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.AuthorizationError)
    assert PASSWORD not in str(error)
    assert await client.keys(f"{store.key_prefix}hb:*") == set()


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(("+@all", "-exists"), id="a-command"),
        pytest.param(("+@all", "-hset"), id="a-command-the-renewal-does-not-call"),
        pytest.param(("+@all", "-publish"), id="publish"),
        pytest.param(("+@all", "resetchannels"), id="the-channels"),
        pytest.param(("+@all", "-time"), id="time"),
        pytest.param(("resetkeys", "~other:*", "+@all"), id="the-namespace-s-keys"),
    ],
)
async def test_open_supervisor_raises_when_a_command_of_the_scripts_is_refused(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    rules: tuple[str, ...],
) -> None:
    """A user who may run scripts but not a command they call, or whose key patterns
    leave out the namespace's keys: refused at start too, and named as a missing ACL
    permission (the server says "No permissions to access a key" for the second, which
    read as a bare refusal before). Every command the scripts call is tried at start:
    before, a user without one the start's renewal does not call (HSET, PUBLISH, TIME)
    got past ``open_supervisor``, and then every keyed call was rejected or held, and
    every ``limited()`` block waited, for ever."""
    await set_user(client, *rules)
    error = await refused_start(store_at(store, user_url(redis_server)))
    assert "refused the lease scripts to this user (an ACL permission is missing)" in str(error)
    assert "ACL failure in script" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ResponseError)


async def test_a_refusal_that_starts_later_is_one_outage_with_a_paused_retry(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ACL change takes the scripts away while the supervisor runs: one
    STORE_UNAVAILABLE, no STORE_RECOVERED while it lasts (an error reply to the renewal
    is no success), reconnection attempts paced by the capped backoff (lease_ttl / 3),
    the running owner ends LEASE_LOST, new wait=False work is rejected and wait=True
    work is held; once the permission is back, one STORE_RECOVERED and the held work runs.
    """
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    await set_user(client, "+@all")
    acl_store = store_at(store, user_url(redis_server))
    async with replica(acl_store) as (sup, recorder), trio.open_nursery() as nursery:
        with trio.fail_after(5):
            assert await sup.run_in_slot("s", trio.lowlevel.checkpoint) is None
        running: list[OutcomeError] = []
        owner_ended = trio.Event()

        async def run_owner() -> None:
            try:
                await sup.run_in_slot("o", sleep_forever)
            except OutcomeError as exc:
                running.append(exc)
            owner_ended.set()

        nursery.start_soon(run_owner)
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="o")
        caplog.clear()
        await client.acl_setuser(USER, "-@scripting")
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        window = 2.0  # real time: 6 retries at the cap of TTL / 3, fewer before it
        await trio.sleep(window)  # observing a rate over a real-clock window, not settling
        attempts = [r for r in caplog.records if "refused the lease scripts" in r.getMessage()]
        assert 3 <= len(attempts) <= 2 * (window / (TTL / 3)) + 4  # a spin made hundreds
        # the outage and the first failed reconnection (a spin logged ~400 lines a second)
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 3
        assert outages(recorder) == (1, 0)
        # the owner lost its lease (no renewal was accepted) and its caller got it
        with trio.fail_after(5):
            lost = await recorder.wait_for(EventKind.CONTROLLER_LEASE_LOST, slot="o")
        assert lost.reason is not None
        assert lost.reason.startswith("lease expired")
        with trio.fail_after(5):
            await owner_ended.wait()
        assert [exc.outcome.kind for exc in running] == [OutcomeKind.LEASE_LOST]
        # new work: rejected at once without a wait mode, held with one
        with trio.fail_after(2), pytest.raises(OutcomeError) as rejected:
            await sup.run_in_slot(
                "s", trio.lowlevel.checkpoint, policy=AdmissionPolicy.DROP_IF_RUNNING
            )
        assert rejected.value.outcome.rejection is RejectionKind.STORE_UNAVAILABLE
        with trio.fail_after(5), pytest.raises(SlotStoreUnavailableError) as query:
            await sup.cluster_slot("s")
        assert "refused the lease scripts" in str(query.value)
        assert isinstance(query.value.__cause__, coredis.exceptions.AuthorizationError)
        done: list[object] = []
        held_ended = trio.Event()

        async def ran() -> str:
            await trio.lowlevel.checkpoint()
            return "ran"

        async def held() -> None:
            done.append(await sup.run_in_slot("s", ran))
            held_ended.set()

        nursery.start_soon(held)
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_SUBMITTED, reason="held")
        await client.acl_setuser(USER, "+@scripting")
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
            await held_ended.wait()
        assert done == ["ran"]
        assert outages(recorder) == (1, 1)


async def test_a_command_the_renewal_reads_taken_away_is_an_outage_not_foreign_data(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ACL change takes away HMGET, which the renewal reads the slots' leases and the
    pools' holders with: an outage (``CONTROLLER_STORE_UNAVAILABLE``), as every refusal
    is, which ends once the permission is back. A first version of the per-slot
    foreign-data check took the refusal for foreign data at every key it read: the
    slot owner and the unit's holder ended ``LEASE_LOST`` at once, no outage."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    await set_user(client, "+@all")
    async with replica(store_at(store, user_url(redis_server))) as (sup, recorder):
        await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", sleep_forever), slot="a"))
        await sup.add(TaskSpec.once("holder", sleep_forever, limits=(ConcurrencyLimit("p", 2),)))
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="a")
            await recorder.wait_for(EventKind.ATTEMPT_STARTING, name="holder")
        await client.acl_setuser(USER, "-hmget")
        with trio.fail_after(2 * TTL):  # the next renewal, at TTL / 3
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.acl_setuser(USER, "+hmget")
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
    assert not [e for e in recorder.events if "foreign" in (e.reason or "")]
    assert not [r for r in caplog.records if "foreign" in r.getMessage()]


async def test_a_refused_probe_leaves_no_key_without_an_expiry(
    store: RedisSlotStore, redis_server: RedisServer, client: coredis.Redis[str]
) -> None:
    """A start refused at the probe's PUBLISH: the scratch keys it made before expire.
    They had none: a pod crash-looping on a wrong ACL left a set of keys per start."""
    await set_user(client, "+@all", "-publish")
    await refused_start(store_at(store, user_url(redis_server)))
    keys = await client.keys(f"{store.key_prefix}probe:*")
    assert [key for key in keys if await client.pttl(key) < 0] == []


async def test_a_refusal_of_only_the_queueing_script_is_one_outage_with_a_paused_retry(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ACL change takes away RPUSH, which only the script that queues work calls:
    another replica's ``wait=True`` work for a busy slot is refused, while every
    reconnection (a renewal and a subscription) works. One STORE_UNAVAILABLE, no
    STORE_RECOVERED while it lasts, the held work asked again at the capped backoff's
    pace; once the permission is back, one STORE_RECOVERED and the held work runs.
    Before, each reconnection reported a recovery, the held work was asked again at
    once and refused again: ~500 outages a second, one WARNING each, a core busy."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    await set_user(client, "+@all")
    acl_store = store_at(store, user_url(redis_server))
    async with replica(acl_store) as (a, owning), replica(acl_store) as (b, recorder):
        gate = trio.Event()
        owner = await a.submit(ControllerSpec.queue(gated(gate, "owner"), slot="s"))
        with trio.fail_after(5):
            await owning.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="s")
        caplog.clear()
        await client.acl_setuser(USER, "-rpush")
        held = await b.submit(ControllerSpec.queue(quick("b", "held"), slot="s", wait=True))
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        keeper = b._keeper
        assert keeper is not None
        before = keeper.statistics().round_trips
        window = 2.0  # real time: 6 retries at the cap of TTL / 3, fewer before it
        await trio.sleep(window)  # observing a rate over a real-clock window, not settling
        assert keeper.statistics().round_trips - before <= 4 * (window / (TTL / 3)) + 8
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 2
        assert outages(recorder) == (1, 0)
        assert not held.done
        await client.acl_setuser(USER, "+rpush")
        gate.set()
        with trio.fail_after(10):
            assert (await owner.wait()).value == "owner"
            assert (await held.wait()).value == "held"
        assert outages(recorder) == (1, 1)


async def test_a_refused_subscription_warns_once_per_outage(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ACL change takes the channels away while the supervisor runs (the server
    drops the subscription): one outage, and WARNINGs for it and its first failures
    only; the reconnections that renew but are refused the subscription log at DEBUG.
    Before, each of them warned (its renewal worked, which counted as the outage's end
    for the log)."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    await set_user(client, "+@all")
    async with replica(store_at(store, user_url(redis_server))) as (_, recorder):
        caplog.clear()
        await client.acl_setuser(USER, "resetchannels")
        await client.client_kill(type_=coredis.PureToken.PUBSUB)
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        window = 2.0  # real time: 6 retries at the cap of TTL / 3, more before it
        await trio.sleep(window)  # observing a rate over a real-clock window, not settling
        refused = [r for r in caplog.records if "No permissions to access a channel" in r.message]
        assert len(refused) >= 3
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 3
        await client.acl_setuser(USER, "&*")
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
        assert len(recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)) == 1


BUSY_FOR_1_S = """
local started = redis.call('TIME')
while true do
    local now = redis.call('TIME')
    if (now[1] - started[1]) * 1000000 + (now[2] - started[2]) > 1000000 then return 1 end
end
"""


async def until_busy(probe: coredis.Redis[str]) -> None:
    """Wait until the server answers ``BUSY`` (a readiness poll of the server's state)."""
    with trio.fail_after(5):
        while True:
            try:
                await probe.ping()
            except coredis.exceptions.ResponseError as exc:
                if str(exc).startswith("BUSY "):
                    return
            await trio.sleep(0.01)


async def test_a_server_busy_with_another_clients_script_is_one_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another client's script runs past ``busy-reply-threshold``: the server answers
    ``BUSY`` to every call for now. That is one outage, as a refusal is: new
    ``wait=False`` work is rejected ``STORE_UNAVAILABLE``, ``wait=True`` work is held,
    an owner that returns meanwhile has its release sent once the script ended, and
    the held work then takes its slot. Before, the calls sent between two renewals
    failed one by one ("slot store call failed"): the submit was rejected with the
    server's text, and a release was dropped (its slot free only once its lease had
    expired)."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    with running_server(extra=("--busy-reply-threshold", "50")) as server:
        store = RedisSlotStore(server.url, lease_ttl=3.0, connect_timeout=2.0)
        async with (
            coredis.Redis.from_url(server.url, decode_responses=True) as other,
            coredis.Redis.from_url(server.url, decode_responses=True) as probe,
            replica(store) as (sup, recorder),
            trio.open_nursery() as nursery,
        ):
            gate = trio.Event()
            owner = await sup.submit(ControllerSpec.queue(gated(gate, "owner"), slot="s"))
            with trio.fail_after(5):
                await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="s")

            async def run_script() -> None:
                await other.eval(BUSY_FOR_1_S, [], [])

            nursery.start_soon(run_script)
            await until_busy(probe)
            rejected = await sup.submit(ControllerSpec.queue(quick("r"), slot="t"))
            with trio.fail_after(5):
                outcome = await rejected.wait()
            assert (outcome.rejection, outcome.reason) == (
                RejectionKind.STORE_UNAVAILABLE,
                "slot store is unavailable",
            )
            held = await sup.submit(ControllerSpec.queue(quick("h", "held"), slot="s", wait=True))
            gate.set()
            with trio.fail_after(10):
                assert (await owner.wait()).value == "owner"
                assert (await held.wait()).value == "held"
        assert outages(recorder) == (1, 1)
        assert [r for r in caplog.records if "call failed" in r.getMessage()] == []
        unavailable = [r.getMessage() for r in caplog.records if "unavailable:" in r.getMessage()]
        assert len(unavailable) == 1
        assert "ResponseError: BUSY " in unavailable[0]


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            coredis.exceptions.BusyLoadingError("Valkey is loading the dataset in memory"),
            "refused the lease scripts while it loads its data set",
        ),
        (
            coredis.exceptions.ResponseError("MASTERDOWN Link with MASTER is down"),
            "refused the lease scripts",
        ),
        (
            coredis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
            "refused the lease scripts",
        ),
        (
            coredis.exceptions.ResponseError("OOM command not allowed when used memory > x"),
            "refused the lease scripts",
        ),
    ],
)
def test_a_server_that_takes_no_call_for_now_refuses_every_call(
    error: Exception, says: str
) -> None:
    """Each code of a server that takes no call for now (``LOADING`` after a restart
    with persistence among them) is a refusal of the calls as such, an outage; an
    error of one call's own (a script's) is not."""
    client = RedisClient(RedisSlotStore("redis://127.0.0.1:1/0"), "i")
    assert client.refuses_calls(error)
    assert client.refusal(error, "the lease scripts") == says
    assert client.may_pass(error)  # a start waits for it
    script_error = coredis.exceptions.ResponseError("ERR user_script:1: bad argument")
    assert not client.refuses_calls(script_error)
    assert not client.may_pass(script_error)


def tls_failure() -> Exception:
    error = coredis.exceptions.ConnectionError("handshake")
    error.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    return error


@pytest.mark.parametrize(
    ("error", "passes"),
    [
        (coredis.exceptions.ConnectionError("no connection to 127.0.0.1:1"), True),
        (coredis.exceptions.ConnectionError("max number of clients reached"), True),
        (OpeningResetError("127.0.0.1:1 reset the connection as it opened"), True),
        (coredis.exceptions.AuthenticationFailureError("WRONGPASS"), False),
        (coredis.exceptions.AuthorizationError("NOPERM"), False),
        (coredis.exceptions.ResponseError("ERR DB index is out of range"), False),
        (coredis.exceptions.UnknownCommandError("ERR unknown command 'EVALSHA'"), False),
        (coredis.exceptions.ProtocolError("not a Redis reply"), False),
        (coredis.exceptions.InvalidResponse("HTTP/1.1 400"), False),
        (tls_failure(), False),
        (NoPrimaryError("no sentinel answered", "could not reach", passes=True), True),
        (NoPrimaryError("know no service 'x'", "found no service 'x'"), False),
    ],
)
def test_only_what_may_pass_by_itself_is_tried_again_at_start(
    error: Exception, passes: bool
) -> None:
    """No connection may pass (nothing listens yet, maxclients); a refusal of the
    store's settings will not."""
    assert RedisClient(RedisSlotStore("redis://127.0.0.1:1/0"), "i").may_pass(error) is passes


# -- a start before the server is ready -----------------------------------------------------


async def test_a_start_waits_for_a_server_that_comes_up_within_connect_timeout(
    store: RedisSlotStore,
) -> None:
    """Nothing listens on the port yet (a server that restarts, or starts with the
    replicas): ``open_supervisor`` tries again with the reconnection's backoff and
    starts once the server answers. It raised at once before ("could not be reached")."""
    with running_server() as server:
        server.stop()
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start_later, server)
            with trio.fail_after(5):
                async with replica(store_at(store, server.url, connect_timeout=5.0)) as (sup, _):
                    assert await sup.run_in_slot("s", nothing) is None
        assert time.monotonic() - started >= 0.3


async def test_a_start_waits_for_a_server_that_takes_no_call_for_now() -> None:
    """A server busy with another client's script (``BUSY``, as ``LOADING`` after a
    restart is) at start: the start waits for it, within ``connect_timeout``."""
    with running_server(extra=("--busy-reply-threshold", "50")) as server:
        store = RedisSlotStore(server.url, lease_ttl=TTL, connect_timeout=5.0)
        async with (
            coredis.Redis.from_url(server.url, decode_responses=True) as other,
            coredis.Redis.from_url(server.url, decode_responses=True) as probe,
            trio.open_nursery() as nursery,
        ):

            async def run_script() -> None:
                await other.eval(BUSY_FOR_1_S, [], [])

            nursery.start_soon(run_script)
            await until_busy(probe)
            with trio.fail_after(5):
                async with replica(store) as (sup, _):
                    assert await sup.run_in_slot("s", nothing) is None


async def test_a_start_that_stays_unreached_names_the_last_failure_after_connect_timeout(
    store: RedisSlotStore,
) -> None:
    """Nothing comes up: after ``connect_timeout`` the error names the last failure,
    with the client's error as cause (not "did not answer": the port refused)."""
    started = time.monotonic()
    error = await refused_start(store_at(store, f"redis://127.0.0.1:{free_port()}/0", 0.5))
    assert time.monotonic() - started >= 0.5
    assert "could not be reached: ConnectionError: no connection to 127.0.0.1" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ConnectionError)


async def test_a_start_names_its_last_failure_when_its_last_attempt_meets_silence(
    store: RedisSlotStore,
) -> None:
    """The port refuses, then a server that never answers listens on it: the error
    names the last failure, the refusal. (The attempt under way at ``connect_timeout``
    may just as well be one that the deadline cut as the server answered: naming it
    "did not answer" read so for a primary whose replicas were still connecting.)"""
    port = free_port()

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:

        async def listen_later() -> None:
            await trio.sleep(0.2)
            listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
            await trio.serve_listeners(silent, listeners)

        nursery.start_soon(listen_later)
        error = await refused_start(store_at(store, f"redis://127.0.0.1:{port}/0", 1.0))
        nursery.cancel_scope.cancel()
    assert "could not be reached: ConnectionError: no connection to 127.0.0.1" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ConnectionError)


@pytest.mark.parametrize("answers", [False, True], ids=["nothing-listens", "silent"])
@pytest.mark.parametrize("how", ["deadline", "cancel"])
async def test_a_start_is_cut_short_by_a_cancellation_of_its_caller(
    store: RedisSlotStore, answers: bool, how: str
) -> None:
    """A caller of ``open_supervisor`` cancelled while the store is being reached (a
    port nothing listens on, tried again; a server that never answers): the start ends
    at once, nothing runs, and the cancellation is the caller's. Before, the shielded
    start went on for ``connect_timeout`` (5 s here) and then raised
    ``SlotStoreUnavailableError`` through the cancelled scope."""
    async with tcp_server(None) as silent_port:
        port = silent_port if answers else free_port()
        slow = store_at(store, f"redis://127.0.0.1:{port}/0", connect_timeout=5.0)
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as scope:
                if how == "deadline":
                    scope.deadline = trio.current_time() + 0.3
                else:
                    nursery.start_soon(cancel_later, scope)
                async with open_supervisor(config(slow)):
                    pytest.fail("the block must not run")
        assert scope.cancelled_caught
        assert time.monotonic() - started < 2.5  # half of connect_timeout


async def cancel_later(scope: trio.CancelScope) -> None:
    await trio.sleep(0.3)
    scope.cancel()


async def test_a_start_that_is_refused_as_configured_raises_at_once(
    store: RedisSlotStore, redis_server: RedisServer, client: coredis.Redis[str]
) -> None:
    """What waiting would not change (here the credentials; the ACL, database, TLS and
    protocol tests around say the same) still raises at once."""
    await set_user(client, "+@all")
    started = time.monotonic()
    url = user_url(redis_server, "not-" + PASSWORD)
    error = await refused_start(store_at(store, url, connect_timeout=5.0))
    assert time.monotonic() - started < 2.5
    assert "refused the credentials" in str(error)


# -- the cause, named --------------------------------------------------------------------------


async def test_wrong_password_is_named(
    store: RedisSlotStore, redis_server: RedisServer, client: coredis.Redis[str]
) -> None:
    """Wrong credentials: "refused the credentials", the client's error as cause."""
    await set_user(client, "+@all")
    error = await refused_start(store_at(store, user_url(redis_server, "not-" + PASSWORD)))
    assert "refused the credentials: AuthenticationFailureError" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.AuthenticationError)
    assert "not-" + PASSWORD not in str(error)


async def test_a_password_the_url_does_not_give_is_named(store: RedisSlotStore) -> None:
    """A server that asks for a password the URL lacks says so; before, it read "refused
    the credentials" (credentials never sent) with coredis's note on ``HELLO``."""
    with running_server("tv-pw-") as server:
        async with coredis.Redis.from_url(server.url) as admin:
            await admin.config_set({"requirepass": PASSWORD})
        error = await refused_start(store_at(store, server.url))
    assert f"{server.url} asks for a password, and the URL gives none" in str(error)
    assert "refused the credentials" not in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.AuthenticationRequiredError)


async def test_bad_database_index_is_named(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A database number the server does not have: "refused the database number"."""
    error = await refused_start(store_at(store, f"redis://127.0.0.1:{redis_server.port}/99"))
    assert "refused the database number: ResponseError: DB index is out of range" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ResponseError)


async def test_tls_to_a_plain_server_is_named(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """``rediss://`` to a server without TLS (it waits for the rest of a "command"):
    the TLS handshake is named, well within ``connect_timeout``."""
    started = time.monotonic()
    error = await refused_start(store_at(store, f"rediss://127.0.0.1:{redis_server.port}/0"))
    assert time.monotonic() - started < 1.0 + 0.5  # connect_timeout, then the teardown
    assert "did not complete the TLS handshake in time (does the server speak TLS?)" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ConnectionError)


async def test_a_replica_is_named(store: RedisSlotStore, redis_server: RedisServer) -> None:
    """A URL that names a read-only replica: refused at once, and named as such (it read
    as a bare refusal of the scripts, with the server's text)."""
    with running_server(extra=("--replicaof", "127.0.0.1", str(redis_server.port))) as replica_:
        error = await refused_start(store_at(store, replica_.url))
    said = "refused the lease scripts: it is a read-only replica (the URL must name the primary)"
    assert said in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ReadOnlyError)


async def test_a_server_with_no_room_for_another_client_is_named(store: RedisSlotStore) -> None:
    """A server at its ``maxclients`` answers a new connection with an error and closes
    it: it refused the connection, it was reached (it used to read "could not be
    reached: ConnectionError: max number of clients reached")."""
    with (
        running_server(extra=("--maxclients", "1")) as server,
        socket.create_connection(("127.0.0.1", server.port)) as only_client,
    ):
        only_client.sendall(b"PING\r\n")
        assert only_client.recv(16) == b"+PONG\r\n"
        error = await refused_start(store_at(store, server.url))
    assert "refused the connection: it has as many clients as its maxclients allows" in str(error)
    assert "could not be reached" not in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ConnectionError)


@asynccontextmanager
async def resetting_server() -> AsyncIterator[tuple[int, list[float]]]:
    """A TCP server on a loopback port that resets every connection once it has read
    the client's first bytes (``SO_LINGER`` 0: an RST, no FIN), as a server or a proxy
    at its limit of clients may; yield its port and the times it accepted one."""
    accepted: list[float] = []

    async def handle(stream: trio.SocketStream) -> None:
        accepted.append(time.monotonic())
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.receive_some(65536)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), handle, 0
        )
        yield listeners[0].socket.getsockname()[1], accepted
        nursery.cancel_scope.cancel(reason="the test server is no longer needed")


async def test_a_server_that_resets_new_connections_is_named_and_tried_again(
    store: RedisSlotStore,
) -> None:
    """A server at its ``maxclients`` whose RST overtook its error reply, or a proxy at
    its own limit, resets a new connection as it opens: a dropped connection, which the
    start tries again with the reconnection's backoff until ``connect_timeout`` (a few
    attempts, no spin), then names ("reset the connection as it opened", with the
    maxclients it may be). Before, the start raised at the first reset, in
    milliseconds, saying the server "could not be reached" (it was: it accepted)."""
    async with resetting_server() as (port, accepted):
        started = time.monotonic()
        error = await refused_start(store_at(store, f"redis://127.0.0.1:{port}/0"))
        took = time.monotonic() - started
    assert (
        "reset the connection as it opened (a server at its maxclients, or a proxy in front"
        " of it at its own limit of clients, may refuse a client so)"
    ) in str(error)
    assert "could not be reached" not in str(error)
    assert isinstance(error.__cause__, OpeningResetError)
    assert isinstance(error.__cause__.__cause__, ConnectionResetError)
    assert 0.9 <= took < 1.0 + 1.0  # connect_timeout, then the teardown
    # backoff from lease_ttl / 24, doubling, capped at lease_ttl / 3: a few attempts
    assert 3 <= len(accepted) <= 10, accepted


async def test_an_error_the_server_sends_as_it_closes_is_named(store: RedisSlotStore) -> None:
    """A server at its ``maxclients`` answers a new socket (the subscription's, which
    the keeper opens past coredis) with an error and closes it: the error names the
    server's words, as coredis's does for the round trips' connection. It read "the
    server closed the connection", the error it sent before lost."""
    async with (
        tcp_server(b"-ERR max number of clients reached\r\n") as port,
        open_client(store_at(store, f"redis://127.0.0.1:{port}/0")) as client,
    ):
        with pytest.raises(coredis.exceptions.ConnectionError) as error:
            await open_wire(client, store, (_head(b"SUBSCRIBE"), ("channel",)))
    assert str(error.value) == "max number of clients reached"
    assert RedisClient(store, "i").refusal(error.value, "the subscription") == (
        "refused the connection: it has as many clients as its maxclients allows"
    )


async def test_a_round_trip_cut_after_an_error_reply_is_a_closed_connection() -> None:
    """A round trip whose first call is answered with an error, the connection then
    closed (a server killed in the middle of the batch): the connection loss is the
    failure (an outage, tried again), not that call's error, which is a handshake's
    failure only."""
    async with (
        tcp_server(b"-WRONGTYPE Operation against a key\r\n") as port,
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
    ):
        with pytest.raises(coredis.exceptions.ConnectionError, match="closed the connection"):
            await _Wire(stream).call([(_head(b"GET"), ("k",)), (_head(b"GET"), ("k2",))])


HTTP_ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(HTTP_ANSWER, id="http"),
        # Python's http.server answers a line it cannot parse with a page, no CRLF in it
        pytest.param(b"<!DOCTYPE HTML>\n<html lang='en'>\n<p>Error code: 400</p>", id="html"),
        # PostgreSQL's ErrorResponse to a startup packet it cannot read
        pytest.param(b"E\x00\x00\x00\x54SFATAL\x00C08P01\x00", id="postgres"),
    ],
)
async def test_a_server_that_is_not_redis_is_named(store: RedisSlotStore, answer: bytes) -> None:
    """A server of another protocol on the port, which answers and closes: "did not answer
    in the Redis protocol", also when its answer holds no complete line (it used to read
    "could not be reached: the server closed the connection")."""
    async with tcp_server(answer) as port:
        error = await refused_start(store_at(store, f"redis://127.0.0.1:{port}/0"))
    assert "did not answer in the Redis protocol (is it a Redis server?)" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.InvalidResponse)


async def test_a_reply_cut_short_is_a_closed_connection(store: RedisSlotStore) -> None:
    """A server that closes the connection in the middle of a Redis reply spoke the
    protocol: the connection was closed, not the protocol wrong."""
    async with tcp_server(b"$10\r\nhel") as port:
        error = await refused_start(store_at(store, f"redis://127.0.0.1:{port}/0"))
    assert "the server closed the connection" in str(error)
    assert "Redis protocol" not in str(error)


async def test_a_failed_tls_handshake_is_named(store: RedisSlotStore) -> None:
    """``rediss://`` to a server that answers the TLS hello with something else."""
    async with tcp_server(HTTP_ANSWER) as port:
        error = await refused_start(store_at(store, f"rediss://127.0.0.1:{port}/0"))
    assert "failed the TLS handshake: ConnectionError" in str(error)
    assert "SSLError" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.ConnectionError)


async def test_only_silence_is_did_not_answer(store: RedisSlotStore) -> None:
    """A server that accepts connections and never answers: after ``connect_timeout``,
    "did not answer within 0.5 s", with no cause."""
    async with tcp_server(None) as port:
        started = time.monotonic()
        error = await refused_start(store_at(store, f"redis://127.0.0.1:{port}/0", 0.5))
        assert time.monotonic() - started >= 0.5
    assert str(error).endswith("did not answer within 0.5 s")
    assert error.__cause__ is None


REACHING = """
import sys, trio
from trio_taskvisor import ControllerConfig, SupervisorConfig, open_supervisor
from trio_taskvisor.redis import RedisSlotStore

async def main() -> None:
    store = RedisSlotStore(sys.argv[1], connect_timeout=60.0)
    config = SupervisorConfig(controller=ControllerConfig(slot_store=store))
    try:
        async with open_supervisor(config, handle_signals=True):
            print("the block ran", flush=True)
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        raise

trio.run(main)
"""


LOADING = b"-LOADING Redis is loading the dataset in memory\r\n"


async def signalled_while_reaching(
    signum: signal.Signals, prelude: str = "", answer: bytes | None = None
) -> tuple[int, str]:
    """Run ``REACHING`` (after ``prelude``) against a silent server (or one that answers
    ``answer``) and send it ``signum`` once it connected (``answer``: connected again,
    having tried once): its return code and what it printed."""
    connected = trio.Event()
    async with tcp_server(answer, connected, 1 if answer is None else 2) as port:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", prelude + REACHING, f"redis://127.0.0.1:{port}/0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            with trio.fail_after(30):  # the interpreter's start on a loaded machine
                await connected.wait()
            process.send_signal(signum)
            with trio.fail_after(20):  # a third of connect_timeout
                await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                process.kill()  # (ended already, unless the test failed)
                await process.wait()
        assert process.stdout is not None
        out = (await process.stdout.receive_some(65536)).decode()
    return process.returncode, out.replace(str(port), "PORT")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_while_reaching_the_store_cuts_it_short(signum: signal.Signals) -> None:
    """A process that is still reaching a silent store (``connect_timeout`` 60 s) when
    it gets a signal (``handle_signals=True``) stops reaching it at once, runs no block,
    and hands the signal to the handler from before the block: SIGTERM's default ends
    the process, SIGINT's (trio's) raises ``KeyboardInterrupt`` (and Python ends an
    uncaught one by SIGINT). Before, the signal waited in trio's receiver until
    ``connect_timeout`` had passed."""
    returncode, out = await signalled_while_reaching(signum)
    assert out == ("" if signum == signal.SIGTERM else "KeyboardInterrupt: \n")
    assert returncode == -signum


async def test_a_signal_while_the_start_tries_again_cuts_it_short() -> None:
    """The same while the start tries again a server that answers ``LOADING`` (it
    waits up to ``connect_timeout`` for such a server)."""
    returncode, out = await signalled_while_reaching(signal.SIGTERM, answer=LOADING)
    assert (returncode, out) == (-signal.SIGTERM, "")


async def test_a_signal_ignored_before_the_block_leaves_the_error_naming_it() -> None:
    """SIGINT ignored before the block (as in a shell's background job): the start is
    still cut short, and ``SlotStoreUnavailableError`` says why."""
    ignore = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    returncode, out = await signalled_while_reaching(signal.SIGINT, ignore)
    assert out == (
        "SlotStoreUnavailableError: slot store redis://127.0.0.1:PORT/0 was not reached yet"
        " when SIGINT came\n"
    )
    assert returncode == 1


DRAINING = """
import sys, trio
from trio_taskvisor import ControllerConfig, ControllerSpec, SupervisorConfig, TaskSpec
from trio_taskvisor import open_supervisor
from trio_taskvisor.redis import RedisSlotStore

async def owner() -> None:
    try:
        await trio.sleep_forever()
    finally:
        print("stopping", flush=True)

async def main() -> None:
    store = RedisSlotStore(sys.argv[1], connect_timeout=30.0)
    config = SupervisorConfig(controller=ControllerConfig(slot_store=store))
    async with open_supervisor(config, handle_signals=True) as sup:
        owned = await sup.submit(ControllerSpec.queue(TaskSpec.once("owner", owner), slot="s"))
        await owned.wait_placed()
        print("ready", flush=True)
        await trio.sleep_forever()
    print("left the block", flush=True)

trio.run(main)
"""


async def test_a_signal_ends_the_wait_for_a_store_that_does_not_answer() -> None:
    """The first SIGTERM starts the shutdown, whose last round trip (the owner's
    release) waits for a server that does not answer, up to ``connect_timeout`` (30 s);
    a SIGTERM during that wait ends it at once, with a WARNING: the lease expires on
    the server, as after a crash. Before, the process waited the 30 s out. (Sent every
    0.2 s until the WARNING comes: one that comes while the owner still stops forces it,
    as any signal during a shutdown does, and does not cut the wait to come. None after
    it: past the block, SIGTERM's own action would end the process, -15.)"""
    forced = b"the shutdown was forced before the store was told"
    with running_server() as server:
        try:
            async with child(DRAINING, server.url) as process:
                assert process.stdout is not None
                assert process.stderr is not None
                with trio.fail_after(30):  # the interpreter's start on a loaded machine
                    assert await read_line(process.stdout) == b"ready\n"
                server.pause()
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    assert await read_line(process.stdout) == b"stopping\n"
                err = b""
                with trio.fail_after(10):  # a third of connect_timeout
                    while forced not in err:
                        process.send_signal(signal.SIGTERM)
                        with trio.move_on_after(0.2):
                            while forced not in err:
                                chunk = await process.stderr.receive_some(65536)
                                assert chunk, f"stderr ended after {err!r}"
                                err += chunk
                    await process.wait()
                out = (await process.stdout.receive_some(65536)).decode()
        finally:
            server.resume()
    assert (process.returncode, out) == (0, "left the block\n")


DEFERRING = """
import sys, trio
from trio_taskvisor import ControllerConfig, ControllerSpec, SupervisorConfig, TaskSpec
from trio_taskvisor import current_context, open_supervisor
from trio_taskvisor.redis import RedisSlotStore

async def owner() -> None:
    context = current_context()
    with context.defer_cancel():  # a clean-up that outlasts the soft stop
        print("owning", flush=True)
        await context.wait_cancel_requested()
        print("stopping", flush=True)
        await trio.sleep(60)

async def main() -> None:
    store = RedisSlotStore(sys.argv[1], namespace=sys.argv[2], lease_ttl=30.0)
    config = SupervisorConfig(controller=ControllerConfig(slot_store=store))
    async with open_supervisor(config, handle_signals=True) as sup:
        spec = TaskSpec.once("owner", owner)  # the default grace: 60 s
        await sup.submit(ControllerSpec.queue(spec, slot="s"))
        await trio.sleep_forever()

trio.run(main)
"""


async def test_a_second_signal_that_forces_an_owner_still_hands_its_slot_over(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The second SIGTERM forces an owner that defers its stop: its release still
    reaches a server that answers, and the next replica's work starts at once, not
    after the lease's 30 s (the signal cuts only a wait for a store that does not
    answer, once no task is left)."""
    async with child(DEFERRING, redis_server.url, store.namespace) as process:
        with trio.fail_after(30):  # the interpreter's start on a loaded machine
            assert await read_line(process.stdout) == b"owning\n"
        async with replica(store) as (sup, _):
            waiter = await sup.submit(ControllerSpec.queue(quick("next", "next"), slot="s"))
            with trio.fail_after(10):
                assert (await waiter.wait_placed()).name == "QUEUED"
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                assert await read_line(process.stdout) == b"stopping\n"
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(10):  # a third of the lease
                assert (await waiter.wait()).value == "next"
        with trio.fail_after(10):
            await process.wait()
        assert process.stderr is not None
        err = (await process.stderr.receive_some(65536)).decode()
    assert "GraceExceededError" in err
    assert "the shutdown was forced before the store was told" not in err


@pytest.fixture(scope="module")
def server_without_evalsha() -> Iterator[RedisServer]:
    with running_server(extra=["--rename-command", "EVALSHA", '""']) as server:
        yield server


async def test_unknown_commands_are_named(
    store: RedisSlotStore, server_without_evalsha: RedisServer
) -> None:
    """A server that does not know EVALSHA (renamed away): "refused the lease scripts as
    unknown commands"."""
    error = await refused_start(store_at(store, server_without_evalsha.url))
    assert "refused the lease scripts as unknown commands: UnknownCommandError" in str(error)
    assert isinstance(error.__cause__, coredis.exceptions.UnknownCommandError)


# -- a subscription that dies without a word ---------------------------------------------------


@asynccontextmanager
async def forgetful_proxy(port: int) -> AsyncIterator[tuple[int, Callable[[], None]]]:
    """A TCP proxy to the loopback server at ``port``: yields its own port and
    ``forget()``, after which what the server sends on the subscriptions open at that
    moment is dropped, as a NAT or a load balancer that forgot an idle connection drops
    it: no reset, no close. Connections opened later pass."""
    subscriptions: set[trio.SocketStream] = set()
    forgotten: set[trio.SocketStream] = set()

    async def upstream(client: trio.SocketStream, data: bytes) -> bytes:
        if b"SUBSCRIBE" in data:
            subscriptions.add(client)
        return data

    async def downstream(client: trio.SocketStream, data: bytes) -> bytes:
        return b"" if client in forgotten else data

    def forget() -> None:
        forgotten.update(subscriptions)

    async with tcp_proxy(port, upstream=upstream, downstream=downstream) as proxied:
        yield proxied, forget


async def test_a_subscription_that_dies_without_a_word_is_replaced(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A subscription whose connection dies without a reset (a NAT's idle timeout) is
    found by a PING after a renewal interval without messages, and replaced: one
    outage, and hand-overs to the process are pushed again. Before, it waited for ever,
    and every hand-over to the process waited for its next renewal (up to
    ``lease_ttl / 3``), with nothing logged."""
    ttl = 3.0  # renewals every 1 s; the PING after 1 s of silence, answered within 0.5 s
    slow = RedisSlotStore(store.url, namespace=store.namespace, lease_ttl=ttl, connect_timeout=0.5)
    async with forgetful_proxy(redis_server.port) as (port, forget):
        url = f"redis://127.0.0.1:{port}/0"
        proxied = RedisSlotStore(url, namespace=store.namespace, lease_ttl=ttl, connect_timeout=0.5)
        async with replica(slow) as (sup_a, _), replica(proxied) as (sup_b, recorder):
            forget()
            with trio.fail_after(4 * ttl):
                await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
                await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
            gate = trio.Event()
            owner = await sup_a.submit(ControllerSpec.queue(gated(gate), slot="s", wait=True))
            assert await owner.wait_placed() is Placement.OWNER
            started = trio.Event()

            async def next_owner() -> None:
                started.set()

            queued = await sup_b.submit(
                ControllerSpec.queue(TaskSpec.once("next", next_owner), slot="s", wait=True)
            )
            assert await queued.wait_placed() is Placement.QUEUED
            gate.set()
            with trio.fail_after(ttl / 6):  # pushed: well within a renewal interval
                await started.wait()
            with trio.fail_after(2 * ttl):
                assert (await queued.wait()).kind is OutcomeKind.COMPLETED
            assert outages(recorder) == (1, 1)


# -- a clock that does not run in real time -----------------------------------------------------


async def refused_on(clock: trio.testing.MockClock) -> None:
    """``open_supervisor`` with a slot store on ``clock``: ``ConfigError`` at once, naming
    the clock, before any connection (the port has no server)."""
    store = RedisSlotStore(f"redis://127.0.0.1:{free_port()}/0", namespace="virtual")
    with pytest.raises(ConfigError) as error:
        async with open_supervisor(config(store)):
            pytest.fail("the block must not run")
    assert str(error.value) == (
        "a slot store needs a clock that runs in real time (its server expires leases in"
        " real time), and this trio.run has MockClock(rate=0.0, autojump_threshold="
        f"{clock.autojump_threshold!r}): run the tests that use a slot store without"
        " autojump_clock (or with MockClock(rate=1.0))"
    )
    assert trio.current_time() == 0.0


async def test_a_slot_store_under_autojump_clock_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """pytest-trio's ``autojump_clock`` with a slot store: refused. Before, the start
    failed with "did not answer within 5.0 s" after a few real milliseconds."""
    await refused_on(autojump_clock)


async def test_a_slot_store_on_a_clock_that_stands_still_is_refused(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A ``MockClock`` that stands still (pytest-trio's ``mock_clock``): refused. Before,
    with a server there, it started and renewed nothing while the server let its
    leases expire."""
    await refused_on(mock_clock)


# -- a lease lost in the instant its owner returns -----------------------------------------------


@pytest.fixture
def jumpable_clock() -> trio.testing.MockClock:
    """Real time, plus jumps: ``jump`` is a pause of the process (nothing runs during it)."""
    return trio.testing.MockClock(rate=1.0)


async def test_owner_returning_as_its_lease_is_lost_ends_lease_lost(
    store: RedisSlotStore, jumpable_clock: trio.testing.MockClock
) -> None:
    """The body returns right after a pause longer than the lease (no checkpoint between:
    the keeper's deadline timer has not run yet): the outcome is LEASE_LOST, not
    COMPLETED, with one CONTROLLER_LEASE_LOST before the task's TASK_FINISHED."""
    ttl_store = store_at(store, store.url)

    async def paused_then_returns() -> str:
        jumpable_clock.jump(TTL)  # paused past 0.8 * lease_ttl since the last renewal
        return "done"

    async with replica(ttl_store) as (sup, recorder):
        with trio.fail_after(5), pytest.raises(OutcomeError) as error:
            await sup.run_in_slot("s", paused_then_returns)
        outcome = error.value.outcome
        assert outcome.kind is OutcomeKind.LEASE_LOST
        assert outcome.reason is not None
        assert outcome.reason.startswith("lease expired")
        with trio.fail_after(5):
            finished = await recorder.wait_for(EventKind.TASK_FINISHED)
        lost = recorder.of(EventKind.CONTROLLER_LEASE_LOST)
        assert [(e.task_id, e.reason) for e in lost] == [(finished.task_id, outcome.reason)]
        assert lost[0].seq < finished.seq
        assert finished.outcome is OutcomeKind.LEASE_LOST


async def test_keeper_answers_lease_lost_until_the_release(
    store: RedisSlotStore, jumpable_clock: trio.testing.MockClock
) -> None:
    """``lease_lost`` checks the deadline at the call, and keeps the answer once its
    timer has reported the loss (the report may still wait in the controller's inbox),
    until the lease is given back."""
    ttl_store = store_at(store, store.url)
    async with open_keeper(ttl_store, "errors-a:1:0000000a") as a:
        reports: Reports = a.reports
        a.keeper.submit("k", 1, AdmissionPolicy.QUEUE, 10, False)
        with trio.fail_after(5):
            await reports.wait_for(Owner, task_id=1)
        assert a.keeper.lease_lost(1) is None
        jumpable_clock.jump(TTL)
        reason = a.keeper.lease_lost(1)  # before the timer task could run
        assert reason is not None
        assert reason.startswith("lease expired")
        with trio.fail_after(5):
            lost = await reports.wait_for(LeaseLost, task_id=1)
        assert lost.reason == reason
        assert len(reports.of(LeaseLost)) == 1
        assert a.keeper.lease_lost(1) == reason
        a.keeper.release("k", 1, TaskOutcome(OutcomeKind.LEASE_LOST, reason=reason))
        assert a.keeper.lease_lost(1) is None


# -- strings another client wrote -----------------------------------------------------------


async def test_bytes_not_utf8_in_a_lease_stop_are_a_stop_not_a_crash(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Another client writes bytes that are not UTF-8 into an owner's lease (its
    ``stop`` field, where a process asks the owner to stop): the next renewal reads
    them as a stop request, as any requester's, and the supervisor goes on. Before, the
    renewal's reply could not be parsed ("unexpected script reply b'[[..."), and the
    keeper's error ended the supervisor and all its work."""
    async with replica(store) as (sup, recorder):
        gate = trio.Event()
        owner = await sup.submit(ControllerSpec.queue(gated(gate, "owner"), slot="s"))
        with trio.fail_after(5):
            await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="s")
        async with coredis.Redis.from_url(redis_server.url) as raw:
            await raw.hset(f"{store.key_prefix}lease:s", {"stop": b"\xff\xfe"})
        with trio.fail_after(5):
            assert (await owner.wait()).kind is OutcomeKind.CANCELLED
            await recorder.wait_for(EventKind.CONTROLLER_REMOTE_STOP, slot="s")
            assert await sup.run_in_slot("s", nothing) is None


async def test_a_holder_not_utf8_is_shown_escaped_by_cluster_slot(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """``cluster_slot`` of a slot whose lease another client wrote with a holder that is
    not UTF-8: its bytes escaped, as the ``slots`` command shows them (it read as the
    ``repr`` of bytes, ``"b'h\\xff'"``)."""
    async with coredis.Redis.from_url(redis_server.url) as raw:
        await raw.hset(f"{store.key_prefix}lease:s", {"entry": b"h\xff/1", "token": b"5"})
        await raw.pexpire(f"{store.key_prefix}lease:s", 10_000)
    async with replica(store) as (sup, _):
        with trio.fail_after(5):
            info = await sup.cluster_slot("s")
    assert info is not None
    assert (info.holder, info.fence_token) == ("h\\xff", 5)


async def test_a_joiner_of_a_lease_whose_entry_is_not_utf8_ends_lost_naming_it_escaped(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Another client wrote a lease whose entry is not UTF-8: a JOIN of that slot
    follows it, finds it lost (no process of that name lives) and ends ``LEASE_LOST``
    naming the instance escaped (``h\\xff``), as ``cluster_slot`` shows it; a QUEUE
    submission behind it gets the slot once the lease expires. The reason read
    "followed work lost: b'h\\xff:1:x" (the ``repr`` of bytes)."""
    async with coredis.Redis.from_url(redis_server.url) as raw:
        await raw.hset(f"{store.key_prefix}lease:s", {"entry": b"h\xff:1:x/1", "token": b"5"})
        await raw.pexpire(f"{store.key_prefix}lease:s", 1500)
    async with replica(store) as (sup, _):
        joiner = await sup.submit(ControllerSpec.join(TaskSpec.once("j", nothing), slot="s"))
        queued = await sup.submit(ControllerSpec.queue(TaskSpec.once("q", nothing), slot="s"))
        with trio.fail_after(8):
            lost = await joiner.wait()
            assert (await queued.wait()).kind is OutcomeKind.COMPLETED
    assert lost.kind is OutcomeKind.LEASE_LOST
    assert lost.reason is not None
    assert lost.reason.startswith("followed work lost: h\\xff:1:x")


# -- strings the server cannot be sent --------------------------------------------------------

SURROGATE = b"doc-\xff".decode(errors="surrogateescape")  # os.fsdecode of a non-UTF-8 name


@pytest.mark.parametrize(
    ("call", "what"),
    [
        pytest.param(
            lambda sup: sup.submit(
                ControllerSpec.queue(TaskSpec.once("w", nothing), slot=SURROGATE)
            ),
            "slot",
            id="submit",
        ),
        pytest.param(
            lambda sup: sup.submit(ControllerSpec.queue(TaskSpec.once(SURROGATE, nothing))),
            "slot",
            id="submit-named-slot",
        ),
        pytest.param(lambda sup: sup.run_in_slot(SURROGATE, nothing), "slot", id="run-in-slot"),
        pytest.param(lambda sup: sup.cluster_slot(SURROGATE), "slot", id="cluster-slot"),
        pytest.param(lambda sup: sup.cancel_slot(SURROGATE), "slot", id="cancel-slot"),
        pytest.param(lambda sup: sup.wait_slot_idle(SURROGATE), "slot", id="wait-slot-idle"),
        pytest.param(
            lambda sup: sup.add(
                TaskSpec.once("w", nothing, limits=(ConcurrencyLimit(SURROGATE, 1),))
            ),
            "limit name",
            id="add-limits",
        ),
        pytest.param(
            lambda sup: sup.limited(RateLimit("r", 1).key(SURROGATE)), "limit key", id="limited"
        ),
        pytest.param(
            lambda sup: sup.cluster_limit(ConcurrencyLimit("c", 1).key(SURROGATE)),
            "limit key",
            id="cluster-limit",
        ),
    ],
)
async def test_a_string_the_server_cannot_be_sent_is_refused_at_the_call(
    store: RedisSlotStore, call: Callable[[Supervisor], Any], what: str
) -> None:
    """A slot, limit name or limit key that does not encode as UTF-8 (a lone surrogate,
    as ``os.fsdecode`` makes of a file name that is not UTF-8) raises ``ConfigError`` at
    the call, and the store serves everyone else. Before, ``cancel_slot`` of such a slot
    crashed the supervisor (the controller's loop failed to encode the stop request);
    the other calls failed the keeper's round trip: the store was unavailable to every
    caller (their work rejected ``STORE_UNAVAILABLE``) until it reconnected; and such a
    limit was refused by the server's scripts at each acquisition
    (``SlotStoreUnavailableError``)."""
    async with replica(store) as (sup, recorder):
        with trio.fail_after(10):
            with pytest.raises(ConfigError) as info:
                await invoke(call, sup)
            assert str(info.value) == (
                f"{what} must encode as UTF-8 to reach the slot store, got {SURROGATE!r} "
                "(a lone surrogate at index 4)"
            )
            waiter = await sup.submit(ControllerSpec.queue(TaskSpec.once("next", nothing)))
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert EventKind.CONTROLLER_STORE_UNAVAILABLE not in {event.kind for event in recorder.events}


async def test_without_a_slot_store_such_strings_work() -> None:
    """Nothing is sent without a slot store: the same slot and pool work in one process."""
    async with open_supervisor(SupervisorConfig(controller=ControllerConfig())) as sup:
        assert await sup.run_in_slot(SURROGATE, nothing) is None
        async with sup.limited(ConcurrencyLimit(SURROGATE, 1).key(SURROGATE)):
            pass
