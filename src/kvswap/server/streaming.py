"""Running a route's generation requests: inside the mind's session when the request names one,
one or several tasks, streamed or not.

Owns the glue between the mind's session (`kvswap.minds`), `EngineClient` and HTTP responses:
- `turn(state, http, raw)` comes first in a generation route, before the body is prepared:
  the mind the request names (`X-Mind-Id`, the body's `"mind"`, else a session key:
  `minds.names`; a parse of those few fields) is held (`MindSession.turn`: its lock, busy and
  claimed; in a cluster placed, so a turn bound for another replica is forwarded from here,
  never rendered or tokenized here). A body whose `"mind"` cannot be read holds nothing: its
  preparation answers the typed 400. `prepare_turn` prepares the body; a side request (another
  conversation on a session's key) lets the session's mind go and holds its own instead
  (`Turn.hold_side`), then is prepared again on it. A request with `X-Conversation-Id` cancels that
  conversation's previous resumable stream (`resumable`).
- `Turn.stream`/`complete`: a mind's request takes its restored state with it and ends its
  turn (`turn_done`) before its last event goes out; how its mind was served (the engine's
  `MindSeated`, its first event) is kept for the answer's headers (`Turn.headers`) and its
  `Completion`; then the route's own end of the turn runs (`Turn.before_answer`: a stored
  response is written), still before that event.
- waiting for the first event before answering (an early error becomes a proper 4xx/5xx, as
  llama-server), merging the events of several tasks (a batch of prompts, `n` > 1) into one
  stream, and cancelling every task when the client goes away (the async generators'
  `finally` posts `Cancel`). A stream keeps the mind held until it ends (`Turn.keep`). A
  stream with `X-Conversation-Id`, once started, is produced into its conversation's stream
  by a task of its own: the client reads it there and may leave without stopping it.

A client can leave before its first event (while it waits for its mind, queues for a slot or
prefills a long prompt): those waits watch the connection itself (`asgi.until_disconnect`, the
ASGI `http.disconnect` message, not a poll), so the request is cancelled and its slot freed at
the engine's next step.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import StreamingResponse

from kvswap.core.errors import KvswapError
from kvswap.core.keys import PUBLIC_NAMESPACE, PageKey
from kvswap.core.types import (
    Completion,
    EngineError,
    Event,
    GenerationRequest,
    MindOnDisk,
    MindSeated,
    MindServed,
)
from kvswap.engine.client import ClientGone, Disconnected, EngineClient, next_or_disconnect
from kvswap.minds.histories import LastTurn
from kvswap.minds.names import request_mind, session_mind
from kvswap.minds.session import HeldMind, MindSession
from kvswap.server.asgi import tenant_namespace, until_disconnect
from kvswap.server.errors import error_json
from kvswap.server.formats import served_headers
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.schemas import MindField, parse_body
from kvswap.server.resumable import ResumableStream, ResumableStreams, StreamKey
from kvswap.server.sse import DONE, sse
from kvswap.server.state import ServerState
from kvswap.server.turnfacts import turn_facts

T = TypeVar("T")
Indexed = tuple[int, Event]
# Turns one task's event into zero or more JSON objects to send.
Render = Callable[[int, Event], Iterable[dict[str, object]]]
# A route's end of a turn, run on its Completion before the answer goes out (the event to
# answer with: the Completion, or an error when the end could not be written).
BeforeAnswer = Callable[[GenerationRequest, Completion], Awaitable[Completion | EngineError]]


@dataclass(frozen=True)
class Resumable:
    """A request's resumable stream (llama-server's `X-Conversation-Id`): where it goes."""

    streams: ResumableStreams
    key: StreamKey  # (tenant namespace, conversation id)

    def start(self, produce: AsyncIterator[bytes]) -> ResumableStream:
        return self.streams.start(self.key, produce)


def raise_error(event: EngineError) -> None:
    raise KvswapError(event.kind, event.message, **event.extra)


class Turn:
    """A route's engine requests; those of a mind run inside its held session."""

    def __init__(
        self,
        client: EngineClient,
        minds: MindSession,
        held: HeldMind | None = None,
        exits: AsyncExitStack | None = None,
        namespace: str = PUBLIC_NAMESPACE,
        resumable: Resumable | None = None,
        holds: Holds | None = None,
    ) -> None:
        self.client = client
        self.minds = minds
        self.held = held
        self.holds = holds  # how `held` was held, which a side request trades (`hold_side`)
        self.exits = exits or AsyncExitStack()
        self.namespace = namespace  # the caller's tenant: its requests carry it
        self.resumable = resumable  # X-Conversation-Id: its stream outlives its client
        self.served: MindServed | None = None  # how the mind was served, once it is seated
        self.before_answer: BeforeAnswer | None = None
        # Only a session key named the mind: a request of another conversation on the same
        # key (a side request) may run on its own mind, or on none in a cluster
        # (`requests.resent.side_request`).
        self.by_session = False

    @property
    def mind(self) -> PageKey | None:
        """The mind held for this request (its engine requests name it)."""
        return self.held.key if self.held is not None else None

    @property
    def last_turn(self) -> LastTurn | None:
        """The held mind's last chat turn, which a request re-sending its conversation
        continues (`requests.resent`); read while the mind is held, so no turn of it runs."""
        return self.minds.histories.get(self.held.key) if self.held is not None else None

    async def hold_side(self, key: PageKey) -> bool:
        """Let the session's mind go and hold `key`, a side request's own mind, instead
        (`requests.resent.side_request`); False (nothing changed) in a cluster, where a side
        request runs without a mind."""
        if self.holds is None or self.minds.shared is not None:
            return False
        await self.holds.let_go()
        self.held, self.by_session = None, False
        self.held = await self.holds.hold(key)
        return True

    def keep(self) -> AsyncExitStack:
        """The session's end, moved to the caller (a stream's last event): leaving `turn`
        then lets nothing go."""
        return self.exits.pop_all()

    def headers(self) -> dict[str, str]:
        """The answer's headers saying how its mind was served (none for no mind)."""
        return served_headers(self.served) if self.served is not None else {}

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Event, None]:
        """The request's events; the last is a Completion or an EngineError. A mind's seating
        (`MindSeated`) is kept as `served`, not yielded."""
        request = replace(request, namespace=self.namespace)
        held = self.held if request.mind is not None else None  # a side request: no mind
        assert held is not None or self.held is None or self.by_session, "a side request"
        assert held is None or request.mind == held.key, "a held turn runs its own mind's"
        async for event in self._engine_events(request, held):
            if isinstance(event, MindSeated):
                if held is not None:
                    self.served = self.minds.served(held, event.served)
                continue
            if isinstance(event, Completion) and held is not None:
                event = replace(event, served=self.served)
                event = await self.minds.turn_done(held, request, event)
            if isinstance(event, Completion) and self.before_answer is not None:
                event = await self.before_answer(request, event)
            yield event

    async def _engine_events(
        self, request: GenerationRequest, held: HeldMind | None
    ) -> AsyncGenerator[Event, None]:
        """The engine's events for the request, its mind's state read from disk first where
        it lives there only. A mind that went to disk after this looked (a switch moved it
        straight there while the request waited) is read back and the request sent again."""
        restore, disk_read, seeds = None, False, False
        if held is not None:
            prompt = np.asarray(request.prompt_tokens, dtype=np.int32)
            restore = await self.minds.restore(held, prompt if request.cache_prompt else None)
            disk_read, seeds = held.on_disk_only, held.disk_seed
        while True:
            stream = self.client.stream(request, restore, disk_read, seeds)
            async with aclosing(stream) as events:
                async for event in events:
                    if isinstance(event, MindOnDisk):
                        break
                    yield event
                else:
                    return
            assert held is not None, "only a mind's request waits for its mind"
            restore, disk_read, seeds = await self.minds.read_again(held), True, False

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


async def named_mind(
    http: Request, raw: bytes, session_headers: Sequence[str] | None = None
) -> PageKey | None:
    """The mind a request names in the caller's tenant namespace (`minds.names`: the header
    and the body's field, else a session key when `session_headers` is given, the session
    minds being on); None when it names none, or its body's `"mind"` cannot be read. A session
    key of a body asking for several completions names nothing (a mind runs one)."""
    return (await _named(http, raw, session_headers))[0]


async def _named(
    http: Request, raw: bytes, session_headers: Sequence[str] | None
) -> tuple[PageKey | None, bool]:
    """`named_mind`, and whether only a session key named it (no `X-Mind-Id`, no `"mind"`)."""
    try:
        field = await prepared(raw, lambda: parse_body(MindField, raw))
    except KvswapError:
        return None, False  # the body's own parse answers the 400
    session = None
    if session_headers is not None and not field.several:
        values = [http.headers.get(name) for name in session_headers]
        session = session_mind(field.prompt_cache_key, [*values, field.claude_session])
    header = http.headers.get("x-mind-id")
    key = request_mind(header, field.mind, tenant_namespace(http.scope), session)
    return key, key is not None and header is None and field.mind is None


def session_headers(state: ServerState) -> Sequence[str] | None:
    """The headers whose value is a session key; None with `--no-session-minds`."""
    http = state.config.http
    return http.session_headers if http.session_minds else None


def turn(state: ServerState, http: Request, raw: bytes) -> AbstractAsyncContextManager[Turn]:
    """The route's work, its mind held first when it names one (see the module docstring)."""
    return _turn(state, http, raw, None, named=True)


def turn_on(
    state: ServerState, http: Request, raw: bytes, key: PageKey | None
) -> AbstractAsyncContextManager[Turn]:
    """`turn`, on mind `key` (the route found it: a stored conversation's), or on none."""
    return _turn(state, http, raw, key, named=False)


@asynccontextmanager
async def _turn(
    state: ServerState, http: Request, raw: bytes, key: PageKey | None, *, named: bool
) -> AsyncIterator[Turn]:
    by_session = False
    if named:
        key, by_session = await _named(http, raw, session_headers(state))
    namespace = tenant_namespace(http.scope)
    resumable = None
    conv = http.headers.get("x-conversation-id")
    if conv:  # llama-server's resumable stream: this request replaces the previous one
        resumable = Resumable(state.streams, (namespace, conv))
        state.streams.replace(resumable.key)
    async with AsyncExitStack() as exits:
        holds = Holds(state, http, raw)
        exits.push_async_callback(holds.let_go)
        held = await holds.hold(key) if key is not None else None
        runner = Turn(state.client, state.minds, held, exits, namespace, resumable, holds)
        runner.by_session = by_session
        yield runner


class Holds:
    """A route's hold of its mind (its session: `MindSession.turn`), which it may let go to
    hold another (a side request's own mind)."""

    def __init__(self, state: ServerState, http: Request, raw: bytes) -> None:
        self.state, self.http, self.raw = state, http, raw
        self.stack = AsyncExitStack()

    async def hold(self, key: PageKey) -> HeldMind:
        """Hold mind `key` (waiting for it, unless the client leaves first: `ClientGone`)."""
        session = self.state.minds.turn(key, turn_facts(self.http.scope, self.raw))
        gone = until_disconnect(self.http.receive)
        return await _unless_gone(self.stack.enter_async_context(session), gone)

    async def let_go(self) -> None:
        stack, self.stack = self.stack, AsyncExitStack()
        await stack.aclose()


async def prepare_turn(
    runner: Turn,
    raw: bytes,
    make: Callable[[PageKey | None, LastTurn | None, bool], T],
    side: Callable[[T], PageKey | None],
) -> T:
    """The route's prepared job, `make(mind, last turn, by_session)` off the event loop for a
    large body; a side request's (`side(job)`: its own mind) prepared again on that mind, once
    the runner holds it instead of the session's."""
    mind, last, by_session = runner.mind, runner.last_turn, runner.by_session
    job = await prepared(raw, lambda: make(mind, last, by_session))
    key = side(job)
    if key is None or not await runner.hold_side(key):
        return job
    mind, last = runner.mind, runner.last_turn
    return await prepared(raw, lambda: make(mind, last, False))


async def _unless_gone(work: Awaitable[T], gone: Awaitable[None]) -> T:
    """`work`'s result, or ClientGone (the work cancelled) when the client leaves first
    (`gone` returns)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(gone)
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone()
    finally:
        watch.cancel()
        if not task.done():
            # Wait for the cancellation to land: a generator the work stepped must be
            # suspended again before the caller closes it.
            task.cancel()
            await asyncio.wait({task})


async def complete_all(
    runner: Turn, requests: Sequence[GenerationRequest], http: Request
) -> list[Completion]:
    """Run every task to its end; the first failure is raised (the others are cancelled)."""
    tasks = [asyncio.ensure_future(runner.complete(r, http.is_disconnected)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()


async def _merged(
    runner: Turn, requests: Sequence[GenerationRequest]
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


async def _kept(
    runner: Turn, requests: Sequence[GenerationRequest], exits: AsyncExitStack
) -> AsyncGenerator[Indexed, None]:
    """`_merged`, then the session's end (`exits`) once the stream is done or closed."""
    async with exits:
        async for item in _merged(runner, requests):
            yield item


# A stream's first event not yet here after this long: its headers go, then a keepalive every
# as long (KVSWAP_KEEPALIVE_S: the tests' seam, to see one without a prefill of minutes).
KEEPALIVE_S = float(os.environ.get("KVSWAP_KEEPALIVE_S", "10"))
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: every client's parser skips it


def _error_event(event: EngineError) -> bytes:
    return sse(error_json(event.kind, event.message))


async def open_stream(
    runner: Turn,
    requests: Sequence[GenerationRequest],
    render: Render,
    *,
    http: Request,
    done_marker: bool,
    encode: Callable[[dict[str, object]], bytes] = sse,
    encode_error: Callable[[EngineError], bytes] = _error_event,
    keepalive: bytes = KEEPALIVE,
) -> StreamingResponse:
    """An SSE response, started once the first event shows the request was accepted, or after
    `KEEPALIVE_S` without one (a long prefill): then `keepalive` goes out every `KEEPALIVE_S`
    until the first event (a comment line by default; the Anthropic route's `ping` event), so
    a client's idle timeout never cancels a prefill of many thousand tokens.

    An error before the stream started is raised (typed HTTP error); after, it is sent as
    `encode_error` writes it (default `data: {"error": ...}`) and the stream ends. `encode`
    writes each rendered object (default `data: <json>`; the Anthropic and Responses routes
    name their events). A client of `http` that leaves before the stream starts cancels every
    task then (ClientGone). The mind stays held until the stream ends.
    """
    exits = runner.keep()
    events = _kept(runner, requests, exits)
    pending = asyncio.ensure_future(anext(events))
    try:
        await _unless_gone(
            asyncio.wait({pending}, timeout=KEEPALIVE_S), until_disconnect(http.receive)
        )
        first = pending.result()[1] if pending.done() else None
        if isinstance(first, EngineError):
            raise_error(first)
    except BaseException:
        pending.cancel()
        await asyncio.wait({pending})
        await events.aclose()
        await exits.aclose()  # when the stream never started
        raise

    out: AsyncIterator[bytes] = _body(
        pending, events, render, len(requests), (encode, encode_error, keepalive), done_marker
    )
    if runner.resumable is not None:  # the answer outlives its client: read from its stream
        out = runner.resumable.start(out).read_from(0)
    return StreamingResponse(
        out,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **runner.headers()},
    )


async def _body(
    pending: asyncio.Future[Indexed],
    events: AsyncGenerator[Indexed, None],
    render: Render,
    n_requests: int,
    encoders: tuple[Callable[[dict[str, object]], bytes], Callable[[EngineError], bytes], bytes],
    done_marker: bool,
) -> AsyncIterator[bytes]:
    """`open_stream`'s bytes: keepalives until the first event (`pending`), then every event
    rendered and encoded (`encoders`: an object's, an error's, the keepalive)."""
    encode, encode_error, keepalive = encoders
    try:
        while not pending.done():
            await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not pending.done():
                yield keepalive
        item: Indexed | None = pending.result()
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
                if n_done == n_requests:
                    break
            item = await anext(events, None)
        if done_marker:
            yield DONE
    finally:
        if not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await events.aclose()
