"""The mind registry: where each named conversation ("mind") lives, and the tiers' counters.

A mind is named by a request (`"mind": NAME` or `X-Mind-Id`) inside the namespace of the API
key that sent it: its key (`core.keys.mind_key`: kind, namespace, name) is the key of its RAM
page, and names its file in the minds' folder of the save path (`tiers.mindfiles`), so a mind
has one identity on every tier:

- **slot**: a slot's `mind` field names it (set and cleared by the engine thread only);
- **RAM**: the page store holds a page under its key;
- **disk**: a committed generation in the minds' folder carries its key.

The live copy is the highest of these: a disk copy left behind when the mind is promoted is its
last durable state (what a SIGKILL leaves), never served while a live copy exists.

Owns which slot each resident mind is in (told by the engine thread, read by the HTTP side), the
disk index, last use times, the set of minds with a request in progress (`busy`: a busy mind's
RAM page is never dropped by the demoter), minds of another model or KV types, minds a slot verb
ended, the last read-back's apply time, retention floors (`retain`: Anthropic's
`cache_control` keeps a mind's state that long, `droppable`) and the tier counters. Its neighbours own the rest of a
mind's bookkeeping, each behind a lock of its own: the flush schedule (`minds.flushes`) and the
hand-offs to disk (`minds.handoffs`); the page store keeps the headroom.

A name costs nothing until its mind holds state: `forget_if_gone` drops every entry of a mind
that is in no tier and used by no request (a brand-new name whose request failed, a mind whose
last copy was dropped), so the registry holds about `ENTRY_BYTES` per mind that holds state,
and nothing per name that never did. An owner with methods: every field is private and guarded
by one lock; the callbacks it is given run under that lock, so what they read is atomic with
`begin_use` (they may take the store's, the flush schedule's or the hand-offs' lock, which
never call back in).

Threads: the engine thread (seating, last use, counters), the event loop (busy marks, tiers,
views), the demoter thread and the I/O executor (the disk index, settling, forgetting), and the
shared tier's workers (whether a mind is idle or resident). No libllama, no files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvswap.core.keys import PageKey
from kvswap.core.vocab import MindTier

# The bookkeeping a mind that holds state costs beyond its page and file bytes, as a stated
# bound: its registry entry (key, last use, disk copy: 363 bytes measured with tracemalloc over
# 5,000 minds) and, while it is a RAM page, the page's Python objects. A name that holds no
# state costs nothing. tests/server/test_tenants.py holds a server of 5,000 minds to it.
ENTRY_BYTES = 1024


def _nothing(_: PageKey) -> None:
    """No neighbour's entries to drop."""


@dataclass(frozen=True)
class DiskCopy:
    """A mind's last spilled generation."""

    n_bytes: int  # every file of the generation
    n_tokens: int
    t_unix_s: float  # when it was written


@dataclass
class MindCounters:
    """Tier hits and moves, for /metrics (`mind_*`)."""

    hits_slot_total: int = 0  # a request found its mind resident
    hits_ram_total: int = 0  # ... as a RAM page (paged in)
    hits_disk_total: int = 0  # ... read back (from disk, or from the shared tier)
    new_total: int = 0  # a mind never seen starts fresh
    disk_seeds_total: int = 0  # ... from a prefix its tenant's mind on disk held (`diskseed`)
    demotions_total: int = 0  # slot -> RAM page
    spills_total: int = 0  # RAM page -> disk
    spill_failed_total: int = 0
    disk_refused_total: int = 0  # a spill refused: --page-disk-bytes full
    disk_dropped_total: int = 0  # spilled minds dropped to make room (--page-disk-drop-lru)
    too_large_total: int = 0  # a mind larger than the whole page store left its slot
    flushes_total: int = 0  # an idle mind's state written on schedule (--page-flush-seconds)
    switch_ms_total: float = 0.0  # engine time spent seating minds (evict, page in, apply)
    seat_wait_ms_total: float = 0.0  # jobs waiting for room to start (NoRoomYet), summed
    diverged_total: int = 0  # a request that did not extend its mind's history
    dropped_tokens_total: int = 0  # ... the tokens of the history it dropped
    read_ms_total: float = 0.0  # reading minds back from disk (I/O worker: read and verify)
    read_bytes_total: int = 0  # ... the bytes read
    restore_ms_total: float = 0.0  # applying states read back to their slots (engine)

    def as_metrics(self) -> dict[str, float]:
        return {f"mind_{k}": float(v) for k, v in vars(self).items()}


@dataclass(frozen=True)
class MindView:
    """One mind as GET /pages shows it."""

    key: PageKey
    tier: MindTier  # the fastest tier that holds it
    slot_id: int  # -1 unless resident
    n_tokens: int
    n_bytes: int
    last_used_unix_s: float
    on_disk: bool  # a durable copy exists (possibly older than the live one)
    n_tokens_on_disk: int = 0  # the tokens of that copy (0: none)


class MindRegistry:
    """See the module docstring. Every field is private and read or written under one lock.

    Threads: the engine thread (`seated`, `unseated`, `touch`, `restored`, `count`), the event
    loop (`begin_use`, `set_busy`, `foreign`, the views), the demoter thread and the closing
    thread (the disk index, `idle`, `busy`, `drop_if_idle`, `forgotten_after`), the I/O
    executor (`forget`, `when_not_live`, `forget_if_gone` through the demoter's `settle`), and
    the shared tier's workers (`idle`, `resident_slot`, `disk_copy`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock  # retention floors' unix seconds (a test's own makes them exact)
        self._disk: dict[PageKey, DiskCopy] = {}
        self._last_used: dict[PageKey, float] = {}  # key -> unix seconds
        self._kept_until: dict[PageKey, float] = {}  # key -> its retention floor, unix s
        self._busy: set[PageKey] = set()
        self._resident: dict[PageKey, int] = {}  # key -> the slot holding it (the engine says)
        self._counters = MindCounters()
        self._restore_ms: dict[PageKey, float] = {}  # key -> its last read-back's apply, ms
        # Minds spilled by a server with another model or KV types: key -> its file's
        # geometry. Never served here and never written over (their state stays on disk).
        self._foreign: dict[PageKey, str] = {}
        self._forgotten: dict[PageKey, float] = {}  # key -> when a slot verb ended it

    # -- use ---------------------------------------------------------------------------------

    def touch(self, key: PageKey, when_unix_s: float | None = None) -> None:
        """The mind was used now, or, for a mind found at start, at `when_unix_s` unless it has
        been used since."""
        with self._lock:
            if when_unix_s is None:
                self._last_used[key] = time.time()
            else:
                self._last_used.setdefault(key, when_unix_s)

    def retain(self, key: PageKey, ttl_s: float) -> None:
        """Keep the mind's state at least `ttl_s` from now in some tier (Anthropic's
        `cache_control`): `--page-disk-drop-lru` drops it only once that has passed."""
        with self._lock:
            until = self._clock() + ttl_s
            self._kept_until[key] = max(until, self._kept_until.get(key, 0.0))

    def droppable(self, keys: Iterable[PageKey]) -> list[PageKey]:
        """Those of `keys` no request holds and no retention floor keeps now, least recently
        used first: what a full disk tier may drop."""
        with self._lock:
            now = self._clock()
            free = [k for k in keys if k not in self._busy and self._kept_until.get(k, 0.0) <= now]
            return sorted(free, key=lambda k: self._last_used.get(k, 0.0))

    def floored(self, keys: Iterable[PageKey]) -> list[tuple[PageKey, bool]]:
        """Those of `keys` a retention floor keeps now, each with whether a request holds it,
        least recently used first: what the floors' cap weighs (`tiers.diskbudget`)."""
        with self._lock:
            now = self._clock()
            kept = [k for k in keys if self._kept_until.get(k, 0.0) > now]
            kept.sort(key=lambda k: self._last_used.get(k, 0.0))
            return [(k, k in self._busy) for k in kept]

    def any_busy(self) -> bool:
        """A request is using some mind now."""
        with self._lock:
            return bool(self._busy)

    def set_busy(self, key: PageKey, busy: bool) -> None:
        """A request holds the mind (its RAM page is never dropped meanwhile), or let go."""
        with self._lock:
            if busy:
                self._busy.add(key)
            else:
                self._busy.discard(key)

    def busy(self) -> frozenset[PageKey]:
        """The minds a request holds now (a copy)."""
        with self._lock:
            return frozenset(self._busy)

    def idle(self, keys: Iterable[PageKey]) -> list[PageKey]:
        """Those of `keys` no request holds, least recently used first."""
        with self._lock:
            free = [k for k in keys if k not in self._busy]
            return sorted(free, key=lambda k: self._last_used.get(k, 0.0))

    def begin_use(self, key: PageKey, in_ram: Callable[[PageKey], bool]) -> bool:
        """A request holds the mind from now on; True when the mind is on disk only (not in a
        slot, not in RAM per `in_ram`). Atomic with `drop_if_idle`: a page the demoter drops is
        either gone before this looks, or kept because the mind is busy."""
        with self._lock:
            self._busy.add(key)
            live = key in self._resident or in_ram(key)
            return not live and key in self._disk

    def disk_only(self, key: PageKey, in_ram: Callable[[PageKey], bool]) -> bool:
        """The mind is in no slot and no RAM page, and has a disk copy."""
        with self._lock:
            return key not in self._resident and not in_ram(key) and key in self._disk

    def drop_if_idle(self, key: PageKey, drop: Callable[[], object]) -> bool:
        """Run `drop` (freeing the mind's RAM page) unless a request holds the mind."""
        with self._lock:
            if key in self._busy:
                return False
            drop()
            return True

    def when_not_live(
        self, key: PageKey, in_ram: Callable[[PageKey], bool], fn: Callable[[], object]
    ) -> bool:
        """Run `fn` (releasing the mind's ownership) if no request holds the mind and it is
        neither resident nor a RAM page (`in_ram`), atomically with `begin_use`."""
        with self._lock:
            if key in self._busy or key in self._resident or in_ram(key):
                return False
            fn()
            return True

    def forget_if_gone(
        self,
        key: PageKey,
        held: Callable[[PageKey], bool],
        also: Callable[[PageKey], object] = _nothing,
    ) -> bool:
        """Drop every entry of a mind that holds state in no tier and that no request holds
        (nor `held`: its RAM page, its hand-off to disk), and run `also` (the neighbours' entries)
        under the same lock; True when it was forgotten (its name then costs nothing)."""
        with self._lock:
            if key in self._busy or key in self._resident or key in self._disk or held(key):
                return False
            self._last_used.pop(key, None)
            self._kept_until.pop(key, None)
            also(key)
            return True

    # -- tiers -------------------------------------------------------------------------------

    def seated(self, key: PageKey, slot_id: int) -> None:
        """The engine put the mind's state into slot `slot_id`."""
        with self._lock:
            self._resident[key] = slot_id

    def unseated(self, key: PageKey) -> None:
        """The mind's state left its slot (to its RAM page, or dropped)."""
        with self._lock:
            self._resident.pop(key, None)

    def restored(self, key: PageKey, ms: float) -> None:
        """The engine applied a state read back for the mind (disk or shared tier) in `ms`."""
        with self._lock:
            self._restore_ms[key] = ms

    def pop_restore_ms(self, key: PageKey) -> float | None:
        """The last read-back's apply time of the mind, once (None: none since)."""
        with self._lock:
            return self._restore_ms.pop(key, None)

    def resident_slot(self, key: PageKey) -> int | None:
        with self._lock:
            return self._resident.get(key)

    def record_disk(self, key: PageKey, copy: DiskCopy) -> None:
        with self._lock:
            self._disk[key] = copy

    def forget_disk(self, key: PageKey) -> DiskCopy | None:
        with self._lock:
            return self._disk.pop(key, None)

    def disk_copy(self, key: PageKey) -> DiskCopy | None:
        with self._lock:
            return self._disk.get(key)

    def disk_copies(self) -> dict[PageKey, DiskCopy]:
        """Every mind's last spilled generation (a copy)."""
        with self._lock:
            return dict(self._disk)

    def last_used(self) -> dict[PageKey, float]:
        """Every mind's last use, unix seconds (a copy)."""
        with self._lock:
            return dict(self._last_used)

    def forget(self, key: PageKey, also: Callable[[PageKey], object] = _nothing) -> DiskCopy | None:
        """A slot verb ended the mind (erase, page_out): it is known no more, and no copy of it
        taken before now may be written (`forgotten_after`); `also` runs under the same lock (the
        neighbours' entries). Returns its disk copy (whose files the caller removes), if any."""
        with self._lock:
            self._forgotten[key] = time.time()
            self._last_used.pop(key, None)
            self._kept_until.pop(key, None)
            also(key)
            return self._disk.pop(key, None)

    def record_foreign(self, key: PageKey, what: str) -> None:
        """Mind `key` is on disk under another model or KV types (`what` says which)."""
        with self._lock:
            self._foreign[key] = what

    def foreign(self, key: PageKey) -> str | None:
        """What made mind `key`'s file when it is another model's or KV types', else None."""
        with self._lock:
            return self._foreign.get(key)

    def forgotten_after(self, key: PageKey, t_unix_s: float) -> bool:
        """Mind `key` was ended at or after `t_unix_s`: a copy taken then must not be written."""
        with self._lock:
            return self._forgotten.get(key, -1.0) >= t_unix_s

    def residents(self) -> dict[PageKey, int]:
        """Every resident mind and its slot (a copy)."""
        with self._lock:
            return dict(self._resident)

    # -- counters ----------------------------------------------------------------------------

    def count(self, **deltas: float) -> None:
        """Add to the named counters (MindCounters' fields)."""
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + delta)

    def metrics(self) -> dict[str, float]:
        with self._lock:
            n_entries = len(self._last_used.keys() | self._disk.keys() | self._resident.keys())
            return {**self._counters.as_metrics(), "mind_entries": float(n_entries)}
