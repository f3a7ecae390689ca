"""POST /reconfigure on the engine thread: a relaunch is a pause, not a reload (SPEC §7).

A reconfigure closes admission (arriving work queues), lets running requests reach a geometry
where each has a seat (a request on a slot past the new `n_parallel` moves to a free lower
slot, or the engine drains until one is free, up to a timeout), then, in one pause: every
occupied slot's state becomes a page (pre-checked against the page ceiling), the context is
freed and rebuilt on the same loaded model, slots are rebuilt, states go back (a stream header
is rewritten when the stream count changed), and admission reopens. Running requests keep their
sampler and RNG and go on as if nothing happened. A geometry libllama cannot build rolls back
to the old one with every state restored.

Owns the plan (pure: `plan_seats`, `target_geometry`) and the procedure (`Reconfigurer`), which
works on the narrow owners it is given (the runtime, the slot table, the page store, the mind
registry) and never on the engine. The engine calls `submit`, `admission_open` and `tick`; a tick
that ran a reconfigure hands back the command and its answer (`Finished`), and the engine then
revalidates its waiting jobs, refreshes its snapshot and replies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import psutil

from kvswap.backend.context import KV_CACHE_TYPES, ContextInitError
from kvswap.backend.model import ModelInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.commands import Reconfigure, ReconfigureReceipt, ReconfigureSpec, SlotFate
from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagefmt import plan_layout, read_tokens, write_tokens
from kvswap.engine.kv.pagestore import Page, PageStore
from kvswap.engine.kv.slotstate import state_of_page
from kvswap.engine.minds.registry import MindRegistry
from kvswap.engine.plan.geometry import Geometry
from kvswap.engine.running import RunningRequest
from kvswap.engine.runtime import Runtime
from kvswap.engine.slot import SlotTable

log = logging.getLogger("kvswap.reconfigure")


def target_geometry(current: Geometry, spec: ReconfigureSpec) -> Geometry:
    """The new geometry: the spec's fields over the current ones; typed 400 on nonsense."""
    geo = replace(
        current,
        n_ctx=spec.n_ctx if spec.n_ctx is not None else current.n_ctx,
        n_parallel=spec.n_parallel if spec.n_parallel is not None else current.n_parallel,
        cache_type_k=spec.cache_type_k or current.cache_type_k,
        cache_type_v=spec.cache_type_v or current.cache_type_v,
        n_batch=spec.n_batch if spec.n_batch is not None else current.n_batch,
        n_ubatch=spec.n_ubatch if spec.n_ubatch is not None else current.n_ubatch,
        generation=current.generation + 1,
    )
    problems = []
    if geo.n_parallel < 1:
        problems.append("n_parallel must be at least 1")
    if geo.n_ctx < 1:
        problems.append("n_ctx must be at least 1")
    if geo.n_batch < 1 or geo.n_ubatch < 1:
        problems.append("n_batch and n_ubatch must be at least 1")
    for name in (geo.cache_type_k, geo.cache_type_v):
        if name not in KV_CACHE_TYPES:
            problems.append(f"unknown KV cache type {name!r} (one of {', '.join(KV_CACHE_TYPES)})")
    if not problems and (reason := geo.unbuildable_reason()) is not None:
        problems.append(reason)
    if problems:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "; ".join(problems))
    return replace(geo, n_ubatch=min(geo.n_ubatch, geo.n_batch))


# Bytes per KV element of each cache type (quantized blocks of 32 values).
_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
               "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}  # fmt: skip


def kv_bytes_estimate(info: ModelInfo, geo: Geometry) -> int:
    """An upper bound of the KV pool's size (every layer counted as attention)."""
    if info.n_head <= 0 or info.n_head_kv <= 0:
        return 0
    head_dim = info.n_embd // info.n_head
    per_elem = _TYPE_BYTES[geo.cache_type_k] + _TYPE_BYTES[geo.cache_type_v]
    return int(geo.n_ctx * info.n_layer * info.n_head_kv * head_dim * per_elem)


def check_memory(info: ModelInfo, geo: Geometry, available_bytes: int) -> None:
    """Refuse a geometry whose KV pool could not fit in memory (libllama would be OOM-killed)."""
    need = kv_bytes_estimate(info, geo)
    if need > 0.9 * available_bytes:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"the new geometry needs about {need / 2**30:.1f} GiB of KV cache and "
            f"{available_bytes / 2**30:.1f} GiB of memory is available: nothing changed",
        )


@dataclass(frozen=True)
class Occupant:
    """An occupied slot, as the seat planner sees it."""

    slot_id: int
    running: bool
    n_tokens: int


@dataclass(frozen=True)
class SeatPlan:
    seats: dict[int, int]  # old slot -> new slot
    unseated: dict[int, str]  # old slot -> why it stays a page


def plan_seats(occupants: list[Occupant], n_parallel: int, n_ctx_slot: int) -> SeatPlan:
    """Seats in the new geometry: running requests first (their own slot, else the lowest
    free one), then idle minds (their own slot, else the lowest free one) if they fit."""
    seats: dict[int, int] = {}
    unseated: dict[int, str] = {}
    taken: set[int] = set()
    for group in ([o for o in occupants if o.running], [o for o in occupants if not o.running]):
        for occ in sorted(group, key=lambda o: o.slot_id):
            if not occ.running and occ.n_tokens >= n_ctx_slot:
                unseated[occ.slot_id] = (
                    f"larger than the new window ({occ.n_tokens} >= {n_ctx_slot} tokens)"
                )
                continue
            if occ.slot_id < n_parallel and occ.slot_id not in taken:
                seat = occ.slot_id
            else:
                free = [
                    s
                    for s in range(n_parallel)
                    if s not in taken and not any(o.slot_id == s and o.running for o in occupants)
                ]
                if not free:
                    unseated[occ.slot_id] = "no free slot in the new geometry"
                    continue
                seat = free[0]
            seats[occ.slot_id] = seat
            taken.add(seat)
    return SeatPlan(seats, unseated)


@dataclass
class _Pending:
    cmd: Reconfigure
    target: Geometry
    deadline: float
    t_start: float


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
        runtime: Runtime,
        slots: SlotTable,
        store: PageStore | None,
        model_info: ModelInfo,
        registry: MindRegistry,
        fault_on_install: bool = False,
    ) -> None:
        self.runtime = runtime
        self.slots = slots
        self.store = store
        self.info = model_info
        self.registry = registry
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
            self.failed_total += 1
            message = (
                f"requests did not drain within {p.cmd.spec.drain_timeout_s} s "
                f"({len(running)} running, {p.target.n_parallel} slots in the new geometry)"
            )
            log.warning("reconfigure refused: %s", message)
            return Finished(p.cmd, KvswapError(ErrorKind.UNAVAILABLE, message), changed=False)
        self._pending = None
        try:
            receipt = self._run(p, time.monotonic())
        except KvswapError as err:
            self.failed_total += 1
            log.warning("reconfigure refused: %s", err.message)
            return Finished(p.cmd, KvswapError(err.kind, err.message), changed=False)
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

    # -- the pause --------------------------------------------------------------------------

    def _run(self, p: _Pending, t_drained: float) -> ReconfigureReceipt:
        rt, slots = self.runtime, self.slots
        old = rt.geometry
        target = p.target
        new_slot_ctx = target.n_ctx_slot(self.info.n_ctx_train)
        occupants = [
            Occupant(
                s.id, s.running is not None, len(s.tokens) + (1 if s.running is not None else 0)
            )
            for s in slots
            if s.running is not None or len(s.tokens) > 0
        ]
        for occ in occupants:
            if occ.running and occ.n_tokens >= new_slot_ctx:
                raise KvswapError(
                    ErrorKind.INVALID_REQUEST,
                    f"the request on slot {occ.slot_id} holds {occ.n_tokens} tokens, more than the "
                    f"new window ({new_slot_ctx}): nothing is truncated, so nothing changed",
                )
        plan = plan_seats(occupants, target.n_parallel, new_slot_ctx)
        kv_change = self._kv_type_changes(target)
        receipt = ReconfigureReceipt(old=old, new=target, n_ctx_slot=new_slot_ctx)
        timings = receipt.timings_ms
        timings["drain_ms"] = (t_drained - p.t_start) * 1e3
        # Whole states even when the KV types change: a rollback must find every state intact.
        pages = self._page_out_all(occupants, old.generation)

        t1 = time.monotonic()
        timings["page_out_ms"] = (t1 - t_drained) * 1e3
        receipt.n_bytes_moved = sum(page.n_bytes for page in pages.values())
        runs = {s.id: s.running for s in slots.busy() if s.running is not None}
        minds = {s.id: s.mind for s in slots if s.mind is not None}
        rt.close()
        t2 = time.monotonic()
        timings["free_ms"] = (t2 - t1) * 1e3
        try:
            if self.fault_on_install:
                raise ContextInitError("injected fault (KVSWAP_FAULT_RECONFIGURE)")
            rt.install(target)
            seats = plan.seats
        except ContextInitError as err:
            log.error("reconfigure: %s; rolling back to %s", err, old)
            rt.install(old)  # the old geometry was built before: it builds again
            seats = {o.slot_id: o.slot_id for o in occupants}
            receipt.rolled_back, receipt.reason = True, str(err)
            receipt.new = old
            receipt.n_ctx_slot = rt.n_ctx_slot
            kv_change = False
            plan = SeatPlan(seats, {})
        t3 = time.monotonic()
        timings["init_ms"] = (t3 - t2) * 1e3
        if kv_change:
            self._drop_states(pages)
        slots.rebuild(rt.geometry.n_parallel, rt.n_ctx_slot)

        receipt.slots = self._page_in_all(occupants, plan, pages, runs, kv_change)
        for mind in minds.values():
            self.registry.unseated(mind)
        for fate in receipt.slots:  # a seated mind stays that mind's (engine.minds)
            if fate.new_slot is not None and fate.old_slot in minds:
                slots[fate.new_slot].mind = minds[fate.old_slot]
                self.registry.seated(minds[fate.old_slot], fate.new_slot)
        t4 = time.monotonic()
        timings["page_in_ms"] = (t4 - t3) * 1e3
        timings["total_ms"] = (t4 - p.t_start) * 1e3
        log.info("reconfigure: %s -> %s in %.1f ms", old, rt.geometry, timings["total_ms"])
        return receipt

    def _page_out_all(self, occupants: list[Occupant], generation: int) -> dict[int, Page]:
        """Every occupied slot becomes a page; pre-checked against the ceiling first."""
        store, verbs = self.store, self.runtime.verbs
        if not occupants:
            return {}
        if store is None:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                "occupied slots need the page store to move (--page-ram-bytes > 0)",
            )
        layouts = {o.slot_id: verbs.mover.measure(self.slots[o.slot_id]) for o in occupants}

        needed = sum(lay.n_bytes for lay in layouts.values())
        room = store.ceiling_bytes - store.charged_bytes
        if needed > room:
            raise KvswapError(
                ErrorKind.UNAVAILABLE,
                f"the page store cannot hold the slots' states for the move: {needed} bytes needed, "
                f"{room} free (--page-ram-bytes {store.ceiling_bytes}); nothing changed",
            )
        pages: dict[int, Page] = {}
        for occ in occupants:
            slot = self.slots[occ.slot_id]
            # A mind keeps its own page name: left without a seat, it stays findable in RAM.
            name = slot.mind or f"reconfigure-g{generation}-slot{slot.id}"
            verbs.capture_to_page(slot, name, layout=layouts[slot.id])
            pages[slot.id] = store.get(name)
        return pages

    def _drop_states(self, pages: dict[int, Page]) -> None:
        """The new contexts are built with other KV types: each page keeps its tokens (and LoRA
        set) only, and re-prefills on page_in. Runs after the install, so a rollback never meets
        a page without its state."""
        store = self.store
        assert store is not None
        for slot_id, page in pages.items():
            with page.view() as view:
                tokens = read_tokens(view, page.layout)
            layout = replace(
                plan_layout(len(tokens), 0, page.layout.geometry),
                token_only=True,
                lora=page.layout.lora,
            )
            store.remove(page.name, page.generation)
            reservation = store.reserve(page.name, layout.n_bytes)
            buffer = new_buffer(layout.n_bytes)
            with memoryview(buffer) as view:
                write_tokens(view, layout, tokens)
            pages[slot_id] = store.commit(reservation, buffer, layout)

    def _page_in_all(
        self,
        occupants: list[Occupant],
        plan: SeatPlan,
        pages: dict[int, Page],
        runs: Mapping[int, RunningRequest],
        kv_change: bool,
    ) -> list[SlotFate]:
        store, mover = self.store, self.runtime.verbs.mover
        fates = []
        for occ in occupants:
            page = pages[occ.slot_id]
            kind = "request" if occ.running else "mind"
            seat = plan.seats.get(occ.slot_id)
            if seat is None or (kv_change and not occ.running):
                reason = plan.unseated.get(
                    occ.slot_id,
                    "the KV types changed: it holds tokens only and re-prefills on page_in",
                )
                fate = "token_only" if kv_change else "paged"
                fates.append(SlotFate(occ.slot_id, kind, None, page.name, fate, reason))
                continue
            slot = self.slots[seat]
            with page.view() as view:
                state = state_of_page(view, page.layout)
                try:
                    mover.apply(slot, state)
                finally:
                    state.release()
            assert store is not None
            store.remove(page.name, page.generation)
            run = runs.get(occ.slot_id)
            if run is not None:
                slot.running = run
            slot.t_last_used = time.monotonic()
            fates.append(
                SlotFate(occ.slot_id, kind, seat, None, "kept" if seat == occ.slot_id else "moved")
            )
        return fates
