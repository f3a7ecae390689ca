"""The KV cells of a unified pool, planned before a decode needs them.

In a unified pool (`-kvu`, or `-np` auto) every slot draws on one set of cells, and libllama
fails a decode whose tokens find no free cells (`decode: failed to find a memory slot`). Most
of that is foreseeable, so the engine plans for it:

- a request starts only when the cells it will hold at its end (its prompt, and its
  `n_predict` when bounded: `plan.planner.cells_at_end`) fit beside what the running requests
  will hold at theirs; else it waits in order until one ends (it is never refused for it). With
  nothing running it always starts: its prompt fits its window, which fits the pool;
- before each step whose tokens need more cells than are free, idle residents move out first
  (least recently used first: a mind to its RAM page, an anonymous prompt into the anonymous
  cache, `Seating.page_out_idle_resident`), and whatever still does not fit waits: the step's
  prompt chunks shrink to the free cells (`Stepper.replan`). When nothing fits until a buffer
  for a move arrives, the step waits for it.

What cannot be foreseen, a request whose `n_predict` is unbounded growing into cells others
hold, still meets the full-pool path (`Engine._apply`): the decode fails, an idle resident
moves out or the most recently admitted request gives way.

Without a unified pool each slot has cells of its own, bounded by admission (a prompt shorter
than the window) and the stop at the window; nothing here applies. Engine thread only; no
libllama (the runtime, the move and the replan are handed in).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kvswap.core.types import GenerationRequest
from kvswap.engine.plan.planner import StepPlan, cells_at_end
from kvswap.engine.seats.outcomes import PagedOut
from kvswap.engine.slot import Slot


class PoolRuntime(Protocol):
    """What the room reads of the runtime (`runtime.Runtime`)."""

    @property
    def n_shared_cells(self) -> int | None: ...

    @property
    def n_ctx_slot(self) -> int: ...


class Room:
    """See the module docstring."""

    def __init__(
        self,
        runtime: PoolRuntime,
        slots: Sequence[Slot],
        move_out: Callable[[], PagedOut],
        replan: Callable[[int], StepPlan],
    ) -> None:
        self.runtime = runtime
        self.slots = slots
        self.move_out = move_out  # one idle resident out of the pool
        self.replan = replan  # the step just planned, held to a number of free cells

    def n_free(self) -> int | None:
        """Free cells of the unified pool (every slot's tokens hold one each), or None when
        each slot has cells of its own."""
        n_cells = self.runtime.n_shared_cells
        if n_cells is None:
            return None
        return n_cells - sum(len(s.tokens) for s in self.slots)

    def may_start(self, request: GenerationRequest) -> bool:
        """Whether `request` can start now without its cells colliding with the running
        requests' at their ends."""
        n_cells = self.runtime.n_shared_cells
        n_window = self.runtime.n_ctx_slot
        ends = [
            cells_at_end(
                len(s.running.prompt), s.running.request.n_predict, n_window, len(s.tokens)
            )
            for s in self.slots
            if s.running is not None
        ]
        if n_cells is None or not ends:
            return True
        need = cells_at_end(len(request.prompt_tokens), request.n_predict, n_window)
        return sum(ends) + need <= n_cells

    def fit(self, plan: StepPlan) -> StepPlan | None:
        """`plan`, once the cells it needs are free; else the part of it that fits; None when
        nothing fits until a buffer for a move arrives (the step waits for it). When nothing
        fits and nothing can move, `plan` itself: its decode fails and the full-pool path
        answers."""
        n_free = self.n_free()
        if n_free is None or plan.n_tokens <= n_free:
            return plan
        moved = PagedOut.MOVED
        while n_free < plan.n_tokens and moved is PagedOut.MOVED:
            moved = self.move_out()
            n_free = self.n_free() or 0  # (still a unified pool: an int)
        if plan.n_tokens <= n_free:
            return plan
        fitted = self.replan(max(0, n_free))
        if fitted.n_tokens <= n_free and fitted.spans:
            return fitted
        return None if moved is PagedOut.WAITING else plan
