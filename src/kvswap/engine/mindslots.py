"""Seating minds in slots, on the engine thread: evict, bring in, flush.

Before any job starts on a slot, `seat` makes the slot right for it:
- a slot holding another mind pages that mind out to its RAM page first (a memcpy into the
  page store), so no request, named or anonymous, and no slot verb ever destroys a mind;
- a request naming a mind then finds it: resident (nothing to do), a RAM page (paged in), a
  state read from disk by the HTTP side (`Submit.restore`, applied), or nothing (a new mind
  starts from an empty slot).

A switch copies into a spare buffer prepared ahead (reserved in the page store, mapped and
faulted in by the buffer worker, a little larger than the largest mind page): faulting fresh
memory in costs several times the copy, so it is done before the switch, not during it. The
part of the spare a page does not use is given back to the OS and to the store's count.

When the page store cannot take the evicted mind now, the job waits (the demoter is woken to
spill least recently used pages to disk and nudges the engine); when the demoter reports it
cannot make room, the job fails with its typed reason instead of waiting forever.

Owns no state of its own: slots carry their mind, the registry the rest. Called only by the
engine thread; does no file I/O.
"""

from __future__ import annotations

import logging
import mmap
import time
from typing import TYPE_CHECKING

import numpy as np

from kvswap.engine.buffers import BufferReady, new_buffer
from kvswap.engine.commands import Captured, PageMoved, PageOut, SlotCapture, Submit
from kvswap.engine.minds import MindRegistry
from kvswap.engine.pagestore import PageStore, Reservation
from kvswap.engine.slot import Slot
from kvswap.engine.types import ErrorKind, KvswapError
from kvswap.engine.verbs import PendingCapture

if TYPE_CHECKING:
    from kvswap.engine.engine import Engine

log = logging.getLogger("kvswap.minds")

SPARE_TAG = -1  # the buffer worker's tag for the spare (the engine's own tags are positive)
_SPARE_SLACK = 1.25  # the spare's size over the largest mind page seen (pages grow each turn)
_SPARE_ROUND = 2 << 20  # ... rounded up to whole huge pages


def _no_reply(_: object) -> None:
    """The reply of a verb run for a mind's move."""


class NoRoomYet(Exception):
    """The page store cannot take an evicted mind now: the job waits for the demoter."""


class MindSlots:
    """See the module docstring."""

    def __init__(self, engine: Engine, registry: MindRegistry) -> None:
        self.engine = engine
        self.registry = registry
        self._asked_at = -1  # demoter passes done when a switch began waiting for room; -1: none
        self._spare: tuple[mmap.mmap, Reservation] | None = None
        self._spare_pending: Reservation | None = None  # asked of the buffer worker

    def seat(self, slot: Slot, cmd: object) -> None:
        """Make `slot` ready for the job `cmd` (a Submit or a slot verb).

        Raises NoRoomYet (the caller requeues the job) or KvswapError (the job fails)."""
        mind = cmd.request.mind if isinstance(cmd, Submit) else ""
        if slot.mind is not None and slot.mind != mind:
            self.evict(slot)
        if not mind:
            if isinstance(cmd, Submit) and cmd.request.cache_prompt:
                prompt = np.asarray(cmd.request.prompt_tokens, dtype=np.int32)
                self.engine.anon.prepare(slot, prompt)
            return
        reg = self.registry
        reg.touch(mind)
        if slot.mind == mind:
            reg.counters.hits_slot_total += 1
            return
        assert isinstance(cmd, Submit)
        t0 = time.perf_counter()
        if slot.mind is None:
            self.engine.anon.save(slot)  # the anonymous prompt it held stays findable
        self._bring_in(slot, mind, cmd)
        slot.mind = mind
        reg.counters.switch_ms_total += (time.perf_counter() - t0) * 1e3
        # The next switch's buffer is faulted in now, not while this one copied.
        self.ask_spare()

    def _bring_in(self, slot: Slot, mind: str, cmd: Submit) -> None:
        eng, reg = self.engine, self.registry
        store = eng.store
        if store is not None and store.has(mind) and store.get(mind).layout.token_only:
            # A KV-type reconfigure left it tokens only; the request carries its whole prompt,
            # so the mind starts from that prompt (a re-prefill) rather than failing.
            store.remove(mind)
            log.warning("mind %s held tokens only (the KV types changed): re-prefilled", mind)
            eng.verbs.clear(slot)
            reg.counters.new_total += 1
        elif store is not None and store.has(mind):
            eng.verbs.page_in(slot, mind)
            reg.counters.hits_ram_total += 1

        elif cmd.restore is not None:
            eng.verbs.mover.apply(slot, cmd.restore)
            reg.counters.hits_disk_total += 1
        else:
            eng.verbs.clear(slot)
            reg.counters.new_total += 1
        slot.t_last_used = time.monotonic()

    def evict(self, slot: Slot) -> None:
        """Page the slot's mind out under its key (the slot is then empty)."""
        mind = slot.mind
        assert mind is not None and slot.is_idle
        store = self._store()
        if len(slot.tokens) == 0:
            slot.mind = None
            return
        verbs = self.engine.verbs
        t0 = time.perf_counter()
        cmd = PageOut(-1, slot.id, mind, _no_reply)
        layout = verbs.mover.measure(slot)
        spare = self._take_spare(mind, layout.n_bytes)
        if spare is not None:
            buffer, reservation = spare
            pending = PendingCapture(cmd, slot, layout, reservation, t0)
        else:
            try:
                pending = verbs.begin_capture(cmd, slot, layout)
            except KvswapError as err:
                if err.kind is not ErrorKind.UNAVAILABLE:
                    raise
                self._no_room(err)
            buffer = new_buffer(layout.n_bytes)
        self._asked_at = -1
        moved = verbs.finish_capture(pending, buffer)
        assert isinstance(moved, PageMoved)
        slot.mind = None
        self.registry.counters.demotions_total += 1
        self.registry.counters.switch_ms_total += (time.perf_counter() - t0) * 1e3
        self.registry.saw_page(pending.layout.n_bytes)
        if store.charged_bytes > store.ceiling_bytes - self.headroom_bytes():
            self.registry.wake.set()
        log.debug("mind %s: slot %d -> RAM page (%d tokens)", mind, slot.id, moved.n_tokens)

    # -- the spare buffer -------------------------------------------------------------------

    def ask_spare(self) -> None:
        """Have a spare buffer prepared for the next switch (when the store has room for it)."""
        store = self.engine.store
        if self._spare is not None or self._spare_pending is not None or store is None:
            return
        largest = self.registry.largest_page_bytes
        if largest == 0:
            return
        n_bytes = -(-int(largest * _SPARE_SLACK) // _SPARE_ROUND) * _SPARE_ROUND
        try:
            self._spare_pending = store.reserve("", n_bytes)
        except KvswapError:
            return  # no room now: the next switch allocates its own buffer
        self.engine.buffers.allocate(n_bytes, SPARE_TAG)

    def spare_ready(self, ready: BufferReady) -> None:
        reservation, self._spare_pending = self._spare_pending, None
        assert reservation is not None and self.engine.store is not None
        if ready.buffer is None:
            self.engine.store.cancel(reservation)
            return
        self._spare = (ready.buffer, reservation)

    def _take_spare(self, name: str, n_bytes: int) -> tuple[mmap.mmap, Reservation] | None:
        """The spare, trimmed to `n_bytes` and reserved for page `name`, if it is large enough."""
        if self._spare is None or len(self._spare[0]) < n_bytes:
            return None
        store = self._store()
        buffer, reservation = self._spare
        self._spare = None
        kept = -(-n_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        if kept < len(buffer):
            buffer.madvise(mmap.MADV_DONTNEED, kept, len(buffer) - kept)
        return buffer, store.trim(reservation, name, min(kept, reservation.n_bytes))

    def close(self) -> None:
        """Give the spare back (the engine is closing)."""
        if self._spare is not None and self.engine.store is not None:
            buffer, reservation = self._spare
            self._spare = None
            buffer.close()
            self.engine.store.cancel(reservation)

    def _no_room(self, err: KvswapError) -> None:
        """The store cannot take an evicted mind: wait for a demoter pass that starts after this
        moment; when such a pass could not make room, fail with its reason."""
        reg = self.registry
        n_passes = reg.n_demote_passes
        if 0 <= self._asked_at < n_passes and reg.room_error:
            self._asked_at = -1
            raise KvswapError(
                ErrorKind.UNAVAILABLE,
                f"cannot make room for a mind switch: the page store is full and {reg.room_error}",
            ) from err
        if self._asked_at < 0:
            self._asked_at = n_passes
        reg.need_room()
        raise NoRoomYet() from err

    def headroom_bytes(self) -> int:
        """Free bytes the demoter keeps in the store: room for a switch, so it stays a memcpy."""
        store = self._store()
        return min(
            store.ceiling_bytes, max(store.ceiling_bytes // 4, self.registry.largest_page_bytes)
        )

    def flush(self) -> list[tuple[str, Captured]]:
        """Copies of every idle resident mind's state (the slots keep theirs)."""
        out = []
        verbs = self.engine.verbs
        for slot in self.engine.slots:
            if slot.mind is None or not slot.is_idle or len(slot.tokens) == 0:
                continue
            pending = verbs.begin_capture(SlotCapture(-1, slot.id, _no_reply), slot)
            captured = verbs.finish_capture(pending, new_buffer(pending.layout.n_bytes))
            assert isinstance(captured, Captured)
            out.append((slot.mind, captured))
        return out

    def _store(self) -> PageStore:
        store = self.engine.store
        if store is None:
            raise KvswapError(
                ErrorKind.NOT_SUPPORTED, "minds need the page store (--page-ram-bytes > 0)"
            )
        return store
