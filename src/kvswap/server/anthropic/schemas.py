"""POST /v1/messages (Anthropic Messages API): the request body, and its chat equivalent.

Owns the body's shape (pydantic, strict types, unknown fields ignored) and its translation into
an OpenAI chat body, as llama-server's `server_chat_convert_anthropic_to_oai`: `system` becomes
a system message; `text` blocks content parts; `thinking` blocks `reasoning_content`;
`tool_use` blocks `tool_calls` (input as JSON text); each `tool_result` a `tool` message after
its turn; `tools` (`input_schema`) become functions; `stop_sequences` is `stop`; `max_tokens`
defaults to 4096; other fields (llama-server's sampling extensions) pass through. Beyond llama-server: `tool_choice` `{"type": "tool", "name"}` forces that tool
(llama-server asks for any tool), `{"type": "none"}` disables calls, `disable_parallel_tool_use`
maps to `parallel_tool_calls`, `thinking` toggles the template's `enable_thinking`, and an
image is a typed 501 instead of being passed to a text model. Pure.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import model_validator

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.server.requests.schemas import Body, JsonInt, NonNegInt, PositiveInt

CACHE_TTL_S = {"5m": 300, "1h": 3600}  # cache_control's `ttl` (absent: 5m)


class CacheControl(Body):
    """A prompt-cache breakpoint: the prefix up to and including its block is kept at least
    `ttl` (kvswap.server.anthropic.cache)."""

    type: str
    ttl: str | None = None

    @model_validator(mode="after")
    def _check(self) -> CacheControl:
        if self.type != "ephemeral":
            raise ValueError(f"cache_control: type must be 'ephemeral', got {self.type!r}")
        if self.ttl is not None and self.ttl not in CACHE_TTL_S:
            raise ValueError(f"cache_control: ttl must be '5m' or '1h', got {self.ttl!r}")
        return self

    @property
    def ttl_s(self) -> int:
        return CACHE_TTL_S[self.ttl or "5m"]


class ContentBlock(Body):
    """One block of Anthropic content (fields by `type`; unknown ones ignored)."""

    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    source: dict[str, Any] | None = None
    cache_control: CacheControl | None = None


class AnthropicMessage(Body):
    role: str
    content: str | list[ContentBlock]

    @model_validator(mode="after")
    def _check_role(self) -> AnthropicMessage:
        # "system": a mid-conversation system turn (Claude Code's environment, its reminders)
        if self.role not in ("user", "assistant", "system"):
            raise ValueError(
                f"messages: role must be 'user', 'assistant' or 'system', got {self.role!r}"
            )
        return self


class AnthropicTool(Body):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; server tools are not supported
    cache_control: CacheControl | None = None


class AnthropicToolChoice(Body):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicThinking(Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: NonNegInt | None = None
    display: str | None = None  # "omitted": Claude Code shows none (nothing here to omit)


class MessagesRequest(Body):
    """The body of POST /v1/messages (and /v1/messages/count_tokens)."""

    messages: list[AnthropicMessage]
    model: str | None = None
    system: str | list[ContentBlock] | None = None
    max_tokens: PositiveInt | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: JsonInt | None = None
    stream: bool | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_control: CacheControl | None = None  # automatic: on the last block


# Claude Code opens its system prompt with a billing line for Anthropic's accounting, not for
# the model: `x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=sdk-cli;` (and,
# interactively, `cch=<stamp>;`). The version's suffix changes with each `claude` run's first
# prompt and the stamp with every request: kept, either would end the session's prefix at token
# 25, so `claude -p --continue` would prefill its whole history again. Dropped, as vLLM does
# (llama-server pins only `cch=`).
_BILLING_PREFIX = "x-anthropic-billing-header:"
_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(\n|$)")


def _without_billing(system: str | list[ContentBlock]) -> str | list[ContentBlock]:
    if isinstance(system, str):
        return _BILLING_LINE.sub("", system, count=1)
    return [
        b for b in system if not (b.type == "text" and (b.text or "").startswith(_BILLING_PREFIX))
    ]


def _unsupported(what: str) -> KvswapError:
    return KvswapError(ErrorKind.NOT_SUPPORTED, f"{what} input is not supported by this server")


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def _text_of(content: str | list[ContentBlock] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for block in content:
        if block.type == "text":
            parts.append(block.text or "")
        elif block.type in ("image", "document"):
            raise _unsupported(block.type)
        else:
            raise _invalid(f"{where}: unsupported content block type {block.type!r}")
    return "".join(parts)


def to_chat_messages(msg: AnthropicMessage, i: int) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages: the turn, then one `tool` message per result; a
    system turn is a system message in place (the template renders it there, or folds it into
    the message before it: `text.messages.fold_late_system`)."""
    if msg.role == "system":
        return [{"role": "system", "content": _text_of(msg.content, f"messages[{i}]")}]
    if isinstance(msg.content, str):
        return [{"role": msg.role, "content": msg.content}]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for block in msg.content:
        where = f"messages[{i}]"
        if block.type == "text":
            parts.append({"type": "text", "text": block.text or ""})
        elif block.type in ("thinking", "redacted_thinking"):
            reasoning += block.thinking or ""
        elif block.type == "tool_use":
            if not block.name:
                raise _invalid(f"{where}: a tool_use block needs a name")
            arguments = block.input if block.input is not None else {}
            calls.append(
                {
                    "id": block.id or "",
                    "type": "function",
                    "function": {
                        "name": block.name,
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        elif block.type == "tool_result":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id or "",
                    "content": _text_of(block.content, where),
                }
            )
        elif block.type in ("image", "document"):
            raise _unsupported(block.type)
        else:
            raise _invalid(f"{where}: unsupported content block type {block.type!r}")
    out: list[dict[str, Any]] = []
    if parts or calls or reasoning:
        turn: dict[str, Any] = {"role": msg.role, "content": parts or ""}
        if calls:
            turn["tool_calls"] = calls
        if reasoning:
            turn["reasoning_content"] = reasoning
        out.append(turn)
    return out + results


def _tool_choice(choice: AnthropicToolChoice | None) -> tuple[Any, bool | None]:
    """(OpenAI tool_choice, parallel_tool_calls) for an Anthropic tool choice."""
    if choice is None:
        return None, None
    parallel = (
        None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
    )
    if choice.type == "auto":
        return "auto", parallel
    if choice.type == "any":
        return "required", parallel
    if choice.type == "none":
        return "none", parallel
    if choice.type == "tool":
        if not choice.name:
            raise _invalid('tool_choice of type "tool" needs a name')
        return {"type": "function", "function": {"name": choice.name}}, parallel
    raise _invalid(f"unsupported tool_choice type {choice.type!r}")


# Anthropic fields translated below (or meaningless here); any other field passes through.
_CONSUMED = {
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "service_tier",
    "container",
    "mcp_servers",
    "cache_control",
}


def to_chat_body(req: MessagesRequest, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI chat body that asks the engine the same thing.

    `raw` is the parsed JSON: fields Anthropic does not define (llama-server's extensions such
    as `grammar`, `seed`, `min_p`) pass through, where llama-server keeps only the sampling
    fields Anthropic has.
    """
    messages: list[dict[str, Any]] = []
    if req.system is not None:
        messages.append(
            {"role": "system", "content": _text_of(_without_billing(req.system), "system")}
        )
    for i, msg in enumerate(req.messages):
        messages += to_chat_messages(msg, i)
    body: dict[str, Any] = {k: v for k, v in (raw or {}).items() if k not in _CONSUMED}
    body["messages"] = messages
    if req.max_tokens is not None:  # required by /v1/messages, not by count_tokens
        body["max_tokens"] = req.max_tokens
    if req.tools:
        for tool in req.tools:
            if tool.type not in (None, "custom"):
                raise _invalid(f"tool type {tool.type!r} is not supported (only custom tools)")
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.input_schema if t.input_schema is not None else {},
                },
            }
            for t in req.tools
        ]
    choice, parallel = _tool_choice(req.tool_choice)
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    for key in ("temperature", "top_p", "top_k", "stream"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    kwargs = dict(req.chat_template_kwargs or {})
    if req.thinking is not None and "enable_thinking" not in kwargs:
        # "adaptive": the model decides how much to think (Claude Code's default): thinking on
        kwargs["enable_thinking"] = req.thinking.type in ("enabled", "adaptive")
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body
