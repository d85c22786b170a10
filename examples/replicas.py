"""Several replicas: one singleton job across two processes, and a fenced database write.

Needs the ``redis`` extra (``pip install 'trio_taskvisor[redis]'``) and a Redis 6.2+ or
Valkey 7.2+ server; by default ``redis://127.0.0.1:6379/0`` (``--url`` for another).

The program starts two replicas of a "service" (this file again, as two subprocesses).
Each opens a supervisor whose controller has a ``RedisSlotStore``, and submits the same
two "nightly report" runs to the slot ``nightly-report``: the four runs are served one
at a time, cluster-wide, in the order the server queued them. Each run writes its report
to a SQLite database with its fence token, in one statement that refuses a token older
than the stored one (the fenced write).

The first run cluster-wide then blocks its event loop for longer than the lease TTL
(synchronous code, as a long computation or a GC pause would). Its process cannot renew
the lease meanwhile, so the lease expires and the other replica's run takes the slot and
writes, with a higher token. When the blocked run resumes, its write is refused by the
database, and its owner ends ``LEASE_LOST`` at its next checkpoint. That is what fence
tokens are for: the lease alone cannot stop a process that does not notice it lost it.
"""

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from trio_taskvisor import (
    ControllerConfig,
    ControllerSpec,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.redis import RedisSlotStore

LEASE_TTL = 1.0  # short for the example; services use 10 s or more
STALL = 2.5 * LEASE_TTL  # blocking code, long enough for the lease to expire


# -- the database: SQLite, shared by the replicas through a file ---------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (name TEXT PRIMARY KEY, body TEXT, fence INTEGER);
CREATE TABLE IF NOT EXISTS runs (replica TEXT, run TEXT, fence INTEGER, started REAL,
                                 ended REAL, written INTEGER);
CREATE TABLE IF NOT EXISTS stalls (name TEXT PRIMARY KEY);
"""

# The fenced write: the row changes only if no newer owner has written (a higher token).
FENCED_WRITE = """
INSERT INTO reports (name, body, fence) VALUES (?, ?, ?)
ON CONFLICT (name) DO UPDATE SET body = excluded.body, fence = excluded.fence
WHERE excluded.fence >= reports.fence
"""


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None)  # autocommit
    db.executescript(SCHEMA)
    return db


def fenced_write(db: sqlite3.Connection, body: str, fence: int) -> bool:
    """Write the report unless a newer owner did; return whether it was written."""
    return db.execute(FENCED_WRITE, ("nightly", body, fence)).rowcount == 1


# -- one replica ------------------------------------------------------------------------------


def say(replica: str, text: str) -> None:
    print(f"[{replica}] {text}", flush=True)


async def nightly_report(replica: str, run: str, path: str) -> str:
    token = current_context().fence_token
    assert token is not None  # a cluster slot: every owner has one
    db = connect(path)
    started = time.monotonic()  # system-wide on Linux: comparable across processes
    say(replica, f"{run} started, fence token {token}")
    await trio.sleep(0.1)  # gather the figures
    if db.execute("INSERT OR IGNORE INTO stalls VALUES ('first')").rowcount:
        say(replica, f"{run} blocks its event loop for {STALL:g} s (synchronous code)")
        time.sleep(STALL)  # noqa: ASYNC251 - the point: nothing else runs meanwhile
    written = fenced_write(db, f"report of {run} by {replica}", token)
    db.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
        (replica, run, token, started, time.monotonic(), written),
    )
    if not written:
        stored = db.execute("SELECT fence FROM reports").fetchone()[0]
        say(replica, f"{run}: write refused, token {token} is older than {stored}")
    await trio.sleep(0.1)  # publish it: a checkpoint, where a lost lease is noticed
    return "written" if written else "refused"


async def replica_main(name: str, url: str, path: str, namespace: str) -> None:
    store = RedisSlotStore(url, namespace=namespace, lease_ttl=LEASE_TTL, connect_timeout=2.0)
    config = SupervisorConfig(grace=1.0, controller=ControllerConfig(slot_store=store))
    async with open_supervisor(config) as sup:
        say(name, f"ready as {sup.instance_id}")
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go": both replicas are ready
        waiters = []
        for i in (1, 2):
            run = f"run {name}{i}"
            spec = TaskSpec.once(run, nightly_report, name, run, path)
            request = ControllerSpec.queue(spec, slot="nightly-report", wait=True)
            waiters.append(await sup.submit(request))
        for waiter in waiters:
            outcome = await waiter.wait()
            detail = outcome.value if outcome.reason is None else outcome.reason
            say(name, f"{waiter.name}: {outcome.kind.name} ({detail})")


# -- the launcher -------------------------------------------------------------------------------


async def launch(url: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "reports.db")
        connect(path).close()
        namespace = f"replicas-example-{os.getpid()}"  # a fresh namespace per run
        ready = Ready(2)
        async with trio.open_nursery() as nursery:
            for name in ("a", "b"):
                command = [sys.executable, __file__, "--url", url, "--replica", name]
                command += ["--db", path, "--namespace", namespace]
                nursery.start_soon(run_replica, command, ready)
        summarize(connect(path))


class Ready:
    """Counts replicas that are ready; releases them all together."""

    def __init__(self, count: int) -> None:
        self.missing = count
        self.all = trio.Event()

    def one(self) -> None:
        self.missing -= 1
        if not self.missing:
            self.all.set()


async def run_replica(command: list[str], ready: Ready) -> None:
    """Run one replica: pass its output on; tell it "go" once every replica is ready."""
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None
    assert stdout is not None
    try:
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                await ready.all.wait()
                await stdin.send_all(b"go\n")

            nursery.start_soon(go)
            buffer = b""
            while chunk := await stdout.receive_some():
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    print(line.decode(), flush=True)
                    if b"ready as" in line:
                        ready.one()
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await stdin.aclose()
        await stdout.aclose()
    if process.returncode:
        raise RuntimeError(f"replica {command[-3]} exited with {process.returncode}")


def summarize(db: sqlite3.Connection) -> None:
    runs = db.execute("SELECT run, fence, started, ended, written FROM runs ORDER BY fence")
    rows = runs.fetchall()
    tokens = [fence for _, fence, *_ in rows]
    blocked = rows[0]  # the first run, which blocked: the lowest token
    overlapped = [run for run, _, started, *_ in rows[1:] if started < blocked[3]]
    written = sum(1 for *_, ok in rows if ok)
    print(f"{len(rows)} runs, fence tokens increasing: {tokens == sorted(set(tokens))}")
    print(f"runs that started while the blocked one still ran: {len(overlapped) > 0}")
    print(f"fenced writes: {written} accepted, {len(rows) - written} refused")
    (fence,) = db.execute("SELECT fence FROM reports").fetchone()
    print(f"the stored report has the highest token: {fence == max(tokens)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--replica", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replica:
        trio.run(replica_main, args.replica, args.url, args.db, args.namespace)
    else:
        trio.run(launch, args.url)


if __name__ == "__main__":
    main()
