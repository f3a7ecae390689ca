"""Response bodies of POST /v1/messages, whole and streamed, in Anthropic's shapes.

Owns llama-server's `to_json_anthropic` and `to_json_anthropic_stream` shapes: a `message`
with `thinking`, `text` and `tool_use` blocks, `stop_reason`, `usage` (`input_tokens` are the
prompt tokens not read from the cache, `cache_read_input_tokens` those that were); a stream of
`message_start`, `content_block_start`/`_delta`/`_stop` per block (`thinking_delta` and an
empty `signature_delta`, `text_delta`, `input_json_delta`), `message_delta` and
`message_stop`. Beyond llama-server: blocks stream one after another, each closed before the
next opens (`BlockStream`), and a matched stop sequence ends with `stop_reason:
"stop_sequence"` and names it. Pure.
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

from kvswap.chat.blocks import BlockEvent, BlockKind
from kvswap.chat.message import ChatMsg
from kvswap.core.types import Completion, EngineError, StopType
from kvswap.server.anthropic.errors import anthropic_error
from kvswap.server.formats import served_block
from kvswap.server.sse import sse_event

_ALNUM = string.ascii_letters + string.digits


def new_message_id() -> str:
    return "msg_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


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


def usage_json(c: Completion) -> dict[str, Any]:
    cached = c.timings.cache_n
    return {
        "input_tokens": c.n_prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": c.n_decoded,
    }


def message_json(c: Completion, msg: ChatMsg, *, msg_id: str, model: str) -> dict[str, Any]:
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
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(c),
        **served_block(
            c
        ),  # beyond Anthropic's shape: kvswap's mind block (no timings, as llama-server)
    }


def message_start(
    *, msg_id: str, model: str, n_prompt_tokens: int, n_cached: int
) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": n_prompt_tokens - n_cached,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": n_cached,
                "output_tokens": 0,
            },
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


def message_end(c: Completion, msg: ChatMsg) -> list[dict[str, Any]]:
    reason, sequence = stop_reason(c, msg)
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": c.n_decoded},
            **served_block(c),
        },
        {"type": "message_stop"},
    ]


def encode(obj: dict[str, Any]) -> bytes:
    """An Anthropic SSE event: `event: <type>` then the data."""
    return sse_event(str(obj["type"]), obj)


def encode_error(event: EngineError) -> bytes:
    """An error after the stream began: Anthropic's `error` event."""
    return sse_event("error", anthropic_error(event.kind.code, event.message))
