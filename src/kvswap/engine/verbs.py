"""Slot verbs on an idle slot: capture (save), apply (restore), erase, page_out, page_in.

Run by the engine thread when the scheduler hands it a verb's slot (after every earlier job on
that slot). Each verb either succeeds whole or changes nothing it promised to keep: a failed
page_out leaves the slot intact, a failed page_in leaves the page in the store, a refused page
never displaces the page stored under its name. File I/O is never done here.

A capture (page_out, save) has two halves: `begin_capture` measures the slot and admits the
bytes, the buffer worker maps a pre-faulted buffer meanwhile (the slot stays locked, the engine
keeps decoding other slots), and `finish_capture` copies the state in: one memcpy on the engine
thread.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass

from kvswap.backend.context import Context
from kvswap.engine.commands import (
    Applied,
    Captured,
    Erased,
    PageMoved,
    PageOut,
    SlotApply,
    SlotCapture,
    SlotErase,
)
from kvswap.engine.lora import resolve
from kvswap.engine.pagefmt import PageLayout
from kvswap.engine.pagestore import PageStore, Reservation
from kvswap.engine.slot import Slot
from kvswap.engine.slotstate import StateMover, state_of_page
from kvswap.engine.types import ErrorKind, KvswapError


@dataclass
class PageCounters:
    """Page verbs done and failed, for /metrics."""

    page_out_total: int = 0
    page_in_total: int = 0
    page_failed_total: int = 0


@dataclass
class PendingCapture:
    """A capture waiting for its buffer; its slot is locked meanwhile."""

    cmd: PageOut | SlotCapture
    slot: Slot
    layout: PageLayout
    reservation: Reservation | None  # page_out: the admitted bytes
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
            raise KvswapError(ErrorKind.NOT_SUPPORTED, "the page store is off (--page-ram-bytes 0)")
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

    def begin_capture(
        self, cmd: PageOut | SlotCapture, slot: Slot, layout: PageLayout | None = None
    ) -> PendingCapture:
        """Measure the slot (or take `layout`, e.g. a token-only one) and, for page_out, admit
        its bytes (typed 503/400 on refusal)."""

        t0 = time.perf_counter()
        reservation = None
        if isinstance(cmd, PageOut):
            store = self._store()
            if len(slot.tokens) == 0:
                self.counters.page_failed_total += 1
                raise KvswapError(
                    ErrorKind.INVALID_REQUEST, f"slot {slot.id} is empty: nothing to page out"
                )
        layout = layout or self.mover.measure(slot)
        if isinstance(cmd, PageOut):
            try:
                reservation = store.reserve(cmd.name, layout.n_bytes)
            except KvswapError:
                self.counters.page_failed_total += 1
                raise
        return PendingCapture(cmd, slot, layout, reservation, t0)

    def abandon(self, pending: PendingCapture) -> None:
        if pending.reservation is not None and self.store is not None:
            self.store.cancel(pending.reservation)
            self.counters.page_failed_total += 1

    def finish_capture(
        self, pending: PendingCapture, buffer: mmap.mmap, keep_slot: bool = False
    ) -> Captured | PageMoved:
        """Copy the slot's state into its buffer; a page_out then commits it and frees the slot
        (unless `keep_slot`: the anonymous prompt cache keeps a copy)."""
        layout, slot = pending.layout, pending.slot
        t_copy = time.perf_counter()
        try:
            with memoryview(buffer) as view:
                self.mover.capture(slot, view, layout)
        except BaseException:
            buffer.close()
            self.abandon(pending)
            raise
        copy_ms = (time.perf_counter() - t_copy) * 1e3
        if pending.reservation is None:
            return Captured(slot.id, buffer, layout)
        assert self.store is not None
        self.store.commit(pending.reservation, buffer, layout)
        if not keep_slot:  # a cache copy is not a page verb
            self.clear(slot)
            self.counters.page_out_total += 1
        return PageMoved(
            slot.id, pending.reservation.name, layout.n_tokens, layout.target.n_bytes,
            layout.n_bytes_spec, len(layout.checkpoints), (time.perf_counter() - pending.t_start) * 1e3,
            copy_ms=copy_ms,
        )  # fmt: skip
