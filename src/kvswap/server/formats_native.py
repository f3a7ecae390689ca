"""Response bodies of llama-server's native /completion (and /completions).

Owns the final object (`server_task_result_cmpl_final::to_json_non_oaicompat`) and the stream
chunks (`server_task_result_cmpl_partial::to_json_non_oaicompat`), including prompt-progress
events. A batch of prompts answers with a list of finals, one per prompt, which the route
builds. The native stream has no `[DONE]` event: it ends after the final object. In the shell,
not `llama/`: an OpenAI final under `verbose` carries the native one too (`__verbose`).

Pure: engine results in, JSON-able dicts out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvswap.core.types import Completion, GenerationRequest, PromptProgress, TokenEvent
from kvswap.server.formats import (
    TaskExtras,
    final_timings,
    generation_settings_json,
    probs_json,
    progress_json,
    select_fields,
    timings_json,
)


def native_final(
    c: Completion,
    req: GenerationRequest,
    *,
    model: str,
    prompt_text: str,
    index: int = 0,
    return_tokens: bool = False,
    response_fields: Sequence[str] = (),
    extras: TaskExtras | None = None,
) -> dict[str, Any]:
    """The last object of a /completion: the whole result, or the stream's closing chunk.

    In stream mode `content` and `tokens` are empty (the chunks carried them) and there are no
    `completion_probabilities`, as llama-server. `tokens` holds ids only with `return_tokens`.
    `prompt_text` is the prompt detokenized with special tokens. `generation_settings` reports
    the seed the sampler used. `response_fields` keeps only the listed (slash-nested) fields.
    """
    sampling = dataclasses.replace(c.sampling, seed=c.seed)
    out: dict[str, Any] = {
        "index": index,
        "content": "" if req.stream else c.content,
        "tokens": list(c.tokens) if return_tokens and not req.stream else [],
        "id_slot": c.id_slot,
        "stop": True,
        "model": model,
        "tokens_predicted": c.n_decoded,
        "tokens_evaluated": c.n_prompt_tokens,
        "generation_settings": generation_settings_json(req, sampling, extras=extras),
        "prompt": prompt_text,
        "has_new_line": "\n" in c.content,
        # llama-server sets this after a context shift; kvswap never shifts (a full window ends
        # the request with stop_type "limit").
        "truncated": False,
        "stop_type": c.stop_type.value,
        "stopping_word": c.stopping_word,
        "tokens_cached": c.n_tokens_cached,
        **final_timings(c),
    }
    if not req.stream and c.probs:
        out["completion_probabilities"] = probs_json(c.probs, post_sampling=req.post_sampling_probs)
    return select_fields(response_fields, out) if response_fields else out


def native_chunk(
    event: TokenEvent, *, index: int = 0, post_sampling: bool = False
) -> dict[str, Any]:
    """One stream chunk: the text and token ids of one step.

    `timings` is present when the engine attached them (`timings_per_token`, or the last
    chunk); `completion_probabilities` when the request asked for `n_probs`.
    """
    out: dict[str, Any] = {
        "index": index,
        "content": event.text,
        "tokens": list(event.tokens),
        "stop": False,
        "id_slot": event.id_slot,
        "tokens_predicted": event.n_decoded,
        "tokens_evaluated": event.n_prompt_tokens,
    }
    if event.timings is not None:
        out["timings"] = timings_json(event.timings)
    if event.probs:
        out["completion_probabilities"] = probs_json(event.probs, post_sampling=post_sampling)
    return out


def native_progress_chunk(
    progress: PromptProgress, *, id_slot: int, index: int = 0
) -> dict[str, Any]:
    """A prefill progress event (`return_progress`, stream only).

    llama-server sends `tokens: [0]` here (an unset token); kvswap sends no token.
    """
    out: dict[str, Any] = {
        "index": index,
        "content": "",
        "tokens": [],
        "stop": False,
        "id_slot": id_slot,
        "tokens_predicted": 0,
        "tokens_evaluated": progress.total,
    }
    if progress.timings is not None:
        out["timings"] = timings_json(progress.timings)
    out["prompt_progress"] = progress_json(progress)
    return out
