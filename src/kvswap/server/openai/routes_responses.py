"""OpenAI's Responses API: POST /v1/responses and /responses (streamed or not), and
POST /v1/responses/input_tokens.

The body becomes the equivalent chat body (`schemas_responses.to_chat_body`), which runs exactly
as /v1/chat/completions does; the answer is parsed (`ChatParser`) and shaped as Responses
output items (`formats_responses`).

Stored state, as OpenAI: a response is stored unless `store` is false; `previous_response_id`
or `conversation` continues a stored chain, sending only the new input. Where such a turn runs
(the chain's mind, a fork, a new chain) is `minds.chains`' decision, its prompt
`stateful.prepare_stored`'s; the turn is written (`StoredChains.record`) before the answer goes out,
streamed or not. A new chain's first turn runs without a mind (its mind adopts that KV on its
second turn), so a client that never continues a response makes no mind. `background: true`
runs in `background` and answers at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.types import (
    EngineError,
    GenerationRequest,
)
from kvswap.minds.chains import ChainStart, StoredChains
from kvswap.minds.histories import LastTurn
from kvswap.server.asgi import tenant_namespace
from kvswap.server.openai import formats_responses as fr
from kvswap.server.openai.background import BackgroundTurn, check_limit
from kvswap.server.openai.items import metadata
from kvswap.server.openai.response_stream import ResponseStream, whole_response
from kvswap.server.openai.schemas_responses import ResponsesRequest, to_chat_body
from kvswap.server.openai.stateful import StoredJob, TurnWriter, prepare_stored
from kvswap.server.openapi import body_schema
from kvswap.server.requests.chat import ChatJob, count_chat_tokens, prepare_chat
from kvswap.server.requests.offload import OFFLOAD_BYTES, prepared
from kvswap.server.requests.schemas import ChatCompletionRequest, parse_body
from kvswap.server.state import ServerState, get_state
from kvswap.server.streaming import (
    complete_all,
    named_mind,
    open_stream,
    prepare_turn,
    session_headers,
    turn,
    turn_on,
)

router = APIRouter()


def _parsed(raw: bytes) -> tuple[ResponsesRequest, dict[str, Any]]:
    req = parse_body(ResponsesRequest, raw)
    metadata(req.metadata)  # OpenAI's limits, as on a conversation (it is stored and echoed)
    return req, json.loads(raw)  # valid: parse_body accepted it


def _bodies(raw: bytes) -> tuple[ResponsesRequest, ChatCompletionRequest]:
    req, data = _parsed(raw)
    return req, parse_body(ChatCompletionRequest, to_chat_body(data, req))


def _echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request settings a response object repeats."""
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "text": req.text or {"format": {"type": "text"}},
        "store": req.store is not False,
        "truncation": req.truncation or "disabled",
        "background": bool(req.background),
        "metadata": req.metadata or {},
        "previous_response_id": req.previous_response_id,
    }


def _stateful(req: ResponsesRequest) -> bool:
    return req.store is not False or bool(req.previous_response_id or req.conversation)


@router.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
@router.post("/responses", openapi_extra=body_schema(ResponsesRequest))
async def responses(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    req, data = await prepared(raw, lambda: _parsed(raw))
    if _stateful(req):
        return await _stored(state, request, raw, req, data)
    async with turn(state, request, raw) as runner:

        def prepare(mind: PageKey | None, last: LastTurn | None, by_session: bool) -> ChatJob:
            return prepare_chat(state, _bodies(raw)[1], mind, last, by_session=by_session)

        job = await prepare_turn(runner, raw, prepare, lambda j: j.side)
        meta = fr.ResponseMeta(
            id=fr.new_response_id(),
            model=state.model_name,
            created_at=int(time.time()),
            params=_echo(req),
            kept=job.requests[0].mind is not None,  # a side request keeps nothing
        )
        if not job.body.stream:
            [c] = await complete_all(runner, job.requests, request)
            return JSONResponse(whole_response(state, meta, job.plan, c), headers=runner.headers())
        stream = ResponseStream(state, job.plan, fr.ResponseEvents(meta))
        return await _open(runner, job.requests, stream, request)


async def _open(
    runner: Any, requests: list[GenerationRequest], stream: ResponseStream, http: Request
) -> Response:
    events = stream.events

    def encode_error(err: EngineError) -> bytes:
        return fr.encode(events.error(err))

    return await open_stream(
        runner,
        requests,
        stream.render,
        http=http,
        done_marker=False,
        encode=fr.encode,
        encode_error=encode_error,
    )


def _chains(state: ServerState) -> StoredChains:
    if state.chains is None:
        raise KvswapError(ErrorKind.NOT_SUPPORTED, "stored responses are off on this server")
    return state.chains


async def _stored(
    state: ServerState, request: Request, raw: bytes, req: ResponsesRequest, data: dict[str, Any]
) -> Response:
    chains = _chains(state)
    ns = tenant_namespace(request.scope)
    named = await named_mind(request, raw)  # X-Mind-Id or the body's mind
    if named is None and not (req.previous_response_id or req.conversation):
        # A new chain of a client with a session key (prompt_cache_key, ...) runs on that
        # session's mind; a continued chain keeps its own (a session key never conflicts).
        named = await named_mind(request, raw, session_headers(state))
    start = await chains.start(
        ns,
        previous=req.previous_response_id,
        conversation=req.conversation_id,
        store=req.store is not False,
        named=named,
    )
    # A new chain's first turn runs without a mind unless the request names one.
    mind = start.mind if start.base is not None else named if start.conversation is None else None
    meta = fr.ResponseMeta(
        fr.new_response_id(), state.model_name, int(time.time()), _echo(req), mind is not None
    )
    if req.background:
        return await _background(state, request, req, data, start, mind, meta)
    seed = await chains.seed(start.fork_from) if start.fork_from is not None else None
    try:
        async with turn_on(state, request, raw, mind) as runner:
            if seed is not None and runner.held is not None:
                runner.held.seed, seed = seed, None
            size = OFFLOAD_BYTES if start.items else len(raw)
            sj = await prepared(size, lambda: prepare_stored(state, data, req, start, mind))
            meta.params.update(_state_json(start, sj))
            writer = TurnWriter(chains, ns, sj, meta)
            if not sj.job.body.stream:
                [c] = await complete_all(runner, sj.job.requests, request)
                body = whole_response(state, meta, sj.job.plan, c)
                await writer.write(body, c)
                return JSONResponse(body, headers=runner.headers())
            stream = ResponseStream(state, sj.job.plan, fr.ResponseEvents(meta))
            runner.before_answer = writer.before_answer(stream)
            return await _open(runner, sj.job.requests, stream, request)
    finally:
        if seed is not None:
            seed.close()


async def _background(
    state: ServerState,
    request: Request,
    req: ResponsesRequest,
    data: dict[str, Any],
    start: ChainStart,
    mind: PageKey | None,
    meta: fr.ResponseMeta,
) -> Response:
    """`background: true`: the turn runs as a task; the answer is its queued response, or its
    events as they come (`background.BackgroundTurn`)."""
    if not start.record:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "Background mode requires store=true.", param="background"
        )
    chains = _chains(state)
    ns = tenant_namespace(request.scope)
    check_limit(state, ns)
    seed = await chains.seed(start.fork_from) if start.fork_from is not None else None
    turn_ = BackgroundTurn(state, chains, ns, req, data, start, mind, meta)
    run = await turn_.begin(seed, lambda sj: _state_json(start, sj))
    if not req.stream:
        return JSONResponse(run.body)
    events = state.backgrounds.follow(ns, meta.id, -1)
    assert events is not None, "a run just started is live"

    async def sse() -> AsyncIterator[bytes]:
        async for event in events:
            yield fr.encode(event)

    return StreamingResponse(
        sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _state_json(start: ChainStart, sj: StoredJob) -> dict[str, Any]:
    """A stored turn's fields: its conversation (OpenAI's), and kvswap's `continuation`: the
    chain's mind and how its prompt was made (the `mind` block beside `timings` says how the
    mind was served, when the turn ran on it)."""
    return {
        "conversation": {"id": start.conversation} if start.conversation is not None else None,
        "continuation": {
            "mind": start.mind.name if start.mind is not None else None,
            "mode": sj.cont.mode.value,
            "reason": sj.cont.reason or None,
            "n_dropped_items": sj.n_dropped,
        },
    }


@router.post("/v1/responses/input_tokens", openapi_extra=body_schema(ResponsesRequest))
@router.post("/responses/input_tokens", openapi_extra=body_schema(ResponsesRequest))
async def input_tokens(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    req, data = await prepared(raw, lambda: _parsed(raw))
    if req.previous_response_id or req.conversation:
        start = await _chains(state).start(
            tenant_namespace(request.scope),
            previous=req.previous_response_id,
            conversation=req.conversation_id,
            store=False,
            named=None,
        )
        sj = await prepared(OFFLOAD_BYTES, lambda: prepare_stored(state, data, req, start, None))
        n = len(sj.cont.tokens)
    else:
        n = await prepared(raw, lambda: count_chat_tokens(state, _bodies(raw)[1]))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})
