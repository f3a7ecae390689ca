"""GET and POST /lora-adapters: the loaded LoRA adapters and their global scales.

As llama-server: GET lists `{id, path, scale, task_name, prompt_prefix}` per adapter in load
order; POST takes `[{"id", "scale"}, ...]`, sets the listed adapters' global scales and every
other one to 0, and answers `{"success": true}`. The global scales apply to requests that carry
no `lora` field of their own, from the next request on.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import RootModel

from kvswap.server.openapi import body_schema
from kvswap.server.requests.lora import parse_entries
from kvswap.server.requests.schemas import LoraEntry
from kvswap.server.state import get_state

router = APIRouter()


class LoraScalesBody(RootModel[list[LoraEntry]]):
    """POST /lora-adapters' body, as published in the OpenAPI document."""


@router.get("/lora-adapters")
async def get_lora_adapters(request: Request) -> JSONResponse:
    return JSONResponse(get_state(request).lora.adapters_json())


@router.post("/lora-adapters", openapi_extra=body_schema(LoraScalesBody))
async def post_lora_adapters(request: Request) -> JSONResponse:
    state = get_state(request)
    state.lora.set_global(parse_entries(await request.body()))
    return JSONResponse({"success": True})
