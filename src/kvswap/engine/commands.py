"""Typed commands that HTTP handlers post to the engine thread's inbox.

Each command carries a `reply` (or a `sink` for streams) that the engine calls from its own
thread; `EngineClient` turns those calls into asyncio results. Commands hold plain data and
buffers, never libllama objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvswap.engine.types import Event, GenerationRequest

Reply = Callable[[Any], None]  # called once with a result or a KvswapError
Sink = Callable[[Event], None]  # called per event; the last is a Completion or an EngineError


@dataclass(frozen=True)
class Submit:
    """Run a generation request."""

    req_id: int
    request: GenerationRequest
    sink: Sink


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
    """Load tokens and a state (with its 8-byte prefix) into a slot (for `restore`)."""

    req_id: int
    slot_id: int
    tokens: npt.NDArray[np.int32]
    state: Any  # a buffer
    reply: Reply


@dataclass(frozen=True)
class SlotErase:
    """Forget a slot's cached tokens and KV."""

    req_id: int
    slot_id: int
    reply: Reply


@dataclass(frozen=True)
class Shutdown:
    """Finish the loop: running requests end as cancelled."""


SlotVerb = SlotCapture | SlotApply | SlotErase
Command = Submit | Cancel | SlotCapture | SlotApply | SlotErase | Shutdown


@dataclass(frozen=True)
class Captured:
    """The result of `SlotCapture`: a slot's tokens and its state bytes."""

    slot_id: int
    tokens: npt.NDArray[np.int32]
    state: Any  # an anonymous mmap holding `n_bytes` bytes (8-byte prefix included)
    n_bytes: int


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
