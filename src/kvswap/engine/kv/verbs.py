"""Slot verbs on an idle slot: capture (save), apply (restore), erase, page_out, page_in.

Run by the engine thread when the scheduler hands it a verb's slot (after every earlier job on
that slot). Each verb either succeeds whole or changes nothing it promised to keep: a failed
page_out leaves the slot intact, a failed page_in leaves the page in the store, a refused page
never displaces the page stored under its name. File I/O is never done here.

A capture (page_out, save) has two halves: `begin_page` (or `begin_copy`) measures the slot and
admits the bytes, the buffer worker maps a pre-faulted buffer meanwhile (the slot stays locked,
the engine keeps decoding other slots), and `finish_page` (`finish_copy`) copies the state in: one
memcpy on the engine thread. The engine's own moves (a mind leaving its slot, the anonymous cache,
a reconfigure, the flush before exit) use the internal API, `capture_to_page` and `copy_out`, with
no command and no reply.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass

from kvswap.backend.context import Context
from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.engine.commands import (
    Applied,
    Captured,
    Erased,
    PageMoved,
    SlotApply,
    SlotErase,
)
from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagefmt import PageLayout
from kvswap.engine.kv.pagestore import PageStore, Reservation
from kvswap.engine.kv.slotstate import StateMover, state_of_page
from kvswap.engine.plan.lora import resolve
from kvswap.engine.slot import Slot


@dataclass
class PageCounters:
    """Page verbs done and failed, for /metrics."""

    page_out_total: int = 0
    page_in_total: int = 0
    page_failed_total: int = 0


@dataclass
class PendingCapture:
    """A capture waiting for its buffer; its slot is locked meanwhile."""

    slot: Slot
    layout: PageLayout
    reservation: Reservation | None  # a page: the admitted bytes; None: a copy out (save)
    t_start: float


class SlotVerbs:
    """Executes slot verbs against one context, one mover and the page store (if any)."""

    def __init__(
        self, ctx: Context, mover: StateMover, store: PageStore | None, counters: PageCounters
    ) -> None:
        self.ctx = ctx
        self.mover = mover
        self.store = store
        self.counters = counters

    def clear(self, slot: Slot) -> None:
        self.ctx.seq_clear(slot.seq_id)
        slot.tokens.truncate(0)
        slot.lora = ()
        self.mover.memory.clear(slot)
        self.mover.clear_draft(slot)

    # -- verbs done in one go ---------------------------------------------------------------

    def apply(self, cmd: SlotApply, slot: Slot) -> Applied:
        self.mover.apply(slot, cmd.state)
        return Applied(slot.id, len(cmd.state.tokens), cmd.state.n_bytes)

    def erase(self, cmd: SlotErase, slot: Slot) -> Erased:
        n = len(slot.tokens)
        self.clear(slot)
        return Erased(slot.id, n)

    def page_in(self, slot: Slot, name: str) -> PageMoved:
        try:
            moved = self._page_in(slot, name)
        except KvswapError:
            self.counters.page_failed_total += 1
            raise
        self.counters.page_in_total += 1
        return moved

    def _store(self) -> PageStore:
        if self.store is None:
            raise StoreOff("the page store is off (--page-ram-bytes 0)")
        return self.store

    def _page_in(self, slot: Slot, name: str) -> PageMoved:
        store = self._store()
        t0 = time.perf_counter()
        page = store.hold(name)  # typed 404; the hold keeps the bytes alive during the copy
        try:
            layout = page.layout
            reason = layout.geometry.refusal(self.mover.geometry)
            if reason is not None:
                raise KvswapError(ErrorKind.INVALID_REQUEST, f"cannot page in {name!r}: {reason}")
            resolve(layout.lora, self.mover.adapters, f"page {name!r}")  # typed 400: page stays
            n_discarded = len(slot.tokens)
            with page.view() as view:
                state = state_of_page(view, layout)
                try:
                    self.mover.apply(slot, state)
                finally:
                    state.release()
            store.remove(name, page.generation)
        finally:
            store.release(page)
        return PageMoved(
            slot.id, name, layout.n_tokens, layout.target.n_bytes, layout.n_bytes_spec,
            len(layout.checkpoints), (time.perf_counter() - t0) * 1e3, n_discarded,
        )  # fmt: skip

    # -- captures: two halves around a buffer allocation -------------------------------------

    def begin_copy(self, slot: Slot) -> PendingCapture:
        """The first half of a copy out (save): measure the slot."""
        return PendingCapture(slot, self.mover.measure(slot), None, time.perf_counter())

    def begin_page(self, slot: Slot, name: str, layout: PageLayout | None = None) -> PendingCapture:
        """The first half of a page_out: measure the slot (or take `layout`, e.g. a token-only
        one) and admit its bytes under `name` (typed 503/400 on refusal)."""
        t0 = time.perf_counter()
        store = self._store()
        if len(slot.tokens) == 0:
            self.counters.page_failed_total += 1
            raise KvswapError(
                ErrorKind.INVALID_REQUEST, f"slot {slot.id} is empty: nothing to page out"
            )
        layout = layout or self.mover.measure(slot)
        try:
            reservation = store.reserve(name, layout.n_bytes)
        except KvswapError:
            self.counters.page_failed_total += 1
            raise
        return PendingCapture(slot, layout, reservation, t0)

    def abandon(self, pending: PendingCapture) -> None:
        if pending.reservation is not None and self.store is not None:
            self.store.cancel(pending.reservation)
            self.counters.page_failed_total += 1

    def _copy(self, pending: PendingCapture, buffer: mmap.mmap) -> float:
        """Copy the slot's state into `buffer`; the copy's ms. On failure the buffer is closed
        and the reservation cancelled."""
        t_copy = time.perf_counter()
        try:
            with memoryview(buffer) as view:
                self.mover.capture(pending.slot, view, pending.layout)
        except BaseException:
            buffer.close()
            self.abandon(pending)
            raise
        return (time.perf_counter() - t_copy) * 1e3

    def finish_copy(self, pending: PendingCapture, buffer: mmap.mmap) -> Captured:
        """The second half of a copy out: the slot's state in `buffer` (the caller closes it)."""
        assert pending.reservation is None
        self._copy(pending, buffer)
        return Captured(pending.slot.id, buffer, pending.layout)

    def finish_page(
        self, pending: PendingCapture, buffer: mmap.mmap, keep_slot: bool = False
    ) -> PageMoved:
        """The second half of a page_out: copy, commit the page, free the slot (unless
        `keep_slot`: the anonymous prompt cache keeps a copy, which is not a page verb)."""
        layout, slot, reservation = pending.layout, pending.slot, pending.reservation
        assert reservation is not None and self.store is not None
        copy_ms = self._copy(pending, buffer)
        self.store.commit(reservation, buffer, layout)
        if not keep_slot:
            self.clear(slot)
            self.counters.page_out_total += 1
        return PageMoved(
            slot.id, reservation.name, layout.n_tokens, layout.target.n_bytes,
            layout.n_bytes_spec, len(layout.checkpoints), (time.perf_counter() - pending.t_start) * 1e3,
            copy_ms=copy_ms,
        )  # fmt: skip

    # -- internal moves: both halves at once ------------------------------------------------

    def capture_to_page(
        self,
        slot: Slot,
        name: str,
        *,
        layout: PageLayout | None = None,
        reservation: Reservation | None = None,
        buffer: mmap.mmap | None = None,
        keep_slot: bool = False,
    ) -> PageMoved:
        """Move (or, `keep_slot`, copy) the slot's state into page `name` now: into `buffer`
        under `reservation` when the caller prepared them, else admitted here (counted as a
        page_out) into a buffer mapped here."""
        if reservation is None:
            pending = self.begin_page(slot, name, layout)
        else:
            measured = layout or self.mover.measure(slot)
            pending = PendingCapture(slot, measured, reservation, time.perf_counter())
        if buffer is None:
            buffer = self._new_buffer(pending)
        return self.finish_page(pending, buffer, keep_slot)

    def copy_out(self, slot: Slot) -> Captured:
        """A copy of the slot's whole state in a new buffer (the slot keeps its state)."""
        pending = self.begin_copy(slot)
        return self.finish_copy(pending, self._new_buffer(pending))

    def _new_buffer(self, pending: PendingCapture) -> mmap.mmap:
        try:
            return new_buffer(pending.layout.n_bytes)
        except (OSError, ValueError) as err:
            self.abandon(pending)
            raise KvswapError(ErrorKind.UNAVAILABLE, f"no memory for the copy: {err}") from err
