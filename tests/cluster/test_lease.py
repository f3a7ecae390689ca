"""Per-mind leases in a real Redis: one holder at a time, fences that only grow, and every
fenced mutation of a holder that lost its lease refused inside Redis."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import redis

from kvswap.core.keys import mind_key
from kvswap.tiers.shared.errors import StaleOwner
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, LeaseHolder, Leases
from kvswap.tiers.shared.token_log import TokenLog
from tests.cluster.util import incarnation, wait_lease_free

pytestmark = pytest.mark.timeout(120)
MIND = MindKeys.of(mind_key("public", "alice"))


def test_one_holder_and_a_new_fence_per_acquisition(rclient: redis.Redis) -> None:
    a = Leases(rclient, incarnation("r1"))
    b = Leases(rclient, incarnation("r2"))
    first = a.acquire(MIND)
    assert isinstance(first, Lease) and first.fence == 1
    again = a.acquire(MIND)  # ours already: the TTL is extended, the fence stays
    assert isinstance(again, Lease) and again.fence == 1
    seen = b.acquire(MIND)
    assert isinstance(seen, LeaseHolder)
    assert (seen.replica_id, seen.advertise_url, seen.fence) == ("r1", "http://127.0.0.1:1/r1", 1)
    assert 0 < seen.ttl_left_ms <= a.ttl_ms
    assert not b.release(Lease(MIND, b.incarnation, 1, b.ttl_ms))  # not b's to release
    assert a.release(first)
    assert b.holder(MIND) is None
    taken = b.acquire(MIND)
    assert isinstance(taken, Lease) and taken.fence == 2
    assert not a.renew(first) and not a.release(first)  # a's old lease is dead
    assert b.renew(taken)


def test_a_restarted_replica_does_not_inherit_its_leases(rclient: redis.Redis) -> None:
    before = Leases(rclient, incarnation("r1"))
    held = before.acquire(MIND)
    assert isinstance(held, Lease)
    after = Leases(rclient, incarnation("r1"))  # same replica id, new process incarnation
    assert isinstance(after.acquire(MIND), LeaseHolder)
    assert not after.renew(Lease(MIND, after.incarnation, held.fence, after.ttl_ms))


def test_an_expired_holder_is_fenced_off(rclient: redis.Redis) -> None:
    log = TokenLog(rclient)
    a = Leases(rclient, incarnation("r1"), ttl_ms=150)
    b = Leases(rclient, incarnation("r2"), ttl_ms=5000)
    old = a.acquire(MIND)
    assert isinstance(old, Lease)
    log.append(old, "t1", 0, [1, 2, 3])
    wait_lease_free(b, MIND)  # a froze past its TTL
    new = b.acquire(MIND)
    assert isinstance(new, Lease) and new.fence == old.fence + 1
    with pytest.raises(StaleOwner):
        log.append(old, "t2", 3, [4])
    assert not a.renew(old)
    log.append(new, "t2", 3, [9])
    assert log.read(MIND).tolist() == [1, 2, 3, 9]
    assert log.counters()["n_stale"] == 1


def test_exclusive_over_many_acquisitions_and_expiries(rclient: redis.Redis) -> None:
    """Three contenders take, use, release or abandon one mind's lease, 45 acquisitions in all.
    Every accepted fenced write is logged (fence, contender) in the mind's token log by Redis
    itself: the log shows one holder per fence, fences in increasing order, and no write of a
    holder after the next acquisition, although abandoned holders wake up and keep writing."""
    n_contenders, n_acquisitions = 3, 45
    store = TokenLog(rclient)
    port = rclient.connection_pool.connection_kwargs["port"]
    clients = [redis.Redis(port=port) for _ in range(n_contenders)]
    stale_attempts = [0] * n_contenders
    stale_refused = [0] * n_contenders
    acquired = [0]
    count_lock = threading.Lock()
    errors: list[BaseException] = []

    def contender(cid: int) -> None:
        rng = random.Random(cid)
        leases = Leases(clients[cid], incarnation(f"c{cid}"), ttl_ms=200)
        abandoned: Lease | None = None
        try:
            while True:
                with count_lock:
                    if acquired[0] >= n_acquisitions:
                        return
                if abandoned is not None and rng.random() < 0.5:
                    stale_attempts[cid] += 1  # a holder that lost its lease wakes up and writes
                    try:
                        _log(store, abandoned, cid)
                    except StaleOwner:
                        stale_refused[cid] += 1
                    abandoned = None
                got = leases.acquire(MIND)
                if not isinstance(got, Lease):
                    time.sleep(0.001)  # contention back-off, not synchronisation
                    continue
                with count_lock:
                    acquired[0] += 1
                try:
                    for _ in range(rng.randint(1, 3)):
                        _log(store, got, cid)
                except StaleOwner:
                    continue  # a loaded machine let the TTL run out: the lease is lost
                if rng.random() < 0.5:
                    leases.release(got)  # False if the TTL ran out meanwhile
                else:
                    abandoned = got  # stops renewing: the lease expires on its own
                    wait_lease_free(leases, MIND)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=contender, args=(c,)) for c in range(n_contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    for c in clients:
        c.close()
    assert not errors, errors
    log = store_log(rclient)
    fences = [f for f, _ in log]
    assert fences == sorted(fences), "a write of an older fence landed after a newer one"
    holder_of: dict[int, int] = {}
    for fence, cid in log:
        assert holder_of.setdefault(fence, cid) == cid, f"fence {fence} used by two contenders"
    assert int(rclient.get(MIND.fence) or 0) == acquired[0]  # one new fence per acquisition
    assert set(holder_of) <= set(range(1, acquired[0] + 1))
    assert len(holder_of) >= n_acquisitions // 2  # most acquisitions wrote before their TTL
    assert len(set(holder_of.values())) == n_contenders
    assert sum(stale_attempts) > 0
    assert stale_refused == stale_attempts  # every stale write was refused


def _log(store: TokenLog, lease: Lease, cid: int) -> None:
    n = len(store.read(lease.keys))
    store.append(lease, f"{lease.fence}.{n}.{cid}", n, [lease.fence, cid])


def store_log(client: redis.Redis) -> list[tuple[int, int]]:
    data = client.get(MIND.tokens) or b""
    pairs = np.frombuffer(data, dtype="<i4").reshape(-1, 2)
    return [(int(f), int(c)) for f, c in pairs]
