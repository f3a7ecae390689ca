"""Immutable views of the engine's state for /slots, /props, /metrics and /health.

The engine publishes a new `EngineSnapshot` at a step boundary (a reference swap, built by
`take_snapshot` on the engine thread) when something changed besides a running request's
progress, or when the last view was read (`Engine.snapshot`), so readers on other threads never
touch live engine objects and always get an answer, even mid-reconfigure, and a decode nobody
watches spends nothing on views.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvswap.config.advice import Trained
from kvswap.core.keys import PageKey, PageKind
from kvswap.core.page import PageGeometry
from kvswap.core.types import GenerationRequest
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.metrics import EngineMetrics, MetricsSnapshot
from kvswap.engine.plan.geometry import Geometry
from kvswap.engine.reconfigure import Reconfigurer
from kvswap.engine.running import RunningRequest
from kvswap.engine.runtime import Runtime
from kvswap.engine.seats.anoncache import AnonCache
from kvswap.engine.seats.registry import MindRegistry
from kvswap.engine.slot import SlotTable


@dataclass(frozen=True)
class SlotSnapshot:
    """One slot as /slots shows it."""

    id: int
    n_ctx: int
    is_processing: bool
    n_cached: int  # tokens held in the slot's KV
    id_task: int  # last or current request, -1 when none
    request: GenerationRequest | None  # last or current request
    n_prompt_tokens: int
    n_prompt_tokens_processed: int
    n_prompt_tokens_cache: int
    n_decoded: int
    has_next_token: bool
    generated_text: str
    speculative: bool = False
    mind: PageKey | None = None  # the mind the slot holds (None: none)


@dataclass(frozen=True)
class EngineSnapshot:
    """Everything read-only routes need, consistent as of one step boundary."""

    slots: tuple[SlotSnapshot, ...]
    geometry: Geometry
    n_ctx: int  # the pool libllama built (it pads per-stream sizes)
    n_ctx_slot: int
    page_geometry: PageGeometry  # what pages and slot files made here record
    metrics: MetricsSnapshot
    n_waiting: int
    is_sleeping: bool = False
    crashed: str | None = None  # the engine loop died: /health answers 500
    # Resident minds: (mind key, slot id, tokens held), for /pages.
    minds: tuple[tuple[PageKey, int, int], ...] = ()
    trained: Trained | None = None  # the model's training context (a refusal's advice)

    @property
    def n_idle_slots(self) -> int:
        return sum(1 for s in self.slots if not s.is_processing)


def own_metrics(
    runtime: Runtime,
    store: PageStore | None,
    registry: MindRegistry,
    anon: AnonCache,
    reconfigurer: Reconfigurer,
) -> dict[str, float]:
    """kvswap's own counters and gauges (pages, checkpoints, reconfigures, minds, the cache)."""
    counters, budget = runtime.counters, runtime.memory.budget.counters
    out: dict[str, float] = {
        "page_out_total": counters.page_out_total,
        "page_in_total": counters.page_in_total,
        "page_failed_total": counters.page_failed_total,
        "ctx_checkpoint_bytes": runtime.memory.total_bytes,
        "ctx_checkpoints_evicted_budget_total": budget.evicted_budget_total,
        "ctx_checkpoints_skipped_budget_total": budget.skipped_budget_total,
        "reconfigure_total": reconfigurer.total,
        "reconfigure_failed_total": reconfigurer.failed_total,
    }
    if store is not None:
        out["page_store_bytes"] = store.charged_bytes
        out["page_store_pages"] = store.n_pages
        out["page_spill_held_bytes"] = store.held_bytes
        out["page_store_leaked_bytes"] = store.leaked_bytes
        out["page_store_spare_bytes"] = sum(
            n for key, n in store.reservations() if key.kind is PageKind.SPARE
        )
    out.update(registry.metrics())
    out.update(anon.metrics())
    return out


def take_snapshot(
    *,
    slots: SlotTable,
    last_run: Mapping[int, RunningRequest],
    runtime: Runtime,
    metrics: EngineMetrics,
    n_waiting: int,
    crashed: str | None,
    extra: dict[str, float],
) -> EngineSnapshot:
    """The engine's state now (engine thread only: it reads live slots)."""
    views = []
    for slot in slots:
        run = slot.running or last_run.get(slot.id)
        views.append(
            SlotSnapshot(
                id=slot.id,
                n_ctx=runtime.n_ctx_slot,
                is_processing=slot.running is not None,
                n_cached=len(slot.tokens),
                id_task=run.req_id if run else -1,
                request=run.request if run else None,
                n_prompt_tokens=len(run.prompt) if run else 0,
                n_prompt_tokens_processed=(run.n_done - run.n_cache) if run else 0,
                n_prompt_tokens_cache=run.n_cache if run else 0,
                n_decoded=len(run.generated) if run else 0,
                has_next_token=slot.running is not None,
                generated_text=run.text.content if run else "",
                speculative=runtime.spec is not None,
                mind=slot.mind,
            )
        )
    return EngineSnapshot(
        slots=tuple(views),
        geometry=runtime.geometry,
        n_ctx=runtime.ctx.n_ctx,
        n_ctx_slot=runtime.n_ctx_slot,
        page_geometry=runtime.page_geometry,
        metrics=metrics.snapshot(len(slots.busy()), n_waiting, spec=runtime.spec, **extra),
        n_waiting=n_waiting,
        crashed=crashed,
        minds=tuple((s.mind, s.id, len(s.tokens)) for s in slots if s.mind is not None),
        trained=runtime.trained,
    )
