"""What the engine's managers call of the runtime, as Protocols.

The seating (`minds.seating`), the anonymous cache (`minds.anoncache`) and the reconfigure
(`reconfigure`) move slot states through the runtime's slot verbs, and read a few facts of the
live geometry; they take these narrow views rather than `runtime.Runtime`, which builds a
libllama context. So none of them imports libllama, and a CPU test drives each with a stand-in
that moves tokens only (tests/unit/test_seating.py, test_reconfigurer.py, test_anoncache.py),
while the engine hands them its real `Runtime`, which mypy checks against these.

Types only: nothing here runs.
"""

from __future__ import annotations

import mmap
from typing import Protocol

from kvswap.core.keys import PageKey
from kvswap.core.page import PageLayout, SlotState
from kvswap.engine.commands import PageMoved
from kvswap.engine.kv.pagestore import Reservation
from kvswap.engine.plan.geometry import Geometry
from kvswap.engine.slot import Slot


class Mover(Protocol):
    """Sizes and loads a slot's whole state (`kv.slotstate.StateMover`)."""

    def measure(self, slot: Slot) -> PageLayout: ...

    def apply(self, slot: Slot, state: SlotState) -> None: ...

    def capture(self, slot: Slot, buffer: memoryview, layout: PageLayout) -> None: ...


class SlotMoves(Protocol):
    """The slot verbs the managers move states with (`kv.verbs.SlotVerbs`)."""

    @property
    def mover(self) -> Mover: ...

    def clear(self, slot: Slot) -> None: ...

    def page_in(self, slot: Slot, key: PageKey) -> PageMoved: ...

    def copy_in(self, slot: Slot, key: PageKey) -> PageMoved: ...

    def share_prefix(self, src: Slot, dst: Slot, n_tokens: int) -> int: ...

    def capture_to_page(
        self,
        slot: Slot,
        *,
        layout: PageLayout,
        reservation: Reservation,
        buffer: mmap.mmap,
        keep_slot: bool = False,
    ) -> PageMoved: ...


class Cuts(Protocol):
    """Cutting a slot's memory back (`kv.memory.SlotMemory`)."""

    def cut(self, slot: Slot, n: int) -> int: ...


class SeatRuntime(Protocol):
    """What seating a mind reads of the runtime."""

    @property
    def verbs(self) -> SlotMoves: ...

    @property
    def n_shared_cells(self) -> int | None: ...


class CacheRuntime(Protocol):
    """What the anonymous cache reads of the runtime."""

    @property
    def verbs(self) -> SlotMoves: ...

    @property
    def geometry(self) -> Geometry: ...

    @property
    def memory(self) -> Cuts: ...


class RebuildRuntime(Protocol):
    """What a reconfigure reads of the runtime, and the rebuild it asks of it."""

    @property
    def verbs(self) -> SlotMoves: ...

    @property
    def geometry(self) -> Geometry: ...

    @property
    def n_ctx_slot(self) -> int: ...

    @property
    def n_ctx_trained(self) -> int: ...  # the training context a slot is capped at

    def install(self, geo: Geometry) -> None:
        """Build the contexts of `geo`; raises `core.errors.ContextInitError` when libllama
        cannot, and nothing is installed then."""

    def close(self) -> None: ...
