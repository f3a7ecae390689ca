"""The shared page store's values: a publish's receipt, a fetched page, the counters, and the
pure helpers that name a manifest's chunks (`store.SharedStore` uses them; readers of its
results import them from here or through it).

Pure: no Redis.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from kvswap.core.keys import PageKey
from kvswap.core.page import PageLayout
from kvswap.tiers.shared import manifest as mf
from kvswap.tiers.shared.keys import MindKeys, mind_id
from kvswap.tiers.shared.lease import Lease
from kvswap.tiers.shared.segments import PagePlan


@dataclass(frozen=True)
class PublishReceipt:
    gen: int
    fence: int
    n_tokens: int
    n_bytes_page: int
    n_bytes_written: int  # chunk bytes sent for this generation
    n_bytes_manifest: int
    n_bytes_reused: int  # page bytes served by older generations' chunks
    n_chunks: int
    delta: bool  # some older generation's chunks were reused
    tokens_only: bool
    n_degraded: int  # other minds degraded to tokens-only to keep the budget
    seconds: float


@dataclass(frozen=True)
class Fetched:
    page: memoryview  # the page's bytes (n_bytes of the caller's buffer)
    layout: PageLayout
    manifest: mf.Manifest
    n_bytes_read: int
    seconds: float  # the whole fetch, wall clock (manifest, chunks, checks, reassembly)
    verify_s: float  # of which checking chunks' lengths and CRC-32s (summed over threads)


@dataclass
class StoreCounters:
    """What /metrics and /pages report about the shared tier (phase 2)."""

    n_publish: int = 0
    n_publish_delta: int = 0
    n_publish_tokens_only: int = 0
    n_publish_stale: int = 0  # refused inside Redis: lease lost or fence moved
    n_publish_failed: int = 0  # Redis unavailable, or chunks lost before the commit
    n_publish_replanned: int = 0  # the manifest moved under a publish (eviction)
    bytes_written: int = 0
    bytes_reused: int = 0
    publish_s: float = 0.0
    n_fetch: int = 0
    n_fetch_hit: int = 0
    misses: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    fetch_s: float = 0.0
    verify_s: float = 0.0
    n_degraded: int = 0


class Replan(Enum):
    """A publish attempt that did not commit, and how the next one is planned."""

    AGAIN = "again"  # the manifest moved under it (an eviction): against the new one
    WHOLE = "whole"  # a chunk it needed was gone: a whole page, reusing nothing


@dataclass(frozen=True)
class Written:
    """A generation whose chunks are in Redis, waiting for its commit."""

    plan: PagePlan | None  # None: tokens-only
    blobs: tuple[mf.BlobRef, ...]  # every blob the plan references, its own included
    chunk_keys: list[str]  # its own chunks (TTL until the commit persists them)
    n_blob_bytes: int
    n_reused_bytes: int
    n_degraded: int = 0  # other minds degraded to make room for its chunks


def decode_or_none(body: bytes | None) -> mf.Manifest | None:
    """A manifest to plan against; an unreadable one is replaced by a full page."""
    if body is None:
        return None
    try:
        return mf.decode(body)
    except mf.ManifestError:
        return None


def manifest_of(
    lease: Lease, mind_key: PageKey, gen: int, layout: PageLayout, written: Written
) -> mf.Manifest:
    """The commit record of generation `gen`, written under `lease`."""
    return mf.Manifest(
        mind_key=mind_id(mind_key),
        gen=gen,
        fence=lease.fence,
        replica_id=lease.holder.replica_id,
        n_tokens=layout.n_tokens,
        fingerprint=layout.geometry.file_fingerprint(),
        layout=layout,
        tokens_only=written.plan is None,
        plan=written.plan,
        blobs=written.blobs,
        t_unix_ms=int(time.time() * 1000),
    )


def chunk_keys(keys: MindKeys, record: mf.Manifest | None) -> list[str]:
    if record is None:
        return []
    return [k for b in record.blobs for k in blob_keys(keys, b)]


def blob_keys(keys: MindKeys, blob: mf.BlobRef) -> list[str]:
    return [keys.chunk(blob.gen, i) for i in range(len(blob.crcs))]


def gen_of(chunk_key: str) -> int:
    return int(chunk_key.rsplit(":", 2)[1][1:])
