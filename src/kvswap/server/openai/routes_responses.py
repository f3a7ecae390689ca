"""OpenAI's Responses API: POST /v1/responses and /responses (streamed or not), and
POST /v1/responses/input_tokens.

The body becomes the equivalent chat body (`schemas_responses.to_chat_body`), which runs exactly
as /v1/chat/completions does; the answer is parsed (`ChatParser`) and shaped as Responses
output items (`formats_responses`). Nothing is stored: `previous_response_id` is refused, as
llama-server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.chat.blocks import BlockStream
from kvswap.chat.parser import ChatParser
from kvswap.core.types import Completion, EngineError, Event, PromptProgress, TokenEvent
from kvswap.server.openai import formats_responses as fr
from kvswap.server.openai.schemas_responses import ResponsesRequest, to_chat_body
from kvswap.server.openapi import body_schema
from kvswap.server.requests.chat import ChatJob, ChatPlan, count_chat_tokens, prepare_chat
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.schemas import ChatCompletionRequest, parse_body
from kvswap.server.state import ServerState, get_state
from kvswap.server.streaming import Render, complete_all, open_stream, turn

router = APIRouter()


def _bodies(raw: bytes) -> tuple[ResponsesRequest, ChatCompletionRequest]:
    req = parse_body(ResponsesRequest, raw)
    data = json.loads(raw)  # valid: parse_body accepted it
    return req, parse_body(ChatCompletionRequest, to_chat_body(data, req))


def _n_reasoning(state: ServerState, reasoning: str) -> int:
    """The output tokens of the reasoning items: its text tokenized again (model-made text
    tokenizes back into the tokens that made it, up to merges at its two ends)."""
    return len(state.tokenize(reasoning, False, True)) if reasoning else 0


def _echo(req: ResponsesRequest, body: ChatCompletionRequest) -> dict[str, Any]:
    """The request settings a response object repeats."""
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "text": req.text or {"format": {"type": "text"}},
    }


@router.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
@router.post("/responses", openapi_extra=body_schema(ResponsesRequest))
async def responses(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    async with turn(state, request, raw) as runner:

        def prepare() -> tuple[ResponsesRequest, ChatJob]:
            req, body = _bodies(raw)
            return req, prepare_chat(state, body, runner.mind)

        req, job = await prepared(raw, prepare)
        meta = fr.ResponseMeta(
            id=fr.new_response_id(),
            model=state.model_name,
            created_at=int(time.time()),
            params=_echo(req, job.body),
            kept=runner.mind is not None,
        )
        if not job.body.stream:
            [c] = await complete_all(runner, job.requests, request)
            msg = ChatParser(job.plan.spec).parse_all(c.content)
            n_reasoning = _n_reasoning(state, msg.reasoning_content)
            return JSONResponse(
                fr.response_json(
                    meta,
                    status="completed",
                    output=fr.output_items(msg),
                    c=c,
                    n_reasoning=n_reasoning,
                ),
                headers=runner.headers(),
            )
        events = fr.ResponseEvents(meta)

        def encode_error(err: EngineError) -> bytes:
            return fr.encode(events.error(err))

        return await open_stream(
            runner,
            job.requests,
            _response_stream(state, job.plan, events),
            http=request,
            done_marker=False,
            encode=fr.encode,
            encode_error=encode_error,
        )


def _response_stream(state: ServerState, plan: ChatPlan, events: fr.ResponseEvents) -> Render:
    """The Responses stream's events: created and in-progress first, output items and their
    deltas as the parser releases them, then completed (with the reasoning's token count)."""
    parser = ChatParser(plan.spec)
    blocks = BlockStream()
    started = False

    def render(_: int, event: Event) -> Iterable[dict[str, Any]]:
        nonlocal started
        if not started:
            started = True
            yield from events.start()
        if isinstance(event, TokenEvent):
            out = events.blocks(blocks.feed(parser.feed(event.text)))
            if out and event.timings is not None:  # timings_per_token: on the step's last event
                out[-1]["timings"] = fr.timings_json(event.timings)
            yield from out
        elif isinstance(event, PromptProgress):
            yield events.progress(event)
        elif isinstance(event, Completion):
            yield from events.blocks(blocks.feed(parser.finish()) + blocks.close())
            yield from events.complete(event, _n_reasoning(state, parser.msg.reasoning_content))

    return render


@router.post("/v1/responses/input_tokens", openapi_extra=body_schema(ResponsesRequest))
@router.post("/responses/input_tokens", openapi_extra=body_schema(ResponsesRequest))
async def input_tokens(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    n = await prepared(raw, lambda: count_chat_tokens(state, _bodies(raw)[1]))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})
