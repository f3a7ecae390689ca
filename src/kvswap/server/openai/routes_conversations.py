"""OpenAI's Conversations API: a conversation is an item list with a mind of its own.

POST /v1/conversations (`items` up to 20, `metadata` up to 16 pairs), GET, POST (its metadata),
DELETE; POST /v1/conversations/{id}/items (up to 20), GET (cursor paging: `after`, `limit`,
`order`, newest first by default), GET and DELETE /v1/conversations/{id}/items/{item_id}.
A response made with `conversation` continues the conversation's mind and appends its input
and output (`routes_responses`). Everything is the caller's own: another API key's id is a
404 exactly as an unknown one.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.minds.chains import StoredChains
from kvswap.minds.stored.records import (
    ConversationNotFound,
    ConversationRecord,
    ItemNotFound,
    page_of,
)
from kvswap.server.asgi import tenant_namespace
from kvswap.server.openai.items import metadata, new_id, new_items
from kvswap.server.openai.listing import list_query
from kvswap.server.openai.routes_stored import chains_of
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.schemas import Body, parse_body
from kvswap.server.state import get_state

router = APIRouter()
PREFIXES = ("/v1/conversations", "/conversations")


class ConversationBody(Body):
    """POST /v1/conversations and POST /v1/conversations/{id} (there `metadata` is required)."""

    items: list[Any] | None = None
    metadata: dict[str, Any] | None = None


class ItemsBody(Body):
    items: list[Any]


def conversation_json(conv: ConversationRecord) -> dict[str, Any]:
    return {
        "id": conv.id,
        "object": "conversation",
        "created_at": int(conv.created_at),
        "metadata": conv.metadata,
    }


async def _body(request: Request, model: type[Body]) -> Any:
    raw = await request.body()
    return await prepared(raw, lambda: parse_body(model, raw or b"{}"))


async def create(request: Request) -> Response:
    state = get_state(request)
    body: ConversationBody = await _body(request, ConversationBody)
    items, meta = new_items(body.items), metadata(body.metadata)
    chains = chains_of(state)
    ns = tenant_namespace(request.scope)
    conv = await chains.run(chains.records.create_conversation, ns, new_id("conv_"), items, meta)
    return JSONResponse(conversation_json(conv))


async def retrieve(request: Request, conversation_id: str) -> Response:
    state = get_state(request)
    chains = chains_of(state)
    ns = tenant_namespace(request.scope)
    conv = await chains.run(chains.records.conversation, ns, conversation_id)
    if conv is None:
        raise ConversationNotFound(conversation_id)
    return JSONResponse(conversation_json(conv))


async def update(request: Request, conversation_id: str) -> Response:
    state = get_state(request)
    body: ConversationBody = await _body(request, ConversationBody)
    if body.metadata is None:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "Missing required parameter: 'metadata'.", param="metadata"
        )
    chains = chains_of(state)
    ns = tenant_namespace(request.scope)
    meta = metadata(body.metadata)
    conv = await chains.run(chains.records.update_conversation, ns, conversation_id, meta)
    if conv is None:
        raise ConversationNotFound(conversation_id)
    return JSONResponse(conversation_json(conv))


async def delete(request: Request, conversation_id: str) -> Response:
    state = get_state(request)
    if not await chains_of(state).delete_conversation(
        tenant_namespace(request.scope), conversation_id
    ):
        raise ConversationNotFound(conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def add_items(request: Request, conversation_id: str) -> Response:
    state = get_state(request)
    body: ItemsBody = await _body(request, ItemsBody)
    items = new_items(body.items)
    chains = chains_of(state)
    ns = tenant_namespace(request.scope)
    if not await chains.run(chains.records.add_items, ns, conversation_id, items):
        raise ConversationNotFound(conversation_id)
    ids = [item["id"] for item in items]
    return JSONResponse(
        {
            "object": "list",
            "data": items,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
            "has_more": False,
        }
    )


async def list_items(request: Request, conversation_id: str) -> Response:
    state = get_state(request)
    query = list_query(request.query_params)
    chains = chains_of(state)
    ns = tenant_namespace(request.scope)
    items = await chains.run(chains.records.conversation_items, ns, conversation_id)
    if items is None:
        raise ConversationNotFound(conversation_id)
    return JSONResponse(
        page_of(items, after=query.after, limit=query.limit, order=query.order).json()
    )


async def _conversation_of(request: Request, conversation_id: str) -> tuple[StoredChains, str]:
    """The store and the caller's namespace, once the conversation is the caller's (404)."""
    chains = chains_of(get_state(request))
    ns = tenant_namespace(request.scope)
    if await chains.run(chains.records.conversation, ns, conversation_id) is None:
        raise ConversationNotFound(conversation_id)
    return chains, ns


async def retrieve_item(request: Request, conversation_id: str, item_id: str) -> Response:
    chains, ns = await _conversation_of(request, conversation_id)
    item = await chains.run(chains.records.conversation_item, ns, conversation_id, item_id)
    if item is None:
        raise ItemNotFound(item_id)
    return JSONResponse(item)


async def delete_item(request: Request, conversation_id: str, item_id: str) -> Response:
    chains, ns = await _conversation_of(request, conversation_id)
    conv = await chains.run(chains.records.delete_conversation_item, ns, conversation_id, item_id)
    if conv is None:
        raise ItemNotFound(item_id)
    return JSONResponse(conversation_json(conv))


for prefix in PREFIXES:
    router.add_api_route(prefix, create, methods=["POST"])
    router.add_api_route(prefix + "/{conversation_id}", retrieve, methods=["GET"])
    router.add_api_route(prefix + "/{conversation_id}", update, methods=["POST"])
    router.add_api_route(prefix + "/{conversation_id}", delete, methods=["DELETE"])
    router.add_api_route(prefix + "/{conversation_id}/items", add_items, methods=["POST"])
    router.add_api_route(prefix + "/{conversation_id}/items", list_items, methods=["GET"])
    items_path = prefix + "/{conversation_id}/items/{item_id}"
    router.add_api_route(items_path, retrieve_item, methods=["GET"])
    router.add_api_route(items_path, delete_item, methods=["DELETE"])
