"""Anthropic's Messages API: POST /v1/messages (streamed or not) and /v1/messages/count_tokens.

The body becomes the equivalent chat body (`schemas_anthropic.to_chat_body`), which runs
exactly as /v1/chat/completions does (same template, tools, grammar, engine, slots and prefix
reuse); the answer is parsed (`ChatParser`) and shaped as Anthropic's (`formats_anthropic`).
The API-key guard accepts `x-api-key`, as Anthropic's clients send it. `max_tokens` is required
on /v1/messages (a 400 naming it, as Anthropic's API; llama-server defaulted it to 4096), not on
count_tokens; errors leave in Anthropic's shape (`anthropic.errors`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.chat.blocks import BlockStream
from kvswap.chat.parser import ChatParser
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.types import Completion, Event, TokenEvent
from kvswap.minds.histories import LastTurn
from kvswap.server.anthropic import formats as fa
from kvswap.server.anthropic.cache import CacheMarks, marks
from kvswap.server.anthropic.schemas import MessagesRequest, to_chat_body
from kvswap.server.openapi import body_schema
from kvswap.server.requests.chat import ChatJob, ChatPlan, count_chat_tokens, prepare_chat
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.schemas import ChatCompletionRequest, parse_body
from kvswap.server.requests.serving import Serving
from kvswap.server.state import get_state
from kvswap.server.streaming import Render, complete_all, open_stream, prepare_turn, turn

router = APIRouter()


def _bodies(raw: bytes, *, generate: bool = True) -> tuple[MessagesRequest, ChatCompletionRequest]:
    req = parse_body(MessagesRequest, raw)
    if generate and req.max_tokens is None:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "max_tokens: Field required")
    data = json.loads(raw)  # valid: parse_body accepted it
    return req, parse_body(ChatCompletionRequest, to_chat_body(req, data))


def _chat_body(raw: bytes, *, generate: bool = True) -> ChatCompletionRequest:
    return _bodies(raw, generate=generate)[1]


def _prepare(
    state: Serving, raw: bytes, mind: PageKey | None, last: LastTurn | None, by_session: bool
) -> tuple[ChatJob, CacheMarks]:
    """The chat job of a Messages body and where its cache breakpoints lie; under a mind, its
    requests carry the retention floor the breakpoints ask for (`last`: the mind's last turn,
    which the body continues)."""
    req, body = _bodies(raw)
    job = prepare_chat(state, body, mind, last, by_session=by_session)
    prompt = job.requests[0].prompt_tokens
    kept = job.requests[0].mind is not None  # a side request runs without the mind
    cache = marks(state, req, body, job.plan, prompt, kept=kept)
    if cache.retain_s:
        requests = [dataclasses.replace(r, retain_s=cache.retain_s) for r in job.requests]
        job = dataclasses.replace(job, requests=requests)
    return job, cache


@router.post("/v1/messages", openapi_extra=body_schema(MessagesRequest))
async def messages(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    async with turn(state, request, raw) as runner:
        job, cache = await prepare_turn(
            runner, raw, lambda m, last, by: _prepare(state, raw, m, last, by), lambda j: j[0].side
        )
        asked = bool(job.body.timings_per_token)  # llama-server's timings, only when asked
        meta = fa.MessageMeta(fa.new_message_id(), state.model_name, cache, asked)
        if not job.body.stream:
            [c] = await complete_all(runner, job.requests, request)
            msg = ChatParser(job.plan.spec).parse_all(c.content)
            return JSONResponse(fa.message_json(c, msg, meta), headers=runner.headers())
        # Token events carry timings, so message_start can report the cached prompt tokens.
        reqs = [dataclasses.replace(r, timings_per_token=True) for r in job.requests]
        return await open_stream(
            runner,
            reqs,
            _message_stream(job.plan, meta),
            http=request,
            done_marker=False,
            encode=fa.encode,
            encode_error=fa.encode_error,
        )


def _message_stream(plan: ChatPlan, meta: fa.MessageMeta) -> Render:
    """The Messages stream's events: message_start with the first token, content blocks as the
    parser releases them, then message_delta and message_stop."""
    parser = ChatParser(plan.spec)
    blocks = BlockStream()
    started = False

    def render(_: int, event: Event) -> Iterable[dict[str, Any]]:
        nonlocal started
        if not isinstance(event, TokenEvent | Completion):
            return
        if not started:
            started = True
            cached = event.timings.cache_n if event.timings is not None else 0
            yield fa.message_start(meta, event.n_prompt_tokens, cached)
        if isinstance(event, TokenEvent):
            yield from fa.block_events(blocks.feed(parser.feed(event.text)))
        else:
            yield from fa.block_events(blocks.feed(parser.finish()) + blocks.close())
            yield from fa.message_end(event, parser.msg, meta)

    return render


@router.post("/v1/messages/count_tokens", openapi_extra=body_schema(MessagesRequest))
async def count_tokens(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    n = await prepared(raw, lambda: count_chat_tokens(state, _chat_body(raw, generate=False)))
    return JSONResponse({"input_tokens": n})
