"""Random operation sequences against the cluster scripts and a Python model of them.

``ClusterModel`` is the cluster queue of the working spec (``notes/cluster_spec.md``,
in executable form: one method per script, plain data, no time. The
state machine sends the same random operations to the model and, through a trio loop
in a helper thread, to the real scripts on the test server, with three instance ids
in one process: ``submit`` with every policy (``max_queue``, ``watch``), ``claim``,
``release`` (with and without an outcome), ``store_outcome``, ``withdraw``,
``stop_owner``, ``renew``, ``cluster_slot``, killing an instance (its heartbeat key
deleted, as its expiry would), a lease's expiry (its key deleted), ``FLUSHALL`` (a
restart that lost the data), and sending a call again: the last one at once, or any
earlier obligation later (the keeper resends withdrawals, releases, outcomes and stop
requests until the server acknowledges them), and a submit or claim the server applied
but the keeper did not act on (its round trip failed after the server ran it, or fewer
replicas than ``replicas_ack`` acknowledged it): the submit is withdrawn, the claimed
entry stays queued for the next renewal.

After every step it compares the reply, every key of the namespace (with its expiry
class) and the messages each instance received, and checks:

* a slot's lease is granted only while free, and only to the live head of its queue
  (a release or withdrawal hands it over at once and pushes the grant, whose token the
  message carries; a process acts on it when it reads it, or finds it at its next
  claim or renewal), on an idle slot, or to a REPLACE during a hand-over;
* fence tokens strictly increase per slot, across ``FLUSHALL`` too, below 2**53;
* at most one process owns a slot, but for owners whose lease went with lost data (they
  learn it at their next renewal); a lease holder is neither queued nor gone; no entry
  is queued twice;
* an owner keeps its lease and a queued entry its place (or a gone marker) until its
  process dies or the data is lost;
* a call sent again at once changes nothing.

Lease and heartbeat expiry run on the server's clock: the store's ``lease_ttl`` is long
enough that nothing expires during an example, and "kill" stands for an expiry.

``test_a_grouped_call_answers_as_its_calls_one_at_a_time`` holds the grouped form of
``submit`` and ``release`` (several calls in one) to the calls one at a time, on the
server alone: the same replies, keys and messages.

The model was written from the spec's text. Where the scripts answered otherwise, the
case was decided from the documented rules and the spec: once for the rules against the
script (a process whose heartbeat expired gets its entries back at the tail, pruned or
not: the renew script was fixed), and nine times for the script where the spec is
silent or loose; those places say "Resolved" in the model, and the ``test_case_*``
tests at the end replay each of them on both sides.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs
import coredis
import pytest
import trio
import trio.from_thread
import trio.lowlevel
from cluster_helpers import Inbox, Scripts, open_inboxes
from conftest import RedisServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore
from trio_taskvisor._slotstore import instance_of

T = TypeVar("T")

A, B, C = "model-a:1:0000000a", "model-b:2:0000000b", "model-c:3:0000000c"
INSTANCES = (A, B, C)
SLOTS = ("s0", "s1")
slots = st.sampled_from(["s0", "s0", "s0", "s1"])  # mostly one busy slot
queue_bounds = st.sampled_from([0, 1, 2, 2, 3, 3])
WITHDRAW_REASONS = ("removed_from_queue", "queue_timeout", "shutting_down")
POLICIES = ("queue", "replace", "drop_if_running", "join")
SYNC = "sync"  # a pseudo instance: its channel marks the end of a step's messages
LEASE_TTL = 60.0  # nothing expires during an example
TTL_MS = round(LEASE_TTL * 1000)
KEEP_MS = round(max(60.0, 10 * LEASE_TTL) * 1000)


# -- the model ------------------------------------------------------------------------------


class NewToken:
    """Stands for the fence token of a grant in a model reply: the server's clock picks
    the value; the machine checks it and gives it to the model."""

    def __repr__(self) -> str:
        return "<new token>"


NEW_TOKEN = NewToken()


class ServerMs:
    """Stands for a time on the server's clock in a model message (Unix milliseconds,
    a decimal string): a pushed grant's lease expiry."""

    def __repr__(self) -> str:
        return "<server ms>"


SERVER_MS = ServerMs()


@attrs.frozen
class Retry:
    """Stands for a ``retry_ms`` in a model reply: the PTTL of ``key`` (``None``: 0)."""

    key: str | None


@attrs.define
class Lease:
    entry: str
    token: int | None  # None until the machine binds the grant's token
    stop: str | None = None


Message = list[Any]


class ClusterModel:
    """The server side of cluster slots as the working spec states it.

    State: heartbeats, leases (entry, token, stop), fences, queues, gone markers,
    outcomes, joiners and watchers, as the key table of the spec. Each script method
    returns the reply in the layout ``_redis_scripts`` parses, with ``NEW_TOKEN`` and
    ``Retry`` where the server's clock decides, and records the messages it publishes.
    """

    def __init__(self) -> None:
        self.flushall()

    def flushall(self) -> None:
        """Lose every key, as a restart without persistence does."""
        self.hb: set[str] = set()
        self.lease: dict[str, Lease] = {}
        self.fence: dict[str, int] = {}
        self.q: dict[str, list[str]] = {}
        self.gone: dict[str, str] = {}
        self.out: dict[str, str] = {}
        self.jn: dict[str, set[str]] = {}
        self.watch: dict[str, set[str]] = {}
        self.sent: list[tuple[str, Message]] = []
        self.granted: str | None = None  # the slot granted by the last call, if any
        self.grant_kind: str | None = None  # "idle", "head", "pushed" or "replace"

    def copy(self) -> ClusterModel:
        return copy.deepcopy(self)

    # -- keys ----------------------------------------------------------------------------------

    def render(self) -> dict[str, object]:
        """Every key the server must hold (without the prefix), with its value."""
        keys: dict[str, object] = {f"hb:{i}": str(TTL_MS) for i in self.hb}
        for slot, lease in self.lease.items():
            fields = {"entry": lease.entry, "token": str(lease.token)}
            if lease.stop is not None:
                fields["stop"] = lease.stop
            keys[f"lease:{slot}"] = fields
        keys.update({f"fence:{slot}": str(token) for slot, token in self.fence.items()})
        keys.update({f"q:{slot}": list(q) for slot, q in self.q.items() if q})
        keys.update({f"gone:{e}": reason for e, reason in self.gone.items()})
        keys.update({f"out:{e}": text for e, text in self.out.items()})
        keys.update({f"jn:{e}": frozenset(s) for e, s in self.jn.items() if s})
        keys.update({f"watch:{slot}": frozenset(s) for slot, s in self.watch.items() if s})
        return keys

    # -- the spec's vocabulary -------------------------------------------------------------------

    def _begin(self) -> None:
        self.sent = []
        self.granted = self.grant_kind = None

    def tell(self, instance: str, message: Message) -> None:
        self.sent.append((instance, message))

    def live(self, e: str) -> bool:
        return instance_of(e) in self.hb and e not in self.gone

    def room(self, slot: str) -> None:
        # Resolved for the script (the spec does not say): watchers are told once and
        # forgotten; held work that finds the queue full again registers again.
        for i in sorted(self.watch.pop(slot, ())):
            self.tell(i, ["room", slot])

    def done(self, e: str) -> None:
        for i in sorted(self.jn.get(e, ())):
            self.tell(i, ["done", e])

    def prune(self, slot: str) -> list[str]:
        """The slot's queue with every entry that is not live removed (room if any)."""
        q = self.q.get(slot, [])
        kept = [e for e in q if self.live(e)]
        if len(kept) != len(q):
            self.q[slot] = kept
            self.room(slot)
        return self.q.setdefault(slot, kept)

    def holder(self, slot: str) -> str | None:
        lease = self.lease.get(slot)
        return None if lease is None else instance_of(lease.entry)

    def retry(self, slot: str, q: list[str]) -> Retry:
        if slot in self.lease:
            return Retry(f"lease:{slot}")
        if q:
            return Retry(f"hb:{instance_of(q[0])}")
        return Retry(None)

    def grant(self, slot: str, e: str, kind: str) -> NewToken:
        assert slot not in self.lease, "a lease is granted only while free"
        self.lease[slot] = Lease(e, None)
        self.granted, self.grant_kind = slot, kind
        return NEW_TOKEN

    def bind_token(self, token: int) -> None:
        assert self.granted is not None
        self.lease[self.granted].token = token
        self.fence[self.granted] = token

    def hand_over(self, slot: str) -> None:
        """A lease was given back: the live head takes it, and its process is told."""
        if slot not in self.lease:
            q = self.prune(slot)
            if q:
                e = q.pop(0)
                token = self.grant(slot, e, "pushed")
                self.room(slot)
                self.tell(instance_of(e), ["grant", slot, e, token, SERVER_MS])

    def stop(self, slot: str, requester: str) -> None:
        lease = self.lease[slot]
        if lease.stop is None:
            lease.stop = requester
            self.tell(instance_of(lease.entry), ["stop", slot, lease.entry, requester])

    # -- scripts -------------------------------------------------------------------------------

    def submit(self, slot: str, e: str, policy: str, max_queue: int, watch: bool) -> list[Any]:
        self._begin()
        me = instance_of(e)
        lease = self.lease.get(slot)
        if lease is not None and lease.entry == e:
            return ["owner", str(lease.token), None]
        # Resolved for the script: the spec checks "already queued" before "gone", and
        # prunes first; the script answers gone before it reads (or prunes) the queue.
        # Equivalent (a queued entry has no marker), but a late submit changes nothing.
        if e in self.gone:
            return ["gone", self.gone[e]]
        q = self.prune(slot)
        if e in q:
            return ["queued", self.holder(slot), self.retry(slot, q), None]
        if lease is None and not q:
            return ["owner", self.grant(slot, e, "idle"), None]
        if lease is None and policy != "replace":
            # The head's claim is due, or never comes (its process lost the entry in a
            # failover): the head takes the free lease now, as after a release.
            self.hand_over(slot)
            q = self.q[slot]
        holder = self.holder(slot)
        if policy == "drop_if_running":
            return ["busy", holder, self.retry(slot, q)]
        if policy == "join":
            target = q[-1] if q else self.lease[slot].entry
            self.jn.setdefault(target, set()).add(me)
            return ["joined", target, holder, self.retry(slot, q)]
        if policy == "queue":
            if len(q) >= max_queue:
                if watch:
                    self.watch.setdefault(slot, set()).add(me)
                return ["full", holder, self.retry(slot, q)]
            retry = self.retry(slot, q)
            q.append(e)
            return ["queued", holder, retry, None]
        # replace
        if lease is not None:
            self.stop(slot, me)
        displaced = q[0] if q else None
        if displaced is not None:
            q[0] = e
            self.gone[displaced] = "superseded"
            self.tell(instance_of(displaced), ["superseded", slot, displaced])
            self.done(displaced)
        else:
            q.insert(0, e)
        if lease is None:  # a hand-over was in flight: the replacement takes the lease
            q.pop(0)
            token = self.grant(slot, e, "replace")
            # Resolved for the script (the spec does not say): the queue is one entry
            # shorter, so held work is told, as for any entry that leaves it.
            self.room(slot)
            return ["owner", token, displaced]
        return ["queued", holder, self.retry(slot, q), displaced]

    def claim(self, slot: str, e: str) -> list[Any]:
        self._begin()
        lease = self.lease.get(slot)
        if lease is not None and lease.entry == e:
            return ["owner", str(lease.token)]
        if e in self.gone:
            return ["gone", self.gone[e]]
        q = self.prune(slot)
        if e not in q:
            return ["missing"]
        if lease is None and q[0] != e:
            self.hand_over(slot)  # as in submit
            return ["wait", self.retry(slot, q)]
        if lease is not None or q[0] != e:
            return ["wait", self.retry(slot, q)]
        q.pop(0)
        token = self.grant(slot, e, "head")
        self.room(slot)
        return ["owner", token]

    def release(self, slot: str, e: str, outcome: str) -> str:
        self._begin()
        lease = self.lease.get(slot)
        if lease is not None and lease.entry == e:
            del self.lease[slot]
        reply = "ok"
        if outcome:
            self.out[e] = outcome
            self.done(e)
        elif e in self.jn:
            # Resolved for the script: the spec stores "pending" whenever joiners exist;
            # a release sent again after the outcome was stored must not replace it
            # (the joiners would wait for an outcome nobody sends again).
            self.out.setdefault(e, "pending")
            if self.out[e] == "pending":
                reply = "need_outcome"
        self.hand_over(slot)
        return reply

    def store_outcome(self, e: str, outcome: str) -> str:
        self._begin()
        self.out[e] = outcome
        self.done(e)
        return "ok"

    def withdraw(self, slot: str, e: str, reason: str) -> str:
        self._begin()
        # Resolved for the script: the spec sets the marker; the script keeps the first
        # reason (a superseded entry withdrawn by a process that had not heard of it yet
        # stays superseded for its joiners; a late withdrawal rewrites nothing).
        self.gone.setdefault(e, reason)
        q = self.q.get(slot, [])
        if e in q:
            q[:] = [x for x in q if x != e]
            self.room(slot)
        lease = self.lease.get(slot)
        if lease is not None and lease.entry == e:
            del self.lease[slot]
        self.done(e)
        # The spec hands the lease over whenever it is free, also after a withdrawal
        # that changed nothing: a try of it that failed before its hand-over (sent
        # again by the keeper) left the lease free, as a release's does.
        self.hand_over(slot)
        return "ok"

    def stop_owner(self, slot: str, requester: str) -> list[str | None] | None:
        self._begin()
        lease = self.lease.get(slot)
        if lease is None:
            return None
        self.stop(slot, requester)
        return [self.holder(slot), str(lease.token)]

    def renew(
        self,
        me: str,
        leases: list[tuple[str, str]],
        entries: list[tuple[str, str]],
        follows: list[tuple[str, str]],
    ) -> list[Any]:
        self._begin()
        expired = me not in self.hb
        self.hb.add(me)
        lease_items: list[str | None] = []
        for slot, e in leases:
            lease = self.lease.get(slot)
            if lease is not None and lease.entry == e:
                lease_items.append(lease.stop or "")
            else:
                lease_items.append(None)
        entry_items: list[list[Any]] = []
        for slot, e in entries:
            lease = self.lease.get(slot)
            if lease is not None and lease.entry == e:
                entry_items.append(["owner", str(lease.token)])
                continue
            if lease is not None and not expired and e in self.q.get(slot, ()):
                # Resolved for the script (the spec does not say): behind a holder the
                # entry cannot be claimed, so the renewal does not prune its queue
                entry_items.append(["queued", 0])
                continue
            q = self.prune(slot)
            if e not in q and e in self.gone:
                entry_items.append(["gone", self.gone[e]])
                continue
            state = "queued"
            if e not in q or expired:
                # The rule: entries lost with the data, or of a process whose heartbeat
                # expired meanwhile, are re-submitted at the tail
                if e in q:
                    q.remove(e)
                q.append(e)
                state = "resubmitted"
            entry_items.append([state, int(slot not in self.lease and q[0] == e)])
        follow_items: list[list[Any]] = []
        for slot, e in follows:
            # Resolved for the script (the spec's renew does not say it): each check
            # registers the joiner again, so a release after lost data asks for the
            # outcome (the rule: "with the stored outcome if the followed process stores
            # one within one renewal interval").
            self.jn.setdefault(e, set()).add(me)
            lease = self.lease.get(slot)
            pending = self.out.get(e) == "pending"
            if e in self.out and not pending:
                follow_items.append(["out", self.out[e]])
            elif e in self.gone:
                follow_items.append(["gone", self.gone[e]])
            # Resolved for the script: the spec reports any out: text; "pending" is no
            # outcome (it would not decode), but says one is on its way while the
            # followed process lives.
            elif instance_of(e) in self.hb and (
                pending or e in self.q.get(slot, ()) or (lease is not None and lease.entry == e)
            ):
                follow_items.append(["live"])
            else:
                follow_items.append(["lost"])
        return [lease_items, entry_items, follow_items]

    def cluster_slot(self, slot: str) -> list[Any]:
        self._begin()
        live = sum(1 for e in self.q.get(slot, ()) if self.live(e))
        lease = self.lease.get(slot)
        if lease is None:
            return [None, None, None, live]
        return [instance_of(lease.entry), str(lease.token), Retry(f"lease:{slot}"), live]

    # -- not scripts ---------------------------------------------------------------------------

    def kill(self, instance: str) -> None:
        self._begin()
        self.hb.discard(instance)

    def expire_lease(self, slot: str) -> None:
        """The lease expires (its holder stopped renewing): nothing is handed over."""
        self._begin()
        del self.lease[slot]


# -- the server side, driven from the machine's thread ---------------------------------------

DUMP = r"""
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do
  local t = redis.call('TYPE', k)['ok']
  local v
  if t == 'string' then v = redis.call('GET', k)
  elseif t == 'list' then v = redis.call('LRANGE', k, 0, -1)
  elseif t == 'hash' then v = redis.call('HGETALL', k)
  elseif t == 'set' then v = redis.call('SMEMBERS', k)
  else v = t end
  out[#out + 1] = {k, t, v, redis.call('PTTL', k)}
end
return out
"""


@attrs.frozen
class Observed:
    """What one step did on the server: the reply, every key of the namespace (value
    and PTTL, prefix removed) and the messages each instance received."""

    reply: Any
    keys: dict[str, object]
    pttl: dict[str, int]
    messages: dict[str, list[Message]]


class Server:
    """A trio loop in a helper thread that holds a client and every instance's
    subscription; the state machine's synchronous rules call into it."""

    def __init__(self, url: str, store: RedisSlotStore) -> None:
        self.url = url
        self.store = store
        self.prefix = store.key_prefix
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._failure: BaseException | None = None
        self._syncs = itertools.count()

    def __enter__(self) -> Server:
        self._thread.start()
        if not self._ready.wait(timeout=10) or self._token is None:
            raise RuntimeError(f"the server helper did not start: {self._failure!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout=10)

    async def _main(self) -> None:
        try:
            async with (
                coredis.Redis.from_url(self.url, decode_responses=True) as client,
                open_inboxes(self.url, self.store, *INSTANCES, SYNC) as inboxes,
            ):
                self.client = client
                self.scripts = Scripts(client, self.store)
                self.inboxes: dict[str, Inbox] = inboxes
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            raise

    def _run(self, fn: Callable[[], Awaitable[T]]) -> T:
        assert self._token is not None
        return trio.from_thread.run(fn, trio_token=self._token)

    async def _observe(self, reply: Any) -> Observed:
        raw = await self.client.eval(DUMP, [], [self.prefix])
        keys: dict[str, object] = {}
        pttl: dict[str, int] = {}
        for key, kind, value, ttl in raw:  # type: ignore[union-attr]
            name = str(key)[len(self.prefix) :]
            if kind == "hash":
                flat = list(value)
                keys[name] = dict(zip(flat[::2], flat[1::2], strict=True))
            elif kind == "set":
                keys[name] = frozenset(value)
            elif kind == "list":
                keys[name] = list(value)
            else:
                keys[name] = value
            pttl[name] = int(ttl)
        # Messages of one client connection arrive in order: once the marker is in,
        # everything this step published is too.
        marker = ["sync", next(self._syncs)]
        await self.client.publish(f"{self.prefix}ch:{SYNC}", json.dumps(marker))
        await self.inboxes[SYNC].wait_for(lambda m: m == marker)
        messages = {}
        for instance, inbox in self.inboxes.items():
            if instance != SYNC:
                messages[instance] = list(inbox.messages)
            inbox.messages.clear()
        return Observed(reply, keys, pttl, messages)

    def call(self, script: scripts.Script, args: tuple[str, ...]) -> Observed:
        async def step() -> Observed:
            return await self._observe(await self.scripts.call(script, *args))

        return self._run(step)

    def calls(self, calls: list[tuple[scripts.Script, tuple[str, ...]]]) -> Observed:
        """Run ``calls`` one after another; observe once, after the last (the replies,
        a list)."""

        async def step() -> Observed:
            replies = [await self.scripts.call(script, *args) for script, args in calls]
            return await self._observe(replies)

        return self._run(step)

    def kill(self, instance: str) -> Observed:
        async def step() -> Observed:
            await self.scripts.kill(instance)
            return await self._observe(None)

        return self._run(step)

    def expire_lease(self, slot: str) -> Observed:
        async def step() -> Observed:
            await self.scripts.expire_lease(slot)
            return await self._observe(None)

        return self._run(step)

    def flushall(self) -> Observed:
        async def step() -> Observed:
            await self.client.flushall()
            return await self._observe(None)

        return self._run(step)


# -- the machine ------------------------------------------------------------------------------


@attrs.define
class Work:
    """One submission as its process sees it."""

    entry: str
    slot: str
    # queued, held, owner, lost (refused at a renewal), needs_outcome, withdrawn,
    # overtaken (withdrawn before its submit arrived), done
    status: str
    stale: bool = False  # its process died or the data was lost since it was confirmed

    @property
    def instance(self) -> str:
        return instance_of(self.entry)


@attrs.define
class Follow:
    instance: str
    slot: str
    target: str
    lost: int = 0


Call = tuple[str, tuple[Any, ...]]

_SCRIPT = {script.name: script for script in scripts.SCRIPTS}

# (action, weight): the machine's operations and how often each is drawn when it can run
ACTIONS = (
    ("submit", 3),
    ("submit_to_a_busy_slot", 6),
    ("claim", 4),
    ("release", 4),
    ("renew", 3),
    ("withdraw", 2),
    ("read_messages", 2),
    ("send_again", 2),
    ("submit_held_again", 2),
    ("store_outcome", 2),
    ("kill", 1),
    ("expire_lease", 1),
    ("flushall", 1),
    ("withdraw_unsent", 1),
    ("submit_after_its_withdrawal", 1),
    ("stop_owner", 1),
    ("cluster_slot", 1),
    ("send_obligation_again", 1),
    ("submit_not_acted_on", 1),
    ("claim_not_acted_on", 1),
)


class ClusterQueueMachine(RuleBasedStateMachine):
    """The model and the real scripts, side by side; see the module docstring."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.server = server
        self.model = ClusterModel()
        self.work: dict[str, Work] = {}
        self.follows: list[Follow] = []
        self.numbers = itertools.count(1)
        self.max_token: dict[str, int] = {}  # survives FLUSHALL: tokens must keep growing
        self.last: Call | None = None
        self.obligations: list[Call] = []
        # messages a process has not read yet: until it does, it acts on what it knew
        self.inbox: dict[str, list[Message]] = {i: [] for i in INSTANCES}
        observed = server.flushall()
        assert observed.keys == {}

    # -- driving both sides ----------------------------------------------------------------

    def send(self, name: str, *args: Any) -> Any:
        """Run one script on the model and on the server; compare; return the reply."""
        before = self.model.copy()
        expected = getattr(self.model, name)(*args)
        observed = self.server.call(_SCRIPT[name], self.wire_args(name, args))
        if name == "renew":
            observed = attrs.evolve(observed, reply=scripts.renew_items(observed.reply))
        tokens: list[int] = []
        self.match(expected, observed.reply, observed, tokens, path=name)
        self.match(self.expected_messages(), observed.messages, observed, tokens, name)
        if self.model.granted is not None:
            assert len(tokens) == 1, tokens
            self.check_grant(before, tokens[0])
            self.model.bind_token(tokens[0])
        else:
            assert tokens == []
        self.compare_state(observed)
        self.last = (name, args)
        return observed.reply

    @staticmethod
    def wire_args(name: str, args: tuple[Any, ...]) -> tuple[str, ...]:
        if name == "submit":
            slot, e, policy, max_queue, watch = args
            return scripts.submit_args(slot, e, policy, max_queue, watch)
        if name == "renew":
            return scripts.renew_args(*args)
        return tuple(map(str, args))

    def match(
        self, expected: Any, real: Any, observed: Observed, tokens: list[int], path: str
    ) -> None:
        if expected is NEW_TOKEN:
            assert isinstance(real, str), (path, real)
            assert real.isdigit(), (path, real)
            tokens.append(int(real))
        elif expected is SERVER_MS:
            assert isinstance(real, str), (path, real)
            assert real.isdigit(), (path, real)
        elif isinstance(expected, dict):
            assert isinstance(real, dict), (path, expected, real)
            assert real.keys() == expected.keys(), (path, expected, real)
            for key, value in expected.items():
                self.match(value, real[key], observed, tokens, f"{path}[{key}]")
        elif isinstance(expected, Retry):
            assert isinstance(real, int), (path, real)
            if expected.key is None:
                assert real == 0, (path, real)
            else:
                # the PTTL at the reply: no less than the key's PTTL after the step
                assert expected.key in observed.pttl, (path, expected.key)
                assert observed.pttl[expected.key] <= real <= TTL_MS, (path, real)
        elif isinstance(expected, list):
            assert isinstance(real, list), (path, expected, real)
            assert len(real) == len(expected), (path, expected, real)
            for i, (e, r) in enumerate(zip(expected, real, strict=True)):
                self.match(e, r, observed, tokens, f"{path}[{i}]")
        else:
            assert real == expected, (path, expected, real)

    def check_grant(self, before: ClusterModel, token: int) -> None:
        """Fence tokens grow per slot, across FLUSHALL; only the live head (or an idle
        slot's submitter, or a REPLACE during a hand-over) takes a free lease."""
        slot = self.model.granted
        assert slot is not None
        kind = self.model.grant_kind
        entry = self.model.lease[slot].entry
        if kind == "pushed":  # the call gave the lease back first
            assert slot not in before.lease or before.lease[slot].entry != entry
        else:
            assert slot not in before.lease
        assert token > self.max_token.get(slot, 0), (slot, token, self.max_token.get(slot))
        assert token > before.fence.get(slot, 0)
        assert token < 2**53
        self.max_token[slot] = token
        # live before the call, and not withdrawn by it (a withdrawal hands over)
        gone = self.model.gone if kind == "pushed" else {}
        live_queue = [e for e in before.q.get(slot, ()) if before.live(e) and e not in gone]
        if kind == "idle":
            assert live_queue == []
        elif kind in ("head", "pushed"):
            assert live_queue[0] == entry
            assert self.model.hb >= {instance_of(entry)}, "a dead head took the lease"
        else:
            assert kind == "replace"
            assert live_queue  # a hand-over in flight

    def compare_state(self, observed: Observed) -> None:
        assert observed.keys == self.model.render()
        for key, ttl in observed.pttl.items():
            kind = key.partition(":")[0]
            if kind in ("lease", "hb", "watch"):
                assert 0 < ttl <= TTL_MS, (key, ttl)
            elif kind in ("gone", "out", "jn"):
                assert 0 < ttl <= KEEP_MS, (key, ttl)
            else:
                assert ttl == -1, (key, ttl)  # fences and queues never expire
        self.match(self.expected_messages(), observed.messages, observed, [], "messages")
        for instance, messages in observed.messages.items():
            self.inbox[instance].extend(messages)

    def expected_messages(self) -> dict[str, list[Message]]:
        expected: dict[str, list[Message]] = {i: [] for i in INSTANCES}
        for instance, message in self.model.sent:
            expected[instance].append(message)
        return expected

    # -- choosing ----------------------------------------------------------------------------

    def alive(self) -> list[str]:
        return [i for i in INSTANCES if i in self.model.hb]

    def works(self, *statuses: str) -> list[Work]:
        return [
            w for w in self.work.values() if w.status in statuses and w.instance in self.model.hb
        ]

    def new_entry(self, instance: str) -> str:
        return f"{instance}/{next(self.numbers)}"

    # -- actions --------------------------------------------------------------------------
    #
    # One rule draws a weighted action among those that can run now, so that examples
    # spend their steps where the scripts differ (busy slots, hand-overs, renewals after
    # a death) rather than on idle renewals; each action draws its own arguments.

    @initialize()
    def start_instances(self) -> None:
        for instance in INSTANCES:
            self.renew_instance(instance)

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        choices = [name for name, weight in ACTIONS for _ in range(weight) if self.can(name)]
        name = data.draw(st.sampled_from(choices), label="action")
        getattr(self, name)(data)

    def can(self, action: str) -> bool:
        match action:
            case "submit" | "withdraw_unsent" | "submit_not_acted_on":
                return bool(self.alive()) and not (action == "withdraw_unsent" and self.overtaken())
            case "submit_to_a_busy_slot":
                return bool(self.alive() and self.busy_slots())
            case "submit_held_again":
                return bool(self.works("held"))
            case "submit_after_its_withdrawal":
                return bool(self.overtaken())
            case "claim" | "claim_not_acted_on":
                return bool(self.works("queued"))
            case "release":
                return bool(self.works("owner", "lost"))
            case "store_outcome":
                return bool(self.works("needs_outcome"))
            case "withdraw":
                return bool(self.works("queued", "held", "owner"))
            case "stop_owner":
                return bool(self.alive() and self.model.lease)
            case "read_messages":
                return any(self.inbox.values())
            case "cluster_slot" | "flushall":
                return bool(self.busy_slots())
            case "expire_lease":
                return bool(self.model.lease)
            case "kill":
                return bool(self.alive())
            case "send_again":
                return self.last is not None
            case "send_obligation_again":
                return bool(self.obligations)
            case _:  # renew
                return True

    def busy_slots(self) -> list[str]:
        return [slot for slot in SLOTS if slot in self.model.lease or self.model.q.get(slot)]

    def overtaken(self) -> list[Work]:
        return [w for w in self.works("overtaken") if not w.stale]

    def submit(self, data: st.DataObject) -> None:
        """A new submission from a live process, to any slot."""
        instance = data.draw(st.sampled_from(self.alive()), label="instance")
        slot = data.draw(slots, label="slot")
        self.submit_new(data, instance, slot)

    def submit_to_a_busy_slot(self, data: st.DataObject) -> None:
        """Where the policies differ: a slot with a lease or a queue."""
        instance = data.draw(st.sampled_from(self.alive()), label="instance")
        slot = data.draw(st.sampled_from(self.busy_slots()), label="slot")
        self.submit_new(data, instance, slot)

    def submit_new(self, data: st.DataObject, instance: str, slot: str) -> None:
        policy = data.draw(st.sampled_from(POLICIES), label="policy")
        max_queue = data.draw(queue_bounds, label="max_queue")
        watch = data.draw(st.booleans(), label="watch")
        self.submit_work(Work(self.new_entry(instance), slot, "new"), policy, max_queue, watch)

    def submit_work(self, work: Work, policy: str, max_queue: int, watch: bool) -> None:
        reply = self.send("submit", work.slot, work.entry, policy, max_queue, watch)
        self.work[work.entry] = work
        work.stale = False
        match reply[0]:
            case "owner":
                work.status = "owner"
            case "queued":
                work.status = "queued"
            case "full":
                work.status = "held" if watch else "done"
            case "joined":
                work.status = "done"
                self.follows.append(Follow(work.instance, work.slot, reply[1]))
            case _:  # busy, gone
                work.status = "done"

    def submit_held_again(self, data: st.DataObject) -> None:
        """Held work is submitted again (on Room, or at a renewal)."""
        work = data.draw(st.sampled_from(self.works("held")), label="work")
        self.submit_work(work, "queue", data.draw(queue_bounds, label="max_queue"), True)

    def withdraw_unsent(self, data: st.DataObject) -> None:
        """A withdrawal that overtakes the submit it withdraws (a failed round trip)."""
        instance = data.draw(st.sampled_from(self.alive()), label="instance")
        slot = data.draw(slots, label="slot")
        work = Work(self.new_entry(instance), slot, "overtaken")
        self.work[work.entry] = work
        self.oblige("withdraw", slot, work.entry, "store_unavailable")

    def submit_after_its_withdrawal(self, data: st.DataObject) -> None:
        """The overtaken submit arrives: it finds the marker and changes nothing."""
        work = data.draw(st.sampled_from(self.overtaken()), label="work")
        policy = data.draw(st.sampled_from(POLICIES), label="policy")
        work.status = "withdrawn"
        reply = self.send("submit", work.slot, work.entry, policy, 3, False)
        assert reply[0] == "gone"

    def claim(self, data: st.DataObject) -> None:
        work = data.draw(st.sampled_from(self.works("queued")), label="work")
        reply = self.send("claim", work.slot, work.entry)
        if reply[0] == "owner":
            work.status = "owner"
        elif reply[0] == "gone":
            work.status = "done"

    def submit_not_acted_on(self, data: st.DataObject) -> None:
        """A submit the server ran in a round trip the keeper handled as failed: the
        reply is not acted on, and the entry is withdrawn (any lease it took given back)."""
        instance = data.draw(st.sampled_from(self.alive()), label="instance")
        slot = data.draw(slots, label="slot")
        work = Work(self.new_entry(instance), slot, "withdrawn")
        policy = data.draw(st.sampled_from(POLICIES), label="policy")
        watch = data.draw(st.booleans(), label="watch")
        self.send("submit", slot, work.entry, policy, data.draw(queue_bounds), watch)
        self.work[work.entry] = work
        self.oblige("withdraw", slot, work.entry, "store_unavailable")

    def claim_not_acted_on(self, data: st.DataObject) -> None:
        """A claim the server ran in a round trip the keeper handled as failed: the entry
        stays queued for the keeper, and its next renewal (or claim) tells it the lease."""
        work = data.draw(st.sampled_from(self.works("queued")), label="work")
        self.send("claim", work.slot, work.entry)

    def release(self, data: st.DataObject) -> None:
        """An owner physically exited (also after a lost lease); with or without its
        outcome (the keeper sends it only when asked: need_outcome)."""
        work = data.draw(st.sampled_from(self.works("owner", "lost")), label="work")
        with_outcome = data.draw(st.booleans(), label="with_outcome")
        outcome = json.dumps({"kind": "completed", "of": work.entry}) if with_outcome else ""
        reply = self.oblige("release", work.slot, work.entry, outcome)
        work.status = "needs_outcome" if reply == "need_outcome" else "done"

    def store_outcome(self, data: st.DataObject) -> None:
        work = data.draw(st.sampled_from(self.works("needs_outcome")), label="work")
        self.oblige("store_outcome", work.entry, json.dumps({"kind": "failed"}))
        work.status = "done"

    def withdraw(self, data: st.DataObject) -> None:
        """Queued or held work removed; an owner withdrawn as the keeper does after a
        lost reply (its lease given back)."""
        work = data.draw(st.sampled_from(self.works("queued", "held", "owner")), label="work")
        reason = data.draw(st.sampled_from(WITHDRAW_REASONS), label="reason")
        if work.status == "owner":
            reason = "store_unavailable"
        self.oblige("withdraw", work.slot, work.entry, reason)
        work.status = "withdrawn"

    def stop_owner(self, data: st.DataObject) -> None:
        """cancel_slot against a remote owner (or a lease that just went)."""
        instance = data.draw(st.sampled_from(self.alive()), label="instance")
        slot = data.draw(slots, label="slot")
        self.oblige("stop_owner", slot, instance)

    def renew(self, data: st.DataObject) -> None:
        """A renewal: also how a paused process (its heartbeat expired) comes back."""
        self.renew_instance(data.draw(st.sampled_from(INSTANCES), label="instance"))

    def renew_instance(self, instance: str) -> None:
        mine = sorted(
            (w for w in self.work.values() if w.instance == instance),
            key=lambda w: int(w.entry.rpartition("/")[2]),
        )
        leases = [w for w in mine if w.status == "owner"]
        entries = [w for w in mine if w.status == "queued"]
        follows = [f for f in self.follows if f.instance == instance]
        reply = self.send(
            "renew",
            instance,
            [(w.slot, w.entry) for w in leases],
            [(w.slot, w.entry) for w in entries],
            [(f.slot, f.target) for f in follows],
        )
        for work, item in zip(leases, reply[0], strict=True):
            if item is None:
                work.status = "lost"
        for work, item in zip(entries, reply[1], strict=True):
            work.stale = False
            if item[0] == "owner":
                work.status = "owner"
            elif item[0] == "gone":
                work.status = "done"
        for follow, item in zip(follows, reply[2], strict=True):
            follow.lost = follow.lost + 1 if item[0] == "lost" else 0
            if item[0] in ("out", "gone") or follow.lost >= 2:
                self.follows.remove(follow)

    def read_messages(self, data: st.DataObject) -> None:
        """A process reads its messages (until then it may withdraw, claim or renew work
        that was superseded or granted meanwhile); ``superseded`` ends queued work,
        ``grant`` makes it the owner while the server still holds that grant (a
        process that skips the message finds the grant at its next claim or renewal)."""
        instance = data.draw(st.sampled_from([i for i in INSTANCES if self.inbox[i]]))
        for message in self.inbox[instance]:
            work = self.work.get(message[2]) if message[0] in ("superseded", "grant") else None
            if work is None or work.status != "queued":
                continue
            if message[0] == "superseded":
                work.status = "done"
            else:
                lease = self.model.lease.get(work.slot)
                if lease is not None and (lease.entry, str(lease.token)) == tuple(message[2:4]):
                    work.status = "owner"
        self.inbox[instance].clear()

    def cluster_slot(self, data: st.DataObject) -> None:
        self.send("cluster_slot", data.draw(slots, label="slot"))

    def kill(self, data: st.DataObject) -> None:
        """An instance dies: its heartbeat expires (its leases would later too)."""
        instance = data.draw(st.sampled_from(self.alive()), label="instance")
        self.model.kill(instance)
        self.compare_state(self.server.kill(instance))
        for work in self.work.values():
            if work.instance == instance and work.status == "queued":
                work.stale = True
        self.last = None

    def expire_lease(self, data: st.DataObject) -> None:
        """A lease expires (its holder's process was paused): nothing is handed over; the
        head claims at the expiry it was told."""
        slot = data.draw(st.sampled_from(sorted(self.model.lease)), label="slot")
        holder = self.model.lease[slot].entry
        self.model.expire_lease(slot)
        self.compare_state(self.server.expire_lease(slot))
        work = self.work.get(holder)
        if work is not None and work.status in ("owner", "queued"):  # queued: granted, unread
            work.stale = True
        self.last = None

    def flushall(self, data: st.DataObject) -> None:
        """The server restarts without its data."""
        self.model.flushall()
        self.compare_state(self.server.flushall())
        for work in self.work.values():
            if work.status in ("queued", "owner", "overtaken"):
                work.stale = True  # overtaken: its marker is lost too
        self.last = None

    def send_again(self, data: st.DataObject) -> None:
        """The last call is sent again (its reply was lost): it changes nothing."""
        assert self.last is not None
        name, args = self.last
        before = self.model.render()
        self.send(name, *args)
        assert self.model.render() == before, f"{name} sent again changed the state"

    def send_obligation_again(self, data: st.DataObject) -> None:
        """An earlier withdrawal, release, outcome or stop request arrives again later."""
        name, args = data.draw(st.sampled_from(self.obligations), label="call")
        self.send(name, *args)

    def oblige(self, name: str, *args: Any) -> Any:
        self.obligations.append((name, args))
        return self.send(name, *args)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def leases_are_sound(self) -> None:
        m = self.model
        queued = [e for q in m.q.values() for e in q]
        assert len(queued) == len(set(queued)), "an entry is queued twice"
        assert not set(queued) & m.gone.keys(), "a gone entry is queued"
        for lease in m.lease.values():
            assert lease.entry not in queued
            assert lease.entry not in m.gone
        owners = [w.slot for w in self.work.values() if w.status == "owner" and not w.stale]
        assert len(owners) == len(set(owners)), "two processes own one slot"
        for work in self.work.values():
            if work.stale:
                continue
            if work.status == "owner":
                assert m.lease[work.slot].entry == work.entry, f"{work} lost its lease"
            elif work.status == "queued":
                lease = m.lease.get(work.slot)
                # Granted (by a claim not acted on, or a pushed grant not yet read):
                # its renewal says so.
                granted = lease is not None and lease.entry == work.entry
                assert work.entry in m.q.get(work.slot, ()) or work.entry in m.gone or granted, (
                    f"{work} lost its place"
                )


# -- the tests --------------------------------------------------------------------------------


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[Server]:
    store = RedisSlotStore(redis_server.url, namespace="model", lease_ttl=LEASE_TTL)
    with Server(redis_server.url, store) as running:
        yield running


SETTINGS = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_scripts_follow_the_model(server: Server) -> None:
    """Random operation sequences: the scripts do what the model says, step by step."""
    run_state_machine_as_test(lambda: ClusterQueueMachine(server), settings=SETTINGS)


@pytest.mark.slow
def test_scripts_follow_the_model_long(server: Server) -> None:
    """The same, with many more and longer sequences."""
    run_state_machine_as_test(
        lambda: ClusterQueueMachine(server),
        settings=settings(SETTINGS, max_examples=1500, stateful_step_count=80),
    )


# -- grouped calls: the same as their calls one at a time ---------------------------------------

GONE = "model-d:4:0000000d"  # no heartbeat: its queued entries are pruned
grouped_calls = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            slots,
            st.sampled_from([*INSTANCES, GONE]),
            st.integers(1, 4),
            st.sampled_from(POLICIES),
            queue_bounds,
            st.booleans(),
        ),
        st.tuples(
            st.just("release"),
            slots,
            st.sampled_from(INSTANCES),
            st.integers(1, 4),
            st.sampled_from(["", '{"kind": "succeeded"}']),
        ),
    ),
    min_size=2,
    max_size=14,
)


def _wire_call(call: tuple[Any, ...]) -> tuple[str, tuple[str, ...]]:
    name, slot, instance, n, *rest = call
    if name == "submit":
        policy, max_queue, watch = rest
        return name, scripts.submit_args(slot, f"{instance}/{n}", policy, max_queue, watch)
    return name, (slot, f"{instance}/{n}", *rest)


def _masked(value: Any) -> Any:
    """``value`` without what the server's clock decides: fence tokens, expiry times
    (decimal strings) and retry hints (numbers)."""
    if isinstance(value, str) and value.isdigit() and len(value) >= 13:
        return "<clock>"
    if isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return "<ms>"
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    return value


def _expiry_class(pttl: int) -> str:
    return "none" if pttl < 0 else "lease_ttl" if pttl <= TTL_MS else "keep"


@settings(
    SETTINGS,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(calls=grouped_calls)
def test_a_grouped_call_answers_as_its_calls_one_at_a_time(
    server: Server, calls: list[tuple[Any, ...]]
) -> None:
    """Random submits and releases (dead heads, every policy, bounded queues, joiners)
    run once one call at a time and once with each run of consecutive calls of a
    script as one call of its grouped form: the same replies, keys, expiries and
    messages, but for what the server's clock decides."""
    wire = [_wire_call(call) for call in calls]
    seen = []
    for grouped in (False, True):
        server.flushall()
        server.calls([(scripts.RENEW, scripts.renew_args(i, [], [], [])) for i in INSTANCES])
        sent: list[tuple[scripts.Script, tuple[str, ...]]] = []
        for name, run in itertools.groupby(wire, key=lambda call: call[0]):
            argss = [args for _, args in run]
            if grouped:
                group = scripts.GROUPED[name].script
                sent.append((group, tuple(itertools.chain(*argss))))
            else:
                sent += [(_SCRIPT[name], args) for args in argss]
        observed = server.calls(sent)
        replies = observed.reply if not grouped else list(itertools.chain(*observed.reply))
        expiries = {key: _expiry_class(pttl) for key, pttl in observed.pttl.items()}
        seen.append([*_masked([replies, observed.keys, observed.messages]), expiries])
    assert seen[0] == seen[1]


# -- where the model and the scripts disagreed: each case, replayed on both -------------------
#
# Each test drives the model and the server through one fixed sequence (every step is
# compared as in the random runs) and states the behaviour that was decided.


@pytest.fixture
def machine(server: Server) -> ClusterQueueMachine:
    running = ClusterQueueMachine(server)
    running.start_instances()
    return running


def e(instance: str, n: int) -> str:
    return f"{instance}/{n}"


def test_case_expired_heartbeat_goes_to_the_tail(machine: ClusterQueueMachine) -> None:
    """Decided by the documented rule (the script was fixed): after its heartbeat expired, a
    process's entries are re-submitted at the tail, pruned or not."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "queue", 3, False)
    machine.send("submit", "s0", e(C, 3), "queue", 3, False)
    machine.model.kill(B)
    machine.compare_state(machine.server.kill(B))
    reply = machine.send("renew", B, [], [("s0", e(B, 2))], [])
    assert reply[1] == [["resubmitted", 0]]
    assert machine.model.q["s0"] == [e(C, 3), e(B, 2)]


def test_case_renewal_behind_a_holder_does_not_prune(machine: ClusterQueueMachine) -> None:
    """Decided for the script: an entry queued behind a lease holder is reported queued
    without a prune of its queue (it cannot be claimed; the next claim, submit or
    release prunes); without a holder the renewal prunes, and tells the watchers."""
    machine.send("submit", "s0", e(A, 1), "queue", 2, False)
    machine.send("submit", "s0", e(C, 2), "queue", 2, False)
    machine.send("submit", "s0", e(B, 3), "queue", 2, False)
    assert machine.send("submit", "s0", e(A, 4), "queue", 2, True)[0] == "full"
    machine.model.kill(C)
    machine.compare_state(machine.server.kill(C))
    assert machine.send("renew", B, [], [("s0", e(B, 3))], [])[1] == [["queued", 0]]
    assert machine.model.q["s0"] == [e(C, 2), e(B, 3)]
    assert machine.model.sent == []
    machine.send("release", "s0", e(A, 1), "")  # prunes C's entry, grants B's
    assert machine.model.q["s0"] == []
    assert machine.model.sent == [
        (A, ["room", "s0"]),
        (B, ["grant", "s0", e(B, 3), NEW_TOKEN, SERVER_MS]),
    ]


def test_case_withdrawal_that_changes_nothing_hands_nothing_over(
    machine: ClusterQueueMachine,
) -> None:
    """Decided for the script: only a withdrawal that freed the lease or left the queue
    hands the lease over (the spec: whenever the lease is free)."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "queue", 3, False)
    machine.send("withdraw", "s0", e(A, 1), "store_unavailable")
    assert machine.model.sent == [(B, ["grant", "s0", e(B, 2), NEW_TOKEN, SERVER_MS])]
    machine.send("withdraw", "s0", e(A, 1), "store_unavailable")
    assert machine.model.sent == []


def test_case_renewal_registers_the_joiner_again(machine: ClusterQueueMachine) -> None:
    """Decided for the script: a followed entry's check adds the joiner to jn: again,
    so after lost data the release still asks for the outcome."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "join", 3, False)
    machine.model.flushall()
    machine.compare_state(machine.server.flushall())
    machine.send("renew", A, [], [], [])
    reply = machine.send("renew", B, [], [], [("s0", e(A, 1))])
    assert reply[2] == [["lost"]]
    assert machine.send("release", "s0", e(A, 1), "") == "need_outcome"


def test_case_watchers_are_told_once(machine: ClusterQueueMachine) -> None:
    """Decided for the script: room tells each watcher once and forgets it."""
    machine.send("submit", "s0", e(A, 1), "queue", 1, False)
    machine.send("submit", "s0", e(A, 2), "queue", 1, False)
    assert machine.send("submit", "s0", e(B, 3), "queue", 1, True)[0] == "full"
    machine.send("withdraw", "s0", e(A, 2), "removed_from_queue")
    assert machine.model.sent == [(B, ["room", "s0"])]
    assert "watch:s0" not in machine.model.render()


def test_case_replace_during_a_hand_over_tells_watchers(machine: ClusterQueueMachine) -> None:
    """Decided for the script: a REPLACE that takes the free lease leaves the queue one
    entry shorter, so the watchers hear of the room."""
    machine.send("submit", "s0", e(A, 1), "queue", 1, False)
    machine.send("submit", "s0", e(A, 2), "queue", 1, False)
    machine.send("submit", "s0", e(B, 3), "queue", 1, True)
    machine.model.expire_lease("s0")
    machine.compare_state(machine.server.expire_lease("s0"))
    reply = machine.send("submit", "s0", e(C, 4), "replace", 1, False)
    assert (reply[0], reply[2]) == ("owner", e(A, 2))
    assert (B, ["room", "s0"]) in machine.model.sent


def test_case_release_sent_again_keeps_the_stored_outcome(machine: ClusterQueueMachine) -> None:
    """Decided for the script: a release without outcome sent again after the outcome
    was stored neither replaces it with "pending" nor asks for it again."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "join", 3, False)
    assert machine.send("release", "s0", e(A, 1), "") == "need_outcome"
    machine.send("store_outcome", e(A, 1), '{"kind":"completed"}')
    assert machine.send("release", "s0", e(A, 1), "") == "ok"
    assert machine.model.out[e(A, 1)] == '{"kind":"completed"}'


def test_case_pending_outcome_is_live_not_out(machine: ClusterQueueMachine) -> None:
    """Decided for the script: "pending" is no outcome: a follower sees the followed
    entry live while its process lives, lost once it died."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "join", 3, False)
    machine.send("release", "s0", e(A, 1), "")
    assert machine.send("renew", B, [], [], [("s0", e(A, 1))])[2] == [["live"]]
    machine.model.kill(A)
    machine.compare_state(machine.server.kill(A))
    assert machine.send("renew", B, [], [], [("s0", e(A, 1))])[2] == [["lost"]]


def test_case_late_submit_answers_gone_before_reading_the_queue(
    machine: ClusterQueueMachine,
) -> None:
    """Decided for the script: a submit of a withdrawn entry answers gone and prunes
    nothing (the spec's order prunes first)."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "queue", 3, False)
    machine.send("withdraw", "s0", e(C, 3), "store_unavailable")
    machine.model.kill(B)
    machine.compare_state(machine.server.kill(B))
    assert machine.send("submit", "s0", e(C, 3), "queue", 3, False) == [
        "gone",
        "store_unavailable",
    ]
    assert machine.model.q["s0"] == [e(B, 2)]  # not pruned


def test_case_withdrawal_keeps_the_first_reason(machine: ClusterQueueMachine) -> None:
    """Decided for the script: a superseded entry withdrawn by a process that had not
    heard of it yet stays superseded."""
    machine.send("submit", "s0", e(A, 1), "queue", 3, False)
    machine.send("submit", "s0", e(B, 2), "queue", 3, False)
    machine.send("submit", "s0", e(C, 3), "replace", 3, False)
    machine.send("withdraw", "s0", e(B, 2), "removed_from_queue")
    assert machine.model.gone[e(B, 2)] == "superseded"
