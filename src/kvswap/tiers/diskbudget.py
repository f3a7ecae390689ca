"""The disk tier's byte budget (`--page-disk-bytes`): whether a mind's spill fits, and the least
recently used spilled minds dropped to make it fit (`--page-disk-drop-lru`).

The budget counts every mind's last spilled generation (the registry's disk index); a mind's own
old copy is replaced by its new one, so it does not count against it. When the new copy does
not fit:
- a scheduled flush or a hand-off that may not drop (`may_drop=False`) is refused quietly: the
  mind is tried again later and no other mind loses its copy for it;
- without `--page-disk-drop-lru` the spill is refused with a typed reason naming both flags
  (the mind switch waiting for room answers it), counted and logged;
- with it, idle minds' spilled copies go, least recently used first, until the copy fits: their
  files are removed, each is counted and logged, and `settle` lets a mind that now lives nowhere
  be forgotten. A mind a request holds never loses its copy, nor one a retention floor keeps
  (Anthropic's `cache_control`: `MindRegistry.retain`) until the floor has passed, within the
  floors' cap: floors keep at most `FLOORS_SHARE` of the budget in all, split evenly between
  the tenants that hold floors. Past it the floors give way (Anthropic's floors are best effort
  too): the least recently used floored mind of the tenant furthest over its share goes first,
  so one tenant's floors never take another's share;
- when no copy can go (the rest are held by requests or within the floors' cap), the idle mind
  being spilled goes instead (`give_way`: its RAM page and any older copy), as its copy would
  have gone, unless a retention floor keeps it: minds waiting for a slot hold their copies, and
  a switch must not be refused while a mind the flag lets go is idle in RAM;
- else the refusal is a typed reason naming the flag, so the waiting switch answers a 503
  rather than waiting for a floor to pass.

Called by the demoter (its thread, the closing thread, the I/O executor) under no lock of its
own: the registry and the publisher are thread-safe, and the demoter's spill lock orders the
writes. No libllama.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from kvswap.core.keys import PageKey
from kvswap.engine.seats.registry import DiskCopy, MindRegistry
from kvswap.files import Publisher
from kvswap.tiers.mindfiles import file_name

log = logging.getLogger("kvswap.demoter")

FLOORS_SHARE = 0.5  # of --page-disk-bytes: the most that retention floors keep, all tenants


class DiskBudget:
    """See the module docstring. Threads: the demoter's (its thread, the closing thread, the I/O
    executor for a client's spill); it keeps no state of its own between calls."""

    def __init__(
        self,
        *,
        bound_bytes: int | None,
        drop_lru: bool,
        registry: MindRegistry,
        publisher: Publisher,
        settle: Callable[[PageKey], None],
    ) -> None:
        self.bound_bytes = bound_bytes  # None: no bound
        self.drop_lru = drop_lru
        self.registry = registry
        self.publisher = publisher
        self.settle = settle  # a mind whose copy was dropped may live nowhere now

    def room(self, key: PageKey, n_bytes: int, may_drop: bool = True) -> str | None:
        """None when a copy of `n_bytes` of mind `key` fits (its own old copy replaced), else
        why not: a reason for the waiting switch, or "" (a quiet refusal: `may_drop` off).
        `may_drop`: --page-disk-drop-lru may make the room."""
        bound = self.bound_bytes
        if bound is None:
            return None
        reg = self.registry
        copies = reg.disk_copies()
        used = sum(c.n_bytes for k, c in copies.items() if k != key)
        if used + n_bytes <= bound:
            return None
        if not may_drop:
            return ""
        if not self.drop_lru:
            reg.count(disk_refused_total=1)
            why = (
                f"the disk tier is full ({used} of --page-disk-bytes {bound} bytes; start with "
                "--page-disk-drop-lru to drop the least recently used spilled minds)"
            )
            log.warning("spill of mind %s refused: %s", key, why)
            return why
        others = [k for k in copies if k != key]
        for victim in reg.droppable(others):
            if used + n_bytes <= bound:
                break
            used -= self._drop(victim)
        if used + n_bytes > bound:
            for victim in self._floors_over_cap(others, copies):
                used -= self._drop(victim)
                if used + n_bytes <= bound:
                    break
        if used + n_bytes <= bound:
            return None
        reg.count(disk_refused_total=1)
        why = (
            f"the disk tier is full ({used} of --page-disk-bytes {bound} bytes, {n_bytes} more "
            "needed) and every spilled mind left is in use by a request or kept by a retention "
            f"floor (cache_control; floors keep at most {FLOORS_SHARE:.0%} of it); raise "
            "--page-disk-bytes"
        )
        log.warning("spill of mind %s refused: %s", key, why)
        return why

    def _floors_over_cap(
        self, keys: list[PageKey], copies: dict[PageKey, DiskCopy]
    ) -> Iterator[PageKey]:
        """The floored copies among `keys` past the floors' cap (see the module docstring), in
        the order they give way; the caller drops each one yielded."""
        assert self.bound_bytes is not None
        cap = int(self.bound_bytes * FLOORS_SHARE)
        held: dict[str, int] = {}  # tenant -> bytes its floors keep
        idle: dict[str, list[PageKey]] = {}  # tenant -> its floored idle minds, LRU first
        for k, busy in self.registry.floored(keys):
            held[k.namespace] = held.get(k.namespace, 0) + copies[k].n_bytes
            if not busy:
                idle.setdefault(k.namespace, []).append(k)
        while held:
            share = cap // len(held)
            over = [ns for ns in held if held[ns] > share and idle.get(ns)]
            if not over:
                return
            ns = max(over, key=lambda n: held[n])
            victim = idle[ns].pop(0)
            held[ns] -= copies[victim].n_bytes
            if held[ns] <= 0:
                del held[ns]
            yield victim

    def give_way(self, key: PageKey, free: Callable[[], object], where: str) -> bool:
        """A spill of mind `key` refused with `--page-disk-drop-lru` on (every spilled copy
        left is held): the mind goes instead, its state freed by `free` (it lives in `where`)
        and any older copy removed, unless a request holds it or a retention floor keeps it.
        True when gone."""
        reg = self.registry
        if not self.drop_lru or reg.floored([key]):
            return False
        if not reg.drop_if_idle(key, free):
            return False
        if reg.forget_disk(key) is not None:
            self.publisher.remove(file_name(key))
        self.settle(key)
        reg.count(disk_dropped_total=1)
        log.warning(
            "disk tier full of minds in use: dropped mind %s from %s (--page-disk-drop-lru)",
            key,
            where,
        )
        return True

    def _drop(self, victim: PageKey) -> int:
        """Drop mind `victim`'s spilled copy; the bytes it held (0: gone meanwhile)."""
        copy = self.registry.forget_disk(victim)
        if copy is None:
            return 0
        self.publisher.remove(file_name(victim))
        self.settle(victim)  # it lives nowhere now, unless in RAM meanwhile
        self.registry.count(disk_dropped_total=1)
        log.warning(
            "disk tier full: dropped spilled mind %s (%d bytes, --page-disk-drop-lru)",
            victim,
            copy.n_bytes,
        )
        return copy.n_bytes
