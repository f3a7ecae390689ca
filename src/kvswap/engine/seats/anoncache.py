"""The anonymous prompt cache: states of requests that name no mind, kept as RAM pages and found
again by their longest common token prefix (as llama-server's `--cache-ram`).

- When an anonymous request is about to overwrite most of an idle slot's cached prompt, or a
  mind takes a slot that holds one, that state is saved as a page first (one memcpy into a
  buffer prepared ahead, `kv.spare`, never mapped on the engine thread: while one is being
  mapped the request waits for it (`displace`), and only a store with no room skips the save;
  an anonymous request's end asks for one sized to its slot's state). Its
  key (`core.keys.anon_key`) is one no request can build, so no client page ever collides
  with it and no request can name, replace or consume it.
- A full KV pool moves an idle anonymous slot's state here (`keep`), and a reconfigure hands
  over the idle anonymous states it could not seat (`adopt`): engine-made states are cache
  entries, evicted like any other, never pages that live forever.
- An anonymous request takes whichever is longer: the prefix its slot already holds or the
  best cached state's, which is then paged into its slot.
- Cached states are indexed by chained hashes of `BLOCK_TOKENS`-token blocks, so a lookup walks
  the prompt's blocks once instead of comparing every cached state. The chain starts from the
  tenant's namespace (the API key's): one key's prompts are never a hit for another key, so
  `cache_n` and the time to first token tell no key what another sent.
- With `--cache-idle-slots` (on by default, as llama-server), a task starting on a slot saves
  every other idle anonymous slot, and with unified KV clears it (`cache_idle_slots`).
- It is a cache: under its byte budget (`--cache-ram`, and at most half the page store) the
  least recently used states are dropped, never spilled, and a store that cannot take a state
  means it is not saved. Minds are never entries: a mind's page is never consumed by an
  anonymous request.

Runs on the engine thread (the demoter may drop entries from the store meanwhile: a lookup
checks that a page still exists). No file I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import KvswapError
from kvswap.core.keys import PageKey, PageKind, anon_key
from kvswap.core.types import GenerationRequest
from kvswap.engine.kv.buffers import BufferWorker
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.kv.spare import Spare, ask_quietly, in_hand
from kvswap.engine.ports import CacheRuntime
from kvswap.engine.seats.mindprefix import best_mind_page, best_resident
from kvswap.engine.seats.outcomes import NoRoomYet
from kvswap.engine.slot import Slot, SlotTable

log = logging.getLogger("kvswap.minds")

# Index granularity; also the least prefix worth saving or moving. 32, not 64: llama-server
# caches prompts of any length, and a 64-token prompt (one block, less the token always
# evaluated) would otherwise never be found again.
BLOCK_TOKENS = 32


class Kept(Enum):
    """What `save` or `keep` did with a slot's state."""

    SAVED = "saved"  # a new entry
    CACHED = "cached"  # an equal state is already an entry
    WAITING = "waiting"  # no prepared buffer yet (one is being mapped): not saved
    REFUSED = "refused"  # off, too short, past the budget, or no room in the store


def block_hashes(tokens: npt.NDArray[np.int32], namespace: str) -> list[bytes]:
    """Chained hashes of the full blocks of `tokens` of tenant `namespace`: entry i covers
    tokens [0, (i+1)*B); the chain starts from the namespace, so tenants never share one."""
    out: list[bytes] = []
    h = hashlib.blake2b(namespace.encode(), digest_size=16).digest()
    for i in range(len(tokens) // BLOCK_TOKENS):
        block = np.ascontiguousarray(tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS])
        h = hashlib.blake2b(h + block.tobytes(), digest_size=16).digest()
        out.append(h)
    return out


@dataclass
class _Entry:
    key: PageKey
    tokens: npt.NDArray[np.int32]
    namespace: str  # the tenant whose prompt it is
    hashes: list[bytes]
    n_bytes: int
    t_used: float = field(default_factory=time.monotonic)


class AnonCache:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: PageStore | None,
        runtime: CacheRuntime,
        slots: SlotTable,
        budget_bytes: int,
        buffers: BufferWorker,
        cache_idle_slots: bool = True,
        seed_from_minds: bool = True,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.slots = slots
        self.budget_bytes = budget_bytes  # 0: off; -1: only the store's half
        self.idle_slots = cache_idle_slots  # --cache-idle-slots
        self.seed_from_minds = seed_from_minds and store is not None  # off in a cluster
        self._entries: dict[PageKey, _Entry] = {}
        self._index: dict[bytes, set[PageKey]] = {}
        self._ids = itertools.count(1)
        self.spare = Spare(store, buffers, "anon-cache") if store is not None else None
        self.n_saved = 0
        self.n_hits = 0
        self.n_mind_seeds = 0  # new minds begun from another mind's page (`mindprefix`)
        self.n_skipped = 0  # saves skipped: no prepared buffer was ready
        if self.idle_slots and self.enabled:
            cleared = " and cleared" if runtime.geometry.kv_unified else ""
            log.debug(
                "idle slots will be saved to the prompt cache%s upon starting a new task "
                "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__",
                cleared,
            )

    @property
    def enabled(self) -> bool:
        return self.budget_bytes != 0 and self.store is not None

    def _limit(self) -> int:
        store = self.store
        assert store is not None
        half = store.ceiling_bytes // 2
        return half if self.budget_bytes < 0 else min(self.budget_bytes, half)

    # -- lookup -----------------------------------------------------------------------------

    def best(self, prompt: npt.NDArray[np.int32], namespace: str) -> tuple[PageKey, int] | None:
        """The cached state of tenant `namespace` sharing the longest prefix with `prompt`, and
        that length."""
        self._forget_gone()
        found: set[PageKey] = set()
        for h in block_hashes(prompt[: len(prompt) - 1], namespace):
            names = self._index.get(h)
            if not names:
                break
            found = names
        best: tuple[PageKey, int] | None = None
        for key in sorted(found):
            tokens = self._entries[key].tokens
            n = min(len(tokens), len(prompt))
            diff = np.flatnonzero(tokens[:n] != prompt[:n])
            common = int(diff[0]) if len(diff) else n
            if best is None or common > best[1]:
                best = (key, common)
        return best

    # -- the two moves ----------------------------------------------------------------------

    def prepare(self, slot: Slot, prompt: npt.NDArray[np.int32], namespace: str) -> None:
        """Before an anonymous request of tenant `namespace` starts on `slot`: bring its best
        cached prefix in, and keep what the slot would lose."""
        if not self.enabled:
            return
        n_slot = min(slot.prefix_for(prompt, namespace), len(prompt) - 1)
        best = self.best(prompt, namespace)
        if best is not None and best[1] >= n_slot + BLOCK_TOKENS:
            assert self.store is not None and self.spare is not None
            log.debug(
                "updating prompt cache: slot %d takes %s (%d tokens)", slot.id, best[0], best[1]
            )
            self.displace(slot, ask_next=False)
            key = best[0]
            page = self.store.hold(key)  # its buffer, once paged in, is the next save's spare
            try:
                self.runtime.verbs.page_in(slot, key)
            except KvswapError as err:
                # Made under another geometry (a reconfigure): of no use to anyone now.
                log.warning("anonymous cache: %s could not be paged in: %s", key, err.message)
                self.store.release(page)
                self.drop(key)
                return
            self.spare.adopt(page)  # no fault-in for the next save, no unmap for this page
            ask_quietly(self.spare, page.n_bytes)  # (a no-op when the adopted one will do)
            self._remove(key)
            slot.namespace = namespace
            self.n_hits += 1
            slot.t_last_used = time.monotonic()
        elif len(slot.tokens) - n_slot >= BLOCK_TOKENS:
            self.displace(slot)

    def seed(self, slot: Slot, request: GenerationRequest | None, mind: PageKey) -> None:
        """A new `mind` starts on `slot` (whose own state was saved) for `request` (None: a
        mind verb, which starts it empty): it begins with the longest prefix of its prompt that
        the slot, its tenant's cache or its tenant's minds in RAM hold (`mindprefix`), copied
        in so the entry or mind stays for the next one (a shared system prompt is prefilled
        once); the slot keeps nothing of another tenant's."""
        if request is None or not request.cache_prompt:
            self.runtime.verbs.clear(slot)
            return
        namespace = mind.namespace
        prompt = np.asarray(request.prompt_tokens, dtype=np.int32)
        n_slot = min(slot.prefix_for(prompt, namespace), len(prompt) - 1)
        best = self.best(prompt, namespace) if self.enabled else None
        if self.seed_from_minds:  # the tenant's other minds (`mindprefix`)
            assert self.store is not None
            other = best_mind_page(self.store, prompt, namespace)
            if other is not None and (best is None or other[1] > best[1]):
                best = other
            if self._share(slot, prompt, mind, max(n_slot + BLOCK_TOKENS, best[1] if best else 0)):
                return
        if best is not None and best[1] >= n_slot + BLOCK_TOKENS:
            key = best[0]
            try:
                self.runtime.verbs.copy_in(slot, key)
            except KvswapError as err:  # another geometry's, or no room in a full pool now
                log.warning("%s could not seed mind %s: %s", key, mind, err.message)
            else:
                slot.namespace = namespace
                if key in self._entries:
                    self._entries[key].t_used = time.monotonic()
                    self.n_hits += 1
                else:
                    self.n_mind_seeds += 1
                    log.info("mind %s starts from %s's first %d tokens", mind, key, best[1])
                return
            n_slot = 0  # the slot was emptied by the failed load
        if n_slot == 0:
            self.runtime.verbs.clear(slot)

    def _share(
        self, slot: Slot, prompt: npt.NDArray[np.int32], mind: PageKey, n_least: int
    ) -> bool:
        """Seed new `mind` on `slot` from the tenant's resident slot sharing at least `n_least`
        tokens of `prompt`, by sharing its cells (`SlotVerbs.share_prefix`); False when none
        does or the pool cannot share."""
        near = best_resident(self.slots, slot, prompt, mind.namespace)
        if near is None or near[1] < n_least:
            return False
        donor, n_common = near
        n_shared = self.runtime.verbs.share_prefix(donor, slot, n_common)
        if n_shared == 0:
            return False
        slot.namespace = mind.namespace
        self.n_mind_seeds += 1
        log.info("mind %s shares slot %d's first %d tokens", mind, donor.id, n_shared)
        return True

    def expect(self, slot: Slot) -> None:
        """An anonymous request ended on `slot`: have a buffer prepared that can hold its state,
        so that the request which displaces it later finds one ready."""
        if self.enabled and slot.mind is None and len(slot.tokens) >= BLOCK_TOKENS:
            assert self.spare is not None
            n_bytes = self.runtime.verbs.mover.measure(slot).n_bytes
            if n_bytes <= self._limit():  # (a state the cache would refuse needs no buffer)
                ask_quietly(self.spare, n_bytes)

    def save(self, slot: Slot, ask_next: bool = True) -> Kept:
        """Keep the slot's anonymous state as a cached page (the slot keeps it too); then
        have the next save's buffer mapped (`ask_next`)."""
        if not self.enabled or slot.mind is not None or len(slot.tokens) < BLOCK_TOKENS:
            return Kept.REFUSED
        tokens = slot.tokens.view().copy()
        hashes = block_hashes(tokens, slot.namespace)
        if any(len(e.tokens) == len(tokens) and e.hashes == hashes for e in self._entries.values()):
            return Kept.CACHED  # an earlier save of the same prompt
        verbs, spare = self.runtime.verbs, self.spare
        assert spare is not None
        layout = verbs.mover.measure(slot)
        if layout.n_bytes > self._limit():
            return Kept.REFUSED
        if not spare.ready_for(layout.n_bytes):
            # Never map on the engine thread: skip this save, and have a buffer mapped for the
            # next one (a full store means it is simply not kept: not a failed verb); one off
            # the store's shelf is in hand at once.
            if spare.error:  # the last mapping failed: do not wait for another now
                spare.error = ""
                self.n_skipped += 1
                return Kept.REFUSED
            ready = in_hand(spare, layout.n_bytes)
            if ready is None:
                self.n_skipped += 1
                return Kept.REFUSED
            if not ready:
                return Kept.WAITING
        if not self._make_room(layout.n_bytes):
            return Kept.REFUSED
        key = anon_key(next(self._ids))
        took = spare.take(key, layout.n_bytes)
        assert took is not None
        buffer, reservation = took
        verbs.capture_to_page(
            slot, layout=layout, reservation=reservation, buffer=buffer, keep_slot=True
        )
        self._add(_Entry(key, tokens, slot.namespace, hashes, layout.n_bytes))
        self.n_saved += 1
        if ask_next:
            ask_quietly(spare, layout.n_bytes)  # the next save's buffer, mapped meanwhile
        return Kept.SAVED

    def cache_idle_slots(self, started: Slot) -> None:
        """`--cache-idle-slots` (llama-server's default): a task started on `started`, so every
        other idle anonymous slot is saved to the cache and, with unified KV, cleared: the
        shared pool then holds only active work, and a later request finds the state here.

        Unlike llama-server, a slot whose state the cache did not take (under BLOCK_TOKENS, no
        room, or no prepared buffer yet) keeps it: clearing would lose it, for almost no KV.
        """
        if not (self.enabled and self.idle_slots):
            return
        unified = self.runtime.geometry.kv_unified
        for slot in self.slots:
            if slot is started or slot.running is not None or slot.locked or slot.mind is not None:
                continue
            if len(slot.tokens) and self.save(slot) in (Kept.SAVED, Kept.CACHED):
                log.debug(
                    "slot %d: idle slot saved to the prompt cache __TEST_TAG_CACHE_IDLE_SLOT__",
                    slot.id,
                )
                if unified:
                    self.runtime.memory.cut(slot, 0)

    def displace(self, slot: Slot, ask_next: bool = True) -> None:
        """Save the slot's anonymous state before a request overwrites it (`save`); while the
        buffer for it is being mapped the request waits (`NoRoomYet`, retried when the buffer
        arrives) rather than lose a prompt the cache has room for: a conversation's first turn
        runs anonymous, and its second finds it here."""
        if self.save(slot, ask_next) is Kept.WAITING:
            raise NoRoomYet()

    def keep(self, slot: Slot) -> Kept:
        """A full KV pool needs the idle anonymous slot's cells: its state becomes an entry (or
        is one already) and the slot is emptied; nothing changes unless SAVED or CACHED."""
        kept = self.save(slot)
        if kept in (Kept.SAVED, Kept.CACHED):
            self.runtime.verbs.clear(slot)
        return kept

    def new_key(self) -> PageKey:
        """The key of an entry-to-be (a reconfigure moves an idle anonymous slot under it)."""
        return anon_key(next(self._ids))

    def adopt(self, key: PageKey, tokens: npt.NDArray[np.int32], namespace: str) -> bool:
        """Make the stored page `key` (made by `new_key`) an entry holding `tokens` of tenant
        `namespace`; under the budget it is dropped instead (False)."""
        store = self.store
        assert store is not None
        page = store.get(key)
        if not self.enabled or len(tokens) < BLOCK_TOKENS or not self._make_room(page.n_bytes):
            store.remove(key)
            return False
        self._add(_Entry(key, tokens, namespace, block_hashes(tokens, namespace), page.n_bytes))
        return True

    def drop_all(self) -> int:
        """Forget every entry (a KV type change made them useless); how many there were."""
        n = len(self._entries)
        for key in list(self._entries):
            self.drop(key)
        return n

    def _add(self, entry: _Entry) -> None:
        self._entries[entry.key] = entry
        for h in entry.hashes:
            self._index.setdefault(h, set()).add(entry.key)

    def close(self) -> None:
        if self.spare is not None:
            self.spare.close()

    # -- bookkeeping ------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return {
            "anon_cache_bytes": float(self.n_bytes()),
            "anon_cache_entries": float(len(self._entries)),
            "anon_cache_saved_total": float(self.n_saved),
            "anon_cache_hits_total": float(self.n_hits),
            "anon_cache_skipped_total": float(self.n_skipped),
            "mind_seeds_total": float(self.n_mind_seeds),
        }

    def n_bytes(self) -> int:
        return sum(e.n_bytes for e in self._entries.values())

    def _make_room(self, n_bytes: int) -> bool:
        limit = self._limit()
        if n_bytes > limit:
            return False
        for entry in sorted(self._entries.values(), key=lambda e: e.t_used):
            if self.n_bytes() + n_bytes <= limit:
                break
            self.drop(entry.key)
        return self.n_bytes() + n_bytes <= limit

    def shed(self, n_bytes: int, *, now: bool = False) -> int:
        """Drop least recently used states until `n_bytes` are freed (or none is left); the
        bytes freed. The demoter asks this when the page store runs short of headroom; a
        client's page_out with `now` (the bytes are free on return, and the cache's spare
        buffer goes back to the store's shelf too)."""
        freed = 0
        for entry in sorted(self._entries.values(), key=lambda e: e.t_used):
            if freed >= n_bytes:
                break
            self.drop(entry.key, now=now)
            freed += entry.n_bytes
        if now and freed < n_bytes and self.spare is not None:
            freed += self.spare.give_back()
        return freed

    def drop(self, key: PageKey, *, now: bool = False) -> None:
        store = self.store
        if store is not None:
            store.remove(key, now=now)
        self._remove(key)

    def _remove(self, key: PageKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        for h in entry.hashes:
            keys = self._index.get(h)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[h]

    def check_integrity(self) -> None:
        """Assert the index is exactly the entries' block hashes, and each entry is a page."""
        expected: dict[bytes, set[PageKey]] = {}
        for key, entry in self._entries.items():
            assert entry.key == key, key
            assert entry.hashes == block_hashes(entry.tokens, entry.namespace), key
            assert key.kind is PageKind.ANON, key
            for h in entry.hashes:
                expected.setdefault(h, set()).add(key)
            if self.store is not None:
                assert self.store.has(key), f"cache entry {key} has no page"
        assert self._index == expected, "the anonymous cache's index drifted from its entries"
        if self.store is not None:
            assert self.n_bytes() <= self._limit(), (self.n_bytes(), self._limit())

    def _forget_gone(self) -> None:
        store = self.store
        for key in [k for k in self._entries if store is None or not store.has(k)]:
            self._remove(key)
