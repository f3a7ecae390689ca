"""The stored responses' own routes (OpenAI's): GET /v1/responses/{id} (with `stream=true` and
`starting_after`, a background response's stream replayed, live while it runs), DELETE,
POST /v1/responses/{id}/cancel (a background response), GET /v1/responses/{id}/input_items.

Everything is the caller's own: an id of another API key is a 404 exactly as an unknown one,
and no answer holds anything of it. A deleted response is gone for the API; the responses
that continue it keep working (`minds.stored.retention`). Deleting the last reference to a
mind drops its state (`StoredChains.release`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.minds.chains import StoredChains
from kvswap.minds.stored.records import ResponseNotFound, page_of
from kvswap.server.asgi import tenant_namespace
from kvswap.server.openai import formats_responses as fr
from kvswap.server.openai.listing import flag, list_query, starting_after
from kvswap.server.state import ServerState, get_state

router = APIRouter()
PREFIXES = ("/v1/responses", "/responses")


def chains_of(state: ServerState) -> StoredChains:
    if state.chains is None:
        raise KvswapError(ErrorKind.NOT_SUPPORTED, "stored responses are off on this server")
    return state.chains


async def _body(state: ServerState, ns: str, rid: str) -> dict[str, Any]:
    chains = chains_of(state)
    live = state.backgrounds.body(ns, rid)
    body = live if live is not None else await chains.run(chains.records.response, ns, rid)
    if body is None:
        raise ResponseNotFound(rid)
    return body


async def retrieve(request: Request, response_id: str) -> Response:
    state = get_state(request)
    ns = tenant_namespace(request.scope)
    query = request.query_params
    body = await _body(state, ns, response_id)
    if not flag(query, "stream"):
        return JSONResponse(body)
    after = starting_after(query)
    if not body.get("background"):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            "Only responses created with background: true can be streamed again.",
            param="stream",
        )
    events = state.backgrounds.follow(ns, response_id, after)
    if events is None:
        chains = chains_of(state)
        stored = await chains.run(chains.records.events, ns, response_id)
        events = _replayed([e for e in stored if e.get("sequence_number", -1) > after])

    async def sse() -> AsyncIterator[bytes]:
        async for event in events:
            yield fr.encode(event)

    return StreamingResponse(
        sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _replayed(events: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for event in events:
        yield event


async def delete(request: Request, response_id: str) -> Response:
    state = get_state(request)
    ns = tenant_namespace(request.scope)
    chains = chains_of(state)
    state.backgrounds.cancel(ns, response_id)
    if not await chains.delete_response(ns, response_id):
        raise ResponseNotFound(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def cancel(request: Request, response_id: str) -> Response:
    state = get_state(request)
    ns = tenant_namespace(request.scope)
    body = await _body(state, ns, response_id)
    if not body.get("background"):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            "Only responses created with background: true can be cancelled.",
            param="response_id",
        )
    cancelled = await state.backgrounds.cancel_and_wait(ns, response_id)
    return JSONResponse(cancelled if cancelled is not None else await _body(state, ns, response_id))


async def input_items(request: Request, response_id: str) -> Response:
    state = get_state(request)
    ns = tenant_namespace(request.scope)
    query = list_query(request.query_params)
    chains = chains_of(state)
    items = await chains.run(chains.records.input_items, ns, response_id)
    if items is None:
        raise ResponseNotFound(response_id)
    return JSONResponse(
        page_of(items, after=query.after, limit=query.limit, order=query.order).json()
    )


for prefix in PREFIXES:
    router.add_api_route(prefix + "/{response_id}", retrieve, methods=["GET"])
    router.add_api_route(prefix + "/{response_id}", delete, methods=["DELETE"])
    router.add_api_route(prefix + "/{response_id}/cancel", cancel, methods=["POST"])
    router.add_api_route(prefix + "/{response_id}/input_items", input_items, methods=["GET"])
