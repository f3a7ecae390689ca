"""The shared page store against a real redis-server: whole generations or typed misses,
fenced publishes, a write-through token log, and kvswap's own byte budget."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from kvswap.core.keys import mind_key
from kvswap.tiers.shared.errors import Miss, MissReason, StaleOwner, TierUnavailable
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.store import Fetched, SharedStore
from kvswap.tiers.shared.token_log import TokenLog
from tests.cluster import publish_child
from tests.cluster.util import RedisServer, incarnation, synthetic_page, wait_lease_free

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
MIND_KEY = mind_key("public", "alice")
MIND = MindKeys.of(MIND_KEY)
Store = Callable[..., SharedStore]


def _lease(
    client: redis.Redis, keys: MindKeys = MIND, who: str = "r1", ttl_ms: int = 30_000
) -> Lease:
    got = Leases(client, incarnation(who), ttl_ms=ttl_ms).acquire(keys)
    assert isinstance(got, Lease)
    return got


def chunk_keys(client: redis.Redis, keys: MindKeys, gen: int | None = None) -> list[bytes]:
    """The mind's chunk keys in Redis (of one generation, or all)."""
    pattern = keys.chunk(gen, 0)[:-1] + "*" if gen is not None else keys.chunk(0, 0)[:-4] + "[0-9]*"
    return list(client.scan_iter(match=pattern, count=1000))


def _fetch_ok(store: SharedStore, keys: MindKeys = MIND) -> Fetched:
    got = store.fetch(keys)
    assert isinstance(got, Fetched), got
    return got


def test_round_trip_in_many_chunks(rclient: redis.Redis, make_store: Store) -> None:
    store = make_store(chunk_bytes=65536)
    page, layout = synthetic_page(3000, 1_000_000)
    receipt = store.publish(_lease(rclient), MIND_KEY, page, layout)
    assert receipt.gen == 1 and not receipt.delta
    assert receipt.n_chunks == -(-receipt.n_bytes_written // 65536) > 10
    got = _fetch_ok(make_store(replica_id="r2", chunk_bytes=1 << 20))  # any reader's chunk size
    assert got.page.tobytes() == page.tobytes()
    assert got.layout == layout
    assert (got.manifest.gen, got.manifest.n_tokens, got.manifest.replica_id) == (1, 3000, "r1")
    assert got.manifest.fingerprint == layout.geometry.file_fingerprint()


def test_a_reader_never_sees_a_half_written_generation(
    rclient: redis.Redis, redis_server: RedisServer, make_store: Store
) -> None:
    """A writer killed between its chunks and its manifest: the old generation stays whole,
    and the new generation's chunks are left to expire."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.publish_child", str(redis_server.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["published", "1"]
        assert child.stdout.readline().split() == ["chunks", "2"]
        child.kill()
    finally:
        child.kill()
        child.wait(30)
    keys = MindKeys.of(publish_child.MIND_KEY)
    got = _fetch_ok(make_store(), keys)
    assert got.manifest.gen == 1
    page_a, _ = synthetic_page(publish_child.N_TOKENS, publish_child.TARGET_BYTES, seed=1)
    assert got.page.tobytes() == page_a.tobytes()
    orphans = chunk_keys(rclient, keys, gen=2)
    assert orphans, "the killed writer's chunks were written"
    assert all(0 < rclient.pttl(k) <= 3_600_000 for k in orphans)  # they expire by themselves


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_chunk_is_a_counted_miss(
    rclient: redis.Redis, make_store: Store, damage: str
) -> None:
    store = make_store(chunk_bytes=65536)
    page, layout = synthetic_page(1000, 500_000)
    store.publish(_lease(rclient), MIND_KEY, page, layout)
    victim = MIND.chunk(1, 3)
    if damage == "flip":
        byte = rclient.getrange(victim, 1000, 1000)
        rclient.setrange(victim, 1000, bytes([byte[0] ^ 0x01]))
    else:
        rclient.delete(victim)
    got = store.fetch(MIND)
    want = MissReason.CHUNK_CORRUPT if damage == "flip" else MissReason.CHUNK_MISSING
    assert isinstance(got, Miss) and got.reason == want and got.gen == 1
    assert victim in got.detail
    assert store.counters()["misses"] == {want.value: 1}


def test_misses_without_a_usable_page(rclient: redis.Redis, make_store: Store) -> None:
    store = make_store()
    absent = store.fetch(MIND)
    assert isinstance(absent, Miss) and absent.reason == MissReason.ABSENT
    page, layout = synthetic_page(100, 10_000)
    store.publish(_lease(rclient), MIND_KEY, page, layout)
    other = store.fetch(MIND, fingerprint="sha256:another-model;k=f16;v=f16")
    assert isinstance(other, Miss) and other.reason == MissReason.FINGERPRINT
    rclient.hset(MIND.manifest, "body", b"{not json")
    broken = store.fetch(MIND)
    assert isinstance(broken, Miss) and broken.reason == MissReason.MANIFEST_CORRUPT


def test_a_stale_owner_cannot_publish(rclient: redis.Redis, make_store: Store) -> None:
    """A froze past its lease; B took the mind and published. A's publish is refused in Redis
    before it writes a chunk, and B's generation stays the latest."""
    leases_b = Leases(rclient, incarnation("r2"))
    store_a, store_b = make_store("r1"), make_store("r2")
    a = _lease(rclient, who="r1", ttl_ms=150)
    gens = [store_a.publish(a, MIND_KEY, *synthetic_page(100, 50_000, seed=1)).gen]
    wait_lease_free(leases_b, MIND)
    b = leases_b.acquire(MIND)
    assert isinstance(b, Lease) and b.fence == a.fence + 1
    page_b, layout_b = synthetic_page(120, 50_000, seed=2)
    gens.append(store_b.publish(b, MIND_KEY, page_b, layout_b).gen)
    with pytest.raises(StaleOwner):
        store_a.publish(a, MIND_KEY, *synthetic_page(130, 50_000, seed=3))
    assert store_a.counters()["n_publish_stale"] == 1
    got = _fetch_ok(store_b)
    assert got.page.tobytes() == page_b.tobytes() and got.manifest.fence == b.fence
    assert got.manifest.gen == gens[-1] > gens[0]


def test_a_lease_lost_between_chunks_and_commit(rclient: redis.Redis, make_store: Store) -> None:
    leases_b = Leases(rclient, incarnation("r2"))
    store_b = make_store("r2")
    page_b, layout_b = synthetic_page(50, 20_000, seed=5)
    taken: list[int] = []

    def lose_lease(gen: int) -> None:  # A freezes after writing its chunks
        wait_lease_free(leases_b, MIND)
        b = leases_b.acquire(MIND)
        assert isinstance(b, Lease)
        taken.append(store_b.publish(b, MIND_KEY, page_b, layout_b).gen)

    store_a = make_store("r1", after_chunks=lose_lease, chunk_bytes=4096)
    a = _lease(rclient, who="r1", ttl_ms=150)
    with pytest.raises(StaleOwner):
        store_a.publish(a, MIND_KEY, *synthetic_page(60, 20_000, seed=6))
    got = _fetch_ok(store_b)
    assert got.page.tobytes() == page_b.tobytes()
    assert got.manifest.gen == taken[0] > 1  # A's generation number 1 never committed
    assert not chunk_keys(rclient, MIND, gen=1)  # A's chunks are gone


def test_redis_down_fails_publishes_visibly(tmp_path: Path) -> None:
    server = RedisServer.start(tmp_path / "redis")
    client = server.client()
    store = SharedStore(client, replica_id="r1")
    try:
        lease = _lease(client)
        page, layout = synthetic_page(100, 10_000)
        store.publish(lease, MIND_KEY, page, layout)
        server.stop()
        with pytest.raises(TierUnavailable):
            store.publish(lease, MIND_KEY, page, layout)
        with pytest.raises(TierUnavailable):
            TokenLog(client).append(lease, "t", 0, [1])
        with pytest.raises(TierUnavailable):
            Leases(client, incarnation("r2")).acquire(MIND)
        got = store.fetch(MIND)
        assert isinstance(got, Miss) and got.reason == MissReason.UNAVAILABLE
        assert store.counters()["n_publish_failed"] == 1
    finally:
        store.close()
        client.close()
        server.stop()


def test_budget_degrades_the_least_recently_used_to_tokens_only(
    rclient: redis.Redis, make_store: Store
) -> None:
    page_bytes = synthetic_page(100, 200_000)[1].n_bytes
    store = make_store(budget_bytes=int(2.5 * page_bytes), chunk_bytes=65536)
    names = [mind_key("public", f"m{n}") for n in (1, 2, 3)]
    keys = [MindKeys.of(n) for n in names]
    leases = [_lease(rclient, k) for k in keys]
    log = TokenLog(rclient)
    for i in (0, 1):
        store.publish(leases[i], names[i], *synthetic_page(100, 200_000, seed=i))
        log.append(leases[i], "t1", 0, [i, i, i])
    _fetch_ok(store, keys[0])  # mind 1 is used again: mind 2 is now the least recently used
    receipt = store.publish(leases[2], names[2], *synthetic_page(100, 200_000, seed=2))
    assert receipt.n_degraded == 1
    degraded = store.fetch(keys[1])
    assert isinstance(degraded, Miss) and degraded.reason == MissReason.TOKENS_ONLY
    assert not chunk_keys(rclient, keys[1])
    assert log.read(keys[1]).tolist() == [1, 1, 1]  # its tokens stay
    for i in (0, 2):
        got = _fetch_ok(store, keys[i])
        assert got.page.tobytes() == synthetic_page(100, 200_000, seed=i)[0].tobytes()
    assert store.budget is not None and store.budget.total_bytes() <= store.budget.budget_bytes
    # its owner publishes again: a whole page (its chunks are gone), and the LRU mind goes
    again = store.publish(leases[1], names[1], *synthetic_page(100, 200_000, seed=1))
    assert not again.delta and again.n_degraded == 1
    assert isinstance(store.fetch(keys[0]), Miss)


def test_a_page_over_the_whole_budget_is_published_tokens_only(
    rclient: redis.Redis, make_store: Store
) -> None:
    store = make_store(budget_bytes=100_000)
    receipt = store.publish(_lease(rclient), MIND_KEY, *synthetic_page(100, 200_000))
    assert receipt.tokens_only and receipt.n_bytes_written == 0
    got = store.fetch(MIND)
    assert isinstance(got, Miss) and got.reason == MissReason.TOKENS_ONLY


def test_drop_removes_the_mind_and_only_its_owner_may(
    rclient: redis.Redis, make_store: Store
) -> None:
    store = make_store(budget_bytes=10_000_000)
    lease = _lease(rclient, ttl_ms=150)
    store.publish(lease, MIND_KEY, *synthetic_page(100, 100_000))
    TokenLog(rclient).append(lease, "t1", 0, [1, 2])
    wait_lease_free(Leases(rclient, incarnation("r2")), MIND)
    with pytest.raises(StaleOwner):
        store.drop(lease)
    assert isinstance(store.fetch(MIND), Fetched)
    owner = _lease(rclient, who="r2")
    store.drop(owner)
    gone = store.fetch(MIND)
    assert isinstance(gone, Miss) and gone.reason == MissReason.ABSENT
    assert not chunk_keys(rclient, MIND) and not rclient.exists(MIND.tokens, MIND.turns)
    assert store.budget is not None and store.budget.total_bytes() == 0
    assert rclient.get(MIND.gens) == b"1"  # generation numbers never restart
