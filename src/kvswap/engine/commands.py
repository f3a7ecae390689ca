"""Typed commands posted to the engine thread's inbox, and the results they reply with.

Each command carries a `reply` (or a `sink` for streams) that the engine calls from its own
thread, once, with the command's result type or a `KvswapError`; `EngineClient` turns those calls
into asyncio results (`Answer` waits for one on a plain thread). Commands hold plain data and
buffers, never libllama objects. HTTP handlers post them through the client; the demoter posts
`RoomReport`.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import KvswapError, MindMovedToDisk
from kvswap.core.keys import PUBLIC_NAMESPACE, PageKey
from kvswap.core.page import PageLayout, SlotState
from kvswap.core.types import EngineError, Event, GenerationRequest, MindOnDisk
from kvswap.core.vocab import MindMove
from kvswap.engine.plan.geometry import Geometry, ReconfigureSpec

T = TypeVar("T")
Reply = Callable[[T | KvswapError], None]  # called once with a result or a KvswapError
# Called per event; the last is a Completion, an EngineError or a MindOnDisk.
Sink = Callable[[Event | MindOnDisk], None]


@dataclass(frozen=True)
class Submit:
    """Run a generation request."""

    req_id: int
    request: GenerationRequest
    sink: Sink
    # A mind read back from disk: applied to the slot before the prompt (minds only).
    restore: SlotState | None = None
    # The caller read the mind's disk copy for it (`restore`; None: it could not be loaded).
    disk_read: bool = False
    # `restore` is another mind's state (`minds.diskseed`): a new mind keeps the prefix they share.
    seeds: bool = False


@dataclass(frozen=True)
class Cancel:
    """The client went away: drop the request if waiting, end it if running."""

    req_id: int


@dataclass(frozen=True)
class SlotCapture:
    """Copy a slot's tokens and state into RAM (for `save`); waits for the slot to be idle."""

    req_id: int
    slot_id: int
    reply: Reply[Captured]
    namespace: str | None = None  # the caller's mind namespace (None: not a tenant's verb)


@dataclass(frozen=True)
class SlotApply:
    """Load a state read from a slot file into a slot (for `restore`)."""

    req_id: int
    slot_id: int
    state: SlotState
    reply: Reply[Applied]
    namespace: str = PUBLIC_NAMESPACE  # the caller's: only its requests reuse the prefix


@dataclass(frozen=True)
class SlotErase:
    """Forget a slot's cached tokens and KV (a mind it holds is erased)."""

    req_id: int
    slot_id: int
    reply: Reply[Erased]
    namespace: str | None = None  # the caller's mind namespace (None: not a tenant's verb)


@dataclass(frozen=True)
class PageOut:
    """Move a slot's whole state into the page store under `key`; the slot is freed."""

    req_id: int
    slot_id: int
    key: PageKey
    reply: Reply[PageMoved]
    namespace: str | None = None  # the caller's mind namespace (None: not a tenant's verb)


@dataclass(frozen=True)
class PageIn:
    """Load page `key` into a slot; on success the page leaves the store."""

    req_id: int
    slot_id: int
    key: PageKey
    reply: Reply[PageMoved]
    namespace: str = PUBLIC_NAMESPACE  # the caller's: only its requests reuse the prefix


@dataclass(frozen=True)
class Reconfigure:
    """The engine command."""

    req_id: int
    spec: ReconfigureSpec
    reply: Reply[ReconfigureReceipt]


@dataclass(frozen=True)
class FlushMinds:
    """Copy idle resident minds' states out: only `keys` (the spill before exit asks for those
    whose disk copy is not current, a scheduled flush for those due), or every one; the slots
    keep theirs.

    Replies with a list of (mind key, Captured) the caller closes, once every copy is in a
    buffer the buffer worker mapped (the engine thread only copies). A `charged` flush (the
    write-behind) copies into memory the page store charges (the switch's spare, lent; a
    shelved buffer; or a reservation within its free room) and leaves a mind whose copy has no
    room now for a later pass: a whole mind's copy is never memory outside the budget."""

    reply: Reply[list[tuple[PageKey, Captured]]]
    keys: frozenset[PageKey] | None = None  # None: every mind
    charged: bool = False


@dataclass(frozen=True)
class ForgetMind:
    """Mind `key` is owned elsewhere now: free its idle slot of it and drop its RAM page.
    Replies False (nothing changed) when its slot is busy."""

    key: PageKey
    reply: Reply[bool]


@dataclass(frozen=True)
class MindTokens:
    """A copy of mind `key`'s tokens where the engine holds its state (its slot, else its RAM
    page); None when neither does (it lives on disk only, or nowhere). The caller holds the
    mind, so no turn changes them meanwhile."""

    key: PageKey
    reply: Reply[npt.NDArray[np.int32] | None]


@dataclass(frozen=True)
class Nudge:
    """Wake the engine to retry waiting work (the demoter made room). `reply`, when given, is
    called once every command posted before this one has been handled (a barrier)."""

    reply: Reply[None] | None = None


@dataclass(frozen=True)
class ShedCache:
    """The demoter needs room: the anonymous prompt cache drops its least recently used states
    until `n_bytes` are freed (or it is empty); replies with the bytes it freed."""

    n_bytes: int
    reply: Reply[int]


ALL_HELD = "no idle mind page can be spilled to disk now"


@dataclass(frozen=True)
class RoomReport:
    """The demoter finished pass `pass_no` of making room in the page store; `refused` says why
    it could not (empty: it could; `ALL_HELD`: every page is held by a request, the disk tier
    refused nothing). A mind switch waiting for room reads it (minds.seating)."""

    pass_no: int
    refused: str = ""


@dataclass(frozen=True)
class Shutdown:
    """Finish the loop: running requests end as cancelled."""


@dataclass(frozen=True)
class MindVerb:
    """Move mind `key` without a request (POST /minds/{name}), once its slot is idle:
    `to_slot` seats it in a slot (from its RAM page, or `restore`, its state read from disk),
    `to_ram` pages it out of its slot, `erase` ends it there (a mind in no slot: nothing to
    do). Replies with the slot it is in after the move (-1: none)."""

    req_id: int
    key: PageKey
    action: MindMove
    reply: Reply[int]
    restore: SlotState | None = None  # to_slot: the state read from disk (a mind on disk only)
    disk_read: bool = False  # as Submit's


SlotVerb = SlotCapture | SlotApply | SlotErase | PageOut | PageIn
SLOT_VERBS = (SlotCapture, SlotApply, SlotErase, PageOut, PageIn)
Command = (
    Submit
    | Cancel
    | SlotCapture
    | SlotApply
    | SlotErase
    | PageOut
    | PageIn
    | MindVerb
    | Reconfigure
    | FlushMinds
    | ForgetMind
    | MindTokens
    | Nudge
    | ShedCache
    | RoomReport
    | Shutdown
)


@dataclass(frozen=True)
class Captured:
    """The result of `SlotCapture`: a slot's whole state in a buffer the caller must close."""

    slot_id: int
    buffer: mmap.mmap  # laid out by `layout`
    layout: PageLayout
    mind: PageKey | None = None  # the mind the slot holds (None: none)
    # A charged buffer's owner, which takes it back on `close` (None: the buffer is closed).
    give_back: Callable[[mmap.mmap], None] | None = None

    def close(self) -> None:
        """Done with the copy: its buffer is given back, or closed."""
        if self.give_back is not None:
            self.give_back(self.buffer)
        else:
            self.buffer.close()


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
    mind: PageKey | None = None  # the mind erased with the slot (None: none)


@dataclass(frozen=True)
class PageMoved:
    """The result of `PageOut` and `PageIn` (the fields the page verbs answer)."""

    slot_id: int
    key: PageKey
    n_tokens: int
    n_bytes: int  # the target state
    n_bytes_spec: int  # the draft state
    n_checkpoints: int
    t_ms: float  # the whole verb, from its start on the slot
    n_discarded: int = 0  # page_in: cached tokens the slot lost
    copy_ms: float = 0.0  # page_out: the copy on the engine thread (its only stall)
    mind: PageKey | None = None  # page_out: the mind the slot held (None: none)


@dataclass(frozen=True)
class SlotFate:
    """What happened to one slot's contents."""

    old_slot: int
    kind: str  # "request" | "mind"
    new_slot: int | None  # None: it stays a page (or joins the anonymous cache, or is dropped)
    page: PageKey | None  # the page that holds it (a mind that stays one)
    fate: str  # "kept" | "moved" | "paged" | "token_only" | "cached" | "dropped"
    reason: str = ""


@dataclass
class ReconfigureReceipt:
    """The answer of a reconfigure (or of its rollback)."""

    old: Geometry
    new: Geometry
    n_ctx_slot: int  # the new geometry's slot window
    old_n_ctx_slot: int  # the old one's
    timings_ms: dict[str, float] = field(default_factory=dict)
    n_bytes_moved: int = 0
    slots: list[SlotFate] = field(default_factory=list)
    rolled_back: bool = False
    reason: str = ""


class Answer:
    """One reply from the engine thread, awaited by a plain thread (the demoter, the shared
    tier's workers): pass it as a command's `reply`, then `wait`."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.value: object = None

    def __call__(self, value: object) -> None:
        self.value = value
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def unread(cmd: object) -> bool:
    """A mind's job sent without its disk copy read: the mind was in a slot or RAM then."""
    return isinstance(cmd, Submit | MindVerb) and cmd.restore is None and not cmd.disk_read


def refuse(cmd: object, error: KvswapError) -> None:
    """Answer a command that will not run with `error`: a stream gets it as an EngineError
    event, a command with a reply gets it as its result; a barrier is released, a shed frees
    nothing; a Cancel or a report needs no answer."""
    if isinstance(cmd, Submit) and isinstance(error, MindMovedToDisk):
        cmd.sink(MindOnDisk(cmd.req_id))
    elif isinstance(cmd, Submit):
        cmd.sink(EngineError(cmd.req_id, error.kind, error.message, error.extra))
    elif isinstance(cmd, Nudge):
        if cmd.reply is not None:
            cmd.reply(None)
    elif isinstance(cmd, ShedCache):
        cmd.reply(0)
    elif isinstance(cmd, (*SLOT_VERBS, MindVerb, Reconfigure, FlushMinds, ForgetMind)):
        cmd.reply(error)
