"""Routes that describe or serve the vocabulary: /health, /props, /models, /slots (GET),
/metrics, /tokenize, /detokenize; and the typed 501 of what kvswap does not serve.

Read-only: they answer from the engine's last published snapshot and from the model's
vocabulary, so they never wait behind a decode step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psutil
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from kvswap import __version__
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.snapshot import EngineSnapshot, SlotSnapshot
from kvswap.minds.names import mind_name
from kvswap.server import formats_cluster
from kvswap.server.asgi import tenant_namespace
from kvswap.server.formats import KvGeometry, detokenize_json, health_json, tokenize_json
from kvswap.server.llama.formats_info import (
    ContextGeometry,
    ModelView,
    PropsView,
    SlotTaskView,
    SlotView,
    models_json,
    props_json,
    slots_json,
)
from kvswap.server.openapi import body_schema
from kvswap.server.prometheus import render, stored_metrics
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.params import build_sampling, content_part, tokenize_prompt
from kvswap.server.requests.schemas import (
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    parse_body,
)
from kvswap.server.state import ServerState, get_state

router = APIRouter()

BUILD_INFO = f"kvswap {__version__} (libllama from llama-cpp-python 0.3.36)"


@router.get("/health")
@router.get("/v1/health")
async def health(request: Request) -> JSONResponse:
    state = get_state(request)
    crashed = state.snapshot.crashed
    if crashed:
        raise KvswapError(ErrorKind.SERVER, crashed)
    shared = state.shared
    if shared is None:
        return JSONResponse(health_json())
    return JSONResponse(health_json(shared.threads(), shared.n_minds_held()))


def _geometry(state: ServerState, snap: EngineSnapshot) -> ContextGeometry:
    geo = snap.geometry
    target = KvGeometry.of(geo, n_ctx=snap.n_ctx, n_ctx_slot=snap.n_ctx_slot)
    spec = state.config.spec
    draft = None
    if spec.spec_type == "draft-simple":
        # The draft context mirrors the target's geometry with its own KV types.
        draft = replace(
            target, cache_type_k=spec.cache_type_k_draft, cache_type_v=spec.cache_type_v_draft
        )
    return ContextGeometry(target=target, draft=draft, generation=geo.generation)


@router.get("/props")
async def props(request: Request) -> JSONResponse:
    state = get_state(request)
    snap = state.snapshot
    defaults = build_sampling(CompletionRequest(prompt=""), state.config.sampling)
    view = PropsView(
        default_sampling=defaults,
        model_alias=state.model_name,
        model_path=state.model.info.path,
        model_ftype=state.model.info.ftype,
        chat_template=state.template.source,
        bos_token=state.template.bos_token,
        eos_token=state.template.eos_token,
        build_info=BUILD_INFO,
        geometry=_geometry(state, snap),
        endpoint_slots=state.config.http.slots_endpoint,
        endpoint_props=state.config.http.props_write,
        endpoint_metrics=state.config.http.metrics,
        is_sleeping=snap.is_sleeping,
        ui=state.config.http.webui,
        speculative_types=state.config.spec.spec_type,
    )

    body = props_json(view)
    if state.shared is not None:
        body["cluster"] = formats_cluster.props_json(state.shared.view(read_redis=False))
    return JSONResponse(body)


@router.get("/models")
@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    state = get_state(request)
    info = state.model.info
    view = ModelView(
        name=state.model_name,
        n_vocab=info.n_vocab,
        n_ctx_slot=state.snapshot.n_ctx_slot,
        n_ctx_train=info.n_ctx_train,
        n_embd=info.n_embd,
        n_params=info.n_params,
        size=info.size_bytes,
        vocab_type=info.vocab_type,
        ftype=info.ftype,
        aliases=state.config.model.aliases,
        tags=state.config.model.tags,
    )
    return JSONResponse(models_json(view, created=int(state.t_start)))


def _slot_view(s: SlotSnapshot, namespace: str) -> SlotView:
    task = None
    if s.request is not None:
        n_predict = s.request.n_predict
        # llama-server resets a released slot's counters (server_slot::reset): an idle slot
        # shows its last task's params but no budget or counts of it.
        busy = s.is_processing
        task = SlotTaskView(
            id_task=s.id_task,
            request=s.request,
            n_prompt_tokens=s.n_cached,
            n_prompt_tokens_processed=s.n_prompt_tokens_processed if busy else 0,
            n_prompt_tokens_cache=s.n_prompt_tokens_cache if busy else 0,
            has_next_token=s.has_next_token,
            has_new_line="\n" in s.generated_text,
            n_remain=-1 if n_predict < 0 or not busy else max(0, n_predict - s.n_decoded),
            n_decoded=s.n_decoded if busy else 0,
            generated=s.generated_text,
        )
    return SlotView(
        id=s.id,
        n_ctx=s.n_ctx,
        speculative=s.speculative,
        is_processing=s.is_processing,
        task=task,
        mind=mind_name(s.mind, namespace),
    )


@router.get("/slots")
async def slots(request: Request) -> JSONResponse:
    state = get_state(request)
    if not state.config.http.slots_endpoint:
        raise KvswapError(ErrorKind.NOT_SUPPORTED, "This server does not support slots endpoint.")
    snap = state.snapshot
    if request.query_params.get("fail_on_no_slot") and snap.n_idle_slots == 0:
        raise KvswapError(ErrorKind.UNAVAILABLE, "no slot available")
    namespace = tenant_namespace(request.scope)
    views = [_slot_view(s, namespace) for s in snap.slots]
    return JSONResponse(slots_json(views, speculative_types=state.config.spec.spec_type))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = get_state(request)
    if not state.config.http.metrics:
        raise KvswapError(ErrorKind.NOT_SUPPORTED, "This server does not support metrics endpoint.")
    text = state.metrics.render(state.snapshot.metrics)
    if state.chains is not None:
        text += render(stored_metrics(state.chains.counters))
    if state.shared_minds is not None:
        text += render(formats_cluster.metrics(await state.shared_minds.view()))
    response = PlainTextResponse(text, media_type="text/plain; version=0.0.4")
    # llama-server's header, in its case (Starlette lowercases names given to a Response);
    # kvswap sends the process's real start time in unix seconds.
    started = str(int(psutil.Process().create_time())).encode()
    response.raw_headers.append((b"Process-Start-Time-Unix", started))
    return response


@router.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
async def tokenize(request: Request) -> JSONResponse:
    state = get_state(request)
    raw = await request.body()

    def run() -> dict[str, Any]:
        body = parse_body(TokenizeRequest, raw)
        if body.content is None:
            return tokenize_json([])

        def tok(text: str, add_special: bool) -> list[int]:
            return [int(t) for t in state.tokenize(text, add_special, body.parse_special)]

        tokens = tokenize_prompt(content_part(body.content), tok, add_special=body.add_special)
        if any(not state.vocab.valid(t) for t in tokens):
            raise KvswapError(ErrorKind.INVALID_REQUEST, "invalid token id in content")
        pieces = [state.vocab.piece(t, special=True) for t in tokens] if body.with_pieces else None
        return tokenize_json(tokens, pieces)

    return JSONResponse(await prepared(raw, run))


@router.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
async def detokenize(request: Request) -> JSONResponse:
    state = get_state(request)
    raw = await request.body()

    def run() -> dict[str, Any]:
        body = parse_body(DetokenizeRequest, raw)
        bad = [t for t in body.tokens if not state.vocab.valid(t)]
        if bad:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"invalid token id {bad[0]} (the vocabulary has {state.vocab.n_tokens} tokens)",
            )
        return detokenize_json(state.vocab.detokenize(body.tokens, special=True))

    return JSONResponse(await prepared(raw, run))


_UNSUPPORTED = (
    "/embedding",
    "/embeddings",
    "/v1/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
    "/infill",
    "/v1/audio/transcriptions",
    "/audio/transcriptions",
)


async def _not_supported(request: Request) -> Response:
    raise KvswapError(
        ErrorKind.NOT_SUPPORTED,
        f"{request.url.path} is not supported by kvswap (no embeddings, rerank, infill or multimodal)",
    )


for _path in _UNSUPPORTED:
    router.add_api_route(_path, _not_supported, methods=["POST"])
