"""Response bodies of POST /v1/responses, whole and streamed, in OpenAI's Responses shapes.

Owns llama-server's `to_json_oaicompat_resp` (a `response` with `reasoning`, `message` and
`function_call` output items, `call_id` "call_<id>", item id "fc_<id>") and its stream
(`response.created`, `response.in_progress`, items added, deltas, items done,
`response.completed`). Beyond llama-server, so that OpenAI's own stream accumulator follows:
every event has its `sequence_number`, `output_index` and (for parts) `content_index`; items are
opened and finished in order (`BlockStream`), each with its `.done` events; the lifecycle
events carry the whole response object; a length-limited answer is `incomplete` with
`incomplete_details.reason` "max_output_tokens". Pure (ids come from `new_*_id`).
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from kvswap.chat.blocks import Block, BlockEvent, BlockKind
from kvswap.chat.message import ChatMsg
from kvswap.core.types import Completion, EngineError, PromptProgress, StopType
from kvswap.server.formats import final_timings, progress_json, timings_json
from kvswap.server.sse import sse_event

_ALNUM = string.ascii_letters + string.digits


def _rand(n: int = 32) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def new_response_id() -> str:
    return "resp_" + _rand()


@dataclass
class ResponseMeta:
    """What every object of one response repeats (`params`: the request's echoed settings)."""

    id: str
    model: str
    created_at: int
    params: dict[str, Any] = field(default_factory=dict)


# Request settings a response repeats, when the request did not set them.
DEFAULT_PARAMS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "parallel_tool_calls": True,
    "temperature": None,
    "top_p": None,
    "tool_choice": "auto",
    "tools": [],
    "text": {"format": {"type": "text"}},
}


def usage_json(c: Completion, n_reasoning: int = 0) -> dict[str, Any]:
    """Token usage; `n_reasoning`: the output tokens of the reasoning items."""
    return {
        "input_tokens": c.n_prompt_tokens,
        "input_tokens_details": {"cached_tokens": c.timings.cache_n, "cache_write_tokens": 0},
        "output_tokens": c.n_decoded,
        "output_tokens_details": {"reasoning_tokens": min(n_reasoning, c.n_decoded)},
        "total_tokens": c.n_prompt_tokens + c.n_decoded,
    }


def response_json(
    meta: ResponseMeta,
    *,
    status: str,
    output: list[dict[str, Any]],
    c: Completion | None = None,
    n_reasoning: int = 0,
) -> dict[str, Any]:
    incomplete = None
    if c is not None and c.stop_type not in (StopType.EOS, StopType.WORD):
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    out: dict[str, Any] = {
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": meta.model,
        "output": output,
        **DEFAULT_PARAMS,
        **meta.params,
        "usage": usage_json(c, n_reasoning) if c is not None else None,
    }
    if c is not None:
        out["completed_at"] = (
            meta.created_at + int(c.timings.prompt_ms + c.timings.predicted_ms) // 1000
        )
        out.update(final_timings(c))  # llama-server's timings, kvswap's mind block
    return out


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": content,
        "encrypted_content": "",
        "status": status,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [text_part(text)] if text is not None else [],
    }


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": "fc_" + call_id,
        "type": "function_call",
        "status": status,
        "call_id": "call_" + call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(msg: ChatMsg) -> list[dict[str, Any]]:
    """The output of a non-streamed response."""
    items = []
    if msg.reasoning_content:
        items.append(reasoning_item("rs_" + _rand(), msg.reasoning_content))
    if msg.content:
        items.append(message_item("msg_" + _rand(), msg.content))
    items += [call_item(t.id, t.name, t.arguments) for t in msg.tool_calls]
    return items


class ResponseEvents:
    """The stream's events, numbered in order (see the module docstring)."""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        self._seq = 0
        self._ids: dict[int, str] = {}  # block position -> item id
        self.done_items: list[dict[str, Any]] = []

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        resp = response_json(self.meta, status="in_progress", output=[])
        return [
            self._event("response.created", response=resp),
            self._event("response.in_progress", response=resp),
        ]

    def _item_id(self, block: Block) -> str:
        if block.position not in self._ids:
            prefix = {BlockKind.REASONING: "rs_", BlockKind.TEXT: "msg_"}.get(block.kind)
            self._ids[block.position] = (prefix + _rand()) if prefix else "fc_" + block.tool_id
        return self._ids[block.position]

    def blocks(self, events: list[BlockEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            b, idx = ev.block, ev.block.position
            item_id = self._item_id(b)
            if ev.op == "open":
                out.append(
                    self._event(
                        "response.output_item.added",
                        output_index=idx,
                        item=self._item(b, "", "in_progress"),
                    )
                )
                if b.kind is BlockKind.TEXT:
                    out.append(
                        self._event(
                            "response.content_part.added",
                            item_id=item_id,
                            output_index=idx,
                            content_index=0,
                            part=text_part(""),
                        )
                    )
            elif ev.op == "delta":
                out.append(self._delta(b, item_id, ev.delta))
            else:
                out += self._close(b, item_id, ev.text)
        return out

    def _item(self, b: Block, text: str, status: str) -> dict[str, Any]:
        item_id = self._item_id(b)
        if b.kind is BlockKind.REASONING:
            return reasoning_item(item_id, text, status)
        if b.kind is BlockKind.TEXT:
            return message_item(item_id, text if status == "completed" else None, status)
        return call_item(b.tool_id, b.tool_name, text, status)

    def _delta(self, b: Block, item_id: str, delta: str) -> dict[str, Any]:
        idx = b.position
        if b.kind is BlockKind.REASONING:
            return self._event(
                "response.reasoning_text.delta",
                item_id=item_id,
                output_index=idx,
                content_index=0,
                delta=delta,
            )
        if b.kind is BlockKind.TEXT:
            return self._event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=idx,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        return self._event(
            "response.function_call_arguments.delta", item_id=item_id, output_index=idx, delta=delta
        )

    def _close(self, b: Block, item_id: str, text: str) -> list[dict[str, Any]]:
        idx = b.position
        out = []
        if b.kind is BlockKind.REASONING:
            out.append(
                self._event(
                    "response.reasoning_text.done",
                    item_id=item_id,
                    output_index=idx,
                    content_index=0,
                    text=text,
                )
            )
        elif b.kind is BlockKind.TEXT:
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=idx,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=idx,
                    content_index=0,
                    part=text_part(text),
                )
            )
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=idx,
                    name=b.tool_name,
                    arguments=text,
                )
            )
        item = self._item(b, text, "completed")
        self.done_items.append(item)
        out.append(self._event("response.output_item.done", output_index=idx, item=item))
        return out

    def complete(self, c: Completion, n_reasoning: int = 0) -> list[dict[str, Any]]:
        resp = response_json(
            self.meta, status="completed", output=self.done_items, c=c, n_reasoning=n_reasoning
        )
        kind = "response.completed" if resp["status"] == "completed" else "response.incomplete"
        return [self._event(kind, response=resp, timings=timings_json(c.timings))]

    def progress(self, p: PromptProgress) -> dict[str, Any]:
        """A prefill progress event (`return_progress`): llama-server's `response.in_progress`
        with `prompt_progress` (and `timings` with timings_per_token)."""
        head = {"id": self.meta.id, "object": "response", "status": "in_progress"}
        event = self._event("response.in_progress", response=head)
        if p.timings is not None:
            event["timings"] = timings_json(p.timings)
        event["prompt_progress"] = progress_json(p)
        return event

    def error(self, event: EngineError) -> dict[str, Any]:
        return self._event("error", code=event.kind.value, message=event.message, param=None)


def encode(obj: dict[str, Any]) -> bytes:
    """A Responses SSE event: `event: <type>` then the data."""
    return sse_event(str(obj["type"]), obj)
