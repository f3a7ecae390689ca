"""Typed commands that HTTP handlers post to the engine thread's inbox.

Each command carries a `reply` (or a `sink` for streams) that the engine calls from its own
thread; `EngineClient` turns those calls into asyncio results. Commands hold plain data and
buffers, never libllama objects.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvswap.engine.pagefmt import PageLayout
from kvswap.engine.slotstate import SlotState
from kvswap.engine.types import Event, GenerationRequest

Reply = Callable[[Any], None]  # called once with a result or a KvswapError
Sink = Callable[[Event], None]  # called per event; the last is a Completion or an EngineError


@dataclass(frozen=True)
class Submit:
    """Run a generation request."""

    req_id: int
    request: GenerationRequest
    sink: Sink
    # A mind read back from disk: applied to the slot before the prompt (minds only).
    restore: SlotState | None = None


@dataclass(frozen=True)
class Cancel:
    """The client went away: drop the request if waiting, end it if running."""

    req_id: int


@dataclass(frozen=True)
class SlotCapture:
    """Copy a slot's tokens and state into RAM (for `save`); waits for the slot to be idle."""

    req_id: int
    slot_id: int
    reply: Reply


@dataclass(frozen=True)
class SlotApply:
    """Load a state read from a slot file into a slot (for `restore`)."""

    req_id: int
    slot_id: int
    state: SlotState
    reply: Reply


@dataclass(frozen=True)
class SlotErase:
    """Forget a slot's cached tokens and KV."""

    req_id: int
    slot_id: int
    reply: Reply


@dataclass(frozen=True)
class PageOut:
    """Move a slot's whole state into the page store under `name`; the slot is freed."""

    req_id: int
    slot_id: int
    name: str
    reply: Reply


@dataclass(frozen=True)
class PageIn:
    """Load page `name` into a slot; on success the page leaves the store."""

    req_id: int
    slot_id: int
    name: str
    reply: Reply


@dataclass(frozen=True)
class ReconfigureSpec:
    """The body of POST /reconfigure; None keeps the current value."""

    n_ctx: int | None = None
    n_parallel: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    force: bool = False  # allow a KV type change (residents and pages become token-only)
    drain_timeout_s: float = 30.0  # how long requests past the new n_parallel may drain


@dataclass(frozen=True)
class Reconfigure:
    """The engine command."""

    req_id: int
    spec: ReconfigureSpec
    reply: Reply


@dataclass(frozen=True)
class FlushMinds:
    """Copy every resident mind's state out (for a spill before exit); the slots keep theirs.

    Replies with a list of (mind key, Captured) whose buffers the caller closes."""

    reply: Reply


@dataclass(frozen=True)
class Nudge:
    """Wake the engine to retry waiting work (the demoter made room). `reply`, when given, is
    called once every command posted before this one has been handled (a barrier)."""

    reply: Reply | None = None


@dataclass(frozen=True)
class Shutdown:
    """Finish the loop: running requests end as cancelled."""


SlotVerb = SlotCapture | SlotApply | SlotErase | PageOut | PageIn
Command = (
    Submit
    | Cancel
    | SlotCapture
    | SlotApply
    | SlotErase
    | PageOut
    | PageIn
    | Reconfigure
    | FlushMinds
    | Nudge
    | Shutdown
)


@dataclass(frozen=True)
class Captured:
    """The result of `SlotCapture`: a slot's whole state in a buffer the caller must close."""

    slot_id: int
    buffer: mmap.mmap  # laid out by `layout`
    layout: PageLayout


@dataclass(frozen=True)
class Applied:
    """The result of `SlotApply`."""

    slot_id: int
    n_tokens: int
    n_bytes: int


@dataclass(frozen=True)
class Erased:
    slot_id: int
    n_erased: int


@dataclass(frozen=True)
class PageMoved:
    """The result of `PageOut` and `PageIn` (SPEC §3 result fields)."""

    slot_id: int
    name: str
    n_tokens: int
    n_bytes: int  # the target state
    n_bytes_spec: int  # the draft state
    n_checkpoints: int
    t_ms: float  # the whole verb, from its start on the slot
    n_discarded: int = 0  # page_in: cached tokens the slot lost
    copy_ms: float = 0.0  # page_out: the copy on the engine thread (its only stall)
