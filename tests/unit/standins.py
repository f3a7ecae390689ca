"""The engine's side of minds on the CPU, for the policy objects' unit tests.

Real owners (the page store, the slot table, the mind registry, the flush schedule, the
hand-offs, the anonymous cache and the seating), built on stand-ins for the two things that
need libllama or a thread: slot verbs that move a slot's tokens only (a "state" of
`STATE_BYTES` per token, so sizes are exact), and a buffer worker that maps at once on the
test's thread. `EngineSide.post` answers the demoter's commands as the engine thread would,
with the same owners, so a demoter test drives the real demoter against them. As vLLM builds a
real scheduler on a hand-made KV config, nothing here is a fake of the code under test.
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import ContextInitError
from kvswap.core.keys import PageKey, namespace_of
from kvswap.core.page import (
    PageGeometry,
    PageLayout,
    SlotState,
    plan_layout,
    read_tokens,
    write_tokens,
)
from kvswap.core.types import Event, GenerationRequest
from kvswap.core.vocab import MindMove
from kvswap.engine.commands import (
    Captured,
    FlushMinds,
    ForgetMind,
    MindVerb,
    PageMoved,
    RoomReport,
    ShedCache,
    Submit,
)
from kvswap.engine.handle import PagesHandle
from kvswap.engine.kv.buffers import BufferReady, new_buffer
from kvswap.engine.kv.pagestore import Page, PageStore, Reservation, close_now
from kvswap.engine.plan.geometry import Geometry
from kvswap.engine.seats.anoncache import AnonCache
from kvswap.engine.seats.flushes import FlushSchedule
from kvswap.engine.seats.handoffs import Handoffs
from kvswap.engine.seats.registry import MindRegistry
from kvswap.engine.seats.seating import Seating
from kvswap.engine.slot import Slot, SlotTable
from kvswap.files.seqfile import STATE_MAGIC

Buffer = mmap.mmap | bytearray

GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=4096)
STATE_HEAD = 12  # libllama's RAM prefix (magic, source seq id) and the payload's first word
STATE_BYTES = 8  # a stand-in state's bytes per token
NS = namespace_of("tenant")


def layout_of(n_tokens: int) -> PageLayout:
    """The layout of a stand-in state of `n_tokens` (4 + STATE_BYTES bytes a token, and the
    state's head)."""
    return plan_layout(n_tokens, STATE_HEAD + STATE_BYTES * n_tokens, GEOMETRY)


def fill(buffer: Buffer, layout: PageLayout, toks: list[int] | npt.NDArray[np.int32]) -> None:
    """Lay a stand-in state out in `buffer`: the tokens, and a target state that starts as
    libllama's does (what the slot files check before writing it)."""
    with memoryview(buffer) as view:
        write_tokens(view, layout, np.asarray(toks, dtype=np.int32))
        struct.pack_into("<III", view, layout.target.offset, STATE_MAGIC, 0, len(toks))


def page_bytes(n_tokens: int) -> int:
    return layout_of(n_tokens).n_bytes


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


class TokenMover:
    """Sizes and loads a slot's tokens (the runtime's `StateMover`)."""

    def measure(self, slot: Slot) -> PageLayout:
        return layout_of(len(slot.tokens))

    def apply(self, slot: Slot, state: SlotState) -> None:
        slot.tokens.replace(np.array(state.tokens, dtype=np.int32))

    def capture(self, slot: Slot, buffer: memoryview, layout: PageLayout) -> None:
        fill(buffer, layout, slot.tokens.view())


class TokenVerbs:
    """The runtime's slot verbs, on tokens: pages and copies hold the slot's tokens exactly."""

    def __init__(self, store: PageStore | None) -> None:
        self.store = store
        self.mover = TokenMover()

    def clear(self, slot: Slot) -> None:
        slot.tokens.truncate(0)
        slot.lora = ()

    def page_in(self, slot: Slot, key: PageKey) -> PageMoved:
        return self._load(slot, key, keep=False)

    def copy_in(self, slot: Slot, key: PageKey) -> PageMoved:
        return self._load(slot, key, keep=True)

    def _load(self, slot: Slot, key: PageKey, *, keep: bool) -> PageMoved:
        assert self.store is not None
        page = self.store.hold(key)
        try:
            with page.view() as view:
                slot.tokens.replace(read_tokens(view, page.layout))
            if not keep:
                self.store.remove(key, page.generation)
        finally:
            self.store.release(page)
        n = page.layout.n_tokens
        return PageMoved(slot.id, key, n, page.layout.target.n_bytes, 0, 0, 0.0)

    def capture_to_page(
        self,
        slot: Slot,
        *,
        layout: PageLayout,
        reservation: Reservation,
        buffer: mmap.mmap,
        keep_slot: bool = False,
    ) -> PageMoved:
        assert self.store is not None and len(buffer) >= layout.n_bytes
        fill(buffer, layout, slot.tokens.view())
        self.store.commit(reservation, buffer, layout)
        if not keep_slot:
            self.clear(slot)
        return PageMoved(slot.id, reservation.key, layout.n_tokens, 0, 0, 0, 0.0)

    def share_prefix(self, src: Slot, dst: Slot, n_tokens: int) -> int:
        dst.tokens.replace(src.tokens.view()[:n_tokens])
        dst.lora = src.lora
        return n_tokens

    def copy_out(self, slot: Slot) -> Captured:
        layout = layout_of(len(slot.tokens))
        buffer = new_buffer(layout.n_bytes)
        fill(buffer, layout, slot.tokens.view())
        return Captured(slot.id, buffer, layout, slot.mind)


class Cuts:
    def cut(self, slot: Slot, n: int) -> int:
        slot.tokens.truncate(min(n, len(slot.tokens)))
        return len(slot.tokens)


class Runtime:
    """The runtime views the managers take (`engine.ports`): its verbs, its live geometry, and a
    rebuild that libllama refuses for the geometries in `refuse` (ContextInitError)."""

    def __init__(self, store: PageStore | None, geometry: Geometry, n_ctx_train: int) -> None:
        self.verbs = TokenVerbs(store)
        self.memory = Cuts()
        self.geometry = geometry
        self.n_ctx_trained = n_ctx_train
        self.n_ctx_slot = geometry.n_ctx_slot(n_ctx_train)
        self.refuse: set[Geometry] = set()
        self.installed: list[Geometry] = []
        self.n_closed = 0

    @property
    def n_shared_cells(self) -> int | None:
        return self.geometry.n_ctx if self.geometry.kv_unified else None

    def install(self, geo: Geometry) -> None:
        if geo in self.refuse:
            raise ContextInitError(f"libllama cannot build {geo}")
        self.geometry = geo
        self.n_ctx_slot = geo.n_ctx_slot(self.n_ctx_trained)
        self.installed.append(geo)

    def close(self) -> None:
        self.n_closed += 1


class Worker:
    """The buffer worker, mapping at once on the caller's thread; `hold` keeps its answers back
    until `deliver`, as a busy worker would."""

    def __init__(self) -> None:
        self.held: list[BufferReady] = []
        self.hold = False
        self.n_mapped = 0

    def allocate(self, n_bytes: int, then: Callable[[BufferReady], None]) -> None:
        self.n_mapped += 1
        ready = BufferReady(new_buffer(n_bytes), then)
        if self.hold:
            self.held.append(ready)
        else:
            then(ready)

    def deliver(self) -> None:
        held, self.held = self.held, []
        for ready in held:
            ready.then(ready)

    def dispose(self, buffer: mmap.mmap, done: Callable[[bool], None]) -> None:
        close_now(buffer, done)


def geometry(n_ctx: int = 4096, n_parallel: int = 2, kv_unified: bool = True) -> Geometry:
    return Geometry(
        n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=kv_unified, n_batch=512, n_ubatch=128,
        cache_type_k="f16", cache_type_v="f16", kv_unified_per_slot=0,
    )  # fmt: skip


@dataclass
class EngineSide:
    """The engine's owners of minds, as the engine builds them, on the stand-ins above."""

    store: PageStore
    slots: SlotTable
    runtime: Runtime
    worker: Worker
    registry: MindRegistry = field(default_factory=MindRegistry)
    flushes: FlushSchedule = field(default_factory=FlushSchedule)
    handoffs: Handoffs = field(default_factory=Handoffs)
    reports: list[RoomReport] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.anon = AnonCache(
            store=self.store,
            runtime=self.runtime,
            slots=self.slots,
            budget_bytes=0,  # off: a test of the cache turns it on (`with_cache`)
            buffers=self.worker,  # type: ignore[arg-type]
            cache_idle_slots=False,
        )
        self.seating = self._seating()

    def _seating(self) -> Seating:
        return Seating(
            store=self.store,
            slots=self.slots,
            runtime=self.runtime,
            buffers=self.worker,  # type: ignore[arg-type]
            registry=self.registry,
            flushes=self.flushes,
            handoffs=self.handoffs,
            anon=self.anon,
        )

    def with_cache(self, budget_bytes: int) -> None:
        """Turn the anonymous cache on (before anything was seated)."""
        self.anon.budget_bytes = budget_bytes

    @property
    def pages(self) -> PagesHandle:
        return PagesHandle(self.store, self.registry, self.flushes, self.handoffs)

    def post(self, cmd: object) -> None:
        """What the engine thread does with a command the demoter or the shared tier posts."""
        if isinstance(cmd, ShedCache):
            cmd.reply(self.anon.shed(cmd.n_bytes))
        elif isinstance(cmd, FlushMinds):
            slots = self.slots.idle_minds(cmd.keys)
            cmd.reply([(s.mind, self.runtime.verbs.copy_out(s)) for s in slots])
        elif isinstance(cmd, ForgetMind):
            cmd.reply(self.seating.forget(cmd.key))
        elif isinstance(cmd, RoomReport):
            self.reports.append(cmd)
            self.seating.on_room_report(cmd)
        else:
            raise AssertionError(f"the engine side has no answer for {cmd!r}")

    def seated(self, slot_id: int, mind: PageKey, n_tokens: int, start: int = 0) -> Slot:
        """Slot `slot_id` holds `mind` with `n_tokens` tokens, as after its turn."""
        slot = self.slots[slot_id]
        slot.tokens.replace(np.array(tokens(n_tokens, start), dtype=np.int32))
        slot.mind = mind
        slot.t_last_used = time.monotonic()
        self.registry.seated(mind, slot_id)
        self.registry.touch(mind)
        self.flushes.changed(mind)
        return slot

    def check(self) -> None:
        """Every owner's invariants, as the engine checks them when idle."""
        self.seating.check_integrity()
        self.anon.check_integrity()
        self.store.check_integrity()


def engine_side(
    *,
    ceiling_bytes: int = 1 << 20,
    n_slots: int = 2,
    n_ctx: int = 4096,
    kv_unified: bool = True,
    clock: Callable[[], float] = time.time,
) -> EngineSide:
    """The engine side of `n_slots` slots on a pool of `n_ctx` cells; `clock`: the flush
    schedule's and the retention floors' (a test's own makes their windows exact)."""
    store = PageStore(ceiling_bytes)
    geo = geometry(n_ctx, n_slots, kv_unified)
    runtime = Runtime(store, geo, n_ctx_train=8192)
    slots = SlotTable(n_slots, runtime.n_ctx_slot)
    registry, flushes = MindRegistry(clock), FlushSchedule(clock)
    return EngineSide(store, slots, runtime, Worker(), registry=registry, flushes=flushes)


def put_page(store: PageStore, key: PageKey, n_tokens: int, start: int = 0) -> Page:
    """A page of `key` holding `n_tokens` tokens, committed as a move would."""
    layout = layout_of(n_tokens)
    reservation = store.reserve(key, layout.n_bytes)
    buffer = new_buffer(layout.n_bytes)
    fill(buffer, layout, tokens(n_tokens, start))
    return store.commit(reservation, buffer, layout)


def page_tokens(store: PageStore, key: PageKey) -> list[int]:
    page = store.hold(key)
    try:
        with page.view() as view:
            return [int(t) for t in read_tokens(view, page.layout)]
    finally:
        store.release(page)


def submit(
    mind: PageKey | None, prompt: list[int], restore: SlotState | None = None
) -> tuple[Submit, list[Event]]:
    """A request naming `mind` (None: anonymous), and the events it is sent."""
    events: list[Event] = []
    request = GenerationRequest(prompt_tokens=tuple(prompt), mind=mind)
    return Submit(1, request, events.append, restore), events


def mind_verb(key: PageKey, action: MindMove) -> tuple[MindVerb, list[object]]:
    replies: list[object] = []
    return MindVerb(1, key, action, replies.append), replies


def state_of(n_tokens: int, start: int = 0) -> SlotState:
    """A state read back from disk (or the shared tier): the tokens, and a stand-in state."""
    return SlotState(
        tokens=np.array(tokens(n_tokens, start), dtype=np.int32),
        target=memoryview(bytearray(STATE_HEAD + STATE_BYTES * n_tokens)),
    )
