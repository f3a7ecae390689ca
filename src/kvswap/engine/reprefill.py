"""page_in of a page that holds tokens only (a KV-type reconfigure dropped its state).

The slot re-prefills the page's tokens as a request of its own (`n_predict` 0); the page leaves
the store only once all its tokens are in the slot. A failure, or a cancellation (the client
hung up mid-prefill: the slot then holds only part of the tokens), leaves it in the store.
`reprefill_request` checks the page and builds that request; the engine admits it on the slot.

Engine thread only; no libllama here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvswap.backend.lora import AdapterInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.page import read_tokens
from kvswap.core.types import Completion, EngineError, Event, GenerationRequest, MindOnDisk
from kvswap.engine.commands import PageIn, PageMoved, Submit
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.kv.verbs import PageCounters
from kvswap.engine.plan.lora import resolve
from kvswap.engine.slot import Slot


def is_token_only(store: PageStore, key: PageKey) -> bool:
    """Page `key` holds tokens only (a missing page is not: page_in answers its 404)."""
    return store.has(key) and store.get(key).layout.token_only


def reprefill_request(
    cmd: PageIn,
    slot: Slot,
    store: PageStore,
    adapters: Sequence[AdapterInfo],
    n_ctx_slot: int,
    counters: PageCounters,
) -> Submit | None:
    """The request that re-prefills page `cmd.key` on `slot`; None when the page is refused
    (the reply is sent, the page stays). The page is held from here until the request ends."""
    name = cmd.key.name
    page = store.hold(cmd.key)
    try:
        with page.view() as view:
            tokens = read_tokens(view, page.layout)
        lora = resolve(page.layout.lora, adapters, f"page {name!r}")
        if len(tokens) >= n_ctx_slot:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"page {name!r} holds {len(tokens)} tokens, more than a slot's window "
                f"({n_ctx_slot})",
            )
    except BaseException as err:
        store.release(page)
        if not isinstance(err, KvswapError):
            raise
        counters.page_failed_total += 1
        cmd.reply(err)
        return None
    t0 = time.perf_counter()
    n_discarded = len(slot.tokens)

    def done(event: Event | MindOnDisk) -> None:  # (no mind: never a MindOnDisk)
        if not isinstance(event, Completion | EngineError):
            return
        if isinstance(event, Completion) and not event.cancelled:
            store.remove(cmd.key, page.generation)
            counters.page_in_total += 1
            ms = (time.perf_counter() - t0) * 1e3
            cmd.reply(PageMoved(slot.id, cmd.key, len(tokens), 0, 0, 0, ms, n_discarded))
        else:
            counters.page_failed_total += 1
            if isinstance(event, EngineError):
                cmd.reply(KvswapError(event.kind, event.message))
            else:
                cmd.reply(
                    KvswapError(
                        ErrorKind.INVALID_REQUEST,
                        f"page_in of {name!r} cancelled mid-prefill: the page stays",
                    )
                )
        store.release(page)

    request = GenerationRequest(
        tuple(tokens.tolist()), n_predict=0, id_slot=slot.id, lora=lora, namespace=cmd.namespace
    )
    return Submit(cmd.req_id, request, done)
