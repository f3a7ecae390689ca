"""A mind that cannot be a page leaves its slot for its file, with no copy of it in memory.

A mind larger than the whole page store, or one the store cannot make room for now (every other
page held: the incoming mind's own, when minds are over half the budget), goes to disk from its
slot while the job that needs the slot waits (`NoRoomYet`, retried by the engine):
1. the engine asks for a file of the mind's size (`Handoffs.want_file`);
2. the demoter opens the mind's next generation, its disk blocks allocated (a full disk refuses
   here) and mapped;
3. the engine captures the slot straight into that mapping (the page cache: memory the kernel
   writes back and may reclaim, not a buffer outside the page budget), or, when the mind grew
   past the file meanwhile, drops the file and asks again;
4. the demoter publishes the generation (crash-safe, as every spill) and says how it went;
5. written: the slot is cleared (a mind that changed since asks again); refused: a typed 503
   naming the flag; without a disk tier the state is dropped, logged once (its next request
   re-prefills).

Owns that walk on the engine thread. No file I/O: the engine only copies into the mapping.
"""

from __future__ import annotations

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.engine.ports import SeatRuntime
from kvswap.engine.seats.handoffs import Handed, Handoffs
from kvswap.engine.seats.outcomes import NoRoomYet
from kvswap.engine.seats.registry import MindRegistry
from kvswap.engine.slot import Slot
from kvswap.files.publish import InPlace
from kvswap.files.seqfile import PAGE_IN_FILE


class ToDisk:
    """See the module docstring."""

    def __init__(self, handoffs: Handoffs, registry: MindRegistry, runtime: SeatRuntime) -> None:
        self.handoffs = handoffs
        self.registry = registry
        self.runtime = runtime

    def leave(self, slot: Slot, mind: PageKey, n_bytes: int, ceiling: int) -> None:
        """Return once the slot's mind is in its file (or dropped, without a disk tier) and the
        slot cleared; raise `NoRoomYet` while that is under way, `KvswapError` when the disk
        refused it (the slot keeps the mind)."""
        handoffs = self.handoffs
        if not handoffs.has_disk_tier:
            why = "dropped (no --slot-save-path): its next request re-prefills"
            handoffs.log_too_large(mind, n_bytes, ceiling, why)
        else:
            while not self._written(slot, mind, n_bytes, ceiling):
                pass  # it changed since its file was asked for: ask again
        self.runtime.verbs.clear(slot)

    def _written(self, slot: Slot, mind: PageKey, n_bytes: int, ceiling: int) -> bool:
        handoffs = self.handoffs
        if not handoffs.handing(mind):
            handoffs.want_file(mind, self.runtime.verbs.mover.measure(slot))
            raise NoRoomYet()  # the slot keeps the mind until its file holds it
        staged = handoffs.file_to_fill(mind)
        if staged is not None:
            self._fill(slot, mind, staged)
            handoffs.log_too_large(mind, n_bytes, ceiling, "written to disk")
            raise NoRoomYet()
        handed = handoffs.state(mind)
        if handed is None:
            raise NoRoomYet()  # being opened or written
        handoffs.end(mind)
        if handed is Handed.REFUSED:
            raise KvswapError(
                ErrorKind.UNAVAILABLE,
                f"a mind of {n_bytes} bytes, which the page store (--page-ram-bytes "
                f"{ceiling}) could not hold, could not be written to disk to free its slot "
                "(see the server log); raise --page-ram-bytes",
            )
        copy = self.registry.disk_copy(mind)
        return handed is Handed.DROPPED or (copy is not None and copy.n_tokens == len(slot.tokens))

    def _fill(self, slot: Slot, mind: PageKey, staged: InPlace) -> None:
        """Capture the slot into the file opened for its mind (one copy, into the file's
        mapping); a mind grown past the file meanwhile drops it, to ask for a larger one."""
        mover = self.runtime.verbs.mover
        layout = mover.measure(slot)
        if PAGE_IN_FILE + layout.n_bytes > len(staged.buffer):
            self.handoffs.end(mind)  # the file is dropped; the next retry asks again
            return
        with memoryview(staged.buffer) as view, view[PAGE_IN_FILE:] as page:
            mover.capture(slot, page, layout)
        self.handoffs.filled(mind, staged, layout)
