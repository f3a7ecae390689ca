"""page_in of a page that holds tokens only (a KV-type reconfigure dropped its state).

The slot re-prefills the page's tokens as a request of its own (`n_predict` 0); the page leaves
the store only once its tokens are in the slot, and a failure leaves it in the store.
`reprefill_request` checks the page and builds that request; the engine admits it on the slot.

Engine thread only; no libllama here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvswap.backend.lora import AdapterInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.types import Completion, EngineError, Event, GenerationRequest
from kvswap.engine.commands import PageIn, PageMoved, Submit
from kvswap.engine.kv.pagefmt import read_tokens
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.kv.verbs import PageCounters
from kvswap.engine.plan.lora import resolve
from kvswap.engine.slot import Slot


def is_token_only(store: PageStore, name: str) -> bool:
    """Page `name` holds tokens only (a missing page is not: page_in answers its 404)."""
    return store.has(name) and store.get(name).layout.token_only


def reprefill_request(
    cmd: PageIn,
    slot: Slot,
    store: PageStore,
    adapters: Sequence[AdapterInfo],
    n_ctx_slot: int,
    counters: PageCounters,
) -> Submit | None:
    """The request that re-prefills page `cmd.name` on `slot`; None when the page is refused
    (the reply is sent, the page stays)."""
    page = store.hold(cmd.name)
    with page.view() as view:
        tokens = read_tokens(view, page.layout)
    try:
        lora = resolve(page.layout.lora, adapters, f"page {cmd.name!r}")
        if len(tokens) >= n_ctx_slot:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"page {cmd.name!r} holds {len(tokens)} tokens, more than a slot's window "
                f"({n_ctx_slot})",
            )
    except KvswapError as err:
        store.release(page)
        cmd.reply(err)
        return None
    t0 = time.perf_counter()
    n_discarded = len(slot.tokens)

    def done(event: Event) -> None:
        if not isinstance(event, Completion | EngineError):
            return
        if isinstance(event, Completion):
            store.remove(cmd.name, page.generation)
            counters.page_in_total += 1
            ms = (time.perf_counter() - t0) * 1e3
            cmd.reply(PageMoved(slot.id, cmd.name, len(tokens), 0, 0, 0, ms, n_discarded))
        else:
            counters.page_failed_total += 1
            cmd.reply(KvswapError(event.kind, event.message))
        store.release(page)

    request = GenerationRequest(
        prompt_tokens=tuple(int(t) for t in tokens), n_predict=0, id_slot=slot.id, lora=lora
    )
    return Submit(cmd.req_id, request, done)
