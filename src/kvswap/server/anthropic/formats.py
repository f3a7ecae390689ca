"""Response bodies of POST /v1/messages, whole and streamed, in Anthropic's shapes.

Owns llama-server's `to_json_anthropic` and `to_json_anthropic_stream` shapes: a `message`
with `thinking`, `text` and `tool_use` blocks, `stop_reason`, `usage` (read, newly kept and
uncached prompt tokens: `anthropic.cache`), and llama-server's `timings` only when the request
asks for them (`timings_per_token`: Anthropic's shapes have none); a stream of
`message_start`, `content_block_start`/`_delta`/`_stop` per block (`thinking_delta` and an
empty `signature_delta`, `text_delta`, `input_json_delta`), `message_delta` and
`message_stop` (`message_delta`'s usage cumulative, as Anthropic's). Beyond llama-server: blocks stream one after another, each closed before the
next opens (`BlockStream`), and a matched stop sequence ends with `stop_reason:
"stop_sequence"` and names it. Pure.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from kvswap.chat.blocks import BlockEvent, BlockKind
from kvswap.chat.message import ChatMsg
from kvswap.core.types import Completion, EngineError, StopType
from kvswap.server.anthropic.cache import CacheMarks, usage
from kvswap.server.anthropic.errors import anthropic_error
from kvswap.server.formats import served_block, timings_json
from kvswap.server.sse import sse_event

_ALNUM = string.ascii_letters + string.digits


def new_message_id() -> str:
    return "msg_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


@dataclass(frozen=True)
class MessageMeta:
    """What every shape of one answer repeats: its id, the model's name, where its cache
    breakpoints lie, and whether the request asked for llama-server's `timings`."""

    msg_id: str
    model: str
    cache: CacheMarks = field(default_factory=CacheMarks)
    timings: bool = False


def stop_reason(c: Completion, msg: ChatMsg) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence)."""
    if c.stop_type is StopType.WORD:
        return "stop_sequence", c.stopping_word
    if c.stop_type is StopType.EOS:
        return ("tool_use" if msg.tool_calls else "end_turn"), None
    return "max_tokens", None


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_json(c: Completion, cache: CacheMarks) -> dict[str, Any]:
    return usage(c.n_prompt_tokens, c.timings.cache_n, c.n_decoded, cache)


def message_json(c: Completion, msg: ChatMsg, meta: MessageMeta) -> dict[str, Any]:
    """The whole answer of a non-streamed request."""
    content: list[dict[str, Any]] = []
    if msg.reasoning_content:
        content.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        content.append({"type": "text", "text": msg.content})
    for call in msg.tool_calls:
        content.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
        )
    reason, sequence = stop_reason(c, msg)
    return {
        "id": meta.msg_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": meta.model,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(c, meta.cache),
        **served_block(c),  # beyond Anthropic's shape: kvswap's mind block
    } | ({"timings": timings_json(c.timings)} if meta.timings else {})


def message_start(meta: MessageMeta, n_prompt_tokens: int, n_cached: int) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": meta.msg_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": meta.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(n_prompt_tokens, n_cached, 0, meta.cache),
        },
    }


_START = {
    BlockKind.REASONING: lambda b: {"type": "thinking", "thinking": "", "signature": ""},
    BlockKind.TEXT: lambda b: {"type": "text", "text": ""},
    BlockKind.TOOL: lambda b: {
        "type": "tool_use",
        "id": b.tool_id,
        "name": b.tool_name,
        "input": {},
    },
}


def block_events(events: list[BlockEvent]) -> list[dict[str, Any]]:
    """Anthropic stream events for block open/delta/close events."""
    out: list[dict[str, Any]] = []
    for ev in events:
        index = ev.block.position
        kind = ev.block.kind
        if ev.op == "open":
            out.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": _START[kind](ev.block),
                }
            )
        elif ev.op == "delta":
            if kind is BlockKind.REASONING:
                delta = {"type": "thinking_delta", "thinking": ev.delta}
            elif kind is BlockKind.TEXT:
                delta = {"type": "text_delta", "text": ev.delta}
            else:
                delta = {"type": "input_json_delta", "partial_json": ev.delta}
            out.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            if kind is BlockKind.REASONING:
                out.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": ""},
                    }
                )
            out.append({"type": "content_block_stop", "index": index})
    return out


def message_end(c: Completion, msg: ChatMsg, meta: MessageMeta) -> list[dict[str, Any]]:
    """message_delta, whose usage is cumulative (Anthropic's: the input fields repeated, the
    output tokens of the whole answer), with the answer's timings when asked; message_stop."""
    reason, sequence = stop_reason(c, msg)
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": usage_json(c, meta.cache),
        **served_block(c),
    }
    if meta.timings:
        delta["timings"] = timings_json(c.timings)
    return [
        delta,
        {"type": "message_stop"},
    ]


def encode(obj: dict[str, Any]) -> bytes:
    """An Anthropic SSE event: `event: <type>` then the data."""
    return sse_event(str(obj["type"]), obj)


def encode_error(event: EngineError) -> bytes:
    """An error after the stream began: Anthropic's `error` event."""
    return sse_event("error", anthropic_error(event.kind.code, event.message))
