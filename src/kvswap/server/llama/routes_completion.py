"""llama-server's generation routes: /completion, /completions and /apply-template.

Each route validates its body (`requests.schemas`), turns it into engine requests
(`requests.params`, `requests.jobs`; tokenizing and grammar checks happen here, off the engine
thread), runs them (`streaming`), and shapes the answer as llama-server does (`formats_native`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvswap.core.types import (
    Completion,
    Event,
    GenerationRequest,
    PromptProgress,
    TokenEvent,
)
from kvswap.server.formats import TaskExtras, apply_template_json
from kvswap.server.llama.formats_native import native_chunk, native_final, native_progress_chunk
from kvswap.server.openapi import body_schema
from kvswap.server.requests.chat import plan_chat
from kvswap.server.requests.constraints import Constraint, completion_constraint
from kvswap.server.requests.jobs import (
    checked_constraint,
    generation_requests,
    tokenizer,
)
from kvswap.server.requests.offload import prepared
from kvswap.server.requests.params import (
    parse_prompt,
    tokenize_prompt,
)
from kvswap.server.requests.schemas import (
    ApplyTemplateRequest,
    CompletionRequest,
    parse_body,
)
from kvswap.server.state import get_state
from kvswap.server.streaming import complete_all, open_stream

router = APIRouter()


# ------------------------------------------------------------------------- native /completion


@router.post("/completion", openapi_extra=body_schema(CompletionRequest))
@router.post("/completions", openapi_extra=body_schema(CompletionRequest))
async def completion(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()

    def prepare() -> tuple[
        CompletionRequest, Constraint | None, list[GenerationRequest], list[str]
    ]:
        body = parse_body(CompletionRequest, raw)
        tokenize = tokenizer(state)
        prompts = [
            tokenize_prompt(p, tokenize, add_special=True) for p in parse_prompt(body.prompt)
        ]
        constraint = checked_constraint(state, completion_constraint(body))
        reqs = generation_requests(state, body, prompts, constraint, http=request)
        # The final answer repeats each prompt's text (as llama-server's "prompt").
        texts = [state.vocab.detokenize(list(p), special=True) for p in prompts]
        return body, constraint, reqs, texts

    body, constraint, reqs, prompt_texts = await prepared(raw, prepare)
    n_per_prompt = max(1, len(reqs) // max(1, len(prompt_texts)))
    runner = state.runner()
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
            prompt_text=prompt_texts[index // n_per_prompt],
            index=index,
            return_tokens=bool(body.return_tokens),
            response_fields=body.response_fields or (),
            extras=extras,
        )

    if not body.stream:
        results = await complete_all(runner, reqs, request)
        objs = [final(i, c, r) for i, (c, r) in enumerate(zip(results, reqs, strict=True))]
        return JSONResponse(objs[0] if len(objs) == 1 else objs)

    def render(index: int, event: Event) -> Iterable[dict[str, Any]]:
        if isinstance(event, TokenEvent):
            yield native_chunk(event, index=index, post_sampling=reqs[index].post_sampling_probs)
        elif isinstance(event, PromptProgress):
            yield native_progress_chunk(event, id_slot=-1, index=index)
        elif isinstance(event, Completion):
            yield final(index, event, reqs[index])

    return await open_stream(runner, reqs, render, http=request, done_marker=False)


@router.post("/apply-template", openapi_extra=body_schema(ApplyTemplateRequest))
async def apply_template(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()

    def render() -> str:
        return plan_chat(state, parse_body(ApplyTemplateRequest, raw)).prompt

    return JSONResponse(apply_template_json(await prepared(raw, render)))
