"""The assistant message parsed from generated text, and the diffs a stream sends of it.

`ChatMsg` is what a chat answer holds (content, reasoning, tool calls); `MsgDiff` is one delta
of it, as llama-server's `common_chat_msg_diff`; `compute_diffs` compares two snapshots of one
growing message (`common_chat_msg_diff::compute_diffs`). Snapshots only ever grow: every field
of a later snapshot extends the earlier one, so the deltas concatenate to the final message.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    """One function call: its name, its arguments as JSON text, and the id given to clients."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class ChatMsg:
    """An assistant message as parsed so far."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class MsgDiff:
    """One delta: reasoning text, content text, or (index >= 0) part of one tool call.

    A tool call's first delta carries its id and name (and maybe the first arguments); later
    ones carry arguments only.
    """

    reasoning_delta: str = ""
    content_delta: str = ""
    tool_index: int = -1
    tool_id: str = ""
    tool_name: str = ""
    arguments_delta: str = ""


class DiffError(RuntimeError):
    """A later snapshot does not extend the earlier one (a parser bug, never the model's)."""


def _tail(old: str, new: str, what: str) -> str:
    if not new.startswith(old):
        raise DiffError(f"{what} changed instead of growing: {old!r} -> {new!r}")
    return new[len(old) :]


def compute_diffs(prev: ChatMsg, new: ChatMsg) -> list[MsgDiff]:
    """The deltas that turn `prev` into `new`."""
    diffs: list[MsgDiff] = []
    if new.reasoning_content != prev.reasoning_content:
        diffs.append(
            MsgDiff(
                reasoning_delta=_tail(prev.reasoning_content, new.reasoning_content, "reasoning")
            )
        )
    if new.content != prev.content:
        diffs.append(MsgDiff(content_delta=_tail(prev.content, new.content, "content")))
    if len(new.tool_calls) < len(prev.tool_calls):
        raise DiffError("a tool call disappeared")
    for i, call in enumerate(new.tool_calls):
        if i < len(prev.tool_calls):
            old = prev.tool_calls[i]
            if (old.name, old.id) != (call.name, call.id):
                raise DiffError(f"tool call {i} changed its name or id")
            delta = _tail(old.arguments, call.arguments, "arguments")
            if delta:
                diffs.append(MsgDiff(tool_index=i, arguments_delta=delta))
        else:
            diffs.append(
                MsgDiff(
                    tool_index=i,
                    tool_id=call.id,
                    tool_name=call.name,
                    arguments_delta=call.arguments,
                )
            )
    return diffs
