"""The fault proxy itself, between redis-py and a real redis-server: each mode does what the
fault-injection tests will rely on, switched at run time on a connection already open.

- pass: commands and replies go through;
- delay: a round trip takes at least the delay;
- drop the reply: the command ran in Redis (read back directly) but the client got no answer;
- reset: the open connection fails at once with a reset, and new ones too, until switched back;
- blackhole: the client's own timeout fires and the command never reached Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.cluster.faultproxy import FaultProxy, Mode
from tests.cluster.util import RedisServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def proxy(redis_server: RedisServer, rclient: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


def _through(proxy: FaultProxy, timeout_s: float = 5.0) -> redis.Redis:
    """A client through the proxy that never retries (each fault shows as it is)."""
    return redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )


def test_pass_and_delay(proxy: FaultProxy, rclient: redis.Redis) -> None:
    client = _through(proxy)
    assert client.set("k", b"v") and client.get("k") == b"v"
    assert rclient.get("k") == b"v"
    proxy.set(Mode.DELAY, delay_ms=300)
    t0 = time.monotonic()
    assert client.get("k") == b"v"  # same connection: the delay applies to it at once
    assert time.monotonic() - t0 >= 0.3 * 2  # the request and the reply each wait 300 ms
    proxy.set(Mode.PASS)
    assert client.ping()
    client.close()


def test_drop_reply_runs_the_command_but_answers_nothing(
    proxy: FaultProxy, rclient: redis.Redis
) -> None:
    client = _through(proxy)
    assert client.ping()  # the connection is open before the fault
    proxy.set(Mode.DROP_REPLY)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.incr("counter")
    assert rclient.get("counter") == b"1"  # it ran: only the reply was lost
    assert proxy.n_replies_dropped == 1
    proxy.set(Mode.PASS)
    assert client.incr("counter") == 2  # a new connection works again
    client.close()


def test_reset_cuts_open_and_new_connections(proxy: FaultProxy, rclient: redis.Redis) -> None:
    client = _through(proxy)
    assert client.ping()
    n_before = proxy.n_connections
    proxy.set(Mode.RESET)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.set("k", b"v")  # the open connection was reset, and the new one too
    assert proxy.n_connections > n_before
    assert rclient.get("k") is None
    proxy.set(Mode.PASS)
    assert client.set("k", b"v") and rclient.get("k") == b"v"
    client.close()


def test_blackhole_swallows_everything(proxy: FaultProxy, rclient: redis.Redis) -> None:
    client = _through(proxy, timeout_s=0.5)
    assert client.ping()
    proxy.set(Mode.BLACKHOLE)
    with pytest.raises(redis.exceptions.TimeoutError):
        client.set("k", b"v")
    fresh = _through(proxy, timeout_s=0.5)  # a new connection is accepted, then silence
    with pytest.raises(redis.exceptions.TimeoutError):
        fresh.ping()
    assert rclient.get("k") is None  # nothing reached Redis
    proxy.set(Mode.PASS)
    assert _through(proxy).ping()
    client.close()
    fresh.close()
