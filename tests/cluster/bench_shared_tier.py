"""Shared-tier figures on this machine (by hand, not a test).

Usage: .venv/bin/python -m tests.cluster.bench_shared_tier [n_mib] [--delta]

1. Page throughput through `SharedStore` against a loopback redis-server started here (no
   persistence): a page of n_mib MiB (default 256) published whole (fresh mind each time) and
   fetched back with every chunk's CRC-32 verified, 8 MiB chunks, pipelines of 4 chunks, over
   1, 2, 4 and 8 connections; worst and best of 3, GB/s = 1e9 bytes/s; beside each, redis-py
   alone moving the same bytes (one pipeline, no CRC, no planning) just before, as the baseline
   that a loaded machine's noise moves with.
2. With --delta: a real SmolLM2-135M state of 4096 tokens (4k prefill: a minute or more on 2
   cores), then 16 turns of +32 tokens each, published one after the other: bytes written per
   turn (chunks + manifest) against the page, and the mean over the turns.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import redis

from kvswap.core.keys import mind_key
from kvswap.tiers.shared.chunks import DEFAULT_CHUNK_BYTES as CHUNK
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.store import Fetched, SharedStore
from tests.cluster.util import RedisServer, incarnation, synthetic_page


def raw(client: redis.Redis, page: memoryview) -> tuple[float, float]:
    """redis-py alone, one pipeline of 8 MiB SETs then GETs of the same bytes: the baseline."""
    chunks = [page[i : i + CHUNK] for i in range(0, len(page), CHUNK)]
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i, chunk in enumerate(chunks):
        pipe.set(f"raw:{i}", chunk)
    pipe.execute()
    write = len(page) / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(len(chunks)):
        pipe.get(f"raw:{i}")
    pipe.execute()
    read = len(page) / (time.perf_counter() - t0) / 1e9
    client.flushall()
    return write, read


def throughput(server: RedisServer, n_mib: int) -> None:
    page, layout = synthetic_page(4096, n_mib << 20)
    client = server.client()
    print(f"page {layout.n_bytes / 1e6:.0f} MB, 8 MiB chunks, pipelines of 4")
    for n_conn in (1, 2, 4, 8):
        store = SharedStore(client, replica_id="bench", n_connections=n_conn)
        writes, reads, raw_writes, raw_reads = [], [], [], []
        for rep in range(3):
            raw_w, raw_r = raw(client, page)
            raw_writes.append(raw_w)
            raw_reads.append(raw_r)
            name = mind_key("bench", f"{n_conn:02x}{rep:02x}")
            got = Leases(client, incarnation("bench")).acquire(MindKeys.of(name))
            assert isinstance(got, Lease)
            t0 = time.perf_counter()
            store.publish(got, name, page, layout)
            writes.append(layout.n_bytes / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            fetched = store.fetch(MindKeys.of(name))
            reads.append(layout.n_bytes / (time.perf_counter() - t0) / 1e9)
            assert isinstance(fetched, Fetched) and fetched.page == page
            del fetched
            client.flushall()
        store.close()
        print(
            f"  {n_conn} connection(s): write {min(writes):.2f}-{max(writes):.2f} GB/s, "
            f"read {min(reads):.2f}-{max(reads):.2f} GB/s | raw redis-py, 1 connection, "
            f"same bytes, just before: write {min(raw_writes):.2f}-{max(raw_writes):.2f}, "
            f"read {min(raw_reads):.2f}-{max(raw_reads):.2f}"
        )
    client.close()


def delta(server: RedisServer) -> None:
    import logging

    from kvswap.backend.liblog import route_libllama_logs
    from kvswap.backend.model import Model
    from kvswap.core.page import PageGeometry
    from kvswap.models import default_model_path
    from tests.cluster.states import capture, context, decode, prompt

    route_libllama_logs(logging.WARNING)
    model = Model.load(default_model_path())
    ctx = context(model, 4096 + 16 * 32 + 256, n_threads=2)
    geometry = PageGeometry("smollm2", "f16", "f16", 1, 8192)
    tokens = prompt(4096 + 16 * 32)
    t0 = time.perf_counter()
    decode(ctx, tokens[:4096], 0)
    print(f"SmolLM2-135M: 4096-token prefill {time.perf_counter() - t0:.0f} s")
    client = server.client()
    store = SharedStore(client, replica_id="bench")
    name = mind_key("bench", "delta")
    lease = Leases(client, incarnation("bench"), ttl_ms=600_000).acquire(MindKeys.of(name))
    assert isinstance(lease, Lease)
    receipt = store.publish(lease, name, *capture(ctx, tokens[:4096], geometry))
    print(f"  turn 0 (4096 tokens): wrote {receipt.n_bytes_written / 1e6:.1f} MB (whole page)")
    ratios = []
    for turn in range(1, 17):
        n = 4096 + 32 * turn
        decode(ctx, tokens[n - 32 : n], n - 32)
        page, layout = capture(ctx, tokens[:n], geometry)
        receipt = store.publish(lease, name, page, layout)
        written = receipt.n_bytes_written + receipt.n_bytes_manifest
        ratios.append(written / layout.n_bytes)
        print(
            f"  turn {turn:2d} ({n} tokens): wrote {written / 1e6:6.2f} MB of "
            f"{layout.n_bytes / 1e6:.1f} MB ({ratios[-1]:.2%}), manifest {receipt.n_bytes_manifest} B"
        )
    fetched = store.fetch(MindKeys.of(name))
    assert isinstance(fetched, Fetched) and fetched.page == page
    print(f"  mean over 16 turns: {sum(ratios) / len(ratios):.2%} of the page per turn")
    store.close()
    client.close()
    ctx.close()
    model.close()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n_mib = int(args[0]) if args else 256
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer.start(Path(tmp))
        try:
            throughput(server, n_mib)
            if "--delta" in sys.argv:
                delta(server)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
