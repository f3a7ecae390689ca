"""What seating a mind tells the engine: the job must wait (`NoRoomYet`), a verb on another
tenant's slot (`NotYourMind`), how a request's mind came in (`Seat`) and what a move out of
the KV pool did (`PagedOut`). Values only; `seating` makes them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.vocab import MindSource


class NoRoomYet(Exception):
    """The job cannot be seated now: an evicted mind cannot be copied out (the page store has
    no room, or its spare buffer is still being mapped, or its file is being written), or
    running requests hold the KV cells a returning mind needs. The job waits for the demoter,
    the buffer worker or a step."""


class NotYourMind(KvswapError):
    """A slot verb of one tenant on a slot holding another tenant's mind (named nowhere) or
    another tenant's prompt."""

    def __init__(self, slot_id: int) -> None:
        super().__init__(
            ErrorKind.PERMISSION,
            f"slot {slot_id} holds a conversation of another API key: this key cannot act on it",
        )


@dataclass(frozen=True)
class Seat:
    """How `Seating.seat` brought a request's mind into its slot."""

    source: MindSource  # where its state was
    switch_ms: float  # the whole seating: the slot's previous mind out, this one in


class PagedOut(Enum):
    """What `page_out_idle_resident` did."""

    MOVED = "moved"  # an idle resident left its slot: retry the step
    WAITING = "waiting"  # a buffer is being mapped (or room made): retry once it arrives
    NOTHING = "nothing"  # nothing can move
