"""Engine requests for a parsed body: tokenizing, sampling fields, constraints, and ids.

Shared by the generation routes (llama-server's, OpenAI's, Anthropic's): `generation_requests`
maps a body (and its tokenized prompts) onto `GenerationRequest`s through `params` and puts the
constraint's grammar in them; `checked_constraint` checks a grammar with libllama first;
`oai_meta` gives an OpenAI response its id and timestamp.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from fastapi import Request

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.types import GenerationRequest
from kvswap.server.guard import tenant_namespace
from kvswap.server.openai.formats_oai import OaiMeta, new_completion_id
from kvswap.server.pages.minds import request_mind
from kvswap.server.requests.constraints import Constraint, check_constraint, with_constraint
from kvswap.server.requests.params import Tokenize, build_generation, resolve_n_cmpl
from kvswap.server.requests.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    OaiCompletionRequest,
)
from kvswap.server.state import ServerState


def tokenizer(state: ServerState) -> Tokenize:
    def tokenize(text: str, add_special: bool) -> list[int]:
        return [int(t) for t in state.tokenize(text, add_special, True)]

    return tokenize


def generation_requests(
    state: ServerState,
    body: CompletionRequest | OaiCompletionRequest | ChatCompletionRequest,
    prompts: list[list[int]],
    constraint: Constraint | None = None,
    *,
    http: Request,
) -> list[GenerationRequest]:
    """The engine requests of a body: one per prompt and completion (`n`), constrained, under
    the mind it names (`"mind"` or `X-Mind-Id`, in the caller's tenant namespace), if any.
    Reads `http`'s headers and scope only (callable off the event loop)."""
    snap = state.snapshot
    n_cmpl = resolve_n_cmpl(body, n_parallel=len(snap.slots))
    mind = request_mind(http.headers, body.mind, tenant_namespace(http.scope))
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
            n_ctx_slot=snap.n_ctx_slot,
            shape=snap.geometry,
            max_n_predict=max_n_predict,
            n_parallel=len(snap.slots),
            n_vocab=state.vocab.n_tokens,
            tokenize=tokenizer(state),
        )
        if req.sampling.ignore_eos:  # llama-server bans every EOG token in logit_bias
            bans = tuple((tok, -math.inf) for tok in state.vocab.eog_tokens)
            req = replace(
                req, sampling=replace(req.sampling, logit_bias=req.sampling.logit_bias + bans)
            )
        lora, asked = state.lora.for_request(body.lora)
        req = replace(with_constraint(req, constraint), lora=lora, lora_request=asked, mind=mind)

        out.extend([req] * n_cmpl)

    return out


def checked_constraint(state: ServerState, constraint: Constraint | None) -> Constraint | None:
    if constraint is not None:
        check_constraint(state.vocab, constraint)
    return constraint


def oai_meta(state: ServerState) -> OaiMeta:
    return OaiMeta(
        id=new_completion_id(),
        model=state.model_name,
        created=int(time.time()),
        system_fingerprint="kvswap",
    )


def prompt_tokens(state: ServerState, text: str) -> list[int]:
    """A rendered chat prompt's tokens (BOS added as the vocabulary asks, specials parsed)."""
    return [int(t) for t in state.tokenize(text, True, True)]
