"""Engine requests for a parsed body: tokenizing, sampling fields, constraints, the mind.

Shared by the generation routes (llama-server's, OpenAI's, Anthropic's): `generation_requests`
maps a body (and its tokenized prompts) onto `GenerationRequest`s through `params`, puts the
constraint's grammar in them and the mind the route holds (`streaming.Turn.mind`);
`checked_constraint` checks a grammar with libllama first.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.types import GenerationRequest
from kvswap.server.requests.constraints import Constraint, check_constraint, with_constraint
from kvswap.server.requests.params import Tokenize, build_generation, resolve_n_cmpl
from kvswap.server.requests.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    OaiCompletionRequest,
)
from kvswap.server.requests.serving import Serving


def tokenizer(state: Serving) -> Tokenize:
    def tokenize(text: str, add_special: bool) -> list[int]:
        return [int(t) for t in state.tokenize(text, add_special, True)]

    return tokenize


def generation_requests(
    state: Serving,
    body: CompletionRequest | OaiCompletionRequest | ChatCompletionRequest,
    prompts: list[list[int]],
    constraint: Constraint | None = None,
    *,
    mind: PageKey | None,
) -> list[GenerationRequest]:
    """The engine requests of a body: one per prompt and completion (`n`), constrained, under
    `mind`, the mind the request names (`"mind"` or `X-Mind-Id`, held by the route)."""
    assert body.mind is None or (mind is not None and mind.name == body.mind), (
        "the route holds the mind the body names"
    )
    snap = state.snapshot
    n_cmpl = resolve_n_cmpl(body, n_parallel=len(snap.slots))
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
            trained=snap.trained,
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


def checked_constraint(state: Serving, constraint: Constraint | None) -> Constraint | None:
    if constraint is not None:
        check_constraint(state.vocab, constraint)
    return constraint


def prompt_tokens(state: Serving, text: str) -> list[int]:
    """A rendered chat prompt's tokens (BOS added as the vocabulary asks, specials parsed)."""
    return [int(t) for t in state.tokenize(text, True, True)]
