"""Response bodies shared by every route: timings (and how a mind was served, as a body block
and as headers), probabilities, generation settings, /tokenize, /detokenize, /apply-template
and slot actions.

Pure functions from engine results to JSON-able dicts, in llama-server's shapes (read from
`server-task.cpp`, `server-common.cpp` and `server-context.cpp`; the source function is named
on each). `/completion` lives in `formats_native.py`, the OpenAI routes in `formats_oai.py`,
/slots, /props and /v1/models in `formats_info.py`. Error bodies are `errors.error_json`'s and
server-sent events `sse.py`'s.

No I/O, no engine calls, no clocks: ids and timestamps come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvswap.core.sampling import SamplingParams
from kvswap.core.types import (
    Completion,
    GenerationRequest,
    MindServed,
    PromptProgress,
    Timings,
    TokenProbs,
)
from kvswap.engine.plan.geometry import Geometry
from kvswap.tiers.shared.replica import LoopView

FLOAT32_LOWEST = -3.4028234663852886e38  # std::numeric_limits<float>::lowest(): log(0)

# ------------------------------------------------------------------------------------- text


def utf8_complete_len(data: bytes) -> int:
    """Length of `data` without a multi-byte sequence cut off at its end (`validate_utf8`)."""
    n = len(data)
    for i in range(1, min(4, n) + 1):
        byte = data[n - i]
        if (byte & 0xE0) == 0xC0 and i < 2:
            return n - i
        if (byte & 0xF0) == 0xE0 and i < 3:
            return n - i
        if (byte & 0xF8) == 0xF0 and i < 4:
            return n - i
    return n


def piece_text(piece: bytes) -> str:
    """A token piece as JSON text: the cut-off tail dropped, invalid bytes replaced.

    llama-server truncates with `validate_utf8` and lets its JSON writer replace the rest.
    """
    return piece[: utf8_complete_len(piece)].decode("utf-8", errors="replace")


def piece_json(piece: bytes) -> str | list[int]:
    """/tokenize's `piece`: a string when valid UTF-8, else the list of byte values."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


# ---------------------------------------------------------------------------- timings, probs


def timings_json(t: Timings) -> dict[str, Any]:
    """`server_slot_stats::to_json`; `draft_n`/`draft_n_accepted` when drafts were sent (as
    llama-server), and kvswap's `draft_prompt_n` (the draft model's prefill) when speculating."""
    out: dict[str, Any] = {
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": t.prompt_per_token_ms,
        "prompt_per_second": t.prompt_per_second,
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": t.predicted_per_token_ms,
        "predicted_per_second": t.predicted_per_second,
    }
    if t.draft_n > 0:
        out["draft_n"] = t.draft_n
        out["draft_n_accepted"] = t.draft_n_accepted
    if t.speculative:
        out["draft_prompt_n"] = t.draft_prompt_n
    return out


def served_json(s: MindServed) -> dict[str, Any]:
    """kvswap's `mind` block of an answer: which mind, the tier its state came from, the time
    its switch into the slot took, and whether the request kept its whole history (else where
    it diverged and how many of its tokens were dropped)."""
    return {
        "name": s.key.name,
        "tier_before": s.source.value,
        "switch_ms": round(s.switch_ms, 3),
        "n_tokens_before": s.n_tokens,
        "diverged_at": s.n_kept if s.diverged else None,
        "n_dropped": s.n_dropped,
    }


def final_timings(c: Completion) -> dict[str, Any]:
    """An answer's last `timings`, with kvswap's `mind` block beside them for a mind's turn."""
    return {"timings": timings_json(c.timings), **served_block(c)}


def served_block(c: Completion) -> dict[str, Any]:
    """kvswap's `mind` block alone, for a mind's turn (Anthropic's answers, which carry no
    `timings`: llama-server's suite checks that they do not)."""
    return {} if c.served is None else {"mind": served_json(c.served)}


def served_headers(s: MindServed) -> dict[str, str]:
    """The same as headers, for clients that read no body field (and streams, whose headers
    come first): `X-Kvswap-Mind` (the name's UTF-8 bytes, as `X-Mind-Id` takes them),
    `X-Kvswap-Tier-Before`, `X-Kvswap-Switch-Ms`, and for a request that diverged from its
    mind's history `X-Kvswap-Diverged-At` and `X-Kvswap-Dropped-Tokens`."""
    out = {
        "X-Kvswap-Mind": s.key.name.encode("utf-8").decode("latin-1"),
        "X-Kvswap-Tier-Before": s.source.value,
        "X-Kvswap-Switch-Ms": f"{s.switch_ms:.3f}",
    }
    if s.diverged:
        out["X-Kvswap-Diverged-At"] = str(s.n_kept)
        out["X-Kvswap-Dropped-Tokens"] = str(s.n_dropped)
    return out


def progress_json(p: PromptProgress) -> dict[str, Any]:
    """`result_prompt_progress::to_json` (time_ms is an integer there)."""
    return {"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": int(p.time_ms)}


def _logprob(prob: float) -> float:
    # llama-server's `logarithm`: its JSON writer turns -inf into null, so log(0) is the lowest
    # finite float instead.
    return FLOAT32_LOWEST if prob <= 0.0 else math.log(prob)


def _prob_fields(token: int, piece: bytes, prob: float, post_sampling: bool) -> dict[str, Any]:
    return {
        "id": token,
        "token": piece_text(piece),
        "bytes": list(piece),
        **({"prob": prob} if post_sampling else {"logprob": _logprob(prob)}),
    }


def probs_json(probs: Sequence[TokenProbs], *, post_sampling: bool) -> list[dict[str, Any]]:
    """`completion_token_output::probs_vector_to_json`.

    `post_sampling` (the request's `post_sampling_probs`) chooses `prob`/`top_probs` over
    `logprob`/`top_logprobs`.
    """
    top_key = "top_probs" if post_sampling else "top_logprobs"
    return [
        {
            **_prob_fields(p.token, p.piece, p.prob, post_sampling),
            top_key: [_prob_fields(t.token, t.piece, t.prob, post_sampling) for t in p.top],
        }
        for p in probs
    ]


# ------------------------------------------------------------------------ generation settings


@dataclass(frozen=True)
class TaskExtras:
    """`task_params` fields the engine does not carry, reported as llama-server reports them."""

    n_keep: int = 0
    n_discard: int = 0
    grammar: str = ""
    grammar_lazy: bool = False
    chat_format: str = "Content-only"
    reasoning_format: str = "deepseek"  # common_params' default for completion requests
    reasoning_in_content: bool = False
    generation_prompt: str = ""
    speculative_types: str = "none"
    backend_sampling: bool = False


def generation_settings_json(
    req: GenerationRequest,
    sampling: SamplingParams | None = None,
    *,
    extras: TaskExtras | None = None,
    only_metrics: bool = False,
) -> dict[str, Any]:
    """`task_params::to_json`: `generation_settings`, /slots `params`, /props' defaults.

    `sampling` overrides `req.sampling` (pass the completion's, whose seed is the one used).
    `only_metrics` drops stop, logit_bias, DRY breakers and grammar fields, as llama-server.
    """
    s = req.sampling if sampling is None else sampling
    x = TaskExtras() if extras is None else extras
    full = not only_metrics
    out = _sampler_json(s, full=full)
    out.update(
        {
            **({"stop": list(req.stop)} if full else {}),
            "max_tokens": req.n_predict,
            "n_predict": req.n_predict,
            "n_keep": x.n_keep,
            "n_discard": x.n_discard,
            "ignore_eos": s.ignore_eos,
            "stream": req.stream,
            **({"logit_bias": logit_bias_json(s.logit_bias)} if full else {}),
            "n_probs": req.n_probs,
            "min_keep": s.min_keep,
        }
    )
    if full:
        out["grammar"] = x.grammar
        out["grammar_lazy"] = x.grammar_lazy
        out["grammar_triggers"] = []
        out["preserved_tokens"] = []
    out.update(
        {
            "chat_format": x.chat_format,
            "reasoning_format": x.reasoning_format,
            "reasoning_in_content": x.reasoning_in_content,
            "generation_prompt": x.generation_prompt,
            "samplers": list(s.samplers),
            "speculative.types": x.speculative_types,
            "timings_per_token": req.timings_per_token,
            "post_sampling_probs": req.post_sampling_probs,
            "backend_sampling": x.backend_sampling,
            "lora": [{"id": i, "scale": scale} for i, scale in req.lora_request],
        }
    )
    return out


def _sampler_json(s: SamplingParams, *, full: bool) -> dict[str, Any]:
    """The sampler settings, in `task_params::to_json`'s order (the DRY breakers when `full`)."""
    return {
        "seed": s.seed,
        "temperature": s.temperature,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        **({"dry_sequence_breakers": list(s.dry_sequence_breakers)} if full else {}),
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "adaptive_target": s.adaptive_target,
        "adaptive_decay": s.adaptive_decay,
    }


@dataclass(frozen=True)
class KvGeometry:
    """One context's KV geometry (the target's, or the draft's): /props `context_geometry`,
    and the old and new geometries of a /reconfigure receipt."""

    n_ctx: int  # the KV pool, all slots
    n_ctx_slot: int  # one slot's window
    n_parallel: int
    n_batch: int
    n_ubatch: int
    kv_unified: bool
    cache_type_k: str  # "f16", "q8_0", ...
    cache_type_v: str

    @classmethod
    def of(cls, g: Geometry, *, n_ctx: int, n_ctx_slot: int) -> KvGeometry:
        return cls(n_ctx, n_ctx_slot, g.n_parallel, g.n_batch, g.n_ubatch, g.kv_unified,
                   g.cache_type_k, g.cache_type_v)  # fmt: skip


def kv_geometry_json(g: KvGeometry) -> dict[str, Any]:
    """A geometry as JSON, the one shape of /props and /reconfigure."""
    return {
        "n_ctx": g.n_ctx,
        "n_ctx_slot": g.n_ctx_slot,
        "n_parallel": g.n_parallel,
        "n_batch": g.n_batch,
        "n_ubatch": g.n_ubatch,
        "kv_unified": g.kv_unified,
        "cache_type_k": g.cache_type_k,
        "cache_type_v": g.cache_type_v,
    }


def logit_bias_json(logit_bias: Sequence[tuple[int, float]]) -> list[dict[str, Any]]:
    """`task_params::format_logit_bias`; a ban (-inf) is null, as nlohmann writes it."""
    return [
        {"bias": bias if math.isfinite(bias) else None, "token": token}
        for token, bias in logit_bias
    ]


def select_fields(paths: Sequence[str], body: Mapping[str, Any]) -> dict[str, Any]:
    """`json_get_nested_values` for `response_fields`: "a/b" moves body["a"]["b"] to key "a/b".

    Missing paths are left out without an error.
    """
    out: dict[str, Any] = {}
    for path in paths:
        node: Any = body
        for key in path.split("/"):
            if not isinstance(node, Mapping) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out


# --------------------------------------------------------------------- small route bodies


def health_json(
    threads: Sequence[LoopView] = (), n_minds_held: int | None = None
) -> dict[str, Any]:
    """llama-server's `{"status": "ok"}`; on a replica of a cluster, how many minds it holds
    (`kvswap cluster status` shows it) and its shared tier's background threads (alive,
    failed passes, restarts, the last error)."""
    body: dict[str, Any] = {"status": "ok"}
    if n_minds_held is not None:
        body["n_minds_held"] = n_minds_held
    if threads:
        body["threads"] = [
            {"name": t.name, "alive": t.alive, "n_failures": t.n_failures,
             "n_restarts": t.n_restarts, "last_error": t.last_error}
            for t in threads
        ]  # fmt: skip
    return body


def tokenize_json(tokens: Sequence[int], pieces: Sequence[bytes] | None = None) -> dict[str, Any]:
    """/tokenize: ids, or `{"id", "piece"}` objects when `with_pieces` (pieces given)."""
    if pieces is None:
        return {"tokens": list(tokens)}
    assert len(pieces) == len(tokens)
    return {
        "tokens": [{"id": t, "piece": piece_json(p)} for t, p in zip(tokens, pieces, strict=True)]
    }


def detokenize_json(content: str) -> dict[str, Any]:
    return {"content": content}


def apply_template_json(prompt: str) -> dict[str, Any]:
    return {"prompt": prompt}


def slot_save_json(
    id_slot: int, filename: str, n_saved: int, n_written: int, save_ms: float
) -> dict[str, Any]:
    """`server_task_result_slot_save_load::to_json`, save: tokens saved, bytes written."""
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_saved": n_saved,
        "n_written": n_written,
        "timings": {"save_ms": save_ms},
    }


def slot_restore_json(
    id_slot: int, filename: str, n_restored: int, n_read: int, restore_ms: float
) -> dict[str, Any]:
    """`server_task_result_slot_save_load::to_json`, restore: tokens restored, bytes read."""
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_restored": n_restored,
        "n_read": n_read,
        "timings": {"restore_ms": restore_ms},
    }


def slot_erase_json(id_slot: int, n_erased: int) -> dict[str, Any]:
    """`server_task_result_slot_erase::to_json`: tokens erased."""
    return {"id_slot": id_slot, "n_erased": n_erased}
