"""A long-running service, as the how-to "Run a service" builds it, step by step.

Needs the ``prometheus`` extra (``pip install 'trio_taskvisor[prometheus]'``).

* **Signals.** ``open_supervisor(handle_signals=True)``: the first Ctrl+C or SIGTERM (what
  an orchestrator sends) cancels the service's body and shuts down gracefully; a second
  one forces the shutdown at once. The exit status is 128 + the signal, as shells expect.
* **Listening.** The HTTP server is started with ``sup.start``: ``trio.serve_tcp``
  reports its listeners through ``task_status``, so "listening" is printed when it is.
* **Readiness through the drain.** ``GET /ready`` on the health port is served by the
  application's own nursery, outside the supervisor: it answers 200 while the supervisor
  runs and 503 from the moment it drains (``sup.closing``; the outbox delivers what is
  still queued, 1 s, within the grace window), until the process exits.
* **Healthy pollers.** Pollers run for ever and fail now and then: ``healthy_after``
  resets their failure streak after a healthy stretch (the backoff starts over),
  ``restart_limit`` gives up on a crash loop instead of retrying it for ever, and
  ``retry_on`` retries only connection errors and timeouts.
* **Critical pollers.** The pollers are the service's key work: ``critical=True``, so a
  poller that gives up (a crash loop, revoked credentials) shuts the service down and it
  exits with status 1 (``CriticalTaskError``), for its orchestrator to restart it,
  instead of staying "ready" while doing nothing.
* **Webhooks.** ``POST /webhook/<tenant>`` replaces the tenant's running sync (REPLACE in
  slot ``tenant:<tenant>``); the syncs have no names of their own (``name=None``).
* **A JOIN cache.** ``GET /price`` refreshes a stale cache once, however many ask.
* **A periodic job** with an attempt timeout.
* **Metrics.** ``GET /metrics`` serves ``PrometheusSubscriber``'s registry.
* **JSON logs.** One JSON object per line: ``LoggingSubscriber``'s events with all
  their fields (it replaces the supervisor's own failure records, ``log_failures``).

    python examples/service.py                   # ports 8000 and 8001 (health), until Ctrl+C
    python examples/service.py --port 0 --health-port 0 --drive  # any ports; drive itself
    python examples/service.py --break-feed orders             # a key task gives up: exit 1

``--drive`` plays a few clients against the service (webhooks, prices, a scrape) and
prints what they got, then waits for Ctrl+C like the plain run. ``--break-feed`` revokes
a feed's credentials: its poller ends ``FATAL`` (a ``PermissionError`` is not worth a
retry) and, being critical, takes the service down.
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import random
import signal
import sys

import trio
from prometheus_client import CollectorRegistry, generate_latest

from trio_taskvisor import (
    AdmissionPolicy,
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    CriticalTaskError,
    Jitter,
    LoggingSubscriber,
    RestartLimit,
    Supervisor,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.contrib.prometheus import PrometheusSubscriber

# -- JSON logs -------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per record: the message, the level, every ``taskvisor_*`` field."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            key.removeprefix("taskvisor_"): value
            for key, value in vars(record).items()
            if key.startswith("taskvisor_") and value is not None
        }
        document = {"level": record.levelname, "message": record.getMessage(), **fields}
        return json.dumps(
            document, default=lambda v: v.value if isinstance(v, enum.Enum) else str(v)
        )


# -- the work --------------------------------------------------------------------------------

rng = random.Random(7)


async def poll(feed: str, revoked: bool) -> None:
    """Poll ``feed`` for ever; the network drops the connection now and then."""
    while True:
        await trio.sleep(0.2)
        if revoked:
            raise PermissionError(f"{feed}: credentials revoked")
        if rng.random() < 0.01:
            raise ConnectionError(f"{feed}: connection reset by peer")


async def outbox() -> None:
    """Deliver outgoing messages; on a stop, deliver what is still queued first."""
    try:
        await trio.sleep_forever()  # messages are delivered as they come
    finally:
        with current_context().defer_cancel():  # the drain, within the grace window
            await trio.sleep(1.0)
            print("outbox: queued messages delivered", flush=True)


async def sync_tenant(tenant: str, revision: int) -> int:
    """Bring ``tenant`` to ``revision``: slow enough for a newer webhook to replace it."""
    await trio.sleep(1.0)
    return revision


class PriceCache:
    """Prices, refreshed at most once at a time (JOIN), however many readers find them stale."""

    def __init__(self) -> None:
        self.version = 0
        self.refreshed_at = -float("inf")

    async def refresh(self) -> int:
        await trio.sleep(0.3)
        self.version += 1
        self.refreshed_at = trio.current_time()
        return self.version

    async def read(self, sup: Supervisor) -> int:
        if trio.current_time() - self.refreshed_at > 5.0:
            return await sup.run_in_slot("cache:prices", self.refresh, policy=AdmissionPolicy.JOIN)
        return self.version


async def compact() -> None:
    """The nightly job, every 2 s here; an overrun is cut at its 1 s timeout."""
    await trio.sleep(0.1)


# -- the HTTP front ----------------------------------------------------------------------------


class Front:
    """A minimal HTTP/1.0 front: webhooks, prices and metrics."""

    def __init__(self, sup: Supervisor, cache: PriceCache, registry: CollectorRegistry) -> None:
        self.sup = sup
        self.cache = cache
        self.registry = registry
        self.revisions: dict[str, int] = {}

    async def handle(self, stream: trio.SocketStream) -> None:
        request = await read_request(stream)
        if request is not None:
            await respond(stream, *await self.route(*request))

    async def route(self, method: str, path: str) -> tuple[str, bytes]:
        if method == "POST" and path.startswith("/webhook/"):
            tenant = path.removeprefix("/webhook/")
            revision = self.revisions[tenant] = self.revisions.get(tenant, 0) + 1
            sync = TaskSpec.once(None, sync_tenant, tenant, revision)  # named sync_tenant#N
            waiter = await self.sup.submit(ControllerSpec.replace(sync, slot=f"tenant:{tenant}"))
            return "202 Accepted", f"{waiter.name} for {tenant} r{revision}\n".encode()
        if method == "GET" and path == "/price":
            return "200 OK", f"prices v{await self.cache.read(self.sup)}\n".encode()
        if method == "GET" and path == "/metrics":
            return "200 OK", generate_latest(self.registry)
        return "404 Not Found", b"not found\n"


async def read_request(stream: trio.SocketStream) -> tuple[str, str] | None:
    """The method and path of one HTTP/1.0 request; ``None`` if the client left first."""
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        request += chunk
    method, path, _ = request.split(b"\r\n", 1)[0].decode().split(" ", 2)
    return method, path


async def respond(stream: trio.SocketStream, status: str, body: bytes) -> None:
    head = f"HTTP/1.0 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    await stream.send_all(head + body)


# -- health checks, outside the supervisor ------------------------------------------------------


async def serve_health(
    sup: Supervisor, port: int, *, task_status: trio.TaskStatus[list[trio.SocketListener]]
) -> None:
    """``/live`` and ``/ready``: run by the application's nursery, so they outlive the drain.

    ``/ready`` answers 503 from the moment the supervisor begins its shutdown (a signal,
    a critical task giving up): the orchestrator stops sending traffic while the
    supervisor drains, and the answer never turns into a refused connection before the
    process exits.
    """

    async def answer(stream: trio.SocketStream) -> None:
        request = await read_request(stream)
        if request is None:
            return
        if request == ("GET", "/live"):
            await respond(stream, "200 OK", b"alive\n")
        elif request == ("GET", "/ready"):
            if sup.closing:
                await respond(stream, "503 Service Unavailable", b"draining\n")
            else:
                await respond(stream, "200 OK", b"ready\n")
        else:
            await respond(stream, "404 Not Found", b"not found\n")

    await trio.serve_tcp(answer, port, task_status=task_status)


async def report_draining(sup: Supervisor) -> None:
    await sup.wait_closing()
    print("draining: /ready answers 503 until the process exits", flush=True)


# -- the service -------------------------------------------------------------------------------


async def serve(port: int, health_port: int, drive: bool, broken_feed: str | None) -> int:
    """Run the service until a signal or a critical task's failure; return its exit status."""
    registry = CollectorRegistry()
    metrics = PrometheusSubscriber(registry)
    events = LoggingSubscriber(logging.getLogger("service.events"))
    config = SupervisorConfig(grace=2.0, controller=ControllerConfig())
    cache = PriceCache()
    async with trio.open_nursery() as app:  # the application's own work, outside the supervisor
        try:
            async with open_supervisor(
                config, subscribers=[metrics, events], handle_signals=True
            ) as sup:
                metrics.bind(sup)
                health = await app.start(serve_health, sup, health_port)
                print(f"health checks on port {health[0].socket.getsockname()[1]}", flush=True)
                app.start_soon(report_draining, sup)
                front = Front(sup, cache, registry)
                # Listening: serve_tcp reports its listeners through task_status.
                server = await sup.start(
                    TaskSpec.restartable("http", trio.serve_tcp, front.handle, port)
                )
                listener = server.started_value[0]
                print(f"listening on port {listener.socket.getsockname()[1]}", flush=True)
                backoff = BackoffPolicy.exponential(0.5, max=30.0, jitter=Jitter.EQUAL)
                for feed in ("orders", "payments"):
                    poller = TaskSpec.restartable(
                        f"poll-{feed}",
                        poll,
                        feed,
                        feed == broken_feed,
                        backoff=backoff,
                        healthy_after=1.0,  # healthy after a second: a later blip is a new streak
                        restart_limit=RestartLimit(5, 10.0),  # a crash loop ends FAILED, loudly
                        retry_on=(ConnectionError, TimeoutError),  # anything else ends FATAL
                        critical=True,  # the service is useless without it: exit, be restarted
                    )
                    await sup.add(poller)
                await sup.add(TaskSpec.once("outbox", outbox))
                await sup.add(TaskSpec.periodic("compact", 2.0, compact, timeout=1.0))
                if drive:
                    await play_clients(listener.socket.getsockname()[1])
                print("ready: press Ctrl+C to stop", flush=True)
                await trio.sleep_forever()
        except CriticalTaskError as exc:
            print(f"exiting: {exc}", flush=True)
            status = 1
        else:
            signum = sup.received_signal
            name = signal.Signals(signum).name if signum else "its own end"
            print(f"stopped by {name}", flush=True)
            status = 0 if signum is None else 128 + signum
        app.cancel_scope.cancel(reason="the supervisor is done: stop the health checks")
    return status


async def request(port: int, method: str, path: str) -> str:
    """One HTTP request to the service; the response body."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(f"{method} {path} HTTP/1.0\r\n\r\n".encode())
        response = b""
        while chunk := await stream.receive_some(4096):
            response += chunk
    return response.split(b"\r\n\r\n", 1)[1].decode()


async def play_clients(port: int) -> None:
    """Webhooks that replace each other, readers sharing one refresh, a scrape."""
    for _ in range(2):
        print("webhook:", (await request(port, "POST", "/webhook/acme")).strip(), flush=True)
    prices: list[str] = []

    async def read_price() -> None:
        prices.append((await request(port, "GET", "/price")).strip())

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(read_price)
    print("prices:", ", ".join(prices), flush=True)
    await trio.sleep(1.2)  # the newest sync lands
    scrape = await request(port, "GET", "/metrics")
    for line in scrape.splitlines():
        if line.startswith("taskvisor_outcomes_total") and not line.endswith(" 0.0"):
            print("metrics:", line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="A supervised service, until Ctrl+C.")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--health-port", type=int, default=8001, help="/live and /ready")
    parser.add_argument("--drive", action="store_true", help="play a few clients first")
    parser.add_argument(
        "--break-feed", metavar="FEED", help="revoke FEED's credentials: the service exits 1"
    )
    args = parser.parse_args()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    return trio.run(serve, args.port, args.health_port, args.drive, args.break_feed)


if __name__ == "__main__":
    sys.exit(main())
