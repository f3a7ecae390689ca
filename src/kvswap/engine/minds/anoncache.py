"""The anonymous prompt cache: states of requests that name no mind, kept as RAM pages and found
again by their longest common token prefix (as llama-server's `--cache-ram`).

- When an anonymous request is about to overwrite most of an idle slot's cached prompt, or a
  mind takes a slot that holds one, that state is saved as a page `anon~N` first (one memcpy).
- An anonymous request takes whichever is longer: the prefix its slot already holds or the
  best cached state's, which is then paged into its slot.
- Cached states are indexed by chained hashes of `BLOCK_TOKENS`-token blocks, so a lookup walks
  the prompt's blocks once instead of comparing every cached state.
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

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import KvswapError
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.runtime import Runtime
from kvswap.engine.slot import Slot, SlotTable

log = logging.getLogger("kvswap.minds")

KEY_PREFIX = "anon~"
# Index granularity; also the least prefix worth saving or moving. 32, not 64: llama-server
# caches prompts of any length, and a 64-token prompt (one block, less the token always
# evaluated) would otherwise never be found again.
BLOCK_TOKENS = 32


def block_hashes(tokens: npt.NDArray[np.int32]) -> list[bytes]:
    """Chained hashes of the full blocks of `tokens`: entry i covers tokens [0, (i+1)*B)."""
    out: list[bytes] = []
    h = b""
    for i in range(len(tokens) // BLOCK_TOKENS):
        block = np.ascontiguousarray(tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS])
        h = hashlib.blake2b(h + block.tobytes(), digest_size=16).digest()
        out.append(h)
    return out


@dataclass
class _Entry:
    name: str
    tokens: npt.NDArray[np.int32]
    hashes: list[bytes]
    n_bytes: int
    t_used: float = field(default_factory=time.monotonic)


class AnonCache:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: PageStore | None,
        runtime: Runtime,
        slots: SlotTable,
        budget_bytes: int,
        cache_idle_slots: bool = True,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.slots = slots
        self.budget_bytes = budget_bytes  # 0: off; -1: only the store's half
        self.idle_slots = cache_idle_slots  # --cache-idle-slots
        self._entries: dict[str, _Entry] = {}
        self._index: dict[bytes, set[str]] = {}
        self._ids = itertools.count(1)
        self.n_saved = 0
        self.n_hits = 0
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

    def best(self, prompt: npt.NDArray[np.int32]) -> tuple[str, int] | None:
        """The cached state sharing the longest prefix with `prompt`, and that length."""
        self._forget_gone()
        found: set[str] = set()
        for h in block_hashes(prompt[: len(prompt) - 1]):
            names = self._index.get(h)
            if not names:
                break
            found = names
        best: tuple[str, int] | None = None
        for name in found:
            tokens = self._entries[name].tokens
            n = min(len(tokens), len(prompt))
            diff = np.flatnonzero(tokens[:n] != prompt[:n])
            common = int(diff[0]) if len(diff) else n
            if best is None or common > best[1]:
                best = (name, common)
        return best

    # -- the two moves ----------------------------------------------------------------------

    def prepare(self, slot: Slot, prompt: npt.NDArray[np.int32]) -> None:
        """Before an anonymous request starts on `slot`: bring the best cached prefix in, and
        keep what the slot would lose."""
        if not self.enabled:
            return
        n_slot = min(slot.tokens.common_prefix(prompt), len(prompt) - 1)
        best = self.best(prompt)
        if best is not None and best[1] >= n_slot + BLOCK_TOKENS:
            log.debug(
                "updating prompt cache: slot %d takes %s (%d tokens)", slot.id, best[0], best[1]
            )
            self.save(slot)
            name = best[0]
            try:
                self.runtime.verbs.page_in(slot, name)
            except KvswapError as err:
                log.warning("anonymous cache: %s could not be paged in: %s", name, err.message)
                return
            self._remove(name)
            self.n_hits += 1
            slot.t_last_used = time.monotonic()
        elif len(slot.tokens) - n_slot >= BLOCK_TOKENS:
            self.save(slot)

    def save(self, slot: Slot) -> bool:
        """Keep the slot's anonymous state as a cached page (the slot keeps it too); whether
        the cache holds it now."""
        if not self.enabled or slot.mind is not None or len(slot.tokens) < BLOCK_TOKENS:
            return False
        tokens = slot.tokens.view().copy()
        hashes = block_hashes(tokens)
        if any(len(e.tokens) == len(tokens) and e.hashes == hashes for e in self._entries.values()):
            return True  # already cached (an earlier save of the same prompt)
        verbs = self.runtime.verbs
        layout = verbs.mover.measure(slot)
        if not self._make_room(layout.n_bytes):
            return False
        name = f"{KEY_PREFIX}{next(self._ids)}"
        store = self.store
        assert store is not None
        try:
            reservation = store.reserve(name, layout.n_bytes)
        except KvswapError:
            return False  # the store is full: an entry is simply not kept (not a failed verb)
        verbs.capture_to_page(slot, name, layout=layout, reservation=reservation, keep_slot=True)
        entry = _Entry(name, tokens, hashes, layout.n_bytes)
        self._entries[name] = entry
        for h in hashes:
            self._index.setdefault(h, set()).add(name)
        self.n_saved += 1
        return True

    def cache_idle_slots(self, started: Slot) -> None:
        """`--cache-idle-slots` (llama-server's default): a task started on `started`, so every
        other idle anonymous slot is saved to the cache and, with unified KV, cleared: the
        shared pool then holds only active work, and a later request finds the state here.

        Unlike llama-server, a slot whose state the cache did not take (under BLOCK_TOKENS, or
        no room) keeps it: clearing would lose it, for almost no KV.
        """
        if not (self.enabled and self.idle_slots):
            return
        unified = self.runtime.geometry.kv_unified
        for slot in self.slots:
            if slot is started or slot.running is not None or slot.locked or slot.mind is not None:
                continue
            if len(slot.tokens) and self.save(slot):
                log.debug(
                    "slot %d: idle slot saved to the prompt cache __TEST_TAG_CACHE_IDLE_SLOT__",
                    slot.id,
                )
                if unified:
                    self.runtime.memory.cut(slot, 0)

    # -- bookkeeping ------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return {
            "anon_cache_bytes": float(self.n_bytes()),
            "anon_cache_entries": float(len(self._entries)),
            "anon_cache_saved_total": float(self.n_saved),
            "anon_cache_hits_total": float(self.n_hits),
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
            self.drop(entry.name)
        return self.n_bytes() + n_bytes <= limit

    def shed(self, n_bytes: int) -> int:
        """Drop least recently used states until `n_bytes` are freed (or none is left); the
        bytes freed. The demoter asks this when the page store runs short of headroom."""
        freed = 0
        for entry in sorted(self._entries.values(), key=lambda e: e.t_used):
            if freed >= n_bytes:
                break
            self.drop(entry.name)
            freed += entry.n_bytes
        return freed

    def drop(self, name: str) -> None:
        store = self.store
        if store is not None:
            store.remove(name)
        self._remove(name)

    def _remove(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        for h in entry.hashes:
            names = self._index.get(h)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._index[h]

    def check_integrity(self) -> None:
        """Assert the index is exactly the entries' block hashes, and each entry is a page."""
        expected: dict[bytes, set[str]] = {}
        for name, entry in self._entries.items():
            assert entry.name == name and entry.hashes == block_hashes(entry.tokens), name
            for h in entry.hashes:
                expected.setdefault(h, set()).add(name)
            if self.store is not None:
                assert self.store.has(name), f"cache entry {name} has no page"
        assert self._index == expected, "the anonymous cache's index drifted from its entries"
        if self.store is not None:
            assert self.n_bytes() <= self._limit(), (self.n_bytes(), self._limit())

    def _forget_gone(self) -> None:
        store = self.store
        for name in [n for n in self._entries if store is None or not store.has(n)]:
            self._remove(name)
