"""OpenAI chat shapes for parsed answers: tool calls, reasoning, and their stream deltas.

Owns `common_chat_msg::to_json_oaicompat` (the assistant message), the delta of one
`common_chat_msg_diff` (`server_chat_msg_diff_to_json_oaicompat`), and the chat finals and
stream chunks built from a `ChatMsg` (`to_json_oaicompat_chat`, `to_json_oaicompat_chat_stream`
in `server-task.cpp`): `finish_reason` is "tool_calls" when the answer calls tools. Where
llama-server and OpenAI differ, OpenAI's shape wins for what its clients read: `content` is
null beside tool calls, and a tool call's first delta carries `arguments` (possibly "").
Pure.
"""

from __future__ import annotations

from typing import Any

from kvswap.chat.message import ChatMsg, MsgDiff
from kvswap.core.types import Completion, GenerationRequest, StopType, Timings, TokenProbs
from kvswap.server.formats import timings_json
from kvswap.server.openai.formats_oai import (
    OaiMeta,
    chat_chunk_json,
    chat_final,
    chat_final_chunks,
    finish_reason,
    logprobs_json,
)


def chat_finish_reason(stop_type: StopType, msg: ChatMsg) -> str:
    reason = finish_reason(stop_type)
    return "tool_calls" if reason == "stop" and msg.tool_calls else reason


def tool_call_json(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def message_json(msg: ChatMsg) -> dict[str, Any]:
    """The assistant message of a non-streamed answer."""
    out: dict[str, Any] = {
        "role": "assistant",
        "content": msg.content if msg.content or not msg.tool_calls else None,
    }
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
                "id": c.id,
            }
            for c in msg.tool_calls
        ]
    return out


def diff_delta(diff: MsgDiff) -> dict[str, Any]:
    """The `delta` object of one diff."""
    delta: dict[str, Any] = {}
    if diff.reasoning_delta:
        delta["reasoning_content"] = diff.reasoning_delta
    if diff.content_delta:
        delta["content"] = diff.content_delta
    if diff.tool_index >= 0:
        call: dict[str, Any] = {"index": diff.tool_index}
        if diff.tool_name:
            call.update(
                tool_call_json(diff.tool_index, diff.tool_id, diff.tool_name, diff.arguments_delta)
            )
        else:
            call["function"] = {"arguments": diff.arguments_delta}
        delta["tool_calls"] = [call]
    return delta


def chat_final_msg(
    c: Completion, req: GenerationRequest, meta: OaiMeta, msg: ChatMsg, *, index: int = 0
) -> dict[str, Any]:
    """A non-streamed `chat.completion` whose message is the parsed answer."""
    out = chat_final(c, req, meta, index=index)
    choice = out["choices"][0]
    choice["message"] = message_json(msg)
    if c.stop_type in (StopType.EOS, StopType.WORD):
        choice["finish_reason"] = chat_finish_reason(c.stop_type, msg)
    return out


def chat_diff_chunks(
    diffs: list[MsgDiff],
    meta: OaiMeta,
    *,
    first: bool,
    index: int = 0,
    probs: tuple[TokenProbs, ...] = (),
    timings: Timings | None = None,
    post_sampling: bool = False,
) -> list[dict[str, Any]]:
    """The chunks of one step: the role chunk when `first`, then one chunk per diff.

    `probs` and `timings` go on the step's last chunk. A step whose text is held back sends
    nothing: llama-server drops its probabilities then; the route carries them to the next
    chunk instead, so the streamed `logprobs` list every token, as the whole answer does.
    """
    chunks = []
    if first:
        chunks.append(chat_chunk_json(meta, index, {"role": "assistant", "content": None}, None))
    chunks.extend(chat_chunk_json(meta, index, diff_delta(d), None) for d in diffs)
    if chunks:
        last = chunks[-1]
        if probs:
            last["choices"][0]["logprobs"] = logprobs_json(probs, post_sampling)
        if timings is not None:
            last["timings"] = timings_json(timings)
    return chunks


def chat_finish_chunks(
    c: Completion,
    meta: OaiMeta,
    msg: ChatMsg,
    *,
    include_usage: bool,
    index: int = 0,
    probs: tuple[TokenProbs, ...] = (),
    post_sampling: bool = False,
) -> list[dict[str, Any]]:
    """The closing chunks, with "tool_calls" as the finish reason when the answer calls tools;
    `probs` not sent yet (the last tokens' text was empty) ride on the finish chunk."""
    chunks = chat_final_chunks(c, meta, include_usage=include_usage, index=index)
    choice = chunks[0]["choices"][0]
    if c.stop_type in (StopType.EOS, StopType.WORD):
        choice["finish_reason"] = chat_finish_reason(c.stop_type, msg)
    if probs:
        choice["logprobs"] = logprobs_json(probs, post_sampling)
    return chunks
