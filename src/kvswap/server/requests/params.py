"""Request bodies -> engine parameters, as llama-server maps them.

Owns the meaning of request fields: server defaults (`SamplingDefaults`, from the flags) under
request values, llama-server's aliases (`max_tokens`, `logprobs`, `n`), its soft-limit clamps
(`top_p` into [0, 1], ...), the prompt forms, and the typed errors for values that could harm
the server (an oversized `n_probs`, `n_predict` or `logit_bias`, an out-of-range slot or token).
Sources: `server-schema.cpp` (`make_llama_cmpl_schema`, `eval_llama_cmpl_schema`),
`server-common.cpp` (`tokenize_mixed`, `tokenize_input_prompts`, `oaicompat_*_params_parse`),
`server-context.cpp` (the prompt-size check).

Pure: text is tokenized through a callable the route passes in (vocabulary calls may run off the
engine thread); nothing here touches the engine or libllama.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kvswap.config.advice import Trained, WindowShape, exceeds_context_message
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.sampling import SAMPLER_ALIASES, SAMPLER_CHARS, SamplingParams
from kvswap.core.types import GenerationRequest
from kvswap.server.requests.schemas import (
    INT32_MAX,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
    OaiCompletionRequest,
    PromptInput,
    PromptObject,
)

MAX_N_PROBS = 100  # per generated token; OpenAI allows 20, llama-server has no bound
MAX_LOGIT_BIAS = 1 << 18  # entries after tokenizing text keys; the largest vocabularies are ~262k
DEFAULT_TOP_LOGPROBS = 20  # chat `logprobs: true` without `top_logprobs`, as llama-server
# libllama's seed is a uint32 and llama-server wraps any integer into it, so -1 (the flag's and
# a request's "random") becomes LLAMA_DEFAULT_SEED, 0xFFFFFFFF.
_SEED_MASK = 0xFFFFFFFF

T = TypeVar("T")
Fields = dict[str, Any]  # keyword arguments of a dataclass, built in parts

# text -> token ids; the bool is add_special (BOS). The route binds parse_special.
Tokenize = Callable[[str, bool], Sequence[int]]


class SamplingDefaultsLike(Protocol):
    """The server-wide defaults a request's sampling fields fall back to.

    `config.settings.SamplingDefaults` satisfies it. Fields it may lack (`dynatemp_*`,
    `adaptive_*`, `dry_sequence_breakers`, `logit_bias`) fall back to `SamplingParams`'s.
    """

    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def typical_p(self) -> float: ...
    @property
    def repeat_last_n(self) -> int: ...
    @property
    def repeat_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def dry_multiplier(self) -> float: ...
    @property
    def dry_base(self) -> float: ...
    @property
    def dry_allowed_length(self) -> int: ...
    @property
    def dry_penalty_last_n(self) -> int: ...
    @property
    def xtc_probability(self) -> float: ...
    @property
    def xtc_threshold(self) -> float: ...
    @property
    def top_n_sigma(self) -> float: ...
    @property
    def mirostat(self) -> int: ...
    @property
    def mirostat_tau(self) -> float: ...
    @property
    def mirostat_eta(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def n_predict(self) -> int: ...
    @property
    def n_probs(self) -> int: ...
    @property
    def ignore_eos(self) -> bool: ...
    @property
    def samplers(self) -> tuple[str, ...]: ...


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


# ---------------------------------------------------------------------------------- sampling


def build_sampling(
    body: GenerationFields,
    defaults: SamplingDefaultsLike,
    *,
    tokenize: Tokenize | None = None,
    n_vocab: int | None = None,
    max_logit_bias: int = MAX_LOGIT_BIAS,
) -> SamplingParams:
    """The request's sampler chain: its fields over the server defaults, clamped as llama-server.

    `tokenize` turns logit_bias text keys into tokens (needed only when the body has some);
    `n_vocab` drops logit_bias tokens outside the vocabulary, as llama-server does.
    """
    base = SamplingParams()
    b, d = body, defaults
    logit_bias = (
        tuple(_extra(d, "logit_bias", base))
        if b.logit_bias is None
        else parse_logit_bias(
            b.logit_bias, tokenize=tokenize, n_vocab=n_vocab, max_entries=max_logit_bias
        )
    )
    return SamplingParams(
        **_truncation(b, d, base),
        **_penalties(b, d, base),
        min_keep=_pick(b.min_keep, base.min_keep),
        seed=(b.seed if b.seed is not None else d.seed) & _SEED_MASK,
        ignore_eos=_pick(b.ignore_eos, d.ignore_eos),
        logit_bias=logit_bias,
        samplers=tuple(d.samplers) if b.samplers is None else parse_samplers(b.samplers),
    )


def _truncation(b: GenerationFields, d: SamplingDefaultsLike, base: SamplingParams) -> Fields:
    """Temperature and the samplers that cut the candidates (top-k/p, min-p, XTC, mirostat)."""
    return {
        "temperature": d.temperature if b.temperature is None else max(0.0, b.temperature),
        "dynatemp_range": _pick(b.dynatemp_range, _extra(d, "dynatemp_range", base)),
        "dynatemp_exponent": _pick(b.dynatemp_exponent, _extra(d, "dynatemp_exponent", base)),
        "top_k": d.top_k if b.top_k is None else int(_clamp(b.top_k, 0, INT32_MAX)),
        "top_p": d.top_p if b.top_p is None else _clamp(b.top_p, 0.0, 1.0),
        "min_p": d.min_p if b.min_p is None else _clamp(b.min_p, 0.0, 1.0),
        "typical_p": _pick(b.typical_p, d.typical_p),
        "xtc_probability": (
            d.xtc_probability if b.xtc_probability is None else _clamp(b.xtc_probability, 0.0, 1.0)
        ),
        "xtc_threshold": (
            d.xtc_threshold if b.xtc_threshold is None else _clamp(b.xtc_threshold, 0.0, 1.0)
        ),
        "top_n_sigma": _pick(b.top_n_sigma, d.top_n_sigma),
        "mirostat": d.mirostat if b.mirostat is None else int(_clamp(b.mirostat, 0, 2)),
        "mirostat_tau": _pick(b.mirostat_tau, d.mirostat_tau),
        "mirostat_eta": _pick(b.mirostat_eta, d.mirostat_eta),
    }


def _penalties(b: GenerationFields, d: SamplingDefaultsLike, base: SamplingParams) -> Fields:
    """The repetition, presence and frequency penalties, DRY and the adaptive sampler."""
    return {
        "repeat_last_n": _pick(b.repeat_last_n, d.repeat_last_n),
        "repeat_penalty": _pick(b.repeat_penalty, d.repeat_penalty),
        "presence_penalty": _pick(b.presence_penalty, d.presence_penalty),
        "frequency_penalty": _pick(b.frequency_penalty, d.frequency_penalty),
        "dry_multiplier": _pick(b.dry_multiplier, d.dry_multiplier),
        "dry_base": d.dry_base if b.dry_base is None or b.dry_base < 1.0 else b.dry_base,
        "dry_allowed_length": _pick(b.dry_allowed_length, d.dry_allowed_length),
        "dry_penalty_last_n": _pick(b.dry_penalty_last_n, d.dry_penalty_last_n),
        "dry_sequence_breakers": (
            _extra(d, "dry_sequence_breakers", base)
            if b.dry_sequence_breakers is None
            else tuple(b.dry_sequence_breakers)
        ),
        "adaptive_target": (
            _extra(d, "adaptive_target", base)
            if b.adaptive_target is None
            else min(b.adaptive_target, 1.0)
        ),
        "adaptive_decay": _pick(b.adaptive_decay, _extra(d, "adaptive_decay", base)),
    }


def _pick(value: T | None, default: T) -> T:
    return default if value is None else value


def _extra(defaults: object, name: str, base: SamplingParams) -> Any:
    return getattr(defaults, name, getattr(base, name))


def parse_logit_bias(
    raw: list[list[Any]] | dict[str, Any],
    *,
    tokenize: Tokenize | None,
    n_vocab: int | None,
    max_entries: int = MAX_LOGIT_BIAS,
) -> tuple[tuple[int, float], ...]:
    """llama-server's two forms, in order: `[[token|text, bias|false], ...]` or `{key: bias}`.

    `false` bans the token (-inf). A text (or an object key that is not an integer) stands for
    every token of its tokenization. Token ids outside [0, n_vocab) are dropped, as llama-server;
    more than `max_entries` entries is a 400. Shapes were checked by the schema.
    """
    pairs: list[tuple[int | str, object]]
    if isinstance(raw, dict):
        pairs = [(int(k) if _INT_KEY.fullmatch(k) else k, v) for k, v in raw.items()]
    else:
        pairs = [(entry[0], entry[1]) for entry in raw]
    out: list[tuple[int, float]] = []
    for key, value in pairs:
        bias = float("-inf") if value is False else float(value)  # type: ignore[arg-type]
        if isinstance(key, str):
            assert tokenize is not None, "logit_bias text keys need the route's tokenizer"
            tokens: Sequence[int] = tokenize(key, False)
        else:
            tokens = (key,)
        out.extend((tok, bias) for tok in tokens if n_vocab is None or 0 <= tok < n_vocab)
        if len(out) > max_entries:
            raise _invalid(f"logit_bias has more than {max_entries} entries")
    return tuple(out)


_INT_KEY = re.compile(r"-?[0-9]+")

# llama-server's `common_sampler_types_from_names` also takes each canonical name without
# underscores ("topk", "minp") and "typ"; names are case-insensitive.
_SAMPLER_NAMES: dict[str, str] = {
    **SAMPLER_ALIASES,
    **{canon.replace("_", ""): canon for canon in set(SAMPLER_ALIASES.values())},
    "typ": "typ_p",
}


def parse_samplers(raw: list[str] | str) -> tuple[str, ...]:
    """The chain order: a list of names (aliases allowed) or a string of one-letter codes.

    llama-server skips unknown entries with a warning; kvswap refuses them with a 400 that names
    them, since a silently shorter chain samples differently from what was asked.
    """
    if isinstance(raw, str):
        unknown = [c for c in raw if c not in SAMPLER_CHARS]
        if unknown:
            raise _invalid(f"samplers: unknown sampler codes {''.join(unknown)!r}")
        return tuple(SAMPLER_CHARS[c] for c in raw)
    names = [_SAMPLER_NAMES.get(name.lower()) for name in raw]
    unknown_names = [raw[i] for i, name in enumerate(names) if name is None]
    if unknown_names:
        raise _invalid(f"samplers: unknown sampler names {unknown_names}")
    return tuple(name for name in names if name is not None)


# -------------------------------------------------------------------------------- generation


def build_generation(
    body: CompletionRequest | OaiCompletionRequest | ChatCompletionRequest,
    defaults: SamplingDefaultsLike,
    *,
    prompt_tokens: Sequence[int],
    n_ctx_slot: int,
    max_n_predict: int | None,
    n_parallel: int | None = None,
    n_vocab: int | None = None,
    tokenize: Tokenize | None = None,
    max_n_probs: int = MAX_N_PROBS,
    shape: WindowShape | None = None,
    trained: Trained | None = None,
) -> GenerationRequest:
    """One engine request for one (tokenized) prompt of `body`.

    Typed 400s: an empty prompt; a token id outside the vocabulary (when `n_vocab` is given);
    a prompt of `n_ctx_slot` tokens or more (`exceed_context_size_error`, with `n_prompt_tokens`
    and `n_ctx`, as llama-server); `n_predict` above `max_n_predict` (None: no cap; with a cap,
    an unlimited request is capped); `id_slot` or `n` at or past `n_parallel`; `n_probs` above
    `max_n_probs`.
    """
    if not prompt_tokens:
        raise _invalid("the prompt is empty")
    if n_vocab is not None:
        check_token_ids(prompt_tokens, n_vocab)
    n_prompt = len(prompt_tokens)
    if n_prompt >= n_ctx_slot:
        raise KvswapError(
            ErrorKind.EXCEED_CONTEXT,
            exceeds_context_message(n_prompt, n_ctx_slot, shape, trained),
            n_prompt_tokens=n_prompt,
            n_ctx=n_ctx_slot,
        )
    id_slot = -1 if body.id_slot is None else body.id_slot
    if n_parallel is not None:
        if id_slot >= n_parallel:
            raise _invalid(f"id_slot {id_slot} is out of range (there are {n_parallel} slots)")
        resolve_n_cmpl(body, n_parallel=n_parallel)
    t_max_predict_ms = body.t_max_predict_ms or 0
    n_probs = resolve_n_probs(body, defaults, max_n_probs=max_n_probs)
    post_sampling_probs = _pick(body.post_sampling_probs, False)
    sampling = build_sampling(body, defaults, tokenize=tokenize, n_vocab=n_vocab)
    if post_sampling_probs and n_probs > 0:
        sampling = dataclasses.replace(sampling, record_candidates=True)
    return GenerationRequest(
        prompt_tokens=tuple(prompt_tokens),
        sampling=sampling,
        n_predict=resolve_n_predict(body, defaults, max_n_predict=max_n_predict),
        stop=resolve_stop(body),
        id_slot=id_slot,
        cache_prompt=_pick(body.cache_prompt, True),
        n_probs=n_probs,
        post_sampling_probs=post_sampling_probs,
        return_progress=_pick(body.return_progress, False),
        timings_per_token=_pick(body.timings_per_token, False),
        stream=_pick(body.stream, False),
        t_max_predict_ms=max(0, t_max_predict_ms),  # llama-server: -1 and 0 both mean no limit
    )


def resolve_n_predict(
    body: GenerationFields, defaults: SamplingDefaultsLike, *, max_n_predict: int | None
) -> int:
    """`n_predict`, else `max_completion_tokens`, else `max_tokens`, else the server's -n."""
    name, value = "n_predict", defaults.n_predict
    for field in ("n_predict", "max_completion_tokens", "max_tokens"):
        requested: int | None = getattr(body, field)
        if requested is not None:
            name, value = field, requested
            break
    if max_n_predict is None or max_n_predict < 0:
        return value
    if value > max_n_predict:
        raise _invalid(f"{name} ({value}) is larger than this server allows ({max_n_predict})")
    return max_n_predict if value < 0 else value


def resolve_n_probs(
    body: GenerationFields, defaults: SamplingDefaultsLike, *, max_n_probs: int = MAX_N_PROBS
) -> int:
    """Top-N probabilities per token: chat's `logprobs`/`top_logprobs`, else `n_probs`/`logprobs`.

    Chat, as `oaicompat_chat_params_parse`: `logprobs: true` asks for `top_logprobs` (default
    20) and overrides `n_probs`. Negative values mean none (llama-server tests `> 0`).
    """
    value: int | None
    if isinstance(body, ChatCompletionRequest) and body.logprobs:
        value = _pick(body.top_logprobs, DEFAULT_TOP_LOGPROBS)
    elif isinstance(body, CompletionRequest | OaiCompletionRequest):
        value = body.n_probs if body.n_probs is not None else body.logprobs
    else:
        value = body.n_probs
    n_probs = max(0, defaults.n_probs if value is None else value)
    if n_probs > max_n_probs:
        raise _invalid(f"n_probs ({n_probs}) is larger than this server allows ({max_n_probs})")
    return n_probs


def resolve_stop(body: GenerationFields) -> tuple[str, ...]:
    """Stop strings: a string or a list; empty strings are dropped, as llama-server."""
    if body.stop is None:
        return ()
    words = [body.stop] if isinstance(body.stop, str) else body.stop
    return tuple(word for word in words if word)


def resolve_n_cmpl(body: GenerationFields, *, n_parallel: int) -> int:
    """Completions per prompt: `n_cmpl`, else OpenAI's `n`; 1..n_parallel, as llama-server."""
    n_cmpl = body.n_cmpl if body.n_cmpl is not None else _pick(body.n, 1)
    if n_cmpl > n_parallel:
        raise _invalid(f"n_cmpl ({n_cmpl}) must be between 1 and the slot count ({n_parallel})")
    return n_cmpl


def check_token_ids(tokens: Sequence[int], n_vocab: int) -> None:
    """A token id outside the vocabulary is a 400 (libllama would read out of bounds)."""
    for tok in tokens:
        if not 0 <= tok < n_vocab:
            raise _invalid(f"invalid token id {tok} (the vocabulary has {n_vocab} tokens)")


# ----------------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class PromptPart:
    """One prompt as the client wrote it: texts and token ids, in order.

    The route tokenizes each text (`tokenize_prompt`) and concatenates with the ids.
    """

    pieces: tuple[int | str, ...]


def parse_prompt(prompt: PromptInput, *, max_prompts: int | None = None) -> list[PromptPart]:
    """llama-server's prompt forms (`tokenize_input_prompts`), one `PromptPart` per prompt.

    A string, a token list, a mixed list of both, or `{"prompt_string": ...}` is one prompt;
    a list holding no bare integer is a batch of such prompts (one result each). Multimodal
    data is a typed 501; an empty batch, or more than `max_prompts`, is a 400.
    """
    if isinstance(prompt, str | PromptObject):
        parts = [_one_prompt(prompt)]
    elif any(isinstance(p, int) for p in prompt):
        flat: list[int | str] = []
        for p in prompt:
            if not isinstance(p, int | str):
                raise _invalid('"prompt": a list with token ids may hold only ids and strings')
            flat.append(p)
        parts = [PromptPart(tuple(flat))]
    else:
        parts = [_one_prompt(p) for p in prompt]  # type: ignore[arg-type]
    if not parts:
        raise _invalid('"prompt" must not be empty')
    if max_prompts is not None and len(parts) > max_prompts:
        raise _invalid(f'"prompt" holds {len(parts)} prompts; this server takes {max_prompts}')
    return parts


def _one_prompt(prompt: str | list[int | str] | PromptObject) -> PromptPart:
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data is not None:
            raise KvswapError(ErrorKind.NOT_SUPPORTED, "multimodal prompts are not supported")
        prompt = prompt.prompt_string
    if isinstance(prompt, str):
        return PromptPart((prompt,))
    return PromptPart(tuple(prompt))


def content_part(content: str | list[int | str]) -> PromptPart:
    """The `content` of /tokenize as one prompt (a string or a mixed list)."""
    return PromptPart((content,) if isinstance(content, str) else tuple(content))


def tokenize_prompt(part: PromptPart, tokenize: Tokenize, *, add_special: bool) -> list[int]:
    """Token ids of one prompt, as llama-server's `tokenize_mixed`.

    Only a text in first position gets `add_special` (the BOS); later texts never do, and a
    prompt that starts with a token id gets none.
    """
    tokens: list[int] = []
    for i, piece in enumerate(part.pieces):
        if isinstance(piece, str):
            tokens.extend(tokenize(piece, add_special and i == 0))
        else:
            tokens.append(piece)
    return tokens
