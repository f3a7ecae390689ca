"""POST /reconfigure: change n_ctx, n_parallel, batch sizes and KV types live.

The route validates the body, posts the command, and answers the receipt: each phase's time,
the bytes moved, and what became of every slot. A refusal or a rollback is a typed error
carrying the same receipt where there is one. `/health`, `/props`, `/slots` and `/metrics`
keep answering from the engine's snapshot while it runs.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.commands import Reconfigure, ReconfigureReceipt, SlotFate
from kvswap.engine.plan.geometry import Geometry, ReconfigureSpec
from kvswap.server.asgi import tenant_namespace
from kvswap.server.formats import KvGeometry, kv_geometry_json
from kvswap.server.openapi import body_schema
from kvswap.server.requests.schemas import Body, parse_body
from kvswap.server.state import get_state

router = APIRouter()


class ReconfigureBody(Body):
    """Omitted fields keep their value. An unknown field is a 400 naming it: a typo must not
    run a whole drain and rebuild that changes nothing."""

    n_ctx: int | None = Field(default=None, ge=1)
    n_parallel: int | None = Field(default=None, ge=1, le=256)
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    cache_type_k_draft: str | None = None
    cache_type_v_draft: str | None = None
    n_batch: int | None = Field(default=None, ge=1)
    n_ubatch: int | None = Field(default=None, ge=1)
    force: bool = False
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(
                    f"unknown field(s) {', '.join(map(repr, unknown))}; /reconfigure takes "
                    + ", ".join(cls.model_fields)
                )
        return data


def geometry_json(g: Geometry, n_ctx_slot: int) -> dict[str, Any]:
    """A geometry of the receipt, with its slot window."""
    kv = kv_geometry_json(KvGeometry.of(g, n_ctx=g.n_ctx, n_ctx_slot=n_ctx_slot))
    return kv | {"generation": g.generation}


def fate_json(f: SlotFate, namespace: str) -> dict[str, Any]:
    """One slot's fate; the page that keeps a mind is named only to that mind's tenant."""
    out = asdict(f)
    own = f.page is not None and f.page.namespace == namespace
    out["page"] = f.page.name if own and f.page is not None else None
    return out


def receipt_json(r: ReconfigureReceipt, namespace: str) -> dict[str, Any]:
    return {
        "old": geometry_json(r.old, r.old_n_ctx_slot),
        "new": geometry_json(r.new, r.n_ctx_slot),
        "timings": {k: round(v, 3) for k, v in r.timings_ms.items()},
        "n_bytes_moved": r.n_bytes_moved,
        "slots": [fate_json(f, namespace) for f in r.slots],
        "rolled_back": r.rolled_back,
        "reason": r.reason,
    }


@router.post("/reconfigure", openapi_extra=body_schema(ReconfigureBody))
async def reconfigure(request: Request) -> JSONResponse:
    state = get_state(request)
    namespace = tenant_namespace(request.scope)
    body = parse_body(ReconfigureBody, await request.body())
    if body.cache_type_k_draft is not None or body.cache_type_v_draft is not None:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            "this server has no draft model: cache_type_*_draft do not apply"
            if state.config.spec.spec_type != "draft-simple"
            else "the draft model's KV types cannot change live yet (restart with -ctkd/-ctvd)",
        )
    spec = ReconfigureSpec(
        n_ctx=body.n_ctx,
        n_parallel=body.n_parallel,
        cache_type_k=body.cache_type_k,
        cache_type_v=body.cache_type_v,
        n_batch=body.n_batch,
        n_ubatch=body.n_ubatch,
        force=body.force,
        drain_timeout_s=body.drain_timeout_s,
    )
    try:
        receipt: ReconfigureReceipt = await state.client.call(
            lambda rid, reply: Reconfigure(rid, spec, reply)
        )
    except KvswapError as err:
        rolled = err.extra.pop("receipt", None)
        if isinstance(rolled, ReconfigureReceipt):
            err.extra["receipt"] = receipt_json(rolled, namespace)
        raise
    return JSONResponse(receipt_json(receipt, namespace))
