"""A writer process for the torn-publish test: `python -m tests.cluster.publish_child PORT`.

Takes the mind's lease, publishes page A (seed 1) whole and prints `published <gen>`; then
publishes page B (seed 2), prints `chunks <gen>` once B's chunks are in Redis and, before the
manifest commit, blocks reading stdin: the parent kills it there.
"""

from __future__ import annotations

import sys

import redis

from kvswap.core.keys import mind_key
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.store import SharedStore
from tests.cluster.util import incarnation, synthetic_page

MIND_KEY = mind_key("public", "torn")
N_TOKENS, TARGET_BYTES, CHUNK_BYTES = 1000, 600_000, 65536


def main(port: int) -> None:
    client = redis.Redis(port=port)
    lease = Leases(client, incarnation("writer"), ttl_ms=60_000).acquire(MindKeys.of(MIND_KEY))
    assert isinstance(lease, Lease)
    first = SharedStore(client, replica_id="writer", chunk_bytes=CHUNK_BYTES)
    receipt = first.publish(lease, MIND_KEY, *synthetic_page(N_TOKENS, TARGET_BYTES, seed=1))
    print(f"published {receipt.gen}", flush=True)

    def stop_here(gen: int) -> None:
        print(f"chunks {gen}", flush=True)
        sys.stdin.readline()  # the parent SIGKILLs this process while it waits here

    torn = SharedStore(client, replica_id="writer", chunk_bytes=CHUNK_BYTES, after_chunks=stop_here)
    torn.publish(lease, MIND_KEY, *synthetic_page(N_TOKENS, TARGET_BYTES, seed=2))


if __name__ == "__main__":
    main(int(sys.argv[1]))
