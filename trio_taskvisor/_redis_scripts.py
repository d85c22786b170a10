"""The server side of cluster slots: Lua scripts, their arguments and their replies.

Pure text and parsing, no I/O: the lease keeper (``_keeper``) sends these scripts with
``EVALSHA``; the tests run them against a real server and against a Python model.

Data model (prefix ``P = "tv:{<namespace>}:"``; an *entry* is ``"<instance_id>/<task_id>"``,
one submission, unique per acquisition):

======================  ======  ===========================================  ===========
key                     type    content                                      expiry
======================  ======  ===========================================  ===========
``P lease:<slot>``      hash    ``entry``, ``token``, ``stop`` (requester)    lease_ttl
``P fence:<slot>``      string  the last fence token of the slot             none
``P q:<slot>``          list    entries, FIFO, head at index 0               none
``P hb:<instance>``     string  heartbeat: the process's lease_ttl in ms     lease_ttl
``P gone:<entry>``      string  why the entry left for good (a RejectionKind   keep
                                value, or ``<value>: <reason>``)
``P out:<entry>``       string  the outcome JSON for joiners, or ``pending``  keep
``P jn:<entry>``        set     instances whose joiners follow the entry     keep (1)
``P watch:<slot>``      set     instances holding work for room in the queue  lease_ttl (1)
``P ch:<instance>``     pubsub  JSON messages to one process
======================  ======  ===========================================  ===========

``keep = max(60 s, 10 * lease_ttl)``. (1): the longest of its members', since replicas
may run with different ``lease_ttl``: a member's call never shortens a set's expiry. An
entry is *live* while its instance's heartbeat exists and it has no ``gone`` marker. A
script that marks an entry gone takes it out of its queue in the same call, and none
queues an entry that has a marker, so for a queued entry only the heartbeat is checked
(the model-based tests hold the scripts to the full rule). Every script that reads a
queue first removes the entries that are not live ("prune"), telling the watchers
``room`` if it removed any, but for ``renew`` on an entry queued behind a lease holder:
it cannot be claimed, so one ``LPOS`` says it is still queued (the next claim, submit or
release prunes). Only the live head of a queue may take a free lease; a slot is busy
while its lease exists or its queue is not empty. A script that gives a lease back
(``release``, ``withdraw``) hands it to the live head at once and pushes the grant to the
head's process (``grant``), which starts without a claim; ``claim`` remains for a lease
that expired (expiries publish nothing) and for a process that missed the message (its
renewal also answers ``owner``). A ``submit`` (but a REPLACE's, which takes the lease
itself) or a ``claim`` by another entry that finds the lease free and the queue not
empty hands the lease over too: the head's own claim is due then, or never comes (a
failover that lost a hand-over, or a restart from an older copy, left the head an entry
whose live process no longer knows it; that process gives such a grant back with a
withdrawal). Before, the slot waited for that claim while the process lived. A
``withdraw`` hands a free lease over too, also when it finds nothing of its entry: a
try of it that failed before its hand-over (the keeper sends it again) gave the lease
back, and a ``release`` sent again hands over likewise (before, it did nothing then).
A lease lasts the ``lease_ttl`` of its holder's process, which its heartbeat holds, whoever
grants it: replicas may run with different ``lease_ttl`` (a rolling change of it), and
a holder counts on its own (a heartbeat of earlier versions, ``1``, says nothing: the
caller's).

Foreign data (a key of the namespace of another type than this table says: written by
something else) fails the call that touches it, with the server's error, but for
``renew``, which carries every item of a process: a slot's ``lease`` or ``q`` key of
another type refuses that slot's items only (``['foreign', what]``), and an entry's
``gone``, ``out`` or ``jn`` key of another type the items that read it only (the
entry's, or the follow's), the reads it makes anyway done with ``redis.pcall`` (one
``TYPE`` more only where a queue is pruned), so one foreign key no longer fails the
renewal of every lease of the process. A follow of an entry that its own renewal
refuses so (its slot's key of another type) answers that refusal too: ``['foreign',
what]`` for a queued entry, ``['foreign_lease', what]`` for the lease holder, whose
owner loses its lease; its joiners end as the entry does, for the same cause (before,
they ended lost two renewals later). Only a ``WRONGTYPE`` error counts as foreign data
there: any other (an ACL that takes a command away, a server out of memory) fails the
script as ``redis.call`` would, a refusal, which makes an outage, not a loss. Foreign
data that no item of the renewal owns is read as none, and the renewal goes on; its
reply names each such key, which the keeper logs at ERROR: another process's ``hb`` key
(that process counts as gone, as one whose heartbeat expired: its queued entries are
pruned, a follow of its work answers ``lost``; a process that lives writes its key anew,
with ``SET``, at its next renewal, and its entries come back at their queues' tails), and
a slot's ``watch`` key when a prune tells the watchers (nobody is told: each watcher
asks again at its own renewal). Refusing the items that read such a key instead would
refuse, in every process, the entries of each queue that another process's entry sits
in, for as long as the key stays (for ever, for a process that is gone). ``release``
on a lease key of foreign data refuses the lease part only (``['foreign', what,
reply]``: as the owner's renewal refuses the lease, which has nothing to give back or
hand over), and does its outcome part, so that the entry's joiners hear of its
outcome at once (its owner's ``LEASE_LOST`` for the refused lease, as a rule), not at
their next renewal. ``submit``, ``claim``, ``release`` and ``withdraw`` read those two
keys that no call owns, another process's ``hb`` and a slot's ``watch`` (when a prune,
or a grant, tells the watchers), as ``renew`` does: as none, the call going on, its
reply wrapped as ``{'unowned', {what, ...}, reply}`` (``reads_unowned``; the grouped
form wraps each call's), which the keeper logs at ERROR. Before, each failed at such a
key, and a ``claim``, a hand-over or a REPLACE that took the lease failed after its
grant (a script keeps what it wrote): the claim's entry held a lease whose owner heard
of it only at its next renewal, and a hand-over's head was taken out of the queue and
given a lease nobody was told of. With those reads done as none, nothing of a grant
is left half-done there; and a grant comes before the head's ``LPOP``, so one that fails
on the slot's own fence key of foreign data (which fails the call: ``SET ... GET``
refuses it before it writes) leaves the head queued, not out of its queue until its
renewal put it back at the tail. The head's own ``claim`` whose grant fails so is
refused instead (``{'foreign', what}``, which its keeper rejects, naming the key): it
leaves its queue for good, marked gone (``store_unavailable``) and its joiners told, as a
withdrawal does; failing, it stayed the claimable head, its claim failed at each of its
renewals, and its waiter was never answered (the grant's ``SET ... GET`` is a ``pcall``:
no call more). The ``pcall`` is made where those keys are read only (one
per heartbeat read, memoized, and per ``room``): no call more on the common path. A
``watch`` key a full ``submit`` adds its process to is its own (``SADD``): foreign data
there fails the submit, as before, before it wrote anything (its prune aside).
``withdraw`` reads the slot's ``lease`` and ``q`` keys of foreign data as none too (named
the same way): its entry cannot hold such a lease nor wait in such a queue, and the
keeper withdraws an entry that its renewal refuses for such a key (its marker
``store_unavailable: <reason>``, naming the key, so that its joiners end as it did).
Failing there, the withdrawal left the entry in the queue while its process lived.
An entry's joiners key (``jn``) of foreign data is read as none, and named, by the calls
of the entry itself that tell its joiners (``withdraw``, ``release`` with an outcome,
``store_outcome``, a ``claim`` that refuses its entry, a REPLACE that supersedes the
head): the key is its joiners' (their renewals and JOIN submits write it), and a joiner's
renewal refuses its follow for that key, so there is nobody to tell. Before, each of
those calls failed there: a withdrawal or a release after it gave the lease back, before
its hand-over (the queue's head waited for a claim of its own), and the keeper sent the
call again with each renewal for as long as its process lived.
A heartbeat that is a string but no lease TTL in ms (foreign data of the right type:
no ``WRONGTYPE``) says nothing, as ``1`` does: a grant to that process's entry lasts
the caller's ``lease_ttl``, and the key is named as above. The process stays live (its
key exists; its next renewal writes it anew): read as no heartbeat, its entries would
be pruned, and its lease holders lose their leases at their next renewal, for another
process's write. Before, the grant's ``PEXPIRE`` failed the script after it had set
the lease's fields: a lease without expiry, which a hand-over's head (taken out of the
queue, never told) could never give back, and the slot was stuck while that process
lived.

Every script is idempotent per entry: a client may send it again after a connection
error (a lost reply) and the second run changes nothing the first did not. A ``gone``
marker is checked before anything may grant a lease or queue an entry, so a withdrawal
that overtakes the request it withdraws still wins.

Fence tokens: ``max(last + 1, server TIME in microseconds)``, built and compared as
decimal strings, because Lua's number-to-string conversion keeps 14 digits; the
``+ 1`` goes through ``INCR``. Tokens stay below 2**53 until the year 2255.

A rate pool's GCRA ``tat`` more than a full burst ahead of the server's clock (which
GCRA never leaves: the clock stepped back, as after a failover to a node whose clock is
behind) is read and written back as a burst just spent (``capped``): the pool waits
one interval, not the step. Rate pools count on the server's clock (docs/design.md,
"Limit pools on the server"); what a step of that clock does is decided here.

A rate pool's GCRA state is ``start`` and ``n`` (its ``tat`` is ``start + n * interval``,
ms), as in one process (``_limits``): the start of its busy stretch and the starts
counted since, so the rounding is one product and one subtraction, never a sum. A
``tat`` moved on by ``interval`` at each start, a double near the server's clock
(``1.8e12`` ms, a step of ``2**-12`` ms), lost what fell below that step: with an
interval below half the step (a rate above about 8.2 million per second:
``RateLimit("r", 10_000_000)``, ``1e-4`` ms) it never moved, so every acquisition of
one instant was granted, no limit at all; with one of about 1.4 steps it moved by one,
so ``RateLimit("r", 1, per=3.4e-7, burst=12)`` granted 16 in one instant. The ``slots``
reading counted the same ``tat``. Decided: keep the exact state, not refuse such
intervals for a cluster: a limit that one process honours is honoured across the
cluster, and the state costs no call (its fields are read and written by the same
``HMGET`` and ``HSET``). In one instant a pool now grants at most ``burst`` (exactly
``burst`` after an idle stretch) whatever its interval, and ``cluster_limit`` and the
``slots`` reading say a start waits exactly when an acquisition then waits (the
server's clock counts microseconds: an interval below one allows as many starts per
microsecond as it holds intervals). A rolling upgrade: the scripts also write ``tat``
(the double ``start + n * interval``), which earlier versions read and write alone;
``start`` and ``n`` count only while the ``tat`` beside them is the one they make, so a
``tat`` an earlier version moved on, capped or deleted (a ``tat`` alone, or none) is read
as ``start = tat, n = 0``: the GCRA state as that version left it.

Keys the server drops (evicted under a ``maxmemory-policy`` other than ``noeviction``,
deleted by a clean-up script) lose what they held: every ``limit_renew`` names the units
its process holds, pool by pool, and a unit its pool's holders (``lh:<pool>``) no longer
hold is lost then, as a slot lease whose key went is lost at its owner's next
``renew``; another process may take its room meanwhile, for at most one renewal
interval. Foreign data there (another type of key, which no script wrote) counts as
holding none in that check, as ``lttl``'s does: those units are lost (their other pools'
units given back, that pool left alone; the reply names the key, which the keeper
logs), and the renewal goes on for the process's other units (failing, it would lose
them all). A waiter that the renewal asks for again is refused alone when a key it
reads holds foreign data: its pools' holders (``lh``), settings (``lp``), waiting
(``lq``) and parked (``lk``) groups, its group (``lg``), its own keys (``lw``, ``lx``):
``['foreign', pool, what]``, and it ends with an error naming the key and the
server's ``WRONGTYPE`` error, as an acquisition answered with that error does. It is
withdrawn there, as ``limit_withdraw`` would (it leaves its line, a grant it has not
heard of is given back, its marker says ``gone``), and the renewal goes on for the
other waiters. Foreign data that no waiter of the renewal owns, met where it settles a
pool (another pool of a group that waits in it, another group, another process's
waiter), or where it reads another process's generation (``lu``) or the acceptance
counter (``lseq``), is read as none, and the renewal goes on; its reply names each such
key, which the keeper logs at ERROR: a pool whose settings or holders are foreign
data has no room (a group that waits for it too waits on, parked there), an index
key of foreign data is left as it is, a group whose key is foreign data counts as
empty (it leaves the indexes), a waiter whose key is, as one whose process is gone (it
leaves its group, not granted), a generation, as none (that process's units are
dead; the process's own makes a new one, and its units are lost). Failing the renewal
instead loses every unit of the process, for a key that is not its own. The longest
lease in use (``lttl``) of foreign data of any type counts as none in every limit
script (it is written anew). An acquisition (``limit_acquire``) reads foreign data that
its request does not own as none, as the renewal does, where its settle meets it
(another pool of a group parked on its pools, another group, another process's waiter
or generation, the acceptance counter), its reply wrapped as ``{'unowned', {what,
...}, reply}`` (``reads_unowned``; the keeper logs each at ERROR); its common case
(``_LIMIT_ACQUIRE_FAST``) leaves a holder's generation of foreign data to the full
script. At its own keys (its pools' ``lp``, ``lh``, ``lq``, ``lk``, its group's
``lg``, its ``lw``, ``lx``, its process's ``lu``: ``owned``) it fails naming the
server's error, as before, and the keeper withdraws it (the script may have granted
it before it failed: an own waiting-groups key is read only after the grant).
A release (``limit_release``) and a withdrawal (``limit_withdraw``) read every key of
foreign data as none and name it in their reply (``{'ok', what, ...}``), which the
keeper logs at ERROR: they give back, and a holders key of foreign data holds none of
the request's units, so there is nothing to refuse; failing, a release gave back the
units of the pools before the key only (its script keeps what it wrote), and the
others stayed held while the process lived (the keeper sent a release again after no
reply, not after an error one: it now does with each renewal too, for errors that are
not foreign data). A withdrawal of a request whose marker (``lx``) is foreign data
gives its units back as if granted (a release of units not held changes nothing) and
leaves the marker as it is (an acquisition still on its way fails on it).
A pool's holders (``lh``) with a field that is no request (no ``/``: of no instance,
foreign data of the right type, which no script wrote) are foreign data as a key of
another type is: read as none where such a key is (a pool without room, named
``lh:<pool>: a holder that is no request``), and where the key is the call's own (an
acquisition's pools, a renewal's waiter's, the ``cluster_limit`` query) the script fails
naming it (``ERR foreign data in the slot store at <key>: ...``), which refuses the
acquisition, or the renewal's waiter alone (``['foreign', pool, what]``). Before, every
limit script that read the pool failed with a Lua error (``gen_of`` of no instance): a
renewal, losing every unit of its process; a release, keeping the units of the pools
after it. So are a pool's settings (``lp``'s ``spec``) that no script writes (none that
``spec_text`` makes: ``rate 1 per x burst 1``, ``concurrency 0``, ``bogus``), named
``lp:<pool>: settings that are no pool's``: checked where ``pool`` parses them (a rate
whose interval is no finite number above 0, a capacity or a burst below 1), no call
more; the common case of ``limit_acquire`` reads the settings it is sent only, and
leaves any other to the full script. Before, a Lua error failed every script that read
the pool (or, for a capacity of 0, it never had room). So is a rate pool's GCRA ``tat``
that is no finite number (``nan``, ``inf``, ``x``: no script writes one), named
``lp:<pool>: a tat that is no finite number``; the common case of ``limit_acquire``
leaves it to the full script. Before, ``nan`` failed every limit script that kept the
pool's settings (a ``PEXPIRE`` of NaN: a renewal as a whole, a release after it gave
back some units), and the others were taken for none or for a clock that stepped back,
and written over. A waiter (``lg``) that is no request counts as one of a dead instance,
and is read as none and named (``lg:<group>: a waiter that is no request``) wherever the
scripts keep ``unowned``, the call's own group too: it holds no units, so no room
depends on it (a settle drops it from its group); before, it was dropped without a
word.
A group parked on a pool (a member of ``lk``) whose id is no JSON list of pool ids (not
JSON, not a list of strings, or empty: no script wrote it) is foreign data too, named
``lk:<pool>: a group that is no list of pools``: read as none where the pool is not the
call's own (a release's or a withdrawal's settle, another pool that a settle meets: the
group is skipped and left as it is), and where it is (an acquisition of the pool, a
renewal's waiter of it, whose settle meets it) the script fails naming it, which refuses
the acquisition, or the renewal's waiter alone. Before, every script that met it failed
with a Lua error (``cjson.decode``: a release after it gave back some units, a renewal
as a whole), and one of ``[]`` or of a JSON object never ended: a settle took it for a
group whose every pool has room, found no waiter in it, and met it again, the server
busy with it (a script that has written cannot be killed) until it was restarted. A
group waiting in a pool (``lq``) is never decoded: one that no script wrote counts as a
group without waiters, and is left as it is. A waiter's ``pools`` field (``lw``) that is
no JSON list of its group's pools is foreign data as well, named ``lw:<w>: pools that
are not its group's``: met at the head of its group, the waiter counts as one whose key
holds foreign data (dropped from its group, not granted), and where the waiter is the
call's own (an acquisition sent again, a renewal's waiter) the script fails naming it,
which refuses it. Before, a Lua error; for a list of other pools, units taken in pools
whose room nobody checked (a Lua error in a pool without settings).

Messages on ``P ch:<instance>`` are JSON arrays: ``["grant", slot, entry, token,
expiry_ms]`` (the lease is the entry's; ``token`` a decimal string; ``expiry_ms`` the
lease's expiry on the server's clock, a decimal string of Unix milliseconds),
``["room", slot]``, ``["stop", slot, entry, requester]``, ``["superseded", slot, entry]``,
``["done", entry]``; ``["wake", slot]`` (claim now) came from earlier versions of these
scripts, in place of ``grant``.

``submit`` and ``release`` also have a grouped form (``GROUPED``): several calls in
one, each run as the script's body and answered as its own call would be.

Every script opens with a header naming the keys it touches (relative to ``P``), its
own arguments and its reply shapes. Every script takes ``ARGV[1..3] = P, lease_ttl_ms,
keep_ms`` and its own arguments after them; none uses ``KEYS`` (a single server, not
Redis Cluster; the ``{namespace}`` hash tag keeps every key of a namespace in one cluster
slot all the same). ``renew``, which carries thousands of items, takes its pairs as one
JSON argument and answers in JSON: encoding that many separate arguments and parsing
that many reply items cost the client more than the script itself. The replies are
typed on the Python side (``SubmitKind``, ``ClaimKind``, ``QueuedKind``, ``FollowKind``,
``ReleaseReply``): the keeper matches them exhaustively.

A string of a reply that is not UTF-8 (another client wrote it into the namespace: a
lease's entry, a ``gone`` reason, a pool's settings; the client leaves it as bytes) is
read with those bytes escaped (``\\xff``, ``_shown``) in the replies of a submit, a claim,
an acquisition and the queries, as the ``slots`` command shows it: never the ``repr`` of
bytes (a joiner of such a lease ended "followed work lost: b'h\\xff:1:x"). An escaped
entry is plain ASCII, so it can be sent back (a joiner follows it, and finds it lost).
The JSON replies (``renew``, ``limit_renew``) keep such bytes as surrogate escapes, and
so do a ``limit_acquire`` reply's generation and the messages (``P ch:<instance>``),
which the keeper compares with a renewal's: before, an acquisition read a generation
that is not UTF-8 as the ``repr`` of bytes, so the units it granted were lost at the
next renewal, and a message of it was no JSON (ignored).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Final, Generic, Literal, TypeAlias, TypeVar, cast

import attrs

from ._slotstore import stored_integer

# -- Lua ------------------------------------------------------------------------------------

_PRELUDE: Final = r"""
-- TTL and KEEP stay strings: they are only ever command arguments
local P, TTL, KEEP = ARGV[1], ARGV[2], ARGV[3]

local function instance_of(e) return string.match(e, '^(.*)/') end

-- 'key: error' for a redis.pcall's error reply r at key (after P) if it says WRONGTYPE
-- (foreign data at the key: the caller refuses what reads it); any other error (a
-- refusal: an ACL change, a server out of memory) is raised, failing the script as
-- redis.call would.
local function wrongtype(key, r)
  if string.find(r.err, 'WRONGTYPE', 1, true) then return key .. ': ' .. r.err end
  error(r)
end

-- renew and limit_renew set this to a list: they read foreign data at a key that no
-- item of theirs owns (another process's heartbeat, a slot's watch key; another pool's,
-- group's or process's keys that a settle meets) as none, naming the key here (their
-- reply says them). So do submit, claim, release, withdraw and store_outcome (another
-- process's heartbeat, a slot's watch key, an entry's joiners key; withdraw, its slot's
-- lease and queue keys too: ``reads_unowned`` wraps their replies) and
-- limit_release and limit_withdraw (any key); in the other scripts (nil) such a key
-- fails the script.
local unowned = nil
-- limit_acquire sets this to the keys (after P) its request owns: foreign data there
-- fails the script all the same
local owned = nil

-- redis.call(cmd, P .. key, ...), but where unowned is set a key of foreign data that
-- the call does not own reads as none (nil)
local function unowned_read(cmd, key, ...)
  if not unowned or (owned and owned[key]) then return redis.call(cmd, P .. key, ...) end
  local r = redis.pcall(cmd, P .. key, ...)
  if type(r) == 'table' and r.err then
    unowned[#unowned + 1] = wrongtype(key, r)
    return nil
  end
  return r
end

-- Foreign data of the right type at key (after P): what names it. Read as none where
-- unowned_read reads a key of another type as none (named in unowned); elsewhere it
-- fails the script, naming the key (as an error of the server would). named keeps
-- what, by key, for a caller that refuses what read it (limit_renew's waiters).
local named = {}
local function read_foreign(key, what)
  named[key] = what
  if not unowned or (owned and owned[key]) then
    error({err = 'ERR foreign data in the slot store at ' .. P .. what})
  end
  unowned[#unowned + 1] = what
end

-- The heartbeat of process i: the lease TTL it renews with, in ms ('1' from earlier
-- versions of these scripts), or false when the process is gone (in renew, also when
-- its key holds foreign data: its process writes it anew at its next renewal).
local hb_memo = {}
local function heartbeat(i)
  local h = hb_memo[i]
  if h == nil then
    h = unowned_read('GET', 'hb:' .. i) or false
    hb_memo[i] = h
  end
  return h
end
local function alive(i) return heartbeat(i) ~= false end

-- A queued entry has no gone marker (see the module docstring): only the heartbeat counts.
local function live(e) return alive(instance_of(e)) end

local function tell(i, msg) redis.call('PUBLISH', P .. 'ch:' .. i, cjson.encode(msg)) end

-- Make key k (a set of instances) last ms from now, unless it lasts longer already: the
-- replicas that share it may run with different lease_ttl (a rolling change of it), and
-- a shorter one's call must not cut a longer one's registration short. (PEXPIRE's GT
-- does this from Redis 7 on; 6.2 is supported.) A key without expiry (PTTL -1) was just
-- made by the caller's SADD.
local function last_at_least(k, ms)
  if redis.call('PTTL', k) < tonumber(ms) then redis.call('PEXPIRE', k, ms) end
end

-- Tell the slot's watchers of room (in renew, none when the key holds foreign data: they
-- learn of room at their own renewal)
local function room(slot)
  local watchers = unowned_read('SMEMBERS', 'watch:' .. slot) or {}
  if #watchers == 0 then return end
  for _, i in ipairs(watchers) do tell(i, {'room', slot}) end
  redis.call('DEL', P .. 'watch:' .. slot)
end

-- Tell e's joiners that e is done. Its joiners key of foreign data (their renewals and
-- JOIN submits write it, not e's calls) is read as none where unowned is set: nobody is
-- told, and a joiner's renewal refuses its follow for that key (see the module docstring).
local function done(e)
  for _, i in ipairs(unowned_read('SMEMBERS', 'jn:' .. e) or {}) do tell(i, {'done', e}) end
end

-- The live entries of a slot's queue, in order, after removing the others.
local function prune(slot)
  local qk = P .. 'q:' .. slot
  local q, removed = {}, false
  for _, e in ipairs(redis.call('LRANGE', qk, 0, -1)) do
    if live(e) then q[#q + 1] = e else redis.call('LREM', qk, 0, e); removed = true end
  end
  if removed then room(slot) end
  return q
end

local function position(q, e)
  for k, x in ipairs(q) do if x == e then return k end end
  return nil
end

-- entry, token, stop of the slot's lease (false each when the lease is free)
local function lease_of(slot)
  local v = redis.call('HMGET', P .. 'lease:' .. slot, 'entry', 'token', 'stop')
  return v[1], v[2], v[3]
end

-- The lease TTL (ms, a string) of e's process: a lease granted to e lasts as long as
-- its process counts on, which may run with another lease_ttl than the caller's (a
-- rolling change of it). The caller's own when e's heartbeat does not say.
-- A heartbeat that is no lease TTL in ms (no script wrote it: foreign data, of the
-- right type) says nothing either, as '1' does: the caller's, named in unowned (a
-- PEXPIRE with it failed the grant, after the queue's head was taken out).
local function ttl_of(e)
  local i = instance_of(e)
  local h = heartbeat(i)
  if h == TTL then return h end
  if h and h ~= '1' then
    if #h < 16 and string.match(h, '^[1-9]%d*$') then return h end
    if unowned then unowned[#unowned + 1] = 'hb:' .. i .. ': no lease TTL in ms' end
  end
  return TTL
end

-- Give the free lease to e for e's TTL; return its fence token (a decimal string), the
-- server's TIME and that TTL. A free lease has no key (every write of one sets its
-- entry), so nothing to delete, and the fence is read as it is set: two calls fewer per
-- grant (benchmark 10, the 3x50 callers and hand-over rows).
-- Foreign data at the fence key (SET ... GET refuses it before it writes anything)
-- fails the script, or, with refusable (e's own claim), returns false and what.
local function grant(slot, e, refusable)
  local fk = P .. 'fence:' .. slot
  local t = redis.call('TIME')
  local now = t[1] .. string.format('%06d', tonumber(t[2]))
  local token = now
  local last = redis.pcall('SET', fk, now, 'GET')
  if type(last) == 'table' then
    if refusable then return false, wrongtype('fence:' .. slot, last) end
    error(last)
  end
  if last and (#last > #now or (#last == #now and last >= now)) then
    -- the last token is not below the clock (a clock step back, or within its tick)
    redis.call('SET', fk, last)
    redis.call('INCR', fk)
    token = redis.call('GET', fk)
  end
  local lk = P .. 'lease:' .. slot
  local ttl = ttl_of(e)
  redis.call('HSET', lk, 'entry', e, 'token', token)
  redis.call('PEXPIRE', lk, ttl)
  return token, t, ttl
end

-- Milliseconds until a waiter of the slot should claim again: the lease's expiry, or
-- the heartbeat expiry of the head (it may be a dead process that nobody pruned yet).
local function retry_ms(slot, q, holder)
  if holder then return redis.call('PTTL', P .. 'lease:' .. slot) end
  if q[1] then return redis.call('PTTL', P .. 'hb:' .. instance_of(q[1])) end
  return 0
end

-- The lease of the slot was given back: hand it to the live head of the queue (dead
-- heads pruned) and push the grant to the head's process, which starts its work on the
-- message, without a claim. The grant is visible to the head's claim and renewal too
-- (they answer 'owner'), so a lost message costs a round trip, not the grant; a grant
-- to an entry its process withdrew meanwhile is freed by that withdrawal.
-- With free set, the caller knows that the lease is free (it has just read or deleted it).
local function hand_over(slot, free)
  if not free and redis.call('EXISTS', P .. 'lease:' .. slot) == 1 then return end
  local q = prune(slot)
  local e = q[1]
  if not e then return end
  -- granted first: a grant that fails (the slot's fence key of foreign data, which
  -- SET ... GET refuses before it writes) leaves e queued, not out of its queue
  local token, t, ttl = grant(slot, e)
  redis.call('LPOP', P .. 'q:' .. slot)
  room(slot)
  local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl)
  tell(instance_of(e), {'grant', slot, e, token, string.format('%.0f', expiry)})
end
"""

_SUBMIT: Final = r"""
-- submit: place entry e of this process in the slot.
-- keys:    lease:<slot> fence:<slot> q:<slot> gone:<e> jn:<target> watch:<slot> (hb:* read)
-- args:    slot, e, policy (an AdmissionPolicy value), max_queue, watch ('1': tell room)
-- replies: {'owner', token, displaced|false}      the lease is e's
--          {'queued', holder|false, retry_ms, displaced|false}
--          {'busy', holder|false, retry_ms}       drop_if_running on a busy slot
--          {'full', holder|false, retry_ms}       the queue holds max_queue live entries
--          {'joined', target, holder|false, retry_ms}
--          {'gone', reason}                       e was withdrawn before it got here
local slot, e, policy, max_queue, watch = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8]
local me = instance_of(e)
local lk, qk = P .. 'lease:' .. slot, P .. 'q:' .. slot
local holder, token, stop = lease_of(slot)
if holder == e then return {'owner', token, false} end
local gone = redis.call('GET', P .. 'gone:' .. e)
if gone then return {'gone', gone} end
local q = prune(slot)
local hi = holder and instance_of(holder)
if position(q, e) then return {'queued', hi, retry_ms(slot, q, holder), false} end
if not holder and #q == 0 then return {'owner', grant(slot, e), false} end
if not holder and policy ~= 'replace' then
  -- The lease is free while the queue is not: its head's claim is due (the lease
  -- expired), or never comes (a failover lost the hand-over, and the head's process
  -- no longer knows its entry): hand it over now, as a release would.
  hand_over(slot, true)
  holder, token, stop = lease_of(slot)
  table.remove(q, 1)
  hi = instance_of(holder)
end
if policy == 'drop_if_running' then return {'busy', hi, retry_ms(slot, q, holder)} end
if policy == 'join' then
  local target = q[#q] or holder
  local jk = P .. 'jn:' .. target
  redis.call('SADD', jk, me)
  last_at_least(jk, KEEP)
  return {'joined', target, hi, retry_ms(slot, q, holder)}
end
if policy == 'queue' then
  if #q >= max_queue then
    if watch == '1' then
      local wk = P .. 'watch:' .. slot
      redis.call('SADD', wk, me)
      last_at_least(wk, TTL)
    end
    return {'full', hi, retry_ms(slot, q, holder)}
  end
  redis.call('RPUSH', qk, e)
  return {'queued', hi, retry_ms(slot, q, holder), false}
end
-- replace: stop the owner (once), then become the head
if holder and not stop then
  redis.call('HSET', lk, 'stop', me)
  tell(hi, {'stop', slot, holder, me})
end
local displaced = q[1] or false
if displaced then
  redis.call('SET', P .. 'gone:' .. displaced, 'superseded', 'PX', KEEP)
  tell(instance_of(displaced), {'superseded', slot, displaced})
  done(displaced)
end
if not holder then
  -- the lease is free while the queue is not (it expired, or a head's claim never
  -- came): take it over
  local t = grant(slot, e)  -- (before the LPOP: as in hand_over)
  redis.call('LPOP', qk)
  room(slot)
  return {'owner', t, displaced}
end
if displaced then redis.call('LSET', qk, 0, e) else redis.call('LPUSH', qk, e) end
return {'queued', hi, retry_ms(slot, {e}, holder), displaced}
"""

_CLAIM: Final = r"""
-- claim: the live head e of the slot's queue takes the free lease (or confirms a grant).
-- keys:    lease:<slot> fence:<slot> q:<slot> gone:<e> jn:<e> watch:<slot> (hb:* read)
-- args:    slot, e
-- replies: {'owner', token} | {'gone', reason} | {'missing'} (not in the queue: renew
--          puts it back) | {'wait', retry_ms} (not the head, or the lease is held) |
--          {'foreign', what} (refused: the grant met foreign data at the slot's fence
--          key; what = the key, after P, and the server's error)
-- A head whose grant fails so is refused, and leaves its queue for good (marked gone,
-- as a withdrawal does): it would be refused so again at each of its renewals, which
-- find it claimable, its waiter never answered. A hand-over's grant fails the call
-- instead, leaving the head queued: its own claim refuses it.
local slot, e = ARGV[4], ARGV[5]
local holder, token = lease_of(slot)
if holder == e then
  -- granted already (pushed, or a reply lost): the lease runs on from this claim
  redis.call('PEXPIRE', P .. 'lease:' .. slot, TTL)
  return {'owner', token}
end
local gone = redis.call('GET', P .. 'gone:' .. e)
if gone then return {'gone', gone} end
local q = prune(slot)
if not position(q, e) then return {'missing'} end
if not holder and q[1] ~= e then
  hand_over(slot, true)  -- the head's claim is due, or never comes: as in submit
  return {'wait', retry_ms(slot, q, true)}
end
if holder or q[1] ~= e then return {'wait', retry_ms(slot, q, holder)} end
local t, what = grant(slot, e, true)  -- (before the LPOP: as in hand_over)
if not t then
  redis.call('SET', P .. 'gone:' .. e, 'store_unavailable', 'NX', 'PX', KEEP)
  redis.call('LPOP', P .. 'q:' .. slot)
  room(slot)
  done(e)
  return {'foreign', what}
end
redis.call('LPOP', P .. 'q:' .. slot)
room(slot)
return {'owner', t}
"""

_RELEASE: Final = r"""
-- release: the owner e exited; give its lease back, to the next live head if any.
-- keys:    lease:<slot> out:<e> jn:<e> q:<slot> fence:<slot> watch:<slot> (hb:* read)
-- args:    slot, e, outcome (JSON, or '' when nobody is known to follow e)
-- replies: 'ok' | 'need_outcome' (another process follows e: store its outcome) |
--          {'foreign', what, 'ok' | 'need_outcome'} (the lease refused: its key holds
--          foreign data; what = the key, after P, and the server's error)
-- A lease key of foreign data refuses the lease part only (as e's renewal refuses the
-- lease: nothing to give back or hand over), and the outcome part is done as always,
-- so that e's joiners hear of it now, not at their next renewal.
local slot, e, outcome = ARGV[4], ARGV[5], ARGV[6]
local lk = P .. 'lease:' .. slot
local holder, foreign = redis.pcall('HGET', lk, 'entry'), false
if type(holder) == 'table' then holder, foreign = false, wrongtype('lease:' .. slot, holder) end
if holder == e then redis.call('DEL', lk) end
local reply = 'ok'
local outk = P .. 'out:' .. e
if outcome ~= '' then
  redis.call('SET', outk, outcome, 'PX', KEEP)
  done(e)
elseif redis.call('EXISTS', P .. 'jn:' .. e) == 1 then
  local stored = redis.call('GET', outk)
  if not stored then redis.call('SET', outk, 'pending', 'PX', KEEP); stored = 'pending' end
  if stored == 'pending' then reply = 'need_outcome' end
end
if foreign then return {'foreign', foreign, reply} end
if not holder or holder == e then hand_over(slot, true) end
return reply
"""

_STORE_OUTCOME: Final = r"""
-- store_outcome: keep e's outcome for the joiners of other processes.
-- keys:    out:<e> jn:<e>
-- args:    e, outcome (JSON)
-- replies: 'ok' (a joiners key of foreign data read as none: done)
local e, outcome = ARGV[4], ARGV[5]
redis.call('SET', P .. 'out:' .. e, outcome, 'PX', KEEP)
done(e)
return 'ok'
"""

_WITHDRAW: Final = r"""
-- withdraw: e leaves for good (queue entry or lease); its marker refuses it later.
-- keys:    gone:<e> q:<slot> lease:<slot> jn:<e> watch:<slot> fence:<slot> (hb:* read)
-- args:    slot, e, reason (a RejectionKind value)
-- replies: 'ok'
-- The slot's lease or queue key of foreign data is read as none (named in unowned): e
-- cannot hold such a lease nor wait in such a queue, and failing, the call left e in
-- the queue while its process lived (a renewal that refuses e for such a key withdraws
-- it). No lease is handed over then: one of foreign data is not free, and a queue of
-- it has no head.
local slot, e, reason = ARGV[4], ARGV[5], ARGV[6]
local lk = P .. 'lease:' .. slot
redis.call('SET', P .. 'gone:' .. e, reason, 'NX', 'PX', KEEP)
local removed = unowned_read('LREM', 'q:' .. slot, 0, e)
if removed and removed > 0 then room(slot) end
local holder = unowned_read('HGET', 'lease:' .. slot, 'entry')
local held = holder == e
if held then redis.call('DEL', lk) end
done(e)
-- also when this call found nothing of e's: a try of it that failed before its
-- hand-over (the keeper sends it again) left the lease free, as a release's does
if removed and holder ~= nil then hand_over(slot, held) end
return 'ok'
"""

_STOP_OWNER: Final = r"""
-- stop_owner: ask the lease holder's process to stop its owner (once per lease).
-- keys:    lease:<slot>
-- args:    slot, me (the requesting instance)
-- replies: false (no lease) | {holder instance, token}
local slot, me = ARGV[4], ARGV[5]
local holder, token, stop = lease_of(slot)
if not holder then return false end
if not stop then
  redis.call('HSET', P .. 'lease:' .. slot, 'stop', me)
  tell(instance_of(holder), {'stop', slot, holder, me})
end
return {instance_of(holder), token}
"""

_RENEW: Final = r"""
-- renew: this process's heartbeat, its leases, queued and followed entries.
-- keys:    hb:<me> lease:<slot> q:<slot> gone:<e> out:<e> jn:<e> (per pair), watch:<slot>
--          (hb:* read)
-- args:    me, JSON [[slot, e, ...] leases, [slot, e, ...] queued, [slot, e, ...] followed]
-- replies: JSON [leases, entries, follows(, unowned)], one item per pair sent, in order
--          (unowned, only when not empty: what, for each key of foreign data read as
--          none, below); leases and entries sparse, as [count, [[k, item], ...]]: the
--          k-th (from 1) is item, every other one the part's common item ('' for a
--          lease, ['queued', 0] for an entry: encoding thousands of them cost the
--          server more than the rest of its renewal did):
--          lease:    stop requester ('' for none) | null (refused: lost) |
--                    ['foreign', what] (refused: a slot key of another type)
--          entry:    ['owner', token] | ['gone', reason] | ['queued', 0|1] |
--                    ['resubmitted', 0|1] (1: claimable now) | ['foreign', what]
--          follow:   ['out', outcome] | ['gone', reason] | ['live'] | ['lost'] |
--                    ['foreign', what] (the entry, or this follow, refused) |
--                    ['foreign_lease', what] (the entry held the slot's lease,
--                    refused: its owner loses it)
-- Foreign data (a key of another type than these scripts write: a slot's lease or
-- queue key, an entry's gone, out or jn key) refuses the items that read it only:
-- what = the key (after P) and the server's error. A follow answers as its entry's
-- own renewal does: an entry whose slot's key holds foreign data is refused there.
-- Foreign data that no item owns is read as none and named in unowned: another
-- process's heartbeat key (that process counts as gone: its queued entries are pruned,
-- its followed ones lost; its own next renewal writes the key anew), a slot's watch key
-- when a prune tells the watchers (nobody is told: they learn at their own renewal).
local me, parts = ARGV[4], cjson.decode(ARGV[5])
unowned = {}
local expired = redis.call('EXISTS', P .. 'hb:' .. me) == 0
redis.call('SET', P .. 'hb:' .. me, TTL, 'PX', TTL)
hb_memo[me] = TTL

-- Nothing below changes a lease's fields: read each slot's lease once.
local lease_memo = {}
local function lease_here(slot)
  local v = lease_memo[slot]
  if not v then
    v = redis.pcall('HMGET', P .. 'lease:' .. slot, 'entry', 'token', 'stop')
    if v.err then
      v = {false, false, false, {'foreign', wrongtype('lease:' .. slot, v)}}
    end
    lease_memo[slot] = v
  end
  return v[1], v[2], v[3], v[4]
end

-- e's place in the slot's queue (false: not in it), or false and the foreign item
local function queued_at(slot, e)
  local at = redis.pcall('LPOS', P .. 'q:' .. slot, e)
  if type(at) == 'table' then return false, {'foreign', wrongtype('q:' .. slot, at)} end
  return at
end

-- e's gone marker (false: none), or false and the foreign item
local function gone_of(e)
  local r = redis.pcall('GET', P .. 'gone:' .. e)
  if type(r) == 'table' then return false, {'foreign', wrongtype('gone:' .. e, r)} end
  return r
end

local leases, flat = {}, parts[1]  -- (sparse: the leases renewed without a stop left out)
for k = 1, #flat, 2 do
  local slot, e = flat[k], flat[k + 1]
  local holder, _, stop, foreign = lease_here(slot)
  if holder == e then
    redis.call('PEXPIRE', P .. 'lease:' .. slot, TTL)
    if stop then leases[#leases + 1] = {(k + 1) / 2, stop} end
  else
    leases[#leases + 1] = {(k + 1) / 2, foreign or cjson.null}
  end
end
leases = {#flat / 2, leases}

local queues = {}  -- slot -> {q = live entries, at = entry -> position} | {foreign = item}
local function queue_of(slot)
  local m = queues[slot]
  if not m then
    local kind = redis.call('TYPE', P .. 'q:' .. slot).ok
    if kind ~= 'list' and kind ~= 'none' then
      m = {foreign = {'foreign', 'q:' .. slot .. ': a ' .. kind .. ', not a list'}}
      queues[slot] = m
      return m
    end
    local q = prune(slot)
    local at = {}
    for k, x in ipairs(q) do at[x] = k end
    m = {q = q, at = at}
    queues[slot] = m
  end
  return m
end

local QUEUED_BEHIND, entries = {'queued', 0}, {}  -- (sparse: ['queued', 0] left out)
flat = parts[2]
for k = 1, #flat, 2 do
  local slot, e = flat[k], flat[k + 1]
  local holder, token, _, foreign = lease_here(slot)
  local behind
  if holder and holder ~= e and not expired then behind, foreign = queued_at(slot, e) end
  local item
  if foreign then
    item = foreign
  elseif holder == e then
    -- a claim whose reply was lost: keep the lease alive until the owner learns of it
    redis.call('PEXPIRE', P .. 'lease:' .. slot, TTL)
    item = {'owner', token}
  elseif behind then
    -- behind a holder: not claimable, so no prune (the other scripts prune, and held
    -- work asks again at each renewal); queued, so live (not gone, and we are alive)
    item = QUEUED_BEHIND
  elseif queue_of(slot).foreign then
    item = queue_of(slot).foreign
  else
    local m = queue_of(slot)
    local at = m.at[e]  -- a live entry of the queue: not gone
    local gone = false
    if not at then gone, foreign = gone_of(e) end
    if foreign then
      item = foreign
    elseif gone then
      item = {'gone', gone}
    elseif at and not expired then
      item = {'queued', (not holder and at == 1) and 1 or 0}
    else
      -- lost with server data, or this process's heartbeat expired meanwhile (its
      -- entry pruned, or not yet): back at the tail, a new acceptance (FIFO order does
      -- not survive lost data)
      if at then
        redis.call('LREM', P .. 'q:' .. slot, 0, e)
        table.remove(m.q, at)
        m.at = {}
        for j, x in ipairs(m.q) do m.at[x] = j end
      end
      redis.call('RPUSH', P .. 'q:' .. slot, e)
      m.q[#m.q + 1] = e
      m.at[e] = #m.q
      item = {'resubmitted', (not holder and m.q[1] == e) and 1 or 0}
    end
  end
  if item[1] ~= 'queued' or item[2] ~= 0 then entries[#entries + 1] = {(k + 1) / 2, item} end
end
entries = {#flat / 2, entries}

-- what e's own renewal finds of it (e's process is alive): {'live'}, or the item of
-- foreign data at its slot's keys that refuses it there, or {'lost'}
local function followed(slot, e)
  local holder, _, _, foreign = lease_here(slot)
  if holder == e then return {'live'} end
  local at, queue_foreign = queued_at(slot, e)
  -- queued: its process refuses the entry if the slot's lease key is foreign data
  if at then return foreign or {'live'} end
  if queue_foreign then return foreign or queue_foreign end
  -- neither queued nor the holder: it held the lease (its owner loses it) or is lost
  if foreign then return {'foreign_lease', foreign[2]} end
  return {'lost'}
end

local follows = {}
flat = parts[3]
for k = 1, #flat, 2 do
  local slot, e = flat[k], flat[k + 1]
  local jk = P .. 'jn:' .. e
  local item
  local r = redis.pcall('SADD', jk, me)
  if type(r) == 'table' then
    item = {'foreign', wrongtype('jn:' .. e, r)}
  else
    last_at_least(jk, KEEP)
    local out = redis.pcall('GET', P .. 'out:' .. e)
    if type(out) == 'table' then
      item = {'foreign', wrongtype('out:' .. e, out)}
    elseif out and out ~= 'pending' then
      item = {'out', out}
    else
      local gone, foreign = gone_of(e)
      if foreign then
        item = foreign
      elseif gone then
        item = {'gone', gone}
      elseif not alive(instance_of(e)) then
        item = {'lost'}
      elseif out then
        item = {'live'}  -- released: its outcome is on its way
      else
        item = followed(slot, e)
      end
    end
  end
  follows[#follows + 1] = item
end
if #unowned > 0 then return cjson.encode({leases, entries, follows, unowned}) end
return cjson.encode({leases, entries, follows})
"""

_CLUSTER_SLOT: Final = r"""
-- cluster_slot: what the server holds for one slot.
-- keys:    lease:<slot> q:<slot> (hb:* read)
-- args:    slot
-- replies: {holder|false, token|false, lease_pttl_ms|false, live queue entries}
local slot = ARGV[4]
local holder, token = lease_of(slot)
local n = 0
for _, e in ipairs(redis.call('LRANGE', P .. 'q:' .. slot, 0, -1)) do
  if live(e) then n = n + 1 end
end
if not holder then return {false, false, false, n} end
return {instance_of(holder), token, redis.call('PTTL', P .. 'lease:' .. slot), n}
"""


# -- limit pools across the cluster ---------------------------------------------------------
#
# Data model (prefix ``P`` as above; a *pool id* is the limit's name, or ``"<name> <key>"``
# for a keyed pool: a name holds no whitespace; a *request* ``w`` is
# ``"<instance_id>/<n>"``, one acquisition of one attempt or block, unique per process):
#
# ======================  ======  ===========================================  ===========
# key                     type    content                                      expiry
# ======================  ======  ===========================================  ===========
# ``P lp:<pool>``         hash    ``spec``; ``tat``, ``start``, ``n`` (ms)       see below
# ``P lh:<pool>``         hash    holders: request -> its instance's generation  live
# ``P lq:<pool>``         zset    groups waiting in the pool, scored by head     live
# ``P lk:<pool>``         zset    groups parked on the pool, scored by head      live
# ``P lg:<group>``        zset    a group's waiters, scored by acceptance        live
# ``P lw:<w>``            hash    a waiter: ``pools`` (JSON), ``gen``, ``seq``    live
# ``P lx:<w>``            string  the generation it was granted in, or ``gone``  keep
# ``P lu:<instance>``     string  the instance's generation (its units' lease)   lease_ttl
# ``P lseq``              string  the last acceptance number                     live
# ``P lttl``              string  the longest lease_ttl in use, in ms             2 * value
# ======================  ======  ===========================================  ===========
#
# Units and waiters are leased with their instance: each carries the *generation* of
# ``lu:<instance>`` at the time it was accepted, and is live while that key still holds
# that generation. The key is renewed by ``limit_renew`` (in the renewal's round trip);
# once it expired, a new one gets a new generation (the server's ``TIME``), so a dead
# instance's units never come back (nor a grant its process heard of only after that:
# such a request is asked for anew). After a change of server, ``limit_renew``'s rebase
# moves the units the process holds to a new generation (see the script). Dead holders
# are removed when a script reads a pool, dead waiters when a settle meets them at the
# head of their group. A pool's settings stay while it has a live holder or waiter, and
# a rate pool's while its ``tat`` is ahead of the server's clock (``lp`` then expires at
# ``tat``; its GCRA state, ms, is ``start`` and ``n``: see the module's docstring).
# Every script that frees units, or first reads a pool, grants the oldest waiters of the
# changed pools that fit (``settle``) and publishes ``["limit", w, gen]`` to their
# instances.
#
# A settle reads only the groups *parked* on the changed pools (below): a group is parked
# on one of its pools that had no room when it was last checked. So the order rule is
# exactly: the oldest waiter whose every pool has room *as the scripts have seen it*.
# Room that a release or a withdrawal makes is seen at once. Room that a rate pool's
# clock or an expired holder makes is seen when a script next settles that pool: an
# acquisition in it, a waiter's retry (the reply says when a rate pool allows a start),
# or the renewal of a waiter in it (each renewal settles its waiters' pools, every
# ``lease_ttl / 3``); until then a younger waiter may be granted another pool the group
# needs. New settings never unblock a live waiter: a pool keeps its settings while one
# waits in it.
#
# A *group* is a set of pools some requests wait for all at once; its id is the JSON list
# of its pool ids, sorted. ``live`` is twice the longest ``lease_ttl`` in use from the last
# write or renewal (``limit_renew`` renews the keys of the pools its instance holds units
# of, and of its waiters): longer than the lease of every instance a key counts for, so
# nothing an unused namespace held stays behind. Replicas may run with different
# ``lease_ttl`` (a rolling change of it): ``P lttl`` (a string, ms, expiring at twice its
# value) holds the longest, said by every acquisition that brings a longer one and by
# the renewals of the instances that run with it. (A key renewed for the caller's
# ``lease_ttl`` alone would expire between the renewals of an instance with one more
# than six times as long, its units with it: a pool then held more than its capacity.)
# The acceptance number is the server's clock in microseconds, or the last number + 1
# if that is not above it, so an expired counter never restarts the order.

_LIMITS: Final = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local NOW = now_ms()
local function num(x) return string.format('%.17g', x) end
-- The longest wait or expiry a reply or a PEXPIRE carries, in ms (about 31.7 years): a
-- rate pool's next start may lie further away (``per`` is any finite number), but cjson
-- prints numbers from 1e14 with an exponent, and redis.call's from 1e17.
local FAR = 1e12
-- Every key below but lx, lu and lttl expires LIVE after its last write or renewal:
-- twice the lease of any instance it counts for (the longest in use, lttl), so a live
-- holder's or waiter's keys never expire before its instance's units do, and a
-- namespace nobody uses leaves nothing behind.
local MY_TTL = tonumber(TTL)
local LONGEST = redis.pcall('GET', P .. 'lttl')
-- (a value no script wrote, foreign data of any type, counts as none: the next say_ttl
-- replaces it)
LONGEST = type(LONGEST) == 'string' and tonumber(LONGEST) or 0
if not (LONGEST > 0 and LONGEST < FAR) then LONGEST = 0 end
local LIVE = 2 * math.max(MY_TTL, LONGEST)
-- Say this instance's lease TTL when it is the longest in use (when it equals the
-- longest, only from a renewal: those keep the key alive while their instance lives).
local said = false
local function say_ttl(renewal)
  if not said and (MY_TTL > LONGEST or (renewal and MY_TTL == LONGEST)) then
    redis.call('SET', P .. 'lttl', TTL, 'PX', 2 * MY_TTL)
    said = true
  end
end

local gen_memo = {}
-- the generation of an instance's units (false: none, its units are dead; nil for no
-- instance, a request or waiter no script wrote: equal to no generation read)
local function gen_of(i)
  if not i then return nil end
  local g = gen_memo[i]
  if g == nil then
    g = unowned_read('GET', 'lu:' .. i) or false  -- (foreign data, in limit_renew: none)
    gen_memo[i] = g
  end
  return g
end

-- this instance's generation, made when it has none; its lease renewed
local function my_gen(me)
  local g = gen_of(me)
  if not g then
    local t = redis.call('TIME')
    g = t[1] .. string.format('%06d', tonumber(t[2]))
    gen_memo[me] = g
  end
  redis.call('SET', P .. 'lu:' .. me, g, 'PX', TTL)
  say_ttl(false)
  return g
end

-- A rate pool's GCRA state is ``start`` (ms) and ``n``: its tat is start + n * interval,
-- counted from the start of its busy stretch, never summed (see the module's docstring).
-- Its fields ``start`` and ``n`` count while ``tat`` is the one they make (this version
-- writes all three); a ``tat`` alone, or one that no longer matches them (written by an
-- earlier version, which reads and writes ``tat`` only), is read as start = tat, n = 0;
-- no ``tat``, as a pool never used. A ``tat`` that is no finite number (no script wrote
-- it) is foreign data, read where ``pool`` reads the state.
local function finite(x) return x ~= nil and x > -math.huge and x < math.huge end

local function gcra_state(tat, start, n, interval)
  tat = tonumber(tat)
  if not tat then return -math.huge, 0 end
  start, n = tonumber(start), tonumber(n)
  if start and n and start + n * interval == tat then return start, n end
  return tat, 0
end

local function gcra_fields(start, n, interval)
  return 'tat', num(start + n * interval), 'start', num(start), 'n', num(n)
end

-- A rate pool's tat is never more than a full burst ahead of the clock that set it: one
-- further ahead tells of a server clock that stepped back (a failover to a node whose
-- clock is behind, a clock set back), which would hold every start back by the step.
-- It is set to now plus a full burst, as if a burst was just spent, and written so (1 ms
-- of slack for rounding). The fast path of limit_acquire needs no such check: a tat that
-- far ahead has no room, and sends it here.
local function capped(start, n, now, burst, interval)
  if start + n * interval > now + burst * interval + 1 then return now, burst end
  return start, n
end

-- a rate spec's interval (ms) and burst (nothing for another spec, nor for one that
-- spec_text does not write: its numbers are checked where they are parsed)
local function rate_of(spec)
  local rate, per, burst = string.match(spec, '^rate ([1-9]%d*) per (%S+) burst ([1-9]%d*)$')
  per = rate and tonumber(per)
  if not per then return end
  -- (divided first: a per near the largest float times 1000 would be infinite)
  local interval = per / tonumber(rate) * 1000
  if interval > 0 and interval < math.huge then return interval, tonumber(burst) end
end

local pools = {}  -- pool id -> state, read once per script
-- In limit_renew, a pool whose settings or holders key holds foreign data reads as one
-- without settings (no room; nothing is written to it), the key named in unowned. So
-- does one whose holders hold a field that is no request (no '/': foreign data of the
-- right type, which no script wrote), or whose settings are none that a script writes
-- (spec_text's: a Lua error on each read, before), or whose tat is no finite number (a
-- PEXPIRE of NaN failed the script, before), where the key is not the call's own
-- (read_foreign names it; at its own, the script fails naming it, as a key of another
-- type does). The dead holders met before such a field are removed, as always.
local function pool(pid)
  local p = pools[pid]
  if p then return p end
  local v = unowned_read('HMGET', 'lp:' .. pid, 'spec', 'tat', 'start', 'n') or {}
  p = {pid = pid, spec = v[1], start = -math.huge, n = 0, held = 0, touched = false}
  pools[pid] = p  -- (before read_foreign may fail: read once, as a pool without room)
  local cap = p.spec and string.match(p.spec, '^concurrency ([1-9]%d*)$')
  if p.spec and not cap then p.interval, p.burst = rate_of(p.spec) end
  if p.spec and not cap and not p.interval then
    p.spec = false
    read_foreign('lp:' .. pid, 'lp:' .. pid .. ": settings that are no pool's")
  end
  if p.spec then
    local flat = cap and unowned_read('HGETALL', 'lh:' .. pid)
    if cap and not flat then
      p.spec = false
    elseif cap then
      p.cap = tonumber(cap)
      local hk = P .. 'lh:' .. pid
      for k = 1, #flat, 2 do
        local i = instance_of(flat[k])
        if not i then
          p.spec, p.cap, p.held = false, nil, 0
          read_foreign('lh:' .. pid, 'lh:' .. pid .. ': a holder that is no request')
          break
        end
        if gen_of(i) == flat[k + 1] then
          p.held = p.held + 1
        else
          redis.call('HDEL', hk, flat[k])
        end
      end
    elseif v[2] and not finite(tonumber(v[2])) then
      p.spec, p.interval = false, nil
      read_foreign('lp:' .. pid, 'lp:' .. pid .. ': a tat that is no finite number')
    else
      p.start, p.n = gcra_state(v[2], v[3], v[4], p.interval)
      local start, n = capped(p.start, p.n, NOW, p.burst, p.interval)
      if start ~= p.start or n ~= p.n then
        p.start, p.n, p.touched = start, n, true  -- tidy sets its key's expiry
        redis.call('HSET', P .. 'lp:' .. pid, gcra_fields(start, n, p.interval))
      end
    end
  end
  return p
end

-- set a new pool's settings (spec is as the client sent it)
local function settle_spec(p, spec)
  p.spec, p.cap, p.interval, p.start, p.n, p.touched = spec, nil, nil, -math.huge, 0, true
  redis.call('HDEL', P .. 'lp:' .. p.pid, 'tat', 'start', 'n')
  local cap = string.match(spec, '^concurrency (%d+)$')
  if cap then p.cap = tonumber(cap); return end
  p.interval, p.burst = rate_of(spec)
end

-- milliseconds until the pool has room (0: now; false: only a release can give it)
local function room_in(p)
  if p.cap then
    if p.held < p.cap then return 0 end
    return false
  end
  -- (NOW - start is exact while both are near the clock, within a factor of two)
  local due, past = (p.n - p.burst + 1) * p.interval, NOW - p.start
  if past >= due then return 0 end
  return due - past
end

-- ms until a rate pool's tat passes (<= 0: passed, the pool is as a new one)
local function ahead_ms(p)
  if not p.interval then return -math.huge end
  return p.n * p.interval - (NOW - p.start)
end

local function has_room(p) return p.spec ~= nil and p.spec ~= false and room_in(p) == 0 end

local function take(p, w, g)
  p.touched = true
  if p.cap then
    p.held = p.held + 1
    redis.call('HSET', P .. 'lh:' .. p.pid, w, g)
    redis.call('PEXPIRE', P .. 'lh:' .. p.pid, LIVE)
  else
    if NOW - p.start < p.n * p.interval then
      p.n = p.n + 1  -- tat has not passed: it moves on by one interval
    else
      p.start, p.n = NOW, 1  -- a new busy stretch: tat = NOW + interval
    end
    redis.call('HSET', P .. 'lp:' .. p.pid, gcra_fields(p.start, p.n, p.interval))
  end
end

-- Waiters are indexed by their *group*, the set of pools they wait for: ``lg:<group>``
-- holds a group's waiters in acceptance order, and ``lq:<pool>`` the groups that include
-- the pool, each scored by its head's acceptance number (who waits in a pool). Within a
-- group only the head can be the oldest waiter that fits (its members need the same
-- pools). A group is also *parked* on one of its pools, ``lk:<pool>``, scored by its
-- head: one that had no room when the group was last checked. A change of a pool's room
-- reads the groups parked on it, in their heads' order; a group found blocked by
-- another pool is parked there instead, so each check moves a group on, and a release
-- reads the groups the freed pool may unblock, not every group that includes it.

-- The instance of w, a waiter of group gid; nil for one that names no request (no '/':
-- foreign data of the right type, which no script wrote), named in unowned. It counts
-- as a waiter of a dead instance, in every script and group, the call's own too (a
-- settle that meets it drops it): it holds no units, so no room depends on it, as a
-- pool's does on a holder's.
local function waiter_instance(gid, w)
  local i = instance_of(w)
  if not i and unowned then
    unowned[#unowned + 1] = 'lg:' .. gid .. ': a waiter that is no request'
  end
  return i
end

local group_memo = {}  -- group id -> its pool ids
-- a pool set's group id (its pool ids sorted, as JSON) and its pool ids
local function group_of(pids)
  local sorted = {}
  for k, pid in ipairs(pids) do sorted[k] = pid end
  table.sort(sorted)
  local gid = cjson.encode(sorted)
  group_memo[gid] = sorted
  return gid, sorted
end

-- The pool ids of a JSON list of them (a group id, a waiter's pools field), or nil for
-- a value that is none (no script wrote it: not JSON, not a list of strings, empty)
local function pool_list(json)
  local ok, v = pcall(cjson.decode, json)
  if not ok or type(v) ~= 'table' or #v == 0 then return nil end
  for k, pid in pairs(v) do
    if type(k) ~= 'number' or type(pid) ~= 'string' then return nil end
  end
  return v
end

-- A group's pool ids; nil for a group id that is no list of pools (foreign data of the
-- right type, which no script wrote: a Lua error, or a settle that never ended, before)
-- met at key (after P), which read_foreign names (or fails on, at the call's own)
local function pools_of_group(gid, key)
  local spids = group_memo[gid]
  if spids == nil then
    spids = pool_list(gid) or false
    group_memo[gid] = spids
  end
  if spids then return spids end
  read_foreign(key, key .. ': a group that is no list of pools')
  return nil
end

-- w's pools (its pools field, JSON) when they are those of its group gid; else nil,
-- named by read_foreign as its key's foreign data (or failing, at the call's own): a
-- Lua error before, or units of pools the settle never checked
local function waiter_pools(w, json, gid)
  local pids = pool_list(json)
  if pids and group_of(pids) == gid then return pids end
  read_foreign('lw:' .. w, 'lw:' .. w .. ": pools that are not its group's")
  return nil
end

-- score the group by its head in each pool's index and where it is parked, or take it
-- out of both when it is empty
-- (in limit_renew, a group whose key holds foreign data counts as empty, and an index
-- key of foreign data is left as it is: both named in unowned)
local function rehead(gid, spids)
  local h = unowned_read('ZRANGE', 'lg:' .. gid, 0, 0, 'WITHSCORES') or {}
  for _, pid in ipairs(spids) do
    local q, k = 'lq:' .. pid, 'lk:' .. pid
    if h[1] then
      if unowned_read('ZADD', q, h[2], gid) then redis.call('PEXPIRE', P .. q, LIVE) end
      unowned_read('ZADD', k, 'XX', h[2], gid)
    else
      unowned_read('ZREM', q, gid)
      unowned_read('ZREM', k, gid)
    end
  end
  return h
end

-- whether it was parked (not in limit_renew when the pool's key holds foreign data)
local function park(gid, pid, score)
  if not unowned_read('ZADD', 'lk:' .. pid, score, gid) then return false end
  redis.call('PEXPIRE', P .. 'lk:' .. pid, LIVE)
  return true
end

-- the first of a group's pools without room (nil: every one has room)
local function blocker(spids)
  for _, pid in ipairs(spids) do
    if not has_room(pool(pid)) then return pid end
  end
  return nil
end

local function drop_waiter(w, pids)
  local gid, spids = group_of(pids)
  if unowned_read('ZREM', 'lg:' .. gid, w) == 1 then rehead(gid, spids) end
  redis.call('DEL', P .. 'lw:' .. w)
end

-- the next acceptance number: above the last one, and above any earlier one even after
-- the counter expired (the server's clock in microseconds is its floor)
local function next_seq()
  local t = redis.call('TIME')
  local seq = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(unowned_read('GET', 'lseq') or false)
  if last and last >= seq then seq = last + 1 end
  redis.call('SET', P .. 'lseq', num(seq), 'PX', LIVE)
  return seq
end

local function add_waiter(w, pids, g)
  local seq = next_seq()
  local wk = P .. 'lw:' .. w
  redis.call('HSET', wk, 'pools', cjson.encode(pids), 'gen', g, 'seq', num(seq))
  redis.call('PEXPIRE', wk, LIVE)
  local gid, spids = group_of(pids)
  redis.call('ZADD', P .. 'lg:' .. gid, num(seq), w)
  redis.call('PEXPIRE', P .. 'lg:' .. gid, LIVE)
  -- (re)parked on the pool without room that has the fewest groups parked (the first of
  -- those in the group's order): a tenant's own pool rather than a shared one
  local head, best, fewest = rehead(gid, spids), nil, nil
  for _, pid in ipairs(spids) do
    local kk = P .. 'lk:' .. pid
    redis.call('ZREM', kk, gid)
    if not has_room(pool(pid)) then
      local n = redis.call('ZCARD', kk)
      if not fewest or n < fewest then best, fewest = pid, n end
    end
  end
  park(gid, best or spids[1], head[2])
end

-- a waiter's renewal: its keys live on
local function keep_waiter(w, pids)
  local gid, spids = group_of(pids)
  redis.call('PEXPIRE', P .. 'lw:' .. w, LIVE)
  redis.call('PEXPIRE', P .. 'lg:' .. gid, LIVE)
  for _, pid in ipairs(spids) do
    redis.call('PEXPIRE', P .. 'lq:' .. pid, LIVE)
    redis.call('PEXPIRE', P .. 'lk:' .. pid, LIVE)
  end
end

-- the oldest group parked on a pool (that has room) whose head is older than ``before``
-- and whose every pool has room (its id and head's number), or nil; groups are read in
-- their heads' order, a few at a time, and one blocked by another pool is parked there
local function oldest_fitting(pid, before)
  local kk = P .. 'lk:' .. pid
  local from = 0  -- (limit_renew) the groups left here: their blocker's key is foreign
  while true do
    local r = unowned_read('ZRANGE', 'lk:' .. pid, from, from + 31, 'WITHSCORES') or {}
    if not r[1] then return nil end
    for j = 1, #r, 2 do
      local seq = tonumber(r[j + 1])
      if before and seq >= before then return nil end
      local spids = pools_of_group(r[j], 'lk:' .. pid)
      local q = spids and blocker(spids)
      if spids and not q then return r[j], seq end
      if q == pid then return nil end  -- only a pool with room is read: never
      -- (a group that is no list of pools, read as none: left as it is)
      if q and park(r[j], q, r[j + 1]) then redis.call('ZREM', kk, r[j]) else from = from + 1 end
    end
  end
end

-- grant w its units in every pool of pids; tell its instance
local function grant(w, pids, g)
  for _, pid in ipairs(pids) do take(pool(pid), w, g) end
  redis.call('SET', P .. 'lx:' .. w, g, 'PX', KEEP)
  return g
end

-- grant, oldest first, the live waiters of the changed pools whose every pool has room:
-- the oldest head that fits among the groups parked on the changed pools that have room,
-- again while one fits (a group parked on another pool waits for that pool's room); a
-- dead instance's waiter met at a head is removed for good
local function settle(changed)
  while true do
    local best, best_seq
    for _, pid in ipairs(changed) do
      if has_room(pool(pid)) then
        local gid, seq = oldest_fitting(pid, best_seq)
        if gid then best, best_seq = gid, seq end
      end
    end
    if not best then return end
    local spids = pools_of_group(best)  -- (a list of pools: oldest_fitting read it)
    local head = (unowned_read('ZRANGE', 'lg:' .. best, 0, 0) or {})[1]
    if not head then
      rehead(best, spids)  -- the group's key expired (or holds foreign data): forget it
    else
      -- (a waiter whose key holds foreign data, in limit_renew: dropped, as a dead one)
      local i = waiter_instance(best, head)
      local v = i and unowned_read('HMGET', 'lw:' .. head, 'pools', 'gen') or {}
      -- (pools that are not its group's, as a key of foreign data: dropped, not granted)
      local pids = v[1] and waiter_pools(head, v[1], best)
      drop_waiter(head, spids)
      if pids and gen_of(i) == v[2] then
        grant(head, pids, v[2])
        tell(i, {'limit', head, v[2]})
      end
    end
  end
end

-- keep a pool's settings while it is in use; forget the pool's keys once it is not
local function tidy(p)
  if not p.touched or not p.spec then return end
  local lk = P .. 'lp:' .. p.pid
  local waiting = (unowned_read('ZCARD', 'lq:' .. p.pid) or 1) > 0  -- (foreign: waiting)
  if p.cap then
    if p.held == 0 and not waiting then
      redis.call('DEL', lk, P .. 'lh:' .. p.pid)
    else
      redis.call('HSET', lk, 'spec', p.spec)
      redis.call('PEXPIRE', lk, LIVE)
    end
  else
    local ahead = ahead_ms(p)
    if not waiting and ahead <= 0 then
      redis.call('DEL', lk)
    else
      redis.call('HSET', lk, 'spec', p.spec)
      local ms = math.min(math.ceil(ahead) + 1, FAR)
      if waiting and ms < LIVE then ms = LIVE end
      redis.call('PEXPIRE', lk, ms)
    end
  end
end

-- the number of a pool's live waiters (at most 1 when ``any``)
local function live_waiters(pid, any)
  local n = 0
  for _, gid in ipairs(unowned_read('ZRANGE', 'lq:' .. pid, 0, -1) or {}) do
    for _, w in ipairs(unowned_read('ZRANGE', 'lg:' .. gid, 0, -1) or {}) do
      local i = waiter_instance(gid, w)
      if i and unowned_read('HGET', 'lw:' .. w, 'gen') == gen_of(i) then
        n = n + 1
        if any then return n end
      end
    end
  end
  return n
end

-- whether a pool's settings must stay: a live holder or waiter, or a tat ahead
local function in_use(p)
  if p.held > 0 or (not p.cap and ahead_ms(p) > 0) then return true end
  return live_waiters(p.pid, true) > 0
end

local function tidy_all() for _, p in pairs(pools) do tidy(p) end end

-- one request w of instance me for the pools pairs {{pid, spec}, ...}:
-- {'granted', gen} | {'waiting', gen, retry_ms, blocked pool ids} |
-- {'conflict', pid, known spec} | {'gone'}
local function acquire(me, w, pairs_)
  local x = redis.call('GET', P .. 'lx:' .. w)
  if x == 'gone' then return {'gone'} end
  local g = my_gen(me)
  if x == g then return {'granted', x} end
  -- x: granted in a generation that expired (its process heard of it too late): those
  -- units are dead, so it is asked for anew (answering the old grant, for ever, would
  -- have its process ask again at once, for ever)
  if x then redis.call('DEL', P .. 'lx:' .. w) end
  local pids = {}
  for k, pair in ipairs(pairs_) do pids[k] = pair[1] end
  local v = redis.call('HMGET', P .. 'lw:' .. w, 'gen', 'seq')
  local waiting = v[1] == g
  if v[1] and not waiting then
    drop_waiter(w, pids)  -- accepted in a generation that expired: back at the tail
  end
  if not waiting then
    for _, pair in ipairs(pairs_) do
      local p = pool(pair[1])
      if p.spec and p.spec ~= pair[2] and in_use(p) then
        return {'conflict', pair[1], p.spec}
      end
    end
    for _, pair in ipairs(pairs_) do
      local p = pool(pair[1])
      if p.spec ~= pair[2] then settle_spec(p, pair[2]) end
    end
  end
  -- older waiters that the clock or an expired holder let fit go first
  settle(pids)
  if waiting and redis.call('EXISTS', P .. 'lw:' .. w) == 0 then
    return {'granted', g}  -- granted by the settle above
  end
  local blocked, retry = {}, false
  for _, pid in ipairs(pids) do
    local ms = room_in(pool(pid))
    if ms ~= 0 then
      blocked[#blocked + 1] = pid
      if ms and (not retry or ms > retry) then retry = ms end
    end
  end
  if #blocked == 0 then
    if waiting then drop_waiter(w, pids) end
    return {'granted', grant(w, pids, g)}
  end
  if waiting then keep_waiter(w, pids) else add_waiter(w, pids, g) end
  for _, pid in ipairs(pids) do pool(pid).touched = true end
  return {'waiting', g, retry and math.min(math.ceil(retry), FAR) or false, blocked}
end

-- give back w's units (a concurrency pool's); then grant what fits in its pools (also
-- when sent again, or when w's units had expired: the settle is harmless, and an expiry
-- may have left room that nobody granted yet)
local function release(w, pids)
  for _, pid in ipairs(pids) do
    local read = pools[pid]  -- read before: w counts in it (a read drops dead entries)
    if unowned_read('HDEL', 'lh:' .. pid, w) == 1 and read and read.cap then
      read.held = read.held - 1
    end
    pool(pid).touched = true  -- else read after the HDEL: w no longer counts
  end
  settle(pids)
end
"""

# The common case of ``limit_acquire``, run before the rest of the script defines anything:
# making the shared functions costs the server more than this whole case does (Lua makes
# each local function anew on every call). It answers a request granted in its
# instance's live generation (its marker), and grants a new one whose every pool has
# room, with settings the same or none yet (none: no state either), no waiter in any of
# them and none for the request itself, and whose instance has a generation (renewed
# here, as ``my_gen`` does): what the full script does then, with the same writes (the
# tidy-up's included; a concurrency pool's dead holders removed as ``pool`` removes
# them). Anything else falls through to the full script, which reads again what this
# read; what this wrote (the renewal, dead holders removed) the full script would have
# written too.
_LIMIT_ACQUIRE_FAST: Final = r"""
do
  local P, me, w = ARGV[1], ARGV[4], ARGV[5]
  local x = redis.call('GET', P .. 'lx:' .. w)
  if x == 'gone' then return {'gone'} end
  local g = redis.call('GETEX', P .. 'lu:' .. me, 'PX', ARGV[2])
  if x and x == g then return {'granted', x} end
  local pairs_ = g and not x and cjson.decode(ARGV[6])
  local keys = {P .. 'lw:' .. w}
  for k, pair in ipairs(pairs_ or {}) do keys[k + 1] = P .. 'lq:' .. pair[1] end
  if pairs_ and redis.call('EXISTS', unpack(keys)) == 0 then
    -- per pool: {new settings?, the rate pool's new start, n and interval (false: a
    -- concurrency pool)}
    local plan, seen, gens, now = {}, {}, {[me] = g}, nil
    for k, pair in ipairs(pairs_) do
      local pid, spec = pair[1], pair[2]
      local v = redis.call('HMGET', P .. 'lp:' .. pid, 'spec', 'tat', 'start', 'n')
      if seen[pid] or (v[1] and v[1] ~= spec) or (not v[1] and v[2]) then plan = nil; break end
      seen[pid] = true
      local cap = string.match(spec, '^concurrency (%d+)$')
      if cap then
        local held, hk = 0, P .. 'lh:' .. pid
        local flat = v[1] and redis.call('HGETALL', hk) or {}
        for j = 1, #flat, 2 do
          local i = string.match(flat[j], '^(.*)/')
          if not i then held = math.huge; break end  -- (no request: the full script's)
          if gens[i] == nil then
            local g = redis.pcall('GET', P .. 'lu:' .. i)
            if type(g) == 'table' then held = math.huge; break end  -- (the full script's)
            gens[i] = g or false
          end
          if gens[i] == flat[j + 1] then held = held + 1 else redis.call('HDEL', hk, flat[j]) end
        end
        if held >= tonumber(cap) then plan = nil; break end
        plan[k] = {not v[1], false}
      else
        local rate, per, burst = string.match(spec, '^rate (%d+) per (%S+) burst (%d+)$')
        if not rate then plan = nil; break end
        if not now then
          local t = redis.call('TIME')
          now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
        end
        local interval = tonumber(per) / tonumber(rate) * 1000  -- as rate_of
        local start, n = -math.huge, 0  -- as gcra_state, room_in and take
        local tat = v[1] and tonumber(v[2])
        -- (a tat that is no finite number: the full script's)
        if v[2] and not (tat and tat > -math.huge and tat < math.huge) then plan = nil; break end
        if tat then
          start, n = tonumber(v[3]), tonumber(v[4])
          if not (start and n and start + n * interval == tat) then start, n = tat, 0 end
        end
        local past = now - start
        if past < (n - tonumber(burst) + 1) * interval then plan = nil; break end
        if past < n * interval then n = n + 1 else start, n = now, 1 end
        plan[k] = {not v[1], {start, n, interval}}
      end
    end
    if plan then
      local live  -- LIVE of the full script, and its say_ttl: for concurrency pools only
      for k, pair in ipairs(pairs_) do
        local lk, new, gcra = P .. 'lp:' .. pair[1], plan[k][1], plan[k][2]
        if gcra then
          local start, n, interval = gcra[1], gcra[2], gcra[3]
          local tat = string.format('%.17g', start + n * interval)  -- as gcra_fields
          local fields = {'tat', tat, 'start', string.format('%.17g', start), 'n',
                          string.format('%.17g', n)}
          if new then fields[7], fields[8] = 'spec', pair[2] end
          redis.call('HSET', lk, unpack(fields))
          local ahead = n * interval - (now - start)
          redis.call('PEXPIRE', lk, math.min(math.ceil(ahead) + 1, 1e12))  -- FAR
        else
          if not live then
            local mine = tonumber(ARGV[2])
            local longest = redis.pcall('GET', P .. 'lttl')  -- (as LONGEST)
            longest = type(longest) == 'string' and tonumber(longest) or 0
            if not (longest > 0 and longest < 1e12) then longest = 0 end  -- as LONGEST
            if mine > longest then redis.call('SET', P .. 'lttl', ARGV[2], 'PX', 2 * mine) end
            live = 2 * math.max(mine, longest)
          end
          local hk = P .. 'lh:' .. pair[1]
          redis.call('HSET', hk, w, g)
          redis.call('PEXPIRE', hk, live)
          if new then redis.call('HSET', lk, 'spec', pair[2]) end
          redis.call('PEXPIRE', lk, live)
        end
      end
      redis.call('SET', P .. 'lx:' .. w, g, 'PX', ARGV[3])
      return {'granted', g}
    end
  end
end
"""

_LIMIT_ACQUIRE: Final = r"""
-- limit_acquire: take one unit of every pool at once, or wait in each pool's line.
-- keys:    lp:<pool> lh:<pool> lq:<pool> lk:<pool> (per pool) lw:<w> lx:<w> lu:<me> lseq
--          (lu:* of other instances read); publishes ``limit`` to granted waiters
-- args:    me, w, JSON [[pool id, spec], ...]
-- replies: {'granted', gen} | {'waiting', gen, retry_ms|false, {pool id, ...} without
--          room} | {'conflict', pool id, known spec} | {'gone'} (withdrawn first)
--          Sent again for a waiting w, it grants w if it fits now, else keeps its place.
--          Wrapped as {'unowned', {what, ...}, reply} when it read a key as none:
-- foreign data at a key w does not own (another pool of a group its settle meets,
-- another group, another process's waiter or generation, the acceptance counter) is
-- read as none, as in limit_renew; at its own (its pools' lp, lh, lq, lk, its group's
-- lg, its lw, lx, its process's lu) it fails the script, as before.
local me, w, pairs_ = ARGV[4], ARGV[5], cjson.decode(ARGV[6])
unowned = {}
owned = {['lx:' .. w] = true, ['lw:' .. w] = true, ['lu:' .. me] = true}
local pids = {}
for k, pair in ipairs(pairs_) do
  pids[k] = pair[1]
  for _, kind in ipairs({'lp:', 'lh:', 'lq:', 'lk:'}) do owned[kind .. pair[1]] = true end
end
owned['lg:' .. group_of(pids)] = true
local reply = acquire(me, w, pairs_)
tidy_all()
if #unowned > 0 then return {'unowned', unowned, reply} end
return reply
"""

_LIMIT_RELEASE: Final = r"""
-- limit_release: w's holder exited: give back its units, grant the waiters that fit.
-- keys:    lh:<pool> lp:<pool> lq:<pool> lk:<pool> (per pool of w and of the granted
--          waiters, and of the pools where it parks groups)
-- args:    w, JSON [pool id, ...]
-- replies: 'ok' | {'ok', what, ...} (what, for each key of foreign data read as none)
-- Foreign data anywhere is read as none (a holders key of it holds none of w's units),
-- so that w's units are given back in every other pool: a release that failed half-way
-- held them while w's process lived.
local w, pids = ARGV[4], cjson.decode(ARGV[5])
unowned = {}
release(w, pids)
tidy_all()
if #unowned > 0 then return {'ok', unpack(unowned)} end
return 'ok'
"""

_LIMIT_WITHDRAW: Final = r"""
-- limit_withdraw: w leaves for good, waiting or granted; its marker refuses it later.
-- keys:    lx:<w> lw:<w> lq:<pool> lk:<pool> lh:<pool> lp:<pool>
-- args:    w, JSON [pool id, ...]
-- replies: 'ok' | {'ok', what, ...} (as limit_release's)
-- Foreign data is read as none, as in limit_release; a marker of it is left as it is
-- (an acquisition of w still on its way fails on it), and w's units given back, as if
-- granted (a release of units it does not hold changes nothing).
local w, pids = ARGV[4], cjson.decode(ARGV[5])
unowned = {}
local x = unowned_read('GET', 'lx:' .. w)
if x ~= nil then redis.call('SET', P .. 'lx:' .. w, 'gone', 'PX', KEEP) end
if x == nil or (x and x ~= 'gone') then release(w, pids) end
if redis.call('EXISTS', P .. 'lw:' .. w) == 1 then
  for _, pid in ipairs(pids) do pool(pid).touched = true end
end
drop_waiter(w, pids)
tidy_all()
if #unowned > 0 then return {'ok', unpack(unowned)} end
return 'ok'
"""

_LIMIT_RENEW: Final = r"""
-- limit_renew: this process's units' lease, its units, and its waiting requests.
-- keys:    lu:<me>, lh:<pool> lp:<pool> (pools it holds units of), and per waiter those
--          of limit_acquire; with a rebase, lx:<w> of every unit named
-- args:    me, JSON [[w, [[pool id, spec], ...]], ...] (waiting requests), JSON [[pool
--          id, [n, ...]], ...] (the concurrency pools it holds units of, each with its
--          units' requests, w = me .. '/' .. n: their keys live on), and optionally a
--          rebase: JSON [[w, [pool id, ...]], ...] (every unit the process holds: its
--          concurrency pools)
-- replies: JSON [gen, items, lost, foreign(, unowned)]: gen is the live generation
--          (units of another one are lost); one item per waiter, as limit_acquire
--          replies (a waiter of an expired generation is accepted again, at the tail),
--          or {'foreign', pool id, what} (refused, and withdrawn: a key of its pool or
--          of its own, after P, holds foreign data; what names it and the server's
--          error); lost: the units named (held, or in the rebase) that are not held in
--          gen; foreign: what, for each holders key of foreign data that lost units
--          were named in; unowned (only when not empty): what, for each key of foreign
--          data that the renewal read as none (see the module docstring)
-- A unit named that its pool no longer holds in gen (its holders key deleted or evicted,
-- or holding foreign data, which counts as holding none) is lost, its other pools'
-- units given back: another instance may have taken its room meanwhile, so its holder
-- must stop, as a slot owner whose lease key went does at its next renewal.
-- A rebase follows a change of server (a failover, a restart from an older copy): the
-- server may hold units the process gave back (a release the old server did not pass
-- on), or lack units it holds. A new generation is made, and what the process names
-- moves to it from the live one: its units, and its waiters (they keep their place, or
-- their grant if the process has not heard of it yet). Every other unit of the live one
-- dies with it. A unit named that is not held live (or in the new generation, once
-- moved: the rebase sent again) is lost, its other pools' units given back. (Which
-- generation is live does not matter: after two changes of server, the one a copy
-- holds may be older than the one the process last heard of.)
local me, waiters, held = ARGV[4], cjson.decode(ARGV[5]), cjson.decode(ARGV[6] or '[]')
local rebase = ARGV[7] and cjson.decode(ARGV[7])
unowned = {}
local old = rebase and gen_of(me)  -- the live generation that moves (false: none)
if old then
  local t = redis.call('TIME')
  local fresh = t[1] .. string.format('%06d', tonumber(t[2]))
  if fresh == old then fresh = fresh .. '0' end
  gen_memo[me] = fresh
end
local g = my_gen(me)
say_ttl(true)
-- pool id -> what (its holders key, after P, and the server's error) when that key
-- holds foreign data (it holds none), false when it was read and does not
local foreign, foreign_lost = {}, {}
-- the generations the holders of a pool give the requests ws, in order (a pool whose
-- key holds foreign data gives none: false for each, and it is said in the reply)
local function holders_of(pid, ws)
  local v = redis.pcall('HMGET', P .. 'lh:' .. pid, unpack(ws))
  if v.err then
    if not foreign[pid] then
      foreign[pid] = wrongtype('lh:' .. pid, v)
      foreign_lost[#foreign_lost + 1] = foreign[pid]
    end
    v = {}
    for k = 1, #ws do v[k] = false end
  end
  return v
end
-- move w's units in pids from the old generation to g (as its marker says); whether
-- each is held in g now
local function move(w, pids)
  local kept = true
  for _, pid in ipairs(pids) do
    local e = holders_of(pid, {w})[1]
    if old and e == old then
      redis.call('HSET', P .. 'lh:' .. pid, w, g)
    elseif e ~= g then
      kept = false
    end
  end
  if kept then redis.call('SET', P .. 'lx:' .. w, g, 'PX', KEEP) end
  return kept
end
local lost, lost_pids = {}, {}
for _, unit in ipairs(rebase or {}) do
  if not move(unit[1], unit[2]) then
    lost[#lost + 1] = unit[1]
    lost_pids[#lost] = unit[2]
  end
end
if not rebase then
  -- every unit named is held in g, or lost (in the order named: pool by pool); a pool's
  -- holders read in one HMGET (of at most 1000 fields: unpack's limit)
  local missing, pids_of = {}, {}
  for _, pair in ipairs(held) do
    local pid, ns = pair[1], pair[2]
    for b = 1, #ns, 1000 do
      local ws = {}
      for k = b, math.min(b + 999, #ns) do ws[#ws + 1] = me .. '/' .. ns[k] end
      local v = holders_of(pid, ws)
      for k, w in ipairs(ws) do
        if v[k] ~= g and not missing[w] then
          missing[w] = true
          lost[#lost + 1] = w
          pids_of[w] = {}
          lost_pids[#lost] = pids_of[w]
        end
      end
    end
  end
  if #lost > 0 then  -- the pools each lost unit is named in
    for _, pair in ipairs(held) do
      for _, n in ipairs(pair[2]) do
        local pids = pids_of[me .. '/' .. n]
        if pids then pids[#pids + 1] = pair[1] end
      end
    end
  end
end
if old then
  for _, pair in ipairs(waiters) do
    local w, wk = pair[1], P .. 'lw:' .. pair[1]
    if unowned_read('GET', 'lx:' .. w) == old then
      -- granted in the old generation, its process not told yet: its units move too
      local pids = {}
      for k, pp in ipairs(pair[2]) do pids[k] = pp[1] end
      move(w, pids)
      redis.call('SET', P .. 'lx:' .. w, g, 'PX', KEEP)
    elseif unowned_read('HGET', 'lw:' .. w, 'gen') == old then
      redis.call('HSET', wk, 'gen', g)
    end
  end
end
-- given back once every unit and waiter moved (a pool read, or a settle, removes what
-- the old generation holds); not in a pool whose key holds foreign data
for k, w in ipairs(lost) do
  local pids = {}
  for _, pid in ipairs(lost_pids[k]) do
    if not foreign[pid] then pids[#pids + 1] = pid end
  end
  release(w, pids)
end
for _, pair in ipairs(held) do
  local pid = pair[1]
  if not foreign[pid] and redis.call('PEXPIRE', P .. 'lh:' .. pid, LIVE) == 1 then
    redis.call('PEXPIRE', P .. 'lp:' .. pid, LIVE)
  end
end
-- A waiter of a pool whose holders key holds foreign data is refused, naming it (any
-- read of such a pool fails: as limit_acquire's would), and leaves the pool's line;
-- the other waiters are asked for as always. So is one whose own keys hold foreign
-- data: its pools' settings (lp), waiting (lq) and parked (lk) groups, its group (lg),
-- read here, each once (a typed read, which fails on foreign data); its own (lw, lx),
-- once its acquisition failed (acquire reads them before it writes anything).
local checked = {}  -- key (after P) -> what (foreign data) | false
local function foreign_at(key, cmd, ...)
  local f = checked[key]
  if f == nil then
    local r = redis.pcall(cmd, P .. key, ...)
    f = type(r) == 'table' and r.err ~= nil and wrongtype(key, r)
    checked[key] = f
  end
  return f
end
local function refusal(w, pairs_, pids)
  for _, pp in ipairs(pairs_) do
    local pid = pp[1]
    if foreign[pid] == nil then
      local r = redis.pcall('HGET', P .. 'lh:' .. pid, me)
      foreign[pid] = type(r) == 'table' and wrongtype('lh:' .. pid, r)
    end
    local what = foreign[pid] or named['lh:' .. pid] or named['lp:' .. pid]
      or named['lk:' .. pid] or foreign_at('lp:' .. pid, 'HGET', 'spec')
      or foreign_at('lq:' .. pid, 'ZCARD') or foreign_at('lk:' .. pid, 'ZCARD')
    if what then return {'foreign', pid, what} end
  end
  local what = foreign_at('lg:' .. group_of(pids), 'ZCARD')
  if w then
    what = what or foreign_at('lx:' .. w, 'GET') or foreign_at('lw:' .. w, 'HGET', 'gen')
      or named['lw:' .. w]
  end
  if what then return {'foreign', pids[1], what} end
  return nil
end
-- raise again an error that pcall caught (a string): a server's keeps its code
local function raise(e)
  if type(e) == 'string' and string.find(e, '^%u+ ') then error({err = e}) end
  error(e)
end
local items = {}
for k, pair in ipairs(waiters) do
  local w, pids = pair[1], {}
  for j, pp in ipairs(pair[2]) do pids[j] = pp[1] end
  local refused = refusal(nil, pair[2], pids)
  if not refused then
    -- its pools' holders, settings and parked groups, and its own pools field, are its
    -- own there: a holder that is no request, settings no script wrote, a parked group
    -- that is no list of pools, or pools not its group's, fail the acquire (pool, settle),
    -- and refuse it (refusal), as in limit_acquire
    owned = {['lw:' .. w] = true}
    for _, pid in ipairs(pids) do
      owned['lh:' .. pid], owned['lp:' .. pid], owned['lk:' .. pid] = true, true, true
    end
    local ok, r = pcall(acquire, me, w, pair[2])
    owned = nil
    if ok then items[k] = r else refused = refusal(w, pair[2], pids) or raise(r) end
  end
  if refused then
    -- withdrawn, as limit_withdraw does: a grant it has not heard of given back, and
    -- marked, so that an acquisition still on its way does not queue it again (a marker
    -- of foreign data is left as it is)
    local x = unowned_read('GET', 'lx:' .. w)
    if x ~= nil then redis.call('SET', P .. 'lx:' .. w, 'gone', 'PX', KEEP) end
    if x and x ~= 'gone' then release(w, pids) end
    drop_waiter(w, pids)
    items[k] = refused
  end
end
tidy_all()
if #unowned > 0 then return cjson.encode({g, items, lost, foreign_lost, unowned}) end
return cjson.encode({g, items, lost, foreign_lost})
"""

_CLUSTER_LIMIT: Final = r"""
-- cluster_limit: what the server holds for one pool.
-- keys:    lp:<pool> lh:<pool> lq:<pool> (lu:* and lw:* read)
-- args:    pool id
-- replies: {spec|false, {instance, units, ...}, live waiters, next_start_ms|false}
-- A pool not in use (no live holder or waiter, a rate pool's tat passed) answers as one
-- without settings, whatever settings its keys still hold (of processes that died: they
-- expire with the pool's keys): an acquisition with other settings is granted then, so
-- the query, which raises a conflict for other settings, answers as it would.
local pid = ARGV[4]
local p = pool(pid)
if not p.spec or not in_use(p) then return {false, {}, 0, false} end
local per = {}
-- (pool failed on a holder that is no request; a rate pool has none)
local flat = p.cap and redis.call('HGETALL', P .. 'lh:' .. pid) or {}
for k = 1, #flat, 2 do
  local i = instance_of(flat[k])
  per[i] = (per[i] or 0) + 1
end
local holders = {}
for i, n in pairs(per) do holders[#holders + 1] = i; holders[#holders + 1] = n end
local n = live_waiters(pid, false)
local next_ms = false
if not p.cap then next_ms = room_in(p) end
return {p.spec, holders, n, next_ms and math.min(math.ceil(next_ms), FAR)}
"""


@attrs.frozen
class Script:
    """One Lua script: its name, full source and SHA1 (for ``EVALSHA``)."""

    name: str
    source: str
    sha: str


_READS_UNOWNED: Final = frozenset({"submit", "claim", "release", "withdraw", "store_outcome"})
"""The slot scripts that read another process's heartbeat, a slot's watch key and an
entry's joiners key of foreign data as none (``unowned``; ``withdraw`` its slot's lease
and queue keys too; ``store_outcome`` the joiners key only):
their reply is ``{'unowned', {what, ...}, reply}`` when they did (``reads_unowned``),
else their own."""


def _reads_unowned(body: str) -> str:
    """``body`` with ``unowned`` on, its reply wrapped when it read a key as none."""
    return f"""
unowned = {{}}
local function run()
{body}
end
local reply = run()
if #unowned > 0 then return {{'unowned', unowned, reply}} end
return reply
"""


def _script(name: str, body: str) -> Script:
    if name in _READS_UNOWNED:
        body = _reads_unowned(body)
    source = _PRELUDE + body
    if name.startswith("limit_") or name == "cluster_limit":
        source = _PRELUDE + _LIMITS + body
    if name == "limit_acquire":
        source = _LIMIT_ACQUIRE_FAST + source
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


SUBMIT: Final = _script("submit", _SUBMIT)
CLAIM: Final = _script("claim", _CLAIM)
RELEASE: Final = _script("release", _RELEASE)
STORE_OUTCOME: Final = _script("store_outcome", _STORE_OUTCOME)
WITHDRAW: Final = _script("withdraw", _WITHDRAW)
STOP_OWNER: Final = _script("stop_owner", _STOP_OWNER)
RENEW: Final = _script("renew", _RENEW)
CLUSTER_SLOT: Final = _script("cluster_slot", _CLUSTER_SLOT)
LIMIT_ACQUIRE: Final = _script("limit_acquire", _LIMIT_ACQUIRE)
LIMIT_RELEASE: Final = _script("limit_release", _LIMIT_RELEASE)
LIMIT_WITHDRAW: Final = _script("limit_withdraw", _LIMIT_WITHDRAW)
LIMIT_RENEW: Final = _script("limit_renew", _LIMIT_RENEW)
CLUSTER_LIMIT: Final = _script("cluster_limit", _CLUSTER_LIMIT)

# Each command the scripts call, called once on scratch keys of the caller's own (in
# this order: the list and the set exist before they are read, and DEL comes last).
# Each key has a TTL from the call that makes it on: a refused call ends the script
# there, keeping what it wrote.
PROBED: Final = {
    "TIME": "redis.call('TIME')",
    "SET": "redis.call('SET', s, '1', 'PX', 60000)",
    "GET": "redis.call('GET', s)",
    "TYPE": "redis.call('TYPE', s)",
    "GETEX": "redis.call('GETEX', s, 'PX', 60000)",
    "INCR": "redis.call('INCR', s)",
    "PTTL": "redis.call('PTTL', s)",
    "PEXPIRE": "redis.call('PEXPIRE', s, 60000)",
    "EXISTS": "redis.call('EXISTS', s)",
    "HSET": "redis.call('HSET', h, 'f', '1') redis.call('PEXPIRE', h, 60000)",
    "HGET": "redis.call('HGET', h, 'f')",
    "HMGET": "redis.call('HMGET', h, 'f')",
    "HGETALL": "redis.call('HGETALL', h)",
    "HDEL": "redis.call('HDEL', h, 'f')",
    "RPUSH": "redis.call('RPUSH', l, 'a') redis.call('PEXPIRE', l, 60000)",
    "LPUSH": "redis.call('LPUSH', l, 'b')",
    "LSET": "redis.call('LSET', l, 0, 'c')",
    "LRANGE": "redis.call('LRANGE', l, 0, -1)",
    "LPOS": "redis.call('LPOS', l, 'a')",
    "LREM": "redis.call('LREM', l, 0, 'a')",
    "LPOP": "redis.call('LPOP', l)",
    "SADD": "redis.call('SADD', t, 'a') redis.call('PEXPIRE', t, 60000)",
    "SMEMBERS": "redis.call('SMEMBERS', t)",
    "ZADD": "redis.call('ZADD', z, 1, 'a') redis.call('PEXPIRE', z, 60000)",
    "ZRANGE": "redis.call('ZRANGE', z, 0, -1)",
    "ZCARD": "redis.call('ZCARD', z)",
    "ZREM": "redis.call('ZREM', z, 'a')",
    "PUBLISH": "redis.call('PUBLISH', P .. 'ch:' .. ARGV[4] .. ':probe', '[]')",
    "DEL": "redis.call('DEL', s, h, l, t, z)",
}

# ``probe``: try every command the other scripts call, as the caller's user, on scratch
# keys under the prefix (gone when it returns) and a channel no process listens to. A
# user the server lets run scripts but not one of those commands, or not on these keys,
# gets the error a script would get later (ARGV[4]: the instance id).
_PROBE: Final = (
    """
local k = P .. 'probe:' .. ARGV[4] .. ':'
local s, h, l, t, z = k .. 's', k .. 'h', k .. 'l', k .. 't', k .. 'z'
redis.call('DEL', s, h, l, t, z)
"""
    + "\n".join(PROBED.values())
    + "\nreturn 'ok'\n"
)
PROBE: Final = _script("probe", _PROBE)


@attrs.frozen
class Grouped:
    """The grouped form of a script: several of its calls in one (``GROUPED``)."""

    script: Script
    arity: int
    """How many arguments of its own each call has."""


def _grouped(name: str, body: str, arity: int) -> Grouped:
    """The script ``name`` (of ``body``) for several calls in one: its own arguments
    are the calls', ``arity`` each, one call after another; its reply, the array of
    theirs. Each call runs ``body``, in order, under ``pcall``: a call that fails has
    its error as its reply, and the calls after it still run, as separate calls would.
    They share the run's memo of live processes: neither script writes a heartbeat,
    and no key expires while a script runs."""
    args = ", ".join(f"ARGV[b + {i}]" for i in range(1, arity + 1))
    dispatch = f"""
local function one(ARGV)
{body}
end
local out = {{}}
for b = 3, #ARGV - 1, {arity} do
  unowned = {{}}  -- (each call reads as none what reads_unowned says)
  local ok, r = pcall(one, {{P, TTL, KEEP, {args}}})
  if not ok and type(r) ~= 'table' then r = redis.error_reply(tostring(r)) end
  if r == nil then r = false end  -- a hole would end the array
  if ok and #unowned > 0 then r = {{'unowned', unowned, r}} end
  out[#out + 1] = r
end
return out
"""
    return Grouped(_script(f"{name}*", dispatch), arity)


GROUPED: Final = {
    SUBMIT.name: _grouped(SUBMIT.name, _SUBMIT, 5),
    RELEASE.name: _grouped(RELEASE.name, _RELEASE, 3),
}
"""The scripts whose consecutive calls in a round trip go as one call of their grouped
form, by name. Every keyed item submits once and releases once: one ``EVALSHA`` for the
submits of a round trip and one for its releases, rather than one each, cut the
server's CPU per item by about a sixth (benchmark 10, the 3x50 callers rows)."""

GROUP_SIZE: Final = 64
"""The most calls in one grouped call: the server runs no other client's command while
a script runs, so a burst of thousands of submits goes as several."""

SCRIPTS: Final = (
    SUBMIT,
    CLAIM,
    RELEASE,
    STORE_OUTCOME,
    WITHDRAW,
    STOP_OWNER,
    RENEW,
    CLUSTER_SLOT,
    LIMIT_ACQUIRE,
    LIMIT_RELEASE,
    LIMIT_WITHDRAW,
    LIMIT_RENEW,
    CLUSTER_LIMIT,
    PROBE,
    *(grouped.script for grouped in GROUPED.values()),
)


# -- arguments ------------------------------------------------------------------------------

Args = tuple[str, ...]
"""A script's own arguments (after the common ``P, lease_ttl_ms, keep_ms``)."""


def common_args(prefix: str, lease_ttl: float, keep: float) -> Args:
    """The arguments every script starts with."""
    return (prefix, str(round(lease_ttl * 1000)), str(round(keep * 1000)))


def submit_args(slot: str, entry: str, policy: str, max_queue: int, watch: bool) -> Args:
    """``policy`` is an ``AdmissionPolicy`` value; ``watch``: register for ``room``."""
    return (slot, entry, policy, str(max_queue), "1" if watch else "0")


def renew_args(
    instance: str,
    leases: Iterable[tuple[str, str]],
    entries: Iterable[tuple[str, str]],
    follows: Iterable[tuple[str, str]],
) -> Args:
    """Each part is ``(slot, entry)`` pairs: held leases, queued entries, followed entries;
    sent as one JSON argument (thousands of separate arguments cost the client more
    than the script)."""
    parts = [list(itertools.chain.from_iterable(part)) for part in (leases, entries, follows)]
    return (instance, json.dumps(parts, separators=(",", ":")))


# -- replies --------------------------------------------------------------------------------


SubmitKind: TypeAlias = Literal["owner", "queued", "busy", "full", "joined", "gone"]
"""The kinds of a ``submit`` reply."""
ClaimKind: TypeAlias = Literal["owner", "gone", "missing", "wait", "foreign"]
"""The kinds of a ``claim`` reply."""
QueuedKind: TypeAlias = Literal["owner", "gone", "queued", "resubmitted", "foreign"]
"""The kinds of a ``renew`` item for a queued entry."""
FollowKind: TypeAlias = Literal["out", "gone", "live", "lost", "foreign", "foreign_lease"]
"""The kinds of a ``renew`` item for a followed entry (``foreign``: the entry, or the
follow itself, refused for foreign data; ``foreign_lease``: the lease the entry held
refused for foreign data; ``detail`` as ``Foreign.what``)."""
ReleaseReply: TypeAlias = Literal["ok", "need_outcome"]
"""A ``release`` reply: ``need_outcome`` asks for the outcome (another process follows)."""

K = TypeVar("K", bound=str, covariant=True)


@attrs.frozen
class Reply(Generic[K]):
    """One parsed item of a script reply; ``kind`` is one of the script's ``K``.

    ``holder`` is the instance holding the lease; ``retry`` the seconds after which a
    claim may succeed (the lease's or the head's heartbeat's expiry); ``claimable``: the
    lease is free and the entry is the live head; ``detail`` the displaced entry
    (``queued``, ``owner``), the followed entry (``joined``), the reason (``gone``) or the
    outcome JSON (``out``).
    """

    kind: K
    token: int | None = None
    holder: str | None = None
    retry: float | None = None
    claimable: bool = False
    detail: str | None = None


def _ms(value: object) -> float:
    return max(int(str(value)), 0) / 1000


def _text(value: object) -> str | None:
    return None if value is None else _shown(value)


def _shown(value: object) -> str:
    """A string of a reply as text; bytes that are not UTF-8 (a name another client
    wrote) escaped as the ``slots`` command shows them (``\\xff``), not as a ``repr``."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def _escaped(value: object) -> str:
    """A string of a reply as text, bytes that are not UTF-8 as surrogate escapes: as the
    JSON replies (``_json_reply``) and the messages read them, for a value that they
    carry too and that is compared with theirs (an instance's generation)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _items(raw: object, minimum: int = 1) -> list[object]:
    if not isinstance(raw, list) or len(raw) < minimum:  # pyright: ignore[reportUnknownArgumentType]
        raise ValueError(f"unexpected script reply {raw!r}")
    return list(raw)  # pyright: ignore[reportUnknownArgumentType]


def parse_submit(raw: object) -> Reply[SubmitKind]:
    """Parse a raw ``submit`` reply (a list as the server sends it)."""
    items = _items(raw)
    match items[0]:
        case "owner":
            displaced = _text(items[2]) if len(items) > 2 else None
            return Reply("owner", token=int(str(items[1])), detail=displaced)
        case "queued":
            holder, retry, displaced = _text(items[1]), _ms(items[2]), _text(items[3])
            return Reply("queued", holder=holder, retry=retry, detail=displaced)
        case "busy":
            return Reply("busy", holder=_text(items[1]), retry=_ms(items[2]))
        case "full":
            return Reply("full", holder=_text(items[1]), retry=_ms(items[2]))
        case "joined":
            holder, retry, target = _text(items[2]), _ms(items[3]), _shown(items[1])
            return Reply("joined", holder=holder, retry=retry, detail=target)
        case "gone":
            return Reply("gone", detail=_shown(items[1]))
        case _:
            raise ValueError(f"unexpected script reply {raw!r}")


def parse_claim(raw: object) -> Reply[ClaimKind]:
    """Parse a raw ``claim`` reply (a list as the server sends it)."""
    items = _items(raw)
    match items[0]:
        case "owner":
            return Reply("owner", token=int(str(items[1])))
        case "gone":
            return Reply("gone", detail=_shown(items[1]))
        case "missing":
            return Reply("missing")
        case "wait":
            return Reply("wait", retry=_ms(items[1]))
        case "foreign":
            return Reply("foreign", detail=_shown(items[1]))
        case _:
            raise ValueError(f"unexpected script reply {raw!r}")


def read_unowned(raw: object) -> bool:
    """Whether a raw reply of ``submit``, ``claim``, ``release``, ``withdraw``,
    ``store_outcome`` or ``limit_acquire`` says it read keys of foreign data as none
    (``reads_unowned`` tells which)."""
    items = _json_list(raw)
    return items is not None and len(items) == 3 and items[0] == "unowned"


def reads_unowned(raw: object) -> tuple[object, tuple[str, ...]]:
    """A raw reply of ``submit``, ``claim``, ``release``, ``withdraw``,
    ``store_outcome`` or ``limit_acquire`` as its script's own, and what (a key after
    the prefix, and why), once for each key of foreign data it read as none (another
    process's heartbeat, a slot's watch key, an entry's joiners key, a withdrawal's
    slot's lease or queue key; another pool's, group's or process's key an
    acquisition's settle met)."""
    if not read_unowned(raw):
        return raw, ()
    _, what, reply = cast("list[object]", raw)
    return reply, tuple(dict.fromkeys(map(_shown, _items(what or [], 0))))


def release_refusal(raw: object) -> str | None:
    """What (the lease key after the prefix, and the server's error) when a raw
    ``release`` reply says the lease was refused for foreign data, else ``None``."""
    if raw == "ok" or raw == "need_outcome":  # (the common case: no list to read)
        return None
    items = _items(raw, 3)
    return str(items[1]) if len(items) == 3 and items[0] == "foreign" else None


def parse_release(raw: object) -> ReleaseReply:
    """Parse a raw ``release`` reply (of a refused lease: the reply of its outcome part)."""
    if release_refusal(raw) is not None:
        raw = _items(raw, 3)[2]
    if raw == "ok":
        return "ok"
    if raw == "need_outcome":
        return "need_outcome"
    raise ValueError(f"unexpected script reply {raw!r}")


_WAITING: Final[dict[tuple[object, object], Reply[QueuedKind]]] = {
    (kind, flag): Reply[QueuedKind](kind, claimable=flag == 1)
    for kind in ("queued", "resubmitted")
    for flag in (0, 1)
}
"""The replies of waiting entries, shared (a renewal parses thousands of them)."""


def _json_list(raw: object) -> list[object] | None:
    # a typed subject for the patterns below (class patterns such as ``str(x)`` would
    # make a renewal's parse ten times slower)
    return cast("list[object]", raw) if isinstance(raw, list) else None


def _parse_queued(raw: object) -> Reply[QueuedKind]:
    match _json_list(raw):
        case [("queued" | "resubmitted") as kind, (0 | 1) as flag]:
            return _WAITING[kind, flag]
        case ["owner", str(token)]:
            return Reply("owner", token=int(token))
        case ["gone", str(reason)]:
            return Reply("gone", detail=reason)
        case ["foreign", str(what)]:
            return Reply("foreign", detail=what)
        case _:
            raise ValueError(f"unexpected renew item {raw!r}")


def _parse_follow(raw: object) -> Reply[FollowKind]:
    match _json_list(raw):
        case ["out", str(outcome)]:
            return Reply("out", detail=outcome)
        case ["gone", str(reason)]:
            return Reply("gone", detail=reason)
        case ["live"]:
            return Reply("live")
        case ["lost"]:
            return Reply("lost")
        case ["foreign", str(what)]:
            return Reply("foreign", detail=what)
        case ["foreign_lease", str(what)]:
            return Reply("foreign_lease", detail=what)
        case _:
            raise ValueError(f"unexpected renew item {raw!r}")


@attrs.frozen
class Foreign:
    """A ``renew`` item refused for foreign data: ``what``, the slot's key (after the
    prefix) of another type than the scripts write, and the server's error."""

    what: str


def _parse_lease(raw: object) -> str | Foreign | None:
    if raw is None or isinstance(raw, str):
        return raw
    match _json_list(raw):
        case ["foreign", str(what)]:
            return Foreign(what)
        case _:
            raise ValueError(f"unexpected renew item {raw!r}")


@attrs.frozen
class RenewReply:
    """A parsed ``renew`` reply, one item per pair sent, in order.

    ``leases``: ``None`` for a refused lease, ``Foreign`` for one refused for foreign
    data, else the instance that asked for a stop (``""`` when nobody did). ``entries``
    and ``follows``: see ``Reply`` (an entry's ``foreign`` item: ``detail`` as
    ``Foreign.what``).
    """

    leases: tuple[str | Foreign | None, ...]
    entries: tuple[Reply[QueuedKind], ...]
    follows: tuple[Reply[FollowKind], ...]
    unowned: tuple[str, ...] = ()
    """What (a key after the prefix, and the server's error), for each key of foreign
    data that no item owns, read as none (another process's heartbeat, a watch key)."""


def _json_reply(raw: object) -> object:
    """A script's reply in JSON, decoded. A string that another client wrote into the
    namespace with bytes that are not UTF-8 (which the client leaves the whole reply as
    bytes for) passes with those bytes as surrogate escapes."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "surrogateescape")
    if not isinstance(raw, str):  # a bad reply is a ValueError throughout this module
        raise ValueError(f"unexpected script reply {raw!r}")  # noqa: TRY004
    try:
        return json.loads(raw)
    except ValueError:
        raise ValueError(f"unexpected script reply {raw!r}") from None


_T = TypeVar("_T")


def _sparse(part: object, common: _T, parse: Callable[[object], _T]) -> list[_T]:
    """A sparse part of a ``renew`` reply, ``[count, [[k, item], ...]]`` (an empty list
    encoded as ``{}``): ``count`` items, ``common`` but ``parse(item)`` at each ``k``
    (from 1). Thousands of items cost the script's encoding and this parse about a
    microsecond each: a renewal names the few that are not ``common`` only."""
    match _json_list(part):
        case [int(count), changed] if count >= 0:
            items = [common] * count
            for pair in _items(changed or [], 0):
                match _json_list(pair):
                    case [int(k), item] if 0 < k <= count:
                        items[k - 1] = parse(item)
                    case _:
                        raise ValueError(f"unexpected script reply {part!r}")
            return items
        case _:
            raise ValueError(f"unexpected script reply {part!r}")


def _unparsed(item: object) -> object:
    return item


def renew_items(raw: object) -> list[list[object]]:
    """The three parts of a raw ``renew`` reply (the script answers in JSON, where an
    empty part is ``{}``), unparsed, one item per pair sent; without the keys it read as
    none."""
    leases, entries, follows = _items(_json_reply(raw), 3)[:3]
    return [
        _sparse(leases, "", _unparsed),
        _sparse(entries, ["queued", 0], _unparsed),
        _items(follows or [], 0),
    ]


def parse_renew(raw: object) -> RenewReply:
    """Parse a raw ``renew`` reply."""
    parts = _items(_json_reply(raw), 3)
    unowned = tuple(map(str, _items(parts[3] or [], 0))) if len(parts) > 3 else ()
    return RenewReply(
        tuple(_sparse(parts[0], "", _parse_lease)),
        tuple(_sparse(parts[1], _WAITING["queued", 0], _parse_queued)),
        tuple(map(_parse_follow, _items(parts[2] or [], 0))),
        unowned,
    )


@attrs.frozen
class SlotReply:
    """A parsed ``cluster_slot`` reply."""

    holder: str | None
    token: int | None
    remaining: float | None
    live_entries: int


def parse_stop_owner(raw: object) -> int | None:
    """Parse a raw ``stop_owner`` reply: the fence token of the lease asked to stop
    (``None``: the slot had no lease)."""
    if raw is None:
        return None
    _, token = _items(raw, 2)
    return int(str(token))


def parse_cluster_slot(raw: object) -> SlotReply:
    """Parse a raw ``cluster_slot`` reply."""
    holder, token, pttl, count = _items(raw, 4)
    return SlotReply(
        _text(holder),
        None if token is None else int(str(token)),
        None if pttl is None else _ms(pttl),
        int(str(count)),
    )


# -- limit pools ----------------------------------------------------------------------------


def pool_wire_id(name: str, key: str | None) -> str:
    """A pool's id on the server: the limit's name, then ``" " + key`` for a keyed pool
    (a name holds no whitespace, so the first space splits them)."""
    return name if key is None else f"{name} {key}"


def capped_tat(tat: float, now: float, burst: int, interval: float) -> float:
    """A rate pool's ``tat`` as the scripts read it (``capped`` in their Lua; ms): one
    more than a full burst ahead of ``now`` tells of a server clock that stepped back,
    and counts from ``now`` as a burst just spent."""
    full = now + burst * interval
    return full if tat > full + 1 else tat


def spec_text(kind: str, capacity: int, rate: int, per: float, burst: int) -> str:
    """A pool's settings as the server keeps and compares them."""
    if kind == "concurrency":
        return f"concurrency {capacity}"
    return f"rate {rate} per {per!r} burst {burst}"


def gcra_state(
    tat: float | None, start: str | None, count: str | None, interval: float
) -> tuple[float, float]:
    """A rate pool's GCRA state ``(start, n)`` from its fields (as the scripts'
    ``gcra_state`` reads them; ms): its ``tat`` is ``start + n * interval``. ``start`` and
    ``n`` count while they make the ``tat`` beside them; a ``tat`` alone (or one an
    earlier version wrote over them) is ``(tat, 0)``; none, a pool never used."""
    if tat is None:
        return -math.inf, 0.0
    try:
        first, n = float(start or "x"), float(count or "x")
    except ValueError:
        return tat, 0.0
    if first + n * interval == tat:
        return first, n
    return tat, 0.0


def next_start_ms(
    spec: str,
    tat: str | None,
    now_ms: float,
    start: str | None = None,
    count: str | None = None,
) -> float | None:
    """A pool's ms until a start is allowed from its settings ``spec`` and GCRA fields
    ``tat``, ``start`` and ``n`` (``count``; as ``spec_text`` and the scripts write them),
    ``now_ms`` the server's time: a rate pool's (0.0 if now, exactly when the scripts
    allow a start at ``now_ms``), ``None`` for a concurrency pool. Raise ``ValueError``
    for settings or a ``tat`` this version does not write (no counts of units, a rate of
    0, a period or a ``tat`` that is no finite number)."""
    if (match := _CONCURRENCY_SPEC.fullmatch(spec)) is not None:
        if stored_integer(match[1]) is None:
            raise ValueError(f"no capacity in {spec!r}")
        return None
    if (match := _RATE_SPEC.fullmatch(spec)) is None:
        raise ValueError(f"no pool's settings: {spec!r}")
    rate, burst, per = stored_integer(match[1]), stored_integer(match[3]), float(match[2])
    if not rate or not burst or not math.isfinite(per) or per <= 0:
        raise ValueError(f"no rate pool's settings: {spec!r}")
    known = None if tat is None else float(tat)  # no tat: no start yet
    if known is not None and not math.isfinite(known):
        raise ValueError(f"no time: {tat!r}")
    interval = per / rate * 1000  # as the scripts' rate_of
    first, n = gcra_state(known, start, count, interval)
    tat_ms = first + n * interval
    if capped_tat(tat_ms, now_ms, burst, interval) != tat_ms:  # as the scripts' capped
        first, n = now_ms, float(burst)
    due, past = (n - burst + 1) * interval, now_ms - first  # as room_in
    if past >= due:
        return 0.0
    next_ms = due - past
    if not math.isfinite(next_ms):  # a period of 1e300 s, say
        raise ValueError(f"no finite time until a start for {spec!r}")
    return next_ms


# the inverse of ``spec_text``, as the scripts' ``rate_of`` reads it
_CONCURRENCY_SPEC = re.compile("concurrency ([1-9][0-9]*)")
_RATE_SPEC = re.compile("rate ([1-9][0-9]*) per ([0-9][0-9.e+-]*) burst ([1-9][0-9]*)")


def _pairs(pools: Iterable[tuple[str, str]]) -> list[list[str]]:
    return [[pid, spec] for pid, spec in pools]


def limit_acquire_args(instance: str, request: str, pools: Iterable[tuple[str, str]]) -> Args:
    """``pools`` are ``(pool id, spec)`` pairs."""
    return (instance, request, json.dumps(_pairs(pools), separators=(",", ":")))


def limit_release_args(request: str, pool_ids: Iterable[str]) -> Args:
    """The same arguments serve ``limit_release`` and ``limit_withdraw``."""
    return (request, json.dumps(list(pool_ids), separators=(",", ":")))


def limit_release_unowned(raw: object) -> tuple[str, ...]:
    """What (a key after the prefix, and the server's error), for each key of foreign
    data a raw ``limit_release`` or ``limit_withdraw`` reply says it read as none."""
    if raw == "ok":  # (the common case: no list to read)
        return ()
    items = _items(raw)
    if items[0] != "ok":
        raise ValueError(f"unexpected script reply {raw!r}")
    return tuple(dict.fromkeys(map(_shown, items[1:])))


def limit_renew_args(
    instance: str,
    waiters: Iterable[tuple[str, Iterable[tuple[str, str]]]],
    held: Iterable[tuple[str, Iterable[str]]] = (),
    rebase: Iterable[tuple[str, Iterable[str]]] | None = None,
) -> Args:
    """``waiters``: ``(request, pools)`` of every waiting request of the process;
    ``held``: ``(pool id, requests)`` of every concurrency pool it holds units of, with
    the requests that hold them (each ``"<instance>/<n>"``, sent as ``n``: a process
    may hold thousands); ``rebase``: after a change of server, every unit it holds, as
    ``(request, concurrency pool ids)``."""
    items = [[request, _pairs(pools)] for request, pools in waiters]
    compact = (",", ":")
    mine = f"{instance}/"

    def number(request: str) -> str:
        if not request.startswith(mine):
            raise ValueError(f"request {request!r} is not of instance {instance!r}")
        return request[len(mine) :]

    units = [[pid, [number(request) for request in requests]] for pid, requests in held]
    args = (
        instance,
        json.dumps(items, separators=compact),
        json.dumps(units, separators=compact),
    )
    if rebase is None:
        return args
    units = [[request, list(pools)] for request, pools in rebase]
    return (*args, json.dumps(units, separators=compact))


LimitKind: TypeAlias = Literal["granted", "waiting", "conflict", "gone", "foreign"]
"""The kinds of a ``limit_acquire`` reply (and of a ``limit_renew`` item: ``foreign``
only there)."""


@attrs.frozen
class LimitReply:
    """A parsed ``limit_acquire`` reply: ``gen`` the generation of the grant (or of the
    wait); ``retry`` seconds until a rate pool allows a start (``None``: only a
    release can help); ``blocked`` the pool ids without room; for ``conflict``, ``pool``
    and the ``known`` settings; for ``foreign``, ``pool`` and ``what``: the key (after
    the prefix) of the pool, or of the request, that holds foreign data, and the
    server's error."""

    kind: LimitKind
    gen: str | None = None
    retry: float | None = None
    blocked: tuple[str, ...] = ()
    pool: str | None = None
    known: str | None = None
    what: str | None = None


def parse_limit(raw: object) -> LimitReply:
    """Parse a raw ``limit_acquire`` reply (or one ``limit_renew`` item)."""
    items = _items(raw)
    match items[0]:
        case "granted":
            return LimitReply("granted", gen=_escaped(items[1]))
        case "waiting":
            retry = items[2]
            blocked = items[3] if isinstance(items[3], list) else []  # pyright: ignore[reportUnknownVariableType]
            return LimitReply(
                "waiting",
                gen=_escaped(items[1]),
                retry=None if retry is None or retry is False else _ms(retry),
                blocked=tuple(str(pid) for pid in blocked),  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            )
        case "conflict":
            return LimitReply("conflict", pool=_shown(items[1]), known=_shown(items[2]))
        case "gone":
            return LimitReply("gone")
        case "foreign":
            return LimitReply("foreign", pool=_shown(items[1]), what=_shown(items[2]))
        case _:
            raise ValueError(f"unexpected script reply {raw!r}")


@attrs.frozen
class LimitRenewReply:
    """A parsed ``limit_renew`` reply: the live generation, one item per waiter, the
    units named (held, or in a rebase) that are lost, and ``foreign``: the holders keys
    (after the prefix) of foreign data that some of them were named in, each with the
    server's error."""

    gen: str
    waiters: tuple[LimitReply, ...]
    lost: frozenset[str] = frozenset()
    foreign: tuple[str, ...] = ()
    unowned: tuple[str, ...] = ()
    """What (a key after the prefix, and the server's error), for each key of foreign
    data the renewal read as none (another process's or pool's, met in a settle)."""


def parse_limit_renew(raw: object) -> LimitRenewReply:
    """Parse a raw ``limit_renew`` reply."""
    gen, items, *rest = _items(_json_reply(raw), 2)
    lost = frozenset(map(str, _items(rest[0] or [], 0))) if rest else frozenset[str]()
    foreign = tuple(map(str, _items(rest[1] or [], 0))) if len(rest) > 1 else ()
    unowned = tuple(map(str, _items(rest[2] or [], 0))) if len(rest) > 2 else ()
    waiters = tuple(map(parse_limit, _items(items or [], 0)))
    return LimitRenewReply(str(gen), waiters, lost, foreign, unowned)


@attrs.frozen
class PoolReply:
    """A parsed ``cluster_limit`` reply."""

    spec: str | None
    holders: dict[str, int]
    waiting: int
    next_start: float | None


def parse_cluster_limit(raw: object) -> PoolReply:
    """Parse a raw ``cluster_limit`` reply."""
    spec, flat, waiting, next_ms = _items(raw, 4)
    pairs = _items(flat or [], 0)
    holders = {_shown(pairs[k]): int(str(pairs[k + 1])) for k in range(0, len(pairs), 2)}
    return PoolReply(
        _text(spec),
        holders,
        int(str(waiting)),
        None if next_ms is None else _ms(next_ms),
    )
