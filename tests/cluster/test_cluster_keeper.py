"""The lease keeper end to end: real server, real clock, fake controllers reading reports.

Timing bounds are liveness bounds with at least a 2x margin: the exact timing rule (the
lost-lease rule, ``LeaseDeadline``) is pure and property-tested in ``test_cluster_values.py``.
Waits are for reports or keys, never sleeps.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Generic, TypeVar, cast

import coredis
import pytest
import trio
import trio.testing
from cluster_helpers import Inbox, Running, Scripts, entry, open_inboxes, open_keeper
from conftest import RedisServer
from hypothesis import given
from hypothesis import strategies as st

from trio_taskvisor import OutcomeKind, RejectionKind, TaskOutcome
from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore
from trio_taskvisor._exceptions import SlotStoreUnavailableError
from trio_taskvisor._keeper import (
    Call,
    Connection,
    FollowedOutcome,
    Full,
    Joined,
    LeaseKeeper,
    LeaseLost,
    Owner,
    Queued,
    Rejected,
    RemoteStop,
    Report,
    Room,
    StoreRecovered,
    StoreUnavailable,
)
from trio_taskvisor._redis_client import (
    RedisClient,
    _head,
    _info_field,
    _online_replicas,
    _packed,
    _Wire,
)
from trio_taskvisor._slots import AdmissionPolicy

A, B, C = "keeper-a:1:0000000a", "keeper-b:2:0000000b", "keeper-c:3:0000000c"
QUEUE, REPLACE, JOIN = AdmissionPolicy.QUEUE, AdmissionPolicy.REPLACE, AdmissionPolicy.JOIN
DONE = TaskOutcome(OutcomeKind.COMPLETED, value={"rows": [1, 2]})


def with_ttl(
    store: RedisSlotStore, lease_ttl: float, connect_timeout: float = 1.0
) -> RedisSlotStore:
    return RedisSlotStore(
        store.url, namespace=store.namespace, lease_ttl=lease_ttl, connect_timeout=connect_timeout
    )


async def test_submit_on_an_idle_slot_reports_owner(store: RedisSlotStore) -> None:
    """The first submission of an idle slot is its owner, with a fence token."""
    async with open_keeper(store, A) as a:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        owner = await a.reports.wait_for(Owner)
        assert (owner.slot, owner.task_id) == ("k", 1)
        info = await a.keeper.query("k")
        assert info is not None
        assert (info.holder, info.fence_token, info.queue_depth) == (A, owner.token, 0)
        assert info.lease_remaining is not None
        assert 0 < info.lease_remaining <= store.lease_ttl
        assert await a.keeper.query("idle") is None


async def test_requests_of_one_tick_share_one_round_trip(store: RedisSlotStore) -> None:
    """Everything requested between two round trips goes in one pipeline."""
    async with open_keeper(store, A) as a:
        before = a.keeper.statistics().round_trips
        for i in range(100):
            a.keeper.submit(f"s{i}", i, QUEUE, 10, False)
        for i in range(100):
            await a.reports.wait_for(Owner, task_id=i)
        assert a.keeper.statistics().round_trips - before == 1


class Wrapping:
    """A ``ServerClient`` over the real one, whose connections ``wrap`` dresses."""

    def __init__(self, store: RedisSlotStore, instance_id: str) -> None:
        self._client = RedisClient(store, instance_id)

    def wrap(self, conn: Connection) -> Connection:
        raise NotImplementedError

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        async with self._client.connect() as conn:
            yield self.wrap(conn)

    def refuses_calls(self, error: Exception) -> bool:
        return self._client.refuses_calls(error)

    def refusal(self, error: Exception, asked: str) -> str:
        return self._client.refusal(error, asked)

    def may_pass(self, error: Exception) -> bool:
        return self._client.may_pass(error)


class Passing:
    """A ``Connection`` that passes every call on to ``conn``; subclasses hook some."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        return await self._conn.round_trip(calls)

    def send_nowait(self, calls: Sequence[Call]) -> bool:
        return self._conn.send_nowait(calls)

    async def replies(self, calls: Sequence[Call]) -> list[object]:
        return await self._conn.replies(calls)

    async def subscribe(
        self, channel: str, deliver: Callable[[str], None], subscribed: Callable[[], None]
    ) -> None:
        await self._conn.subscribe(channel, deliver, subscribed)


H = TypeVar("H")


class Hooked(Passing, Generic[H]):
    """A ``Passing`` connection with its hook (the client that made it) as ``_hook``."""

    def __init__(self, conn: Connection, hook: H) -> None:
        super().__init__(conn)
        self._hook = hook


class Listening(Hooked[H]):
    """Every call goes through ``round_trip`` (nothing is written by ``send_nowait``),
    and ``heard`` sees each message once it has been delivered."""

    def send_nowait(self, calls: Sequence[Call]) -> bool:
        return False  # every call through round_trip, where the hook is

    async def subscribe(
        self, channel: str, deliver: Callable[[str], None], subscribed: Callable[[], None]
    ) -> None:
        def deliver_then_hear(text: str) -> None:
            deliver(text)
            self.heard(text)

        await self._conn.subscribe(channel, deliver_then_hear, subscribed)

    def heard(self, text: str) -> None:
        """A message was delivered."""


class Writes(Wrapping):
    """A ``ServerClient`` that records the calls of each round trip its connections
    started with ``send_nowait`` (in the caller's task: ``written``) or sent with
    ``round_trip`` (``sent``)."""

    def __init__(self, store: RedisSlotStore, instance_id: str) -> None:
        super().__init__(store, instance_id)
        self.written: list[list[str]] = []
        self.sent: list[list[str]] = []

    def wrap(self, conn: Connection) -> Connection:
        return _WritesConnection(conn, self)


class _WritesConnection(Hooked[Writes]):
    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        self._hook.sent.append([name for name, _ in calls])
        return await self._conn.round_trip(calls)

    def send_nowait(self, calls: Sequence[Call]) -> bool:
        started = self._conn.send_nowait(calls)
        if started:
            self._hook.written.append([name for name, _ in calls])
        return started


async def test_a_release_while_the_loop_waits_is_written_in_the_callers_task(
    store: RedisSlotStore,
) -> None:
    """A release that finds the I/O loop waiting for work starts its round trip in the
    caller's task, before ``release`` returns; one more in the same tick waits for the
    next round trip (one at a time). Both hand their slots over."""
    slow = with_ttl(store, 30.0)  # no renewal (every 10 s) during the test
    hook = Writes(slow, A)
    async with open_keeper(slow, A, client=hook) as a, open_keeper(slow, B) as b:
        for task_id, slot in ((1, "k"), (2, "j")):
            a.keeper.submit(slot, task_id, QUEUE, 10, False)
            await a.reports.wait_for(Owner, task_id=task_id)
            b.keeper.submit(slot, task_id, QUEUE, 10, False)
            await b.reports.wait_for(Queued, task_id=task_id)
        assert hook.written == []  # submits wait for the loop
        a.keeper.release("k", 1, DONE)
        assert hook.written == [[scripts.RELEASE.name]]
        a.keeper.release("j", 2, DONE)
        assert hook.written == [[scripts.RELEASE.name]]
        with trio.fail_after(2.0):
            await b.reports.wait_for(Owner, task_id=1)
            await b.reports.wait_for(Owner, task_id=2)


async def test_hand_over_between_keepers_is_pushed(store: RedisSlotStore) -> None:
    """A release wakes the next keeper by message: it owns well before any renewal
    (lease_ttl / 3) or retry timer (the lease's expiry) could have noticed."""
    slow = with_ttl(store, 6.0)
    async with open_keeper(slow, A) as a, open_keeper(slow, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        released = trio.current_time()
        a.keeper.release("k", 1, DONE)
        owner = await b.reports.wait_for(Owner, task_id=1)
        assert b.reports.time_of(owner) - released < 1.0  # renewals come every 2 s


class MessageFirst(Wrapping):
    """A ``ServerClient`` whose replies to submits in ``slot`` wait until a message about
    ``slot`` has been delivered to the keeper: the order in which a published message
    overtakes the reply of the round trip that queued the entry."""

    def __init__(self, store: RedisSlotStore, instance_id: str, slot: str) -> None:
        super().__init__(store, instance_id)
        self.slot = slot
        self.arrived = trio.Event()  # the submit ran on the server; its reply is held
        self.delivered = trio.Event()  # the keeper has the message

    def wrap(self, conn: Connection) -> Connection:
        return _MessageFirstConnection(conn, self)


class _MessageFirstConnection(Listening[MessageFirst]):
    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        replies = await self._conn.round_trip(calls)
        if any(name == "submit" and args[0] == self._hook.slot for name, args in calls):
            self._hook.arrived.set()
            await self._hook.delivered.wait()
        return replies

    def heard(self, text: str) -> None:
        if json.loads(text)[1] == self._hook.slot:
            self._hook.delivered.set()


async def test_hand_over_message_before_the_queued_reply_is_kept(store: RedisSlotStore) -> None:
    """The hand-over's message for a slot can arrive before the reply that queued this
    process's entry there: the keeper keeps it until the reply, then acts on it (it was
    dropped, and the entry was claimed only at the next renewal, lease_ttl / 3 later)."""
    slow = with_ttl(store, 6.0)
    hook = MessageFirst(slow, B, "k")
    async with open_keeper(slow, A) as a, open_keeper(slow, B, client=hook) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await hook.arrived.wait()
        released = trio.current_time()
        a.keeper.release("k", 1, DONE)
        queued = await b.reports.wait_for(Queued, task_id=1)
        owner = await b.reports.wait_for(Owner, task_id=1)
        assert b.reports.time_of(queued) <= b.reports.time_of(owner)
        assert b.reports.time_of(owner) - released < 1.0  # renewals come every 2 s


async def test_wake_up_before_the_queued_reply_is_kept(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A ``wake`` (claim now: what earlier versions of the scripts sent instead of a
    grant) that arrives before the reply queueing the entry is kept until the reply,
    then claimed at once (it was dropped: the claim waited for the next renewal)."""
    slow = with_ttl(store, 6.0)
    hook = MessageFirst(slow, B, "k")
    async with open_keeper(slow, A) as a, open_keeper(slow, B, client=hook) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await hook.arrived.wait()
        woken = trio.current_time()
        await client.delete([f"{slow.key_prefix}lease:k"])  # A's lease expires, unreleased
        await client.publish(f"{slow.key_prefix}ch:{B}", '["wake", "k"]')
        owner = await b.reports.wait_for(Owner, task_id=1)
        assert b.reports.time_of(owner) - woken < 1.0  # renewals come every 2 s


async def test_hand_over_is_granted_without_a_claim(store: RedisSlotStore) -> None:
    """A release hands the lease to the next head on the server and pushes the grant:
    the next keeper reports Owner (a newer fence token) without a round trip of its own."""
    slow = with_ttl(store, 30.0)  # no renewal or retry in the window
    async with open_keeper(slow, A) as a, open_keeper(slow, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        first = await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        before = b.keeper.statistics().round_trips
        a.keeper.release("k", 1, DONE)
        owner = await b.reports.wait_for(Owner, task_id=1)
        assert owner.token > first.token
        assert b.keeper.statistics().round_trips == before
        info = await b.keeper.query("k")
        assert info is not None
        assert (info.holder, info.fence_token) == (B, owner.token)


class Rewrite(Wrapping):
    """A ``ServerClient`` whose subscription passes each message through ``rewrite``
    (it returns the messages to deliver instead: none, the same twice, ...)."""

    def __init__(
        self, store: RedisSlotStore, instance_id: str, rewrite: Callable[[str], list[str]]
    ) -> None:
        super().__init__(store, instance_id)
        self._rewrite = rewrite

    def wrap(self, conn: Connection) -> Connection:
        return _RewriteConnection(conn, self._rewrite)


class _RewriteConnection(Passing):
    def __init__(self, conn: Connection, rewrite: Callable[[str], list[str]]) -> None:
        super().__init__(conn)
        self._rewrite = rewrite

    async def subscribe(
        self, channel: str, deliver: Callable[[str], None], subscribed: Callable[[], None]
    ) -> None:
        def rewritten(text: str) -> None:
            for message in self._rewrite(text):
                deliver(message)

        await self._conn.subscribe(channel, rewritten, subscribed)


def grants_twice(text: str) -> list[str]:
    return [text, text] if json.loads(text)[0] == "grant" else [text]


def grants_lost(text: str) -> list[str]:
    return [] if json.loads(text)[0] == "grant" else [text]


async def test_grant_delivered_twice_owns_once(store: RedisSlotStore) -> None:
    """A duplicated grant message changes nothing: one Owner, and the next hand-over
    goes on as usual."""
    async with (
        open_keeper(store, A) as a,
        open_keeper(store, B, client=Rewrite(store, B, grants_twice)) as b,
    ):
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        a.keeper.submit("k", 2, QUEUE, 10, False)
        await a.reports.wait_for(Queued, task_id=2)
        a.keeper.release("k", 1, DONE)
        await b.reports.wait_for(Owner, task_id=1)
        b.keeper.release("k", 1, DONE)
        await a.reports.wait_for(Owner, task_id=2)
        assert len(b.reports.of(Owner)) == 1
        assert b.reports.of(LeaseLost) == a.reports.of(LeaseLost) == []


async def test_lost_grant_message_is_found_at_the_next_renewal(store: RedisSlotStore) -> None:
    """A grant whose message never arrives is found by the next renewal (it answers
    owner), within lease_ttl / 3, and the lease stays held."""
    async with (
        open_keeper(store, A) as a,
        open_keeper(store, B, client=Rewrite(store, B, grants_lost)) as b,
    ):
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        released = trio.current_time()
        a.keeper.release("k", 1, DONE)
        owner = await b.reports.wait_for(Owner, task_id=1)
        assert b.reports.time_of(owner) - released < 2 * store.lease_ttl / 3
        with trio.move_on_after(2 * store.lease_ttl):
            await b.reports.wait_for(LeaseLost)
        assert b.reports.of(LeaseLost) == []


async def test_grant_for_withdrawn_work_goes_on_to_the_next_head(store: RedisSlotStore) -> None:
    """Work withdrawn just before its grant message arrives: the keeper ignores the
    message, the withdrawal gives the lease back, and the next head owns it."""
    keepers: list[LeaseKeeper] = []

    def withdraw_first(text: str) -> list[str]:
        if json.loads(text)[0] == "grant":
            keepers[0].withdraw("k", 1, RejectionKind.REMOVED_FROM_QUEUE)
        return [text]

    hook = Rewrite(store, B, withdraw_first)
    async with (
        open_keeper(store, A) as a,
        open_keeper(store, B, client=hook) as b,
        open_keeper(store, C) as c,
    ):
        keepers.append(b.keeper)
        a.keeper.submit("k", 1, QUEUE, 10, False)
        first = await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        c.keeper.submit("k", 1, QUEUE, 10, False)
        await c.reports.wait_for(Queued, task_id=1)
        a.keeper.release("k", 1, DONE)
        owner = await c.reports.wait_for(Owner, task_id=1)
        assert owner.token > first.token + 1  # B's grant came in between
        info = await c.keeper.query("k")
        assert info is not None
        assert (info.holder, info.fence_token) == (C, owner.token)
        assert b.reports.of(Owner) == []


async def test_fifo_across_three_keepers(store: RedisSlotStore) -> None:
    """Entries from several processes are served in the order the server accepted them."""
    async with open_keeper(store, A) as a, open_keeper(store, B) as b, open_keeper(store, C) as c:
        keepers = {A: a, B: b, C: c}
        a.keeper.submit("k", 0, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=0)
        order = [(B, 1), (C, 1), (A, 1), (C, 2), (B, 2)]
        for instance, n in order:
            keepers[instance].keeper.submit("k", n, QUEUE, 10, False)
            await keepers[instance].reports.wait_for(Queued, task_id=n)
        holder = (A, 0)
        for instance, n in order:
            keepers[holder[0]].keeper.release("k", holder[1], DONE)
            await keepers[instance].reports.wait_for(Owner, task_id=n)
            holder = (instance, n)
        tokens = [keepers[i].reports.of(Owner) for i in (A, B, C)]
        assert len({o.token for group in tokens for o in group}) == 6


async def test_takeover_after_the_holder_is_killed(store: RedisSlotStore) -> None:
    """A killed holder stops renewing: the next keeper owns once the lease expired,
    found by its retry timer (an expiry publishes nothing)."""
    ttl = store.lease_ttl
    async with open_keeper(store, B) as b:
        async with open_keeper(store, A) as a:
            a.keeper.submit("k", 1, QUEUE, 10, False)
            await a.reports.wait_for(Owner)
            b.keeper.submit("k", 1, QUEUE, 10, False)
            await b.reports.wait_for(Queued)
            killed = trio.current_time()
            a.kill()
        owner = await b.reports.wait_for(Owner, task_id=1)
        waited = b.reports.time_of(owner) - killed
        # the last renewal was at most ttl / 3 before the kill; the server expires it
        assert ttl / 2 <= waited < 2 * ttl


async def test_lease_is_lost_while_the_server_is_paused(
    store: RedisSlotStore, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """No renewal confirmed for 0.8 * lease_ttl: LeaseLost on time although the server
    never answers; the outage is reported once and its end too, and its log line says
    that the server did not answer, and within how long."""
    ttl = store.lease_ttl
    async with open_keeper(store, A) as a:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        owner = await a.reports.wait_for(Owner)
        redis_server.pause()
        paused = trio.current_time()
        lost = await a.reports.wait_for(LeaseLost)
        assert (lost.task_id, lost.token) == (1, owner.token)
        assert lost.reason.startswith("lease expired")
        # the last renewal was sent between ttl / 3 before the pause and the pause
        assert ttl * 0.4 <= a.reports.time_of(lost) - paused <= 2 * 0.8 * ttl
        await a.reports.wait_for(StoreUnavailable)
        redis_server.resume()
        await a.reports.wait_for(StoreRecovered)
        assert len(a.reports.of(StoreUnavailable)) == 1
        assert len(a.reports.of(LeaseLost)) == 1
    (line,) = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert re.fullmatch(
        rf"slot store {re.escape(store.safe_url)} unavailable: it did not answer within "
        r"[0-9.]+ s",
        line,
    ), line


async def test_a_later_lease_is_lost_on_time_after_the_earlier_one_left(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A lease taken after another is due later, so it does not wake the keeper's
    timers; once the earlier one is released, the later one is still lost on time."""
    ttl = store.lease_ttl
    async with open_keeper(store, A) as a:
        a.keeper.submit("k1", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        a.keeper.submit("k2", 2, QUEUE, 10, False)
        owner = await a.reports.wait_for(Owner, task_id=2)
        a.keeper.release("k1", 1, DONE)
        redis_server.pause()
        paused = trio.current_time()
        try:
            lost = await a.reports.wait_for(LeaseLost)
        finally:
            redis_server.resume()
        assert (lost.task_id, lost.token) == (2, owner.token)
        assert a.reports.time_of(lost) - paused <= 2 * 0.8 * ttl


async def test_a_release_written_to_a_paused_server_is_sent_again_after_the_outage(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A release written in the caller's task to a paused server gets no reply within
    ``connect_timeout``: an outage. It is sent again once the keeper has reconnected (the
    server may run both: a release is idempotent), and the next entry gets the slot."""
    slow = with_ttl(store, 30.0)  # the lease would expire (and B claim it) only at 30 s
    hook = Writes(slow, A)
    async with open_keeper(slow, A, client=hook) as a, open_keeper(slow, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        redis_server.pause()
        try:
            a.keeper.release("k", 1, DONE)
            assert hook.written == [[scripts.RELEASE.name]]
            await a.reports.wait_for(StoreUnavailable)
        finally:
            redis_server.resume()
        with trio.fail_after(4 * slow.connect_timeout):
            await a.reports.wait_for(StoreRecovered)
            await b.reports.wait_for(Owner, task_id=1)
        assert any(scripts.RELEASE.name in calls for calls in hook.sent)  # sent again
        info = await a.keeper.query("k")
        assert info is not None
        assert info.holder == B


async def test_restart_refuses_leases_and_resubscribes(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """After a restart that lost the data: the lease is refused, the keepers reconnect
    and subscribe again (reported once), and a pushed wake-up works again."""
    slow = with_ttl(store, 6.0)
    async with open_keeper(slow, A) as a, open_keeper(slow, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner)
        redis_server.restart()
        lost = await a.reports.wait_for(LeaseLost, task_id=1)
        assert lost.reason.startswith("lease refused")
        for running in (a, b):
            await running.reports.wait_for(StoreRecovered)
            assert len(running.reports.of(StoreUnavailable)) == 1
        a.keeper.release("k", 1, DONE)
        a.keeper.submit("k2", 2, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=2)
        b.keeper.submit("k2", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        released = trio.current_time()
        a.keeper.release("k2", 2, DONE)
        owner = await b.reports.wait_for(Owner, task_id=1)
        assert b.reports.time_of(owner) - released < 1.0  # pushed: renewals are 2 s apart


async def test_failed_request_leaves_no_orphan_lease(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """A submit whose round trip timed out is rejected STORE_UNAVAILABLE; the server
    may still run it when it wakes up, and the keeper gives that lease back."""
    async with open_keeper(store, A) as a:
        redis_server.pause()
        a.keeper.submit("k", 1, QUEUE, 10, False)
        rejected = await a.reports.wait_for(Rejected, task_id=1)
        assert rejected.kind is RejectionKind.STORE_UNAVAILABLE
        redis_server.resume()
        await a.reports.wait_for(StoreRecovered)
        assert await a.keeper.query("k") is None
        assert a.reports.of(Owner) == []


async def test_wait_mode_work_is_held_while_the_store_is_down(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """wait=True work gets Full during an outage; wait=False work is rejected at once."""
    async with open_keeper(store, A) as a:
        redis_server.pause()
        a.keeper.submit("k", 1, QUEUE, 10, True)
        held = await a.reports.wait_for(Full, task_id=1)
        assert "unavailable" in held.reason
        await a.reports.wait_for(StoreUnavailable)
        a.keeper.submit("k", 2, QUEUE, 10, False)
        assert (await a.reports.wait_for(Rejected, task_id=2)).kind is (
            RejectionKind.STORE_UNAVAILABLE
        )
        redis_server.resume()
        await a.reports.wait_for(StoreRecovered)
        a.keeper.submit("k", 1, QUEUE, 10, True)  # the controller submits it again
        await a.reports.wait_for(Owner, task_id=1)


async def test_query_raises_when_the_server_does_not_answer(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """query() gives up after connect_timeout with SlotStoreUnavailableError."""
    async with open_keeper(store, A) as a:
        redis_server.pause()
        started = trio.current_time()
        with pytest.raises(SlotStoreUnavailableError, match="did not answer"):
            await a.keeper.query("k")
        assert trio.current_time() - started < 2 * store.connect_timeout
        redis_server.resume()


async def test_start_fails_when_nothing_answers(
    store: RedisSlotStore, redis_server: RedisServer
) -> None:
    """run() raises SlotStoreUnavailableError within connect_timeout and reports nothing."""
    redis_server.pause()
    send, receive = trio.open_memory_channel[Report](math.inf)
    slow = with_ttl(store, 1.0, connect_timeout=0.5)
    keeper = LeaseKeeper(slow, A, send, RedisClient(slow, A))
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        with pytest.raises(SlotStoreUnavailableError):
            await nursery.start(keeper.run)
    assert trio.current_time() - started < 1.0
    redis_server.resume()
    with pytest.raises(trio.WouldBlock):
        receive.receive_nowait()


async def test_replace_stops_the_remote_owner_and_supersedes_the_head(
    store: RedisSlotStore,
) -> None:
    """REPLACE from another process: the holder gets RemoteStop once, a displaced head
    in a third process gets Rejected(SUPERSEDED)."""
    async with open_keeper(store, A) as a, open_keeper(store, B) as b, open_keeper(store, C) as c:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner)
        c.keeper.submit("k", 1, REPLACE, 10, False)
        await c.reports.wait_for(Queued, task_id=1)
        stop = await a.reports.wait_for(RemoteStop, task_id=1)
        assert stop.requester == C
        b.keeper.submit("k", 1, REPLACE, 10, False)
        queued = await b.reports.wait_for(Queued, task_id=1)
        assert queued.displaced == f"{C}/1"
        rejected = await c.reports.wait_for(Rejected, task_id=1)
        assert rejected.kind is RejectionKind.SUPERSEDED
        a.keeper.release("k", 1, DONE)
        await b.reports.wait_for(Owner, task_id=1)
        assert len(a.reports.of(RemoteStop)) == 1


async def test_full_queue_holds_wait_work_until_room(store: RedisSlotStore) -> None:
    """wait=True on a full queue: Full, then Room when an entry leaves."""
    async with open_keeper(store, A) as a, open_keeper(store, B) as b:
        a.keeper.submit("k", 1, QUEUE, 1, False)
        a.keeper.submit("k", 2, QUEUE, 1, False)
        await a.reports.wait_for(Queued, task_id=2)
        b.keeper.submit("k", 1, QUEUE, 1, True)
        assert (await b.reports.wait_for(Full, task_id=1)).reason == "cluster queue is full"
        a.keeper.withdraw("k", 2, RejectionKind.REMOVED_FROM_QUEUE)
        await b.reports.wait_for(Room, slot="k")
        b.keeper.submit("k", 1, QUEUE, 1, True)
        await b.reports.wait_for(Queued, task_id=1)


async def test_joiner_gets_the_remote_outcome(store: RedisSlotStore) -> None:
    """A JOIN on remote work resolves to that work's outcome, value through JSON."""
    async with open_keeper(store, A) as a, open_keeper(store, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner)
        b.keeper.submit("k", 7, JOIN, 10, False)
        joined = await b.reports.wait_for(Joined, task_id=7)
        assert joined.target == f"{A}/1"
        b.keeper.follow(7, "k", joined.target)
        a.keeper.release("k", 1, TaskOutcome(OutcomeKind.COMPLETED, value=(1, {2: 3})))
        followed = await b.reports.wait_for(FollowedOutcome, joiner=7)
        assert followed.outcome == TaskOutcome(OutcomeKind.COMPLETED, value=[1, {"2": 3}])


async def test_joiner_of_killed_work_resolves_lease_lost(store: RedisSlotStore) -> None:
    """Followed work whose process died resolves LEASE_LOST, naming that process."""
    async with open_keeper(store, B) as b:
        async with open_keeper(store, A) as a:
            a.keeper.submit("k", 1, QUEUE, 10, False)
            await a.reports.wait_for(Owner)
            b.keeper.submit("k", 7, JOIN, 10, False)
            joined = await b.reports.wait_for(Joined, task_id=7)
            b.keeper.follow(7, "k", joined.target)
            a.kill()
        followed = await b.reports.wait_for(FollowedOutcome, joiner=7)
        assert followed.outcome.kind is OutcomeKind.LEASE_LOST
        assert followed.outcome.reason == f"followed work lost: {A}"


async def test_withdrawn_work_leaves_the_queue_at_once(store: RedisSlotStore) -> None:
    """A withdrawal takes the entry out of the cluster queue; the next one is served."""
    async with open_keeper(store, A) as a, open_keeper(store, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        b.keeper.submit("k", 2, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=2)
        b.keeper.withdraw("k", 1, RejectionKind.REMOVED_FROM_QUEUE)
        a.keeper.release("k", 1, DONE)
        await b.reports.wait_for(Owner, task_id=2)
        assert b.reports.of(Owner)[0].task_id == 2


async def test_close_flushes_and_deletes_the_heartbeat(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """aclose(): withdrawals are acknowledged, the heartbeat is gone, and the leases
    still held stay (their owners may still run) until they expire."""
    async with open_keeper(store, A) as a:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        a.keeper.submit("k", 2, QUEUE, 10, False)
        await a.reports.wait_for(Queued, task_id=2)
        a.keeper.withdraw("k", 2, RejectionKind.SHUTTING_DOWN)
        await a.keeper.aclose()
    runner = Scripts(client, store)
    assert await runner.queue("k") == []
    assert await runner.get(f"gone:{A}/2") == "shutting_down"
    assert await client.exists([f"{store.key_prefix}hb:{A}"]) == 0
    assert (await runner.lease("k"))["entry"] == f"{A}/1"


async def test_credentials_never_show(
    store: RedisSlotStore,
    client: coredis.Redis[str],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The password is in no repr, report, error or log record, right or wrong."""
    password = "s3cr3t-pa55"
    url = redis_server.url.replace("redis://", f"redis://default:{password}@")
    secure = RedisSlotStore(url, namespace=store.namespace, lease_ttl=1.0, connect_timeout=0.5)
    caplog.set_level(logging.DEBUG)
    await client.config_set({"requirepass": password})
    try:
        async with open_keeper(secure, A) as a:
            a.keeper.submit("k", 1, QUEUE, 10, False)
            await a.reports.wait_for(Owner)
            redis_server.pause()
            await a.reports.wait_for(LeaseLost)
            redis_server.resume()
            await a.reports.wait_for(StoreRecovered)
            texts = [repr(secure), str(secure), repr(a.keeper), *map(repr, a.reports.items)]
        wrong = RedisSlotStore(
            url.replace(password, "wrong-" + password), namespace="x", connect_timeout=0.5
        )
        send, _ = trio.open_memory_channel[Report](math.inf)
        async with trio.open_nursery() as nursery:
            with pytest.raises(SlotStoreUnavailableError) as failure:
                await nursery.start(LeaseKeeper(wrong, B, send, RedisClient(wrong, B)).run)
        texts.append(str(failure.value))
    finally:
        async with coredis.Redis.from_url(url, decode_responses=True) as admin:
            await admin.config_set({"requirepass": ""})
    texts += [record.getMessage() for record in caplog.records]
    texts += [caplog.text]
    assert not [text for text in texts if password in text]
    assert any("***" in text for text in texts)


async def test_stop_owner_answers_with_the_stopped_lease_token(store: RedisSlotStore) -> None:
    """``stop_owner`` asks the lease holder's process to stop its owner (``RemoteStop``
    there) and answers with that lease's fence token; ``None`` for a slot without one."""
    async with open_keeper(store, A) as a, open_keeper(store, B) as b:
        assert await b.keeper.stop_owner("k").wait() is None
        a.keeper.submit("k", 1, QUEUE, 10, False)
        owner = await a.reports.wait_for(Owner, task_id=1)
        assert await b.keeper.stop_owner("k").wait() == owner.token
        stop = await a.reports.wait_for(RemoteStop, task_id=1)
        assert stop.requester == B


async def test_stop_owner_of_a_stopped_keeper_fails_at_once(store: RedisSlotStore) -> None:
    """A stop requested after the keeper stopped raises ``SlotStoreUnavailableError``
    without waiting for ``connect_timeout``."""
    async with open_keeper(store, A) as a:
        pass
    with trio.testing.assert_checkpoints(), pytest.raises(SlotStoreUnavailableError):
        with trio.fail_after(store.connect_timeout / 2):
            await a.keeper.stop_owner("k").wait()


async def test_a_batch_of_script_calls_that_met_noscript_is_sent_again(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A server that lost its scripts (a restart, a failover) answers NOSCRIPT: the
    scripts are loaded and the calls sent again, so the batch gets the scripts' replies
    (here two submits, in one call of the grouped form)."""
    await client.script_flush()
    calls: list[Call] = [
        (scripts.SUBMIT.name, scripts.submit_args(slot, f"{A}/{n}", "queue", 10, False))
        for n, slot in enumerate(("k", "j"))
    ]
    async with RedisClient(store, A).connect() as conn:
        replies = await conn.round_trip(calls)
    assert [scripts.parse_submit(reply).kind for reply in replies] == ["owner", "owner"]


async def test_an_error_reply_to_one_script_call_is_that_calls_reply(
    store: RedisSlotStore,
) -> None:
    """A script's error (here: arguments it cannot read) is the reply of its call only:
    the other calls of the batch run and get their own replies."""
    submit = scripts.submit_args("k", f"{A}/1", "queue", 10, False)
    async with RedisClient(store, A).connect() as conn:
        replies = await conn.round_trip(
            [(scripts.SUBMIT.name, submit), (scripts.SUBMIT.name, ("k",))]
        )
    assert not isinstance(replies[0], Exception)
    assert isinstance(replies[1], coredis.exceptions.ResponseError)


async def _evalsha_calls(client: coredis.Redis[str]) -> int:
    stats = await client.info("commandstats")
    return int(cast("dict[str, int]", stats.get("cmdstat_evalsha", {})).get("calls", 0))


async def test_consecutive_submits_and_releases_go_as_one_call_each(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A run of submits (or of releases) in a round trip is one ``EVALSHA`` of the
    script's grouped form, at most ``GROUP_SIZE`` calls in one; a lone call goes as
    itself. Each call still gets its own reply, in order."""
    slots = [f"k{n}" for n in range(scripts.GROUP_SIZE + 6)]
    submits: list[Call] = [
        (scripts.SUBMIT.name, scripts.submit_args(slot, f"{A}/{slot}", "queue", 10, False))
        for slot in slots
    ]
    releases: list[Call] = [(scripts.RELEASE.name, (slot, f"{A}/{slot}", "")) for slot in slots[:3]]
    lone: Call = (scripts.SUBMIT.name, scripts.submit_args("j", f"{A}/j", "queue", 10, False))
    async with RedisClient(store, A).connect() as conn:
        await conn.round_trip([])  # the socket's handshake
        before = await _evalsha_calls(client)
        replies = await conn.round_trip([*submits, *releases, lone])
        assert await _evalsha_calls(client) - before == 2 + 1 + 1
    kinds = [scripts.parse_submit(reply).kind for reply in replies[: len(slots)]]
    assert kinds == ["owner"] * len(slots)
    assert [scripts.parse_release(reply) for reply in replies[len(slots) : -1]] == ["ok"] * 3
    assert scripts.parse_submit(replies[-1]).kind == "owner"


async def test_an_error_in_one_call_of_a_group_is_that_calls_reply(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A call of a group that fails (a key of a foreign type; arguments its script
    cannot read) has its error as its reply; the calls after it still run."""
    await client.set(f"{store.key_prefix}lease:foreign", "not a hash")
    calls: list[Call] = [
        (scripts.SUBMIT.name, scripts.submit_args("k", f"{A}/1", "queue", 10, False)),
        (scripts.SUBMIT.name, scripts.submit_args("foreign", f"{A}/2", "queue", 10, False)),
        (scripts.SUBMIT.name, ("k", f"{A}/3", "queue", "many", "0")),  # a busy slot's bound
        (scripts.SUBMIT.name, scripts.submit_args("j", f"{A}/4", "queue", 10, False)),
    ]
    async with RedisClient(store, A).connect() as conn:
        replies = await conn.round_trip(calls)
    assert scripts.parse_submit(replies[0]).kind == "owner"
    assert isinstance(replies[1], coredis.exceptions.WrongTypeError)
    assert isinstance(replies[2], coredis.exceptions.ResponseError)
    assert "compare" in str(replies[2])
    assert scripts.parse_submit(replies[3]).kind == "owner"


async def test_round_trips_after_a_broken_connection_go_on_a_fresh_one(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """The socket of the round trips, closed by the server while idle, is replaced: the
    next round trip finds it closed before any reply and goes once more, on a fresh
    socket (as a connection pool would), instead of failing."""
    calls: list[Call] = [
        (scripts.SUBMIT.name, scripts.submit_args("k", f"{A}/1", "queue", 10, False))
    ]
    async with RedisClient(store, A).connect() as conn:
        await conn.round_trip(calls)
        assert await client.client_kill(user="default", skipme=True) == 1
        replies = await conn.round_trip(calls)
        named = [c for c in await client.client_list() if c.get("name") == f"taskvisor:{A}"]
        assert len(named) == 1  # the fresh connection, in use
    assert scripts.parse_submit(replies[0]).kind == "owner"


async def test_a_round_trip_started_on_a_socket_the_server_closed_goes_once_more(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """``send_nowait`` writes nothing before the first round trip opened the socket. On a
    socket the server closed while it was idle, the bytes it wrote find no reply: the
    round trip goes once more, on a fresh socket, as one of ``round_trip`` does."""
    calls: list[Call] = [
        (scripts.SUBMIT.name, scripts.submit_args("k", f"{A}/1", "queue", 10, False))
    ]
    async with RedisClient(store, A).connect() as conn:
        assert not conn.send_nowait(calls)
        await conn.round_trip(calls)
        assert await client.client_kill(user="default", skipme=True) == 1
        assert conn.send_nowait(calls)
        replies = await conn.replies(calls)
        named = [c for c in await client.client_list() if c.get("name") == f"taskvisor:{A}"]
        assert len(named) == 1  # the fresh connection, in use
    assert scripts.parse_submit(replies[0]).kind == "owner"


async def test_a_write_the_socket_takes_in_part_is_finished_before_the_replies() -> None:
    """What the socket does not take at once (4 MB: more than any default buffer) is
    written before the replies are read, in order."""
    ours, theirs = trio.socket.socketpair()
    commands = [(_head(b"ECHO"), ("x" * 4_000_000,)), (_head(b"PING"), ())]
    sent = _packed(commands)
    received = bytearray()

    async def server() -> None:
        with theirs:
            while len(received) < len(sent):
                received.extend(await theirs.recv(1 << 20))
            await theirs.send(b"+ok\r\n+PONG\r\n")

    async with trio.SocketStream(ours) as stream, trio.open_nursery() as nursery:
        wire = _Wire(stream)
        assert wire.send_nowait(commands)
        nursery.start_soon(server)
        with trio.fail_after(5):
            assert await wire.answers(len(commands)) == ["ok", "PONG"]
    assert received == sent


@given(
    st.binary(min_size=1, max_size=12),
    st.lists(st.text(max_size=20), max_size=6),
    st.lists(st.text(max_size=20), max_size=6),
)
def test_a_command_packed_with_its_head_packed_once_is_the_whole_command(
    name: bytes, fixed: list[str], rest: list[str]
) -> None:
    """A head packed once (a script's ``EVALSHA``, its sha and the common arguments),
    then the rest of the arguments: the same bytes as the whole command packed at once,
    in the Redis protocol (lengths in bytes, not characters)."""
    parts = [name, *(arg.encode() for arg in fixed + rest)]
    whole = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    assert _packed([(_head(name, *fixed), tuple(rest))]) == whole


def test_replicas_are_counted_from_info_replication_online_only() -> None:
    """Only replicas in sync (``state=online``) count; other ``slave`` fields do not."""
    info = (
        "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave_read_only:1\r\n"
        "slave0:ip=127.0.0.1,port=1,state=online,offset=10,lag=0\r\n"
        "slave1:ip=127.0.0.1,port=2,state=wait_bgsave,offset=0,lag=0\r\n"
    )
    assert _online_replicas(info) == 1
    assert _info_field("# Server\r\nrun_id:abc\r\ntcp_port:1\r\n", "run_id") == "abc"


async def test_a_reconnection_with_queued_entries_renews_again_once_subscribed(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> None:
    """A reconnection renews, then subscribes: a grant pushed in between is not heard,
    so a keeper with queued entries renews once more as soon as it is subscribed,
    rather than a renewal interval (``lease_ttl / 3``, 10 s here) later."""
    slow = with_ttl(store, 30.0)
    async with open_keeper(slow, A) as a, open_keeper(slow, B) as b:
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        b.keeper.submit("k", 1, QUEUE, 10, False)
        await b.reports.wait_for(Queued, task_id=1)
        before = b.keeper.statistics().round_trips
        for info in await client.client_list():
            if info.get("name") == f"taskvisor:{B}":
                await client.client_kill(identifier=int(info["id"]))
        await b.reports.wait_for(StoreRecovered)
        with trio.fail_after(2.0):  # well under the renewal interval
            # The keeper's own count, polled: no event tells of a renewal sent.
            # Two: the reconnection's renewal, then the one once subscribed.
            while b.keeper.statistics().round_trips < before + 2:  # noqa: ASYNC110
                await trio.sleep(0.01)


class Timed(Wrapping):
    """A ``ServerClient`` that records when each round trip was sent (started with
    ``send_nowait`` or sent with ``round_trip``), with the names of its calls."""

    def __init__(self, store: RedisSlotStore, instance_id: str) -> None:
        super().__init__(store, instance_id)
        self.trips: list[tuple[float, list[str]]] = []

    def wrap(self, conn: Connection) -> Connection:
        return _TimedConnection(conn, self)

    def with_call(self, name: str) -> list[tuple[float, list[str]]]:
        """The round trips that held a call of ``name``."""
        return [(at, names) for at, names in self.trips if name in names]


class _TimedConnection(Hooked[Timed]):
    async def round_trip(self, calls: Sequence[Call]) -> list[object]:
        self._hook.trips.append((trio.current_time(), [name for name, _ in calls]))
        return await self._conn.round_trip(calls)

    def send_nowait(self, calls: Sequence[Call]) -> bool:
        started = self._conn.send_nowait(calls)
        if started:
            self._hook.trips.append((trio.current_time(), [name for name, _ in calls]))
        return started


def records_of(caplog: pytest.LogCaptureFixture, level: int, said: str) -> list[str]:
    """The messages of ``caplog``'s records at ``level`` that hold ``said``."""
    return [r.getMessage() for r in caplog.records if r.levelno == level and said in r.getMessage()]


@asynccontextmanager
async def a_owns_b_waits(
    store: RedisSlotStore, client: coredis.Redis[str]
) -> AsyncIterator[tuple[Running, dict[str, Inbox], Timed, Scripts]]:
    """A (a keeper, its calls timed) owns slot ``k``, and B's entry waits behind it (B:
    a process of raw script calls, which never claims; its heartbeat lives 30 s)."""
    other = Scripts(client, with_ttl(store, 30.0))
    hook = Timed(store, A)
    async with (
        open_inboxes(store.url, store, B) as inbox,
        open_keeper(store, A, client=hook) as a,
    ):
        a.keeper.submit("k", 1, QUEUE, 10, False)
        await a.reports.wait_for(Owner, task_id=1)
        await other.heartbeat(B)
        assert (await other.submit("k", entry(B, 1)))[0] == "queued"
        yield a, inbox, hook, other


def give_back(a: Running, call: str) -> None:
    """A's entry leaves slot ``k``: by its ``release``, or its ``withdraw``."""
    if call == "withdraw":
        a.keeper.withdraw("k", 1, RejectionKind.REMOVED_FROM_QUEUE)
    else:
        a.keeper.release("k", 1, DONE)


@pytest.mark.parametrize("call", ["release", "withdraw"])
async def test_a_joiners_key_of_foreign_data_is_read_as_none_and_logged_once(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture, call: str
) -> None:
    """A holds slot ``k`` and B's entry waits behind it; A's entry's joiners key holds
    foreign data (a string). A's withdrawal, or A's release and the stored outcome it
    asks for (the key exists), read it as none: B is granted the lease, the key is
    logged at ERROR once, and the call is sent once. Before, the withdrawal, or the
    stored outcome, failed on it, and the keeper sent it again with each renewal for
    as long as the process lived (and the withdrawal's hand-over waited for B's claim)."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    prefix, interval = store.key_prefix, store.lease_ttl / 3
    name = (scripts.WITHDRAW if call == "withdraw" else scripts.STORE_OUTCOME).name
    what = {
        "withdraw": "slot store withdraw of slot 'k' read as none: ",
        "release": f"slot store outcome of {A}/1 read as none: ",
    }[call]
    async with a_owns_b_waits(store, client) as (a, inbox, hook, _):
        await client.set(f"{prefix}jn:{A}/1", "foreign")
        give_back(a, call)
        with trio.fail_after(2.0):
            await inbox[B].wait_kind("grant", "k", entry(B, 1))
            while not records_of(caplog, logging.ERROR, what):  # noqa: ASYNC110
                await trio.sleep(0.01)
        (error,) = records_of(caplog, logging.ERROR, "")
        key = f"{prefix}jn:{A}/1"
        assert error.startswith(what + f"foreign data in the slot store at {key}: WRONGTYPE")
        await trio.sleep(2 * interval)  # two renewals: nothing sent again
        assert len(hook.with_call(name)) == 1
        assert len(records_of(caplog, logging.ERROR, "")) == 1


@pytest.mark.parametrize("call", ["release", "withdraw"])
async def test_an_obligation_the_server_answers_with_an_error_is_sent_with_each_renewal(
    store: RedisSlotStore, client: coredis.Redis[str], caplog: pytest.LogCaptureFixture, call: str
) -> None:
    """A holds slot ``k`` and B's entry waits behind it (B: a process of raw script
    calls, which never claims). A's release, or withdrawal, fails on foreign data at the
    slot's fence key after it gave the lease back, before its hand-over (the grant
    fails). (A stored outcome, which shares their path, has no error of its own left
    to fail on: its joiners key of foreign data is read as none, above.) The keeper logs
    the error at ERROR once, and sends the call again with each renewal (every
    ``lease_ttl / 3``),
    never at once, failing again quietly (DEBUG); once the key is gone, the next
    renewal's call works (B is granted the lease), the keeper logs at INFO that it
    worked, and sends it no more. Before, the call was dropped at its error: B waited
    for a claim of its own, with the slot free."""
    caplog.set_level(logging.DEBUG, logger="trio_taskvisor")
    prefix, interval = store.key_prefix, store.lease_ttl / 3
    name = {"release": scripts.RELEASE, "withdraw": scripts.WITHDRAW}[call].name
    what = {
        "release": f"slot store release of {A}/1 in slot 'k'",
        "withdraw": f"slot store withdrawal of {A}/1 from slot 'k'",
    }[call]
    key = f"{prefix}fence:k"
    async with a_owns_b_waits(store, client) as (a, inbox, hook, other):
        await client.delete([key])
        await client.hset(key, {"foreign": "1"})
        give_back(a, call)
        with trio.fail_after(2.0):
            while not hook.with_call(name):  # noqa: ASYNC110
                await trio.sleep(0.01)
        await trio.sleep(4 * interval)
        sends = hook.with_call(name)
        assert 4 <= len(sends) <= 6  # the first, then one per renewal: no spin
        assert scripts.RENEW.name in sends[1][1]
        for (at, _), (then, names) in itertools.pairwise(sends[1:]):
            assert scripts.RENEW.name in names
            assert then - at > interval / 2
        (error,) = records_of(caplog, logging.ERROR, what)
        assert f"{what} failed: " in error
        assert "WrongTypeError: Operation against a key holding the wrong kind" in error
        assert error.endswith("(sent again with each renewal until it works)")
        assert len(records_of(caplog, logging.DEBUG, f"{what} failed again")) >= 3
        assert (await other.lease("k"), await other.queue("k")) == ({}, [entry(B, 1)])
        assert inbox[B].of("grant") == []
        await client.delete([key])
        with trio.fail_after(2 * interval + 1.0):
            while not records_of(caplog, logging.INFO, what):  # noqa: ASYNC110
                await trio.sleep(0.01)
            await inbox[B].wait_kind("grant", "k", entry(B, 1))
        (worked,) = records_of(caplog, logging.INFO, what)
        assert re.fullmatch(f"{re.escape(what)} worked, after [0-9]+ failed tries", worked)
        sent = len(hook.with_call(name))
        await trio.sleep(2 * interval)
        assert len(hook.with_call(name)) == sent  # no more
        assert len(records_of(caplog, logging.ERROR, what)) == 1
