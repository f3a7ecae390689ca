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
  (Anthropic's `cache_control`: `MindRegistry.retain`) until the floor has passed.

Called by the demoter (its thread, the closing thread, the I/O executor) under no lock of its
own: the registry and the publisher are thread-safe, and the demoter's spill lock orders the
writes. No libllama.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvswap.core.keys import PageKey
from kvswap.engine.seats.registry import MindRegistry
from kvswap.files import Publisher
from kvswap.tiers.mindfiles import file_name

log = logging.getLogger("kvswap.demoter")


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
        why not: a reason for the waiting switch, or "" (a quiet refusal: `may_drop` off, or
        nothing left to drop). `may_drop`: --page-disk-drop-lru may make the room."""
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
        for victim in reg.droppable(k for k in copies if k != key):
            if used + n_bytes <= bound:
                break
            used -= self._drop(victim)
        return None if used + n_bytes <= bound else ""

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
