"""The mind registry: where each named conversation ("mind") lives, and the tiers' counters.

A mind is named by a request (`"mind": NAME` or `X-Mind-Id`) inside the namespace of the API
key that sent it. Its key (`mind~NS~HEX`, the name's UTF-8 in hex) is at once the name of its
RAM page and of its spilled file, so a mind has one identity on every tier:

- **slot**: a slot's `mind` field names it (set and cleared by the engine thread only);
- **RAM**: the page store holds a page under its key;
- **disk**: a committed generation under `--slot-save-path` carries its key.

The live copy is the highest of these: a disk copy left behind when the mind is promoted is its
last durable state (what a SIGKILL leaves), never served while a live copy exists.

Owns the disk index, last use times, the set of minds with a request in progress (`busy`: a busy
mind's RAM page is never dropped by the demoter), which slot each resident mind is in (told by
the engine thread, read by the HTTP side), the tier counters, and the demoter's wake-up. An owner
with methods: every field is private and guarded by one lock. Thread-safe: the engine thread,
HTTP handlers and the demoter use it. No libllama, no files.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvswap.core.errors import ErrorKind, KvswapError

KEY_PREFIX = "mind~"
NAME_MAX_BYTES = 100  # the key (prefix, namespace, hex) stays a valid page and file name
PUBLIC_NAMESPACE = "public"  # the namespace of requests sent without an API key


def namespace_of(api_key: str) -> str:
    """The namespace of an API key: names never collide across keys."""
    if not api_key:
        return PUBLIC_NAMESPACE
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def mind_key(namespace: str, name: str) -> str:
    """The key of mind `name` in `namespace`; a typed 400 for a bad name."""
    if not isinstance(name, str) or not name:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "a mind name must be a non-empty string")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as err:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "a mind name must be valid UTF-8") from err
    if len(raw) > NAME_MAX_BYTES:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"a mind name has at most {NAME_MAX_BYTES} bytes (this one has {len(raw)})",
        )
    if any(c < 0x20 or c == 0x7F for c in raw):
        raise KvswapError(ErrorKind.INVALID_REQUEST, "a mind name has no control characters")
    return f"{KEY_PREFIX}{namespace}~{raw.hex()}"


def is_mind_key(name: str) -> bool:
    return name.startswith(KEY_PREFIX)


def split_key(key: str) -> tuple[str, str]:
    """(namespace, name) of a key made by `mind_key`; ValueError for anything else."""
    if not is_mind_key(key):
        raise ValueError(f"not a mind key: {key!r}")
    namespace, _, hex_name = key[len(KEY_PREFIX) :].partition("~")
    return namespace, bytes.fromhex(hex_name).decode("utf-8")


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
    switch_ms_total: float = 0.0  # engine time spent seating minds (evict, page in, apply)

    def as_metrics(self) -> dict[str, float]:
        return {f"mind_{k}": float(v) for k, v in vars(self).items()}


@dataclass(frozen=True)
class MindView:
    """One mind as GET /pages shows it."""

    key: str
    namespace: str
    name: str
    tier: str  # "slot", "ram" or "disk"
    slot_id: int  # -1 unless resident
    n_tokens: int
    n_bytes: int
    last_used_unix_s: float
    on_disk: bool  # a durable copy exists (possibly older than the live one)


class MindRegistry:
    """See the module docstring. Every field is private and read or written under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._disk: dict[str, DiskCopy] = {}
        self._last_used: dict[str, float] = {}  # key -> unix seconds
        self._busy: set[str] = set()
        self._resident: dict[str, int] = {}  # key -> the slot holding it (the engine says)
        self._counters = MindCounters()
        self._largest_page_bytes = 0
        self._wake = threading.Event()  # the demoter's bell
        self._restore_ms: dict[str, float] = {}  # key -> its last read-back's apply, ms

    # -- use ---------------------------------------------------------------------------------

    def touch(self, key: str, when_unix_s: float | None = None) -> None:
        """The mind was used now (or, for a mind found at start, at `when_unix_s` unless it has
        been used since)."""
        with self._lock:
            if when_unix_s is None:
                self._last_used[key] = time.time()
            else:
                self._last_used.setdefault(key, when_unix_s)

    def known(self, key: str) -> bool:
        with self._lock:
            return key in self._last_used or key in self._disk

    def lru(self, keys: Iterable[str]) -> list[str]:
        """`keys`, least recently used first."""
        with self._lock:
            return sorted(keys, key=lambda k: self._last_used.get(k, 0.0))

    def set_busy(self, key: str, busy: bool) -> None:
        """A request holds the mind (its RAM page is never dropped meanwhile), or let go."""
        with self._lock:
            if busy:
                self._busy.add(key)
            else:
                self._busy.discard(key)

    def idle(self, keys: Iterable[str]) -> list[str]:
        """Those of `keys` no request holds, least recently used first."""
        with self._lock:
            free = [k for k in keys if k not in self._busy]
            return sorted(free, key=lambda k: self._last_used.get(k, 0.0))

    def begin_use(self, key: str, in_ram: Callable[[str], bool]) -> bool:
        """A request holds the mind from now on; True when the mind is on disk only (not in a
        slot, not in RAM per `in_ram`). Atomic with `drop_if_idle`: a page the demoter drops is
        either gone before this looks, or kept because the mind is busy."""
        with self._lock:
            self._busy.add(key)
            live = key in self._resident or in_ram(key)
            return not live and key in self._disk

    def drop_if_idle(self, key: str, drop: Callable[[], object]) -> bool:
        """Run `drop` (freeing the mind's RAM page) unless a request holds the mind."""
        with self._lock:
            if key in self._busy:
                return False
            drop()
            return True

    # -- tiers -------------------------------------------------------------------------------

    def seated(self, key: str, slot_id: int) -> None:
        """The engine put the mind's state into slot `slot_id`."""
        with self._lock:
            self._resident[key] = slot_id

    def unseated(self, key: str) -> None:
        """The mind's state left its slot (to its RAM page, or dropped)."""
        with self._lock:
            self._resident.pop(key, None)

    def restored(self, key: str, ms: float) -> None:
        """The engine applied a state read back for the mind (disk or shared tier) in `ms`."""
        with self._lock:
            self._restore_ms[key] = ms

    def pop_restore_ms(self, key: str) -> float | None:
        """The last read-back's apply time of the mind, once (None: none since)."""
        with self._lock:
            return self._restore_ms.pop(key, None)

    def resident_slot(self, key: str) -> int | None:
        with self._lock:
            return self._resident.get(key)

    def record_disk(self, key: str, copy: DiskCopy) -> None:
        with self._lock:
            self._disk[key] = copy

    def forget_disk(self, key: str) -> DiskCopy | None:
        with self._lock:
            return self._disk.pop(key, None)

    def disk_copy(self, key: str) -> DiskCopy | None:
        with self._lock:
            return self._disk.get(key)

    def disk_copies(self) -> dict[str, DiskCopy]:
        """Every mind's last spilled generation (a copy)."""
        with self._lock:
            return dict(self._disk)

    def last_used(self) -> dict[str, float]:
        """Every mind's last use, unix seconds (a copy)."""
        with self._lock:
            return dict(self._last_used)

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
            return self._counters.as_metrics()
