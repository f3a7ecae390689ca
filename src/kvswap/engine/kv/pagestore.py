"""The page store: host-RAM pages under one byte ceiling (`--page-ram-bytes`), found by key.

Owns every page's bytes (one anonymous `mmap` per page, closed when the last owner lets go) and
the one byte count that the ceiling is enforced on. Pages are keyed by `core.keys.PageKey`
(kind, tenant namespace, name): a client's page, a mind's, the anonymous cache's and the
engine's own live side by side and never collide, and a request can only ever build a key of its
own tenant's client page or mind. Pure Python: no libllama, no files.

Rules (docs/DESIGN.md, "Where a mind waits"):
- One count. `reserve(name, n_bytes)` admits a page with the bytes measured before any copy and
  charges exactly that; `commit` stores a buffer of exactly that size, so no estimate can let a
  page past the ceiling.
- Admission subtracts the page being replaced only when the store is its sole owner. A refusal
  (503 full now, 400 larger than the whole ceiling) never displaces the stored page.
- Open reservations are visible (`reservations`): a prepared spare buffer is charged and shown,
  so a 503 is explained by what /pages lists.
- The charge is released when the last owner drops a page: a spill holding a page keeps it
  counted after page_in, page_drop or replacement (`held` pages).
- At every moment the charge (pages + reservations + buffers being closed) is at most the
  ceiling: a page's bytes stay charged until its buffer is really unmapped. When a replacement
  only fits once the old page is gone, the old page is released before the new bytes are
  reserved (the copy then runs without a fallback); otherwise the old page lives until the new
  one is in.

The store also keeps the headroom the demoter frees under the ceiling for the next mind switch,
so that a switch stays a memcpy: a quarter of the store, or the largest mind page seen
(`saw_mind_page`, told by the engine as a mind leaves its slot), whichever is larger. The
switch's own prepared buffer (a reservation under `SWITCH_KEY`) is that room, so it counts as
headroom: the budget pays for the next switch once, not for a free mind beside a spare one.

A buffer freed by its last owner is not unmapped at once: up to `shelf_max` of them (the engine
keeps `SHELF_MAX`) stay on a shelf, faulted in and still charged (a reservation under
`SHELF_KEY`, shown among the spares), for the next buffer of about their size (`take_shelved`:
the engine's next spare, the next read of a mind from disk), which then costs no page faults:
fresh memory costs the kernel a zeroed page per 4 KiB, several times the copy that fills it. A
buffer whose user is done with it comes back the same way (`shelve`). The shelf is a cache: its
bytes never count against the headroom and are unmapped when a reservation needs them. A
recycled buffer is not zeroed: every user writes all the bytes it exposes (a capture fills its
layout end to end, a read fills its view).

Closing a buffer (munmap) costs milliseconds per hundred MB, so it goes through `dispose`, which
the engine points at a worker thread; the charge is released when the close is done. A close
that fails (a view of the buffer still exists: a bug) keeps its bytes charged, since they are
still mapped, and counts them in `leaked_bytes`, a gauge that stays 0 (checked by
`check_integrity`, so every engine and server test would fail on a leak).

Thread-safe: the engine thread reserves, commits and takes; HTTP handlers drop and list; spill
workers release their holds; the disposer releases charges; the disk reader takes and shelves.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kvswap.core.errors import PageNotFound, PageTooLarge, StoreFull
from kvswap.core.keys import PageKey, spare_key
from kvswap.core.page import LoraRef, PageLayout

log = logging.getLogger("kvswap.engine")

# Closes a buffer, then calls `done(closed)` (possibly on another thread); `closed` is False
# when the close failed and the bytes are still mapped.
Disposer = Callable[[mmap.mmap, Callable[[bool], None]], None]

SHELF_MAX = 2  # freed buffers kept for reuse: a disk switch's read and the next spare
SHELF_KEY = spare_key("recycled")  # the shelf's charge, shown among the spares
SWITCH_PURPOSE = "mind-switch"  # the spare a mind switch copies the outgoing mind into
SWITCH_KEY = spare_key(SWITCH_PURPOSE)  # its reservation: the headroom, prepared
_SHELF_MIN_BYTES = 1 << 20  # smaller buffers are cheap to map again: not worth a shelf place


def close_now(buffer: mmap.mmap, done: Callable[[bool], None]) -> None:
    """Close `buffer` here and report whether it really closed (a view still alive keeps it
    mapped: a bug, logged and counted, never silently ignored)."""
    try:
        buffer.close()
    except BufferError:
        log.error("a page buffer could not be unmapped: a view of it is still alive")
        done(False)
        return
    done(True)


@dataclass
class Page:
    """A page: one buffer, the layout of what it holds, and its owners."""

    key: PageKey
    generation: int  # unique per page object: a spill's `drop` frees only its own generation
    buffer: mmap.mmap  # everything the page holds, laid out by `layout`
    n_bytes: int  # the charge (the buffer's size)
    layout: PageLayout  # what lies where in `buffer`
    created_unix_s: float = field(default_factory=time.time)
    owners: int = 1  # the store (while it lists the page) plus running spills

    def view(self) -> memoryview:
        return memoryview(self.buffer)[: self.n_bytes]


@dataclass(frozen=True)
class Reservation:
    """Bytes admitted for a page being copied: commit it or cancel it, exactly once."""

    key: PageKey
    n_bytes: int


@dataclass(frozen=True)
class PageInfo:
    """One page as GET /pages shows it."""

    key: PageKey
    generation: int
    n_bytes: int
    n_tokens: int
    age_s: float
    in_store: bool  # False: dropped or replaced, still held by a running spill
    n_spills: int
    lora: tuple[LoraRef, ...] = ()  # the LoRA set its KV was computed under


@dataclass(frozen=True)
class StoreUsage:
    """The one count and its parts, read at one moment (GET /pages: the totals add up)."""

    charged_bytes: int
    pages: list[PageInfo]  # listed pages, then generations held by running spills
    reserved_bytes: dict[PageKey, int]  # admitted, not yet committed (spare buffers included)
    closing_bytes: int  # buffers being unmapped
    leaked_bytes: int  # buffers whose unmap failed (still charged)


def _infos(listed: list[Page], held: list[Page]) -> list[PageInfo]:
    now = time.time()
    return [
        PageInfo(
            key=p.key,
            generation=p.generation,
            n_bytes=p.n_bytes,
            n_tokens=p.layout.n_tokens,
            age_s=now - p.created_unix_s,
            in_store=in_store,
            n_spills=p.owners - (1 if in_store else 0),
            lora=p.layout.lora,
        )
        for pages, in_store in ((listed, True), (held, False))
        for p in pages
    ]


class PageStore:
    """Named pages under a byte ceiling; see the module docstring."""

    def __init__(
        self, ceiling_bytes: int, dispose: Disposer = close_now, shelf_max: int = 0
    ) -> None:
        self.ceiling_bytes = ceiling_bytes
        self._dispose = dispose
        self.shelf_max = shelf_max  # freed buffers kept for reuse (0: each is closed at once)
        self.shelf_min_bytes = _SHELF_MIN_BYTES  # smaller ones are closed
        # Re-entrant: a synchronous disposer gives the charge back from inside a release.
        self._lock = threading.RLock()
        self._pages: dict[PageKey, Page] = {}
        self._held: dict[int, Page] = {}  # generation -> page no longer listed, held by spills
        # pages (listed and held) + open reservations + closing buffers + leaked buffers
        self._charged = 0
        self._reserved: Counter[PageKey] = Counter()  # bytes of open reservations, by key
        self._closing = 0  # bytes of buffers given to the disposer and not yet unmapped
        self._leaked = 0  # bytes of buffers whose close failed (still mapped, still charged)
        self._largest_mind_page = 0  # bytes of the largest mind page seen (the headroom)
        self._shelf: list[tuple[mmap.mmap, int]] = []  # freed buffers and their charged bytes
        self._ids = itertools.count(1)

    # -- reading ----------------------------------------------------------------------------

    @property
    def charged_bytes(self) -> int:
        with self._lock:
            return self._charged

    @property
    def in_use_bytes(self) -> int:
        """The charge less the shelf's (a cache, given back when a reservation needs it) and
        the switch spare's (the headroom, prepared)."""
        with self._lock:
            return self._charged - self._reserved[SHELF_KEY] - self._reserved[SWITCH_KEY]

    @property
    def n_pages(self) -> int:
        with self._lock:
            return len(self._pages)

    @property
    def leaked_bytes(self) -> int:
        """Bytes of buffers that could not be unmapped: a gauge that must stay 0."""
        with self._lock:
            return self._leaked

    # -- the headroom for a mind switch --------------------------------------------------------

    def saw_mind_page(self, n_bytes: int) -> None:
        """A mind left its slot as a page of `n_bytes`."""
        with self._lock:
            self._largest_mind_page = max(self._largest_mind_page, n_bytes)

    @property
    def largest_mind_page_bytes(self) -> int:
        with self._lock:
            return self._largest_mind_page

    @property
    def headroom_bytes(self) -> int:
        """Free bytes the demoter keeps under the ceiling: room for a mind switch."""
        ceiling = self.ceiling_bytes
        return min(ceiling, max(ceiling // 4, self.largest_mind_page_bytes))

    @property
    def short_of_headroom(self) -> bool:
        """More than the ceiling less the headroom is charged (the shelf aside: it is given
        back on demand; the switch spare aside: it is the headroom): the demoter has work."""
        return self.in_use_bytes > self.ceiling_bytes - self.headroom_bytes

    def reservations(self) -> list[tuple[PageKey, int]]:
        """Open reservations (bytes admitted for copies in flight, prepared spare buffers)."""
        with self._lock:
            return sorted((k, n) for k, n in self._reserved.items() if n > 0)

    @property
    def held_bytes(self) -> int:
        """Bytes of pages no longer listed but still held by running spills."""
        with self._lock:
            return sum(p.n_bytes for p in self._held.values())

    def has(self, key: PageKey) -> bool:
        with self._lock:
            return key in self._pages

    def get(self, key: PageKey) -> Page:
        with self._lock:
            return self._get(key)

    def _get(self, key: PageKey) -> Page:
        page = self._pages.get(key)
        if page is None:
            raise PageNotFound(key.name)
        return page

    def infos(self) -> list[PageInfo]:
        with self._lock:
            listed = list(self._pages.values())
            held = list(self._held.values())
        return _infos(listed, held)

    def usage(self) -> StoreUsage:
        """The count and its parts at one moment."""
        with self._lock:
            return StoreUsage(
                self._charged,
                _infos(list(self._pages.values()), list(self._held.values())),
                {k: n for k, n in self._reserved.items() if n > 0},
                self._closing,
                self._leaked,
            )

    # -- admission --------------------------------------------------------------------------

    def reserve(self, key: PageKey, n_bytes: int) -> Reservation:
        """Admit and charge `n_bytes` for page `key` (the caller then allocates a buffer of
        that size, copies, and commits; or cancels).

        Raises PageTooLarge when the page is larger than the whole ceiling, StoreFull when the
        store cannot take it now; the page stored under `key` is untouched by a refusal.
        """
        if n_bytes > self.ceiling_bytes:
            raise PageTooLarge(n_bytes, self.ceiling_bytes)
        with self._lock:
            old = self._pages.get(key)
            replaceable = old.n_bytes if old is not None and old.owners == 1 else 0
            self._unshelve_for(self._charged - replaceable + n_bytes - self.ceiling_bytes)
            if self._charged - replaceable + n_bytes > self.ceiling_bytes:
                raise StoreFull(self._charged, self.ceiling_bytes, n_bytes)
            if old is not None and self._charged + n_bytes > self.ceiling_bytes:
                # It only fits without the old page: close it here and now (synchronously, so
                # its bytes are really gone before they are counted for the new page).
                try:
                    old.buffer.close()
                except BufferError as err:  # a view is alive: a bug; refuse rather than crash
                    raise StoreFull(self._charged, self.ceiling_bytes, n_bytes) from err
                del self._pages[key]
                old.owners -= 1
                self._charged -= old.n_bytes
            self._charged += n_bytes
            self._reserved[key] += n_bytes
        return Reservation(key, n_bytes)

    def trim(self, res: Reservation, key: PageKey, n_bytes: int) -> Reservation:
        """Turn `res` into a reservation of `n_bytes` (at most its own) for page `key`: the
        caller has given the rest of a larger buffer back to the OS (MADV_DONTNEED)."""
        assert n_bytes <= res.n_bytes
        with self._lock:
            self._charged -= res.n_bytes - n_bytes
            self._unreserve(res)
            self._reserved[key] += n_bytes
        return Reservation(key, n_bytes)

    def cancel(self, res: Reservation, *, closed: bool = True) -> None:
        """The copy failed (or was abandoned): give the reserved bytes back. `closed=False`:
        the buffer mapped for it could not be unmapped, so its bytes stay charged as leaked."""
        with self._lock:
            self._unreserve(res)
            if closed:
                self._charged -= res.n_bytes
            else:
                self._leaked += res.n_bytes

    def _unreserve(self, res: Reservation) -> None:
        self._reserved[res.key] -= res.n_bytes
        if self._reserved[res.key] == 0:
            del self._reserved[res.key]

    def commit(self, res: Reservation, buffer: mmap.mmap, layout: PageLayout) -> Page:
        """Store the copied page under its key; a page it replaces loses the store's hold."""
        assert len(buffer) >= res.n_bytes
        page = Page(res.key, next(self._ids), buffer, res.n_bytes, layout)
        with self._lock:
            self._unreserve(res)
            old = self._pages.pop(res.key, None)
            self._pages[res.key] = page
            if old is not None:
                self._release_locked(old)
        return page

    # -- leaving the store ------------------------------------------------------------------

    def remove(self, key: PageKey, generation: int | None = None, *, now: bool = False) -> bool:
        """Drop the store's hold on `key` (only that generation, when given). `now`: a buffer
        no one else holds is unmapped here, its charge gone on return (not by the disposer)."""
        with self._lock:
            page = self._pages.get(key)
            if page is None or (generation is not None and page.generation != generation):
                return False
            del self._pages[key]
            self._release_locked(page, now=now)
            return True

    def drop(self, key: PageKey) -> None:
        """page_drop: a typed 404 when there is no such page."""
        if not self.remove(key):
            raise PageNotFound(key.name)

    def reclaim(self, page: Page, key: PageKey) -> Reservation | None:
        """Turn `page`, left the store and held only by the caller, into a reservation under
        `key` of its bytes, its buffer the caller's (already faulted in: a recycled spare).
        None, and nothing changes, when anyone else still holds or lists it."""
        with self._lock:
            if page.owners != 1 or self._pages.get(page.key) is page:
                return None
            page.owners = 0
            self._held.pop(page.generation, None)
            self._reserved[key] += page.n_bytes  # the charge stays: now a reservation
            return Reservation(key, page.n_bytes)

    def hold(self, key: PageKey) -> Page:
        """A spill (or a page_in) takes a hold: the page stays alive and counted until `release`."""
        with self._lock:
            page = self._get(key)
            page.owners += 1
            return page

    def release(self, page: Page) -> None:
        with self._lock:
            self._release_locked(page)

    def _release_locked(self, page: Page, *, now: bool = False) -> None:
        page.owners -= 1
        listed = self._pages.get(page.key) is page
        if page.owners > 0:
            if not listed:
                self._held[page.generation] = page
            return
        self._held.pop(page.generation, None)
        if len(self._shelf) < self.shelf_max and page.n_bytes >= self.shelf_min_bytes:
            self._shelf.append((page.buffer, page.n_bytes))  # the charge stays: now the shelf's
            self._reserved[SHELF_KEY] += page.n_bytes
            return
        n_bytes = page.n_bytes
        self._closing += n_bytes
        if now:
            close_now(page.buffer, lambda closed: self._closed_locked(n_bytes, closed))
        else:
            self._dispose(page.buffer, lambda closed: self._closed(n_bytes, closed))

    # -- the shelf (see the module docstring) -------------------------------------------------

    def take_shelved(self, key: PageKey, n_bytes: int) -> tuple[mmap.mmap, Reservation] | None:
        """A shelved buffer holding `n_bytes` (and at most twice that), trimmed to them (the
        rest given back to the OS) and reserved under `key`; None when none fits."""
        with self._lock:
            fits = [
                i for i, (_, charged) in enumerate(self._shelf) if n_bytes <= charged <= 2 * n_bytes
            ]
            if not fits:
                return None
            buffer, charged = self._shelf.pop(fits[0])
            self._unreserve(Reservation(SHELF_KEY, charged))
            self._reserved[key] += charged
        kept = -(-max(1, n_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        if kept < charged:
            buffer.madvise(mmap.MADV_DONTNEED, kept, len(buffer) - kept)
        return buffer, self.trim(Reservation(key, charged), key, min(kept, charged))

    def shelve(self, buffer: mmap.mmap, res: Reservation | None) -> None:
        """Its user is done with `buffer` (reserved as `res`; None: never charged, charged now
        when the store has room): shelved for reuse, or closed when the shelf is full."""
        with self._lock:
            n_bytes = res.n_bytes if res is not None else len(buffer)
            fits = self._charged + n_bytes <= self.ceiling_bytes
            keep = len(self._shelf) < self.shelf_max and n_bytes >= self.shelf_min_bytes
            if keep and (res is not None or fits):
                if res is None:
                    self._charged += n_bytes
                else:
                    self._unreserve(res)
                self._shelf.append((buffer, n_bytes))
                self._reserved[SHELF_KEY] += n_bytes
                return
            if res is not None:  # its charge ends once the disposer has unmapped it
                self._unreserve(res)
                self._closing += n_bytes
        if res is None:
            self._dispose(buffer, lambda closed: None)  # (never charged)
        else:
            self._dispose(buffer, lambda closed: self._closed(n_bytes, closed))

    def _unshelve_for(self, n_bytes: int) -> None:
        """Unmap shelved buffers (oldest first, here and now) until `n_bytes` more are free."""
        while n_bytes > 0 and self._shelf:
            buffer, charged = self._shelf.pop(0)
            self._unreserve(Reservation(SHELF_KEY, charged))
            try:
                buffer.close()
            except BufferError:  # a view is alive: a bug, shown by the gauge
                log.error("a shelved buffer could not be unmapped: a view of it is still alive")
                self._leaked += charged
                continue
            self._charged -= charged
            n_bytes -= charged

    def _closed(self, n_bytes: int, closed: bool) -> None:
        with self._lock:
            self._closed_locked(n_bytes, closed)

    def _closed_locked(self, n_bytes: int, closed: bool) -> None:
        self._closing -= n_bytes
        if closed:
            self._charged -= n_bytes
        else:
            self._leaked += n_bytes  # still mapped: still charged, and shown

    def check_integrity(self) -> None:
        """Assert the one count is whole: charged = listed + held + reserved + closing +
        leaked, within the ceiling; nothing leaked; every listed page is owned, held pages are
        not listed."""
        with self._lock:
            listed = sum(p.n_bytes for p in self._pages.values())
            held = sum(p.n_bytes for p in self._held.values())
            reserved = sum(self._reserved.values())
            parts = (listed, held, reserved, self._closing, self._leaked)
            assert self._charged == sum(parts), f"charged {self._charged} != {parts}"
            assert 0 <= self._charged <= self.ceiling_bytes, f"charged {self._charged}"
            assert all(n > 0 for n in self._reserved.values()), self._reserved
            assert self._closing >= 0, parts
            assert self._leaked == 0, f"{self._leaked} bytes of page buffers could not be unmapped"
            shelved = sum(n for _, n in self._shelf)
            assert self._reserved[SHELF_KEY] == shelved <= self._charged, shelved
            assert len(self._shelf) <= self.shelf_max, len(self._shelf)
            for key, page in self._pages.items():
                assert page.key == key and page.owners >= 1, (key, page.owners)
                assert len(page.buffer) >= page.n_bytes, key
            for generation, page in self._held.items():
                assert page.generation == generation and page.owners >= 1, generation
                assert self._pages.get(page.key) is not page, generation

    def close(self) -> None:
        with self._lock:
            pages = list(self._pages.values())
            self._pages.clear()
        for page in pages:
            self.release(page)
        with self._lock:
            self._unshelve_for(self._reserved[SHELF_KEY])
