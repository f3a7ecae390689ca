"""Running generation requests for a route: one or several tasks, streamed or not.

Owns the glue between `EngineClient` and HTTP responses: the `Runner` (a request naming a mind
runs inside the mind's session, `pages.minds.MindGate.session`), waiting for the first event
before answering (an early error becomes a proper 4xx/5xx, as llama-server), merging the events
of several tasks (a batch of prompts, `n` > 1) into one stream, and cancelling every task when
the client goes away (the async generators' `finally` posts `Cancel`).

A stream's client can leave before its first event (while it queues for a slot, waits for its
mind or prefills a long prompt): the wait for that event watches the connection itself
(`until_gone`, the ASGI `http.disconnect` message, not a poll), so the request is cancelled
and its slot freed at the engine's next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse

from kvswap.core.errors import KvswapError
from kvswap.core.types import Completion, EngineError, Event, GenerationRequest
from kvswap.engine.client import ClientGone, Disconnected, EngineClient, next_or_disconnect
from kvswap.server.pages.minds import MindGate
from kvswap.server.sse import DONE, sse

Indexed = tuple[int, Event]
# Turns one task's event into zero or more JSON objects to send.
Render = Callable[[int, Event], Iterable[dict[str, object]]]


def raise_error(event: EngineError) -> None:
    raise KvswapError(event.kind, event.message, **event.extra)


class Runner:
    """Runs engine requests for a route; a request naming a mind runs inside its session."""

    def __init__(self, client: EngineClient, minds: MindGate) -> None:
        self.client = client
        self.minds = minds

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Event, None]:
        """The request's events; the last is a Completion or an EngineError."""
        if request.mind:
            async with self.minds.session(request) as restore:
                async for event in self.client.stream(request, restore):
                    if isinstance(event, Completion):
                        event = await self.minds.turn_done(request, event)
                    yield event
            return
        async for event in self.client.stream(request):
            yield event

    async def complete(
        self, request: GenerationRequest, disconnected: Disconnected | None = None
    ) -> Completion:
        """Run a request to its end; raises KvswapError on failure. A disconnect cancels it."""
        agen = self.stream(request)
        try:
            while True:
                event = await next_or_disconnect(agen, disconnected)
                if isinstance(event, EngineError):
                    raise_error(event)
                if isinstance(event, Completion):
                    return event
        finally:
            await agen.aclose()


async def complete_all(
    runner: Runner, requests: Sequence[GenerationRequest], http: Request
) -> list[Completion]:
    """Run every task to its end; the first failure is raised (the others are cancelled)."""
    tasks = [asyncio.ensure_future(runner.complete(r, http.is_disconnected)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()


async def _merged(
    runner: Runner, requests: Sequence[GenerationRequest]
) -> AsyncGenerator[Indexed, None]:
    """Events of several tasks as they come, tagged with the task's index."""
    if len(requests) == 1:
        async for event in runner.stream(requests[0]):
            yield 0, event
        return
    queue: asyncio.Queue[Indexed | None] = asyncio.Queue()

    async def pump(index: int, request: GenerationRequest) -> None:
        async for event in runner.stream(request):
            await queue.put((index, event))
        await queue.put(None)

    pumps = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(requests)]
    try:
        n_open = len(pumps)
        while n_open:
            item = await queue.get()
            if item is None:
                n_open -= 1
                continue
            yield item
    finally:
        for p in pumps:
            p.cancel()


def _error_event(event: EngineError) -> bytes:
    return sse(
        {"error": {"code": event.kind.code, "message": event.message, "type": event.kind.value}}
    )


async def until_gone(http: Request) -> None:
    """Return once the client has disconnected (the body must have been read already: the
    next ASGI message is then the disconnect)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _first(events: AsyncIterator[Indexed], gone: Awaitable[None]) -> Indexed:
    """The first event, or ClientGone when the client leaves first."""
    task = asyncio.ensure_future(events.__anext__())
    watch = asyncio.ensure_future(gone)
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone()
    finally:
        watch.cancel()
        if not task.done():
            # The generator must be suspended again before the caller closes it.
            task.cancel()
            await asyncio.wait({task})


async def open_stream(
    runner: Runner,
    requests: Sequence[GenerationRequest],
    render: Render,
    *,
    http: Request,
    done_marker: bool,
    encode: Callable[[dict[str, object]], bytes] = sse,
    encode_error: Callable[[EngineError], bytes] = _error_event,
) -> StreamingResponse:
    """An SSE response, started only once the first event shows the request was accepted.

    An error before any output is raised (typed HTTP error); after output began, it is sent as
    `encode_error` writes it (default `data: {"error": ...}`) and the stream ends. `encode`
    writes each rendered object (default `data: <json>`; the Anthropic and Responses routes
    name their events). A client of `http` that leaves before the first event cancels every
    task then (ClientGone).
    """
    events = _merged(runner, requests)
    try:
        first = await _first(events, until_gone(http))
    except BaseException:
        await events.aclose()
        raise
    if isinstance(first[1], EngineError):
        await events.aclose()
        raise_error(first[1])

    async def body() -> AsyncIterator[bytes]:
        try:
            item: Indexed | None = first
            n_done = 0
            while item is not None:
                index, event = item
                if isinstance(event, EngineError):
                    yield encode_error(event)
                    return
                for obj in render(index, event):
                    yield encode(obj)
                if isinstance(event, Completion):
                    n_done += 1
                    if n_done == len(requests):
                        break
                item = await anext(events, None)
            if done_marker:
                yield DONE
        finally:
            await events.aclose()

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
