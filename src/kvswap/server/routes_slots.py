"""POST /slots/{id_slot}?action=save|restore|erase, as llama-server.

The engine thread only captures or applies state (RAM bytes); the files are written and read
by the publisher on a worker thread, so a save or restore never blocks decoding. A verb waits
in order behind work queued on its slot; a client that disconnects while it waits cancels it.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvswap.engine.commands import Applied, Captured, Erased, SlotApply, SlotCapture, SlotErase
from kvswap.engine.types import ErrorKind, KvswapError
from kvswap.files import FilesError, Publisher, validate_filename
from kvswap.files.seqfile import file_parts
from kvswap.server.formats import slot_erase_json, slot_restore_json, slot_save_json
from kvswap.server.openapi import body_schema
from kvswap.server.schemas import SlotFileRequest, parse_body
from kvswap.server.state import ServerState, get_state

router = APIRouter()

_FILES_KINDS = {
    "invalid": ErrorKind.INVALID_REQUEST,
    "not_found": ErrorKind.NOT_FOUND,
    "corrupt": ErrorKind.INVALID_REQUEST,
    "io": ErrorKind.SERVER,
}


def files_error(err: FilesError, verb: str) -> KvswapError:
    return KvswapError(_FILES_KINDS[err.kind], f"Unable to {verb} slot: {err}")


def _publisher(state: ServerState) -> Publisher:
    if state.publisher is None:
        raise KvswapError(
            ErrorKind.NOT_SUPPORTED,
            "This server does not support slots action (start it with --slot-save-path).",
        )
    return state.publisher


def drop_frames(err: BaseException | None) -> None:
    """Clear the locals of the frames an exception (and its causes) carries."""
    while err is not None:
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


async def _in_worker(state: ServerState, fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(state.io, fn, *args)


@router.post("/slots/{id_slot}", openapi_extra=body_schema(SlotFileRequest))
async def slot_action(id_slot: int, request: Request, action: str = "") -> JSONResponse:
    state = get_state(request)
    client = state.engine_client()
    if action == "erase":
        erased: Erased = await client.call(
            lambda rid, reply: SlotErase(rid, id_slot, reply), request.is_disconnected
        )
        return JSONResponse(slot_erase_json(erased.slot_id, erased.n_erased))
    if action not in ("save", "restore"):
        raise KvswapError(ErrorKind.INVALID_REQUEST, f"Invalid action: {action!r}")
    publisher = _publisher(state)
    body = parse_body(SlotFileRequest, await request.body())
    try:
        filename = validate_filename(body.filename)
    except FilesError as err:
        raise files_error(err, action) from err
    if action == "save":
        return await _save(state, publisher, request, id_slot, filename)
    return await _restore(state, publisher, request, id_slot, filename)


async def _save(
    state: ServerState, publisher: Publisher, request: Request, id_slot: int, filename: str
) -> JSONResponse:
    client = state.engine_client()
    t0 = time.perf_counter()
    captured: Captured = await client.call(
        lambda rid, reply: SlotCapture(rid, id_slot, reply), request.is_disconnected
    )
    try:
        receipt = await _in_worker(
            state, _publish_captured, publisher, filename, captured, state.model.info.fingerprint
        )
    except FilesError as err:
        raise files_error(err, "save") from err
    finally:
        captured.state.close()
    ms = (time.perf_counter() - t0) * 1e3
    return JSONResponse(
        slot_save_json(id_slot, filename, len(captured.tokens), receipt.n_bytes, ms)
    )


def _publish_captured(
    publisher: Publisher, filename: str, captured: Captured, fingerprint: str
) -> Any:
    """Write a captured state as `F` (worker thread).

    Every view of the buffer dies here, also on failure (the frames an exception carries would
    otherwise keep them alive), so the caller can close the buffer.
    """
    view = memoryview(captured.state)[: captured.n_bytes]
    parts = file_parts(captured.tokens, view)
    try:
        return publisher.publish(filename, {"": parts}, fingerprint)
    except BaseException as err:
        drop_frames(err)
        raise
    finally:
        del parts
        view.release()


async def _restore(
    state: ServerState, publisher: Publisher, request: Request, id_slot: int, filename: str
) -> JSONResponse:
    client = state.engine_client()
    t0 = time.perf_counter()
    try:
        gen = await _in_worker(
            state, publisher.read_generation, filename, state.model.info.fingerprint
        )
    except FilesError as err:
        raise files_error(err, "restore") from err
    try:
        applied: Applied = await client.call(
            lambda rid, reply: SlotApply(rid, id_slot, gen.tokens, gen.state, reply),
            request.is_disconnected,
        )
    finally:
        gen.close()
    ms = (time.perf_counter() - t0) * 1e3
    return JSONResponse(
        slot_restore_json(id_slot, filename, applied.n_tokens, gen.n_bytes_read, ms)
    )
