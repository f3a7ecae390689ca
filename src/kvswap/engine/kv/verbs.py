"""Slot verbs on an idle slot: capture (save), apply (restore), erase, page_out, page_in.

Run by the engine thread when the scheduler hands it a verb's slot (after every earlier job on
that slot). Each verb either succeeds whole or changes nothing it promised to keep: a failed
page_out leaves the slot intact, a failed page_in leaves the page in the store, a refused page
never displaces the page stored under its key. File I/O is never done here, and neither is
mapping a buffer: the engine thread only copies.

A capture (page_out, save) has two halves: `begin_page` (or `begin_copy`) measures the slot and
admits the bytes, the buffer worker maps a pre-faulted buffer meanwhile (the slot stays locked,
the engine keeps decoding other slots), and `finish_page` (`finish_copy`) copies the state in: one
memcpy on the engine thread. The engine's own moves (a mind leaving its slot, the anonymous cache,
a reconfigure) use `capture_to_page` with a buffer prepared ahead (`kv.spare`).

Counting is the caller's: the page verbs a client asked for are counted where they are run
(`engine.captures`), so the engine's own moves never inflate `page_out_total`/`page_in_total`.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass

from kvswap.backend.context import Context
from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.core.keys import PageKey
from kvswap.core.page import PageLayout, state_of_page
from kvswap.engine.commands import (
    Applied,
    Captured,
    Erased,
    PageMoved,
    SlotApply,
    SlotErase,
)
from kvswap.engine.kv.pagestore import PageStore, Reservation
from kvswap.engine.kv.slotstate import StateMover
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

    def __init__(self, ctx: Context, mover: StateMover, store: PageStore | None) -> None:
        self.ctx = ctx
        self.mover = mover
        self.store = store

    def clear(self, slot: Slot) -> None:
        self.ctx.seq_clear(slot.seq_id)
        slot.tokens.truncate(0)
        slot.lora = ()
        self.mover.memory.clear(slot)
        self.mover.clear_draft(slot)

    def share_prefix(self, src: Slot, dst: Slot, n_tokens: int) -> int:
        """Start `dst` from the first `n_tokens` (at most all) of what `src` holds, sharing
        `src`'s cells (a slot's tokens are its cells', a running request's sampled token aside):
        possible only in a unified pool of a plain KV cache without a draft model. The tokens
        `dst` now holds (0: not possible here; `dst` untouched)."""
        mover = self.mover
        if not mover.plain_kv or mover.draft is not None or mover.geometry.n_stream != 1:
            return 0
        n_tokens = min(n_tokens, len(src.tokens))
        self.clear(dst)
        self.ctx.seq_cp(src.seq_id, dst.seq_id, 0, n_tokens)
        dst.tokens.replace(src.tokens.view()[:n_tokens])
        dst.lora = src.lora  # the cells were computed under its adapters
        return n_tokens

    # -- verbs done in one go ---------------------------------------------------------------

    def apply(self, cmd: SlotApply, slot: Slot) -> Applied:
        self.mover.apply(slot, cmd.state)
        return Applied(slot.id, len(cmd.state.tokens), cmd.state.n_bytes)

    def erase(self, cmd: SlotErase, slot: Slot) -> Erased:
        n = len(slot.tokens)
        self.clear(slot)
        return Erased(slot.id, n)

    def _store(self) -> PageStore:
        if self.store is None:
            raise StoreOff("the page store is off (--page-ram-bytes 0)")
        return self.store

    def page_in(self, slot: Slot, key: PageKey) -> PageMoved:
        """Load page `key` into the slot; on success the page leaves the store."""
        return self._load(slot, key, keep=False)

    def copy_in(self, slot: Slot, key: PageKey) -> PageMoved:
        """Load a copy of page `key` into the slot; the page stays in the store."""
        return self._load(slot, key, keep=True)

    def _load(self, slot: Slot, key: PageKey, *, keep: bool) -> PageMoved:
        store = self._store()
        t0 = time.perf_counter()
        page = store.hold(key)  # typed 404; the hold keeps the bytes alive during the copy
        name = key.name
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
            if not keep:
                store.remove(key, page.generation)
        finally:
            store.release(page)
        return PageMoved(
            slot.id, key, layout.n_tokens, layout.target.n_bytes, layout.n_bytes_spec,
            len(layout.checkpoints), (time.perf_counter() - t0) * 1e3, n_discarded,
        )  # fmt: skip

    # -- captures: two halves around a buffer allocation -------------------------------------

    def begin_copy(self, slot: Slot) -> PendingCapture:
        """The first half of a copy out (save): measure the slot."""
        return PendingCapture(slot, self.mover.measure(slot), None, time.perf_counter())

    def begin_page(self, slot: Slot, key: PageKey) -> PendingCapture:
        """The first half of a page_out: measure the slot and admit its bytes under `key`
        (typed 503/400 on refusal)."""
        t0 = time.perf_counter()
        store = self._store()
        if len(slot.tokens) == 0:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST, f"slot {slot.id} is empty: nothing to page out"
            )
        layout = self.mover.measure(slot)
        return PendingCapture(slot, layout, store.reserve(key, layout.n_bytes), t0)

    def abandon(self, pending: PendingCapture) -> None:
        """The capture will not happen: give its reserved bytes back."""
        if pending.reservation is not None and self.store is not None:
            self.store.cancel(pending.reservation)

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
        `keep_slot`: the anonymous prompt cache keeps a copy)."""
        layout, slot, reservation = pending.layout, pending.slot, pending.reservation
        assert reservation is not None and self.store is not None
        copy_ms = self._copy(pending, buffer)
        self.store.commit(reservation, buffer, layout)
        if not keep_slot:
            self.clear(slot)
        return PageMoved(
            slot.id, reservation.key, layout.n_tokens, layout.target.n_bytes,
            layout.n_bytes_spec, len(layout.checkpoints), (time.perf_counter() - pending.t_start) * 1e3,
            copy_ms=copy_ms,
        )  # fmt: skip

    # -- internal moves: both halves at once, into a prepared buffer -----------------------

    def capture_to_page(
        self,
        slot: Slot,
        *,
        layout: PageLayout,
        reservation: Reservation,
        buffer: mmap.mmap,
        keep_slot: bool = False,
    ) -> PageMoved:
        """Move (or, `keep_slot`, copy) the slot's state now into `buffer`, a buffer prepared
        ahead (`kv.spare`) and reserved for the page (`reservation` names its key)."""
        pending = PendingCapture(slot, layout, reservation, time.perf_counter())
        return self.finish_page(pending, buffer, keep_slot)
