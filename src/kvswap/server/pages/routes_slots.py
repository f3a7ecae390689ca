"""POST /slots/{id_slot}?action=... (save, restore, erase, page_out, page_in, spill, page_drop)
and GET /pages.

The engine thread only captures or applies state (RAM bytes); files are written and read by the
publisher on a worker thread, so a save, restore or spill never blocks decoding. Slot verbs wait
in order behind work queued on their slot; a client that disconnects while its verb waits
cancels it. `spill` and `page_drop` act on the page store only (`{id_slot}` is validated and
ignored), so they never wait behind a slot.

`save`, `erase` and `page_out` on a slot holding a mind act on the mind (the answer names it):
save writes its state, erase and page_out end it (its spilled copy is removed, so no tier holds
it; after page_out the page is its state). They are refused, typed and naming no mind, when the
mind is another key's.

Tenants: a page name is always a client page of the caller's own namespace
(`core.keys.page_key` with `asgi.tenant_namespace`), so no verb can reach another key's pages
or any page the server made (minds, the anonymous cache), and GET /pages lists only the
caller's own pages and minds. Minds' files live in a folder no `filename` can name
(`tiers.mindfiles`), so save, restore and spill cannot reach them either. Slot files are the
save path's own on a server without API keys (llama-server's layout); with `--api-key`, each
key's are in a folder of its own (`<save>/.kvswap-keys/<namespace>/`), so one key can neither
save over nor restore (and so probe) another key's files.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.core.keys import PageKey, PageKind, page_key
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
from kvswap.files import FilesError, Publisher, validate_filename, validate_page_name
from kvswap.minds.names import mind_name
from kvswap.server import formats_cluster
from kvswap.server.asgi import tenant_namespace
from kvswap.server.formats import slot_erase_json, slot_restore_json, slot_save_json
from kvswap.server.openapi import body_schema
from kvswap.server.pages.formats_pages import minds_json, page_moved_json, pages_json, spill_json
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


def _publisher(state: ServerState, namespace: str) -> Publisher:
    """The caller's slot files (its key's own folder on a keyed server)."""
    found = state.slot_files(namespace)
    if found is None:
        raise KvswapError(
            ErrorKind.NOT_SUPPORTED,
            "This server does not support slots action (start it with --slot-save-path).",
        )
    return found


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
    namespace = tenant_namespace(request.scope)
    if action == "erase":
        erased: Erased = await _verb(
            state, request, lambda rid, reply: SlotErase(rid, id_slot, reply, namespace)
        )
        if erased.mind:
            await state.minds.forget(erased.mind)
        answer = slot_erase_json(erased.slot_id, erased.n_erased)
        return JSONResponse(_with_mind(answer, erased.mind, namespace))
    if action in ("save", "restore"):
        publisher = _publisher(state, namespace)
        body = parse_body(SlotFileRequest, await request.body())
        filename = _name(validate_filename, body.filename, f"{action} slot")
        if action == "save":
            return await _save(state, publisher, request, id_slot, filename, namespace)
        return await _restore(state, publisher, request, id_slot, filename, namespace)
    store = _store(state)
    key = page_key(namespace, _name(validate_page_name, page, action))
    if action == "page_out":
        moved: PageMoved = await _verb(
            state, request, lambda rid, reply: PageOut(rid, id_slot, key, reply, namespace)
        )
        if moved.mind:
            await state.minds.forget(moved.mind)
        answer = page_moved_json(moved, page_in=False)
        return JSONResponse(_with_mind(answer, moved.mind, namespace))
    if action == "page_in":
        moved = await _verb(
            state, request, lambda rid, reply: PageIn(rid, id_slot, key, reply, namespace)
        )
        return JSONResponse(page_moved_json(moved, page_in=True))
    if not 0 <= id_slot < len(state.snapshot.slots):
        raise KvswapError(ErrorKind.INVALID_REQUEST, "Invalid slot ID")
    if action == "page_drop":
        store.drop(key)
        return JSONResponse({"page": key.name, "dropped": True})
    return await _spill(state, store, request, key)


def _with_mind(body: dict[str, Any], key: PageKey | None, namespace: str) -> dict[str, Any]:
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
    state: ServerState,
    publisher: Publisher,
    request: Request,
    id_slot: int,
    filename: str,
    namespace: str,
) -> JSONResponse:
    t0 = time.perf_counter()
    try:
        # Into a buffer off the page store's shelf when one fits (faulted in already: a fresh
        # gigabyte faults 1-2 GB/s here, slower than the read), as a mind's read back does.
        read = await _in_worker(
            state, read_state, publisher, filename, state.snapshot.page_geometry, state.store
        )
    except FilesError as err:
        raise files_error(err, "restore slot") from err
    applied: Applied = await _verb(
        state,
        request,
        lambda rid, reply: SlotApply(rid, id_slot, read.state, reply, namespace),
        on_reply=lambda _: read.close(),
    )
    ms = (time.perf_counter() - t0) * 1e3
    return JSONResponse(
        slot_restore_json(id_slot, filename, applied.n_tokens, read.n_bytes_read, ms)
    )


async def _spill(
    state: ServerState, store: PageStore, request: Request, key: PageKey
) -> JSONResponse:
    publisher = _publisher(state, key.namespace)
    body = parse_body(SpillRequest, await request.body())
    filename = _name(validate_filename, body.filename, "spill")
    t0 = time.perf_counter()
    page = store.hold(key)  # a running spill is an owner: the page stays counted until it ends

    def spill() -> tuple[int, bool]:
        receipt = publish_state(publisher, filename, page.buffer, page.layout)
        # `drop` frees this generation only: a page stored under the name meanwhile stays.
        return receipt.n_bytes, body.drop and store.remove(key, page.generation)

    try:
        n_written, dropped = await _in_worker(state, spill, then=lambda: store.release(page))
    except FilesError as err:
        raise files_error(err, "spill") from err
    ms = (time.perf_counter() - t0) * 1e3
    return JSONResponse(
        spill_json(key.name, filename, page.layout.n_tokens, n_written, dropped, ms)
    )


@router.get("/pages")
async def pages(request: Request) -> JSONResponse:
    """The caller's own pages and minds; the store's totals, its prepared spare buffers and
    the anonymous cache's bytes (so a 503 is explained), nothing of other tenants but a sum."""
    state = get_state(request)
    store = _store(state)
    namespace = tenant_namespace(request.scope)
    usage = store.usage()
    infos = usage.pages
    own = [i for i in infos if i.key.kind is PageKind.PAGE and i.key.namespace == namespace]
    body = pages_json(own, usage.charged_bytes, store.ceiling_bytes)
    minds = state.minds.views(namespace)
    body["minds"] = minds_json(minds, time.time())
    reserved = usage.reserved_bytes
    spares = [(k, n) for k, n in reserved.items() if k.kind is PageKind.SPARE]
    body["spares"] = [{"purpose": k.name, "n_bytes": n} for k, n in sorted(spares)]
    copies = [(k, n) for k, n in reserved.items() if k.kind is not PageKind.SPARE]
    body["copies_under_way"] = [
        {"name": k.name, "n_bytes": n} for k, n in sorted(copies) if k.namespace == namespace
    ]
    body["closing_bytes"] = usage.closing_bytes + usage.leaked_bytes
    body["anon_cache_bytes"] = sum(i.n_bytes for i in infos if i.key.kind is PageKind.ANON)
    shown = sum(i.n_bytes for i in own) + sum(m.n_bytes for m in minds if m.tier == "ram")
    shown += sum(n for _, n in spares) + body["anon_cache_bytes"] + body["closing_bytes"]
    shown += sum(c["n_bytes"] for c in body["copies_under_way"])
    body["other_bytes"] = max(0, usage.charged_bytes - shown)  # other tenants' pages and copies
    body["disk_tier"] = state.save_dir is not None  # --slot-save-path: minds may go to disk
    body["disk_n_bytes"] = state.minds.disk_bytes(namespace)
    body["disk_ceiling_bytes"] = state.demoter.policy.page_disk_bytes  # None: no bound
    if state.chains is not None:  # the caller's stored conversations, beside their minds
        chains = state.chains
        body["stored"] = await chains.run(chains.records.listing, namespace)
    if state.shared_minds is not None:
        body["shared_tier"] = formats_cluster.pages_json(await state.shared_minds.view(), namespace)
    return JSONResponse(body)
