"""Chat messages and tools as llama-server validates and reshapes them before rendering.

Owns the validation of a chat body's `messages` and `tools` (llama-server's
`oaicompat_chat_params_parse` and `common_chat_msgs_parse_oaicompat`: `normalize_messages`,
`validate_messages`, `normalize_tools`, with `InvalidMessagesError`), and the content reshaping
a template needs (text parts joined, content as a string or typed parts, a system message merged
into the next one). Pure: no jinja, no libllama, any thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NoReturn

_MEDIA_PART_TYPES = {
    "image_url": "image",
    "input_audio": "audio",
    "input_video": "video",
    "video_url": "video",
}


class InvalidMessagesError(ValueError):
    """A chat request's messages, tools or template kwargs have a shape llama-server rejects."""


# Validation: llama-server's oaicompat_chat_params_parse + common_chat_msgs_parse_oaicompat.


def _dump(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _fail(message: str) -> NoReturn:
    raise InvalidMessagesError(message)


def _parse_fail(message: str) -> NoReturn:
    raise InvalidMessagesError(f"Failed to parse messages: {message}")


def _optional_str(message: Mapping[str, Any], key: str) -> str:
    value = message.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        _parse_fail(f"Invalid '{key}' type: expected string, got {_dump(value)}")
    return value


def _content_parts(content: list[Any]) -> list[dict[str, str]]:
    parts: list[dict[str, str]] = []
    for part in content:
        if not isinstance(part, Mapping) or "type" not in part:
            _parse_fail(f"Missing content part type: {_dump(part)}")
        part_type = part["type"]
        if part_type in _MEDIA_PART_TYPES:
            kind = _MEDIA_PART_TYPES[part_type]
            _fail(
                f"{kind} input is not supported - hint: if this is unexpected, "
                "you may need to provide the mmproj"
            )
        if part_type != "text":
            _fail("unsupported content[].type")
        text = part.get("text")
        if not isinstance(text, str):
            _parse_fail(f"Invalid 'text' in content part: expected string, got {_dump(part)}")
        parts.append({"type": "text", "text": text})
    return parts


def _tool_call(tool_call: object) -> dict[str, Any]:
    if not isinstance(tool_call, Mapping) or "type" not in tool_call:
        _parse_fail(f"Missing tool call type: {_dump(tool_call)}")
    if tool_call["type"] != "function":
        _parse_fail(f"Unsupported tool call type: {_dump(tool_call)}")
    function = tool_call.get("function")
    if not isinstance(function, Mapping):
        _parse_fail(f"Missing tool call function: {_dump(tool_call)}")
    name = function.get("name")
    if not isinstance(name, str):
        _parse_fail(f"Missing tool call name: {_dump(tool_call)}")
    if "arguments" not in function:
        _parse_fail(f"Missing tool call arguments: {_dump(tool_call)}")
    arguments = function["arguments"]
    out: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": name,
            "arguments": arguments if isinstance(arguments, str) else _dump(arguments),
        },
    }
    call_id = _optional_str(tool_call, "id")
    if call_id:
        out["id"] = call_id
    return out


def _normalize_message(message: object) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        _parse_fail(f"Expected 'message' to be an object, got {_dump(message)}")
    if "role" not in message:
        _parse_fail(f"Missing 'role' in message: {_dump(message)}")
    role = message["role"]
    if not isinstance(role, str):
        _parse_fail(f"Invalid 'role' type: expected string, got {_dump(role)}")
    has_content = "content" in message
    if role != "assistant" and not has_content:
        _fail("All non-assistant messages must contain 'content'")
    tool_calls = message.get("tool_calls")
    if role == "assistant" and not has_content and "tool_calls" not in message:
        _fail("Assistant message must contain either 'content' or 'tool_calls'!")
    content = message.get("content")
    out: dict[str, Any] = {"role": role}
    if isinstance(content, str) or content is None:
        out["content"] = content or ""
    elif isinstance(content, list):
        parts = _content_parts(content)
        out["content"] = parts if parts else ""
    else:
        _fail("Expected 'content' to be a string or an array")
    for key in ("reasoning_content", "name", "tool_call_id"):
        value = _optional_str(message, key)
        if value:
            out[key] = value
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            _parse_fail(f"Expected 'tool_calls' to be an array, got {_dump(tool_calls)}")
        if tool_calls:
            out["tool_calls"] = [_tool_call(call) for call in tool_calls]
    return out


def normalize_messages(messages: object) -> list[dict[str, Any]]:
    """Validate request messages and reshape them as llama-server hands them to templates.

    Each result has `role` and `content` (a string, or a list of {"type": "text"} parts), plus
    non-empty `reasoning_content`, `name`, `tool_call_id` and `tool_calls` (arguments as JSON
    text). Unknown fields are dropped. Raises `InvalidMessagesError` with llama-server's message.
    """
    if not isinstance(messages, list):
        _fail("Expected 'messages' to be an array")
    return [_normalize_message(message) for message in messages]


def validate_messages(messages: object) -> None:
    """Raise `InvalidMessagesError` for messages llama-server rejects (see `normalize_messages`)."""
    normalize_messages(messages)


def normalize_tools(tools: object) -> list[dict[str, Any]] | None:
    """Validate OpenAI `tools` and reshape them as llama-server does; None when absent or empty."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        _fail(f"Failed to parse tools: Expected 'tools' to be an array, got {_dump(tools)}")
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, Mapping) or "type" not in tool:
            _fail(f"Failed to parse tools: Missing tool type: {_dump(tool)}")
        if tool["type"] != "function":
            _fail(f"Failed to parse tools: Unsupported tool type: {_dump(tool)}")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            _fail(f"Failed to parse tools: Missing tool function: {_dump(tool)}")
        name = function.get("name")
        if not isinstance(name, str):
            _fail(f"Failed to parse tools: Missing tool function name: {_dump(tool)}")
        description = function.get("description", "")
        parameters = function.get("parameters", {})
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description if isinstance(description, str) else "",
                    "parameters": parameters,
                },
            }
        )
    return out or None


# ---------------------------------------------------------------------------------------------
# Message workarounds (common/chat.cpp, namespace workaround and messages_inp_normalizer).


def join_text_parts(parts: list[dict[str, str]]) -> str:
    """llama-server's `concat_content_parts`: newline between parts once text is non-empty."""
    text = ""
    for part in parts:
        if text:
            text += "\n"
        text += part["text"]
    return text


def as_string_content(content: str | list[dict[str, str]]) -> str:
    return content if isinstance(content, str) else join_text_parts(content)


def as_typed_content(content: str | list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def fold_late_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each system message after the first non-system one (a mid-conversation system turn, as
    Claude Code sends) appended to the message before it, for a template that renders system
    messages only at the front. Into the one before, never the next: a request that ends with
    a system turn renders as the next request's prefix does, so a mind's history holds."""
    out: list[dict[str, Any]] = []
    for message in messages:
        late = message["role"] == "system" and any(m["role"] != "system" for m in out)
        if not late:
            out.append(message)
            continue
        prev = dict(out[-1])
        if isinstance(prev["content"], str) and isinstance(message["content"], str):
            prev["content"] = prev["content"] + "\n\n" + message["content"]
        else:
            sep = [{"type": "text", "text": "\n\n"}]
            prev["content"] = (
                as_typed_content(prev["content"] or "") + sep + as_typed_content(message["content"])
            )
        out[-1] = prev
    return out


def merge_system_into_next(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages or messages[0]["role"] != "system":
        return messages
    if len(messages) == 1:
        return []
    system, nxt = messages[0], dict(messages[1])
    if isinstance(system["content"], str) and isinstance(nxt["content"], str):
        nxt["content"] = system["content"] + "\n" + nxt["content"]
    else:
        nxt["content"] = as_typed_content(system["content"]) + as_typed_content(nxt["content"])
    return [nxt, *messages[2:]]
