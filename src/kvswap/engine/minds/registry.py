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

A mind too large for the whole page store never has a page: with a disk tier the engine copies
it out and hands the copy over here (`hand_to_disk`); the demoter takes it, writes it as the
mind's spilled file and says how that went (`handoff_done`); the engine frees the slot once the
file holds the slot's state (`end_handoff`).

Owns the disk index, last use times, the set of minds with a request in progress (`busy`: a busy
mind's RAM page is never dropped by the demoter), which slot each resident mind is in (told by
the engine thread, read by the HTTP side), the handoffs to disk, the tier counters, and the
demoter's wake-up. A name costs nothing until its mind holds state: `forget_if_gone` drops every
entry of a mind that is in no tier and used by no request (a brand-new name whose request
failed, a mind whose last copy was dropped), so the registry holds about `ENTRY_BYTES` per mind
that holds state, and nothing per name that never did. An owner with methods: every field is
private and guarded by one lock.
Thread-safe: the engine thread, HTTP handlers and the demoter use it. No libllama, no files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvswap.core.keys import PageKey

if TYPE_CHECKING:
    from kvswap.engine.commands import Captured

# The bookkeeping a mind that holds state costs beyond its page and file bytes, as a stated
# bound: its registry entry (key, last use, disk copy: 363 bytes measured with tracemalloc over
# 5,000 minds) and, while it is a RAM page, the page's Python objects. A name that holds no
# state costs nothing. tests/server/test_tenants.py holds a server of 5,000 minds to it.
ENTRY_BYTES = 1024


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
    demotions_total: int = 0  # slot -> RAM page
    spills_total: int = 0  # RAM page -> disk
    spill_failed_total: int = 0
    disk_refused_total: int = 0  # a spill refused: --page-disk-bytes full
    disk_dropped_total: int = 0  # spilled minds dropped to make room (--page-disk-drop-lru)
    too_large_total: int = 0  # a mind larger than the whole page store left its slot
    flushes_total: int = 0  # an idle mind's state written on schedule (--page-flush-seconds)
    switch_ms_total: float = 0.0  # engine time spent seating minds (evict, page in, apply)

    def as_metrics(self) -> dict[str, float]:
        return {f"mind_{k}": float(v) for k, v in vars(self).items()}


@dataclass(frozen=True)
class MindView:
    """One mind as GET /pages shows it."""

    key: PageKey
    tier: str  # "slot", "ram" or "disk"
    slot_id: int  # -1 unless resident
    n_tokens: int
    n_bytes: int
    last_used_unix_s: float
    on_disk: bool  # a durable copy exists (possibly older than the live one)
    n_tokens_on_disk: int = 0  # the tokens of that copy (0: none)


class MindRegistry:
    """See the module docstring. Every field is private and read or written under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._disk: dict[PageKey, DiskCopy] = {}
        self._last_used: dict[PageKey, float] = {}  # key -> unix seconds
        # key -> when it first changed after its last disk copy (the flush schedule)
        self._dirty_since: dict[PageKey, float] = {}
        self._busy: set[PageKey] = set()
        self._resident: dict[PageKey, int] = {}  # key -> the slot holding it (the engine says)
        self._counters = MindCounters()
        self._largest_page_bytes = 0
        self._wake = threading.Event()  # the demoter's bell
        self._restore_ms: dict[PageKey, float] = {}  # key -> its last read-back's apply, ms
        self._disk_tier = False  # the demoter has a save path to spill to
        # Minds too large for the store on their way to disk: key -> the copy to write (None:
        # being written), then True (written) or False (the write failed).
        self._handoffs: dict[PageKey, Captured | bool | None] = {}
        self._handed_at: dict[PageKey, float] = {}  # key -> when its copy was taken
        self._too_large: set[PageKey] = set()  # minds whose size was logged
        # Minds spilled by a server with another model or KV types: key -> its file's
        # geometry. Never served here and never written over (their state stays on disk).
        self._foreign: dict[PageKey, str] = {}
        self._forgotten: dict[PageKey, float] = {}  # key -> when a slot verb ended it

    # -- use ---------------------------------------------------------------------------------

    def touch(self, key: PageKey, when_unix_s: float | None = None) -> None:
        """The mind was used now (its state changes: it is dirty until a disk copy taken after
        this is written), or, for a mind found at start, at `when_unix_s` unless it has been
        used since."""
        with self._lock:
            if when_unix_s is None:
                now = time.time()
                self._last_used[key] = now
                self._dirty_since.setdefault(key, now)
            else:
                self._last_used.setdefault(key, when_unix_s)

    def flushed(self, key: PageKey, t_copied_unix_s: float) -> None:
        """A disk copy of the mind taken at `t_copied_unix_s` is written: clean, unless it was
        used after that."""
        with self._lock:
            # Its first change since the last copy is not enough: a flush postpones that mark,
            # and a turn seated after the copy was taken changed it again (`touch` keeps the
            # earlier mark), so its last use must predate the copy too.
            if (
                self._dirty_since.get(key, float("inf")) <= t_copied_unix_s
                and self._last_used.get(key, 0.0) <= t_copied_unix_s
            ):
                del self._dirty_since[key]

    def due_for_flush(self, age_s: float) -> list[PageKey]:
        """Idle minds changed at least `age_s` seconds ago and not written since (oldest
        first); each is postponed by `age_s`, so a mind that cannot be written now is retried
        then, not on every pass."""
        with self._lock:
            now = time.time()
            due = [
                k for k, t in self._dirty_since.items() if t <= now - age_s and k not in self._busy
            ]
            due.sort(key=self._dirty_since.__getitem__)
            for key in due:
                self._dirty_since[key] = now
            return due

    def is_clean(self, key: PageKey) -> bool:
        """Mind `key` has a disk copy holding its newest state (not changed since it was taken)."""
        with self._lock:
            return key in self._disk and key not in self._dirty_since

    def any_busy(self) -> bool:
        """A request is using some mind now."""
        with self._lock:
            return bool(self._busy)

    def known(self, key: PageKey) -> bool:
        with self._lock:
            return key in self._last_used or key in self._disk

    def lru(self, keys: Iterable[PageKey]) -> list[PageKey]:
        """`keys`, least recently used first."""
        with self._lock:
            return sorted(keys, key=lambda k: self._last_used.get(k, 0.0))

    def set_busy(self, key: PageKey, busy: bool) -> None:
        """A request holds the mind (its RAM page is never dropped meanwhile), or let go."""
        with self._lock:
            if busy:
                self._busy.add(key)
            else:
                self._busy.discard(key)

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

    def forget_if_gone(self, key: PageKey, in_ram: Callable[[PageKey], bool]) -> bool:
        """Drop every entry of a mind that holds state in no tier and that no request holds;
        True when it was forgotten (its name then costs nothing)."""
        with self._lock:
            if key in self._busy or key in self._resident or key in self._disk or in_ram(key):
                return False
            if key in self._handoffs:
                return False  # on its way to disk
            self._last_used.pop(key, None)
            self._dirty_since.pop(key, None)
            self._too_large.discard(key)
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

    def forget(self, key: PageKey) -> DiskCopy | None:
        """A slot verb ended the mind (erase, page_out): it is known no more, and no copy of it
        taken before now may be written (`forgotten_after`); returns its disk copy (whose files
        the caller removes), if it had one."""
        with self._lock:
            self._forgotten[key] = time.time()
            self._last_used.pop(key, None)
            self._dirty_since.pop(key, None)
            self._too_large.discard(key)
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

    # -- minds too large for the page store ----------------------------------------------------

    def set_disk_tier(self, present: bool) -> None:
        with self._lock:
            self._disk_tier = present

    @property
    def has_disk_tier(self) -> bool:
        with self._lock:
            return self._disk_tier

    def first_too_large(self, key: PageKey) -> bool:
        """True the first time mind `key` is found too large for the store (log it once)."""
        with self._lock:
            if key in self._too_large:
                return False
            self._too_large.add(key)
            return True

    def hand_to_disk(self, key: PageKey, captured: Captured) -> None:
        """The engine hands a copy of a mind too large for the store to the demoter."""
        with self._lock:
            assert key not in self._handoffs, key
            self._handoffs[key] = captured
            self._handed_at[key] = time.time()
        self._wake.set()

    def take_handoff(self) -> tuple[PageKey, Captured, float] | None:
        """A copy to write and when it was taken (the demoter then owns its buffer), or None."""
        with self._lock:
            for key, value in self._handoffs.items():
                if value is not None and not isinstance(value, bool):
                    self._handoffs[key] = None
                    return key, value, self._handed_at[key]
            return None

    def handoff_done(self, key: PageKey, written: bool) -> None:
        with self._lock:
            if key in self._handoffs:  # not ended by a slot verb meanwhile
                self._handoffs[key] = written

    def handoff_state(self, key: PageKey) -> bool | None:
        """True: the copy is on disk; False: its write failed; None: none asked or under way
        (`handing` tells those apart)."""
        with self._lock:
            value = self._handoffs.get(key)
            return value if isinstance(value, bool) else None

    def handing(self, key: PageKey) -> bool:
        with self._lock:
            return key in self._handoffs

    def end_handoff(self, key: PageKey) -> None:
        with self._lock:
            self._handoffs.pop(key, None)
            self._handed_at.pop(key, None)

    def residents(self) -> dict[PageKey, int]:
        """Every resident mind and its slot (a copy)."""
        with self._lock:
            return dict(self._resident)

    def handoff_keys(self) -> set[PageKey]:
        with self._lock:
            return set(self._handoffs)

    # -- page sizes and the demoter's bell -----------------------------------------------------

    def saw_page(self, n_bytes: int) -> None:
        with self._lock:
            self._largest_page_bytes = max(self._largest_page_bytes, n_bytes)

    @property
    def largest_page_bytes(self) -> int:
        with self._lock:
            return self._largest_page_bytes

    def headroom_bytes(self, ceiling_bytes: int) -> int:
        """Free bytes the demoter keeps in a store of `ceiling_bytes`: room for a mind switch,
        so that it stays a memcpy (a quarter of the store, or the largest mind page seen)."""
        return min(ceiling_bytes, max(ceiling_bytes // 4, self.largest_page_bytes))

    def need_room(self) -> None:
        """Wake the demoter (the store is short of its headroom, or a switch waits for room)."""
        self._wake.set()

    def wait_for_work(self, timeout_s: float) -> None:
        """The demoter sleeps until woken (or `timeout_s`)."""
        self._wake.wait(timeout_s)
        self._wake.clear()

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
