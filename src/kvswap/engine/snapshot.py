"""Immutable views of the engine's state for /slots, /props, /metrics and /health.

The engine publishes a new `EngineSnapshot` after each step (a reference swap), so readers on
other threads never touch live engine objects and always get an answer, even mid-reconfigure.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvswap.engine.geometry import Geometry
from kvswap.engine.metrics import MetricsSnapshot
from kvswap.engine.types import GenerationRequest


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


@dataclass(frozen=True)
class EngineSnapshot:
    """Everything read-only routes need, consistent as of one step boundary."""

    slots: tuple[SlotSnapshot, ...]
    geometry: Geometry
    n_ctx: int  # the pool libllama built (it pads per-stream sizes)
    n_ctx_slot: int
    metrics: MetricsSnapshot
    n_waiting: int
    is_sleeping: bool = False
    crashed: str | None = None  # the engine loop died: /health answers 500
    # Resident minds: (mind key, slot id, tokens held), for /pages.
    minds: tuple[tuple[str, int, int], ...] = ()

    @property
    def n_idle_slots(self) -> int:
        return sum(1 for s in self.slots if not s.is_processing)
