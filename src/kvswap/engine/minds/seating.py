"""Seating minds in slots, on the engine thread: evict, bring in, make room, flush.

Before any job starts on a slot, `seat` makes the slot right for it:
- a slot holding another mind pages that mind out to its RAM page first (a memcpy into the
  page store), so no request, named or anonymous, and no slot verb ever destroys a mind;
- a request naming a mind then finds it: resident (nothing to do), a RAM page (paged in), a
  state read from disk by the HTTP side (`Submit.restore`, applied), or nothing (a new mind
  starts from an empty slot).

A switch copies into a spare buffer prepared ahead (`kv.spare`: reserved in the page store,
mapped and faulted in by the buffer worker, a little larger than the largest mind page):
faulting fresh memory in costs several times the copy, so it is done before the switch, never
during it on the engine thread. A switch that finds no spare large enough waits for one (the
job is retried when the buffer arrives), as it waits for room.

When the page store cannot take the evicted mind now, the job waits: the demoter is woken to
spill least recently used pages to disk, and answers each pass with a `RoomReport`; when a pass
that ran after the switch began waiting could not make room, the job fails with its typed
reason instead of waiting forever.

`page_out_idle_resident` is the engine's answer to a full KV pool: the least recently used idle
resident moves out (a mind to its own page; an anonymous slot's cached prompt into the
anonymous cache, where it is found by its prefix and evicted like any entry, or, when the cache
cannot take it, purged as llama-server purges idle slots), or the caller learns to wait for a
buffer, or that nothing can move. Nothing the engine makes here is a page that lives forever.

Owns the spare and the wait for room; slots carry their mind, the registry the rest. Called only
by the engine thread; does no file I/O.
"""

from __future__ import annotations

import logging
import time
from enum import Enum

import numpy as np

from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.core.keys import PageKey
from kvswap.engine.commands import RoomReport, Submit
from kvswap.engine.kv.buffers import BufferWorker
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.kv.spare import Spare, ask_quietly
from kvswap.engine.minds.anoncache import AnonCache, Kept
from kvswap.engine.minds.registry import MindRegistry
from kvswap.engine.runtime import Runtime
from kvswap.engine.slot import Slot, SlotTable

log = logging.getLogger("kvswap.minds")


class NoRoomYet(Exception):
    """An evicted mind cannot be copied out now (the page store has no room, or its spare
    buffer is still being mapped): the job waits for the demoter or the buffer worker."""


class PagedOut(Enum):
    """What `page_out_idle_resident` did."""

    MOVED = "moved"  # an idle resident left its slot: retry the step
    WAITING = "waiting"  # a buffer is being mapped (or room made): retry once it arrives
    NOTHING = "nothing"  # nothing can move


class Seating:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: PageStore | None,
        slots: SlotTable,
        runtime: Runtime,
        buffers: BufferWorker,
        registry: MindRegistry,
        anon: AnonCache,
    ) -> None:
        self.store = store
        self.slots = slots
        self.runtime = runtime
        self.buffers = buffers
        self.registry = registry
        self.anon = anon
        self._n_reported = 0  # the last demoter pass that reported
        self._room_ticket: int | None = None  # a waiting switch needs a report from this pass on
        self._room_refused = ""  # why such a pass could not make room
        self.spare = Spare(store, buffers, "mind-switch") if store is not None else None

    def seat(self, slot: Slot, cmd: object) -> None:
        """Make `slot` ready for the job `cmd` (a Submit or a slot verb).

        Raises NoRoomYet (the caller requeues the job) or KvswapError (the job fails)."""
        mind = cmd.request.mind if isinstance(cmd, Submit) else None
        if slot.mind is not None and slot.mind != mind:
            self.evict(slot)
        if not mind:
            if isinstance(cmd, Submit) and cmd.request.cache_prompt:
                prompt = np.asarray(cmd.request.prompt_tokens, dtype=np.int32)
                self.anon.prepare(slot, prompt)
            return
        reg = self.registry
        reg.touch(mind)
        if slot.mind == mind:
            reg.count(hits_slot_total=1)
            return
        assert isinstance(cmd, Submit)
        t0 = time.perf_counter()
        if slot.mind is None:
            self.anon.save(slot)  # the anonymous prompt it held stays findable
        self._bring_in(slot, mind, cmd)
        slot.mind = mind
        reg.seated(mind, slot.id)
        reg.count(switch_ms_total=(time.perf_counter() - t0) * 1e3)
        # The next switch's buffer is faulted in now, not while this one copied.
        self.ask_spare()

    def _bring_in(self, slot: Slot, mind: PageKey, cmd: Submit) -> None:
        store, reg, verbs = self.store, self.registry, self.runtime.verbs
        if store is not None and store.has(mind) and store.get(mind).layout.token_only:
            # A KV-type reconfigure left it tokens only; the request carries its whole prompt,
            # so the mind starts from that prompt (a re-prefill) rather than failing.
            store.remove(mind)
            log.warning("mind %s held tokens only (the KV types changed): re-prefilled", mind)
            verbs.clear(slot)
            reg.count(new_total=1)
        elif store is not None and store.has(mind):
            verbs.page_in(slot, mind)
            reg.count(hits_ram_total=1)
        elif cmd.restore is not None:
            verbs.mover.apply(slot, cmd.restore)
            reg.count(hits_disk_total=1)
        else:
            verbs.clear(slot)
            reg.count(new_total=1)
        slot.t_last_used = time.monotonic()

    def evict(self, slot: Slot) -> None:
        """Page the slot's mind out under its key (the slot is then empty)."""
        mind = slot.mind
        assert mind is not None and slot.is_idle
        store = self._store()
        if len(slot.tokens) == 0:
            self._left(slot, mind)
            return
        verbs = self.runtime.verbs
        t0 = time.perf_counter()
        layout = verbs.mover.measure(slot)
        spare = self.spare
        assert spare is not None
        took = spare.take(mind, layout.n_bytes)
        if took is None:
            if spare.error:  # the last mapping failed: fail this switch rather than wait again
                why, spare.error = spare.error, ""
                raise KvswapError(ErrorKind.UNAVAILABLE, f"no memory for a mind switch: {why}")
            try:
                spare.ask(layout.n_bytes)
            except KvswapError as err:
                if err.kind is not ErrorKind.UNAVAILABLE:
                    raise
                self._no_room(err)
            raise NoRoomYet()  # the buffer worker maps one; the job is retried on its arrival
        buffer, reservation = took
        moved = verbs.capture_to_page(slot, layout=layout, reservation=reservation, buffer=buffer)
        self._room_ticket, self._room_refused = None, ""
        self._left(slot, mind)
        self.registry.count(demotions_total=1, switch_ms_total=(time.perf_counter() - t0) * 1e3)
        self.registry.saw_page(layout.n_bytes)
        self.ask_spare()  # the next switch's buffer, mapped meanwhile
        if store.charged_bytes > store.ceiling_bytes - self.registry.headroom_bytes(
            store.ceiling_bytes
        ):
            self.registry.need_room()
        log.debug("mind %s: slot %d -> RAM page (%d tokens)", mind, slot.id, moved.n_tokens)

    def _left(self, slot: Slot, mind: PageKey) -> None:
        slot.mind = None
        self.registry.unseated(mind)

    # -- a full KV pool ---------------------------------------------------------------------

    def page_out_idle_resident(self) -> PagedOut:
        """Move the least recently used idle slot that holds tokens out of the KV pool."""
        if self.store is None:
            return PagedOut.NOTHING
        idle = self.slots.idle_residents()
        if not idle:
            return PagedOut.NOTHING
        slot = idle[0]
        n_tokens = len(slot.tokens)
        if slot.mind is not None:
            try:
                self.evict(slot)  # the mind keeps its own page
            except NoRoomYet:
                return PagedOut.WAITING
            except KvswapError as err:
                log.warning(
                    "KV pool full and idle mind slot %d could not be paged out: %s",
                    slot.id,
                    err.message,
                )
                return PagedOut.NOTHING
            return PagedOut.MOVED
        kept = self.anon.keep(slot)
        if kept is Kept.WAITING:
            return PagedOut.WAITING
        if kept is Kept.REFUSED:
            # The cache is off or cannot take it: a cached prompt is purged, as llama-server's
            # try_clear_idle_slots does (a mind is never purged).
            self.runtime.verbs.clear(slot)
            log.warning("KV pool full: purged idle slot %d (%d cached tokens)", slot.id, n_tokens)
            return PagedOut.MOVED
        log.warning(
            "KV pool full: idle slot %d (%d tokens) moved into the anonymous cache",
            slot.id,
            n_tokens,
        )
        return PagedOut.MOVED

    # -- waiting for room -------------------------------------------------------------------

    def _no_room(self, err: KvswapError) -> None:
        """The store cannot take an evicted mind: wait for a demoter pass that reports after
        this moment; when such a pass could not make room, fail with its reason."""
        if self._room_ticket is not None and self._room_refused:
            reason = self._room_refused
            self._room_ticket, self._room_refused = None, ""
            raise KvswapError(
                ErrorKind.UNAVAILABLE,
                f"cannot make room for a mind switch: the page store is full and {reason}",
            ) from err
        if self._room_ticket is None:
            self._room_ticket = self._n_reported + 1
        self.registry.need_room()
        raise NoRoomYet() from err

    def on_room_report(self, report: RoomReport) -> None:
        """A demoter pass ended: a waiting switch learns whether room could be made."""
        self._n_reported = report.pass_no
        ticket = self._room_ticket
        if ticket is not None and report.pass_no >= ticket and report.refused:
            self._room_refused = report.refused

    # -- the spare buffer -------------------------------------------------------------------

    def ask_spare(self) -> None:
        """Have a spare buffer prepared for the next switch (when the store has room for it)."""
        largest = self.registry.largest_page_bytes
        if self.spare is not None and largest > 0:
            ask_quietly(self.spare, largest)

    def close(self) -> None:
        """Give the spare back (the engine is closing)."""
        if self.spare is not None:
            self.spare.close()

    # -- the flush before exit --------------------------------------------------------------

    def flush_slots(self) -> list[Slot]:
        """The idle slots holding a mind with tokens: what a spill before exit copies out."""
        return [s for s in self.slots if s.mind is not None and s.is_idle and len(s.tokens) > 0]

    def _store(self) -> PageStore:
        if self.store is None:
            raise StoreOff("minds need the page store (--page-ram-bytes > 0)")
        return self.store
