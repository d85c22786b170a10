"""Cluster slots through the public API: supervisors with a slot store, in this process,
against the real server (real clock).

What needs no second OS process is tested here, where the supervisors' events and
outcomes can be read directly: start-up against a server that does not answer,
credentials, wait-mode work held for cluster queue room and through an outage, a
caller cancelled while its acquisition waits for a paused server. Timing bounds are
liveness bounds with at least a 2x margin; waits are for events and outcomes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pathlib
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import coredis
import pytest
import trio
import trio.testing
import trustme
from cluster_helpers import config, gated, quick, refused_start, replica
from conftest import RedisServer

from trio_taskvisor import (
    BackoffPolicy,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    SlotStoreUnavailableError,
    Supervisor,
    TaskOutcome,
    TaskSpec,
    TaskWaiter,
    current_context,
    open_supervisor,
)
from trio_taskvisor.redis import RedisSlotStore
from trio_taskvisor.testing import EventRecorder

TTL = 1.0


def store_like(store: RedisSlotStore, url: str | None = None, **fields: float) -> RedisSlotStore:
    values = {"lease_ttl": store.lease_ttl, "connect_timeout": store.connect_timeout, **fields}
    return RedisSlotStore(url or store.url, namespace=store.namespace, **values)


async def until_cancelled() -> None:
    await trio.sleep_forever()


# -- start-up -------------------------------------------------------------------------------


async def test_open_supervisor_raises_when_nothing_answers(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A server that accepts connections but never answers (SIGSTOP): ``open_supervisor``
    raises ``SlotStoreUnavailableError`` after ``connect_timeout`` and runs no body."""
    paused = store_like(store, connect_timeout=0.5)
    redis_server.pause()
    started = time.monotonic()
    entered = False
    with pytest.raises(SlotStoreUnavailableError, match=r"did not answer within 0\.5 s"):
        async with open_supervisor(config(paused)):
            entered = True
    assert not entered
    assert time.monotonic() - started < 2 * 0.5 + 0.5  # connect_timeout, then the teardown


async def test_open_supervisor_raises_when_no_server_listens(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """Nothing listens on the port: ``SlotStoreUnavailableError`` at once."""
    with trio.socket.socket() as sock:  # a port that is surely free: bound, not listening
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        closed = store_like(store, f"redis://127.0.0.1:{port}/0")
        with pytest.raises(SlotStoreUnavailableError):
            async with open_supervisor(config(closed)):
                pytest.fail("the block must not run")


# -- credentials -----------------------------------------------------------------------------

SECRET = "s3cr3t-Pa55"


async def add_user(client: coredis.Redis[str]) -> None:
    await client.acl_setuser("tv-user", "on", f">{SECRET}", "~*", "&*", "+@all")


async def test_credentials_never_show(
    store: RedisSlotStore,
    redis_server: RedisServer,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A password in the URL is in no repr, event, log record or error: not at start with
    a wrong password, not while the server restarts and refuses it, not in normal work."""
    caplog.set_level(logging.DEBUG)
    await add_user(client)
    url = f"redis://tv-user:{SECRET}@127.0.0.1:{redis_server.port}/0"
    secret_store = store_like(store, url)
    wrong = store_like(store, url.replace(SECRET, SECRET + "-wrong"), connect_timeout=0.5)
    with pytest.raises(SlotStoreUnavailableError) as error:
        async with open_supervisor(config(wrong)):
            pytest.fail("the block must not run")
    texts = [repr(secret_store), str(secret_store), repr(wrong), str(error.value)]
    texts.append(repr(error.value.__cause__) + repr(error.value.__context__))
    recorder = EventRecorder()
    async with open_supervisor(config(secret_store), subscribers=[recorder]) as sup:
        texts.append(repr(sup))
        assert (await sup.run_in_slot("s", trio.lowlevel.checkpoint)) is None
        redis_server.restart()  # the user is gone: every reconnection is refused
        await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as fresh:
            await add_user(fresh)
        await recorder.wait_for(EventKind.CONTROLLER_STORE_RECOVERED)
        info = await sup.cluster_slot("s")
        texts.append(repr(info))
    texts += [repr(event) for event in recorder.events]
    texts += [record.getMessage() for record in caplog.records]
    texts += [repr(record.args) for record in caplog.records]
    assert any("tv-user:***@" in text for text in texts)  # the masked URL is shown
    assert [text for text in texts if SECRET in text] == []


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await sink.aclose()


@contextlib.asynccontextmanager
async def tls_terminator(
    redis_server: RedisServer, tmp_path: pathlib.Path, name: str = "127.0.0.1"
) -> AsyncIterator[tuple[int, pathlib.Path, list[int]]]:
    """A TLS terminator in front of the test server (which has no TLS of its own), as a
    proxy would be, with a certificate for ``name`` from a CA of its own: yields its
    port, the CA's file and its connections' count (a one-item list)."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    connections = [0]

    async def terminate(stream: trio.SSLStream[trio.SocketStream]) -> None:
        connections[0] += 1
        upstream = await trio.open_tcp_stream("127.0.0.1", redis_server.port)
        async with stream, upstream, trio.open_nursery() as pumps:
            pumps.start_soon(_pump, stream, upstream)
            pumps.start_soon(_pump, upstream, stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_ssl_over_tcp, host="127.0.0.1"),
            terminate,
            0,
            server_context,
        )
        yield listeners[0].transport_listener.socket.getsockname()[1], ca_file, connections
        nursery.cancel_scope.cancel(reason="the test is over")


async def test_round_trips_and_grants_over_tls(
    store: RedisSlotStore, redis_server: RedisServer, tmp_path: pathlib.Path
) -> None:
    """``rediss://`` with a CA to verify: the store's round trips and its subscription
    (a grant pushed to the next owner's process) work over TLS."""
    async with tls_terminator(redis_server, tmp_path) as (port, ca_file, connections):
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca_file}&ssl_cert_reqs=required"
        tls = store_like(store, url, lease_ttl=30.0)  # renewals every 10 s
        gate = trio.Event()
        async with replica(tls) as (a, rec_a), replica(tls) as (b, _):
            owner = await a.submit(ControllerSpec.queue(gated(gate), slot="s"))
            await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
            after = await b.submit(ControllerSpec.queue(quick("next", 7), slot="s"))
            gate.set()
            with trio.fail_after(5):  # the pushed grant: no renewal for 10 s
                outcome = await after.wait()
            assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, 7)
        assert connections == [4]  # each supervisor: its round trips and its subscription


async def test_tls_checks_the_host_name_by_default(
    store: RedisSlotStore, redis_server: RedisServer, tmp_path: pathlib.Path
) -> None:
    """A certificate a trusted CA issued for another name is refused at start, saying
    so (coredis checked no host name: any certificate of a trusted CA passed, a
    man in the middle's too); ``ssl_check_hostname=false`` lets it pass."""
    async with tls_terminator(redis_server, tmp_path, "cache.example") as (port, ca_file, _):
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca_file}"
        error = await refused_start(store_like(store, url))
        assert "failed the TLS handshake: its certificate did not pass the checks" in str(error)
        assert "IP address mismatch" in str(error)
        unchecked = store_like(store, f"{url}&ssl_check_hostname=false")
        async with replica(unchecked) as (sup, _):
            assert await sup.cluster_slot("s") is None


async def test_a_tls_file_that_cannot_be_read_is_named(
    store: RedisSlotStore, redis_server: RedisServer, tmp_path: pathlib.Path
) -> None:
    """A CA file that is not there, or a client certificate that is not one, is named by
    its option at start, at once (it said "could not be reached" before, and a lone
    ``ssl_certfile`` was ignored)."""
    async with tls_terminator(redis_server, tmp_path) as (port, ca_file, _):
        base = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs="
        for query, option, cause in [
            (tmp_path / "missing.pem", "ssl_ca_certs", "FileNotFoundError"),
            (f"{ca_file}&ssl_certfile={ca_file}", "ssl_certfile", "SSLError"),
        ]:
            started = time.monotonic()
            error = await refused_start(store_like(store, f"{base}{query}"))
            assert time.monotonic() - started < 1.0
            said = f"could not load the file of its url option {option!r}: TLSFileError: {option}="
            assert said in str(error)
            assert f"({cause}: " in str(error)


# -- wait-mode work ------------------------------------------------------------------------------


async def test_wait_mode_work_is_held_for_cluster_queue_room(store: RedisSlotStore) -> None:
    """``max_slot_queue`` bounds the cluster-wide queue: with it full, wait=False work is
    rejected QUEUE_FULL and wait=True work is held, then placed when an entry leaves."""
    gate_a, gate_b = trio.Event(), trio.Event()
    async with replica(store, max_slot_queue=1) as (a, rec_a), replica(store) as (b, rec_b):
        owner = await a.submit(ControllerSpec.queue(gated(gate_a), slot="s"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="s")
        queued = await b.submit(ControllerSpec.queue(gated(gate_b, "b"), slot="s"))
        await rec_b.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=queued.id)
        full = await a.submit(ControllerSpec.queue(quick("full"), slot="s"))
        assert (await full.wait()).rejection is RejectionKind.QUEUE_FULL
        held = await a.submit(ControllerSpec.queue(quick("held", "a"), slot="s", wait=True))
        await rec_a.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=held.id, reason="held")
        view = a.controller_snapshot().slot("s")
        assert view is not None
        assert (view.status, view.waiting, view.queue_depth) == (SlotStatus.RUNNING, 1, 0)
        gate_a.set()  # B's entry leaves the queue to own the slot: room for the held work
        await rec_a.wait_for(
            EventKind.CONTROLLER_SUBMITTED, task_id=held.id, reason="queued in the cluster"
        )
        info = await a.cluster_slot("s")
        assert info is not None
        assert (info.holder, info.queue_depth) == (b.instance_id, 1)
        gate_b.set()
        assert (await held.wait()).value == "a"
        assert (await owner.wait()).kind is OutcomeKind.COMPLETED
        assert (await queued.wait()).value == "b"


async def test_held_work_of_one_process_runs_in_order_as_room_appears(
    store: RedisSlotStore,
) -> None:
    """Three wait=True submissions held behind a full cluster queue all run, in their
    order, as entries leave it (each room report wakes the process once)."""
    gate_owner, gate_queued = trio.Event(), trio.Event()
    async with replica(store, max_slot_queue=1) as (a, rec_a), replica(store) as (b, rec_b):
        owner = await b.submit(ControllerSpec.queue(gated(gate_owner), slot="s"))
        await rec_b.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        queued = await b.submit(ControllerSpec.queue(gated(gate_queued), slot="s"))
        await rec_b.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=queued.id)
        held = []
        for i in range(3):
            spec = ControllerSpec.queue(quick(f"h{i}", i), slot="s", wait=True)
            held.append(await a.submit(spec))
            await rec_a.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=held[i].id)
        gate_owner.set()
        gate_queued.set()
        assert [(await w.wait()).value for w in held] == [0, 1, 2]
        # (the subscriber may get the events after the waiters resolve)
        starts = [
            (await rec_a.wait_for(EventKind.ATTEMPT_STARTING, task_id=w.id)).seq for w in held
        ]
        assert starts == sorted(starts)


async def test_wait_mode_work_is_held_through_an_outage(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """While the server is down, wait=False work is rejected STORE_UNAVAILABLE (JOIN too)
    and wait=True work is held; once it is back, the held work runs, all of it."""
    async with replica(store) as (sup, recorder):
        redis_server.stop()
        await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        rejected = await sup.submit(ControllerSpec.queue(quick("now"), slot="s"))
        joiner = await sup.submit(ControllerSpec.join(quick("join"), slot="s"))
        held = await sup.submit(ControllerSpec.queue(quick("later", 7), slot="s", wait=True))
        second = await sup.submit(ControllerSpec.queue(quick("after", 8), slot="s", wait=True))
        assert (await rejected.wait()).rejection is RejectionKind.STORE_UNAVAILABLE
        assert (await joiner.wait()).rejection is RejectionKind.STORE_UNAVAILABLE
        await recorder.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=held.id, reason="held")
        view = sup.controller_snapshot().slot("s")
        assert view is not None
        assert (view.status, view.waiting) == (SlotStatus.REMOTE, 2)
        redis_server.start()
        outcome = await held.wait()
        assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, 7)
        assert (await second.wait()).value == 8  # the slot's next held work is asked too
        assert len(recorder.of(EventKind.CONTROLLER_STORE_RECOVERED)) == 1


async def test_replicas_with_different_lease_ttls_never_overlap(store: RedisSlotStore) -> None:
    """A rolling change of ``lease_ttl``: replicas of 1 s and of 10 s share a slot. When
    one of 1 s hands the slot to one of 10 s, the lease lasts 10 s on the server too, so
    the next replica in line waits for the owner's exit. (The lease used to last the
    releaser's 1 s: the third replica took the slot 1 s later while the owner still ran,
    and the owner ended LEASE_LOST at its next renewal.)"""
    running: set[str] = set()
    overlaps: list[set[str]] = []

    def hold(name: str, seconds: float) -> TaskSpec:
        async def body() -> None:
            if running:
                overlaps.append({*running, name})
            running.add(name)
            try:
                await trio.sleep(seconds)
            finally:
                running.discard(name)

        return TaskSpec.once(name, body)

    short, long = store_like(store, lease_ttl=1.0), store_like(store, lease_ttl=10.0)
    async with replica(short) as (a, _), replica(long) as (b, _), replica(short) as (c, _):
        waiters = [await a.submit(ControllerSpec.queue(hold("a", 0.2), slot="s"))]
        for sup, name, seconds in ((b, "b", 1.5), (c, "c", 0.1)):
            await waiters[-1].wait_placed()
            waiters.append(await sup.submit(ControllerSpec.queue(hold(name, seconds), slot="s")))
        with trio.fail_after(2 * (0.2 + 1.5 + 0.1)):
            outcomes = [await w.wait() for w in waiters]
    assert [o.kind for o in outcomes] == [OutcomeKind.COMPLETED] * 3
    assert overlaps == []


@pytest.mark.parametrize("wait", [False, True])
async def test_an_error_reply_to_a_submit_rejects_it_with_the_error(
    store: RedisSlotStore, client: coredis.Redis[str], wait: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The server answers a submit with an error (here foreign data: the slot's fence
    key is a list): the work ends REJECTED(STORE_UNAVAILABLE) at once with the server's
    error as its reason, wait=True work too (it used to be held until a recovery that
    never came, for no outage began), and the error is logged once. Other slots work on."""
    await client.rpush(f"{store.key_prefix}fence:foreign", ["not a token"])
    async with replica(store) as (sup, recorder):
        spec = ControllerSpec.queue(quick("foreign"), slot="foreign", wait=wait)
        with trio.fail_after(2 * store.connect_timeout):
            outcome = await (await sup.submit(spec)).wait()
        assert outcome.rejection is RejectionKind.STORE_UNAVAILABLE
        assert outcome.reason is not None
        assert outcome.reason.startswith("slot store call failed: WrongTypeError: ")
        rejected = await recorder.wait_for(EventKind.CONTROLLER_REJECTED)
        assert rejected.reason == outcome.reason
        other = await sup.submit(ControllerSpec.queue(quick("other", 1), slot="other"))
        assert (await other.wait()).value == 1
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.getMessage().startswith("slot store call failed (_Submit): WrongTypeError: ")


async def owners_and_one_queued(
    sup: Supervisor, recorder: EventRecorder, gates: dict[str, trio.Event]
) -> tuple[dict[str, TaskWaiter[Any]], TaskWaiter[Any]]:
    """An owner of slots ``a`` and ``b`` (each ends with its slot's name once its gate
    is set), and an entry queued behind ``a``'s owner, placed."""
    owners = {
        slot: await sup.submit(ControllerSpec.queue(gated(gate, slot), slot=slot))
        for slot, gate in gates.items()
    }
    queued = await sup.submit(ControllerSpec.queue(quick("queued"), slot="a", wait=True))
    with trio.fail_after(5):
        await queued.wait_placed()
        await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, slot="b")
    return owners, queued


async def refused_for_foreign_data(
    waiter: TaskWaiter[Any], store: RedisSlotStore, said: str
) -> TaskOutcome[Any]:
    """``waiter``'s outcome, within two ``lease_ttl``: REJECTED(STORE_UNAVAILABLE),
    its reason naming foreign data at ``said`` (a key after the prefix, and more)."""
    with trio.fail_after(2 * store.lease_ttl):
        rejected = await waiter.wait()
    assert rejected.rejection is RejectionKind.STORE_UNAVAILABLE
    assert rejected.reason is not None
    assert rejected.reason.startswith(f"foreign data in the slot store at {store.key_prefix}{said}")
    return rejected


@pytest.mark.parametrize("key", ["lease", "q"])
async def test_foreign_data_at_a_slots_key_refuses_that_slots_renewal_only(
    store: RedisSlotStore, client: coredis.Redis[str], key: str
) -> None:
    """Foreign data (a string) at slot ``a``'s lease or queue key, while ``a`` has an
    owner and an entry queued behind it and slot ``b`` an owner: the renewal refuses
    ``a``'s items only, naming the key and the server's error: the queued entry is
    REJECTED(STORE_UNAVAILABLE), and the owner (for the lease key) ends LEASE_LOST. No
    outage: ``b``'s owner keeps its lease past ``lease_ttl`` and new work runs. Before,
    the whole renewal script failed, the process's store went unavailable, and ``b``'s
    owner ended LEASE_LOST."""
    gates = {slot: trio.Event() for slot in "ab"}
    async with replica(store) as (sup, recorder):
        owners, queued = await owners_and_one_queued(sup, recorder, gates)
        await client.set(f"{store.key_prefix}{key}:a", "foreign")
        rejected = await refused_for_foreign_data(queued, store, f"{key}:a: ")
        if key == "lease":
            with trio.fail_after(2 * store.lease_ttl):
                lost = await owners["a"].wait()
            assert lost.kind is OutcomeKind.LEASE_LOST
            assert lost.reason == f"lease refused: {rejected.reason}"
            assert "WRONGTYPE" in lost.reason
        await trio.sleep(store.lease_ttl)  # observing b's lease over a lease_ttl, not settling
        new = await sup.submit(ControllerSpec.queue(quick("new", 1), slot="c"))
        with trio.fail_after(5):
            assert (await new.wait()).value == 1
        assert not owners["b"].done
        gates["b"].set()
        with trio.fail_after(5):
            assert (await owners["b"].wait()).value == "b"
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([f"{store.key_prefix}{key}:a"])
        gates["a"].set()


async def test_a_queued_entry_refused_for_a_foreign_lease_key_leaves_the_queue(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Foreign data (a string) at slot ``a``'s lease key while an entry waits in ``a``'s
    queue behind its owner: the renewal refuses the entry (REJECTED(STORE_UNAVAILABLE)
    naming the key), and the keeper withdraws it, a withdrawal that reads the key as
    none: the entry leaves the server's queue, marked gone (naming the key: its joiners
    end as it did), the withdrawal is sent
    once (no failed call after it, a renewal per ``lease_ttl / 3``), and it names the
    key in one ERROR record. Before, the entry was not withdrawn (its withdrawal failed
    on the key), and stayed in the server's queue while its process lived."""
    gates = {slot: trio.Event() for slot in "ab"}
    prefix = store.key_prefix
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    async with replica(store) as (sup, recorder):
        _, queued = await owners_and_one_queued(sup, recorder, gates)
        (eid,) = await client.lrange(f"{prefix}q:a", 0, -1)
        await client.set(f"{prefix}lease:a", "foreign")
        rejected = await refused_for_foreign_data(queued, store, "lease:a: WRONGTYPE")
        said = "slot store withdraw of slot 'a' read as none: foreign data in the slot store "
        said += f"at {prefix}lease:a: WRONGTYPE"
        await logged_at_once(caplog, said, store.lease_ttl)
        assert await client.lrange(f"{prefix}q:a", 0, -1) == []
        # (the marker names the key: a joiner of the entry ends as the entry did)
        assert await client.get(f"{prefix}gone:{eid}") == f"store_unavailable: {rejected.reason}"
        calls, failed = await script_calls(client)
        await trio.sleep(store.lease_ttl)  # observing the calls over a lease_ttl
        now_calls, now_failed = await script_calls(client)
        assert now_failed == failed
        assert now_calls - calls <= 5  # the renewals, 3 per lease_ttl
        assert len([r for r in caplog.records if said in r.getMessage()]) == 1
        assert not [r for r in caplog.records if "withdrawal of" in r.getMessage()]
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([f"{prefix}lease:a"])
        gates["a"].set()
        gates["b"].set()


async def script_calls(client: coredis.Redis[str]) -> tuple[int, int]:
    """The server's script calls so far, and how many of them failed."""
    stats = (await client.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("failed_calls", 0))


async def test_a_queued_entry_whose_grant_meets_foreign_data_is_refused_once(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """Foreign data (a list) at slot ``a``'s fence key while ``a``'s owner runs and an
    entry waits behind it: the owner's release fails at the hand-over (the head stays
    queued), and the head's own claim refuses it: its work ends
    REJECTED(STORE_UNAVAILABLE) naming the key, within a renewal or two, the entry is out
    of the server's queue, and no call is sent for it again (no failed call, a renewal
    per ``lease_ttl / 3``). Before, the claim failed at each renewal (one failed call
    and one ERROR record per ``lease_ttl / 3``) for as long as the process lived, and
    the work was never answered."""
    gates = {slot: trio.Event() for slot in "ab"}
    prefix = store.key_prefix
    async with replica(store) as (sup, recorder):
        owners, queued = await owners_and_one_queued(sup, recorder, gates)
        await client.delete([f"{prefix}fence:a"])
        await client.rpush(f"{prefix}fence:a", ["foreign"])
        gates["a"].set()
        with trio.fail_after(5):
            assert (await owners["a"].wait()).value == "a"
        await refused_for_foreign_data(queued, store, "fence:a: WRONGTYPE")
        assert await client.lrange(f"{prefix}q:a", 0, -1) == []
        calls, failed = await script_calls(client)
        await trio.sleep(store.lease_ttl)  # observing the calls over a lease_ttl
        now_calls, now_failed = await script_calls(client)
        assert now_failed == failed
        assert now_calls - calls <= 5  # the renewals, 3 per lease_ttl
        assert not owners["b"].done
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([f"{prefix}fence:a"])
        gates["b"].set()


async def test_foreign_data_at_an_entrys_gone_key_refuses_that_entry_only(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """Foreign data (a list) at a queued entry's ``gone`` key, once the entry left its
    queue (data the server lost: the renewal reads the marker before it queues the
    entry again), while slot ``b`` has an owner: the renewal refuses that entry only,
    REJECTED(STORE_UNAVAILABLE) naming the key and the server's error. No outage: ``b``'s
    owner keeps its lease past ``lease_ttl``. Before, the whole renewal failed, the
    process's store went unavailable, and ``b``'s owner ended LEASE_LOST."""
    gates = {slot: trio.Event() for slot in "ab"}
    prefix = store.key_prefix
    async with replica(store) as (sup, recorder):
        owners, queued = await owners_and_one_queued(sup, recorder, gates)
        (entry,) = await client.lrange(f"{prefix}q:a", 0, -1)
        await client.rpush(f"{prefix}gone:{entry}", ["foreign"])  # then out of its queue
        await client.lrem(f"{prefix}q:a", 0, entry)
        await refused_for_foreign_data(queued, store, f"gone:{entry}: WRONGTYPE")
        await trio.sleep(store.lease_ttl)  # observing the leases over a lease_ttl
        assert not owners["a"].done
        assert not owners["b"].done
        for gate in gates.values():
            gate.set()
        with trio.fail_after(5):
            assert [(await owners[slot].wait()).value for slot in "ab"] == ["a", "b"]
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([f"{prefix}gone:{entry}"])


@pytest.mark.parametrize("key", ["out", "jn"])
async def test_foreign_data_at_a_followed_entrys_key_refuses_that_follow_only(
    store: RedisSlotStore, client: coredis.Redis[str], key: str
) -> None:
    """Foreign data (a list) at the ``out`` or ``jn`` key of work that another process
    owns and this one follows (a JOIN), while this process owns slot ``b``: its renewal
    refuses that follow only: the joiner ends REJECTED(STORE_UNAVAILABLE) naming the key
    and the server's error, as a JOIN whose submit the server answered with an error
    does. No outage: ``b``'s owner keeps its lease past ``lease_ttl``, and the followed
    work runs on. Before, the whole renewal failed, the process's store went
    unavailable, and ``b``'s owner ended LEASE_LOST."""
    gate_a, gate_b = trio.Event(), trio.Event()
    prefix = store.key_prefix
    async with replica(store) as (a, rec_a), replica(store) as (b, rec_b):
        followed = await a.submit(ControllerSpec.queue(gated(gate_a, "a"), slot="a"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=followed.id)
        owner = await b.submit(ControllerSpec.queue(gated(gate_b, "b"), slot="b"))
        await rec_b.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        joiner = await b.submit(ControllerSpec.join(quick("j"), slot="a"))
        with trio.fail_after(5):
            await joiner.wait_placed()
        entry = await client.hget(f"{prefix}lease:a", "entry")
        foreign = f"{prefix}{key}:{entry}"
        await client.delete([foreign])
        await client.rpush(foreign, ["foreign"])
        await refused_for_foreign_data(joiner, store, f"{key}:{entry}: WRONGTYPE")
        await trio.sleep(store.lease_ttl)  # observing the leases over a lease_ttl
        assert not owner.done
        assert not followed.done
        await client.delete([foreign])
        gate_a.set()
        gate_b.set()
        with trio.fail_after(5):
            assert (await owner.wait()).value == "b"
            assert (await followed.wait()).value == "a"
        assert not rec_b.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)


@pytest.mark.parametrize("key", ["lease", "q"])
async def test_a_joiner_of_work_refused_for_foreign_data_ends_as_that_work(
    store: RedisSlotStore, client: coredis.Redis[str], key: str
) -> None:
    """Foreign data (a string) at slot ``a``'s lease key while another process's owner
    holds it, or at its queue key while that process's entry waits there, and this
    process follows that work (a JOIN): the joiner ends as the followed work does, for
    the same cause: LEASE_LOST ("lease refused: foreign data ...") for the owner,
    REJECTED(STORE_UNAVAILABLE) naming the queue key for the queued entry. Before, it
    ended LEASE_LOST "followed work lost" two renewals later, naming no cause."""
    gate = trio.Event()
    prefix = store.key_prefix
    async with replica(store) as (a, rec_a), replica(store) as (b, _):
        owner = await a.submit(ControllerSpec.queue(gated(gate, "a"), slot="a"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        followed = owner
        if key == "q":
            followed = await a.submit(ControllerSpec.queue(quick("queued"), slot="a"))
            with trio.fail_after(5):
                await followed.wait_placed()
        joiner = await b.submit(ControllerSpec.join(quick("j"), slot="a"))
        with trio.fail_after(5):
            await joiner.wait_placed()
        await client.set(f"{prefix}{key}:a", "foreign")
        with trio.fail_after(2 * store.lease_ttl):
            expected = await followed.wait()
            joined = await joiner.wait()
        assert expected.reason is not None
        assert f"foreign data in the slot store at {prefix}{key}:a: WRONGTYPE" in expected.reason
        if key == "lease":
            assert expected.kind is OutcomeKind.LEASE_LOST
        else:
            assert expected.rejection is RejectionKind.STORE_UNAVAILABLE
        assert (joined.kind, joined.rejection, joined.reason) == (
            expected.kind,
            expected.rejection,
            expected.reason,
        )
        await client.delete([f"{prefix}{key}:a"])
        gate.set()


async def test_a_release_on_a_foreign_lease_key_tells_the_joiners_at_once(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Foreign data (a string) at slot ``a``'s lease key while this process's owner
    holds it and another process (renewing every 3.3 s) follows that work: the owner's
    renewal refuses the lease (LEASE_LOST, "lease refused: foreign data ..."), and its
    release, refused for the lease key too (logged naming it), still gives the joiner
    that outcome at once, for the same cause. Before, the release failed on the key,
    and the joiner learnt of the loss only at its own next renewal."""
    prefix = store.key_prefix
    async with replica(store) as (a, rec_a), replica(store_like(store, lease_ttl=10.0)) as (b, _):
        owner = await a.submit(ControllerSpec.queue(TaskSpec.once("o", until_cancelled), slot="a"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        joiner = await b.submit(ControllerSpec.join(quick("j"), slot="a"))
        with trio.fail_after(5):
            await joiner.wait_placed()
        await client.set(f"{prefix}lease:a", "foreign")
        with trio.fail_after(2 * store.lease_ttl):
            lost = await owner.wait()
        assert lost.kind is OutcomeKind.LEASE_LOST
        assert lost.reason is not None
        assert lost.reason.startswith(f"lease refused: foreign data in the slot store at {prefix}")
        with trio.fail_after(1.0):  # a push, well before b's next renewal
            joined = await joiner.wait()
        assert (joined.kind, joined.reason) == (lost.kind, lost.reason)
        await logged_at_once(
            caplog, f"refused: foreign data in the slot store at {prefix}lease:a", 0
        )
        assert not error_logged(caplog, "slot store call failed")
        await client.delete([f"{prefix}lease:a"])


def error_logged(caplog: pytest.LogCaptureFixture, said: str) -> bool:
    """Whether an ERROR record's message holds ``said``."""
    return any(said in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


async def logged_at_once(caplog: pytest.LogCaptureFixture, said: str, within: float) -> None:
    """Wait (up to ``within`` seconds) for an ERROR record whose message holds ``said``."""
    with trio.fail_after(within):
        while not error_logged(caplog, said):  # noqa: ASYNC110 (no event for a log record)
            await trio.sleep(0.01)


@pytest.mark.parametrize("read", ["prune", "follow", "watch"])
async def test_foreign_data_no_item_owns_is_read_as_none_and_logged(
    store: RedisSlotStore,
    client: coredis.Redis[str],
    caplog: pytest.LogCaptureFixture,
    read: str,
) -> None:
    """Foreign data (a list, or a string) that the renewal reads but no item of its
    process owns: another process's heartbeat key, met where the renewal prunes a queue
    (``prune``) or follows that process's work (``follow``), and a slot's watch key when
    a prune tells the watchers (``watch``). The renewal reads it as none and goes on,
    logging the key at ERROR: a process whose heartbeat is foreign data counts as gone
    (its queued entry is pruned, and this entry behind it takes the lease; the joiner of
    its work ends LEASE_LOST as one of lost work), and nobody is told of the room. No
    outage: this process's owner of ``b`` keeps its lease. Before, the whole renewal
    failed, every renewal: an outage, and ``b``'s owner ended LEASE_LOST."""
    prefix, ms = store.key_prefix, 60_000
    gate = trio.Event()
    async with replica(store) as (sup, recorder):
        owner = await sup.submit(ControllerSpec.queue(gated(gate, "b"), slot="b"))
        await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        # another process, x, holds slot a's lease and queues x/1 (and y/1) behind it
        for i in "xy":
            await client.set(f"{prefix}hb:{i}", str(ms), px=ms)
        await client.hset(f"{prefix}lease:a", {"entry": "x/0", "token": "1"})
        await client.pexpire(f"{prefix}lease:a", ms)
        await client.rpush(f"{prefix}q:a", ["x/1", "y/1"] if read == "watch" else ["x/1"])
        if read == "follow":
            waiter = await sup.submit(ControllerSpec.join(quick("j"), slot="a"))
        else:
            waiter = await sup.submit(ControllerSpec.queue(quick("q", 1), slot="a"))
        with trio.fail_after(5):
            await waiter.wait_placed()
        await client.delete([f"{prefix}hb:x"])
        if read == "watch":  # x is gone, and y/1 heads the queue
            await client.delete([f"{prefix}lease:a"])
            await client.set(f"{prefix}watch:a", "foreign")
            await logged_at_once(caplog, f"{prefix}watch:a: WRONGTYPE", 2 * store.lease_ttl)
            (mine,) = [e for e in await client.lrange(f"{prefix}q:a", 0, -1) if e != "y/1"]
            assert await client.lrange(f"{prefix}q:a", 0, -1) == ["y/1", mine]
        else:
            await client.rpush(f"{prefix}hb:x", ["foreign"])
            if read == "prune":  # the lease is free: the renewal prunes the queue
                await client.delete([f"{prefix}lease:a"])
            with trio.fail_after(3 * store.lease_ttl):
                outcome = await waiter.wait()
            if read == "prune":
                assert outcome.value == 1
            else:
                assert outcome.kind is OutcomeKind.LEASE_LOST
                assert outcome.reason == "followed work lost: x"
            await logged_at_once(caplog, f"{prefix}hb:x: WRONGTYPE", 0)
        await trio.sleep(store.lease_ttl)  # observing b's lease over a lease_ttl
        assert not owner.done
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([f"{prefix}{key}" for key in ("hb:x", "hb:y", "watch:a", "q:a")])
        gate.set()
        with trio.fail_after(5):
            assert (await owner.wait()).value == "b"


async def test_a_submit_reads_another_process_heartbeat_of_foreign_data_as_none(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Another process, x, holds slot ``a``'s lease and has an entry queued there when
    its heartbeat key is overwritten with a list: a submit to ``a`` prunes the queue,
    reads it as none (x/1 counts as gone, pruned) and queues this work, logging the key
    at ERROR. Before, the submit failed: the work was rejected with the server's error."""
    prefix, ms = store.key_prefix, 60_000
    async with replica(store) as (sup, recorder):
        await client.hset(f"{prefix}lease:a", {"entry": "x/0", "token": "1"})
        await client.pexpire(f"{prefix}lease:a", ms)
        await client.rpush(f"{prefix}q:a", ["x/1"])
        await client.rpush(f"{prefix}hb:x", ["foreign"])
        waiter = await sup.submit(ControllerSpec.queue(quick("q", 1), slot="a"))
        with trio.fail_after(5):
            await waiter.wait_placed()
        assert not waiter.done
        (mine,) = await client.lrange(f"{prefix}q:a", 0, -1)
        assert mine != "x/1"
        await logged_at_once(caplog, "submit of slot 'a' read as none: foreign data in", 0)
        await logged_at_once(caplog, f"{prefix}hb:x: WRONGTYPE", 0)
        await client.delete([f"{prefix}lease:a"])  # its renewal claims the free lease
        with trio.fail_after(3 * store.lease_ttl):
            assert (await waiter.wait()).value == 1
        assert not recorder.of(EventKind.CONTROLLER_STORE_UNAVAILABLE)
        await client.delete([f"{prefix}hb:x"])


async def test_shutdown_is_bounded_when_the_server_does_not_answer(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server hangs (SIGSTOP) while an owner runs and work is queued: leaving the
    block still ends within grace + connect_timeout (plus the subscriber drain)."""
    quick_store = store_like(store, connect_timeout=0.5)
    gate = trio.Event()
    async with replica(quick_store) as (other, _):
        await other.submit(ControllerSpec.queue(gated(gate), slot="q"))
        started = 0.0
        async with replica(quick_store) as (sup, recorder):
            owner = await sup.submit(
                ControllerSpec.queue(TaskSpec.once("o", until_cancelled), slot="s")
            )
            await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
            queued = await sup.submit(ControllerSpec.queue(quick("queued"), slot="q"))
            await recorder.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=queued.id)
            redis_server.pause()
            started = time.monotonic()
        elapsed = time.monotonic() - started
        assert elapsed < 2 * (1.0 + 0.5)  # grace + connect_timeout, 2x margin
        assert (await owner.wait()).kind is OutcomeKind.CANCELLED
        assert (await queued.wait()).rejection is RejectionKind.SHUTTING_DOWN
        redis_server.resume()
        gate.set()


@pytest.mark.parametrize("known", [False, True])
async def test_a_shutdown_that_waits_for_the_server_says_so(
    store: RedisSlotStore,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    known: bool,
) -> None:
    """The shutdown waits up to ``connect_timeout`` for the server to take back the
    owner's lease: a WARNING says so as the wait begins when the outage is known, and
    names what was not taken back when the wait ends unanswered. Before, the process
    took ``connect_timeout`` to leave without a word."""
    quick_store = store_like(store, connect_timeout=0.5)
    async with replica(quick_store) as (sup, recorder):
        owner = await sup.submit(
            ControllerSpec.queue(TaskSpec.once("o", until_cancelled), slot="s")
        )
        await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        redis_server.pause()
        if known:
            with trio.fail_after(2 * (TTL / 3 + 0.5)):  # the next renewal's bound
                await recorder.wait_for(EventKind.CONTROLLER_STORE_UNAVAILABLE)
    redis_server.resume()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    url = quick_store.safe_url
    waits = (
        f"slot store {url} is unavailable: the shutdown waits up to 0.5 s (connect_timeout) "
        "for it to take back the leases and units of this process; what it does not take "
        "back expires within lease_ttl"
    )
    gave_up = (
        f"slot store {url} did not take back the leases and units of this process within "
        "0.5 s (connect_timeout) of the shutdown: they expire within lease_ttl"
    )
    assert (waits in lines, gave_up in lines) == (known, True)


async def test_cluster_slot_raises_when_the_server_does_not_answer(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """``cluster_slot`` raises ``SlotStoreUnavailableError`` after ``connect_timeout``."""
    async with replica(store_like(store, connect_timeout=0.5)) as (sup, _):
        redis_server.pause()
        started = time.monotonic()
        with pytest.raises(SlotStoreUnavailableError, match=r"did not answer within 0\.5 s"):
            await sup.cluster_slot("s")
        assert time.monotonic() - started < 2 * 0.5
        redis_server.resume()


# -- entries a live process no longer knows ---------------------------------------------------


@pytest.mark.parametrize("who", ["its own process", "another process"])
async def test_an_entry_its_live_process_no_longer_knows_frees_its_slot(
    store: RedisSlotStore, client: coredis.Redis[str], who: str
) -> None:
    """A failover that lost a hand-over (or a restart from an older copy) leaves the
    queue's head an entry whose process is alive but no longer knows it, with the lease
    free. The next submit hands the lease to that head, as a release would, and its
    process, told of a grant for an entry it does not know, gives it back: the work
    behind runs at once. Before, only the head's own claim could take the free lease,
    which never came: the slot stayed blocked for every replica while that process
    lived (its heartbeat kept the entry live)."""
    prefix = f"tv:{{{store.namespace}}}:"
    async with replica(store) as (a, _), replica(store) as (b, rec_b):
        orphan = f"{a.instance_id}/999999"  # of no task of a's
        await client.rpush(f"{prefix}q:s", [orphan])
        submitter = a if who == "its own process" else b
        start = time.monotonic()
        with trio.fail_after(4 * TTL):  # before: never (a lives on)
            waiter = await submitter.submit(ControllerSpec.queue(quick("behind", 7), slot="s"))
            assert (await waiter.wait()).value == 7
        assert time.monotonic() - start < 2 * TTL
        assert await client.lrange(f"{prefix}q:s", 0, -1) == []
        assert await client.get(f"{prefix}gone:{orphan}") == "store_unavailable"
        assert not rec_b.of(EventKind.CONTROLLER_LEASE_LOST)


# -- a cancelled acquisition --------------------------------------------------------------------


async def test_caller_cancelled_while_the_server_is_paused_leaves_no_lease(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """The server takes the acquisition only after the caller left: the lease it grants is
    given back at once, so another process's work starts well before the lease TTL."""
    async with replica(store) as (a, _), replica(store) as (b, _):
        redis_server.pause()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.run_in_slot, "s", until_cancelled)
            await trio.testing.wait_all_tasks_blocked()  # the request is on the wire
            nursery.cancel_scope.cancel(reason="the caller gives up")
        redis_server.resume()
        resumed = time.monotonic()
        assert (await b.run_in_slot("s", trio.lowlevel.checkpoint)) is None
        assert time.monotonic() - resumed < TTL / 2
        # B's keeper sends its release before this query (the owner's exit requested it)
        assert await b.cluster_slot("s") is None


@pytest.mark.parametrize("queued", [False, True])
async def test_a_grant_too_late_to_trust_is_confirmed_before_its_work_starts(
    store: RedisSlotStore, redis_server: RedisServer, queued: bool
) -> None:
    """The server pauses (SIGSTOP; or ``CLIENT PAUSE``) while a submission is on the wire,
    for longer than a lease may go unconfirmed (``0.8 * lease_ttl``), and then grants it:
    a lease counts from its request's sending, so that grant is already as good as lost.
    Its work waits for a claim to confirm it, then runs and completes (it ended
    ``LEASE_LOST`` before, without ever starting). ``queued``: the grant comes from a
    renewal that finds the entry at the head (its owner was released meanwhile)."""
    gate = trio.Event()
    async with replica(store) as (sup, _), replica(store) as (other, recorder):
        if queued:
            owner = await other.submit(ControllerSpec.queue(gated(gate), slot="s"))
            await recorder.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        redis_server.pause()
        waiter = await sup.submit(ControllerSpec.queue(quick("late", 7), slot="s"))
        await trio.sleep(1.5 * TTL)  # real time, past 0.8 * TTL (and under connect_timeout)
        if queued:
            gate.set()
        redis_server.resume()
        with trio.fail_after(2 * 2.0):  # a claim, within connect_timeout, 2x margin
            outcome = await waiter.wait()
        assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, 7), outcome.reason


async def test_restarting_owner_keeps_its_lease_and_token(store: RedisSlotStore) -> None:
    """A restartable owner keeps one lease (one token) for all its attempts: another
    process's work waits for the task's end, not for an attempt's."""
    tokens: list[int | None] = []

    async def flaky() -> str:
        tokens.append(current_context().fence_token)
        if len(tokens) < 3:
            raise ConnectionError("upstream unavailable")
        return "done"

    spec = TaskSpec.restartable("flaky", flaky, backoff=BackoffPolicy.constant(0.05))
    async with replica(store) as (a, rec_a), replica(store) as (b, rec_b):
        owner = await a.submit(ControllerSpec.queue(spec, slot="s"))
        await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        follower = await b.submit(ControllerSpec.queue(quick("after"), slot="s"))
        assert (await owner.wait()).value == "done"
        await follower.wait()
        acquired = rec_b.of(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=follower.id)
    assert len(tokens) == 3
    assert len(set(tokens)) == 1
    assert acquired[0].fence_token > tokens[0]


# -- observing -------------------------------------------------------------------------------------


async def test_remote_owner_shows_as_remote_and_in_cluster_slot(store: RedisSlotStore) -> None:
    """Work queued behind another process's owner: REMOTE locally, the owner's instance,
    token and lease in ``cluster_slot``; DROP_IF_RUNNING is rejected SLOT_BUSY."""
    gate = trio.Event()
    async with replica(store) as (a, rec_a), replica(store) as (b, rec_b):
        owner = await a.submit(ControllerSpec.queue(gated(gate), slot="s"))
        acquired = await rec_a.wait_for(EventKind.CONTROLLER_LEASE_ACQUIRED, task_id=owner.id)
        queued = await b.submit(ControllerSpec.queue(quick("next"), slot="s"))
        await rec_b.wait_for(EventKind.CONTROLLER_SUBMITTED, task_id=queued.id)
        dropped = await b.submit(ControllerSpec.drop_if_running(quick("drop"), slot="s"))
        assert (await dropped.wait()).rejection is RejectionKind.SLOT_BUSY
        view = b.controller_snapshot().slot("s")
        assert view is not None
        assert (view.status, view.owner_id, view.queue_depth, view.fence_token) == (
            SlotStatus.REMOTE,
            None,
            1,
            None,
        )
        mine = a.controller_snapshot().slot("s")
        assert mine is not None
        assert (mine.status, mine.fence_token) == (SlotStatus.RUNNING, acquired.fence_token)
        info = await b.cluster_slot("s")
        assert info is not None
        assert (info.holder, info.fence_token, info.queue_depth) == (
            a.instance_id,
            acquired.fence_token,
            1,
        )
        assert info.lease_remaining is not None
        assert 0 < info.lease_remaining <= TTL
        gate.set()
        await queued.wait()
