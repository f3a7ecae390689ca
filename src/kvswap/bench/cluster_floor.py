"""`kvswap bench cluster`'s floor: what a resume cannot beat on this machine.

A resumed turn moves the mind's page from Redis, restores it into a slot and prefills the turn's
new tokens. Its floor is the sum of those three at the speeds this machine allows: the page's
bytes at the tier's raw bandwidth (`tier_bandwidth`: pipelined GETs of chunks already in Redis,
over as many connections as a replica fetches with, nothing checked or placed), the restore as
the replica measured it, and the new tokens' prefill as the same replica measured it in that
turn. A resume's time to first token over its floor is what everything else costs (the lease,
the manifest and token log, the chunk checks, the HTTP turn).

Owns the bandwidth probe and the floor's arithmetic. Runs in the bench process.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis

N_CONNECTIONS = 4  # as a replica's chunk reads (tiers.shared.chunks)
DEPTH = 4  # chunks per pipeline


def tier_bandwidth(url: str, n_rounds: int = 3) -> float:
    """Bytes per second of plain pipelined GETs of every chunk in the tier (the best of
    `n_rounds`)."""
    client = redis.Redis.from_url(url)
    try:
        keys = sorted(client.scan_iter(match="kv:*:g[0-9]*:*", count=1000))
        batches = [keys[i : i + DEPTH] for i in range(0, len(keys), DEPTH)]
        if not batches:
            return 0.0

        def read(batch: list[bytes]) -> int:
            pipe = client.pipeline(transaction=False)
            for key in batch:
                pipe.get(key)
            return sum(len(v or b"") for v in pipe.execute())

        best = 0.0
        with ThreadPoolExecutor(N_CONNECTIONS) as pool:
            for _ in range(n_rounds):
                t0 = time.perf_counter()
                n_bytes = sum(pool.map(read, batches))
                best = max(best, n_bytes / (time.perf_counter() - t0))
        return best
    finally:
        client.close()


@dataclass(frozen=True)
class Floor:
    fetch_s: float  # the page's bytes at the tier's raw bandwidth
    restore_s: float
    prefill_s: float  # the turn's new tokens, on the same replica

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.restore_s + self.prefill_s


def floor_of(n_bytes: int, bandwidth_bytes_s: float, restore_s: float, prefill_s: float) -> Floor:
    fetch_s = n_bytes / bandwidth_bytes_s if bandwidth_bytes_s > 0 else 0.0
    return Floor(fetch_s, restore_s, prefill_s)
