"""The shared tier: minds' pages and token logs in Redis, readable by every replica.

Publishing a page (`SharedStore.publish`, by the mind's lease holder):

1. `BEGIN` (a script: lease and fence checked) allocates a generation number from
   `kv:{h}:gens` and returns the current manifest;
2. the page is planned against that manifest (`segments`): a page that grew by appending
   writes only its new columns, anything else what changed;
3. the new generation's blob goes to `kv:{h}:g<gen>:<i>` in chunks with a TTL (orphans of a
   writer that dies here expire by themselves);
4. `COMMIT` (lease, fence, and "the manifest is still the one planned against") persists the
   chunks, writes the manifest, and unlinks chunks no longer referenced, all at once.

A reader (`fetch`) takes the manifest, then the chunks, verifying each chunk's length and
CRC-32, so it rebuilds a whole generation or reports a `Miss`; no exception escapes a read. (The
token log is `token_log.TokenLog`.) The tier's byte budget is enforced here after each publish:
the least recently used minds are degraded to tokens-only (manifest first, its chunks unlinked
in the same script), never left half-deleted.

Owns `SharedStore` and its counters. Thread-safe. Raises `StaleOwner` and `TierUnavailable`
(kvswap.tiers.shared.errors) from mutations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Final

import redis

from kvswap.core.keys import PageKey
from kvswap.core.page import PageLayout
from kvswap.tiers.shared import manifest as mf
from kvswap.tiers.shared import store_scripts as lua
from kvswap.tiers.shared.budget import TierBudget, mind_charge
from kvswap.tiers.shared.chunks import DEFAULT_CHUNK_BYTES, ChunkIO, cut
from kvswap.tiers.shared.connection import as_bytes
from kvswap.tiers.shared.errors import Miss, MissReason, StaleOwner, TierUnavailable, translating
from kvswap.tiers.shared.keys import MindKeys, TierKeys
from kvswap.tiers.shared.lease import Lease
from kvswap.tiers.shared.receipts import (
    Fetched,
    PublishReceipt,
    Replan,
    StoreCounters,
    Written,
    blob_keys,
    chunk_keys,
    decode_or_none,
    gen_of,
    manifest_of,
)
from kvswap.tiers.shared.segments import (
    BlobScatter,
    plan_generation,
    split_page,
    write_literals,
)

DEFAULT_PENDING_TTL_MS: Final = 3_600_000  # uncommitted chunks expire after an hour
_MAX_ATTEMPTS: Final = 3  # a publish whose base moved (budget eviction) is planned again
_MANIFEST_RESERVE_BYTES: Final = 64 << 10  # a manifest's bytes, reserved before it is known
Alloc = Callable[[int], memoryview]


class SharedStore:
    """Minds' pages in one Redis database."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        replica_id: str,
        budget_bytes: int | None = None,
        prefix: str = "kv",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        n_connections: int = 4,
        pipeline_depth: int = 4,
        pending_ttl_ms: int = DEFAULT_PENDING_TTL_MS,
        after_chunks: Callable[[int], None] | None = None,
        bulk: redis.Redis | None = None,
    ) -> None:
        """`bulk`: the client chunks travel on (a longer timeout; default `client`).
        `after_chunks(gen)` is a seam for crash tests: it runs between a generation's chunks
        and its commit."""
        if chunk_bytes < 4096:
            raise ValueError(f"chunk size {chunk_bytes} is below 4096 bytes")
        self.replica_id = replica_id
        self.prefix = prefix
        self.chunk_bytes = chunk_bytes
        self.pending_ttl_ms = pending_ttl_ms
        self.budget = (
            TierBudget(client, TierKeys(prefix), budget_bytes) if budget_bytes is not None else None
        )
        self._client = client
        self._io = ChunkIO(bulk or client, n_connections, pipeline_depth)
        self._after_chunks = after_chunks
        self._lock = threading.Lock()
        self._counters = StoreCounters()
        self._begin = client.register_script(lua.BEGIN)
        self._commit = client.register_script(lua.COMMIT)
        self._degrade_script = client.register_script(lua.DEGRADE)
        self._drop = client.register_script(lua.DROP)
        self._unlink_script = client.register_script(lua.UNLINK_REFUSED)
        self._evict_script = client.register_script(lua.EVICT)

    def close(self) -> None:
        self._io.close()

    def counters(self) -> dict[str, object]:
        with self._lock:
            snap = asdict(self._counters)
        return snap

    def counters_now(self) -> StoreCounters:
        """A copy of the counters."""
        with self._lock:
            c = self._counters
            return dataclasses.replace(c, misses=dict(c.misses))

    def _count(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + delta)

    def _miss(self, reason: MissReason, detail: str, gen: int = 0) -> Miss:
        with self._lock:
            misses = self._counters.misses
            misses[reason.value] = misses.get(reason.value, 0) + 1
        return Miss(reason, detail, gen)

    # -- publish -----------------------------------------------------------------------------

    def publish(
        self,
        lease: Lease,
        mind_key: PageKey,
        page: memoryview,
        layout: PageLayout,
        *,
        whole: bool = False,
    ) -> PublishReceipt:
        """Publish the page as the mind's next generation: a delta when it grew by appending,
        unless `whole` (the previous generation's chunks are not to be trusted)."""
        if MindKeys.of(mind_key, self.prefix) != lease.keys:
            raise ValueError("the lease is for another mind")
        t0 = time.perf_counter()
        try:
            for _ in range(_MAX_ATTEMPTS):
                receipt = self._publish_once(lease, mind_key, page, layout, t0, whole)
                if isinstance(receipt, PublishReceipt):
                    return receipt
                whole = whole or receipt is Replan.WHOLE
                self._count(n_publish_replanned=1)
            raise TierUnavailable("the manifest kept moving under the publish (evictions)")
        except StaleOwner:
            self._count(n_publish_stale=1)
            raise
        except TierUnavailable:
            self._count(n_publish_failed=1)
            raise

    def _publish_once(
        self,
        lease: Lease,
        mind_key: PageKey,
        page: memoryview,
        layout: PageLayout,
        t0: float,
        whole: bool,
    ) -> PublishReceipt | Replan:
        """One attempt: begin, write the chunks, commit; or how to plan the next attempt."""
        keys = lease.keys
        owner: list[str | int] = [lease.holder.value, lease.fence]
        with translating("publish begin"):
            reply = self._begin(keys=[keys.lease, keys.fence, keys.gens, keys.manifest], args=owner)
        if int(reply[0]) != lua.DONE:
            raise StaleOwner(f"lease on {keys.tag} lost before publishing (fence {lease.fence})")
        gen, base_gen = int(reply[1]), int(reply[2])
        base_body = as_bytes(reply[3])
        base = decode_or_none(base_body)
        written = self._write_generation(keys, gen, page, layout, base, whole)
        if self._after_chunks is not None:
            self._after_chunks(gen)
        record = manifest_of(lease, mind_key, gen, layout, written)
        body = mf.encode(record)
        kept = {b.gen for b in written.blobs}
        if base is None and base_body is not None:
            old = self._orphans(keys, gen)  # an unreadable base: its chunks found by name
        else:
            old = chunk_keys(keys, base)
        drop = [k for k in old if gen_of(k) not in kept]
        reused = [k for b in written.blobs if b.gen != gen for k in blob_keys(keys, b)]
        with translating("publish commit"):
            reply = self._commit(
                keys=[keys.lease, keys.fence, keys.manifest, *written.chunk_keys, *reused, *drop],
                args=[*owner, gen, base_gen, body, len(written.chunk_keys), len(reused)],
            )
        outcome = int(reply[0])
        if outcome != lua.DONE:
            self._unlink_refused(keys, gen, written.chunk_keys)
            if outcome == lua.NOT_OWNER:
                raise StaleOwner(
                    f"lease on {keys.tag} lost before the commit (fence {lease.fence})"
                )
            # BASE_MOVED (an eviction): plan again; CHUNK_LOST (expired, or a reused chunk
            # gone): plan again as a whole page
            return Replan.WHOLE if outcome == lua.CHUNK_LOST else Replan.AGAIN
        return self._committed(keys.tag, record, len(body), written, t0)

    def _orphans(self, keys: MindKeys, gen: int) -> list[str]:
        """Every chunk key of the mind older than `gen` (its manifest cannot be read, so its
        chunks are found by name: a scan of the mind's own keys)."""
        pattern = keys.chunk(0, 0).rsplit(":", 2)[0] + ":g[0-9]*"
        with translating("publish scan"):
            found = [k.decode() for k in self._client.scan_iter(match=pattern, count=1000)]
        return [k for k in found if gen_of(k) < gen]

    def _committed(
        self, tag: str, record: mf.Manifest, n_body: int, written: Written, t0: float
    ) -> PublishReceipt:
        """A generation committed: the budget settled (least recently used minds degraded),
        counted, and its receipt. Redis failing during the settling does not fail the publish:
        the commit landed (the charge is set again by the mind's next publish)."""
        try:
            charge = mind_charge(record.n_bytes_stored, n_body, record.n_tokens)
            n_degraded = written.n_degraded + self._settle_budget(tag, charge)
        except TierUnavailable:
            n_degraded = written.n_degraded
        seconds = time.perf_counter() - t0
        n_reused = written.n_reused_bytes
        layout = record.layout
        self._count(
            n_publish=1,
            n_publish_delta=int(n_reused > 0),
            n_publish_tokens_only=int(record.tokens_only),
            bytes_written=written.n_blob_bytes,
            bytes_reused=n_reused,
            publish_s=seconds,
        )
        return PublishReceipt(
            gen=record.gen,
            fence=record.fence,
            n_tokens=layout.n_tokens,
            n_bytes_page=layout.n_bytes,
            n_bytes_written=written.n_blob_bytes,
            n_bytes_manifest=n_body,
            n_bytes_reused=n_reused,
            n_chunks=len(written.chunk_keys),
            delta=n_reused > 0,
            tokens_only=record.tokens_only,
            n_degraded=n_degraded,
            seconds=seconds,
        )

    def _write_generation(
        self,
        keys: MindKeys,
        gen: int,
        page: memoryview,
        layout: PageLayout,
        base: mf.Manifest | None,
        whole: bool,
    ) -> Written:
        """Plan generation `gen` against `base` (unless `whole`) and write its chunks (none
        when tokens-only)."""
        over_budget = self.budget is not None and layout.n_bytes > self.budget.budget_bytes
        if layout.token_only or over_budget:
            return Written(None, (), [], 0, 0)
        previous = None
        same_model = base is not None and base.fingerprint == layout.geometry.file_fingerprint()
        if base is not None and same_model and not whole:
            previous = base.plan
        view = memoryview(page)
        write = plan_generation(view, split_page(view, layout), previous, gen)
        if self.budget is not None:
            # the old generation's chunks and the new one's coexist until the commit: room
            # for both is made before a byte is written
            n_old = base.n_bytes_stored if base is not None else 0
            peak = mind_charge(n_old + write.n_blob_bytes, _MANIFEST_RESERVE_BYTES, layout.n_tokens)
            n_degraded = self._settle_budget(keys.tag, peak)
        else:
            n_degraded = 0
        chunks = list(cut(write.blob, self.chunk_bytes))
        chunk_keys = [keys.chunk(gen, i) for i in range(len(chunks))]
        crcs = self._io.write(chunk_keys, chunks, self.pending_ttl_ms)
        old = {b.gen: b for b in base.blobs} if base is not None else {}
        blobs = [old[g] for g in sorted(write.plan.gens() - {gen})]
        if write.n_blob_bytes:
            blobs.append(mf.BlobRef(gen, write.n_blob_bytes, self.chunk_bytes, tuple(crcs)))
        return Written(
            write.plan,
            tuple(blobs),
            chunk_keys,
            write.n_blob_bytes,
            write.n_reused_bytes,
            n_degraded,
        )

    def _unlink_refused(self, keys: MindKeys, gen: int, chunk_keys: Sequence[str]) -> None:
        """Best effort: chunks of a refused generation, unless its commit did land after all
        (a script that refuses when the manifest is that generation); on failure they expire
        after pending_ttl_ms."""
        if chunk_keys:
            with contextlib.suppress(
                redis.exceptions.ConnectionError, redis.exceptions.TimeoutError
            ):
                self._unlink_script(keys=[keys.manifest, *chunk_keys], args=[gen])

    # -- budget ------------------------------------------------------------------------------

    def _settle_budget(self, tag: str, n_bytes: int) -> int:
        """Charge the mind `n_bytes`; degrade LRU minds while the tier is over budget."""
        if self.budget is None:
            return 0
        n_degraded = self.budget.settle(
            tag, n_bytes, lambda victim: self._degrade(MindKeys(victim, self.prefix))
        )
        self._count(n_degraded=n_degraded)
        return n_degraded

    def _degrade(self, keys: MindKeys) -> int | None:
        """Make room: a mind with chunks becomes tokens-only (its manifest marked, its chunks
        unlinked, in one script); a tokens-only mind nobody holds leaves the tier (manifest,
        token log, turn ids, chat record). What it still costs (0: nothing), or None when it was left alone
        (the manifest changed under every attempt, or a replica holds it)."""
        for _ in range(_MAX_ATTEMPTS):
            with translating("budget eviction"):
                body = as_bytes(self._client.hget(keys.manifest, "body"))
                current = decode_or_none(body)
                if current is None:
                    return 0  # a stale charge
                if current.tokens_only:
                    reply = self._evict_script(
                        keys=[keys.lease, keys.manifest, keys.tokens, keys.turns, keys.chat],
                        args=[current.gen],
                    )
                    outcome = int(reply[0])
                    if outcome == lua.NOT_OWNER:
                        return None  # held: its holder keeps it
                    if outcome == lua.DONE:
                        return 0
                    continue
                gen = int(self._client.incr(keys.gens))
                degraded = dataclasses.replace(
                    current, gen=gen, tokens_only=True, plan=None, blobs=()
                )
                new_body = mf.encode(degraded)
                reply = self._degrade_script(
                    keys=[keys.manifest, *chunk_keys(keys, current)],
                    args=[current.gen, gen, new_body],
                )
            if int(reply[0]) == lua.DONE:
                return mind_charge(0, len(new_body), degraded.n_tokens)
        return None

    # -- fetch -------------------------------------------------------------------------------

    def read_manifest(self, keys: MindKeys) -> mf.Manifest | Miss:
        """The mind's current manifest, or a miss (absent, unreadable, Redis down)."""
        try:
            with translating("manifest read"):
                body = as_bytes(self._client.hget(keys.manifest, "body"))
        except TierUnavailable as err:
            return self._miss(MissReason.UNAVAILABLE, str(err))
        if body is None:
            return self._miss(MissReason.ABSENT, f"no manifest for {keys.tag}")
        try:
            return mf.decode(body)
        except mf.ManifestError as err:
            return self._miss(MissReason.MANIFEST_CORRUPT, str(err))

    def fetch(
        self, keys: MindKeys, *, fingerprint: str | None = None, alloc: Alloc | None = None
    ) -> Fetched | Miss:
        """The mind's latest page, verified chunk by chunk, or a miss saying why not.

        `alloc(n_bytes)` provides the buffer (default: a new bytearray); after a miss its
        content is undefined. `fingerprint` (PageGeometry.file_fingerprint()) refuses a page
        made with another model or KV types before any chunk is read.
        """
        t0 = time.perf_counter()
        self._count(n_fetch=1)
        record = self.read_manifest(keys)
        if isinstance(record, Miss):
            return record
        if record.tokens_only or record.plan is None:
            return self._miss(MissReason.TOKENS_ONLY, "the tier holds its tokens only", record.gen)
        if fingerprint is not None and record.fingerprint != fingerprint:
            return self._miss(MissReason.FINGERPRINT, f"made with {record.fingerprint}", record.gen)
        if self.budget is not None:
            # used now: the budget never degrades a mind while it is being taken over
            with contextlib.suppress(TierUnavailable):
                self.budget.touch(keys.tag)
        plan = record.plan
        out = alloc(plan.n_bytes) if alloc is not None else memoryview(bytearray(plan.n_bytes))
        page = out.cast("B") if out.format != "B" else out
        failure, verify_s = self._read_blobs(keys, record, page)
        if failure is not None:
            return self._miss(failure[0], failure[1], record.gen)
        write_literals(page, plan.literals)
        if self.budget is not None:
            # the page is whole; a missed LRU touch only ages it
            with contextlib.suppress(TierUnavailable):
                self.budget.touch(keys.tag)
        seconds = time.perf_counter() - t0
        n_read = record.n_bytes_stored
        self._count(n_fetch_hit=1, bytes_read=n_read, fetch_s=seconds, verify_s=verify_s)
        return Fetched(page[: plan.n_bytes], record.layout, record, n_read, seconds, verify_s)

    def _read_blobs(
        self, keys: MindKeys, record: mf.Manifest, page: memoryview
    ) -> tuple[tuple[MissReason, str] | None, float]:
        """The first failure (or None) and the seconds spent checking chunks."""
        assert record.plan is not None
        places: list[tuple[mf.BlobRef, int, int, BlobScatter]] = []
        for blob in record.blobs:
            scatter = BlobScatter(record.plan, blob.gen)
            pos = 0
            for i, size in enumerate(blob.chunk_sizes()):
                places.append((blob, i, pos, scatter))
                pos += size
        failures: list[tuple[MissReason, str]] = []
        verify_s = [0.0] * len(places)

        def on_chunk(index: int, value: bytes | None) -> None:
            blob, i, pos, scatter = places[index]
            key = keys.chunk(blob.gen, i)
            if value is None:
                failures.append((MissReason.CHUNK_MISSING, f"{key} is gone"))
                return
            size = min(blob.chunk_bytes, blob.n_bytes - pos)
            t0 = time.perf_counter()
            intact = len(value) == size and zlib.crc32(value) == blob.crcs[i]
            verify_s[index] = time.perf_counter() - t0
            if not intact:
                failures.append((MissReason.CHUNK_CORRUPT, f"{key} fails its length or CRC-32"))
                return
            if not failures:
                scatter.scatter(page, pos, memoryview(value))

        chunk_keys = [keys.chunk(blob.gen, i) for blob, i, _, _ in places]
        try:
            self._io.read(chunk_keys, on_chunk)
        except TierUnavailable as err:
            return (MissReason.UNAVAILABLE, str(err)), sum(verify_s)
        return (failures[0] if failures else None), sum(verify_s)

    def drop(self, lease: Lease) -> None:
        """Remove the mind from the tier: manifest, chunks, token log (the lease stays held)."""
        keys = lease.keys
        current = self.read_manifest(keys)
        chunks = chunk_keys(keys, current) if isinstance(current, mf.Manifest) else []
        with translating("drop"):
            reply = self._drop(
                keys=[
                    keys.lease,
                    keys.fence,
                    keys.manifest,
                    keys.tokens,
                    keys.turns,
                    keys.chat,
                    *chunks,
                ],
                args=[lease.holder.value, lease.fence],
            )
        if int(reply[0]) != lua.DONE:
            raise StaleOwner(f"lease on {keys.tag} lost before the drop")
        if self.budget is not None:
            self.budget.uncharge(keys.tag)
