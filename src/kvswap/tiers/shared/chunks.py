"""Moving a blob's chunks to and from Redis, pipelined over several connections.

A blob (the bytes one generation writes) is cut into chunks of `chunk_bytes` (8 MiB by
default: a Redis string caps at 512 MB and one big value stalls Redis's single thread for
everyone else). `ChunkIO` sends them as pipelines of `depth` chunks,
one pipeline per worker thread and connection, `n_connections` at a time; each chunk's CRC-32
is computed by the worker that carries it (zlib releases the GIL). Values go to redis-py as
memoryviews, which it sends without copying.

Owns the executor and the chunking; knows nothing of manifests. Raises `TierUnavailable` when
Redis fails under it. Thread-safe.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import redis

from kvswap.tiers.shared.errors import translating

# A chunk is a Redis string: its bytes and a header of at most 17 bytes in one allocation.
# jemalloc's size classes above 8 MiB are 10, 12, 14 MiB, so a chunk of exactly 8 MiB would
# occupy 10 MiB (25% of Redis's memory lost); 64 bytes less fits the 8 MiB class.
DEFAULT_CHUNK_BYTES: Final = (8 << 20) - 64
DEFAULT_CONNECTIONS: Final = 4
DEFAULT_DEPTH: Final = 4  # chunks per pipeline

# What a reader's callback gets for each chunk: its index and its bytes (None: key missing).
OnChunk = Callable[[int, bytes | None], None]


def cut(pieces: Sequence[memoryview], chunk_bytes: int) -> Iterator[memoryview]:
    """The blob made of `pieces`, in chunks: views where a chunk lies in one piece, else joined."""
    parts: list[memoryview] = []
    n_parts = 0
    for piece in pieces:
        pos = 0
        while pos < len(piece):
            take = min(chunk_bytes - n_parts, len(piece) - pos)
            parts.append(piece[pos : pos + take])
            n_parts += take
            pos += take
            if n_parts == chunk_bytes:
                yield _join(parts)
                parts, n_parts = [], 0
    if parts:
        yield _join(parts)


def _join(parts: list[memoryview]) -> memoryview:
    return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))


class ChunkIO:
    """Pipelined, parallel SET and GET of chunks."""

    def __init__(
        self,
        client: redis.Redis,
        n_connections: int = DEFAULT_CONNECTIONS,
        depth: int = DEFAULT_DEPTH,
    ) -> None:
        if n_connections < 1 or depth < 1:
            raise ValueError("n_connections and depth must be at least 1")
        self._client = client
        self._depth = depth
        self._pool = ThreadPoolExecutor(n_connections, thread_name_prefix="kvswap-chunks")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def write(self, keys: Sequence[str], chunks: Sequence[memoryview], ttl_ms: int) -> list[int]:
        """SET every chunk under its key with a TTL; return their CRC-32s, in order."""
        batches = [
            range(i, min(i + self._depth, len(keys))) for i in range(0, len(keys), self._depth)
        ]

        def send(batch: range) -> list[int]:
            crcs = [zlib.crc32(chunks[i]) for i in batch]
            with translating("chunk write"):
                pipe = self._client.pipeline(transaction=False)
                for i in batch:
                    pipe.set(keys[i], chunks[i], px=ttl_ms)
                pipe.execute()
            return crcs

        return [crc for crcs in self._pool.map(send, batches) for crc in crcs]

    def read(self, keys: Sequence[str], on_chunk: OnChunk) -> None:
        """GET every key; `on_chunk(i, value)` runs on a worker as each pipeline returns."""
        batches = [
            range(i, min(i + self._depth, len(keys))) for i in range(0, len(keys), self._depth)
        ]

        def fetch(batch: range) -> None:
            with translating("chunk read"):
                pipe = self._client.pipeline(transaction=False)
                for i in batch:
                    pipe.get(keys[i])
                values = pipe.execute()
            for i, value in zip(batch, values, strict=True):
                on_chunk(i, value)

        for _ in self._pool.map(fetch, batches):
            pass
