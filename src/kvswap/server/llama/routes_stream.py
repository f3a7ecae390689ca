"""llama-server's resumable stream routes, for answers streamed with `X-Conversation-Id`
(`server.resumable`), in the caller's tenant namespace:

- `GET /v1/stream?conv_id=ID&from=N`: the conversation's stream from byte N (default 0) as
  `text/event-stream`, what is buffered first, then live bytes until it ends; 404 when there
  is none (never streamed, stopped, or finished more than 5 minutes ago), 400 when N is not a
  number or below the bytes the 4 MiB buffer dropped.
- `DELETE /v1/stream?conv_id=ID`: stop it (its generation is cancelled) and forget it; 204,
  whether or not there was one.
- `POST /v1/streams/lookup` `{"conversation_ids": [...]}`: the status of the caller's streams
  whose id is one of those or `<id>::<model>` (no listing of ids nobody asked about).

The id travels in the query string, as llama-server's (it may hold a model name with slashes).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.server.asgi import tenant_namespace
from kvswap.server.resumable import OffsetLost, ResumableStream
from kvswap.server.state import get_state

router = APIRouter()


def _conv_id(request: Request) -> str:
    conv_id = request.query_params.get("conv_id", "")
    if not conv_id:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "Missing conversation id in path")
    return conv_id


@router.get("/v1/stream")
async def get_stream(request: Request) -> Response:
    state = get_state(request)
    key = (tenant_namespace(request.scope), _conv_id(request))
    stream = state.streams.get(key)
    if stream is None:
        raise KvswapError(ErrorKind.NOT_FOUND, "Stream not found or expired")
    raw_from = request.query_params.get("from", "") or "0"
    if not raw_from.isdigit():
        raise KvswapError(ErrorKind.INVALID_REQUEST, "Invalid 'from' offset")
    offset = int(raw_from)
    if offset < stream.n_dropped:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "Stream offset lost, please restart")
    return StreamingResponse(
        _replay(stream, offset),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def _replay(stream: ResumableStream, offset: int) -> Any:
    try:
        async for chunk in stream.read_from(offset):
            yield chunk
    except OffsetLost:
        return  # the reader fell behind the 4 MiB it keeps: the client restarts


@router.delete("/v1/stream")
async def delete_stream(request: Request) -> Response:
    state = get_state(request)
    state.streams.stop((tenant_namespace(request.scope), _conv_id(request)))
    return Response(status_code=204)


@router.post("/v1/streams/lookup")
async def lookup_streams(request: Request) -> JSONResponse:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as err:
        raise KvswapError(ErrorKind.INVALID_REQUEST, f"invalid body: {err}") from err
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    wanted = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
    found = get_state(request).streams.lookup(tenant_namespace(request.scope), wanted)
    return JSONResponse(
        [
            {
                "conversation_id": s.conversation_id,
                "is_done": s.done,
                "total_bytes": s.n_bytes,
                "started_at": int(s.t_started_unix_s),
                "completed_at": int(s.t_ended_unix_s),
            }
            for s in found
        ]
    )
