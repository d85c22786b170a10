"""The cluster scripts (``_redis_scripts``) against a real server, one call at a time.

Every reply shape, the idempotency of each script when it is sent again, cross-process
FIFO, pruning of dead processes, REPLACE's stop and superseded markers, JOIN's target,
withdrawals, renewals and fence tokens. Instances are plain strings here: the scripts
only need their heartbeat keys (``Scripts.heartbeat``) to count them alive.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import attrs
import coredis
import pytest
import trio
from cluster_helpers import Inbox, Scripts, entry, open_inboxes
from conftest import RedisServer

from trio_taskvisor import _redis_scripts as scripts
from trio_taskvisor._config import RedisSlotStore
from trio_taskvisor._redis_client import read_namespace

A, B, C = "host-a:101:0000000a", "host-b:202:0000000b", "host-c:303:0000000c"


@pytest.fixture
async def s(client: coredis.Redis[str], store: RedisSlotStore) -> Scripts:
    runner = Scripts(client, store)
    await runner.heartbeat(A, B, C)
    return runner


@pytest.fixture
async def inbox(
    redis_server: RedisServer, store: RedisSlotStore
) -> AsyncIterator[dict[str, Inbox]]:
    async with open_inboxes(redis_server.url, store, A, B, C) as inboxes:
        yield inboxes


def token_of(reply: list[object]) -> int:
    assert reply[0] == "owner", reply
    return int(str(reply[1]))


# -- submit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["queue", "replace", "drop_if_running", "join"])
async def test_idle_slot_grants_the_lease_for_every_policy(s: Scripts, policy: str) -> None:
    """On an idle slot every policy takes the lease at once."""
    reply = await s.submit("k", entry(A, 1), policy)
    assert reply[0] == "owner"
    assert (await s.lease("k"))["entry"] == entry(A, 1)
    assert await s.queue("k") == []


async def test_submit_sent_again_changes_nothing(s: Scripts) -> None:
    """A re-sent submit returns the first reply's state: same token, same queue."""
    first = await s.submit("k", entry(A, 1))
    assert await s.submit("k", entry(A, 1)) == first
    queued = await s.submit("k", entry(B, 1))
    assert queued[:2] == ["queued", A]
    assert (await s.submit("k", entry(B, 1)))[:2] == ["queued", A]
    assert await s.queue("k") == [entry(B, 1)]


async def test_queue_is_fifo_across_instances(s: Scripts) -> None:
    """Entries of several instances are served in the order the server accepted them."""
    await s.submit("k", entry(A, 1))
    order = [entry(B, 1), entry(C, 1), entry(A, 2), entry(B, 2)]
    for e in order:
        assert (await s.submit("k", e))[0] == "queued"
    served = []
    holder = entry(A, 1)
    for _ in order:
        assert await s.release("k", holder) == "ok"
        # everyone claims; only the live head may take the free lease
        for e in reversed(order):
            if e not in served:
                reply = await s.claim("k", e)
                if reply[0] == "owner":
                    served.append(e)
                    holder = e
                else:
                    assert reply[0] == "wait"
    assert served == order


async def test_busy_reply_names_the_holder_and_its_expiry(s: Scripts) -> None:
    """drop_if_running on a busy slot: busy, with the holder and the lease's PTTL."""
    await s.submit("k", entry(A, 1))
    kind, holder, retry_ms = await s.submit("k", entry(B, 1), "drop_if_running")
    assert (kind, holder) == ("busy", A)
    assert 0 < int(retry_ms) <= 1000
    assert await s.queue("k") == []


async def test_join_follows_the_queue_tail_else_the_owner(s: Scripts) -> None:
    """JOIN's target: the last live work in the line (tail, else the lease's entry)."""
    await s.submit("k", entry(A, 1))
    assert (await s.submit("k", entry(B, 1), "join"))[:3] == ["joined", entry(A, 1), A]
    await s.submit("k", entry(C, 1))
    assert (await s.submit("k", entry(B, 2), "join"))[:2] == ["joined", entry(C, 1)]
    assert await s.client.smembers(f"{s.prefix}jn:{entry(C, 1)}") == {B}
    await s.kill(C)  # a dead tail is not in the line
    assert (await s.submit("k", entry(B, 3), "join"))[:2] == ["joined", entry(A, 1)]


async def test_full_queue_replies_full_and_registers_watchers(s: Scripts) -> None:
    """max_queue bounds live entries; a waiting submitter is told about room later."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1), max_queue=1)
    assert (await s.submit("k", entry(C, 1), max_queue=1))[:2] == ["full", A]
    assert await s.client.smembers(f"{s.prefix}watch:k") == set()
    assert (await s.submit("k", entry(C, 1), max_queue=1, watch=True))[0] == "full"
    assert await s.client.smembers(f"{s.prefix}watch:k") == {C}
    await s.kill(B)  # dead entries do not count: room at once
    assert (await s.submit("k", entry(C, 1), max_queue=1))[0] == "queued"


async def test_room_is_published_to_watchers_when_an_entry_leaves(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """An entry leaving the queue (here: withdrawn) tells every watcher once."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1), max_queue=1)
    await s.submit("k", entry(C, 1), max_queue=1, watch=True)
    await s.withdraw("k", entry(B, 1))
    await inbox[C].wait_kind("room", "k")
    assert await s.client.exists([f"{s.prefix}watch:k"]) == 0


async def test_replace_stops_the_owner_once_and_takes_the_head(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """REPLACE stores the stop marker, tells the holder once, and becomes the head."""
    await s.submit("k", entry(A, 1))
    reply = await s.submit("k", entry(B, 1), "replace")
    assert reply[0] == "queued"
    assert reply[3] is None
    assert (await s.lease("k"))["stop"] == B
    assert await inbox[A].wait_kind("stop") == ["stop", "k", entry(A, 1), B]
    # a second REPLACE supersedes the first and sends no second stop
    reply = await s.submit("k", entry(C, 1), "replace")
    assert reply[0] == "queued"
    assert reply[3] == entry(B, 1)
    assert await inbox[B].wait_kind("superseded") == ["superseded", "k", entry(B, 1)]
    assert await s.get(f"gone:{entry(B, 1)}") == "superseded"
    assert (await s.lease("k"))["stop"] == B
    assert await s.queue("k") == [entry(C, 1)]
    assert (await s.claim("k", entry(B, 1))) == ["gone", "superseded"]
    assert len(inbox[A].of("stop")) == 1


async def test_replace_keeps_the_fifo_tail(s: Scripts) -> None:
    """REPLACE swaps the head only: the rest of the queue stays in order."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1))
    await s.submit("k", entry(A, 2), "replace")
    assert await s.queue("k") == [entry(A, 2), entry(C, 1)]


async def test_replace_during_a_hand_over_takes_the_lease(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """With the lease free and a head waiting (the lease expired: nobody released it, so
    nobody handed it over), REPLACE supersedes the head and owns."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.expire_lease("k")
    reply = await s.submit("k", entry(C, 1), "replace")
    assert reply[0] == "owner"
    assert reply[2] == entry(B, 1)
    assert (await s.lease("k"))["entry"] == entry(C, 1)
    assert await s.queue("k") == []
    await inbox[B].wait_kind("superseded", "k", entry(B, 1))


async def test_superseded_head_tells_its_joiners(s: Scripts, inbox: dict[str, Inbox]) -> None:
    """Joiners of a displaced head learn that it is gone."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1), "join")
    await s.submit("k", entry(A, 2), "replace")
    await inbox[C].wait_kind("done", entry(B, 1))


# -- claim, release, withdraw ------------------------------------------------------------------


async def test_release_grants_the_lease_to_the_live_head(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """A release hands the lease to the live head (skipping dead entries) with a new
    fence token, and pushes the grant to the head's process only; the head's claim
    and renewal see the same grant."""
    first = token_of(await s.submit("k", entry(A, 1)))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1))
    await s.submit("k", entry(A, 2))
    await s.kill(B)
    assert await s.release("k", entry(A, 1)) == "ok"
    lease = await s.lease("k")
    assert lease["entry"] == entry(C, 1)
    assert int(lease["token"]) > first
    assert await s.queue("k") == [entry(A, 2)]  # B's entry pruned, C's taken out
    message = await inbox[C].wait_kind("grant")
    assert message[:4] == ["grant", "k", entry(C, 1), lease["token"]]
    server_ms = round((await s.client.time()).timestamp() * 1000)
    assert server_ms < int(message[4]) <= server_ms + 2 * 1000  # the expiry, lease_ttl on
    assert inbox[A].of("grant") == inbox[B].of("grant") == []
    assert await s.claim("k", entry(C, 1)) == ["owner", lease["token"]]
    _, entries, _ = await s.renew(C, [], [("k", entry(C, 1))])
    assert entries == [["owner", lease["token"]]]


async def test_release_of_a_slot_without_a_live_head_frees_the_lease(s: Scripts) -> None:
    """Without a live entry in the queue the lease is simply free."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.kill(B)
    assert await s.release("k", entry(A, 1)) == "ok"
    assert await s.lease("k") == {}
    assert await s.queue("k") == []


async def test_withdrawn_grant_goes_on_to_the_next_head(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """A grant pushed to work its process withdrew meanwhile is given back by that
    withdrawal, to the next live head, with a newer token; sent again, it does nothing."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1))
    await s.release("k", entry(A, 1))
    granted = await inbox[B].wait_kind("grant", "k", entry(B, 1))
    assert await s.withdraw("k", entry(B, 1), "removed_from_queue") == "ok"
    lease = await s.lease("k")
    assert lease["entry"] == entry(C, 1)
    assert int(lease["token"]) > int(granted[3])
    await inbox[C].wait_kind("grant", "k", entry(C, 1), lease["token"])
    assert await s.withdraw("k", entry(B, 1), "removed_from_queue") == "ok"
    assert await s.lease("k") == lease


async def test_claim_replies(s: Scripts) -> None:
    """claim: wait while held or not the head; owner for the head; missing; gone."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1))
    kind, retry_ms = await s.claim("k", entry(B, 1))
    assert kind == "wait"
    assert 0 < int(retry_ms) <= 1000
    await s.expire_lease("k")
    kind, retry_ms = await s.claim("k", entry(C, 1))  # the head's heartbeat expiry
    assert kind == "wait"
    assert 0 < int(retry_ms) <= 1000
    owned = await s.claim("k", entry(B, 1))
    assert owned[0] == "owner"
    assert await s.claim("k", entry(B, 1)) == owned  # sent again: same grant
    assert await s.claim("k", entry(A, 9)) == ["missing"]
    await s.withdraw("k", entry(C, 1), "queue_timeout")
    assert await s.claim("k", entry(C, 1)) == ["gone", "queue_timeout"]


async def test_dead_head_is_skipped(s: Scripts) -> None:
    """Entries of an instance whose heartbeat expired are pruned: the next one serves."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1))
    await s.expire_lease("k")
    await s.kill(B)
    assert (await s.cluster_slot("k"))[3] == 1  # counted live only, before any prune
    assert (await s.claim("k", entry(C, 1)))[0] == "owner"
    assert await s.queue("k") == []


async def test_release_sent_again_is_harmless(s: Scripts) -> None:
    """A second release of a released lease does not touch the next owner's lease, nor
    hand anything over again."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1))
    await s.release("k", entry(A, 1))
    lease = await s.lease("k")
    assert lease["entry"] == entry(B, 1)
    assert await s.release("k", entry(A, 1)) == "ok"
    assert await s.lease("k") == lease
    assert await s.queue("k") == [entry(C, 1)]


async def test_release_with_joiners_asks_for_the_outcome(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """Without an outcome and with joiners: need_outcome and a pending marker; the
    stored outcome is then announced to every joining instance."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1), "join")
    assert await s.release("k", entry(A, 1)) == "need_outcome"
    assert await s.get(f"out:{entry(A, 1)}") == "pending"
    assert await s.release("k", entry(A, 1)) == "need_outcome"  # sent again
    assert await s.store_outcome(entry(A, 1), '{"kind":"completed"}') == "ok"
    await inbox[B].wait_kind("done", entry(A, 1))
    assert await s.get(f"out:{entry(A, 1)}") == '{"kind":"completed"}'
    assert await s.release("k", entry(A, 1)) == "ok"  # the outcome is there now


async def test_release_with_an_outcome_stores_it(s: Scripts, inbox: dict[str, Inbox]) -> None:
    """A release that carries the outcome stores it at once and tells the joiners."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(C, 1), "join")
    assert await s.release("k", entry(A, 1), '{"x":1}') == "ok"
    await inbox[C].wait_kind("done", entry(A, 1))
    ttl = await s.client.pttl(f"{s.prefix}out:{entry(A, 1)}")
    assert 0 < ttl <= 60_000


async def test_withdraw_gives_back_a_lease_taken_by_a_lost_request(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """A withdrawal of an entry that holds the lease gives it back, to the head."""
    await s.submit("k", entry(A, 1))  # its reply was "lost"
    await s.submit("k", entry(B, 1))
    assert await s.withdraw("k", entry(A, 1), "store_unavailable") == "ok"
    assert (await s.lease("k"))["entry"] == entry(B, 1)
    await inbox[B].wait_kind("grant", "k", entry(B, 1))
    assert await s.withdraw("k", entry(A, 1), "shutting_down") == "ok"  # sent again
    assert await s.get(f"gone:{entry(A, 1)}") == "store_unavailable"  # the first reason stays


async def test_withdraw_overtaking_its_submit_wins(s: Scripts) -> None:
    """A withdrawal that reaches the server before the submit it withdraws: the late
    submit finds the marker and neither queues nor takes the lease."""
    await s.withdraw("k", entry(A, 1), "store_unavailable")
    assert await s.submit("k", entry(A, 1)) == ["gone", "store_unavailable"]
    assert await s.lease("k") == {}


async def test_withdraw_tells_joiners(s: Scripts, inbox: dict[str, Inbox]) -> None:
    """Joiners of withdrawn work learn it is gone."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(C, 1), "join")
    await s.withdraw("k", entry(B, 1), "queue_timeout")
    await inbox[C].wait_kind("done", entry(B, 1))


async def test_stop_owner_marks_the_lease_once(s: Scripts, inbox: dict[str, Inbox]) -> None:
    """stop_owner replies with the holder and its token, stores the requester, tells the
    holder once."""
    assert await s.stop_owner("k", B) is None
    _, token, _ = await s.submit("k", entry(A, 1))
    assert await s.stop_owner("k", B) == [A, token]
    assert await s.stop_owner("k", C) == [A, token]
    assert scripts.parse_stop_owner(await s.stop_owner("k", C)) == int(token)
    assert scripts.parse_stop_owner(None) is None
    assert (await s.lease("k"))["stop"] == B
    await inbox[A].wait_kind("stop", "k", entry(A, 1), B)
    assert len(inbox[A].of("stop")) == 1


# -- renew -------------------------------------------------------------------------------------


async def test_renew_extends_held_leases_and_refuses_lost_ones(s: Scripts) -> None:
    """renew: '' for a renewed lease, the stop requester when one asked, None if lost."""
    await s.submit("a", entry(A, 1))
    await s.submit("b", entry(A, 2))
    await s.submit("c", entry(B, 1))
    await s.stop_owner("b", C)
    await s.client.pexpire(f"{s.prefix}lease:a", 100)
    leases, _, _ = await s.renew(A, [("a", entry(A, 1)), ("b", entry(A, 2)), ("c", entry(A, 3))])
    assert leases == ["", C, None]
    assert await s.client.pttl(f"{s.prefix}lease:a") > 500


async def test_renew_reports_queued_entries(s: Scripts) -> None:
    """renew: queued with claimable when the lease is free and the entry is the head."""
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(A, 2))
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1)), ("k", entry(A, 2))])
    assert entries == [["queued", 0], ["queued", 0]]
    await s.expire_lease("k")  # an expiry hands nothing over
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1)), ("k", entry(A, 2))])
    assert entries == [["queued", 1], ["queued", 0]]


async def test_renew_resubmits_lost_entries_at_the_tail(s: Scripts) -> None:
    """An entry the server no longer has (pruned while this process was dead, or lost
    with the data) goes back at the tail: a new acceptance."""
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(C, 1))
    await s.kill(A)
    await s.claim("k", entry(C, 1))  # prunes A's entry
    assert await s.queue("k") == [entry(C, 1)]
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])
    assert entries == [["resubmitted", 0]]
    assert await s.queue("k") == [entry(C, 1), entry(A, 1)]
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])  # sent again
    assert entries == [["queued", 0]]


async def test_renew_after_a_heartbeat_expiry_moves_entries_to_the_tail(s: Scripts) -> None:
    """A process whose heartbeat expired (a long pause) has its entries re-submitted at
    the tail by its next renewal, also where no script pruned them
    meanwhile; while its heartbeat lives, an entry keeps its place."""
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(C, 1))
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])
    assert entries == [["queued", 0]]
    await s.kill(A)  # nothing reads the queue until A's next renewal
    assert await s.queue("k") == [entry(A, 1), entry(C, 1)]
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])
    assert entries == [["resubmitted", 0]]
    assert await s.queue("k") == [entry(C, 1), entry(A, 1)]
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])  # sent again
    assert entries == [["queued", 0]]
    assert await s.queue("k") == [entry(C, 1), entry(A, 1)]


async def test_renew_sees_a_grant_whose_reply_was_lost(s: Scripts) -> None:
    """A claim whose reply was lost shows at renewal as owner, and the lease is renewed."""
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(A, 1))
    await s.release("k", entry(B, 1))
    token = token_of(await s.claim("k", entry(A, 1)))
    await s.client.pexpire(f"{s.prefix}lease:k", 100)
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])
    assert entries == [["owner", str(token)]]
    assert await s.client.pttl(f"{s.prefix}lease:k") > 500


async def test_renew_reports_gone_entries(s: Scripts) -> None:
    """A superseded entry shows as gone at renewal (the marker is not a lost entry)."""
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(C, 1), "replace")
    _, entries, _ = await s.renew(A, [], [("k", entry(A, 1))])
    assert entries == [["gone", "superseded"]]
    assert entry(A, 1) not in await s.queue("k")


async def test_renew_follows(s: Scripts) -> None:
    """Followed entries: live while in line and alive, out once stored, gone, lost."""
    await s.submit("k", entry(B, 1))
    await s.submit("k", entry(B, 2))
    await s.submit("j", entry(C, 1))
    follows = [("k", entry(B, 1)), ("k", entry(B, 2)), ("j", entry(C, 1)), ("k", entry(B, 9))]
    _, _, items = await s.renew(A, [], [], follows)
    assert items == [["live"], ["live"], ["live"], ["lost"]]
    assert await s.client.smembers(f"{s.prefix}jn:{entry(B, 1)}") == {A}  # joiner registered
    assert await s.release("k", entry(B, 1)) == "need_outcome"
    _, _, items = await s.renew(A, [], [], follows[:1])
    assert items == [["live"]]  # pending: the outcome is on its way
    await s.store_outcome(entry(B, 1), "{}")
    await s.withdraw("k", entry(B, 2), "queue_timeout")
    await s.kill(C)
    _, _, items = await s.renew(A, [], [], follows[:3])
    assert items == [["out", "{}"], ["gone", "queue_timeout"], ["lost"]]


async def test_renew_refuses_only_the_items_that_read_foreign_data(s: Scripts) -> None:
    """Foreign data (a list, a string) at an entry's gone, out or jn key, or at the lease
    key of a slot whose holder is followed: only the items that read it are refused,
    naming the key and the server's error; the other items of the renewal answer as
    always. Before, the whole script failed."""
    for n, slot in enumerate("kmnx", 1):
        await s.submit(slot, entry(B, n))  # B holds k, m, n and x
    await s.submit("k", entry(A, 1))  # queued behind B's lease
    await s.client.rpush(f"{s.prefix}gone:{entry(A, 2)}", ["foreign"])  # not queued
    for key in (f"jn:{entry(B, 1)}", f"out:{entry(B, 2)}"):
        await s.client.rpush(f"{s.prefix}{key}", ["foreign"])
    await s.client.delete([f"{s.prefix}lease:x"])
    await s.client.set(f"{s.prefix}lease:x", "foreign")
    follows = [("k", entry(B, 1)), ("m", entry(B, 2)), ("n", entry(B, 3)), ("x", entry(B, 4))]
    _, entries, items = await s.renew(A, [], [("f", entry(A, 2)), ("k", entry(A, 1))], follows)
    wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value"
    assert entries == [["foreign", f"gone:{entry(A, 2)}: {wrongtype}"], ["queued", 0]]
    assert items == [
        ["foreign", f"jn:{entry(B, 1)}: {wrongtype}"],
        ["foreign", f"out:{entry(B, 2)}: {wrongtype}"],
        ["live"],
        ["foreign_lease", f"lease:x: {wrongtype}"],
    ]


async def test_a_release_on_a_foreign_lease_key_refuses_the_lease_and_tells_the_joiners(
    s: Scripts,
) -> None:
    """Foreign data (a string) at the lease key of a slot whose owner releases: the
    release refuses the lease part only (``['foreign', what, reply]``), and its outcome
    part is done: the outcome stored and the joiners told, or ``need_outcome`` asked for.
    Before, the whole script failed, and the joiners heard nothing until their renewal."""
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(B, 1), "join")
    await s.submit("m", entry(A, 2))
    await s.submit("m", entry(B, 2), "join")
    for slot in "km":
        await s.client.delete([f"{s.prefix}lease:{slot}"])
        await s.client.set(f"{s.prefix}lease:{slot}", "foreign")
    what = f"lease:k: {WRONGTYPE}"
    assert await s.release("k", entry(A, 1), '{"kind": "completed"}') == ["foreign", what, "ok"]
    assert await s.client.get(f"{s.prefix}out:{entry(A, 1)}") == '{"kind": "completed"}'
    reply = await s.release("m", entry(A, 2))
    assert reply == ["foreign", f"lease:m: {WRONGTYPE}", "need_outcome"]
    assert scripts.parse_release(reply) == "need_outcome"
    assert scripts.release_refusal(reply) == f"lease:m: {WRONGTYPE}"
    assert await s.client.get(f"{s.prefix}lease:k") == "foreign"


@pytest.mark.parametrize("key", ["lease", "q"])
async def test_a_withdrawal_reads_a_slot_key_of_foreign_data_as_none(
    s: Scripts, inbox: dict[str, Inbox], key: str
) -> None:
    """Foreign data (a string) at the lease key of a slot where B's entry waits behind
    A, or at its queue key: B's withdrawal (its renewal refused it for that key) reads
    the key as none, a lease B cannot hold, a queue B cannot wait in, and names it
    (``['unowned', [what], 'ok']``): B's entry leaves the queue, is marked gone, and its
    joiner is told; the key is left as it is, and nothing is handed over. Before, the
    script failed on the key, and B's entry stayed in the queue while its process
    lived."""
    assert (await s.submit("k", entry(A, 1)))[0] == "owner"
    assert (await s.submit("k", entry(B, 1)))[0] == "queued"
    assert (await s.submit("k", entry(C, 1), "join"))[:2] == ["joined", entry(B, 1)]
    await s.client.delete([f"{s.prefix}{key}:k"])
    await s.client.set(f"{s.prefix}{key}:k", "foreign")
    for _ in range(2):  # sent again: the same
        raw = await s.withdraw("k", entry(B, 1), "store_unavailable")
        assert raw == ["unowned", [f"{key}:k: {WRONGTYPE}"], "ok"]
        assert scripts.reads_unowned(raw) == ("ok", (f"{key}:k: {WRONGTYPE}",))
    assert await s.get(f"gone:{entry(B, 1)}") == "store_unavailable"
    await inbox[C].wait_kind("done", entry(B, 1))
    assert await s.client.get(f"{s.prefix}{key}:k") == "foreign"
    if key == "lease":
        assert await s.queue("k") == []
    assert inbox[A].of("grant") == inbox[B].of("grant") == []


async def test_renew_of_a_thousand_leases_is_one_call(
    client: coredis.Redis[str], store: RedisSlotStore
) -> None:
    """One renew call answers for every lease and entry it was given, in order."""
    # Leases that outlast a thousand submits, one round trip each, on a loaded machine.
    s = Scripts(client, attrs.evolve(store, lease_ttl=60.0))
    await s.heartbeat(A, B)
    leases = [(f"s{i}", entry(A, i)) for i in range(1000)]
    for slot, e in leases:
        await s.submit(slot, e)
    refused = ("s0", entry(B, 0))
    raw = await s.call(scripts.RENEW, *scripts.renew_args(A, [*leases, refused], [], []))
    assert scripts.renew_items(raw) == [[""] * 1000 + [None], [], []]
    parsed = scripts.parse_renew(raw)
    assert parsed.leases[-1] is None
    assert len(parsed.entries) == 0


# -- fence tokens and cluster_slot -------------------------------------------------------------


async def test_fence_tokens_strictly_increase_per_slot(s: Scripts) -> None:
    """Every new owner of a slot gets a larger token, however fast they follow."""
    tokens = []
    for i in range(50):
        tokens.append(token_of(await s.submit("k", entry(A, i))))
        await s.release("k", entry(A, i))
    assert tokens == sorted(set(tokens))
    assert tokens[-1] < 2**53


async def test_fence_tokens_increase_across_flushall(s: Scripts) -> None:
    """Tokens keep increasing after the server lost every key (from its clock)."""
    before = token_of(await s.submit("k", entry(A, 1)))
    await s.client.flushall()
    await s.heartbeat(A)
    assert token_of(await s.submit("k", entry(A, 2))) > before


async def test_fence_tokens_increase_across_a_restart(
    redis_server: RedisServer, store: RedisSlotStore
) -> None:
    """Tokens keep increasing after a restart of the server without persistence."""
    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as client:
        runner = Scripts(client, store)
        await runner.heartbeat(A)
        before = token_of(await runner.submit("k", entry(A, 1)))
    redis_server.restart()
    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as client:
        runner = Scripts(client, store)
        await runner.heartbeat(A)  # scripts reload after NOSCRIPT
        assert token_of(await runner.submit("k", entry(A, 2))) > before


async def test_fence_token_takes_last_plus_one_when_ahead_of_the_clock(s: Scripts) -> None:
    """A stored fence ahead of the server clock is continued, digit-exact."""
    await s.client.set(f"{s.prefix}fence:k", "8999999999999998")
    assert token_of(await s.submit("k", entry(A, 1))) == 8999999999999999


async def test_cluster_slot_reply(s: Scripts) -> None:
    """cluster_slot: holder instance, token, remaining ms, live entries; all free: None."""
    assert await s.cluster_slot("k") == [None, None, None, 0]
    token = token_of(await s.submit("k", entry(A, 1)))
    await s.submit("k", entry(B, 1))
    holder, got, pttl, depth = await s.cluster_slot("k")
    assert (holder, int(got), depth) == (A, token, 1)
    assert 0 < int(pttl) <= 1000
    parsed = scripts.parse_cluster_slot(await s.cluster_slot("k"))
    assert parsed.holder == A
    assert parsed.token == token
    assert parsed.live_entries == 1
    await s.expire_lease("k")
    assert await s.cluster_slot("k") == [None, None, None, 1]


async def test_lease_and_heartbeat_expire_on_the_server(s: Scripts) -> None:
    """The lease carries lease_ttl and the heartbeat too (the server expires them)."""
    await s.submit("k", entry(A, 1))
    assert 0 < await s.client.pttl(f"{s.prefix}lease:k") <= 1000
    assert 0 < await s.client.pttl(f"{s.prefix}hb:{A}") <= 1000


async def test_a_handed_over_lease_lasts_the_lease_ttl_of_its_holder(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """Replicas may run with different ``lease_ttl`` (a rolling change of it): a release
    by a process of 1 s hands the lease to the head of a process of 30 s for 30 s, as
    its heartbeat says, and the other way round for 1 s; the grant's expiry says the
    same. A heartbeat of earlier versions (``1``) says nothing: the releaser's own."""
    slow = Scripts(s.client, attrs.evolve(s.store, lease_ttl=30.0))
    await slow.heartbeat(B)
    assert await s.get(f"hb:{A}") == "1000"
    assert await s.get(f"hb:{B}") == "30000"

    async def hand_over(releaser: Scripts, holder: str, head: str, slot: str) -> int:
        """The lease's time (ms) when ``holder`` released to ``head``, from the grant:
        its expiry less the grant's time (its fence token, the server's TIME in us);
        the lease's PTTL agrees."""
        await s.heartbeat(A)  # (1 s: it may have expired since)
        token_of(await releaser.submit(slot, entry(holder, 1)))
        await s.submit(slot, entry(head, 1))
        assert await releaser.release(slot, entry(holder, 1)) == "ok"
        pttl = await s.client.pttl(f"{s.prefix}lease:{slot}")
        _, _, _, token, expiry = await inbox[head].wait_kind("grant", slot)
        granted = int(expiry) - int(token) // 1000
        assert granted - 1000 < pttl <= granted
        return granted

    assert await hand_over(s, A, B, "to-slow") == 30_000
    assert await hand_over(slow, B, A, "to-fast") == 1_000
    await s.client.set(f"{s.prefix}hb:{C}", "1", px=30_000)  # of earlier versions
    assert await hand_over(slow, B, C, "to-earlier") == 30_000


async def test_a_set_of_instances_lasts_the_longest_of_its_members(s: Scripts) -> None:
    """The ``watch`` and ``jn`` sets of instances are made to last longer by a member's
    call, never shorter: a replica of 1 s registered after one of 30 s leaves the
    registration of 30 s (a rolling change of ``lease_ttl``). Before, the last call set
    its own, and the replica of 30 s missed the ``room`` it waited for."""
    slow = Scripts(s.client, attrs.evolve(s.store, lease_ttl=30.0))
    await slow.heartbeat(B)
    watch, joiners = f"{s.prefix}watch:k", f"{s.prefix}jn:{entry(A, 2)}"  # the tail
    await s.submit("k", entry(A, 1))
    await s.submit("k", entry(A, 2), max_queue=1)
    assert (await slow.submit("k", entry(B, 1), max_queue=1, watch=True))[0] == "full"
    assert (await s.submit("k", entry(C, 1), max_queue=1, watch=True))[0] == "full"
    assert await s.client.smembers(watch) == {B, C}
    assert 29_000 < await s.client.pttl(watch) <= 30_000
    assert (await slow.submit("k", entry(B, 2), "join"))[0] == "joined"
    assert (await s.submit("k", entry(C, 2), "join"))[0] == "joined"
    await s.renew(C, [], [], [("k", entry(A, 2))])
    assert await s.client.smembers(joiners) == {B, C}
    assert 299_000 < await s.client.pttl(joiners) <= 300_000  # keep: 10 * 30 s
    # the other way round, a longer member's call extends the set
    await s.client.delete([watch])
    assert (await s.submit("k", entry(C, 1), max_queue=1, watch=True))[0] == "full"
    assert 0 < await s.client.pttl(watch) <= 1000
    assert (await slow.submit("k", entry(B, 1), max_queue=1, watch=True))[0] == "full"
    assert 29_000 < await s.client.pttl(watch) <= 30_000


# -- limit pools ------------------------------------------------------------------------------

CONC1 = "concurrency 1"


async def limit_acquire(s: Scripts, instance: str, w: str, *pools: str) -> scripts.LimitReply:
    """Ask for one unit of each concurrency pool of capacity 1 in ``pools``."""
    args = scripts.limit_acquire_args(instance, w, [(pid, CONC1) for pid in pools])
    return scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args))


async def limit_release(s: Scripts, w: str, *pools: str) -> None:
    await s.call(scripts.LIMIT_RELEASE, *scripts.limit_release_args(w, pools))


async def test_a_release_grants_the_oldest_that_fits_across_pool_sets(s: Scripts) -> None:
    """Waiters of several pool sets (one set given in two orders): each release grants
    the oldest waiter whose every pool has room; one waiting for a full pool never
    blocks one that needs other pools, and the same set in another order is one line."""
    assert (await limit_acquire(s, A, f"{A}/h1", "c1")).kind == "granted"
    assert (await limit_acquire(s, A, f"{A}/h2", "c2")).kind == "granted"
    waiters = [("w1", ("c1", "c2")), ("w2", ("c1",)), ("w3", ("c2", "c1")), ("w4", ("c2",))]
    for w, pools in waiters:
        assert (await limit_acquire(s, B, f"{B}/{w}", *pools)).kind == "waiting"

    async def granted() -> set[str]:
        """The waiters granted so far (an acquisition sent again answers its grant)."""
        replies = {w: await limit_acquire(s, B, f"{B}/{w}", *pools) for w, pools in waiters}
        return {w for w, reply in replies.items() if reply.kind == "granted"}

    await limit_release(s, f"{A}/h1", "c1")  # w1 still needs c2
    assert await granted() == {"w2"}
    await limit_release(s, f"{A}/h2", "c2")  # w1 and w3 need c1, held by w2
    assert await granted() == {"w2", "w4"}
    await limit_release(s, f"{B}/w2", "c1")  # w1 and w3 need c2, held by w4
    assert await granted() == {"w2", "w4"}
    await limit_release(s, f"{B}/w4", "c2")  # both free: the older of the pair first
    assert await granted() == {"w1", "w2", "w4"}
    await limit_release(s, f"{B}/w1", "c1", "c2")
    assert await granted() == {"w1", "w2", "w3", "w4"}


async def test_abandoned_limit_pools_leave_no_keys(s: Scripts) -> None:
    """Every key the limit scripts write expires: holders, waiters (of one and of two
    pools), settings and markers of a namespace nobody uses any more are gone after
    ``2 * lease_ttl`` (and ``keep``, for the markers)."""
    ttl, keep = 0.25, 0.5
    s._common = scripts.common_args(s.prefix, ttl, keep)
    rate = [("c1", CONC1), ("r", "rate 1 per 0.2 burst 1")]
    args = scripts.limit_acquire_args(A, f"{A}/1", rate)
    assert scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args)).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/2", "c1")).kind == "waiting"
    assert (await limit_acquire(s, B, f"{B}/3", "c1", "k x")).kind == "waiting"
    await s.call(scripts.LIMIT_WITHDRAW, *scripts.limit_release_args(f"{B}/2", ["c1"]))
    await s.call(scripts.LIMIT_RENEW, *scripts.limit_renew_args(A, [], [("c1", [f"{A}/1"])]))
    keys = await s.client.keys(f"{s.prefix}l*")
    assert {k[len(s.prefix) :].split(":")[0] for k in keys} >= {"lp", "lh", "lq", "lg", "lw"}
    for key in keys:
        assert 0 < await s.client.pttl(key) <= 1000 * max(2 * ttl, keep), key
    await trio.sleep(2 * max(2 * ttl, keep))
    assert await s.client.keys(f"{s.prefix}l*") == set()


async def test_renewal_keeps_the_keys_of_held_pools(s: Scripts) -> None:
    """A holder that renews keeps its pool's keys (and its unit) for longer than they
    would live unrenewed."""
    ttl = 0.2
    s._common = scripts.common_args(s.prefix, ttl, 1.0)
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    for _ in range(10):  # 1 s: more than 2 * lease_ttl
        await trio.sleep(ttl / 2)
        await s.call(scripts.LIMIT_RENEW, *scripts.limit_renew_args(A, [], [("c1", [f"{A}/1"])]))
    reply = scripts.parse_cluster_limit(await s.call(scripts.CLUSTER_LIMIT, "c1"))
    assert reply.holders == {A: 1}
    assert (await limit_acquire(s, B, f"{B}/2", "c1")).kind == "waiting"


async def test_a_rebase_keeps_a_grant_its_process_has_not_heard_of(s: Scripts) -> None:
    """B waits in a pool of capacity 1, then C; A's release grants B, whose process has
    not heard of it when its rebase (a new server) names B's request as a waiter: the
    grant moves to the new generation with B's units, and C still waits. Before, the
    rebase took the grant away (its generation was the old one): B was queued again
    behind C, and C held the unit."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    waiting = await limit_acquire(s, B, f"{B}/2", "c1")
    assert waiting.kind == "waiting"
    assert (await limit_acquire(s, C, f"{C}/3", "c1")).kind == "waiting"
    await limit_release(s, f"{A}/1", "c1")
    waiters = [(f"{B}/2", [("c1", CONC1)])]
    args = scripts.limit_renew_args(B, waiters, (), [])
    renewed = scripts.parse_limit_renew(await s.call(scripts.LIMIT_RENEW, *args))
    assert renewed.gen != waiting.gen
    assert renewed.waiters == (scripts.LimitReply("granted", gen=renewed.gen),)
    assert await s.client.hgetall(f"{s.prefix}lh:c1") == {f"{B}/2": renewed.gen}
    assert (await limit_acquire(s, C, f"{C}/3", "c1")).kind == "waiting"


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


@pytest.mark.parametrize("script", ["submit", "claim", "release", "withdraw"])
@pytest.mark.parametrize("key", ["hb", "watch"])
async def test_slot_scripts_read_as_none_foreign_data_no_call_owns(
    s: Scripts, script: str, key: str
) -> None:
    """A holds slot ``k``, B's and C's entries wait; foreign data at C's heartbeat key
    (``hb``), or at the slot's watch key while C is gone (``watch``). A submit, a claim
    of the free lease, A's release and A's withdrawal each prune the queue and read it
    as none (C counts as gone; nobody is told of room), go on, and name it in their
    reply (``['unowned', [what], reply]``). Before, each failed: a claim and a release,
    after the grant (the claim's grant kept, a hand-over's head taken out of the queue
    and no message sent)."""
    assert (await s.submit("k", entry(A, 1)))[0] == "owner"
    for e in (entry(B, 1), entry(C, 1)):
        assert (await s.submit("k", e))[0] == "queued"
    if key == "hb":
        await s.client.delete([f"{s.prefix}hb:{C}"])
        await s.client.rpush(f"{s.prefix}hb:{C}", ["foreign"])
        what = f"hb:{C}: {WRONGTYPE}"
    else:
        await s.kill(C)
        await s.client.set(f"{s.prefix}watch:k", "foreign")
        what = f"watch:k: {WRONGTYPE}"
    if script == "submit":
        raw = await s.submit("k", entry(B, 2))
    elif script == "claim":
        await s.expire_lease("k")
        raw = await s.claim("k", entry(B, 1))
    elif script == "release":
        raw = await s.release("k", entry(A, 1))
    else:
        raw = await s.withdraw("k", entry(A, 1))
    assert scripts.read_unowned(raw)
    reply, unowned = scripts.reads_unowned(raw)
    assert unowned == (what,)
    if script == "submit":
        assert reply[0] == "queued"
        assert await s.queue("k") == [entry(B, 1), entry(B, 2)]
    else:
        assert reply == "ok" or reply[0] == "owner"
        assert (await s.lease("k"))["entry"] == entry(B, 1)
        assert await s.queue("k") == []


@pytest.mark.parametrize("script", ["claim", "release"])
async def test_a_grant_that_fails_on_the_fence_key_leaves_its_entry_queued(
    s: Scripts, script: str
) -> None:
    """The slot's fence key holds foreign data (a list) when another entry's claim, or a
    release's hand-over, grants the lease to the head of the queue: the script fails
    (the slot's own key), and the head is still queued, so the next grant that works
    finds it (or its own claim refuses it: below). Before, the head was taken out of
    the queue first: it waited for nothing, until its renewal put it back at the
    tail."""
    assert (await s.submit("k", entry(A, 1)))[0] == "owner"
    assert (await s.submit("k", entry(B, 1)))[0] == "queued"
    await s.client.delete([f"{s.prefix}fence:k"])
    await s.client.rpush(f"{s.prefix}fence:k", ["foreign"])
    if script == "claim":
        assert (await s.submit("k", entry(C, 1)))[0] == "queued"
        await s.expire_lease("k")
    grant = s.claim("k", entry(C, 1)) if script == "claim" else s.release("k", entry(A, 1))
    with pytest.raises(coredis.exceptions.WrongTypeError):
        await grant
    assert (await s.queue("k"))[0] == entry(B, 1)
    assert await s.lease("k") == {}


async def test_a_claim_whose_grant_fails_on_the_fence_key_refuses_its_entry(
    s: Scripts, inbox: dict[str, Inbox]
) -> None:
    """The slot's fence key holds foreign data (a list) when the head's own claim takes
    the free lease: the claim refuses it (``['foreign', what]``, naming the key and the
    server's error), takes it out of its queue for good (marked gone,
    ``store_unavailable``) and tells its joiners; the next entry is the head. Before, the
    script failed and left the head queued: its renewal found it claimable at each
    round, its claim failed each time, and its waiter was never answered."""
    assert (await s.submit("k", entry(A, 1)))[0] == "owner"
    for e in (entry(C, 1), entry(B, 1)):
        assert (await s.submit("k", e))[0] == "queued"
    assert (await s.submit("k", entry(A, 2), "join"))[:2] == ["joined", entry(B, 1)]
    await s.client.delete([f"{s.prefix}fence:k"])
    await s.client.rpush(f"{s.prefix}fence:k", ["foreign"])
    await s.expire_lease("k")
    reply = scripts.parse_claim(await s.claim("k", entry(C, 1)))
    assert (reply.kind, reply.detail) == ("foreign", f"fence:k: {WRONGTYPE}")
    assert await s.queue("k") == [entry(B, 1)]
    assert await s.get(f"gone:{entry(C, 1)}") == "store_unavailable"
    assert scripts.parse_claim(await s.claim("k", entry(C, 1))).kind == "gone"  # sent again
    reply = scripts.parse_claim(await s.claim("k", entry(B, 1)))  # the next head, so too
    assert (reply.kind, reply.detail) == ("foreign", f"fence:k: {WRONGTYPE}")
    assert await s.queue("k") == []
    with trio.fail_after(5):
        await inbox[A].wait_kind("done", entry(B, 1))  # to the joiners


async def test_a_grouped_call_reads_as_none_what_its_script_does(s: Scripts) -> None:
    """The grouped form of a submit answers each call as its own script would: the one
    that met another process's heartbeat of foreign data names it, the other not."""
    assert (await s.submit("k", entry(A, 1)))[0] == "owner"
    assert (await s.submit("k", entry(C, 1)))[0] == "queued"
    await s.client.delete([f"{s.prefix}hb:{C}"])
    await s.client.rpush(f"{s.prefix}hb:{C}", ["foreign"])
    grouped = scripts.GROUPED[scripts.SUBMIT.name].script
    args = [
        *scripts.submit_args("k", entry(B, 1), "queue", 10, False),
        *scripts.submit_args("m", entry(B, 2), "queue", 10, False),
    ]
    first, second = await s.call(grouped, *args)
    assert scripts.reads_unowned(first)[1] == (f"hb:{C}: {WRONGTYPE}",)
    assert scripts.reads_unowned(first)[0][0] == "queued"
    assert not scripts.read_unowned(second)
    assert second[0] == "owner"


@pytest.mark.parametrize("script", ["withdraw", "release", "store_outcome"])
async def test_a_joiners_key_of_foreign_data_is_read_as_none(s: Scripts, script: str) -> None:
    """A holds slot ``k``, B's entry waits; A's entry's joiners key (``jn``, a set that
    A's joiners write) holds a string. A's withdrawal, release with an outcome, or
    stored outcome reads it as none (nobody to tell: a joiner's renewal refuses its
    follow for that key), does the rest, and names the key (``['unowned', [what],
    reply]``). Before, each failed on it: a withdrawal or a release after it gave the
    lease back, before its hand-over (B waited for a claim of its own), and the keeper
    sent it again with each renewal for as long as A's process lived."""
    assert (await s.submit("k", entry(A, 1)))[0] == "owner"
    assert (await s.submit("k", entry(B, 1)))[0] == "queued"
    await s.client.set(f"{s.prefix}jn:{entry(A, 1)}", "foreign")
    if script == "withdraw":
        raw = await s.withdraw("k", entry(A, 1))
    elif script == "release":
        raw = await s.release("k", entry(A, 1), "{}")
    else:
        raw = await s.store_outcome(entry(A, 1), "{}")
    reply, unowned = scripts.reads_unowned(raw)
    assert unowned == (f"jn:{entry(A, 1)}: {WRONGTYPE}",)
    assert reply == "ok"
    if script == "store_outcome":
        assert await s.get(f"out:{entry(A, 1)}") == "{}"
    else:
        assert (await s.lease("k"))["entry"] == entry(B, 1)
    assert await s.get(f"jn:{entry(A, 1)}") == "foreign"


@pytest.mark.parametrize("script", ["submit", "claim", "release"])
async def test_a_heartbeat_that_is_no_lease_ttl_grants_for_the_callers(
    s: Scripts, script: str
) -> None:
    """B's heartbeat key holds a string that is no number (foreign data of the right
    type) when a grant to B's entry reads B's lease TTL there: the lease lasts the
    caller's, and the reply names the key. Before, the grant's ``PEXPIRE`` failed the
    script after it had written the lease: a hand-over left a lease without expiry to
    an entry taken out of the queue, and nobody was told (the slot stuck while B
    lived)."""
    await s.client.set(f"{s.prefix}hb:{B}", "not a ttl", px=60_000)
    if script == "submit":
        raw = await s.submit("k", entry(B, 1))
    else:
        assert (await s.submit("k", entry(A, 1)))[0] == "owner"
        assert (await s.submit("k", entry(B, 1)))[0] == "queued"
        if script == "claim":
            await s.expire_lease("k")
            raw = await s.claim("k", entry(B, 1))
        else:
            raw = await s.release("k", entry(A, 1))
    reply, unowned = scripts.reads_unowned(raw)
    assert unowned == (f"hb:{B}: no lease TTL in ms",)
    assert reply == "ok" or reply[0] == "owner"
    assert (await s.lease("k"))["entry"] == entry(B, 1)
    pttl = await s.client.pttl(f"{s.prefix}lease:k")
    assert 0 < pttl <= 1000 * s.store.lease_ttl


async def limit_renew(
    s: Scripts, instance: str, *waiters: tuple[str, tuple[str, ...]]
) -> scripts.LimitRenewReply:
    """Renew ``instance``'s waiters, each of concurrency pools of capacity 1."""
    asked = [(w, [(pid, CONC1) for pid in pools]) for w, pools in waiters]
    args = scripts.limit_renew_args(instance, asked, (), None)
    return scripts.parse_limit_renew(await s.call(scripts.LIMIT_RENEW, *args))


async def make_foreign(s: Scripts, key: str) -> None:
    """Foreign data at ``key`` (after the prefix): a list where a string belongs, else a
    string."""
    await s.client.delete([f"{s.prefix}{key}"])
    if key.startswith(("lx:", "lu:")):
        await s.client.rpush(f"{s.prefix}{key}", ["foreign"])
    else:
        await s.client.set(f"{s.prefix}{key}", "foreign")


@pytest.mark.parametrize("kind", ["lp", "lq", "lk", "lg", "lw", "lx"])
async def test_limit_renew_refuses_only_a_waiter_whose_own_key_is_foreign_data(
    s: Scripts, kind: str
) -> None:
    """Foreign data at a key of B's waiter ``B/1`` (its pool's settings, waiting or parked
    groups, its group, itself, its marker) while another waiter of B waits in another
    pool: the renewal refuses that waiter only (``['foreign', pool, what]``, naming the
    key and the server's error) and takes it out of its line, marked withdrawn; the
    other waits on. Before, the whole script failed."""
    for w, pool in ((f"{A}/1", "c1"), (f"{A}/2", "c2")):
        assert (await limit_acquire(s, A, w, pool)).kind == "granted"
    for w, pool in ((f"{B}/1", "c1"), (f"{B}/2", "c2")):
        assert (await limit_acquire(s, B, w, pool)).kind == "waiting"
    key = {"lg": 'lg:["c1"]', "lw": f"lw:{B}/1", "lx": f"lx:{B}/1"}.get(kind, f"{kind}:c1")
    await make_foreign(s, key)
    renewed = await limit_renew(s, B, (f"{B}/1", ("c1",)), (f"{B}/2", ("c2",)))
    refused, other = renewed.waiters
    assert (refused.kind, refused.pool, refused.what) == ("foreign", "c1", f"{key}: {WRONGTYPE}")
    assert other.kind == "waiting"
    if kind != "lg":
        assert await s.client.zscore(f'{s.prefix}lg:["c1"]', f"{B}/1") is None
    if kind != "lx":
        assert await s.client.get(f"{s.prefix}lx:{B}/1") == "gone"
    assert (await limit_acquire(s, B, f"{B}/2", "c2")).kind == "waiting"


async def test_limit_renew_gives_back_the_grant_of_a_refused_waiter(s: Scripts) -> None:
    """B's waiter of pools ``c1`` and ``c2`` was granted by A's release, and its process
    has not heard of it when ``c1``'s holders key is overwritten with foreign data: its
    renewal refuses it, and gives back its unit of ``c2`` (which its process, told of a
    refusal, would never release), marking it withdrawn. Before, the unit stayed held
    while B's process lived, and ``c2`` had no room for anyone else."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/1", "c1", "c2")).kind == "waiting"
    await limit_release(s, f"{A}/1", "c1")
    assert list(await s.client.hgetall(f"{s.prefix}lh:c2")) == [f"{B}/1"]
    await make_foreign(s, "lh:c1")
    (refused,) = (await limit_renew(s, B, (f"{B}/1", ("c1", "c2")))).waiters
    assert (refused.kind, refused.what) == ("foreign", f"lh:c1: {WRONGTYPE}")
    assert await s.client.hgetall(f"{s.prefix}lh:c2") == {}
    assert await s.client.get(f"{s.prefix}lx:{B}/1") == "gone"
    assert (await limit_acquire(s, C, f"{C}/1", "c2")).kind == "granted"


# Keys of foreign data that a settle meets in another pool, group or waiter (C's, in
# the two tests below), and whose waiter it grants then (their docstrings say why).
SETTLE_MEETS = [
    ("lp:zf", B),
    ("lh:zf", B),
    ("lk:zf", C),
    ("lq:zf", C),
    ('lg:["s","zf"]', B),
    (f"lw:{C}/1", B),
]


@pytest.mark.parametrize(("key", "granted"), SETTLE_MEETS)
async def test_limit_renew_reads_as_none_foreign_data_its_settle_meets(
    s: Scripts, key: str, granted: str
) -> None:
    """C's waiter waits in pools ``s`` and ``zf``, B's (younger) in ``s``: both held by
    A, whose units then die; foreign data at a key of ``zf``, of C's group or of C's
    waiter. B's renewal settles ``s`` and meets C's group: ``zf`` with foreign settings
    or holders has no room (C's group is parked there, and B's waiter granted); one
    with foreign index keys is left as it is (C's waiter granted, its indexes in ``zf``
    not written); a group or a waiter of foreign data is left out (B's granted). The
    renewal goes on and names the key. Before, the whole script failed."""
    assert (await limit_acquire(s, A, f"{A}/1", "s", "zf")).kind == "granted"
    assert (await limit_acquire(s, C, f"{C}/1", "s", "zf")).kind == "waiting"
    assert (await limit_acquire(s, B, f"{B}/1", "s")).kind == "waiting"
    await s.client.delete([f"{s.prefix}lu:{A}"])  # A's units are dead
    await make_foreign(s, key)
    renewed = await limit_renew(s, B, (f"{B}/1", ("s",)))
    assert renewed.waiters[0].kind == ("granted" if granted == B else "waiting")
    assert f"{key}: {WRONGTYPE}" in renewed.unowned
    holders = await s.client.hgetall(f"{s.prefix}lh:s")
    assert list(holders) == [f"{granted}/1"]


@pytest.mark.parametrize(
    "key", ["lp:c1", "lh:c1", "lq:c1", "lk:c1", 'lg:["c1"]', f"lw:{B}/1", f"lu:{B}"]
)
async def test_limit_release_gives_back_every_unit_past_foreign_data(s: Scripts, key: str) -> None:
    """A holds units of ``c1`` and ``c2``, B waits for ``c1``; foreign data at a key of
    ``c1`` (its settings, holders, waiting or parked groups), of B's group, waiter or
    generation. A's release reads it as none, gives back A's units in both pools and
    names the key (``['ok', what]``). Before, the script failed at it, and when that was
    before ``c2`` (``c1``'s settings, holders or the generation of one of its holders)
    A's unit of ``c2`` stayed held while A's process lived: the keeper never sent the
    release again."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1", "c2")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/1", "c1")).kind == "waiting"
    await make_foreign(s, key)
    raw = await s.call(scripts.LIMIT_RELEASE, *scripts.limit_release_args(f"{A}/1", ["c1", "c2"]))
    assert f"{key}: {WRONGTYPE}" in scripts.limit_release_unowned(raw)
    assert f"{A}/1" not in await s.client.hgetall(f"{s.prefix}lh:c2")
    if key != "lh:c1":
        assert f"{A}/1" not in await s.client.hgetall(f"{s.prefix}lh:c1")


async def test_limit_withdraw_gives_back_the_units_of_a_marker_of_foreign_data(
    s: Scripts,
) -> None:
    """B's request holds units of ``c1`` and ``c2`` when its marker (``lx``) is
    overwritten with foreign data: its withdrawal gives them back all the same (whether
    it was granted cannot be read), leaves the marker as it is and names it. Before, the
    script failed at the marker: the units stayed held while B's process lived."""
    assert (await limit_acquire(s, B, f"{B}/1", "c1", "c2")).kind == "granted"
    await make_foreign(s, f"lx:{B}/1")
    args = scripts.limit_release_args(f"{B}/1", ["c1", "c2"])
    raw = await s.call(scripts.LIMIT_WITHDRAW, *args)
    assert scripts.limit_release_unowned(raw) == (f"lx:{B}/1: {WRONGTYPE}",)
    assert await s.client.hgetall(f"{s.prefix}lh:c1") == {}
    assert await s.client.hgetall(f"{s.prefix}lh:c2") == {}
    assert await s.client.lrange(f"{s.prefix}lx:{B}/1", 0, -1) == ["foreign"]
    assert scripts.limit_release_unowned(await s.call(scripts.LIMIT_WITHDRAW, *args)) == (
        f"lx:{B}/1: {WRONGTYPE}",
    )


def test_a_limit_release_reply_names_what_it_read_as_none() -> None:
    assert scripts.limit_release_unowned("ok") == ()
    assert scripts.limit_release_unowned(["ok", "lp:x: E", b"lh:\xff: E"]) == (
        "lp:x: E",
        "lh:\\xff: E",
    )
    with pytest.raises(ValueError, match="unexpected script reply"):
        scripts.limit_release_unowned(["no"])


@pytest.mark.parametrize(("key", "granted"), [*SETTLE_MEETS, (f"lu:{C}", B)])
async def test_limit_acquire_reads_as_none_foreign_data_its_settle_meets(
    s: Scripts, key: str, granted: str
) -> None:
    """As the renewal's settle does (above): C's waiter waits in pools ``s`` and ``zf``,
    both held by A, whose units then die; foreign data at a key of ``zf``, of C's group,
    of C's waiter or of C's generation. B's acquisition of ``s`` settles ``s`` first and
    meets C's group there: it reads the key as none, goes on (B, or C, granted), and
    names it (``['unowned', [what], reply]``). Before, the acquisition failed, and B's
    work ended ``FATAL`` for another process's key."""
    assert (await limit_acquire(s, A, f"{A}/1", "s", "zf")).kind == "granted"
    assert (await limit_acquire(s, C, f"{C}/1", "s", "zf")).kind == "waiting"
    await s.client.delete([f"{s.prefix}lu:{A}"])  # A's units are dead
    await make_foreign(s, key)
    args = scripts.limit_acquire_args(B, f"{B}/1", [("s", CONC1)])
    raw = await s.call(scripts.LIMIT_ACQUIRE, *args)
    reply, unowned = scripts.reads_unowned(raw)
    assert f"{key}: {WRONGTYPE}" in unowned
    assert scripts.parse_limit(reply).kind == ("granted" if granted == B else "waiting")
    assert list(await s.client.hgetall(f"{s.prefix}lh:s")) == [f"{granted}/1"]


async def test_limit_acquire_still_fails_on_foreign_data_at_its_own_keys(s: Scripts) -> None:
    """Foreign data at a key of the request's own pool (its waiting groups) fails the
    acquisition as before: the keeper refuses the request with the server's error."""
    await make_foreign(s, "lq:c1")
    with pytest.raises(coredis.exceptions.WrongTypeError):
        await limit_acquire(s, A, f"{A}/1", "c1")


NO_REQUEST = "a holder that is no request"


async def add_junk_holder(s: Scripts, pid: str) -> str:
    """A holder of pool ``pid`` that no script wrote (a field with no ``/``: no request,
    of no instance); what a reply names it as."""
    await s.client.hset(f"{s.prefix}lh:{pid}", {"junk": "1"})
    return f"lh:{pid}: {NO_REQUEST}"


@pytest.mark.parametrize("script", ["limit_release", "limit_withdraw"])
async def test_a_release_reads_a_holder_that_is_no_request_as_none(s: Scripts, script: str) -> None:
    """A holds units of ``c1`` and ``c2`` when ``c1``'s holders gain a field that names no
    request (foreign data of the right type): A's release, or withdrawal, reads ``c1``'s
    holders as none (foreign data), gives back A's units in both pools and names the
    key. Before, the script failed with a Lua error (``gen_of`` of no instance), and the
    unit of ``c2`` stayed held."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1", "c2")).kind == "granted"
    what = await add_junk_holder(s, "c1")
    script_ = scripts.LIMIT_RELEASE if script == "limit_release" else scripts.LIMIT_WITHDRAW
    raw = await s.call(script_, *scripts.limit_release_args(f"{A}/1", ["c1", "c2"]))
    assert scripts.limit_release_unowned(raw) == (what,)
    assert await s.client.hgetall(f"{s.prefix}lh:c1") == {"junk": "1"}
    assert await s.client.hgetall(f"{s.prefix}lh:c2") == {}


@pytest.mark.parametrize("fast", [True, False])
async def test_an_acquisition_refuses_a_holder_that_is_no_request_in_its_own_pool(
    s: Scripts, fast: bool
) -> None:
    """A field that names no request among the holders of the request's own pool fails
    the acquisition naming the key, as foreign data at its own keys does (the keeper
    refuses the request with that error and withdraws it), by the common case's way
    (the pool has room) and the full script's (the pool is full). Before, it failed
    with a Lua error that named no key."""
    pools = [("c1", "concurrency 2" if fast else CONC1)]
    for instance in (A, C):
        args = scripts.limit_acquire_args(instance, f"{instance}/1", pools)
        await s.call(scripts.LIMIT_ACQUIRE, *args)
    what = await add_junk_holder(s, "c1")
    with pytest.raises(coredis.exceptions.ResponseError) as error:
        await s.call(scripts.LIMIT_ACQUIRE, *scripts.limit_acquire_args(B, f"{B}/1", pools))
    assert f"foreign data in the slot store at {s.prefix}{what}" in str(error.value)
    assert f"{B}/1" not in await s.client.hgetall(f"{s.prefix}lh:c1")


@pytest.mark.parametrize("junk", ["holder", "settings"])
@pytest.mark.parametrize("script", ["limit_acquire", "limit_renew"])
async def test_a_settle_reads_values_no_script_wrote_in_another_pool_as_none(
    s: Scripts, script: str, junk: str
) -> None:
    """C waits in pools ``s`` and ``zf``, B (younger) in ``s``, both held by A, whose units
    then die; ``zf``'s holders gain a field that names no request, or its settings become
    some that no script writes. B's acquisition, or B's renewal, settles ``s`` and meets
    C's group: ``zf`` reads as a pool without room (C waits on), B is granted, and the
    key is named. Before, the script failed with a Lua error: B's block raised, or B's
    whole renewal failed."""
    assert (await limit_acquire(s, A, f"{A}/1", "s", "zf")).kind == "granted"
    assert (await limit_acquire(s, C, f"{C}/1", "s", "zf")).kind == "waiting"
    if script == "limit_renew":
        assert (await limit_acquire(s, B, f"{B}/1", "s")).kind == "waiting"
    await s.client.delete([f"{s.prefix}lu:{A}"])  # A's units are dead
    if junk == "holder":
        what = await add_junk_holder(s, "zf")
    else:
        what = await junk_settings(s, "zf", "rate 1 per x burst 1")
    if script == "limit_acquire":
        args = scripts.limit_acquire_args(B, f"{B}/1", [("s", CONC1)])
        reply, unowned = scripts.reads_unowned(await s.call(scripts.LIMIT_ACQUIRE, *args))
        assert scripts.parse_limit(reply).kind == "granted"
    else:
        renewed = await limit_renew(s, B, (f"{B}/1", ("s",)))
        assert renewed.waiters[0].kind == "granted"
        unowned = renewed.unowned
    assert what in unowned
    assert list(await s.client.hgetall(f"{s.prefix}lh:s")) == [f"{B}/1"]
    if junk == "settings":
        assert await s.client.hget(f"{s.prefix}lp:zf", "spec") == "rate 1 per x burst 1"


async def test_limit_renew_refuses_only_a_waiter_whose_pool_has_a_holder_that_is_no_request(
    s: Scripts,
) -> None:
    """B waits in ``c1`` and in ``c2``; ``c1``'s holders gain a field that names no
    request: B's renewal refuses that waiter only (``['foreign', 'c1', what]``, as for
    foreign data at its own keys), withdraws it, and asks for the other. Before, the
    whole renewal failed with a Lua error, every time: B's units of every pool lost."""
    for w, pool in ((f"{A}/1", "c1"), (f"{A}/2", "c2")):
        assert (await limit_acquire(s, A, w, pool)).kind == "granted"
    for w, pool in ((f"{B}/1", "c1"), (f"{B}/2", "c2")):
        assert (await limit_acquire(s, B, w, pool)).kind == "waiting"
    what = await add_junk_holder(s, "c1")
    renewed = await limit_renew(s, B, (f"{B}/1", ("c1",)), (f"{B}/2", ("c2",)))
    assert (await refused_alone(s, renewed, "c1", what)).kind == "waiting"


async def test_the_pool_query_refuses_a_holder_that_is_no_request(s: Scripts) -> None:
    """``cluster_limit`` of a pool whose holders hold a field that names no request fails
    naming the key (the query reads nothing as none). Before, with a Lua error."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    what = await add_junk_holder(s, "c1")
    with pytest.raises(coredis.exceptions.ResponseError) as error:
        await s.call(scripts.CLUSTER_LIMIT, "c1")
    assert f"foreign data in the slot store at {s.prefix}{what}" in str(error.value)


NO_SETTINGS = "settings that are no pool's"
# settings that spec_text never writes (each failed the scripts with a Lua error)
JUNK_SPECS = [
    "rate 1 per x burst 1",
    "rate 0 per 1.0 burst 1",
    "rate 1 per 1e-330 burst 1",
    "rate 1 per nan burst 1",
    "rate 1 per 1.0 burst 0",
    "concurrency -1",
    "concurrency 0",
    "bogus",
]


async def junk_settings(s: Scripts, pid: str, spec: str) -> str:
    """Settings of pool ``pid`` that no script wrote; what a reply names them as."""
    await s.client.hset(f"{s.prefix}lp:{pid}", {"spec": spec})
    return f"lp:{pid}: {NO_SETTINGS}"


@pytest.mark.parametrize("spec", JUNK_SPECS)
@pytest.mark.parametrize("script", ["limit_release", "limit_withdraw"])
async def test_a_release_reads_settings_no_script_wrote_as_none(
    s: Scripts, script: str, spec: str
) -> None:
    """A holds units of ``c1`` and ``c2`` when ``c1``'s settings become some that no
    script writes: A's release, or withdrawal, reads ``c1`` as a pool without room (no
    settings), gives back A's units in both pools, names the key, and leaves the
    settings as they are. Before, the script failed with a Lua error on the settings
    (or, for the ones that parse, read a pool that never has room), and the unit of
    ``c2`` stayed held."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1", "c2")).kind == "granted"
    what = await junk_settings(s, "c1", spec)
    script_ = scripts.LIMIT_RELEASE if script == "limit_release" else scripts.LIMIT_WITHDRAW
    raw = await s.call(script_, *scripts.limit_release_args(f"{A}/1", ["c1", "c2"]))
    assert scripts.limit_release_unowned(raw) == (what,)
    assert await s.client.hgetall(f"{s.prefix}lh:c1") == {}
    assert await s.client.hgetall(f"{s.prefix}lh:c2") == {}
    assert await s.client.hget(f"{s.prefix}lp:c1", "spec") == spec


async def refused_in_its_own_pool(s: Scripts, pid: str, spec: str, what: str) -> None:
    """B's acquisition of pool ``pid`` (settings ``spec``) and ``cluster_limit`` of it both
    fail naming ``what``, as foreign data at their own keys does."""
    for script, args in (
        (scripts.LIMIT_ACQUIRE, scripts.limit_acquire_args(B, f"{B}/1", [(pid, spec)])),
        (scripts.CLUSTER_LIMIT, (pid,)),
    ):
        with pytest.raises(coredis.exceptions.ResponseError) as error:
            await s.call(script, *args)
        assert f"foreign data in the slot store at {s.prefix}{what}" in str(error.value)


@pytest.mark.parametrize("spec", JUNK_SPECS)
async def test_an_acquisition_and_the_query_refuse_settings_no_script_wrote_in_their_pool(
    s: Scripts, spec: str
) -> None:
    """Settings that no script writes at the request's own pool fail its acquisition
    naming the key (the keeper refuses the request with that error and withdraws it),
    and ``cluster_limit`` of the pool, as foreign data at their own keys does; nothing
    is written to the pool. Before, both failed with a Lua error that named no key, or
    read a pool that never has room (``concurrency 0``: the request waited for ever)."""
    what = await junk_settings(s, "c1", spec)
    await refused_in_its_own_pool(s, "c1", CONC1, what)
    assert await s.client.hgetall(f"{s.prefix}lp:c1") == {"spec": spec}
    assert await s.client.exists([f"{s.prefix}lh:c1", f"{s.prefix}lw:{B}/1"]) == 0


async def refused_alone(
    s: Scripts, renewed: scripts.LimitRenewReply, pool: str, what: str
) -> scripts.LimitReply:
    """B's renewal refused its first waiter alone, for ``what`` in ``pool``, and
    withdrew it; the reply's item for B's other waiter."""
    refused, other = renewed.waiters
    assert (refused.kind, refused.pool, refused.what) == ("foreign", pool, what)
    assert what not in renewed.unowned
    assert await s.client.get(f"{s.prefix}lx:{B}/1") == "gone"
    return other


async def test_limit_renew_refuses_only_a_waiter_whose_pool_has_settings_no_script_wrote(
    s: Scripts,
) -> None:
    """B waits in ``c1`` and in ``c2``; ``c1``'s settings become some that no script
    writes: B's renewal refuses that waiter only (``['foreign', 'c1', what]``), withdraws
    it, and asks for the other. Before, the whole renewal failed with a Lua error, every
    time: B's units of every pool lost."""
    for w, pool in ((f"{A}/1", "c1"), (f"{A}/2", "c2")):
        assert (await limit_acquire(s, A, w, pool)).kind == "granted"
    for w, pool in ((f"{B}/1", "c1"), (f"{B}/2", "c2")):
        assert (await limit_acquire(s, B, w, pool)).kind == "waiting"
    what = await junk_settings(s, "c1", "bogus")
    renewed = await limit_renew(s, B, (f"{B}/1", ("c1",)), (f"{B}/2", ("c2",)))
    assert (await refused_alone(s, renewed, "c1", what)).kind == "waiting"
    assert await s.client.hget(f"{s.prefix}lp:c1", "spec") == "bogus"


NO_TAT = "a tat that is no finite number"
RATE1 = "rate 1 per 3600.0 burst 1"  # one start an hour: its state outlives the test


async def acquire_with_rate(s: Scripts, instance: str, w: str, pid: str) -> scripts.LimitReply:
    """Ask for one start of the rate pool ``r`` (``RATE1``) and one unit of ``pid``."""
    args = scripts.limit_acquire_args(instance, w, [("r", RATE1), (pid, CONC1)])
    return scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args))


async def junk_tat(s: Scripts, tat: str) -> str:
    """A ``tat`` of the rate pool ``r`` that no script wrote; what a reply names it as."""
    await s.client.hset(f"{s.prefix}lp:r", {"tat": tat})
    return f"lp:r: {NO_TAT}"


@pytest.mark.parametrize("tat", ["nan", "inf", "-inf", "x"])
@pytest.mark.parametrize("script", ["limit_release", "limit_withdraw"])
async def test_a_release_reads_a_tat_no_script_wrote_as_none(
    s: Scripts, script: str, tat: str
) -> None:
    """A started in the rate pool ``r`` and holds a unit of ``c1`` when ``r``'s ``tat``
    becomes no finite number: A's release, or withdrawal, reads ``r`` as a pool without
    settings, gives back A's unit, names the key, and leaves the ``tat`` as it is.
    Before, ``nan`` failed the script (a ``PEXPIRE`` of NaN, after the unit was given
    back), and the others were read as none or as a clock step back, and written over
    without a word."""
    assert (await acquire_with_rate(s, A, f"{A}/1", "c1")).kind == "granted"
    what = await junk_tat(s, tat)
    script_ = scripts.LIMIT_RELEASE if script == "limit_release" else scripts.LIMIT_WITHDRAW
    raw = await s.call(script_, *scripts.limit_release_args(f"{A}/1", ["r", "c1"]))
    assert scripts.limit_release_unowned(raw) == (what,)
    assert await s.client.hgetall(f"{s.prefix}lh:c1") == {}
    assert await s.client.hget(f"{s.prefix}lp:r", "tat") == tat


@pytest.mark.parametrize("tat", ["nan", "inf", "-inf", "x"])
async def test_an_acquisition_and_the_query_refuse_a_tat_no_script_wrote_in_their_pool(
    s: Scripts, tat: str
) -> None:
    """A ``tat`` of no finite number in the request's own rate pool fails its
    acquisition naming the key, the common case's too (it leaves such a ``tat`` to the
    full script), and ``cluster_limit`` of the pool; nothing is written to the pool.
    Before, the acquisition was granted and wrote its own state over it, and the query
    failed with a Lua error (``nan``) or read it as none."""
    await s.client.hset(f"{s.prefix}lp:r", {"spec": RATE1})
    what = await junk_tat(s, tat)
    await refused_in_its_own_pool(s, "r", RATE1, what)
    assert await s.client.hgetall(f"{s.prefix}lp:r") == {"spec": RATE1, "tat": tat}
    assert await s.client.exists([f"{s.prefix}lw:{B}/1"]) == 0


async def test_limit_renew_refuses_only_a_waiter_whose_rate_pool_has_a_tat_no_script_wrote(
    s: Scripts,
) -> None:
    """A started in the rate pool ``r`` (no room for an hour) and holds ``c2``; B waits
    for ``r`` and, apart, for ``c2``. ``r``'s ``tat`` becomes ``nan``: B's renewal refuses
    its waiter of ``r`` alone (``['foreign', 'r', what]``) and withdraws it. Before, the
    whole renewal failed (a ``PEXPIRE`` of NaN), every time: B's units of every pool
    lost, its waiters never granted."""
    assert (await acquire_with_rate(s, A, f"{A}/1", "c2")).kind == "granted"
    for w, pools in ((f"{B}/1", [("r", RATE1)]), (f"{B}/2", [("c2", CONC1)])):
        args = scripts.limit_acquire_args(B, w, pools)
        assert scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args)).kind == "waiting"
    what = await junk_tat(s, "nan")
    args = scripts.limit_renew_args(B, [(f"{B}/1", [("r", RATE1)]), (f"{B}/2", [("c2", CONC1)])])
    renewed = scripts.parse_limit_renew(await s.call(scripts.LIMIT_RENEW, *args))
    assert (await refused_alone(s, renewed, "r", what)).kind == "waiting"
    assert await s.client.hget(f"{s.prefix}lp:r", "tat") == "nan"


async def settled_by(s: Scripts, script: str) -> tuple[str, ...]:
    """Settle ``c1``, which A holds and B waits for, by A's release (``limit_release``)
    or by B's renewal once A's units died (``limit_renew``: B is granted); what the
    reply names as read as none."""
    if script == "limit_release":
        raw = await s.call(scripts.LIMIT_RELEASE, *scripts.limit_release_args(f"{A}/1", ["c1"]))
        return scripts.limit_release_unowned(raw)
    await s.client.delete([f"{s.prefix}lu:{A}"])  # A's units are dead
    renewed = await limit_renew(s, B, (f"{B}/1", ("c1",)))
    assert renewed.waiters[0].kind == "granted"
    return renewed.unowned


@pytest.mark.parametrize("script", ["limit_release", "limit_renew"])
async def test_a_waiter_that_is_no_request_is_read_as_none_and_named(
    s: Scripts, script: str
) -> None:
    """A holds ``c1``, B waits for it; a waiter that names no request (no ``/``: data
    no script wrote) heads B's group (``lg``). A's release, or B's renewal once A's
    units died, settles ``c1`` and meets it: it counts as a waiter of a dead instance
    (dropped from the group), B is granted, and the reply names the key. Before, it was
    dropped without a word."""
    group = '["c1"]'
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/1", "c1")).kind == "waiting"
    await s.client.zadd(f"{s.prefix}lg:{group}", {"junk": 1})
    assert await settled_by(s, script) == (f"lg:{group}: a waiter that is no request",)
    assert list(await s.client.hgetall(f"{s.prefix}lh:c1")) == [f"{B}/1"]
    assert await s.client.exists([f"{s.prefix}lg:{group}"]) == 0


NO_GROUP = "a group that is no list of pools"


@pytest.mark.parametrize("script", ["limit_release", "limit_withdraw"])
async def test_a_release_reads_a_parked_group_that_is_no_list_of_pools_as_none(
    s: Scripts, script: str
) -> None:
    """A holds ``c1`` and ``c2``, B waits for ``c1``; a group id that is no JSON list of
    pools (data no script wrote) is parked on ``c1``, ahead of B's group. A's release, or
    withdrawal, reads it as none where its settle meets it (left as it is), names the
    key, and grants B. Before, the script failed with a Lua error (``cjson.decode`` of
    the group id), after it gave back A's units: B was granted only by a later call."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1", "c2")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/1", "c1")).kind == "waiting"
    await s.client.zadd(f"{s.prefix}lk:c1", {"junk": 1})
    script_ = scripts.LIMIT_RELEASE if script == "limit_release" else scripts.LIMIT_WITHDRAW
    raw = await s.call(script_, *scripts.limit_release_args(f"{A}/1", ["c1", "c2"]))
    assert scripts.limit_release_unowned(raw) == (f"lk:c1: {NO_GROUP}",)
    assert list(await s.client.hgetall(f"{s.prefix}lh:c1")) == [f"{B}/1"]
    assert await s.client.hgetall(f"{s.prefix}lh:c2") == {}
    assert "junk" in await s.client.zrange(f"{s.prefix}lk:c1", 0, -1)


@pytest.mark.parametrize("junk", ["junk", "[]", '{"c1": 1}', '["c1", 2]', "7"])
async def test_an_acquisition_refuses_a_group_that_is_no_list_of_pools_in_its_own_pool(
    s: Scripts, junk: str
) -> None:
    """A held ``c1``, B waits for it; A's units die, and a group id that no script wrote
    is parked on ``c1``. C's acquisition of ``c1`` settles it, meets that group (its own
    pool's key) and fails naming the key, as foreign data at its own keys does (the
    keeper refuses the request with that error and withdraws it). Before, it failed with
    a Lua error that named no key (or, for some, read a list of no pools)."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/1", "c1")).kind == "waiting"
    await s.client.delete([f"{s.prefix}lu:{A}"])  # A's units are dead
    await s.client.zadd(f"{s.prefix}lk:c1", {junk: 1})
    with pytest.raises(coredis.exceptions.ResponseError) as error:
        await limit_acquire(s, C, f"{C}/1", "c1")
    assert f"foreign data in the slot store at {s.prefix}lk:c1: {NO_GROUP}" in str(error.value)


NO_POOLS = "pools that are not its group's"


@pytest.mark.parametrize("junk", ["junk", '["c2"]', "[]"])
@pytest.mark.parametrize("script", ["limit_release", "limit_renew"])
async def test_a_waiter_whose_pools_are_not_its_groups_is_read_as_none_and_named(
    s: Scripts, script: str, junk: str
) -> None:
    """A holds ``c1``; C waits for it, and B after C. C's waiter's ``pools`` field (its
    ``lw`` hash) becomes no JSON list, or one of other pools (data no script wrote). A's
    release, or B's renewal once A's units died, settles ``c1`` and meets C at the head:
    C's waiter counts as one whose key holds foreign data (dropped from its group, not
    granted), B is granted, and the reply names the key. Before, the script failed with
    a Lua error (``cjson.decode``), or granted C units of pools it never checked."""
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"
    assert (await limit_acquire(s, C, f"{C}/1", "c1")).kind == "waiting"
    assert (await limit_acquire(s, B, f"{B}/1", "c1")).kind == "waiting"
    await s.client.hset(f"{s.prefix}lw:{C}/1", {"pools": junk})
    assert await settled_by(s, script) == (f"lw:{C}/1: {NO_POOLS}",)
    assert list(await s.client.hgetall(f"{s.prefix}lh:c1")) == [f"{B}/1"]
    assert await s.client.hgetall(f"{s.prefix}lh:c2") == {}
    assert await s.client.exists([f"{s.prefix}lw:{C}/1"]) == 0


@pytest.mark.parametrize("junk", ["lk", "lw"])
async def test_limit_renew_refuses_only_its_waiter_that_meets_foreign_data_of_its_own(
    s: Scripts, junk: str
) -> None:
    """B waits in ``c1`` and in ``c2``, both held by A, whose units then die; a group id
    that is no JSON list of pools is parked on ``c1`` (``lk``), or the ``pools`` field of
    B's waiter of ``c1`` becomes no JSON list (``lw``). B's renewal refuses the waiter of
    ``c1`` alone (``['foreign', 'c1', what]``, as for foreign data at its own keys),
    withdraws it, and grants the other. Before, the whole renewal failed with a Lua
    error, every time: B's units of every pool lost, its waiters never granted."""
    for w, pool in ((f"{A}/1", "c1"), (f"{A}/2", "c2")):
        assert (await limit_acquire(s, A, w, pool)).kind == "granted"
    for w, pool in ((f"{B}/1", "c1"), (f"{B}/2", "c2")):
        assert (await limit_acquire(s, B, w, pool)).kind == "waiting"
    await s.client.delete([f"{s.prefix}lu:{A}"])  # A's units are dead
    if junk == "lk":
        await s.client.zadd(f"{s.prefix}lk:c1", {"junk": 1})
        what = f"lk:c1: {NO_GROUP}"
    else:
        await s.client.hset(f"{s.prefix}lw:{B}/1", {"pools": "junk"})
        what = f"lw:{B}/1: {NO_POOLS}"
    renewed = await limit_renew(s, B, (f"{B}/1", ("c1",)), (f"{B}/2", ("c2",)))
    assert (await refused_alone(s, renewed, "c1", what)).kind == "granted"


@pytest.mark.parametrize("foreign", ["x", "nan", "inf", "-5", "0", "1e300"])
async def test_a_longest_lease_no_script_wrote_counts_as_none(s: Scripts, foreign: str) -> None:
    """Foreign data where the longest lease in use is kept (``lttl``): the scripts read
    it as none and write their own, the common acquisition and the full script alike.
    Before, a value that is no number failed every limit script ("bad argument #2 to
    'max'"), and "inf", "nan" or a huge number gave keys an expiry the server refuses."""
    key = f"{s.prefix}lttl"
    await s.client.set(key, foreign)
    assert (await limit_acquire(s, A, f"{A}/1", "c1")).kind == "granted"  # the short way
    assert await s.client.get(key) == str(int(1000 * s.store.lease_ttl))
    await s.client.set(key, foreign)
    assert (await limit_acquire(s, B, f"{B}/2", "c1")).kind == "waiting"  # the full script
    assert await s.client.get(key) == str(int(1000 * s.store.lease_ttl))
    assert 0 < await s.client.pttl(f"{s.prefix}lh:c1") <= 2000 * s.store.lease_ttl


async def test_limit_renew_reads_a_generation_of_foreign_data_as_none(s: Scripts) -> None:
    """A list at C's generation key (``lu``: the lease of its units) while C holds pool
    ``c1``'s unit and B waits for it: B's renewal reads it as none (C's units are dead:
    B is granted) and names the key; C's own renewal makes a new generation, and its
    unit is lost. Before, both renewals failed, every time."""
    assert (await limit_acquire(s, C, f"{C}/1", "c1")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/1", "c1")).kind == "waiting"
    await s.client.delete([f"{s.prefix}lu:{C}"])
    await s.client.rpush(f"{s.prefix}lu:{C}", ["foreign"])
    renewed = await limit_renew(s, B, (f"{B}/1", ("c1",)))
    assert renewed.waiters[0].kind == "granted"
    assert renewed.unowned == (f"lu:{C}: {WRONGTYPE}",)
    args = scripts.limit_renew_args(C, [], [("c1", [f"{C}/1"])])
    lost = scripts.parse_limit_renew(await s.call(scripts.LIMIT_RENEW, *args))
    assert lost.lost == {f"{C}/1"}
    assert lost.unowned == (f"lu:{C}: {WRONGTYPE}",)
    assert await s.client.get(f"{s.prefix}lu:{C}") == lost.gen


async def test_foreign_data_of_another_type_at_the_longest_lease_counts_as_none(
    s: Scripts,
) -> None:
    """A list where the longest lease in use is kept (``lttl``): every limit script reads
    it as none and writes its own, the renewal too. Before, it failed every limit
    script: the common acquisition, the full one and every renewal (an outage of the
    units of every process of the namespace)."""
    key = f"{s.prefix}lttl"
    for acquire in (f"{A}/1", f"{B}/2", None):  # the short way, the full script, a renewal
        await s.client.delete([key])
        await s.client.rpush(key, ["foreign"])
        if acquire is None:
            renewed = await limit_renew(s, B, (f"{B}/2", ("c1",)))
            assert renewed.waiters[0].kind == "waiting"
        else:
            reply = await limit_acquire(s, acquire.split("/")[0], acquire, "c1")
            assert reply.kind == ("granted" if acquire.startswith(A) else "waiting")
        assert await s.client.get(key) == str(int(1000 * s.store.lease_ttl))


async def test_a_release_of_several_pools_grants_the_oldest_of_all_their_waiters(
    s: Scripts,
) -> None:
    """Waiters of two freed pools compete for a third: the older one gets it, whichever
    pool the release names first."""
    assert (await limit_acquire(s, A, f"{A}/h", "c1", "c2")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/old", "c2", "c3")).kind == "waiting"
    assert (await limit_acquire(s, B, f"{B}/new", "c1", "c3")).kind == "waiting"
    await limit_release(s, f"{A}/h", "c1", "c2")
    assert (await limit_acquire(s, B, f"{B}/old", "c2", "c3")).kind == "granted"
    assert (await limit_acquire(s, B, f"{B}/new", "c1", "c3")).kind == "waiting"


async def test_the_slots_command_counts_the_live_waiters_of_every_pool_set(
    s: Scripts, store: RedisSlotStore
) -> None:
    """``read_namespace`` counts a pool's live waiters across the pool sets that include
    it, and none of an instance whose units' lease is gone."""
    assert (await limit_acquire(s, A, f"{A}/h", "c1")).kind == "granted"
    for w, pools in [("1", ("c1",)), ("2", ("c1",)), ("3", ("c1", "c2"))]:
        assert (await limit_acquire(s, B, f"{B}/{w}", *pools)).kind == "waiting"
    namespace = await read_namespace(store)
    assert (namespace.pools["c1"].waiting, namespace.pools["c2"].waiting) == (3, 1)
    await s.client.delete([f"{s.prefix}lu:{B}"])
    namespace = await read_namespace(store)
    assert (namespace.pools["c1"].waiting, namespace.pools["c1"].holders) == (0, [A])


async def commands_of(s: Scripts, *args: str) -> tuple[scripts.LimitReply, dict[str, int]]:
    """A ``limit_acquire`` reply and the commands it ran on the server, by name."""
    await s.client.config_resetstat()
    reply = scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args))
    stats = await s.client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return reply, {k: n for k, n in calls.items() if k != "evalsha" and not k.startswith("config")}


async def test_a_rate_start_with_room_costs_the_server_few_commands(s: Scripts) -> None:
    """The common acquisition (rate pools with room, no waiter, the instance's
    generation made) runs one command per thing it must read or write, none of the
    full script's: the marker, the generation's renewal, one check that nobody waits,
    the clock, each pool's settings and state, its new state and expiry, the new
    marker. Sent again it reads its marker, and renews the generation it checks the
    marker against."""
    rate = "rate 1 per 60.0 burst 10"  # a start every minute: the keys live that long
    pools = [("r1", rate), ("r2 key", rate)]
    args = scripts.limit_acquire_args(A, f"{A}/1", pools)
    assert (await limit_acquire(s, A, f"{A}/0", "c1")).kind == "granted"  # the generation
    reply, calls = await commands_of(s, *args)
    assert reply.kind == "granted"
    assert calls == {
        "get": 1,
        "getex": 1,
        "exists": 1,
        "time": 1,
        "hmget": 2,
        "hset": 2,
        "pexpire": 2,
        "set": 1,
    }
    assert await commands_of(s, *args) == (reply, {"get": 1, "getex": 1})
    for pid, _ in pools:
        key = f"{s.prefix}lp:{pid}"
        assert await s.client.hget(key, "spec") == rate
        assert 59_000 < await s.client.pttl(key) <= 60_001


async def test_a_concurrency_unit_with_room_costs_the_server_few_commands(s: Scripts) -> None:
    """A concurrency pool with room takes the same short way: its holders counted (a
    dead instance's removed, as the full script removes them), the longest lease_ttl in
    use read (the keys' expiry), the unit, the keys' expiry and the marker written, and
    nothing else; a full pool takes the full script, which queues the request."""
    spec = "concurrency 2"
    for instance, w in [(A, f"{A}/1"), (B, f"{B}/2")]:
        args = scripts.limit_acquire_args(instance, w, [("c", spec)])
        assert scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args)).kind == "granted"
    await s.client.delete([f"{s.prefix}lu:{B}"])  # B's units' lease expired
    reply, calls = await commands_of(s, *scripts.limit_acquire_args(A, f"{A}/3", [("c", spec)]))
    assert reply.kind == "granted"
    assert calls == {
        "get": 3,  # the marker, B's generation, the longest lease_ttl in use
        "getex": 1,
        "exists": 1,
        "hmget": 1,
        "hgetall": 1,
        "hdel": 1,
        "hset": 1,
        "pexpire": 2,
        "set": 1,
    }
    assert set(await s.client.hkeys(f"{s.prefix}lh:c")) == {f"{A}/1", f"{A}/3"}
    for key in ("lh:c", "lp:c"):
        assert 0 < await s.client.pttl(f"{s.prefix}{key}") <= 2 * 1000 * s.store.lease_ttl
    args = scripts.limit_acquire_args(A, f"{A}/4", [("c", spec)])
    assert scripts.parse_limit(await s.call(scripts.LIMIT_ACQUIRE, *args)).kind == "waiting"


# -- probe -----------------------------------------------------------------------------------


def test_the_probe_calls_every_command_the_scripts_call() -> None:
    """A command added to a script is tried at start too, or this fails (a command is
    called with ``redis.call``, ``redis.pcall`` or ``unowned_read``, or named to
    ``foreign_at``)."""
    calls = r"(?:redis\.p?call|unowned_read)\('([A-Z]+)'|foreign_at\([^,]+, '([A-Z]+)'"
    called = {
        command
        for script in scripts.SCRIPTS
        if script is not scripts.PROBE
        for match in re.findall(calls, script.source)
        for command in match
        if command
    }
    assert called == set(scripts.PROBED)


async def test_the_probe_leaves_no_key(s: Scripts, client: coredis.Redis[str]) -> None:
    # (this namespace's keys only: another test's may expire meanwhile)
    before = await client.keys(f"{s.prefix}*")
    assert await s.call(scripts.PROBE, A) == "ok"
    assert await client.keys(f"{s.prefix}*") == before
