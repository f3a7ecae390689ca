"""OpenAI's generation routes: /v1/completions, /v1/chat/completions, /chat/completions (and their
/input_tokens count).

Each route holds the mind its request names first (`streaming.turn`: in a cluster, a turn for
another replica is forwarded before it is prepared), validates its body, turns it into engine
requests (tokenizing, template rendering and grammar checks happen here, off the engine thread:
`requests.chat.prepare_chat` for a chat body), runs them (`streaming`), and shapes the answer as
OpenAI (and llama-server) do. Chat answers are parsed for tool calls and reasoning
(`kvswap.chat`), whole or as stream deltas.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.chat.parser import ChatParser
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.types import (
    Completion,
    Event,
    GenerationRequest,
    PromptProgress,
    TokenEvent,
    TokenProbs,
)
from kvswap.server.formats_native import native_final
from kvswap.server.openai.formats_chat import chat_diff_chunks, chat_final_msg, chat_finish_chunks
from kvswap.server.openai.formats_oai import (
    OaiMeta,
    chat_progress_chunk,
    completion_chunk,
    completion_final,
    completion_progress_chunk,
    merge_choices,
    oai_meta,
)
from kvswap.server.openapi import body_schema
from kvswap.server.requests.chat import ChatPlan, count_chat_tokens, prepare_chat
from kvswap.server.requests.constraints import completion_constraint
from kvswap.server.requests.jobs import checked_constraint, generation_requests, tokenizer
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.params import parse_prompt, tokenize_prompt
from kvswap.server.requests.schemas import (
    ChatCompletionRequest,
    OaiCompletionRequest,
    parse_body,
)
from kvswap.server.state import ServerState, get_state
from kvswap.server.streaming import Render, complete_all, open_stream, prepare_turn, turn

router = APIRouter()


def _with_verbose(
    state: ServerState,
    body: OaiCompletionRequest | ChatCompletionRequest,
    finals: list[dict[str, Any]],
    results: list[Completion],
    reqs: list[GenerationRequest],
) -> list[dict[str, Any]]:
    """llama-server's debug field: under -v (or a body's `verbose: true`) each OpenAI final
    carries the native /completion answer, the rendered prompt included, as `__verbose`."""
    if not (state.config.log.verbose if body.verbose is None else body.verbose):
        return finals
    for i, (final, c, r) in enumerate(zip(finals, results, reqs, strict=True)):
        prompt_text = state.vocab.detokenize(list(r.prompt_tokens), special=True)
        final["__verbose"] = native_final(
            c, r, model=state.model_name, prompt_text=prompt_text, index=i
        )
    return finals


# ---------------------------------------------------------------------------- /v1/completions


@router.post("/v1/completions", openapi_extra=body_schema(OaiCompletionRequest))
async def oai_completion(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    async with turn(state, request, raw) as runner:

        def prepare() -> tuple[OaiCompletionRequest, list[GenerationRequest]]:
            body = parse_body(OaiCompletionRequest, raw)
            tokenize = tokenizer(state)
            prompts = [
                tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)
            ]
            constraint = checked_constraint(
                state, completion_constraint(body, body.response_format)
            )
            reqs = generation_requests(state, body, prompts, constraint, mind=runner.mind)
            return body, reqs

        body, reqs = await prepared(raw, prepare)
        meta = oai_meta(state.model_name)
        if not body.stream:
            results = await complete_all(runner, reqs, request)
            finals = [
                completion_final(c, r, meta, index=i)
                for i, (c, r) in enumerate(zip(results, reqs, strict=True))
            ]
            return JSONResponse(
                merge_choices(_with_verbose(state, body, finals, results, reqs)),
                headers=runner.headers(),
            )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def render(index: int, event: Event) -> Iterable[dict[str, Any]]:
            if isinstance(event, TokenEvent):
                yield completion_chunk(
                    event, meta, index=index, post_sampling=reqs[index].post_sampling_probs
                )
            elif isinstance(event, PromptProgress):
                yield completion_progress_chunk(event, meta, index=index)
            elif isinstance(event, Completion):
                final = completion_final(event, reqs[index], meta, index=index)
                if not include_usage:
                    final.pop("usage", None)
                yield final

        return await open_stream(runner, reqs, render, http=request, done_marker=True)


# ----------------------------------------------------------------------- /v1/chat/completions


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
@router.post("/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completion(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    async with turn(state, request, raw) as runner:
        job = await prepare_turn(
            runner,
            raw,
            lambda m, last, by: prepare_chat(state, _chat_body(raw), m, last, by_session=by),
            lambda j: j.side,
        )
        body, plan, reqs = job.body, job.plan, job.requests
        meta = oai_meta(state.model_name)
        if not body.stream:
            results = await complete_all(runner, reqs, request)
            finals = [
                chat_final_msg(c, r, meta, ChatParser(plan.spec).parse_all(c.content), index=i)
                for i, (c, r) in enumerate(zip(results, reqs, strict=True))
            ]
            return JSONResponse(
                merge_choices(_with_verbose(state, body, finals, results, reqs)),
                headers=runner.headers(),
            )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        render = _chat_stream(plan, reqs, meta, include_usage=include_usage)
        return await open_stream(runner, reqs, render, http=request, done_marker=True)


def _chat_stream(
    plan: ChatPlan, reqs: list[GenerationRequest], meta: OaiMeta, *, include_usage: bool
) -> Render:
    """A chat stream's chunks for each task's events: content, reasoning and tool-call deltas
    as the parser releases them, then the finish (and usage) chunks."""
    parsers = [ChatParser(plan.spec) for _ in reqs]
    unsent: list[tuple[TokenProbs, ...]] = [() for _ in reqs]  # probs of steps sent no chunk
    started: set[int] = set()

    def render(index: int, event: Event) -> Iterable[dict[str, Any]]:
        parser = parsers[index]
        post_sampling = reqs[index].post_sampling_probs
        if isinstance(event, TokenEvent):
            first = index not in started
            started.add(index)
            probs = unsent[index] + event.probs
            chunks = chat_diff_chunks(
                parser.feed(event.text),
                meta,
                first=first,
                index=index,
                probs=probs,
                timings=event.timings,
                post_sampling=post_sampling,
            )
            unsent[index] = () if chunks else probs
            yield from chunks
        elif isinstance(event, PromptProgress):
            yield chat_progress_chunk(event, meta, index=index)
        elif isinstance(event, Completion):
            chunks = chat_diff_chunks(
                parser.finish(),
                meta,
                first=False,
                index=index,
                probs=unsent[index],
                post_sampling=post_sampling,
            )
            yield from chunks
            yield from chat_finish_chunks(
                event,
                meta,
                parser.msg,
                include_usage=include_usage,
                index=index,
                probs=() if chunks else unsent[index],
                post_sampling=post_sampling,
            )

    return render


@router.post("/v1/chat/completions/input_tokens", openapi_extra=body_schema(ChatCompletionRequest))
@router.post("/chat/completions/input_tokens", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_input_tokens(request: Request) -> Response:
    """The prompt's token count for a chat body (llama-server's `handle_count_tokens`)."""
    state = get_state(request)
    raw = await request.body()
    n = await prepared(raw, lambda: count_chat_tokens(state, _chat_body(raw)))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


def _chat_body(raw: bytes) -> ChatCompletionRequest:
    """An OpenAI chat body; no messages is a 400, as OpenAI's API (the Anthropic and Responses
    routes, which build the same body, accept an empty conversation, as llama-server does)."""
    body = parse_body(ChatCompletionRequest, raw)
    if not body.messages:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            "'messages' must contain at least one message (as OpenAI's API)",
        )
    return body
