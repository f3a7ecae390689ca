"""The shared tier's own writes under faults between a replica and Redis, through the TCP fault
proxy (`faultproxy`), against a real redis-server: what redis-py's retries and a lost reply
must never do to a mind's published generations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from kvswap.cluster.procs import free_port, start_redis
from kvswap.core.keys import mind_key
from kvswap.tiers.shared.connection import connect
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.store import Fetched, SharedStore
from kvswap.tiers.shared.token_log import TokenLog
from tests.cluster.faultproxy import FaultProxy, Mode
from tests.cluster.util import RedisServer, grown_page, incarnation, synthetic_page

pytestmark = pytest.mark.timeout(120)
MIND_KEY = mind_key("public", "faults")
MIND = MindKeys.of(MIND_KEY)


@pytest.fixture()
def proxy(redis_server: RedisServer, rclient: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


def _lease(client: redis.Redis) -> Lease:
    got = Leases(client, incarnation("r1"), ttl_ms=60_000).acquire(MIND)
    assert isinstance(got, Lease)
    return got


def test_a_commit_whose_reply_is_lost_keeps_the_generation_it_committed(
    proxy: FaultProxy, rclient: redis.Redis
) -> None:
    """Audit A1: redis-py re-sends a COMMIT whose reply was lost; the commit had landed. Before
    the fix the retry answered 'base moved', the publisher unlinked the chunks the committed
    manifest references, and every later delta built on the hole (every fetch a miss)."""
    client = connect(proxy.url)
    drop_at = {2}

    def lose_the_commits_reply(gen: int) -> None:
        if gen in drop_at:
            proxy.set(Mode.DROP_REPLY, n_drops=1)  # the next reply is the COMMIT's

    store = SharedStore(
        client, replica_id="r1", chunk_bytes=65536, after_chunks=lose_the_commits_reply
    )
    try:
        lease = _lease(client)
        page1, layout1 = synthetic_page(1000, 600_000)
        assert store.publish(lease, MIND_KEY, page1, layout1).gen == 1
        page2, layout2 = grown_page(page1, layout1, 10, 6_000)
        second = store.publish(lease, MIND_KEY, page2, layout2)
        assert proxy.n_replies_dropped == 1
        assert second.delta and int(rclient.hget(MIND.manifest, "gen") or 0) == second.gen
        got = store.fetch(MIND)
        assert isinstance(got, Fetched), got
        assert got.page.tobytes() == page2[: layout2.n_bytes].tobytes()
        page3, layout3 = grown_page(page2, layout2, 10, 6_000, seed=2)
        third = store.publish(lease, MIND_KEY, page3, layout3)
        assert third.delta
        got = store.fetch(MIND)
        assert isinstance(got, Fetched), got
        assert got.page.tobytes() == page3[: layout3.n_bytes].tobytes()
    finally:
        store.close()
        client.close()


def test_a_reused_chunk_that_is_gone_makes_the_next_publication_whole(
    rclient: redis.Redis,
) -> None:
    """Audit A1: COMMIT checked only the new generation's chunks; a delta that reuses an older
    chunk someone removed committed a page no reader could rebuild."""
    store = SharedStore(rclient, replica_id="r1", chunk_bytes=65536)
    try:
        lease = _lease(rclient)
        page1, layout1 = synthetic_page(1000, 600_000)
        store.publish(lease, MIND_KEY, page1, layout1)
        assert rclient.delete(MIND.chunk(1, 0)) == 1
        page2, layout2 = grown_page(page1, layout1, 10, 6_000)
        again = store.publish(lease, MIND_KEY, page2, layout2)
        assert not again.delta  # replanned whole: it reuses nothing
        got = store.fetch(MIND)
        assert isinstance(got, Fetched), got
        assert got.page.tobytes() == page2[: layout2.n_bytes].tobytes()
    finally:
        store.close()


def test_the_chunks_of_an_unreadable_manifest_are_removed_by_the_next_publication(
    rclient: redis.Redis,
) -> None:
    """Audit C5: a base manifest that cannot be decoded (a format change, a damaged body) left
    every chunk it referenced in Redis forever, counted nowhere."""
    store = SharedStore(rclient, replica_id="r1", chunk_bytes=65536)
    try:
        lease = _lease(rclient)
        page, layout = synthetic_page(1000, 600_000)
        store.publish(lease, MIND_KEY, page, layout)
        assert rclient.exists(MIND.chunk(1, 0))
        rclient.hset(MIND.manifest, "body", b"{not a manifest")
        store.publish(lease, MIND_KEY, page, layout)
        pattern = MIND.chunk(0, 0).rsplit(":", 2)[0] + ":g*"
        left = {k.decode().removeprefix(pattern[:-2]) for k in rclient.scan_iter(match=pattern)}
        assert "gens" in left and {k.split(":")[0] for k in left - {"gens"}} == {"g2"}, left
    finally:
        store.close()


def test_token_logs_and_manifests_are_budgeted_so_a_capped_redis_never_fills(
    tmp_path: Path,
) -> None:
    """Audit C1: the budget counted chunk bytes only; token logs, manifests and the keys
    beside them grew uncounted, a Redis at `maxmemory` (noeviction) then refused every write,
    new leases included, so every mind no replica held answered 503. Now everything a mind
    stores is charged, the least recently used minds degrade to tokens-only and, unheld, leave
    the tier: 40 minds of long conversations through a Redis capped at 4/3 of the budget."""
    port = free_port()
    budget = 6 << 20
    # 4/3 of the budget (the shipped ratio), and the megabyte an empty Redis uses already
    proc = start_redis(port, tmp_path, tmp_path / "redis.log", persistent=False,
                       maxmemory_bytes=budget * 4 // 3 + (1 << 20))  # fmt: skip
    client = connect(f"redis://127.0.0.1:{port}/0")
    # chunks just under a jemalloc size class, as the default is (chunks.DEFAULT_CHUNK_BYTES)
    store = SharedStore(client, replica_id="r1", chunk_bytes=65536 - 64, budget_bytes=budget)
    log = TokenLog(client)
    leases = Leases(client, incarnation("r1"), ttl_ms=60_000)
    try:
        for i in range(40):
            key = mind_key("public", f"long-{i}")
            lease = leases.acquire(MindKeys.of(key))
            assert isinstance(lease, Lease)
            log.append(lease, "t1", 0, np.arange(20_000, dtype=np.int32))  # 80 KB of log
            store.publish(lease, key, *synthetic_page(20_000, 200_000, seed=i))
            leases.release(lease)  # idle: released, as a replica does
        assert store.budget is not None and store.budget.total_bytes() <= budget
        last = MindKeys.of(mind_key("public", "long-39"))
        assert isinstance(store.fetch(last), Fetched)  # the newest is whole
        assert store.counters()["n_degraded"] > 0
    finally:
        store.close()
        client.close()
        proc.stop()
