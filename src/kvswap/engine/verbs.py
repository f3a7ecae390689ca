"""Slot verbs on an idle slot: capture (save), apply (restore), erase, page_out, page_in.

Run by the engine thread when the scheduler hands it a verb's slot (after every earlier job on
that slot). Each verb either succeeds whole or changes nothing it promised to keep: a failed
page_out leaves the slot intact, a failed page_in leaves the page in the store, a refused page
never displaces the page stored under its name. File I/O is never done here.
"""

from __future__ import annotations

import logging
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
    SlotVerb,
)
from kvswap.engine.pagestore import PageStore
from kvswap.engine.slot import Slot
from kvswap.engine.slotstate import StateMover, state_of_page
from kvswap.engine.types import ErrorKind, KvswapError

log = logging.getLogger("kvswap.engine")


@dataclass
class PageCounters:
    """Page verbs done and failed, for /metrics."""

    page_out_total: int = 0
    page_in_total: int = 0
    page_failed_total: int = 0


class SlotVerbs:
    """Executes slot verbs against one context, one mover and the page store (if any)."""

    def __init__(self, ctx: Context, mover: StateMover, store: PageStore | None) -> None:
        self.ctx = ctx
        self.mover = mover
        self.store = store
        self.counters = PageCounters()

    def run(self, cmd: SlotVerb, slot: Slot) -> object:
        """The verb's result, or the KvswapError to reply with."""
        try:
            if isinstance(cmd, SlotCapture):
                return self.capture(slot)
            if isinstance(cmd, SlotApply):
                self.mover.apply(slot, cmd.state)
                return Applied(slot.id, len(cmd.state.tokens), cmd.state.n_bytes)
            if isinstance(cmd, SlotErase):
                n = len(slot.tokens)
                self.clear(slot)
                return Erased(slot.id, n)
            if isinstance(cmd, PageOut):
                return self.page_out(slot, cmd.name)
            return self.page_in(slot, cmd.name)
        except KvswapError as err:
            return err

    def clear(self, slot: Slot) -> None:
        self.ctx.seq_clear(slot.seq_id)
        slot.tokens.truncate(0)

    def capture(self, slot: Slot) -> Captured:
        layout = self.mover.measure(slot)
        buffer = mmap.mmap(-1, max(1, layout.n_bytes))
        try:
            with memoryview(buffer) as view:
                self.mover.capture(slot, view, layout)
        except BaseException:
            buffer.close()
            raise
        return Captured(slot.id, buffer, layout)

    def _store(self) -> PageStore:
        if self.store is None:
            raise KvswapError(ErrorKind.NOT_SUPPORTED, "the page store is off (--page-ram-bytes 0)")
        return self.store

    def page_out(self, slot: Slot, name: str) -> PageMoved:
        try:
            moved = self._page_out(slot, name)
        except KvswapError:
            self.counters.page_failed_total += 1
            raise
        self.counters.page_out_total += 1
        return moved

    def page_in(self, slot: Slot, name: str) -> PageMoved:
        try:
            moved = self._page_in(slot, name)
        except KvswapError:
            self.counters.page_failed_total += 1
            raise
        self.counters.page_in_total += 1
        return moved

    def _page_out(self, slot: Slot, name: str) -> PageMoved:
        store = self._store()
        if len(slot.tokens) == 0:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST, f"slot {slot.id} is empty: nothing to page out"
            )
        t0 = time.perf_counter()
        layout = self.mover.measure(slot)
        res = store.reserve(name, layout.n_bytes)  # typed 503 / 400; the stored page stays
        try:
            with memoryview(res.buffer) as view:
                self.mover.capture(slot, view, layout)
        except BaseException:
            store.cancel(res)
            raise
        store.commit(res, layout)
        self.clear(slot)
        return PageMoved(
            slot.id,
            name,
            layout.n_tokens,
            layout.target.n_bytes,
            layout.n_bytes_spec,
            len(layout.checkpoints),
            (time.perf_counter() - t0) * 1e3,
        )

    def _page_in(self, slot: Slot, name: str) -> PageMoved:
        store = self._store()
        t0 = time.perf_counter()
        page = store.hold(name)  # typed 404; the hold keeps the bytes alive during the copy
        try:
            layout = page.layout
            reason = layout.geometry.refusal(self.mover.geometry)
            if reason is not None:
                raise KvswapError(ErrorKind.INVALID_REQUEST, f"cannot page in {name!r}: {reason}")
            n_discarded = len(slot.tokens)
            with page.view() as view:
                state = state_of_page(view, layout)
                try:
                    self.mover.apply(slot, state)
                finally:
                    state.target.release()
            store.remove(name, page.generation)
        finally:
            store.release(page)
        return PageMoved(
            slot.id,
            name,
            layout.n_tokens,
            layout.target.n_bytes,
            layout.n_bytes_spec,
            len(layout.checkpoints),
            (time.perf_counter() - t0) * 1e3,
            n_discarded,
        )
