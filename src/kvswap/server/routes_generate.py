"""Generation routes: /completion, /completions, /v1/completions, /chat/completions,
/v1/chat/completions, and /apply-template.

Each route validates its body (schemas), turns it into engine requests (params; tokenizing and
template rendering happen here, off the engine thread), runs them (streaming), and shapes the
answer as llama-server does (formats).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.engine.client import EngineClient
from kvswap.engine.types import (
    Completion,
    ErrorKind,
    Event,
    GenerationRequest,
    KvswapError,
    PromptProgress,
    TokenEvent,
)
from kvswap.server.formats import apply_template_json
from kvswap.server.formats_native import native_chunk, native_final, native_progress_chunk
from kvswap.server.formats_oai import (
    OaiMeta,
    chat_chunks,
    chat_final,
    chat_final_chunks,
    chat_progress_chunk,
    completion_chunk,
    completion_final,
    completion_progress_chunk,
    merge_choices,
    new_completion_id,
)
from kvswap.server.minds import request_mind
from kvswap.server.openapi import body_schema
from kvswap.server.params import (
    Tokenize,
    build_generation,
    chat_messages,
    parse_prompt,
    resolve_n_cmpl,
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
from kvswap.text.template import InvalidMessagesError, TemplateError

router = APIRouter()


def _tokenizer(state: ServerState) -> Tokenize:
    def tokenize(text: str, add_special: bool) -> list[int]:
        return [int(t) for t in state.tokenize(text, add_special, True)]

    return tokenize


def _requests(
    state: ServerState,
    body: CompletionRequest | OaiCompletionRequest | ChatCompletionRequest,
    prompts: list[list[int]],
    http: Request,
) -> list[GenerationRequest]:
    engine = state.engine
    n_cmpl = resolve_n_cmpl(body, n_parallel=len(engine.slots))
    mind = request_mind(http.headers, body.mind, keyed=bool(state.config.http.api_keys))
    if mind and n_cmpl * len(prompts) > 1:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "a request naming a mind runs one prompt and one completion"
        )
    cfg = state.config
    max_n_predict = cfg.http.max_n_predict if cfg.http.max_n_predict >= 0 else None
    out = []
    for tokens in prompts:
        req = build_generation(
            body,
            cfg.sampling,
            prompt_tokens=tokens,
            n_ctx_slot=engine.n_ctx_slot,
            max_n_predict=max_n_predict,
            n_parallel=len(engine.slots),
            n_vocab=state.vocab.n_tokens,
            tokenize=_tokenizer(state),
        )
        out.extend([replace(req, mind=mind) if mind else req] * n_cmpl)
    return out


def _oai_meta(state: ServerState) -> OaiMeta:
    return OaiMeta(
        id=new_completion_id(),
        model=state.model_name,
        created=int(time.time()),
        system_fingerprint="kvswap",
    )


async def _finals(
    client: EngineClient,
    reqs: list[GenerationRequest],
    request: Request,
    shape: Callable[..., dict[str, Any]],
    meta: OaiMeta,
) -> list[dict[str, Any]]:
    """Run every task to its end and shape each final result (OpenAI routes)."""
    results = await complete_all(client, reqs, request)
    return [shape(c, r, meta, index=i) for i, (c, r) in enumerate(zip(results, reqs, strict=True))]


# ------------------------------------------------------------------------- native /completion


@router.post("/completion", openapi_extra=body_schema(CompletionRequest))
@router.post("/completions", openapi_extra=body_schema(CompletionRequest))
async def completion(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(CompletionRequest, await request.body())
    tokenize = _tokenizer(state)
    prompts = [tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)]
    reqs = _requests(state, body, prompts, request)
    client = state.engine_client()

    def final(index: int, c: Completion, req: GenerationRequest) -> dict[str, Any]:
        return native_final(
            c,
            req,
            model=state.model_name,
            prompt_text=state.vocab.detokenize(list(req.prompt_tokens), special=True),
            index=index,
            return_tokens=bool(body.return_tokens),
            response_fields=body.response_fields or (),
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
    tokenize = _tokenizer(state)
    prompts = [tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)]
    reqs = _requests(state, body, prompts, request)
    client = state.engine_client()
    meta = _oai_meta(state)
    if not body.stream:
        return JSONResponse(
            merge_choices(await _finals(client, reqs, request, completion_final, meta))
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

    return await open_stream(client, reqs, render, done_marker=True)


# ----------------------------------------------------------------------- /v1/chat/completions


def render_chat_prompt(state: ServerState, body: ChatCompletionRequest) -> str:
    """The chat template applied to the body's messages (typed 400 on bad messages)."""
    try:
        return state.template.render(
            chat_messages(body),
            add_generation_prompt=True
            if body.add_generation_prompt is None
            else body.add_generation_prompt,
            tools=body.tools,
            chat_template_kwargs=body.chat_template_kwargs,
        )
    except (InvalidMessagesError, TemplateError) as err:
        raise KvswapError(ErrorKind.INVALID_REQUEST, str(err)) from err


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
@router.post("/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completion(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(ChatCompletionRequest, await request.body())
    prompt = render_chat_prompt(state, body)
    reqs = _requests(state, body, [[int(t) for t in state.tokenize(prompt, True, True)]], request)
    client = state.engine_client()
    meta = _oai_meta(state)
    if not body.stream:
        return JSONResponse(merge_choices(await _finals(client, reqs, request, chat_final, meta)))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    started: set[int] = set()

    def render(index: int, event: Event) -> Iterable[dict[str, Any]]:
        if isinstance(event, TokenEvent):
            first = index not in started
            started.add(index)
            yield from chat_chunks(
                event, meta, first=first, index=index, post_sampling=reqs[index].post_sampling_probs
            )
        elif isinstance(event, PromptProgress):
            yield chat_progress_chunk(event, meta, index=index)
        elif isinstance(event, Completion):
            yield from chat_final_chunks(event, meta, include_usage=include_usage, index=index)

    return await open_stream(client, reqs, render, done_marker=True)


@router.post("/apply-template", openapi_extra=body_schema(ApplyTemplateRequest))
async def apply_template(request: Request) -> Response:
    state = get_state(request)
    body = parse_body(ApplyTemplateRequest, await request.body())
    return JSONResponse(apply_template_json(render_chat_prompt(state, body)))
