"""GET /minds/{name}: one of the caller's minds, its history as text and as chat messages (the
web page opens a mind with it); POST /minds/{name}?action=page_out|page_in|spill|drop: move it
between the tiers without a request (the web page's mind actions). kvswap's own.

GET answers `{"mind", "tier", "n_tokens", "text", "messages"}`: `text` is its tokens as text
(special tokens written out), `messages` the system, user and assistant messages that render
those tokens again through the chat template (`text.transcript`), or null where they cannot be
told apart (a raw /completion prompt, a template that frames turns unalike): a chat turn that
sends those messages and a new user message extends the mind, and prefills only the new
tokens. The tokens are read where the mind lives (its slot or RAM page, on the engine thread;
its spilled file's header, on the I/O executor), while the mind is held, so no turn changes
them meanwhile; nothing moves. In a cluster, a mind another live replica owns is read there (the request goes
on to its owner through the forwarder, as a turn does).

- `page_out`: from its slot to its RAM page (a mind not in a slot stays where it is);
- `page_in`: into a slot, as a request naming it would be seated (from RAM, or read back from
  disk);
- `spill`: to disk, leaving its slot and RAM (needs `--slot-save-path`);
- `drop`: out of every tier: its slot is cleared, its RAM page and its files removed.

Each verb holds the mind as a request's turn does (`MindSession.turn`: its lock, so a move never
races a turn of the same mind; in a cluster the mind is placed first, so a verb sent to a
replica that does not own the mind goes on to its owner through the forwarder, as a turn does,
and a drop leaves the shared tier too, inside the mind's lock). The name is the caller's own,
in its tenant namespace: another tenant's mind cannot be named, and a mind that lives nowhere
is a 404. The answer is `{"mind", "action", "tier"}`, the tier after the move ("slot", "ram",
"disk", or "none" after a drop).
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvswap.core.errors import ErrorKind, KvswapError, MindMovedToDisk
from kvswap.core.keys import PageKey, mind_key
from kvswap.core.page import SlotState
from kvswap.core.vocab import MindAction, MindMove, MindTier
from kvswap.engine.commands import MindTokens, MindVerb
from kvswap.files import FilesError
from kvswap.minds.session import HeldMind
from kvswap.server.asgi import tenant_namespace
from kvswap.server.requests.chat import render_plain
from kvswap.server.state import ServerState, get_state
from kvswap.server.turnfacts import turn_facts
from kvswap.text.transcript import history
from kvswap.tiers.mindfiles import tokens_on_disk
from kvswap.tiers.slotfiles import files_error

router = APIRouter()


@router.get("/minds/{name}")
async def mind_history(name: str, request: Request) -> JSONResponse:
    state = get_state(request)
    key = mind_key(tenant_namespace(request.scope), name)
    if state.shared_minds is not None:  # another replica owns it: the read goes there
        await state.shared_minds.to_owner(key, turn_facts(request.scope, b""))
    tier = state.minds.tier(key)
    tokens = await _tokens(state, key) if tier is not None else None
    if tier is None or tokens is None:
        raise KvswapError(ErrorKind.NOT_FOUND, f"no mind named {name!r}")
    text = state.vocab.detokenize([int(t) for t in tokens], special=True)
    template = state.template
    if template.add_bos and text.startswith(template.bos_token):
        text = text[len(template.bos_token) :]  # the vocabulary's, not the template's
    messages = history(text, lambda m, gen: render_plain(state, m, gen))
    return JSONResponse(
        {"mind": name, "tier": tier, "n_tokens": len(tokens), "text": text, "messages": messages}
    )


async def _tokens(state: ServerState, key: PageKey) -> npt.NDArray[np.int32] | None:
    """Mind `key`'s tokens where it lives, read while it is held; None: it lives nowhere."""
    async with state.minds.hold(key) as held:
        tokens: npt.NDArray[np.int32] | None = await state.client.call(
            lambda _, reply: MindTokens(key, reply)
        )
        if tokens is not None or not held.on_disk_only or state.minds_files is None:
            return tokens
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(state.io, tokens_on_disk, state.minds_files, key)
        except FilesError as err:
            raise files_error(err, "read the mind's tokens") from err


@router.post("/minds/{name}")
async def mind_action(name: str, request: Request, action: str = "") -> JSONResponse:
    state = get_state(request)
    if action not in set(MindAction):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"Invalid action: {action!r} (one of {', '.join(MindAction)})",
        )
    act = MindAction(action)
    key = mind_key(tenant_namespace(request.scope), name)
    minds = state.minds
    if act is MindAction.SPILL and state.publisher is None:
        raise KvswapError(
            ErrorKind.NOT_SUPPORTED,
            "spilling a mind needs a disk tier (start with --slot-save-path)",
        )
    facts = turn_facts(request.scope, await request.body())
    async with minds.turn(key, facts) as held:  # placed: its owner's, in a cluster
        await _move(state, request, held, act)
    loop = asyncio.get_running_loop()
    if act is MindAction.SPILL and minds.tier(key) is MindTier.RAM:
        why = await loop.run_in_executor(state.io, state.demoter.spill_now, key)
        if why is not None:
            raise KvswapError(
                ErrorKind.UNAVAILABLE,
                f"the mind could not be written to disk now: {why}; it stays in RAM",
            )
    return JSONResponse({"mind": name, "action": action, "tier": minds.tier(key) or "none"})


async def _move(state: ServerState, request: Request, held: HeldMind, act: MindAction) -> None:
    """The verb on the held mind (a drop also leaves the disk and the shared tier, still
    inside the mind's lock: no turn slips in between)."""
    key, minds = held.key, state.minds
    here = minds.tier(key) is not None or (held.resumed is not None and held.resumed.state)
    if not here and not (act is MindAction.DROP and state.shared is not None):
        raise KvswapError(ErrorKind.NOT_FOUND, f"no mind named {key.name!r}")
    if act is MindAction.PAGE_IN:
        await _page_in(state, request, held)
    elif act in (MindAction.PAGE_OUT, MindAction.SPILL):
        await _mind_verb(state, request, key, MindMove.TO_RAM)
    else:
        await _mind_verb(state, request, key, MindMove.ERASE)
        if state.store is not None:
            state.store.remove(key)
        await minds.forget(key)  # its files, and in a cluster the shared tier's copy


async def _page_in(state: ServerState, request: Request, held: HeldMind) -> None:
    """Seat the held mind, its state read from disk first where it lives there only (again
    when a switch moved it straight there while the verb waited)."""
    restore = await state.minds.restore(held)
    try:
        await _mind_verb(state, request, held.key, MindMove.TO_SLOT, restore, held.on_disk_only)
    except MindMovedToDisk:
        restore = await state.minds.read_again(held)
        await _mind_verb(state, request, held.key, MindMove.TO_SLOT, restore, disk_read=True)


async def _mind_verb(
    state: ServerState,
    request: Request,
    key: PageKey,
    action: MindMove,
    restore: SlotState | None = None,
    disk_read: bool = False,
) -> int:
    seated: int = await state.client.call(
        lambda rid, reply: MindVerb(rid, key, action, reply, restore, disk_read),
        request.is_disconnected,
    )
    return seated
