"""llama-server's generation routes: /completion, /completions and /apply-template.

Each route holds the mind its request names first (`streaming.turn`), validates its body
(`requests.schemas`), turns it into engine requests (`requests.params`, `requests.jobs`;
tokenizing and grammar checks happen here, off the engine thread), runs them (`streaming`),
and shapes the answer as llama-server does (`formats_native`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.core.keys import PageKey
from kvswap.core.types import (
    Completion,
    Event,
    GenerationRequest,
    PromptProgress,
    TokenEvent,
)
from kvswap.server.formats import TaskExtras, apply_template_json
from kvswap.server.formats_native import native_chunk, native_final, native_progress_chunk
from kvswap.server.openapi import body_schema
from kvswap.server.requests.chat import plan_chat
from kvswap.server.requests.constraints import Constraint, completion_constraint
from kvswap.server.requests.jobs import checked_constraint, generation_requests, tokenizer
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.params import parse_prompt, tokenize_prompt
from kvswap.server.requests.schemas import ApplyTemplateRequest, CompletionRequest, parse_body
from kvswap.server.requests.serving import Serving
from kvswap.server.state import get_state
from kvswap.server.streaming import complete_all, open_stream, turn

router = APIRouter()


# ------------------------------------------------------------------------- native /completion


@router.post("/completion", openapi_extra=body_schema(CompletionRequest))
@router.post("/completions", openapi_extra=body_schema(CompletionRequest))
async def completion(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    async with turn(state, request, raw) as runner:
        job = await prepared(raw, lambda: _prepare(state, raw, runner.mind))
        body, reqs = job.body, job.requests
        extras = TaskExtras(
            grammar=job.constraint.grammar if job.constraint else "",
            grammar_lazy=job.constraint.lazy if job.constraint else False,
            speculative_types=state.config.spec.spec_type,
        )
        n_per_prompt = max(1, len(reqs) // max(1, len(job.prompt_texts)))

        def final(index: int, c: Completion, req: GenerationRequest) -> dict[str, Any]:
            return native_final(
                c,
                req,
                model=state.model_name,
                prompt_text=job.prompt_texts[index // n_per_prompt],
                index=index,
                return_tokens=bool(body.return_tokens),
                response_fields=body.response_fields or (),
                extras=extras,
            )

        if not body.stream:
            results = await complete_all(runner, reqs, request)
            objs = [final(i, c, r) for i, (c, r) in enumerate(zip(results, reqs, strict=True))]
            return JSONResponse(objs[0] if len(objs) == 1 else objs, headers=runner.headers())

        def render(index: int, event: Event) -> Iterable[dict[str, Any]]:
            if isinstance(event, TokenEvent):
                post_sampling = reqs[index].post_sampling_probs
                yield native_chunk(event, index=index, post_sampling=post_sampling)
            elif isinstance(event, PromptProgress):
                yield native_progress_chunk(event, id_slot=-1, index=index)
            elif isinstance(event, Completion):
                yield final(index, event, reqs[index])

        return await open_stream(runner, reqs, render, http=request, done_marker=False)


@dataclass(frozen=True)
class _CompletionJob:
    body: CompletionRequest
    constraint: Constraint | None
    requests: list[GenerationRequest]
    prompt_texts: list[str]  # each prompt's text: the final answer repeats it ("prompt")


def _prepare(state: Serving, raw: bytes, mind: PageKey | None) -> _CompletionJob:
    body = parse_body(CompletionRequest, raw)
    tokenize = tokenizer(state)
    prompts = [tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)]
    constraint = checked_constraint(state, completion_constraint(body))
    reqs = generation_requests(state, body, prompts, constraint, mind=mind)
    texts = [state.vocab.detokenize(list(p), special=True) for p in prompts]
    return _CompletionJob(body, constraint, reqs, texts)


@router.post("/apply-template", openapi_extra=body_schema(ApplyTemplateRequest))
async def apply_template(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()

    def render() -> str:
        return plan_chat(state, parse_body(ApplyTemplateRequest, raw)).prompt

    return JSONResponse(apply_template_json(await prepared(raw, render)))
