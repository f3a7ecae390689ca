"""The asyncio side of the engine: start it, post commands, await results, stream events.

HTTP handlers use only this (and the snapshot and the `handle.PagesHandle` it exposes); it is the
one module above the engine that holds the `Engine`. Events cross from the engine thread to the
event loop through an `_Outbox`, which wakes the loop once per batch (not once per token);
nothing here blocks the loop. When the caller stops listening (client disconnect, task
cancelled), the client posts `Cancel`, so the engine frees the slot or drops the waiting job.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from kvswap.backend.lora import Adapters
from kvswap.backend.model import Model
from kvswap.core.errors import KvswapError
from kvswap.core.page import SlotState
from kvswap.core.types import Completion, EngineError, Event, GenerationRequest, MindOnDisk
from kvswap.engine.commands import Cancel, Command, Reply, Submit
from kvswap.engine.engine import Engine
from kvswap.engine.handle import PagesHandle
from kvswap.engine.runtime import EngineConfig
from kvswap.engine.snapshot import EngineSnapshot

T = TypeVar("T")
Disconnected = Callable[[], Awaitable[bool]]

# How often a waiting handler checks whether its client went away.
_DISCONNECT_POLL_S = 0.25


class _Outbox:
    """Stream events from the engine thread to their queues on the event loop.

    The first event of a batch schedules one flush on the loop (`call_soon_threadsafe`: a
    self-pipe write that wakes it); events the engine sends before that flush runs (the other
    slots of the same step) ride along. With every core decoding, each wake-up of the loop thread
    takes a core from a decode thread, so a step wakes the loop about once, whatever its number
    of streams."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Event | MindOnDisk], Event | MindOnDisk]] = []

    def put(self, queue: asyncio.Queue[Event | MindOnDisk], event: Event | MindOnDisk) -> None:
        """Deliver `event` to `queue` (any thread)."""
        with self._lock:
            self._items.append((queue, event))
            if len(self._items) > 1:
                return  # a flush is already scheduled
        self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for queue, event in items:
            queue.put_nowait(event)


class StartedEngine:
    """An engine built and running, not yet tied to an event loop (`kvswap serve` builds it
    while its HTTP stack imports, before any loop runs); `connect(loop)` makes its client."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def connect(self, loop: asyncio.AbstractEventLoop) -> EngineClient:
        return EngineClient(self._engine, loop)

    def close(self) -> None:
        """Stop it unconnected (a start that failed after building it)."""
        self._engine.close()


class EngineClient:
    """Posts typed commands to the engine thread and receives its events."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self.loop = loop
        self._outbox = _Outbox(loop)
        self._ids = itertools.count(1)
        self.pages = PagesHandle(engine.store, engine.registry, engine.flushes, engine.handoffs)

    @staticmethod
    def build(
        model: Model,
        config: EngineConfig,
        *,
        adapters: Adapters | None = None,
        draft_model: Model | None = None,
    ) -> StartedEngine:
        """Build the engine (its contexts made and warmed up) and start its thread, with no
        event loop yet: `StartedEngine.connect` makes the client."""
        engine = Engine(model, config, adapters=adapters, draft_model=draft_model)
        engine.start()
        return StartedEngine(engine)

    def close(self) -> None:
        """Stop the engine thread and free its contexts (the model stays the caller's)."""
        self._engine.close()

    @property
    def snapshot(self) -> EngineSnapshot:
        return self._engine.snapshot

    def new_id(self) -> int:
        return next(self._ids)

    def post(self, cmd: Command) -> None:
        self._engine.post(cmd)

    async def stream(
        self,
        request: GenerationRequest,
        restore: SlotState | None = None,
        disk_read: bool = False,
        seeds: bool = False,
    ) -> AsyncGenerator[Event | MindOnDisk, None]:
        """Run a request and yield its events; the last is a Completion, an EngineError or,
        for a mind that went to disk after its request looked, a MindOnDisk. `restore` is a
        mind's state read back from disk, applied before the prompt (`disk_read`: the disk
        copy was read for this request; `seeds`: it is another mind's, a new mind's start)."""
        req_id = self.new_id()
        events: asyncio.Queue[Event | MindOnDisk] = asyncio.Queue()
        outbox = self._outbox

        def sink(event: Event | MindOnDisk) -> None:
            outbox.put(events, event)

        self.post(Submit(req_id, request, sink, restore, disk_read, seeds))
        finished = False
        try:
            while True:
                event = await events.get()
                if isinstance(event, Completion | EngineError | MindOnDisk):
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.post(Cancel(req_id))

    async def call(
        self,
        make: Callable[[int, Reply[T]], Command],
        disconnected: Disconnected | None = None,
        on_reply: Callable[[T | KvswapError], None] | None = None,
    ) -> T:
        """Post a command built by `make(req_id, reply)` and await its reply.

        `on_reply` runs on the event loop when the engine answers, even if the caller was
        cancelled first: buffers the command references are released there, never while the
        engine may still read them.
        """
        req_id = self.new_id()
        future: asyncio.Future[T | KvswapError] = self.loop.create_future()
        loop = self.loop

        def reply(result: T | KvswapError) -> None:
            loop.call_soon_threadsafe(_resolve, future, result, on_reply)

        self.post(make(req_id, reply))
        try:
            result = await _await_or_disconnect(future, disconnected)
        except BaseException:
            self.post(Cancel(req_id))
            raise
        if isinstance(result, KvswapError):
            raise result
        return result


def _resolve(
    future: asyncio.Future[Any], result: Any, on_reply: Callable[[Any], None] | None = None
) -> None:
    if on_reply is not None:
        on_reply(result)
    if not future.done():
        future.set_result(result)


class ClientGone(Exception):
    """The HTTP client disconnected while its request waited."""


async def _await_or_disconnect(future: asyncio.Future[T], disconnected: Disconnected | None) -> T:
    if disconnected is None:
        return await future
    while True:
        done, _ = await asyncio.wait({future}, timeout=_DISCONNECT_POLL_S)
        if done:
            return future.result()
        if await disconnected():
            raise ClientGone()


async def next_or_disconnect(
    agen: AsyncIterator[Event], disconnected: Disconnected | None
) -> Event:
    """The next event of a stream, or ClientGone when the client leaves first."""
    task = asyncio.ensure_future(agen.__anext__())
    try:
        return await _await_or_disconnect(task, disconnected)
    finally:
        if not task.done():
            # Wait for the cancellation to land: the generator must be suspended again before
            # the caller closes it (closing a running generator raises RuntimeError).
            task.cancel()
            await asyncio.wait({task})
