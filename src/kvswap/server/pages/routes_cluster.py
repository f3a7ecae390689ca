"""POST /cluster/handoff: another replica asks this one to give a mind up (kvswap's own, only
on a replica of a cluster, `--shared-tier`).

Body `{"mind": NAME}`, the mind named in the caller's namespace (its API key), as a turn names
it. Once no request of the mind runs here (its lock is taken), the mind is published to the
shared tier, its lease released and its copies here dropped: the asking replica's next turn of
the mind takes it over with no wait and no re-prefill. Answers `{"mind", "handed_off",
"replica"}`; `handed_off` is false when this replica does not hold the mind, or could not
publish it (it then keeps it).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.minds.names import request_mind
from kvswap.server.asgi import tenant_namespace
from kvswap.server.openapi import body_schema
from kvswap.server.requests.schemas import Body, parse_body
from kvswap.server.state import get_state

router = APIRouter()


class HandoffRequest(Body):
    """POST /cluster/handoff: the mind to give up."""

    mind: str


@router.post("/cluster/handoff", openapi_extra=body_schema(HandoffRequest))
async def handoff(request: Request) -> JSONResponse:
    state = get_state(request)
    shared = state.shared_minds
    if shared is None:
        raise KvswapError(
            ErrorKind.NOT_SUPPORTED, "this server is not in a cluster (--shared-tier)"
        )
    body = parse_body(HandoffRequest, await request.body())
    header = request.headers.get("x-mind-id")
    key = request_mind(header, body.mind, tenant_namespace(request.scope))
    assert key is not None  # the body names it
    async with state.minds.exclusive(key):
        done = await shared.hand_off(key)
    return JSONResponse({"mind": body.mind, "handed_off": done, "replica": shared.replica_id})
