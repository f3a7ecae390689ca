"""Generation routes: /completion, /completions, /v1/completions, /chat/completions,
/v1/chat/completions (and its /input_tokens count), and /apply-template.

Each route validates its body (schemas), turns it into engine requests (params, jobs;
tokenizing, template rendering and grammar checks happen here, off the engine thread), runs
them (streaming), and shapes the answer as llama-server does (formats). Chat answers are parsed
for tool calls and reasoning (`kvswap.chat`), whole or as stream deltas.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.chat.parser import ChatParser
from kvswap.engine.types import (
    Completion,
    Event,
    GenerationRequest,
    PromptProgress,
    TokenEvent,
    TokenProbs,
)
from kvswap.server.chat import plan_chat
from kvswap.server.constraints import (
    completion_constraint,
)
from kvswap.server.formats import TaskExtras, apply_template_json
from kvswap.server.formats_chat import chat_diff_chunks, chat_final_msg, chat_finish_chunks
from kvswap.server.formats_native import native_chunk, native_final, native_progress_chunk
from kvswap.server.formats_oai import (
    chat_progress_chunk,
    completion_chunk,
    completion_final,
    completion_progress_chunk,
    merge_choices,
)
from kvswap.server.jobs import (
    checked_constraint,
    generation_requests,
    oai_meta,
    prompt_tokens,
    tokenizer,
)
from kvswap.server.openapi import body_schema
from kvswap.server.params import (
    parse_prompt,
    tokenize_prompt,
)
from kvswap.server.schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    OaiCompletionRequest,
    parse_body,
)
from kvswap.server.state import ServerState, get_state
from kvswap.server.streaming import complete_all, open_stream

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


# ------------------------------------------------------------------------- native /completion


@router.post("/completion", openapi_extra=body_schema(CompletionRequest))
@router.post("/completions", openapi_extra=body_schema(CompletionRequest))
async def completion(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(CompletionRequest, await request.body())
    tokenize = tokenizer(state)
    prompts = [tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)]
    constraint = checked_constraint(state, completion_constraint(body))
    reqs = generation_requests(state, body, prompts, constraint, headers=request.headers)
    client = state.engine_client()
    extras = TaskExtras(
        grammar=constraint.grammar if constraint else "",
        grammar_lazy=constraint.lazy if constraint else False,
        speculative_types=state.config.spec.spec_type,
    )

    def final(index: int, c: Completion, req: GenerationRequest) -> dict[str, Any]:
        return native_final(
            c,
            req,
            model=state.model_name,
            prompt_text=state.vocab.detokenize(list(req.prompt_tokens), special=True),
            index=index,
            return_tokens=bool(body.return_tokens),
            response_fields=body.response_fields or (),
            extras=extras,
        )

    if not body.stream:
        results = await complete_all(client, reqs, request)
        objs = [final(i, c, r) for i, (c, r) in enumerate(zip(results, reqs, strict=True))]
        return JSONResponse(objs[0] if len(objs) == 1 else objs)

    def render(index: int, event: Event) -> Iterable[dict[str, Any]]:
        if isinstance(event, TokenEvent):
            yield native_chunk(event, index=index, post_sampling=reqs[index].post_sampling_probs)
        elif isinstance(event, PromptProgress):
            yield native_progress_chunk(event, id_slot=-1, index=index)
        elif isinstance(event, Completion):
            yield final(index, event, reqs[index])

    return await open_stream(client, reqs, render, done_marker=False)


# ---------------------------------------------------------------------------- /v1/completions


@router.post("/v1/completions", openapi_extra=body_schema(OaiCompletionRequest))
async def oai_completion(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(OaiCompletionRequest, await request.body())
    tokenize = tokenizer(state)
    prompts = [tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)]
    constraint = checked_constraint(state, completion_constraint(body, body.response_format))
    reqs = generation_requests(state, body, prompts, constraint, headers=request.headers)
    client = state.engine_client()
    meta = oai_meta(state)
    if not body.stream:
        results = await complete_all(client, reqs, request)
        finals = [
            completion_final(c, r, meta, index=i)
            for i, (c, r) in enumerate(zip(results, reqs, strict=True))
        ]
        return JSONResponse(merge_choices(_with_verbose(state, body, finals, results, reqs)))
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

    return await open_stream(client, reqs, render, done_marker=True)


# ----------------------------------------------------------------------- /v1/chat/completions


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
@router.post("/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completion(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(ChatCompletionRequest, await request.body())
    plan = plan_chat(state, body)
    reqs = generation_requests(
        state, body, [prompt_tokens(state, plan.prompt)], plan.constraint, headers=request.headers
    )
    client = state.engine_client()
    meta = oai_meta(state)
    if not body.stream:
        results = await complete_all(client, reqs, request)
        finals = [
            chat_final_msg(c, r, meta, ChatParser(plan.spec).parse_all(c.content), index=i)
            for i, (c, r) in enumerate(zip(results, reqs, strict=True))
        ]
        return JSONResponse(merge_choices(_with_verbose(state, body, finals, results, reqs)))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
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

    return await open_stream(client, reqs, render, done_marker=True)


@router.post("/v1/chat/completions/input_tokens", openapi_extra=body_schema(ChatCompletionRequest))
@router.post("/chat/completions/input_tokens", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_input_tokens(request: Request) -> Response:
    """The prompt's token count for a chat body (llama-server's `handle_count_tokens`)."""
    state = get_state(request)
    body = parse_body(ChatCompletionRequest, await request.body())
    n = len(prompt_tokens(state, plan_chat(state, body).prompt))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


@router.post("/apply-template", openapi_extra=body_schema(ApplyTemplateRequest))
async def apply_template(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(ApplyTemplateRequest, await request.body())
    return JSONResponse(apply_template_json(plan_chat(state, body).prompt))
