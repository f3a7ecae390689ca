"""What the other threads may touch of the engine's state directly: `PagesHandle`.

The engine builds these owners and hands them to its managers; the client exposes them to the
HTTP side and the tiers (`EngineClient.pages`). Each is a thread-safe owner with a lock of its
own; everything else of the engine is reached through commands. Imports no libllama, so the
tiers' policy objects that hold one (the demoter, the shared tier) build in a CPU test.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.seats.flushes import FlushSchedule
from kvswap.engine.seats.handoffs import Handoffs
from kvswap.engine.seats.registry import MindRegistry


@dataclass(frozen=True)
class PagesHandle:
    """The page store (None: off), the mind registry, the flush schedule and the hand-offs to
    disk (the last two for the demoter)."""

    store: PageStore | None
    registry: MindRegistry
    flushes: FlushSchedule
    handoffs: Handoffs
