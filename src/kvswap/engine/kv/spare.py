"""A buffer prepared ahead for one of the engine's own moves: reserved in the page store,
mapped and faulted in by the buffer worker, then taken by a move that only copies into it.

Faulting fresh memory in costs several times the copy (`buffers`), so a spare is taken off the
store's shelf of freed buffers when one fits (`PageStore.take_shelved`), and the engine's internal
moves (a mind leaving its slot, the anonymous cache keeping a state, a full pool paging an idle
slot out, a reconfigure moving its slots) never map a buffer on the engine thread: each takes a
spare prepared for it, trimmed to the bytes it needs (the rest goes back to the OS and to the
store's count), or waits for one (a cache skips the save instead). A spare is an open
reservation under its purpose's key (`core.keys.spare_key`), so /pages shows its bytes.

Engine thread only: the buffer worker maps, and the engine hands the buffer to `arrived`.
"""

from __future__ import annotations

import mmap

from kvswap.core.errors import KvswapError, PageTooLarge, StoreFull
from kvswap.core.keys import PageKey, spare_key
from kvswap.engine.kv.buffers import BufferReady, BufferWorker
from kvswap.engine.kv.pagestore import Page, PageStore, Reservation

SLACK = 1.25  # a spare's size over what it was asked for (states grow between ask and take)
_HUGE_PAGE = 2 << 20  # large spares are rounded to whole huge pages
_HUGE_FROM = 64 << 20


def spare_size(n_bytes: int) -> int:
    """What a spare asked for `n_bytes` maps: `SLACK` more, rounded to whole pages."""
    unit = _HUGE_PAGE if n_bytes >= _HUGE_FROM else mmap.PAGESIZE
    return -(-int(n_bytes * SLACK) // unit) * unit


class Spare:
    """One prepared buffer for one purpose; see the module docstring."""

    def __init__(self, store: PageStore, buffers: BufferWorker, purpose: str) -> None:
        self.store = store
        self.buffers = buffers
        self.key = spare_key(purpose)
        self._held: tuple[mmap.mmap, Reservation] | None = None
        self._pending: Reservation | None = None  # asked of the buffer worker
        self._closed = False
        self.error = ""  # why the last allocation failed ("" when it did not)

    def ready_for(self, n_bytes: int) -> bool:
        """A buffer of at least `n_bytes` (faulted in and reserved) is in hand."""
        return self._held is not None and self._held[1].n_bytes >= n_bytes

    def adopt(self, page: Page) -> None:
        """`page` (held by the caller, out of the store) is done with: keep its buffer, faulted
        in already, as the spare when none as large is in hand or being mapped; else let it go."""
        held = self._held[1].n_bytes if self._held is not None else 0
        if self._closed or self._pending is not None or held >= page.n_bytes:
            self.store.release(page)
            return
        reservation = self.store.reclaim(page, self.key)
        if reservation is None:  # someone else holds it (a spill): it stays theirs
            self.store.release(page)
            return
        self.give_back()
        self._held = (page.buffer, reservation)

    def ask(self, n_bytes: int) -> bool:
        """Have a buffer of at least `n_bytes` prepared: a no-op when one is in hand, or being
        mapped (its size is checked when it is taken); one off the store's shelf is in hand at
        once. True when a buffer is in hand now, without the buffer worker. Raises StoreFull or
        PageTooLarge when the store cannot reserve even `n_bytes` now."""
        if self._closed or self._pending is not None or self.ready_for(n_bytes):
            return self.ready_for(n_bytes)
        self.give_back()
        self._held = self.store.take_shelved(self.key, n_bytes)
        if self._held is not None:
            return True
        size = spare_size(n_bytes)
        try:
            reservation = self.store.reserve(self.key, size)
        except (StoreFull, PageTooLarge):
            reservation = self.store.reserve(self.key, n_bytes)  # no slack, if that fits
        self._pending = reservation
        self.error = ""
        self.buffers.allocate(reservation.n_bytes, self.arrived)
        return False

    def arrived(self, ready: BufferReady) -> None:
        """The buffer worker's answer (engine thread)."""
        reservation, self._pending = self._pending, None
        assert reservation is not None
        if ready.buffer is None:
            self.store.cancel(reservation)
            self.error = ready.error
            return
        self._held = (ready.buffer, reservation)
        if self._closed:
            self.give_back()

    def take(self, key: PageKey, n_bytes: int) -> tuple[mmap.mmap, Reservation] | None:
        """The buffer in hand, trimmed to `n_bytes` and reserved for page `key`; None when no
        buffer that large is in hand."""
        if self._held is None or not self.ready_for(n_bytes):
            return None
        buffer, reservation = self._held
        self._held = None
        kept = -(-max(1, n_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        if kept < len(buffer):
            buffer.madvise(mmap.MADV_DONTNEED, kept, len(buffer) - kept)
        return buffer, self.store.trim(reservation, key, min(kept, reservation.n_bytes))

    def lend(self, n_bytes: int) -> tuple[mmap.mmap, Reservation] | None:
        """The buffer in hand, whole and still reserved, for a copy whose user gives it to the
        store's shelf when done (the write-behind of a resident mind), where the next `ask`
        finds it; None when none of `n_bytes` is in hand."""
        if self._closed or not self.ready_for(n_bytes):
            return None
        held, self._held = self._held, None
        return held

    def give_back(self) -> int:
        """Return the buffer in hand to the store's shelf (or closed, when it is full); its
        bytes (0: none was in hand)."""
        if self._held is None:
            return 0
        buffer, reservation = self._held
        self._held = None
        self.store.shelve(buffer, reservation)
        return reservation.n_bytes

    def discard(self) -> None:
        """No more moves: give the buffer back (closed on the buffer worker), and one still
        being mapped on its arrival."""
        self._closed = True
        self.give_back()

    def close(self) -> None:
        """The engine is closing: give the buffer back now, and one still being mapped on
        arrival."""
        self._closed = True
        if self._held is not None:
            buffer, reservation = self._held
            self._held = None
            buffer.close()
            self.store.cancel(reservation)


def in_hand(spare: Spare, n_bytes: int) -> bool | None:
    """`spare.ask`: True when a buffer is in hand now, False when one is being mapped, None
    when the store has no room for it now."""
    try:
        return spare.ask(n_bytes)
    except KvswapError:
        return None


def ask_quietly(spare: Spare, n_bytes: int) -> bool:
    """`spare.ask`, False instead of raising when the store has no room for it now."""
    try:
        spare.ask(n_bytes)
    except KvswapError:
        return False
    return True
