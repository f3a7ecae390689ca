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
mind's RAM page is never dropped by the demoter), the counters, and the demoter's wake-up.
Thread-safe: the engine thread, HTTP handlers and the demoter use it. No libllama, no files.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field

from kvswap.engine.types import ErrorKind, KvswapError

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
    hits_disk_total: int = 0  # ... on disk only (read back)
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


@dataclass
class MindRegistry:
    """See the module docstring."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    disk: dict[str, DiskCopy] = field(default_factory=dict)
    last_used: dict[str, float] = field(default_factory=dict)  # key -> unix seconds
    busy: set[str] = field(default_factory=set)
    counters: MindCounters = field(default_factory=MindCounters)
    wake: threading.Event = field(default_factory=threading.Event)  # the demoter's bell
    # Why the demoter could not make room last time (empty: it could); the engine fails a
    # switch that waits for room with this reason instead of waiting forever.
    room_error: str = ""
    n_demote_passes: int = 0  # completed demoter passes (a waiting switch reads its answer)
    largest_page_bytes: int = 0

    def touch(self, key: str) -> None:
        with self.lock:
            self.last_used[key] = time.time()

    def known(self, key: str) -> bool:
        with self.lock:
            return key in self.last_used or key in self.disk

    def set_busy(self, key: str, busy: bool) -> None:
        with self.lock:
            if busy:
                self.busy.add(key)
            else:
                self.busy.discard(key)

    def need_room(self) -> None:
        """The engine could not page a mind out: wake the demoter."""
        self.wake.set()

    def saw_page(self, n_bytes: int) -> None:
        with self.lock:
            self.largest_page_bytes = max(self.largest_page_bytes, n_bytes)

    def lru(self, keys: list[str]) -> list[str]:
        """`keys`, least recently used first."""
        with self.lock:
            return sorted(keys, key=lambda k: self.last_used.get(k, 0.0))
