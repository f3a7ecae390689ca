"""Response bodies of the OpenAI routes: /v1/completions and /v1/chat/completions.

Owns llama-server's OpenAI shapes (`server-task.cpp`): `to_json_oaicompat` (completions, final
and stream), `to_json_oaicompat_chat` (chat, final), `to_json_oaicompat_chat_stream` and the
partial's `to_json_oaicompat_chat` (chat stream chunks), `usage_json_oaicompat`, and the
merging of several results into `choices` (`handle_completions_impl`). llama-server adds
`timings` (and `prompt_progress`) to these objects; OpenAI clients ignore them.

A chat stream is, in order: a role chunk (`{"role": "assistant", "content": null}`) with the
first token, content chunks (one per step that released text), a finish chunk (empty delta,
`finish_reason`), then with `stream_options.include_usage` a usage chunk with no choices; the
last of these carries `timings`. Both OpenAI streams end with `SSE_DONE`.

Tool calls, reasoning content and `response_format` belong to the agent API issue. Pure.
"""

from __future__ import annotations

import secrets
import string
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvswap.core.types import (
    Completion,
    GenerationRequest,
    PromptProgress,
    StopType,
    TokenEvent,
    TokenProbs,
)
from kvswap.server.formats import final_timings, probs_json, progress_json, timings_json

_ID_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase


def new_completion_id() -> str:
    """`gen_chatcmplid`: "chatcmpl-" and 32 random letters and digits (both OpenAI routes)."""
    return "chatcmpl-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(32))


@dataclass(frozen=True)
class OaiMeta:
    """What every object of one OpenAI response repeats."""

    id: str  # new_completion_id(), the same for every chunk of a stream
    model: str  # the model alias, else the model file name (not the request's `model`)
    created: int  # Unix seconds
    system_fingerprint: str  # llama-server: its build info, "b<number>-<commit>"


def oai_meta(model_name: str) -> OaiMeta:
    """A new response's id and timestamp, under the server's model name."""
    return OaiMeta(
        id=new_completion_id(),
        model=model_name,
        created=int(time.time()),
        system_fingerprint="kvswap",
    )


def finish_reason(stop_type: StopType) -> str:
    """EOS and stop strings are "stop"; anything else (the length limit, a cancel) "length"."""
    return "stop" if stop_type in (StopType.EOS, StopType.WORD) else "length"


def usage_json(c: Completion) -> dict[str, Any]:
    """`usage_json_oaicompat`; `cached_tokens` is the prompt prefix reused (timings.cache_n)."""
    return {
        "completion_tokens": c.n_decoded,
        "prompt_tokens": c.n_prompt_tokens,
        "total_tokens": c.n_decoded + c.n_prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": c.timings.cache_n},
    }


def _envelope(meta: OaiMeta, obj: str) -> dict[str, Any]:
    return {
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.system_fingerprint,
        "object": obj,
        "id": meta.id,
    }


def logprobs_json(probs: Sequence[TokenProbs], post_sampling: bool) -> dict[str, Any]:
    return {"content": probs_json(probs, post_sampling=post_sampling)}


# -------------------------------------------------------------------------- /v1/completions


def completion_final(
    c: Completion,
    req: GenerationRequest,
    meta: OaiMeta,
    *,
    index: int = 0,
    verbose: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `text_completion` with `usage` and `timings`; in a stream, its last chunk.

    In stream mode `text` is empty and `logprobs` null (the chunks carried them). `verbose` is
    the native final, sent as `__verbose` when the request asked for it.
    """
    logprobs = None
    if not req.stream and c.probs:
        logprobs = logprobs_json(c.probs, req.post_sampling_probs)
    out: dict[str, Any] = {
        "choices": [
            {
                "text": "" if req.stream else c.content,
                "index": index,
                "logprobs": logprobs,
                "finish_reason": finish_reason(c.stop_type),
            }
        ],
        **_envelope(meta, "text_completion"),
        "usage": usage_json(c),
    }
    if verbose is not None:
        out["__verbose"] = dict(verbose)
    out.update(final_timings(c))
    return out


def completion_chunk(
    event: TokenEvent, meta: OaiMeta, *, index: int = 0, post_sampling: bool = False
) -> dict[str, Any]:
    """One stream chunk of /v1/completions: the step's text, `finish_reason` null."""
    out: dict[str, Any] = {
        "choices": [
            {
                "text": event.text,
                "index": index,
                "logprobs": logprobs_json(event.probs, post_sampling) if event.probs else None,
                "finish_reason": None,
            }
        ],
        **_envelope(meta, "text_completion"),
    }
    if event.timings is not None:
        out["timings"] = timings_json(event.timings)
    return out


def completion_progress_chunk(
    progress: PromptProgress, meta: OaiMeta, *, index: int = 0
) -> dict[str, Any]:
    """A prefill progress event of /v1/completions: empty text, `prompt_progress`."""
    out: dict[str, Any] = {
        "choices": [{"text": "", "index": index, "logprobs": None, "finish_reason": None}],
        **_envelope(meta, "text_completion"),
    }
    if progress.timings is not None:
        out["timings"] = timings_json(progress.timings)
    out["prompt_progress"] = progress_json(progress)
    return out


# --------------------------------------------------------------------- /v1/chat/completions


def chat_final(
    c: Completion,
    req: GenerationRequest,
    meta: OaiMeta,
    *,
    index: int = 0,
    verbose: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A non-streamed `chat.completion`: the assistant message, `usage`, `timings`."""
    choice: dict[str, Any] = {
        "finish_reason": finish_reason(c.stop_type),
        "index": index,
        "message": {"role": "assistant", "content": c.content},
    }
    if c.probs:
        choice["logprobs"] = logprobs_json(c.probs, req.post_sampling_probs)
    out: dict[str, Any] = {
        "choices": [choice],
        **_envelope(meta, "chat.completion"),
        "usage": usage_json(c),
    }
    if verbose is not None:
        out["__verbose"] = dict(verbose)
    out.update(final_timings(c))
    return out


def chat_chunk_json(meta: OaiMeta, index: int, delta: dict[str, Any], reason: str | None) -> dict:
    return {
        "choices": [{"finish_reason": reason, "index": index, "delta": delta}],
        **_envelope(meta, "chat.completion.chunk"),
    }


ROLE_DELTA: Mapping[str, Any] = {"role": "assistant", "content": None}


def chat_chunks(
    event: TokenEvent,
    meta: OaiMeta,
    *,
    first: bool,
    index: int = 0,
    post_sampling: bool = False,
) -> list[dict[str, Any]]:
    """The chunks of one step: the role chunk when `first`, then the text if any.

    `logprobs` and `timings` go on the last chunk; a step that released no text and is not the
    first sends nothing, as llama-server (its probabilities are dropped with it).
    """
    chunks = []
    if first:
        chunks.append(chat_chunk_json(meta, index, dict(ROLE_DELTA), None))
    if event.text:
        chunks.append(chat_chunk_json(meta, index, {"content": event.text}, None))
    if chunks:
        last = chunks[-1]
        if event.probs:
            last["choices"][0]["logprobs"] = logprobs_json(event.probs, post_sampling)
        if event.timings is not None:
            last["timings"] = timings_json(event.timings)
    return chunks


def chat_progress_chunk(progress: PromptProgress, meta: OaiMeta, *, index: int = 0) -> dict:
    """A prefill progress event: llama-server sends it as a role chunk with `prompt_progress`."""
    chunk = chat_chunk_json(meta, index, dict(ROLE_DELTA), None)
    if progress.timings is not None:
        chunk["timings"] = timings_json(progress.timings)
    chunk["prompt_progress"] = progress_json(progress)
    return chunk


def chat_final_chunks(
    c: Completion, meta: OaiMeta, *, include_usage: bool, index: int = 0
) -> list[dict[str, Any]]:
    """The stream's closing chunks: `finish_reason` with an empty delta, then (with
    `stream_options.include_usage`) `usage` with no choices; the last one carries `timings`."""
    chunks = [chat_chunk_json(meta, index, {}, finish_reason(c.stop_type))]
    if include_usage:
        chunks.append({"choices": [], **_envelope(meta, "chat.completion.chunk")})
        chunks[-1]["usage"] = usage_json(c)
    chunks[-1].update(final_timings(c))
    return chunks


# ------------------------------------------------------------------------------- several


def merge_choices(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several finals (`n` > 1, or a batch of prompts) as one object with several `choices`.

    llama-server keeps the first result's `usage`; kvswap sums `completion_tokens` over the
    choices (OpenAI's meaning) and keeps the first's prompt counts (the `n` copies of one
    prompt share it).
    """
    assert results, "merge_choices needs at least one result"
    out = dict(results[0])
    out["choices"] = [choice for res in results for choice in res["choices"]]
    if "usage" in out:
        usage = dict(out["usage"])
        usage["completion_tokens"] = sum(res["usage"]["completion_tokens"] for res in results)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        out["usage"] = usage
    return out
