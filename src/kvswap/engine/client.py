"""The asyncio side of the engine: post commands, await results, stream events.

HTTP handlers use only this. Events cross from the engine thread to the event loop through
`loop.call_soon_threadsafe`; nothing here blocks the loop. When the caller stops listening
(client disconnect, task cancelled), the client posts `Cancel`, so the engine frees the slot or
drops the waiting job.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from kvswap.engine.commands import Cancel, Command, Reply, Submit
from kvswap.engine.engine import Engine
from kvswap.engine.slotstate import SlotState
from kvswap.engine.snapshot import EngineSnapshot
from kvswap.engine.types import Completion, EngineError, Event, GenerationRequest, KvswapError

Disconnected = Callable[[], Awaitable[bool]]
# Holds a request's mind while it runs; yields the mind's state when it was read from disk.
MindSession = Callable[[GenerationRequest], AbstractAsyncContextManager[SlotState | None]]

# How often a waiting handler checks whether its client went away.
_DISCONNECT_POLL_S = 0.25


class EngineClient:
    """Posts typed commands to the engine thread and receives its events."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self._ids = itertools.count(1)
        self.mind_session: MindSession | None = None  # set by the server when minds are on

    @property
    def snapshot(self) -> EngineSnapshot:
        return self.engine.snapshot

    def new_id(self) -> int:
        return next(self._ids)

    def post(self, cmd: Command) -> None:
        self.engine.post(cmd)

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Event, None]:
        """Run a request and yield its events; the last is a Completion or an EngineError.

        A request naming a mind runs inside the mind's session (one request per mind)."""
        if request.mind and self.mind_session is not None:
            async with self.mind_session(request) as restore:
                async for event in self._stream(request, restore):
                    yield event
            return
        async for event in self._stream(request, None):
            yield event

    async def _stream(
        self, request: GenerationRequest, restore: SlotState | None
    ) -> AsyncGenerator[Event, None]:
        req_id = self.new_id()
        events: asyncio.Queue[Event] = asyncio.Queue()
        loop = self.loop

        def sink(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self.post(Submit(req_id, request, sink, restore))
        finished = False
        try:
            while True:
                event = await events.get()
                if isinstance(event, Completion | EngineError):
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.post(Cancel(req_id))

    async def complete(
        self, request: GenerationRequest, disconnected: Disconnected | None = None
    ) -> Completion:
        """Run a request to its end; raises KvswapError on failure. A disconnect cancels it."""
        agen = self.stream(request)
        try:
            while True:
                event = await _next_or_disconnect(agen, disconnected)
                if isinstance(event, EngineError):
                    raise KvswapError(event.kind, event.message, **event.extra)
                if isinstance(event, Completion):
                    return event
        finally:
            await agen.aclose()

    async def call(
        self,
        make: Callable[[int, Reply], Command],
        disconnected: Disconnected | None = None,
        on_reply: Callable[[Any], None] | None = None,
    ) -> Any:
        """Post a command built by `make(req_id, reply)` and await its reply.

        `on_reply` runs on the event loop when the engine answers, even if the caller was
        cancelled first: buffers the command references are released there, never while the
        engine may still read them.
        """
        req_id = self.new_id()
        future: asyncio.Future[Any] = self.loop.create_future()
        loop = self.loop

        def reply(result: Any) -> None:
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


async def _await_or_disconnect(
    future: asyncio.Future[Any], disconnected: Disconnected | None
) -> Any:
    if disconnected is None:
        return await future
    while True:
        done, _ = await asyncio.wait({future}, timeout=_DISCONNECT_POLL_S)
        if done:
            return future.result()
        if await disconnected():
            raise ClientGone()


async def _next_or_disconnect(
    agen: AsyncIterator[Event], disconnected: Disconnected | None
) -> Event:
    task = asyncio.ensure_future(agen.__anext__())
    try:
        return await _await_or_disconnect(task, disconnected)
    finally:
        if not task.done():
            # Wait for the cancellation to land: the generator must be suspended again before
            # the caller closes it (closing a running generator raises RuntimeError).
            task.cancel()
            await asyncio.wait({task})
