"""Seating minds in slots, on the engine thread: evict, bring in, make room, flush.

Before any job starts on a slot, `seat` makes the slot right for it:
- a slot holding another mind pages that mind out to its RAM page first (a memcpy into the
  page store), so no request, named or anonymous, and no restore or page_in ever destroys a
  mind. A mind larger than the whole page store cannot have a page: with a disk tier a copy is
  handed to the demoter, which writes it as the mind's spilled file (`minds.handoffs` holds
  it until it is on disk); without one its state is dropped, logged once (a mind's state is a
  cache of the conversation its next request carries whole, which then re-prefills it);
- `save`, `erase` and `page_out` on a slot holding a mind act on the mind where it is: save
  copies it, erase and page_out end it (the caller then forgets its spilled copy). A verb of
  another tenant is refused, naming no mind, as is one on another tenant's anonymous prompt;
- with `--cache-idle-slots` (on by default) in a unified pool, a request starting moves every
  other idle mind to its RAM page (`_idle_minds_out`), as the anonymous cache moves idle
  prompts: the pool then holds only work that runs, which libllama attends over;
- a request naming a mind then finds it: resident, a RAM page (paged in), a state read from
  disk by the HTTP side (`Submit.restore`, applied), or nothing (a new mind starts from the
  longest prefix its tenant's anonymous cache, minds in RAM or the slot hold, else empty). In a
  unified KV pool a returning mind needs cells: the least recently used idle residents move
  out first (`_make_cells`); while running requests hold the cells the job waits.

A switch copies into a spare buffer prepared ahead (`kv.spare`: reserved in the page store,
mapped and faulted in by the buffer worker, a little larger than the largest mind page), never
faulting fresh memory in on the engine thread; one that finds no spare large enough waits for
one (the job is retried when the buffer arrives). The spare is the store's headroom; the
demoter is woken, when the store is short of it, once the switch is done (the incoming mind's
page freed, the next spare off the shelf), never between its halves.

When the page store cannot take the evicted mind now, the job waits (`roomwait`) for the
demoter to spill least recently used pages to disk (each pass answers with a `RoomReport`);
when a pass that ran after the wait began could not make room (every other page is held: the
incoming mind's own, when minds are over half the budget), the evicted mind goes straight to
disk as one larger than the store does (`todisk`: from its slot into its file's mapping, no
copy in memory), or, with no disk tier, the job fails, typed.

`page_out_idle_resident` is the engine's answer to a full KV pool: the least recently used idle
resident moves out (a mind to its own page; an anonymous slot's cached prompt into the
anonymous cache, or purged as llama-server purges idle slots when the cache cannot take it),
or the caller learns to wait for a buffer, or that nothing can move.

`seat` says how a request's mind came in (`Seat`: the tier, the switch's time); `served` adds
what of the mind's history the request's prompt keeps: a prompt that does not extend it
diverges, and the rest is dropped (counted and logged, and the answer says so).

Owns the spare and the wait for room; slots carry their mind, the registry where each mind
lives, the flush schedule what changed, the hand-offs what goes to disk. Engine thread; no I/O.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import ErrorKind, KvswapError, MindMovedToDisk, StoreOff
from kvswap.core.keys import PageKey
from kvswap.core.page import read_tokens
from kvswap.core.types import MindServed
from kvswap.core.vocab import MindMove, MindSource
from kvswap.engine.commands import (
    ALL_HELD,
    MindVerb,
    PageOut,
    RoomReport,
    SlotCapture,
    SlotErase,
    Submit,
    unread,
)
from kvswap.engine.kv.buffers import BufferWorker
from kvswap.engine.kv.pagestore import SWITCH_PURPOSE, PageStore
from kvswap.engine.kv.spare import Spare, ask_quietly, in_hand
from kvswap.engine.ports import SeatRuntime
from kvswap.engine.seats.anoncache import AnonCache, Kept
from kvswap.engine.seats.flushes import FlushSchedule
from kvswap.engine.seats.handoffs import Handoffs
from kvswap.engine.seats.outcomes import NoRoomYet, NotYourMind, PagedOut, Seat
from kvswap.engine.seats.registry import MindRegistry
from kvswap.engine.seats.roomwait import RoomWait
from kvswap.engine.seats.todisk import ToDisk
from kvswap.engine.slot import Slot, SlotTable

log = logging.getLogger("kvswap.minds")


class Seating:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: PageStore | None,
        slots: SlotTable,
        runtime: SeatRuntime,
        buffers: BufferWorker,
        registry: MindRegistry,
        flushes: FlushSchedule,
        handoffs: Handoffs,
        anon: AnonCache,
        idle_out: bool = False,
    ) -> None:
        self.store = store
        self.idle_out = idle_out  # --cache-idle-slots: a start moves idle minds out of the pool
        self.slots = slots
        self.runtime = runtime
        self.buffers = buffers
        self.registry = registry
        self.flushes = flushes
        self.handoffs = handoffs
        self.anon = anon
        self.room = RoomWait()
        self.to_disk = ToDisk(handoffs, registry, runtime)
        self.spare = Spare(store, buffers, SWITCH_PURPOSE) if store is not None else None
        self._moved = False  # a mind left its slot since the demoter was last considered

    def seat(self, slot: Slot, cmd: object) -> Seat | None:
        """Make `slot` ready for the job `cmd` (a Submit or a slot verb); for a job naming a
        mind, how its mind came into the slot.

        Raises NoRoomYet (the caller requeues the job) or KvswapError (the job fails)."""
        try:
            return self._seat(slot, cmd)
        finally:
            self._wake_demoter()

    def _seat(self, slot: Slot, cmd: object) -> Seat | None:
        if isinstance(cmd, SlotCapture | SlotErase | PageOut):
            # These verbs act on the state the slot holds: the mind's, where it is (the engine
            # calls `left` after erase and page_out), or another key's prompt, never theirs.
            owner = slot.mind.namespace if slot.mind is not None else slot.namespace
            held = slot.mind is not None or len(slot.tokens) > 0
            if held and cmd.namespace is not None and owner != cmd.namespace:
                raise NotYourMind(slot.id)
            if slot.mind is not None:
                return None
        if isinstance(cmd, MindVerb) and cmd.action != MindMove.TO_SLOT:
            if slot.mind != cmd.key:
                return None  # the mind is in no slot: nothing to do
            if cmd.action == MindMove.TO_RAM:
                self.evict(slot)
            else:  # erase: the mind ends here (the caller forgets its other copies)
                self.runtime.verbs.clear(slot)
                self.left(slot)
            return None
        mind = cmd.key if isinstance(cmd, MindVerb) else None
        if isinstance(cmd, Submit):
            mind = cmd.request.mind
        reg = self.registry
        if mind and slot.mind != mind and unread(cmd) and reg.disk_only(mind, self._store().has):
            raise MindMovedToDisk(mind.name)  # since its request looked: read, sent again
        t_start = time.perf_counter()
        if slot.mind is not None and slot.mind != mind:
            self.evict(slot)
        if isinstance(cmd, Submit):
            self._idle_minds_out(slot)
        if not mind:
            if isinstance(cmd, Submit) and cmd.request.cache_prompt:
                prompt = np.asarray(cmd.request.prompt_tokens, dtype=np.int32)
                self.anon.prepare(slot, prompt, cmd.request.namespace)
            return None
        reg.touch(mind)
        if isinstance(cmd, Submit) and cmd.request.retain_s:
            reg.retain(mind, cmd.request.retain_s)
        self.flushes.changed(mind)
        if slot.mind == mind:
            reg.count(hits_slot_total=1)
            return Seat(MindSource.SLOT, 0.0)
        assert isinstance(cmd, Submit | MindVerb)
        t0 = time.perf_counter()
        if slot.mind is None:
            self.anon.displace(slot)  # the anonymous prompt it held stays findable
        source = self._bring_in(slot, mind, cmd)
        slot.mind = mind
        reg.seated(mind, slot.id)
        reg.count(switch_ms_total=(time.perf_counter() - t0) * 1e3)
        # The next switch's buffer is faulted in now, not while this one copied.
        self.ask_spare()
        return Seat(source, (time.perf_counter() - t_start) * 1e3)

    def served(self, seat: Seat, slot: Slot, prompt: np.ndarray) -> MindServed:
        """How the request `seat` seated in `slot` finds its mind: the history its prompt
        keeps. A prompt that does not extend the whole history diverges: the rest is dropped
        (its prefill writes over it), counted and logged, never silently."""
        mind = slot.mind
        assert mind is not None, "a mind's request is seated with its mind"
        # A new mind has no history of its own (what the slot holds is a seeded prefix).
        n_tokens = 0 if seat.source is MindSource.NEW else len(slot.tokens)
        n_kept = min(n_tokens, slot.tokens.common_prefix(prompt))
        served = MindServed(mind, seat.source, seat.switch_ms, n_tokens, n_kept)
        if served.diverged:
            self.registry.count(diverged_total=1, dropped_tokens_total=served.n_dropped)
            log.info(
                "mind %s: the request diverged from its history at token %d: %d of its %d "
                "tokens dropped",
                mind, served.n_kept, served.n_dropped, served.n_tokens,
            )  # fmt: skip
        return served

    def _bring_in(self, slot: Slot, mind: PageKey, cmd: Submit | MindVerb) -> MindSource:
        store, reg, verbs = self.store, self.registry, self.runtime.verbs
        if store is not None and store.has(mind) and store.get(mind).layout.token_only:
            # A KV-type reconfigure left it tokens only; the request carries its whole prompt,
            # so the mind starts from that prompt (a re-prefill) rather than failing.
            store.remove(mind)
            log.warning("mind %s held tokens only (the KV types changed): re-prefilled", mind)
            verbs.clear(slot)
            reg.count(new_total=1)
            source = MindSource.NEW
        elif store is not None and store.has(mind):
            self._make_cells(slot, store.get(mind).layout.n_tokens)
            verbs.page_in(slot, mind)
            reg.count(hits_ram_total=1)
            source = MindSource.RAM
        elif cmd.restore is not None:
            self._make_cells(slot, len(cmd.restore.tokens))
            t0 = time.perf_counter()
            verbs.mover.apply(slot, cmd.restore)
            ms = (time.perf_counter() - t0) * 1e3
            if isinstance(cmd, Submit) and cmd.seeds:  # another mind's: a new mind's prefix
                reg.count(new_total=1, disk_seeds_total=1)
                slot.t_last_used = time.monotonic()
                return MindSource.NEW
            reg.restored(mind, ms)
            reg.count(hits_disk_total=1, restore_ms_total=ms)
            source = MindSource.DISK  # or the shared tier: the HTTP side knows which
        else:  # a new mind: from its tenant's longest cached prefix, if any
            self.anon.seed(slot, cmd.request if isinstance(cmd, Submit) else None, mind)
            reg.count(new_total=1)
            source = MindSource.NEW
        slot.t_last_used = time.monotonic()
        return source

    def _make_cells(self, slot: Slot, n_tokens: int) -> None:
        """Free KV cells for a state of `n_tokens` about to be loaded into `slot`: in a unified
        pool every slot draws on one set of cells, so the least recently used idle residents
        move out (as a full pool moves them) until the state fits. Loading a state clears the
        slot's own cells first, so only the other slots' count."""
        n_cells = self.runtime.n_shared_cells
        if n_cells is None:
            return  # each slot has cells of its own
        while sum(len(s.tokens) for s in self.slots if s is not slot) + n_tokens > n_cells:
            idle = [s for s in self.slots.idle_residents() if s is not slot]
            if not idle or self._move_out(idle[0]) is not PagedOut.MOVED:
                raise NoRoomYet()  # running requests hold the cells, or a buffer is mapped

    def _idle_minds_out(self, started: Slot) -> None:
        """`--cache-idle-slots` for minds (on by default): a request starting on `started`
        moves every other idle mind of a unified pool to its RAM page, as the anonymous cache
        moves idle prompts (and llama-server its cached ones), so the pool holds only work that
        runs. libllama attends over the pool up to its highest used cell, so an idle mind left
        there slows every step of the others; a move is one copy into a spare prepared ahead,
        and the mind's return another. Without a spare ready the start waits for one (as a
        switch does; `expect` has one mapped when a mind's request ends); a mind larger than the
        whole store, or one the store has no room for now, stays."""
        if not self._moves_idle() or self.spare is None:
            return
        ceiling = self._store().ceiling_bytes
        for other in self.slots.idle_residents():
            if other is started or other.mind is None:
                continue
            n_bytes = self.runtime.verbs.mover.measure(other).n_bytes
            if n_bytes > ceiling:
                continue
            if not self.spare.ready_for(n_bytes):
                if self.spare.error:  # the last mapping failed: not now
                    self.spare.error = ""
                    return
                ready = in_hand(self.spare, n_bytes)  # (one off the store's shelf: at once)
                if ready is None:
                    return  # no room in the store for it now: the mind stays
                if not ready:
                    raise NoRoomYet()  # the start is retried when the buffer arrives
            self.evict(other)

    def expect(self, slot: Slot) -> None:
        """A mind's request ended on `slot`: have a spare mapped that can hold its state, so
        the start that moves it out of the pool finds one ready."""
        if self._moves_idle() and self.spare is not None and len(slot.tokens) > 0:
            ask_quietly(self.spare, self.runtime.verbs.mover.measure(slot).n_bytes)

    def _moves_idle(self) -> bool:
        return self.idle_out and self.runtime.n_shared_cells is not None

    def evict(self, slot: Slot) -> None:
        """Page the slot's mind out under its key (the slot is then empty); a mind too large
        for the whole store is handed to the disk tier, or dropped without one, and so is one
        the store cannot make room for (every other page held by a request) when there is a
        disk tier: a switch is refused only for a mind that fits no tier."""
        mind = slot.mind
        assert mind is not None and slot.is_idle
        store = self._store()
        if len(slot.tokens) == 0:
            self._left(slot, mind)
            return
        verbs = self.runtime.verbs
        t0 = time.perf_counter()
        layout = verbs.mover.measure(slot)
        if layout.n_bytes > store.ceiling_bytes or self.handoffs.handing(mind):
            self._too_large(slot, mind, layout.n_bytes)
            return
        # The headroom the demoter keeps and the next spare are sized by the largest mind
        # page: this one's, grown in its slot past every page so far, counts before it waits
        # (else the demoter, its headroom met, would free nothing for a page that fits no spare).
        store.saw_mind_page(layout.n_bytes)
        spare = self.spare
        assert spare is not None
        took = spare.take(mind, layout.n_bytes)
        if took is None:
            if spare.error:  # the last mapping failed: fail this switch rather than wait again
                why, spare.error = spare.error, ""
                raise KvswapError(ErrorKind.UNAVAILABLE, f"no memory for a mind switch: {why}")
            try:
                ready = spare.ask(layout.n_bytes)  # one off the store's shelf: in hand now
            except KvswapError as err:
                if err.kind is not ErrorKind.UNAVAILABLE:
                    raise
                refused = self.room.refusal()
                if refused == ALL_HELD and self.handoffs.has_disk_tier:
                    # The store cannot hold this page beside those requests hold (the incoming
                    # mind's, when minds are over half the budget): straight to disk. (A disk
                    # tier that refused the spill would refuse this too: the 503 names it.)
                    self.handoffs.log_past_store(mind, layout.n_bytes, refused)
                    self._too_large(slot, mind, layout.n_bytes)
                    return
                if refused:
                    self.room.refuse(refused, store.ceiling_bytes, err)
                self.room.begin()
                self.handoffs.call_demoter()
                raise NoRoomYet() from err
            took = spare.take(mind, layout.n_bytes) if ready else None
            if took is None:
                raise NoRoomYet()  # the buffer worker maps one; retried on its arrival
        buffer, reservation = took
        moved = verbs.capture_to_page(slot, layout=layout, reservation=reservation, buffer=buffer)
        self.room.made()
        self._left(slot, mind)
        self.registry.count(demotions_total=1, switch_ms_total=(time.perf_counter() - t0) * 1e3)
        self.ask_spare()  # the next switch's buffer, mapped meanwhile
        self._moved = True  # the demoter is woken once the switch is done (`_wake_demoter`)
        log.debug("mind %s: slot %d -> RAM page (%d tokens)", mind, slot.id, moved.n_tokens)

    def _too_large(self, slot: Slot, mind: PageKey, n_bytes: int) -> None:
        """The mind's state cannot be a page: to its file (`todisk`), or dropped without a
        disk tier; the slot is then free."""
        self.to_disk.leave(slot, mind, n_bytes, self._store().ceiling_bytes)
        self._left(slot, mind)
        self.registry.count(too_large_total=1)

    def _left(self, slot: Slot, mind: PageKey) -> None:
        slot.mind = None
        self.registry.unseated(mind)

    def left(self, slot: Slot) -> PageKey | None:
        """A slot verb ended the slot's mind (erase, page_out): the slot holds it no more.
        Returns the mind's key (None when the slot held none)."""
        mind = slot.mind
        if mind is None:
            return None
        self._left(slot, mind)
        self.handoffs.end(mind)  # a copy on its way to disk is the ended mind's
        return mind

    # -- a full KV pool ---------------------------------------------------------------------

    def page_out_idle_resident(self) -> PagedOut:
        """Move the least recently used idle slot that holds tokens out of the KV pool."""
        if self.store is None:
            return PagedOut.NOTHING
        idle = self.slots.idle_residents()
        if not idle:
            return PagedOut.NOTHING
        try:
            return self._move_out(idle[0])
        finally:
            self._wake_demoter()

    def _move_out(self, slot: Slot) -> PagedOut:
        """Free an idle resident's cells: a mind to its own page (`evict`), an anonymous
        slot's prompt into the anonymous cache (or purged when the cache cannot take it)."""
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

    def on_room_report(self, report: RoomReport) -> None:
        """A demoter pass ended: a waiting switch learns whether room could be made, and the
        next switch's spare is asked for now that there may be room (off the store's shelf,
        where the pages it spilled left their buffers)."""
        self.room.reported(report)
        self.ask_spare()

    # -- the spare buffer -------------------------------------------------------------------

    def ask_spare(self) -> None:
        """Have a spare buffer prepared for the next switch (when the store has room for it)."""
        if self.store is None:
            return
        largest = self.store.largest_mind_page_bytes
        if self.spare is not None and largest > 0:
            ask_quietly(self.spare, largest)

    def _wake_demoter(self) -> None:
        """A mind left its slot: wake the demoter if the store is short of headroom now that
        the switch is done (the incoming mind's page freed, the next spare taken off the
        shelf), not between its halves, where a pass would spill the page a moment
        later would have had room for."""
        if self._moved and self.store is not None and self.store.short_of_headroom:
            self.handoffs.call_demoter()
        self._moved = False

    def close(self) -> None:
        """Give the spare back (the engine is closing)."""
        if self.spare is not None:
            self.spare.close()

    def forget(self, key: PageKey) -> bool:
        """Free the mind's slot of it (cleared) and drop its RAM page: another replica owns it
        now. False, changing nothing, when its slot is busy."""
        slot = next((s for s in self.slots if s.mind == key), None)
        if slot is not None:
            if not slot.is_idle:
                return False
            self.runtime.verbs.clear(slot)
            self.left(slot)  # a copy on its way to disk goes too
        if self.store is not None and self.store.has(key):
            self.store.remove(key)
        return True

    def tokens_of(self, key: PageKey) -> npt.NDArray[np.int32] | None:
        """A copy of mind `key`'s tokens from its slot or its RAM page (`MindTokens`)."""
        held = self.slots.tokens_of(key)
        if held is None and self.store is not None and self.store.has(key):
            page = self.store.get(key)
            held = read_tokens(page.view(), page.layout)
        return held

    def check_integrity(self) -> None:
        """Assert the registry's residents are exactly the slots' minds, and a mind on its way
        to disk (too large for the store) still holds its slot until its file is written."""
        seated = {s.mind: s.id for s in self.slots if s.mind is not None}
        assert self.registry.residents() == seated, (self.registry.residents(), seated)
        for key in self.handoffs.minds():
            assert key in seated, f"mind {key} on its way to disk left its slot first"

    def _store(self) -> PageStore:
        if self.store is None:
            raise StoreOff("minds need the page store (--page-ram-bytes > 0)")
        return self.store
