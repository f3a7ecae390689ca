"""POST /slots/{id_slot}?action=... (save, restore, erase, page_out, page_in, spill, page_drop)
and GET /pages.

The engine thread only captures or applies state (RAM bytes); files are written and read by the
publisher on a worker thread, so a save, restore or spill never blocks decoding. Slot verbs wait
in order behind work queued on their slot; a client that disconnects while its verb waits
cancels it. `spill` and `page_drop` act on the page store only (`{id_slot}` is validated and
ignored), so they never wait behind a slot.

`save`, `erase` and `page_out` on a slot holding a mind act on the mind (the answer names it):
save writes its state, erase and page_out end it (its spilled copy is removed, so no tier holds
it; after page_out the page is its state). With API keys they are refused, typed and naming no
mind, when the mind is another key's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.engine.commands import (
    Applied,
    Captured,
    Erased,
    PageIn,
    PageMoved,
    PageOut,
    Reply,
    SlotApply,
    SlotCapture,
    SlotErase,
    SlotVerb,
)
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.minds.registry import KEY_PREFIX, is_mind_key
from kvswap.files import FilesError, Publisher, validate_filename, validate_page_name
from kvswap.server.formats import slot_erase_json, slot_restore_json, slot_save_json
from kvswap.server.openapi import body_schema
from kvswap.server.pages import formats_cluster
from kvswap.server.pages.formats_pages import minds_json, page_moved_json, pages_json, spill_json
from kvswap.server.pages.minds import caller_namespace, mind_name
from kvswap.server.requests.schemas import SlotFileRequest, SpillRequest, parse_body
from kvswap.server.state import ServerState, get_state
from kvswap.tiers.slotfiles import files_error, publish_state, read_state

router = APIRouter()

SLOT_ACTIONS = ("save", "restore", "erase", "page_out", "page_in", "spill", "page_drop")


async def _in_worker(
    state: ServerState, fn: Callable[..., Any], *args: Any, then: Callable[[], None] | None = None
) -> Any:
    """Run `fn` on an I/O worker. `then` runs once the worker is done, even when this handler
    is cancelled first (a client gone): buffers the worker reads are released only then."""
    future = asyncio.get_running_loop().run_in_executor(state.io, fn, *args)
    if then is not None:
        future.add_done_callback(lambda _: then())
    return await asyncio.shield(future)


def _publisher(state: ServerState) -> Publisher:
    if state.publisher is None:
        raise KvswapError(
            ErrorKind.NOT_SUPPORTED,
            "This server does not support slots action (start it with --slot-save-path).",
        )
    return state.publisher


def _store(state: ServerState) -> PageStore:
    if state.store is None:
        raise StoreOff("the page store is off (--page-ram-bytes 0)")
    return state.store


def _name(validate: Callable[[str], str], name: str, verb: str) -> str:
    try:
        return validate(name)
    except FilesError as err:
        raise files_error(err, verb) from err


async def _verb(
    state: ServerState,
    request: Request,
    make: Callable[[int, Reply], SlotVerb],
    on_reply: Callable[[Any], None] | None = None,
) -> Any:
    return await state.client.call(make, request.is_disconnected, on_reply)


@router.post("/slots/{id_slot}", openapi_extra=body_schema(SlotFileRequest, SpillRequest))
async def slot_action(
    id_slot: int, request: Request, action: str = "", page: str = ""
) -> JSONResponse:
    state = get_state(request)
    if action not in SLOT_ACTIONS:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"Invalid action: {action!r} (one of {', '.join(SLOT_ACTIONS)})",
        )
    namespace = caller_namespace(request.headers, keyed=bool(state.config.http.api_keys))
    if action == "erase":
        erased: Erased = await _verb(
            state, request, lambda rid, reply: SlotErase(rid, id_slot, reply, namespace)
        )
        if erased.mind:
            await state.minds.forget(erased.mind)
        answer = slot_erase_json(erased.slot_id, erased.n_erased)
        return JSONResponse(_with_mind(answer, erased.mind, namespace))
    if action in ("save", "restore"):
        publisher = _publisher(state)
        body = parse_body(SlotFileRequest, await request.body())
        filename = _name(validate_filename, body.filename, f"{action} slot")
        if action == "save":
            return await _save(state, publisher, request, id_slot, filename, namespace)
        return await _restore(state, publisher, request, id_slot, filename)
    store = _store(state)
    name = _name(validate_page_name, page, action)
    if is_mind_key(name):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"page names starting with {KEY_PREFIX!r} belong to minds; name the mind in a request",
        )
    if action == "page_out":
        moved: PageMoved = await _verb(
            state, request, lambda rid, reply: PageOut(rid, id_slot, name, reply, namespace)
        )
        if moved.mind:
            await state.minds.forget(moved.mind)
        answer = page_moved_json(moved, page_in=False)
        return JSONResponse(_with_mind(answer, moved.mind, namespace))
    if action == "page_in":
        moved = await _verb(state, request, lambda rid, reply: PageIn(rid, id_slot, name, reply))
        return JSONResponse(page_moved_json(moved, page_in=True))
    if not 0 <= id_slot < len(state.snapshot.slots):
        raise KvswapError(ErrorKind.INVALID_REQUEST, "Invalid slot ID")
    if action == "page_drop":
        store.drop(name)
        return JSONResponse({"page": name, "dropped": True})
    return await _spill(state, store, request, name)


def _with_mind(body: dict[str, Any], key: str, namespace: str) -> dict[str, Any]:
    """A verb's answer, naming the mind it acted on (the caller's own: others are refused)."""
    name = mind_name(key, namespace)
    return {**body, "mind": name} if name is not None else body


async def _save(
    state: ServerState,
    publisher: Publisher,
    request: Request,
    id_slot: int,
    filename: str,
    namespace: str,
) -> JSONResponse:
    t0 = time.perf_counter()
    captured: Captured = await _verb(
        state, request, lambda rid, reply: SlotCapture(rid, id_slot, reply, namespace)
    )
    try:
        receipt = await _in_worker(
            state,
            publish_state,
            publisher,
            filename,
            captured.buffer,
            captured.layout,
            then=captured.buffer.close,
        )
    except FilesError as err:
        raise files_error(err, "save slot") from err
    ms = (time.perf_counter() - t0) * 1e3
    body = slot_save_json(id_slot, filename, captured.layout.n_tokens, receipt.n_bytes, ms)
    return JSONResponse(_with_mind(body, captured.mind, namespace))


async def _restore(
    state: ServerState, publisher: Publisher, request: Request, id_slot: int, filename: str
) -> JSONResponse:
    t0 = time.perf_counter()
    try:
        read = await _in_worker(
            state, read_state, publisher, filename, state.snapshot.page_geometry
        )
    except FilesError as err:
        raise files_error(err, "restore slot") from err
    applied: Applied = await _verb(
        state,
        request,
        lambda rid, reply: SlotApply(rid, id_slot, read.state, reply),
        on_reply=lambda _: read.close(),
    )
    ms = (time.perf_counter() - t0) * 1e3
    return JSONResponse(
        slot_restore_json(id_slot, filename, applied.n_tokens, read.n_bytes_read, ms)
    )


async def _spill(state: ServerState, store: PageStore, request: Request, name: str) -> JSONResponse:
    publisher = _publisher(state)
    body = parse_body(SpillRequest, await request.body())
    filename = _name(validate_filename, body.filename, "spill")
    t0 = time.perf_counter()
    page = store.hold(name)  # a running spill is an owner: the page stays counted until it ends

    def spill() -> tuple[int, bool]:
        receipt = publish_state(publisher, filename, page.buffer, page.layout)
        # `drop` frees this generation only: a page stored under the name meanwhile stays.
        return receipt.n_bytes, body.drop and store.remove(name, page.generation)

    try:
        n_written, dropped = await _in_worker(state, spill, then=lambda: store.release(page))
    except FilesError as err:
        raise files_error(err, "spill") from err
    ms = (time.perf_counter() - t0) * 1e3
    return JSONResponse(spill_json(name, filename, page.layout.n_tokens, n_written, dropped, ms))


@router.get("/pages")
async def pages(request: Request) -> JSONResponse:
    state = get_state(request)
    store = _store(state)
    body = pages_json(store.usage(), store.ceiling_bytes)
    body["minds"] = minds_json(state.minds.views(), time.time())
    body["disk_n_bytes"] = state.minds.disk_bytes()
    body["disk_ceiling_bytes"] = state.demoter.policy.page_disk_bytes  # None: no bound
    if state.cluster is not None:
        body["shared_tier"] = formats_cluster.pages_json(await state.cluster.view())
    return JSONResponse(body)
