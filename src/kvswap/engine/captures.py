"""A client's slot verbs on their slot, and captures waiting for their buffer: a client's
page_out and save, and the copy of every idle resident mind before exit (`FlushMinds`).

`run` answers restore, erase and page_in at once on the slot the engine seated them on (a
page_in of a page holding tokens only hands back the re-prefill request for the engine to
admit, `engine.reprefill`), and starts a capture for page_out and save.

A capture measures its slot and admits the bytes at once (`SlotVerbs.begin_page` or
`begin_copy`), locks the slot (the step leaves it out and nothing else touches it) and asks the
buffer worker for a pre-faulted buffer; when the buffer arrives, the copy is the engine thread's
only work (`finish_page`, `finish_copy`). A flush is a group of copies answered together, once
the last one is in its buffer.

Owns the captures in flight, and counts the client's page verbs where they end
(`page_out_total`, `page_in_total`, `page_failed_total`; the engine's own moves are not page
verbs). Engine
thread only; no file I/O.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import time
from collections.abc import Callable
from dataclasses import replace

from kvswap.backend.lora import Adapters
from kvswap.core.errors import ErrorKind, KvswapError, PageTooLarge, StoreFull
from kvswap.core.keys import PageKey, spare_key
from kvswap.engine.commands import (
    Captured,
    FlushMinds,
    PageOut,
    SlotApply,
    SlotCapture,
    SlotErase,
    SlotVerb,
    Submit,
)
from kvswap.engine.kv.buffers import BufferReady, BufferWorker
from kvswap.engine.kv.pagestore import PageStore, Reservation
from kvswap.engine.kv.spare import Spare
from kvswap.engine.kv.verbs import PendingCapture
from kvswap.engine.reprefill import is_token_only, reprefill_request
from kvswap.engine.runtime import Runtime
from kvswap.engine.slot import Slot

log = logging.getLogger("kvswap.engine")

FLUSH_KEY = spare_key("write-behind")  # a resident mind's copy on its way to disk
Finish = Callable[[PendingCapture, BufferReady], None]
Fail = Callable[[KvswapError], None]


class Captures:
    """See the module docstring."""

    def __init__(
        self,
        runtime: Runtime,
        buffers: BufferWorker,
        store: PageStore | None,
        adapters: Adapters,
        *,
        left: Callable[[Slot], PageKey | None],
        shed: Callable[[int], int],
    ) -> None:
        self.runtime = runtime
        self.buffers = buffers
        self.store = store
        self.adapters = adapters
        self.left = left  # a page_out ended the slot's mind: the slot holds it no more
        self.shed = shed  # the anonymous cache gives up this many bytes (`AnonCache.shed`)
        self._pending: dict[int, tuple[PendingCapture, Fail]] = {}
        self._ids = itertools.count(1)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def frozen(self) -> set[int]:
        """Slots whose capture waits for its buffer (their page layout is fixed)."""
        return {pending.slot.id for pending, _ in self._pending.values()}

    # -- a client's slot verbs ----------------------------------------------------------------

    def run(self, cmd: SlotVerb, slot: Slot) -> Submit | None:
        """Run the verb on its slot (answered now, or once a capture's buffer arrives); returns
        the re-prefill request of a token-only page_in, for the engine to admit on `slot`."""
        verbs, counters = self.runtime.verbs, self.runtime.counters
        if isinstance(cmd, PageOut | SlotCapture):
            self.start(cmd, slot)  # answered once its buffer has arrived
            return None
        try:
            if isinstance(cmd, SlotApply):
                cmd.reply(verbs.apply(cmd, slot))
            elif isinstance(cmd, SlotErase):
                erased = verbs.erase(cmd, slot)
                cmd.reply(replace(erased, mind=self.left(slot)))
            elif self.store is not None and is_token_only(self.store, cmd.key):
                # A KV type change dropped its state: the slot re-prefills its tokens.
                return reprefill_request(
                    cmd, slot, self.store, self.adapters.infos, self.runtime.n_ctx_slot, counters
                )
            else:
                try:
                    cmd.reply(verbs.page_in(slot, cmd.key))
                except KvswapError:
                    counters.page_failed_total += 1
                    raise
                counters.page_in_total += 1
            slot.t_last_used = time.monotonic()
            if not isinstance(cmd, SlotErase):
                slot.namespace = cmd.namespace  # the state is the caller's prefix now
        except KvswapError as err:
            cmd.reply(err)
        return None

    def start(self, cmd: PageOut | SlotCapture, slot: Slot) -> None:
        """Admit the capture and ask for its buffer (a refusal is answered at once)."""
        verbs, counters = self.runtime.verbs, self.runtime.counters
        try:
            pending = (
                self._begin_page(cmd, slot) if isinstance(cmd, PageOut) else verbs.begin_copy(slot)
            )
        except KvswapError as err:
            counters.page_failed_total += isinstance(cmd, PageOut)
            cmd.reply(err)
            return

        def finish(pending: PendingCapture, ready: BufferReady) -> None:
            buffer = ready.buffer
            if buffer is None:
                fail(KvswapError(ErrorKind.UNAVAILABLE, f"no memory for the copy: {ready.error}"))
                return
            try:
                slot = pending.slot
                if isinstance(cmd, PageOut):
                    moved = verbs.finish_page(pending, buffer)
                    cmd.reply(replace(moved, mind=self.left(slot)))  # the mind is the page
                    counters.page_out_total += 1
                else:
                    cmd.reply(replace(verbs.finish_copy(pending, buffer), mind=slot.mind))
            except KvswapError as err:
                counters.page_failed_total += isinstance(cmd, PageOut)
                cmd.reply(err)
                return
            pending.slot.t_last_used = time.monotonic()

        def fail(err: KvswapError) -> None:
            verbs.abandon(pending)
            counters.page_failed_total += isinstance(cmd, PageOut)
            cmd.reply(err)

        self._ask(pending, finish, fail)

    def _begin_page(self, cmd: PageOut, slot: Slot) -> PendingCapture:
        """Admit a client's page; the anonymous cache's states give way to it (a cache, never
        the reason a client's page is refused)."""
        verbs = self.runtime.verbs
        try:
            return verbs.begin_page(slot, cmd.key)
        except StoreFull as err:
            self.shed(err.short_bytes)  # then admitted, or refused as the store is now
        return verbs.begin_page(slot, cmd.key)

    # -- the copy of every resident mind before exit ------------------------------------------

    def flush(self, cmd: FlushMinds, slots: list[Slot], spare: Spare | None = None) -> None:
        """Copy each slot's mind out (the slots keep their state); reply with every copy made
        once the last buffer has arrived (a copy that fails is logged and left out). A charged
        flush copies into charged memory only (`_charged_buffer`: `spare` lent, when in hand);
        a mind with no room for its copy now is left out, for a later pass."""
        out: list[tuple[PageKey, Captured]] = []
        left = len(slots)
        if not left:
            cmd.reply(out)
            return

        def one_done() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                cmd.reply(out)

        for slot in slots:
            mind = slot.mind
            assert mind is not None
            pending = self.runtime.verbs.begin_copy(slot)
            held = self._charged_buffer(pending.layout.n_bytes, spare) if cmd.charged else None
            if cmd.charged and held is None:
                one_done()  # no room for its copy now: a later pass writes it
                continue
            buffer, charge = held if held is not None else (None, None)
            if buffer is not None:
                self._copy_out(out, mind, pending, buffer, charge)
                one_done()
                continue

            def finish(
                pending: PendingCapture,
                ready: BufferReady,
                mind: PageKey = mind,
                charge: Reservation | None = charge,
            ) -> None:
                if ready.buffer is None:
                    self._failed(mind, ready.error, charge)
                else:
                    self._copy_out(out, mind, pending, ready.buffer, charge)
                one_done()

            def fail(
                err: KvswapError, mind: PageKey = mind, charge: Reservation | None = charge
            ) -> None:
                self._failed(mind, err.message, charge)
                one_done()

            self._ask(pending, finish, fail)

    def _charged_buffer(
        self, n_bytes: int, spare: Spare | None
    ) -> tuple[mmap.mmap | None, Reservation] | None:
        """Charged memory for a copy of `n_bytes`: the switch's spare, lent while no switch
        needs it (it comes back through the shelf); a shelved buffer; else a reservation within
        the store's free room, the headroom kept (its buffer mapped by the buffer worker:
        None in its place). None when none is there now."""
        store = self.store
        if store is None:
            return None
        held = spare.lend(n_bytes) if spare is not None else None
        if held is None:
            held = store.take_shelved(FLUSH_KEY, n_bytes)
        if held is not None:
            return held
        if store.in_use_bytes + store.headroom_bytes + n_bytes > store.ceiling_bytes:
            return None
        try:
            return None, store.reserve(FLUSH_KEY, n_bytes)
        except (StoreFull, PageTooLarge):
            return None

    def _copy_out(
        self,
        out: list[tuple[PageKey, Captured]],
        mind: PageKey,
        pending: PendingCapture,
        buffer: mmap.mmap,
        charge: Reservation | None,
    ) -> None:
        """The copy of `mind` into `buffer`, kept in `out`; a charged buffer goes back to the
        store's shelf when its copy is closed (a failed copy closes it and gives its charge
        back)."""
        try:
            captured = self.runtime.verbs.finish_copy(pending, buffer)
        except KvswapError as err:
            self._failed(mind, err.message, charge)
            return
        if charge is not None:
            store = self.store
            assert store is not None
            captured = replace(captured, give_back=lambda b: store.shelve(b, charge))
        out.append((mind, captured))

    def _failed(self, mind: PageKey, why: str, charge: Reservation | None) -> None:
        log.error("mind %s could not be copied out: %s", mind, why)
        if charge is not None and self.store is not None:
            self.store.cancel(charge)

    # -- the buffer -----------------------------------------------------------------------------

    def _ask(self, pending: PendingCapture, finish: Finish, fail: Fail) -> None:
        cid = next(self._ids)
        self._pending[cid] = (pending, fail)
        pending.slot.locked = True

        def arrived(ready: BufferReady) -> None:
            entry = self._pending.pop(cid, None)
            if entry is None:  # failed meanwhile (the engine is stopping)
                if ready.buffer is not None:
                    ready.buffer.close()
                return
            pending.slot.locked = False
            finish(pending, ready)

        self.buffers.allocate(pending.layout.n_bytes, arrived)

    def fail_all(self, kind: ErrorKind, message: str) -> None:
        """The engine stops: every capture in flight fails (its bytes given back)."""
        pending_all = list(self._pending.values())
        self._pending.clear()
        for pending, fail in pending_all:
            pending.slot.locked = False
            fail(KvswapError(kind, message))
