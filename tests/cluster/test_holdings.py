"""The leases a replica holds (`tiers.shared.holdings.Holdings`), renewed against a real
redis-server: many minds, a slow link, a lost lease, a failing pass.

- 50,000 held minds over a link with 1 ms each way (the fault proxy's delay) keep every lease
  through two lease periods: renewals go in pipelines, not one round trip per mind (which
  takes 100 s a pass over this link).
- A lease another replica took, whose handling blocks (forgetting a mind waits on a demoter
  spill that holds its lock for seconds), never holds up the other minds' renewals.
- A renewal pass that raises an unexpected error is logged and counted, and the next pass
  runs: the thread keeps renewing, and /health's view of it says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from kvswap.core.keys import PageKey, mind_key
from kvswap.tiers.shared.connection import connect
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.holdings import Held, Holdings
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Leases
from tests.cluster.faultproxy import FaultProxy, Mode
from tests.cluster.util import RedisServer, incarnation, wait_until

pytestmark = pytest.mark.timeout(180)


def _holdings(client: redis.Redis, ttl_ms: int, on_lost: object = None) -> Holdings:
    return Holdings(
        client,
        Leases(client, incarnation("r1"), ttl_ms),
        prefix="kv",
        health=TierHealth(),
        busy=lambda _: False,
        on_lost=on_lost or (lambda _: None),  # type: ignore[arg-type]
    )


def _fences(client: redis.Redis, keys: list[PageKey]) -> list[int]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(MindKeys.of(key).fence)
    return [int(v or 0) for v in pipe.execute()]


def _held_now(client: redis.Redis, keys: list[PageKey]) -> int:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.exists(MindKeys.of(key).lease)
    return sum(pipe.execute())


@pytest.fixture()
def proxy(redis_server: RedisServer, rclient: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


def test_fifty_thousand_held_minds_keep_their_leases_over_a_slow_link(
    proxy: FaultProxy, rclient: redis.Redis
) -> None:
    """Audit A2: the renewal thread made one round trip per held mind, so past about TTL/RTT
    minds (10,000 at 0.5 ms) every lease lapsed each pass and was taken again (fence moved),
    and live owners' forwarded turns were abandoned."""
    client = connect(proxy.url)
    ttl_ms = 10_000
    holdings = _holdings(client, ttl_ms=ttl_ms)
    keys = [mind_key("ns", f"m{i}") for i in range(50_000)]
    try:
        holdings.start()  # renewing from the start: no lease lapses while the rest are taken
        for key in keys:
            holdings.take(key)
        proxy.set(Mode.DELAY, delay_ms=1)  # 2 ms a round trip from now on
        time.sleep(ttl_ms * 2 / 1000)  # two lease periods
        assert _held_now(rclient, keys) == len(keys)
        assert set(_fences(rclient, keys)) == {1}  # never lapsed, never taken again
        (view,) = holdings.threads()
        assert view.alive and view.n_failures == 0
    finally:
        holdings.stop()
        client.close()


def test_a_lost_lease_that_blocks_never_holds_up_the_other_renewals(
    rclient: redis.Redis,
) -> None:
    """Audit A4: `on_lost` ran inline in the renewal thread; forgetting the lost mind waited
    for a demoter spill of seconds, and meanwhile every other lease lapsed."""
    release = threading.Event()
    lost: list[PageKey] = []

    def slow_forget(held: Held) -> None:
        lost.append(held.key)
        release.wait(15)  # a demoter spill holding the lock

    holdings = _holdings(rclient, ttl_ms=600, on_lost=slow_forget)
    keys = [mind_key("ns", f"m{i}") for i in range(20)]
    try:
        for key in keys:
            holdings.take(key)
        holdings.start()
        stolen = MindKeys.of(keys[0])
        rclient.set(stolen.lease, b"r2 http://r2:1 other", px=60_000)
        rclient.incr(stolen.fence)
        wait_until(lambda: lost == [keys[0]], 10, "the stolen lease to be found lost")
        time.sleep(600 * 3 / 1000)  # three lease periods while the forget is blocked
        assert _held_now(rclient, keys[1:]) == len(keys) - 1
        assert set(_fences(rclient, keys[1:])) == {1}
    finally:
        release.set()
        holdings.stop()


def test_a_pass_that_fails_is_logged_and_the_next_one_runs(rclient: redis.Redis) -> None:
    """Audit A4: an unexpected exception (a bug, a MemoryError, a TimeoutError of the engine)
    killed the renewal thread for good, and every idle lease then expired silently."""
    holdings = _holdings(rclient, ttl_ms=600)
    key = mind_key("ns", "alice")
    renew_many = holdings.leases.renew_many
    n_calls = [0]

    def fails_once(leases: list[object]) -> list[int]:
        n_calls[0] += 1
        if n_calls[0] == 1:
            raise ValueError("an unexpected error")
        return renew_many(leases)  # type: ignore[arg-type]

    holdings.leases.renew_many = fails_once  # type: ignore[method-assign]
    try:
        holdings.take(key)
        holdings.start()
        wait_until(lambda: n_calls[0] >= 3, 10, "renewal passes after the failure")
        (view,) = holdings.threads()
        assert view.alive and view.n_failures == 1 and "an unexpected error" in view.last_error
        time.sleep(0.7)
        assert _fences(rclient, [key]) == [1] and _held_now(rclient, [key]) == 1
    finally:
        holdings.stop()
