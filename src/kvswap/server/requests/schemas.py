"""Request bodies of the HTTP routes, as pydantic models, and the one way to parse them.

Owns the *shape* of every JSON body kvswap accepts: which fields exist, their types and their
hard limits, as llama-server's `server-schema.cpp` (`make_llama_cmpl_schema`),
`server-common.cpp` (`oaicompat_completion_params_parse`, `oaicompat_chat_params_parse`) and the
handlers in `server-context.cpp` define them. It does not apply defaults, clamp soft limits or
map anything onto engine parameters: `params.py` does that.

Rules (docs/DESIGN.md, "Compatible first"):
- unknown fields are ignored; `null` is the same as absent (as llama-server's `has_value`);
- a known field of the wrong type is a 400 (llama-server's nlohmann getters coerce a bool into a
  number and fall back to defaults in places; we do not): models are strict, except that an
  integral float (`5.0`) is accepted where an integer is expected;
- a value outside a llama-server *hard* limit is a 400; soft limits are clamped in `params.py`.

Callers: route handlers, through `parse_body`. Pure: no I/O, no engine.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from kvswap.core.errors import ErrorKind, KvswapError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _integral_float_to_int(value: object) -> object:
    # JSON has one number type; `5.0` is an integer to most clients. `5.5` stays a float and
    # fails the strict int check below.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_ToInt = BeforeValidator(_integral_float_to_int)
JsonInt = Annotated[int, _ToInt]
# Bounds go before the validator: after it, pydantic publishes them as `ge`/`le` keys that JSON
# Schema does not know (instead of `minimum`/`maximum`), and the OpenAPI document loses them.
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX), _ToInt]
# A prompt piece: a token id or a text to tokenize (llama-server's "mixed" prompts).
PromptPiece = TokenId | str


# llama-server's hard limits (`set_hard_limits`): a value outside is a 400.
NonNegInt = Annotated[int, Field(ge=0, le=INT32_MAX), _ToInt]
PositiveInt = Annotated[int, Field(ge=1, le=INT32_MAX), _ToInt]
IntOrMinus1 = Annotated[int, Field(ge=-1, le=INT32_MAX), _ToInt]  # -1: "default" or "unlimited"


class Body(BaseModel):
    """Base of every request body: strict types, unknown fields ignored, no NaN or infinity.

    Validators are built on a model's first use (`defer_build`), not at import: a cold start
    builds only the bodies its first requests send."""

    model_config = ConfigDict(
        strict=True, extra="ignore", allow_inf_nan=False, frozen=True, defer_build=True
    )


_SESSION_SUFFIX = re.compile(r"_session_([0-9A-Za-z-]+)$")  # older Claude Code's user_id


class MindField(Body):
    """What a generation body says of its mind, read before the body is prepared, so the mind's
    turn is held (and in a cluster placed) first (`streaming.turn`): its `mind`, validated as
    every body's `mind` is (a body this refuses, the body's own model refuses too); and, taken
    as sent (never a refusal), its session key and whether it asks for several completions."""

    mind: str | None = None
    prompt_cache_key: Any = None  # OpenAI's session key (chat completions, Responses)
    n: Any = None
    n_cmpl: Any = None
    prompt: Any = None
    metadata: Any = None  # Anthropic's: Claude Code's `user_id` carries its session id

    @property
    def claude_session(self) -> str | None:
        """The session id in Anthropic's `metadata.user_id`, as Claude Code sends it (a JSON
        object with `session_id`, or `user_..._session_<id>` in older releases); None when
        it carries none."""
        user_id = self.metadata.get("user_id") if isinstance(self.metadata, dict) else None
        if not isinstance(user_id, str):
            return None
        try:
            parsed = json.loads(user_id)
        except ValueError:
            found = _SESSION_SUFFIX.search(user_id)
            return found.group(1) if found else None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        return session if isinstance(session, str) and session else None

    @property
    def several(self) -> bool:
        """Several completions (`n`, `n_cmpl`) or a batch of prompts (a list holding no token
        id and more than one prompt, as `params.parse_prompt` reads it)."""
        counts = [c for c in (self.n, self.n_cmpl) if isinstance(c, int | float)]
        if any(c > 1 for c in counts):
            return True
        p = self.prompt
        return isinstance(p, list) and len(p) > 1 and not any(type(x) is int for x in p)


class PromptObject(Body):
    """`{"prompt_string": ..., "multimodal_data": [...]}`, one prompt as an object."""

    prompt_string: str | list[PromptPiece]
    multimodal_data: list[str] | None = None


# One prompt: a string, token ids, a mixed list, or an object. `prompt` is one of these or a list
# of them (a batch); `params.parse_prompt` tells the forms apart as llama-server does.
PromptInput = str | PromptObject | list[PromptPiece | list[PromptPiece] | PromptObject]


class StreamOptions(Body):
    include_usage: bool | None = None


class LoraEntry(Body):
    id: NonNegInt
    scale: float


class GenerationFields(Body):
    """Fields every completion route shares (llama-server copies OpenAI bodies through).

    Field order and aliases follow `make_llama_cmpl_schema`: `n_predict`, then
    `max_completion_tokens`, then `max_tokens`; `n_cmpl`, then `n`.
    """

    # -- response and streaming
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    verbose: bool | None = None
    timings_per_token: bool | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    post_sampling_probs: bool | None = None
    response_fields: list[str] | None = None
    sse_ping_interval: IntOrMinus1 | None = None

    # -- scheduling and cache
    cache_prompt: bool | None = None
    id_slot: IntOrMinus1 | None = None
    n_keep: IntOrMinus1 | None = None
    n_discard: NonNegInt | None = None
    n_cache_reuse: NonNegInt | None = None
    n_indent: NonNegInt | None = None
    n_cmpl: PositiveInt | None = None
    n: PositiveInt | None = None
    lora: list[LoraEntry] | None = None
    mind: str | None = None  # kvswap: the named conversation this request continues

    # -- length and stopping (kvswap: a negative n_predict other than -1 is a 400)
    n_predict: IntOrMinus1 | None = None
    max_completion_tokens: IntOrMinus1 | None = None
    max_tokens: IntOrMinus1 | None = None
    t_max_predict_ms: Annotated[int, Field(ge=-1, le=INT64_MAX), _ToInt] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None

    # -- sampling (soft limits are clamped by params.build_sampling, as llama-server)
    temperature: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_k: JsonInt | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    # llama-server's hard limit is [0, INT32_MAX]; kvswap also takes -1 ("the whole window").
    repeat_last_n: IntOrMinus1 | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: NonNegInt | None = None
    dry_penalty_last_n: IntOrMinus1 | None = None
    dry_sequence_breakers: Annotated[list[str], Field(min_length=1)] | None = None
    mirostat: JsonInt | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    adaptive_target: float | None = None
    adaptive_decay: Annotated[float, Field(ge=0.0, le=0.99)] | None = None
    min_keep: NonNegInt | None = None
    # Any integer: libllama's seed is a uint32 and llama-server wraps (-1 is "random").
    seed: JsonInt | None = None
    n_probs: JsonInt | None = None
    # `[[token or text, bias or false], ...]` or `{"token or text": bias or false}`.
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
    samplers: list[str] | str | None = None
    backend_sampling: bool | None = None

    # -- constrained output and chat parsing (parsed now, implemented by the agent API issue)
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    grammar_lazy: bool | None = None
    grammar_triggers: list[Any] | None = None
    preserved_tokens: list[str] | None = None
    reasoning_format: str | None = None
    echo: bool | None = None

    @model_validator(mode="after")
    def _check_logit_bias(self) -> GenerationFields:
        _check_logit_bias_shape(self.logit_bias)
        return self


def _check_logit_bias_shape(logit_bias: list[list[Any]] | dict[str, Any] | None) -> None:
    # llama-server skips malformed entries silently; kvswap makes a wrong type a 400.
    if logit_bias is None:
        return
    if isinstance(logit_bias, dict):
        for key, bias in logit_bias.items():
            if not _is_bias(bias):
                raise ValueError(f"logit_bias[{key!r}] must be a number or false")
        return
    for i, entry in enumerate(logit_bias):
        if len(entry) != 2:
            raise ValueError(f"logit_bias[{i}] must be a [token, bias] pair")
        token, bias = entry
        is_token = isinstance(token, str) or (
            isinstance(token, int) and not isinstance(token, bool)
        )
        if not is_token:
            raise ValueError(f"logit_bias[{i}][0] must be a token id or a string")
        if not _is_bias(bias):
            raise ValueError(f"logit_bias[{i}][1] must be a number or false")


def _is_bias(value: object) -> bool:
    if value is False:
        return True
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) and value == value and abs(value) != float("inf")


class ResponseFormat(Body):
    type: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_type(self) -> ResponseFormat:
        if self.type not in (None, "", "text", "json_object", "json_schema"):
            raise ValueError(
                'response_format type must be one of "text", "json_object" or "json_schema", '
                f"but got: {self.type}"
            )
        return self


class CompletionRequest(GenerationFields):
    """POST /completion and /completions: llama-server's native body."""

    prompt: PromptInput
    logprobs: JsonInt | None = None  # alias of n_probs, used only when n_probs is absent


class OaiCompletionRequest(GenerationFields):
    """POST /v1/completions: OpenAI's body plus llama-server's extensions."""

    prompt: PromptInput
    model: str | None = None
    logprobs: JsonInt | None = None  # OpenAI: top-N log-probabilities (alias of n_probs)
    user: str | None = None
    best_of: JsonInt | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None  # kvswap: as on the chat route

    @model_validator(mode="after")
    def _check_oai(self) -> OaiCompletionRequest:
        # llama-server refuses `echo`, `best_of` and `suffix` outright; we accept the values
        # that ask for nothing (`best_of: 1`, `suffix: ""`), which some clients always send.
        if self.echo:
            raise ValueError("Only no echo is supported")
        if self.best_of not in (None, 1):
            raise ValueError("Unsupported param: best_of")
        if self.suffix:
            raise ValueError("Unsupported param: suffix")
        return self


# Content parts that carry media (`oaicompat_content_load_media`): valid OpenAI, refused by
# chat.chat_messages with a 501 (kvswap has no multimodal support).
MEDIA_PART_TYPES = frozenset({"image_url", "input_audio", "input_video", "video_url"})


class ContentPart(Body):
    """One part of a message's content: `text` here; media parts are refused by params.py."""

    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _check_part(self) -> ContentPart:
        if self.type == "text":
            if self.text is None:
                raise ValueError("a text content part needs 'text'")
        elif self.type not in MEDIA_PART_TYPES:
            raise ValueError(f"unsupported content[].type: {self.type!r}")
        return self


class ToolCallFunction(Body):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCall(Body):
    type: str
    function: ToolCallFunction
    id: str | None = None

    @model_validator(mode="after")
    def _check_type(self) -> ToolCall:
        if self.type != "function":
            raise ValueError(f"unsupported tool call type: {self.type!r}")
        return self


class ChatMessage(Body):
    """One chat turn, as `common_chat_msgs_parse_oaicompat` reads it."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _check_content(self) -> ChatMessage:
        # llama-server tests key presence: `"content": null` is allowed, a missing key is not.
        has_content = "content" in self.model_fields_set
        if self.role == "assistant":
            if not has_content and "tool_calls" not in self.model_fields_set:
                raise ValueError("Assistant message must contain either 'content' or 'tool_calls'")
        elif not has_content:
            raise ValueError("All non-assistant messages must contain 'content'")
        return self


CONTINUATIONS = frozenset({"content", "reasoning_content"})


class ChatCompletionRequest(GenerationFields):
    """POST /v1/chat/completions and /chat/completions: OpenAI's body plus extensions.

    `oaicompat_chat_params_parse` turns it into a prompt (the chat template) and a native body;
    `grammar`, `json_schema` and `reasoning_format` are inherited from the native fields.
    """

    messages: list[ChatMessage]
    model: str | None = None
    user: str | None = None
    logprobs: bool | None = None
    top_logprobs: JsonInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    # true, "content" or "reasoning_content" (`common_chat_continuation_parse`)
    continue_final_message: bool | str | None = None
    reasoning_effort: str | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.json_schema is not None and self.grammar:
            raise ValueError("Cannot use both json_schema and grammar")
        if not self.logprobs and self.top_logprobs is not None:
            raise ValueError("top_logprobs requires logprobs to be set to true")
        if self.logprobs and self.tools and self.stream:
            raise ValueError("logprobs is not supported with tools + stream")
        cont = self.continue_final_message
        if isinstance(cont, str) and cont not in CONTINUATIONS:
            # llama-server reads an unknown string as "no continuation"; a typo deserves a 400.
            raise ValueError(
                'continue_final_message must be true, "content" or "reasoning_content"'
            )
        if cont and self.add_generation_prompt:
            raise ValueError(
                "Cannot set both add_generation_prompt and continue_final_message to true."
            )
        return self


class ApplyTemplateRequest(ChatCompletionRequest):
    """POST /apply-template: the chat body, rendered but not run."""


class TokenizeRequest(Body):
    """POST /tokenize. Without `content` the answer is an empty list, as llama-server."""

    content: str | list[PromptPiece] | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Body):
    """POST /detokenize."""

    tokens: list[TokenId] = Field(default_factory=list)


class SlotFileRequest(Body):
    """POST /slots/{id}?action=save|restore. The name is checked by `files.names`."""

    filename: str


class SpillRequest(Body):
    """POST /slots/{id}?action=spill&page=NAME: write the page to a slot file."""

    filename: str
    drop: bool = False  # then free that generation of the page (a newer one under NAME stays)


BodyT = TypeVar("BodyT", bound=Body)


def parse_body(model: type[BodyT], raw: bytes | str | dict[str, Any]) -> BodyT:
    """Validate a request body; any failure (bad JSON, bad UTF-8, wrong type) is a typed 400."""
    try:
        if isinstance(raw, dict):
            return model.model_validate(raw)
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise KvswapError(ErrorKind.INVALID_REQUEST, validation_message(exc)) from exc


def validation_message(exc: ValidationError) -> str:
    """A short message naming the offending fields, like llama-server's "Field 'x': ..."."""
    by_path: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        text = str(error["msg"]).removeprefix("Value error, ")
        texts = by_path.setdefault(_field_path(error["loc"]), [])
        if text not in texts:
            texts.append(text)
    parts = [
        f"Field '{path}': {' or '.join(texts)}" if path else " or ".join(texts)
        for path, texts in by_path.items()
    ]
    if len(parts) > 3:
        parts = [*parts[:3], f"({len(parts) - 3} more)"]
    return "; ".join(parts) or "invalid request body"


def _field_path(loc: tuple[int | str, ...]) -> str:
    # pydantic puts union members' type tags ("str", "list[...]", "PromptObject") into `loc`;
    # keep field names and list indices only.
    names: list[str] = []
    for item in loc:
        if isinstance(item, int):
            names.append(str(item))
        elif item.isidentifier() and item.islower() and item not in _TYPE_TAGS:
            names.append(item)
    return ".".join(names)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
