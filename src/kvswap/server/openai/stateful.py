"""A stored (or chained) Responses turn made ready to run, and what its end writes.

`prepare_stored` (pure CPU: run off the event loop) turns a request and where its chain starts
(`minds.chains.ChainStart`) into the engine request: the history's items and the request's
input (with ids) become one chat body; its render is the prompt text, and its tokens are the
continuation of the mind's own tokens when the template allows it (`minds.chain`), else the
render tokenized (the engine reuses the longest common prefix with the mind). With
`truncation: "auto"`, a prompt that does not fit its slot's window (with room for the answer)
drops its oldest items, a whole user turn at a time, until it takes at most half of what fits
(one re-prefill of the kept window; the next turns then continue incrementally in the room
left).

`turn_write` is the record of a finished turn (`minds.records.TurnWrite`): the response, its
position in the mind (tokens, the rendered prompt's length and digest), its input and output.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.types import Completion, EngineError, GenerationRequest
from kvswap.minds.chains import ChainStart, StoredChains
from kvswap.minds.continuation import (
    Continuation,
    ContinueMode,
    Position,
    continue_chain,
    rendered,
    text_digest,
)
from kvswap.minds.stored.db import RecordsDbError
from kvswap.minds.stored.records import Item, ResponseRecord, TurnWrite
from kvswap.minds.stored.responses import segment_after
from kvswap.server.openai import formats_responses as fr
from kvswap.server.openai.items import stored_items
from kvswap.server.openai.response_stream import ResponseStream
from kvswap.server.openai.schemas_responses import ResponsesRequest, to_chat_body
from kvswap.server.requests.chat import ChatJob, ChatPlan, plan_chat, render_history
from kvswap.server.requests.jobs import generation_requests
from kvswap.server.requests.resent import ends_turn, tokenizers
from kvswap.server.requests.schemas import ChatCompletionRequest, parse_body
from kvswap.server.requests.serving import Serving

TRUNCATED_SHARE = 0.5  # a truncated prompt takes at most this share of what fits
DEFAULT_RESERVE_TOKENS = 256  # room kept for the answer when max_output_tokens is not set


@dataclass(frozen=True)
class StoredJob:
    """A stored turn ready to run."""

    job: ChatJob
    start: ChainStart
    new_items: list[Item]  # the request's input, with ids
    cont: Continuation  # how its prompt was made
    prompt_chars: int  # the rendered prompt: its length and digest (the next turn checks)
    prompt_digest: str
    n_dropped: int  # leading history items left out of the prompt


def _chat_body(raw: dict[str, Any], req: ResponsesRequest, items: list[Item]) -> Any:
    chat = to_chat_body(raw, req, items)
    return parse_body(ChatCompletionRequest, chat)


def _continuation(
    state: Serving,
    raw: dict[str, Any],
    req: ResponsesRequest,
    start: ChainStart,
    plan: ChatPlan,
    n_dropped: int,
) -> Continuation:
    tokenize = tokenizers(state)["tokenize"]
    base = start.base
    if base is None and start.why_rendered:
        return rendered(plan.prompt, tokenize, ContinueMode.RENDERED, start.why_rendered)
    if base is None:
        return rendered(plan.prompt, tokenize, ContinueMode.NEW)
    if n_dropped != base.response.n_dropped:
        return rendered(plan.prompt, tokenize, ContinueMode.TRUNCATED, "truncated")
    history = render_history(state, _chat_body(raw, req, start.items[n_dropped : start.n_covered]))
    return continue_chain(
        base.tokens,
        base.response.position,
        full=plan.prompt,
        history=history,
        ends_turn=ends_turn(state),
        **tokenizers(state),
    )


def prepare_stored(
    state: Serving,
    raw: dict[str, Any],
    req: ResponsesRequest,
    start: ChainStart,
    mind: PageKey | None,
) -> StoredJob:
    """The turn's engine request (see the module docstring); `mind`: the mind it runs on."""
    new_items = stored_items(req.input)
    n_dropped = start.n_dropped
    body = _chat_body(raw, req, start.items[n_dropped:] + new_items)
    plan = plan_chat(state, body)
    cont = _continuation(state, raw, req, start, plan, n_dropped)
    if req.truncation == "auto":
        body, plan, cont, n_dropped = _truncated(
            state, raw, req, start, new_items, body, plan, cont
        )
    requests = [
        replace(r, adopt_prefix=True)  # a new chain's mind takes its first turn's KV
        for r in generation_requests(
            state, body, [[int(t) for t in cont.tokens]], plan.constraint, mind=mind
        )
    ]
    return StoredJob(
        ChatJob(body, plan, requests),
        start,
        new_items,
        cont,
        len(plan.prompt),
        text_digest(plan.prompt),
        n_dropped,
    )


def _truncated(
    state: Serving,
    raw: dict[str, Any],
    req: ResponsesRequest,
    start: ChainStart,
    new_items: list[Item],
    body: Any,
    plan: ChatPlan,
    cont: Continuation,
) -> tuple[Any, ChatPlan, Continuation, int]:
    """`truncation: "auto"`: the oldest items dropped until the prompt fits (see the module
    docstring); the prompt unchanged when it fits already."""
    n_ctx_slot = state.snapshot.n_ctx_slot
    reserve = req.max_output_tokens or min(DEFAULT_RESERVE_TOKENS, n_ctx_slot // 4)
    fits = n_ctx_slot - reserve
    if len(cont.tokens) <= fits:
        return body, plan, cont, start.n_dropped
    tokenize = tokenizers(state)["tokenize"]
    history = start.items
    n_dropped = start.n_dropped
    while True:
        n_dropped = _next_turn(history, n_dropped + 1)
        body = _chat_body(raw, req, history[n_dropped:] + new_items)
        plan = plan_chat(state, body)
        cont = rendered(plan.prompt, tokenize, ContinueMode.TRUNCATED, "truncated")
        if len(cont.tokens) <= fits * TRUNCATED_SHARE or n_dropped >= len(history):
            return body, plan, cont, n_dropped


def _next_turn(items: list[Item], i: int) -> int:
    """The first index at or after `i` where a user message starts a turn (or the end)."""
    while i < len(items) and not (
        items[i].get("type") == "message" and items[i].get("role") == "user"
    ):
        i += 1
    return i


def turn_write(
    sj: StoredJob,
    *,
    namespace: str,
    response_id: str,
    mind: str,
    output: list[Item],
    body: dict[str, Any],
    c: Completion,
    created_at: float,
    events: list[dict[str, Any]] | None = None,
) -> TurnWrite:
    """What a finished stored turn writes."""
    start = sj.start
    prompt = np.asarray(sj.job.requests[0].prompt_tokens, dtype=np.int32)
    tokens = np.concatenate([prompt, np.asarray(c.tokens, dtype=np.int32)])
    position = Position(len(tokens), len(prompt), sj.prompt_chars, sj.prompt_digest)
    record = ResponseRecord(
        id=response_id,
        namespace=namespace,
        mind=mind,
        parent=start.previous,
        conversation=start.conversation,
        conv_seq=0,  # set by the store when it appends the items
        segment=0,  # set by the store
        position=position,
        n_dropped=sj.n_dropped,
        input=sj.new_items,
        output=output,
        body=body,
        created_at=created_at,
    )
    segment = segment_after(start.base, tokens)
    return TurnWrite(namespace, mind, start.owned, record, segment, list(events or []))


class TurnWriter:
    """A stored turn's write, before its answer goes out (`write`; `before_answer`: the hook a
    streamed turn runs on its Completion, `streaming.Turn.before_answer`)."""

    def __init__(self, chains: StoredChains, ns: str, sj: StoredJob, meta: fr.ResponseMeta) -> None:
        self.chains, self.ns, self.sj, self.meta = chains, ns, sj, meta

    async def write(
        self, body: dict[str, Any], c: Completion, events: list[dict[str, Any]] | None = None
    ) -> None:
        start: ChainStart = self.sj.start
        if not start.record or start.mind is None:
            return
        write = turn_write(
            self.sj,
            namespace=self.ns,
            response_id=self.meta.id,
            mind=start.mind.name,
            output=body["output"],
            body=body,
            c=c,
            created_at=self.meta.created_at,
            events=events,
        )
        try:
            await self.chains.record(write, self.sj.cont.mode)
        except (sqlite3.Error, RecordsDbError) as err:
            raise KvswapError(
                ErrorKind.SERVER, f"the response could not be stored: {err} (nothing was kept)"
            ) from err

    def before_answer(self, stream: ResponseStream) -> Any:
        async def hook(_: GenerationRequest, c: Completion) -> Completion | EngineError:
            final = stream.finish(c)
            try:
                await self.write(final[-1]["response"], c)
            except KvswapError as err:
                return EngineError(c.req_id, err.kind, err.message)
            return c

        return hook
