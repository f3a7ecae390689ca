"""The page store: named host-RAM pages under one byte ceiling (`--page-ram-bytes`).

Owns every page's bytes (one anonymous `mmap` per page, closed when the last owner lets go) and
the one byte count that the ceiling is enforced on. Pure Python: no libllama, no files.

Rules (SPEC §3):
- One count. `reserve(name, n_bytes)` admits a page with the bytes measured before any copy and
  charges exactly that; `commit` stores a buffer of exactly that size, so no estimate can let a
  page past the ceiling.
- Admission subtracts the page being replaced only when the store is its sole owner. A refusal
  (503 full now, 400 larger than the whole ceiling) never displaces the stored page.
- The charge is released when the last owner drops a page: a spill holding a page keeps it
  counted after page_in, page_drop or replacement (`held` pages).
- At every moment the charge (pages + reservations + buffers being closed) is at most the
  ceiling: a page's bytes stay charged until its buffer is really unmapped. When a replacement
  only fits once the old page is gone, the old page is released before the new bytes are
  reserved (the copy then runs without a fallback); otherwise the old page lives until the new
  one is in.

Closing a buffer (munmap) costs milliseconds per hundred MB, so it goes through `dispose`, which
the engine points at a worker thread; the charge is released when the close is done.

Thread-safe: the engine thread reserves, commits and takes; HTTP handlers drop and list; spill
workers release their holds; the disposer releases charges.
"""

from __future__ import annotations

import itertools
import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvswap.core.errors import PageNotFound, PageTooLarge, StoreFull
from kvswap.engine.kv.pagefmt import LoraRef, PageLayout

# Closes a buffer, then calls `done` (possibly on another thread).
Disposer = Callable[[mmap.mmap, Callable[[], None]], None]


def close_now(buffer: mmap.mmap, done: Callable[[], None]) -> None:
    buffer.close()  # raises if a view still exists: a bug, never silently ignored
    done()


@dataclass
class Page:
    """A page: one buffer, the layout of what it holds, and its owners."""

    name: str
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

    name: str
    n_bytes: int


@dataclass(frozen=True)
class PageInfo:
    """One page as GET /pages shows it."""

    name: str
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
    reserved_bytes: dict[str, int]  # admitted, not yet committed, by page name ("": unnamed)
    closing_bytes: int  # buffers being unmapped


def _infos(listed: list[Page], held: list[Page]) -> list[PageInfo]:
    now = time.time()
    return [
        PageInfo(
            name=p.name,
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

    def __init__(self, ceiling_bytes: int, dispose: Disposer = close_now) -> None:
        self.ceiling_bytes = ceiling_bytes
        self._dispose = dispose
        # Re-entrant: a synchronous disposer gives the charge back from inside a release.
        self._lock = threading.RLock()
        self._pages: dict[str, Page] = {}
        self._held: dict[int, Page] = {}  # generation -> page no longer listed, held by spills
        self._charged = 0  # pages (listed and held) + open reservations + closing buffers
        self._reserved = 0  # bytes of open reservations (admitted, not yet committed)
        self._reserved_by_name: dict[str, int] = {}  # the same bytes, by the name reserved
        self._closing = 0  # bytes of buffers given to the disposer and not yet unmapped
        self._ids = itertools.count(1)

    # -- reading ----------------------------------------------------------------------------

    @property
    def charged_bytes(self) -> int:
        with self._lock:
            return self._charged

    @property
    def n_pages(self) -> int:
        with self._lock:
            return len(self._pages)

    @property
    def held_bytes(self) -> int:
        """Bytes of pages no longer listed but still held by running spills."""
        with self._lock:
            return sum(p.n_bytes for p in self._held.values())

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._pages

    def get(self, name: str) -> Page:
        with self._lock:
            return self._get(name)

    def _get(self, name: str) -> Page:
        page = self._pages.get(name)
        if page is None:
            raise PageNotFound(name)
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
                dict(self._reserved_by_name),
                self._closing,
            )

    # -- admission --------------------------------------------------------------------------

    def reserve(self, name: str, n_bytes: int) -> Reservation:
        """Admit and charge `n_bytes` for a page named `name` (the caller then allocates a
        buffer of that size, copies, and commits; or cancels).

        Raises PageTooLarge when the page is larger than the whole ceiling, StoreFull when the
        store cannot take it now; the page stored under `name` is untouched by a refusal.
        """
        if n_bytes > self.ceiling_bytes:
            raise PageTooLarge(n_bytes, self.ceiling_bytes)
        with self._lock:
            old = self._pages.get(name)
            replaceable = old.n_bytes if old is not None and old.owners == 1 else 0
            if self._charged - replaceable + n_bytes > self.ceiling_bytes:
                raise StoreFull(self._charged, self.ceiling_bytes, n_bytes)
            if old is not None and self._charged + n_bytes > self.ceiling_bytes:
                # It only fits without the old page: close it here and now (synchronously, so
                # its bytes are really gone before they are counted for the new page).
                del self._pages[name]
                old.owners -= 1
                old.buffer.close()
                self._charged -= old.n_bytes
            self._charged += n_bytes
            self._reserve_locked(name, n_bytes)
        return Reservation(name, n_bytes)

    def trim(self, res: Reservation, name: str, n_bytes: int) -> Reservation:
        """Turn `res` into a reservation of `n_bytes` (at most its own) for page `name`: the
        caller has given the rest of a larger buffer back to the OS (MADV_DONTNEED)."""
        assert n_bytes <= res.n_bytes
        with self._lock:
            self._charged -= res.n_bytes - n_bytes
            self._reserve_locked(res.name, -res.n_bytes)
            self._reserve_locked(name, n_bytes)
        return Reservation(name, n_bytes)

    def cancel(self, res: Reservation) -> None:
        """The copy failed (or was abandoned): give the reserved bytes back."""
        with self._lock:
            self._charged -= res.n_bytes
            self._reserve_locked(res.name, -res.n_bytes)

    def commit(self, res: Reservation, buffer: mmap.mmap, layout: PageLayout) -> Page:
        """Store the copied page under its name; a page it replaces loses the store's hold."""
        assert len(buffer) >= res.n_bytes
        page = Page(res.name, next(self._ids), buffer, res.n_bytes, layout)
        with self._lock:
            self._reserve_locked(res.name, -res.n_bytes)
            old = self._pages.pop(res.name, None)
            self._pages[res.name] = page
            if old is not None:
                self._release_locked(old)
        return page

    def _reserve_locked(self, name: str, n_bytes: int) -> None:
        """Add `n_bytes` (negative: give back) to the open reservations, under `name`."""
        self._reserved += n_bytes
        left = self._reserved_by_name.get(name, 0) + n_bytes
        if left:
            self._reserved_by_name[name] = left
        else:
            self._reserved_by_name.pop(name, None)

    # -- leaving the store ------------------------------------------------------------------

    def remove(self, name: str, generation: int | None = None) -> bool:
        """Drop the store's hold on `name` (only that generation, when given)."""
        with self._lock:
            page = self._pages.get(name)
            if page is None or (generation is not None and page.generation != generation):
                return False
            del self._pages[name]
            self._release_locked(page)
            return True

    def drop(self, name: str) -> None:
        """page_drop: a typed 404 when there is no such page."""
        if not self.remove(name):
            raise PageNotFound(name)

    def hold(self, name: str) -> Page:
        """A spill (or a page_in) takes a hold: the page stays alive and counted until `release`."""
        with self._lock:
            page = self._get(name)
            page.owners += 1
            return page

    def release(self, page: Page) -> None:
        with self._lock:
            self._release_locked(page)

    def _release_locked(self, page: Page) -> None:
        page.owners -= 1
        listed = self._pages.get(page.name) is page
        if page.owners > 0:
            if not listed:
                self._held[page.generation] = page
            return
        self._held.pop(page.generation, None)
        n_bytes = page.n_bytes
        self._closing += n_bytes
        self._dispose(page.buffer, lambda: self._uncharge(n_bytes))

    def _uncharge(self, n_bytes: int) -> None:
        with self._lock:
            self._charged -= n_bytes
            self._closing -= n_bytes

    def check_integrity(self) -> None:
        """Assert the one count is whole: charged = listed + held + reserved + closing, within
        the ceiling; every listed page is owned, held pages are not listed."""
        with self._lock:
            listed = sum(p.n_bytes for p in self._pages.values())
            held = sum(p.n_bytes for p in self._held.values())
            parts = (listed, held, self._reserved, self._closing)
            assert self._charged == sum(parts), f"charged {self._charged} != {parts}"
            assert 0 <= self._charged <= self.ceiling_bytes, f"charged {self._charged}"
            assert self._reserved >= 0 and self._closing >= 0, parts
            assert sum(self._reserved_by_name.values()) == self._reserved, self._reserved_by_name
            assert all(n > 0 for n in self._reserved_by_name.values()), self._reserved_by_name
            for name, page in self._pages.items():
                assert page.name == name and page.owners >= 1, (name, page.owners)
                assert len(page.buffer) >= page.n_bytes, name
            for generation, page in self._held.items():
                assert page.generation == generation and page.owners >= 1, generation
                assert self._pages.get(page.name) is not page, generation

    def close(self) -> None:
        with self._lock:
            pages = list(self._pages.values())
            self._pages.clear()
        for page in pages:
            self.release(page)
