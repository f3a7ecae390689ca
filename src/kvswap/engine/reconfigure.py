"""POST /reconfigure on the engine thread: a relaunch is a pause, not a reload.

A reconfigure closes admission (arriving work queues), lets running requests reach a geometry
where each has a seat (a request on a slot past the new `n_parallel` moves to a free lower
slot, or the engine drains until one is free, up to a timeout), then, in one pause: every
occupied slot's state becomes a page (pre-checked against the page ceiling), the context is
freed and rebuilt on the same loaded model, slots are rebuilt, states go back (a stream header
is rewritten when the stream count changed), and admission reopens. Running requests keep their
sampler and RNG and go on as if nothing happened. A geometry libllama cannot build rolls back
to the old one with every state restored.

Before the pause, each occupied slot gets a buffer prepared by the buffer worker (`kv.spare`,
reserved in the page store: a store that cannot hold them refuses the reconfigure before
anything changes), so the pause only copies. After it, a mind left without a seat stays its own
RAM page; an idle anonymous slot left without one joins the anonymous cache. A KV type change
leaves every state of the old types (residents, minds' and clients' pages) as tokens that
re-prefill on page_in, and empties the anonymous cache (re-prefilling a cached prefix costs what
a miss costs).

Owns the procedure (`Reconfigurer`; the pure plan is `engine.plan.reconfigure`), which
works on the narrow owners it is given (the runtime, the slot table, the page store, the mind
registry) and never on the engine. The engine calls `submit`, `admission_open` and `tick`; a tick
that ran a reconfigure hands back the command and its answer (`Finished`), and the engine then
revalidates its waiting jobs, refreshes its snapshot and replies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import psutil

from kvswap.backend.info import ModelInfo
from kvswap.core.errors import ContextInitError, ErrorKind, KvswapError
from kvswap.core.keys import PageKey, PageKind, engine_key
from kvswap.core.page import plan_layout, read_tokens, state_of_page, write_tokens
from kvswap.engine.commands import Reconfigure, ReconfigureReceipt, SlotFate
from kvswap.engine.kv.buffers import BufferWorker, new_buffer
from kvswap.engine.kv.pagestore import Page, PageStore
from kvswap.engine.kv.spare import Spare
from kvswap.engine.plan.geometry import Geometry
from kvswap.engine.plan.reconfigure import (
    Occupant,
    SeatPlan,
    check_memory,
    plan_seats,
    target_geometry,
)
from kvswap.engine.ports import RebuildRuntime
from kvswap.engine.running import RunningRequest
from kvswap.engine.seats.anoncache import AnonCache
from kvswap.engine.seats.registry import MindRegistry
from kvswap.engine.slot import SlotTable

log = logging.getLogger("kvswap.reconfigure")


@dataclass
class _Pending:
    cmd: Reconfigure
    target: Geometry
    deadline: float
    t_start: float
    spares: dict[int, Spare] = field(default_factory=dict)  # slot id -> its move's buffer

    def discard_spares(self) -> None:
        for spare in self.spares.values():
            spare.discard()
        self.spares.clear()


@dataclass(frozen=True)
class Finished:
    """A reconfigure that ended (ran, rolled back or was refused after waiting): the engine
    revalidates waiting work and refreshes its snapshot, then sends `result` to `cmd`."""

    cmd: Reconfigure
    result: ReconfigureReceipt | KvswapError
    changed: bool  # the contexts were rebuilt (queued work must be checked again)


class Reconfigurer:
    """Runs reconfigures; see the module docstring."""

    def __init__(
        self,
        *,
        runtime: RebuildRuntime,
        slots: SlotTable,
        store: PageStore | None,
        model_info: ModelInfo,
        registry: MindRegistry,
        anon: AnonCache,
        buffers: BufferWorker,
        fault_on_install: bool = False,
    ) -> None:
        self.runtime = runtime
        self.slots = slots
        self.store = store
        self.info = model_info
        self.registry = registry
        self.anon = anon
        self.buffers = buffers
        self.fault_on_install = fault_on_install  # a test seam: the new context fails to build
        self._pending: _Pending | None = None
        self.total = 0
        self.failed_total = 0

    @property
    def admission_open(self) -> bool:
        return self._pending is None

    def submit(self, cmd: Reconfigure) -> None:
        if self._pending is not None:
            self._refuse(cmd, ErrorKind.UNAVAILABLE, "a reconfigure is already running")
            return
        try:
            target = target_geometry(self.runtime.geometry, cmd.spec)
            if self._kv_type_changes(target) and not cmd.spec.force:
                raise KvswapError(
                    ErrorKind.INVALID_REQUEST,
                    'changing the KV cache types drops every resident state to tokens: send "force": true',
                )
            self._check_streams(target)
            check_memory(self.info, target, psutil.virtual_memory().available)

        except KvswapError as err:
            self._refuse(cmd, err.kind, err.message)
            return
        now = time.monotonic()
        self._pending = _Pending(cmd, target, now + cmd.spec.drain_timeout_s, now)
        log.info("reconfigure: admission closed, waiting for seats (target %s)", target)

    def _refuse(self, cmd: Reconfigure, kind: ErrorKind, message: str) -> None:
        self.failed_total += 1
        log.warning("reconfigure refused: %s", message)
        cmd.reply(KvswapError(kind, message))

    def _kv_type_changes(self, target: Geometry) -> bool:
        cur = self.runtime.geometry
        return (cur.cache_type_k, cur.cache_type_v) != (target.cache_type_k, target.cache_type_v)

    def _check_streams(self, target: Geometry) -> None:
        cur, info = self.runtime.geometry, self.info
        n_from = 1 if cur.kv_unified else cur.n_parallel
        n_to = 1 if target.kv_unified else target.n_parallel
        plain = not (info.is_recurrent or info.is_hybrid or info.n_swa > 0)
        if n_from != n_to and not plain:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"this model's memory (recurrent, hybrid or sliding window) records its stream count "
                f"({n_from} -> {n_to}), and kvswap rewrites stream headers for plain KV caches only: "
                "keep n_parallel, or run with unified KV (-kvu)",
            )

    # -- waiting for seats ------------------------------------------------------------------

    def tick(self, captures_pending: bool) -> Finished | None:
        """Called between steps: run the pending reconfigure once every request has a seat (and
        no capture waits for its buffer). Returns what ended, for the engine to answer."""
        p = self._pending
        if p is None:
            return None
        running = self.slots.busy()
        kv_change = self._kv_type_changes(p.target)
        blocked = len(running) > p.target.n_parallel or (kv_change and running) or captures_pending
        if blocked:
            if time.monotonic() < p.deadline:
                return None  # keep decoding: requests drain
            self._pending = None
            p.discard_spares()
            self.failed_total += 1
            message = (
                f"requests did not drain within {p.cmd.spec.drain_timeout_s} s "
                f"({len(running)} running, {p.target.n_parallel} slots in the new geometry)"
            )
            log.warning("reconfigure refused: %s", message)
            return Finished(p.cmd, KvswapError(ErrorKind.UNAVAILABLE, message), changed=False)
        try:
            if not self._prepared(p):
                return None  # keep decoding while the buffer worker maps the moves' buffers
            self._pending = None
            receipt = self._run(p, time.monotonic())
        except KvswapError as err:
            self._pending = None
            self.failed_total += 1
            log.warning("reconfigure refused: %s", err.message)
            return Finished(p.cmd, KvswapError(err.kind, err.message), changed=False)
        finally:
            if self._pending is None:
                p.discard_spares()
        if receipt.rolled_back:
            self.failed_total += 1
            error = KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"reconfigure rolled back: {receipt.reason}",
                receipt=receipt,
            )
            return Finished(p.cmd, error, changed=True)
        self.total += 1
        return Finished(p.cmd, receipt, changed=True)

    def _prepared(self, p: _Pending) -> bool:
        """Every occupied slot has a buffer large enough for its move (asked for now if not);
        typed 503 when the page store cannot reserve them or the worker cannot map them."""
        occupied = [s for s in self.slots if s.running is not None or len(s.tokens) > 0]
        if not occupied:
            return True
        store = self.store
        if store is None:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                "occupied slots need the page store to move (--page-ram-bytes > 0)",
            )
        ready = True
        for slot in occupied:
            n_bytes = self.runtime.verbs.mover.measure(slot).n_bytes
            spare = p.spares.setdefault(
                slot.id, Spare(store, self.buffers, f"reconfigure-slot{slot.id}")
            )
            if spare.error:
                raise KvswapError(ErrorKind.UNAVAILABLE, f"no memory for the move: {spare.error}")
            if spare.ready_for(n_bytes):
                continue
            try:
                ready = spare.ask(n_bytes) and ready  # (one off the store's shelf: at once)
            except KvswapError as err:
                raise KvswapError(
                    ErrorKind.UNAVAILABLE,
                    f"the page store cannot hold the slots' states for the move ({err.message}; "
                    f"--page-ram-bytes {store.ceiling_bytes}); nothing changed",
                ) from err
        return ready

    # -- the pause --------------------------------------------------------------------------

    def _run(self, p: _Pending, t_drained: float) -> ReconfigureReceipt:
        rt, slots, target = self.runtime, self.slots, p.target
        old = rt.geometry
        new_slot_ctx = target.n_ctx_slot(rt.n_ctx_trained)
        occupants = self._occupants(new_slot_ctx)
        plan = plan_seats(occupants, target.n_parallel, new_slot_ctx)
        kv_change = self._kv_type_changes(target)
        receipt = ReconfigureReceipt(old, target, new_slot_ctx, rt.n_ctx_slot)
        timings = receipt.timings_ms
        timings["drain_ms"] = (t_drained - p.t_start) * 1e3
        # Whole states even when the KV types change: a rollback must find every state intact.
        pages = self._page_out_all(occupants, old.generation, p.spares)

        t1 = time.monotonic()
        timings["page_out_ms"] = (t1 - t_drained) * 1e3
        receipt.n_bytes_moved = sum(page.n_bytes for page in pages.values())
        runs = {s.id: s.running for s in slots.busy() if s.running is not None}
        minds = {s.id: s.mind for s in slots if s.mind is not None}
        tenants = {s.id: s.namespace for s in slots}
        rt.close()
        t2 = time.monotonic()
        timings["free_ms"] = (t2 - t1) * 1e3
        rollback = self._install(target, occupants, receipt)
        if rollback is not None:
            plan, kv_change = rollback, False  # every state goes back where it was
        t3 = time.monotonic()
        timings["init_ms"] = (t3 - t2) * 1e3
        if kv_change:
            self._drop_states(pages)
            self._drop_stored_states(exclude={page.generation for page in pages.values()})
        slots.rebuild(rt.geometry.n_parallel, rt.n_ctx_slot)

        receipt.slots = self._page_in_all(occupants, plan, pages, runs, kv_change, tenants)
        self._reseat_minds(minds, receipt.slots)
        t4 = time.monotonic()
        timings["page_in_ms"] = (t4 - t3) * 1e3
        timings["total_ms"] = (t4 - p.t_start) * 1e3
        log.info("reconfigure: %s -> %s in %.1f ms", old, rt.geometry, timings["total_ms"])
        return receipt

    def _occupants(self, new_slot_ctx: int) -> list[Occupant]:
        """The occupied slots; typed 400 when a running request would not fit the new window
        (nothing is truncated, so nothing changes)."""
        occupants = [
            Occupant(
                s.id, s.running is not None, len(s.tokens) + (1 if s.running is not None else 0)
            )
            for s in self.slots
            if s.running is not None or len(s.tokens) > 0
        ]
        for occ in occupants:
            if occ.running and occ.n_tokens >= new_slot_ctx:
                raise KvswapError(
                    ErrorKind.INVALID_REQUEST,
                    f"the request on slot {occ.slot_id} holds {occ.n_tokens} tokens, more than the "
                    f"new window ({new_slot_ctx}): nothing is truncated, so nothing changed",
                )
        return occupants

    def _install(
        self, target: Geometry, occupants: list[Occupant], receipt: ReconfigureReceipt
    ) -> SeatPlan | None:
        """Build `target`; when libllama cannot, build the old geometry again (it was built
        before) and return the rollback's plan: every state back to its own slot."""
        try:
            if self.fault_on_install:
                raise ContextInitError("injected fault (KVSWAP_FAULT_RECONFIGURE)")
            self.runtime.install(target)
            return None
        except ContextInitError as err:
            log.error("reconfigure: %s; rolling back to %s", err, receipt.old)
            self.runtime.install(receipt.old)
            receipt.rolled_back, receipt.reason = True, str(err)
            receipt.new = receipt.old
            receipt.n_ctx_slot = self.runtime.n_ctx_slot
            return SeatPlan({o.slot_id: o.slot_id for o in occupants}, {})

    def _reseat_minds(self, minds: Mapping[int, PageKey], fates: list[SlotFate]) -> None:
        """A seated mind stays that mind's (engine.seats): the registry follows it to its new
        slot; one left without a seat stays its own RAM page."""
        for mind in minds.values():
            self.registry.unseated(mind)
        for fate in fates:
            if fate.new_slot is not None and fate.old_slot in minds:
                self.slots[fate.new_slot].mind = minds[fate.old_slot]
                self.registry.seated(minds[fate.old_slot], fate.new_slot)

    def _page_out_all(
        self, occupants: list[Occupant], generation: int, spares: Mapping[int, Spare]
    ) -> dict[int, Page]:
        """Every occupied slot becomes a page, copied into the buffer prepared for it."""
        store, verbs = self.store, self.runtime.verbs
        pages: dict[int, Page] = {}
        for occ in occupants:
            assert store is not None
            slot = self.slots[occ.slot_id]
            layout = verbs.mover.measure(slot)
            key = self._page_key(slot.mind, occ.running, generation, slot.id)
            took = spares[slot.id].take(key, layout.n_bytes)
            assert took is not None, "checked by _prepared in this same tick"
            buffer, reservation = took
            verbs.capture_to_page(slot, layout=layout, reservation=reservation, buffer=buffer)
            pages[slot.id] = store.get(key)
        return pages

    def _page_key(
        self, mind: PageKey | None, running: bool, generation: int, slot_id: int
    ) -> PageKey:
        """A mind keeps its own key (left without a seat, it stays findable in RAM); an idle
        anonymous state takes a key of the anonymous cache (left without one, it joins it)."""
        if mind is not None:
            return mind
        if not running:
            return self.anon.new_key()
        return engine_key(f"reconfigure-g{generation}-slot{slot_id}")

    def _drop_states(self, pages: dict[int, Page]) -> None:
        """The new contexts are built with other KV types: each page keeps its tokens (and LoRA
        set) only, and re-prefills on page_in. Runs after the install, so a rollback never meets
        a page without its state."""
        store = self.store
        assert store is not None
        for slot_id, page in pages.items():
            with page.view() as view:
                tokens = read_tokens(view, page.layout)
            store.remove(page.key, page.generation)
            pages[slot_id] = self._store_tokens(page.key, tokens, page)

    def _store_tokens(self, key: PageKey, tokens: np.ndarray, page: Page) -> Page:
        """Page `key` as its tokens only (4 bytes a token: the only buffer a pause maps)."""
        store = self.store
        assert store is not None
        layout = replace(
            plan_layout(len(tokens), 0, page.layout.geometry),
            token_only=True,
            lora=page.layout.lora,
        )
        reservation = store.reserve(key, layout.n_bytes)
        try:
            buffer = new_buffer(layout.n_bytes)
        except OSError as err:
            store.cancel(reservation)
            raise KvswapError(
                ErrorKind.UNAVAILABLE, f"no memory for a tokens-only page: {err}"
            ) from err
        with memoryview(buffer) as view:
            write_tokens(view, layout, tokens)
        return store.commit(reservation, buffer, layout)

    def _drop_stored_states(self, exclude: set[int]) -> None:
        """The KV types changed: every minds' and clients' page of the old types keeps its
        tokens only (re-prefilled on page_in), and the anonymous cache is emptied."""
        store = self.store
        assert store is not None
        n_cached = self.anon.drop_all()
        n_pages = 0
        for info in store.infos():
            if not info.in_store or info.key.kind not in (PageKind.MIND, PageKind.PAGE):
                continue
            try:
                page = store.hold(info.key)
            except KvswapError:
                continue  # spilled and dropped meanwhile
            try:
                if page.generation in exclude or page.layout.token_only:
                    continue
                with page.view() as view:
                    tokens = read_tokens(view, page.layout)
            finally:
                store.release(page)
            try:
                self._store_tokens(info.key, tokens, page)
                n_pages += 1
            except KvswapError as err:
                log.warning("reconfigure: %s keeps its old KV types: %s", info.key, err.message)
        log.info(
            "reconfigure: %d page(s) now hold tokens only; %d anonymous cache entries dropped",
            n_pages,
            n_cached,
        )

    def _page_in_all(
        self,
        occupants: list[Occupant],
        plan: SeatPlan,
        pages: dict[int, Page],
        runs: Mapping[int, RunningRequest],
        kv_change: bool,
        tenants: Mapping[int, str],
    ) -> list[SlotFate]:
        """Every state back into its seat, with the tenant whose prompt it holds (`tenants`,
        by old slot id); an idle anonymous state without a seat joins the anonymous cache."""
        store, mover = self.store, self.runtime.verbs.mover
        fates = []
        for occ in occupants:
            page = pages[occ.slot_id]
            cached = page.key.kind is PageKind.ANON  # an idle anonymous slot's state
            kind = "request" if occ.running else ("cache" if cached else "mind")
            seat = plan.seats.get(occ.slot_id)
            if seat is None or (kv_change and not occ.running):
                reason = plan.unseated.get(
                    occ.slot_id,
                    "the KV types changed: it holds tokens only and re-prefills on page_in",
                )
                if cached:
                    tenant = tenants[occ.slot_id]
                    fates.append(self._cache_unseated(occ, page, kv_change, reason, tenant))
                    continue
                fate = "token_only" if kv_change else "paged"
                fates.append(SlotFate(occ.slot_id, kind, None, page.key, fate, reason))
                continue
            slot = self.slots[seat]
            with page.view() as view:
                state = state_of_page(view, page.layout)
                try:
                    mover.apply(slot, state)
                finally:
                    state.release()
            assert store is not None
            store.remove(page.key, page.generation)
            slot.namespace = tenants[occ.slot_id]
            run = runs.get(occ.slot_id)
            if run is not None:
                slot.running = run
            slot.t_last_used = time.monotonic()
            fates.append(
                SlotFate(occ.slot_id, kind, seat, None, "kept" if seat == occ.slot_id else "moved")
            )
        return fates

    def _cache_unseated(
        self, occ: Occupant, page: Page, kv_change: bool, reason: str, tenant: str
    ) -> SlotFate:
        """An idle anonymous state of `tenant` left without a seat joins the anonymous cache
        (of the old KV types it is dropped: re-prefilling it costs what a cache miss costs)."""
        store = self.store
        assert store is not None
        if not kv_change:
            with page.view() as view:
                tokens = read_tokens(view, page.layout)
            if self.anon.adopt(page.key, tokens, tenant):
                return SlotFate(occ.slot_id, "cache", None, None, "cached", reason)
            reason = f"{reason}; the anonymous cache has no room for it"
        else:
            store.remove(page.key, page.generation)
            reason = "the KV types changed: a cached prompt of the old types is dropped"
        return SlotFate(occ.slot_id, "cache", None, None, "dropped", reason)
