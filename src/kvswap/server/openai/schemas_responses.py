"""POST /v1/responses (OpenAI Responses API): the request body, and its chat equivalent.

Owns the body's shape and its translation into an OpenAI chat body, as llama-server's
`server_chat_convert_responses_to_chatcmpl`: `instructions` becomes a system message; `input`
(a string, or items: messages with `input_text`/`output_text`/`refusal` parts,
`function_call`, `function_call_output`, `reasoning`) becomes messages, consecutive assistant
items merged into one turn; function `tools` become chat functions (other tool types are
skipped, as llama-server); `max_output_tokens` is `max_tokens`; `reasoning.effort` is
`reasoning_effort`; every other field passes through (llama-server's sampling extensions).
The stored-state fields (`store`, `previous_response_id`, `conversation`, `truncation`,
`background`, `metadata`) are read here and acted on by the routes (`stateful`); a chained
turn's history comes in as `items`, ahead of the request's own input. Beyond llama-server: `text.format` (json_object, json_schema) becomes `response_format`, and a
named `tool_choice` (`{"type": "function", "name"}`) forces that function. Pure.
"""

from __future__ import annotations

from typing import Any, Literal

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.server.requests.schemas import Body, PositiveInt

# Fields of a Responses body that have no chat meaning or are translated below.
_CONSUMED = {
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "reasoning",
    "text",
    "previous_response_id",
    "store",
    "metadata",
    "truncation",
    "include",
    "background",
    "prompt",
    "conversation",
}


class ResponsesRequest(Body):
    """The body of POST /v1/responses; fields llama-server reads, typed."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # default true, as OpenAI
    conversation: str | dict[str, Any] | None = None  # an id, or {"id": ...}
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    metadata: dict[str, Any] | None = None

    @property
    def conversation_id(self) -> str | None:
        conv = self.conversation
        if isinstance(conv, dict):
            cid = conv.get("id")
            if not isinstance(cid, str):
                raise _invalid("Invalid 'conversation': expected an id or {\"id\": ...}")
            return cid
        return conv


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def _unsupported(what: str) -> KvswapError:
    return KvswapError(ErrorKind.NOT_SUPPORTED, f"{what} is not supported by this server")


def _input_parts(content: list[Any], where: str) -> list[dict[str, str]]:
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise _invalid(f"{where}: a {kind} part requires 'text'")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _unsupported(f"{kind} input")
        else:
            raise _invalid(f"{where}: unsupported content part type {kind!r}")
    return parts


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant turn to add to: the previous message if it is one, else a new one."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    turn: dict[str, Any] = {"role": "assistant", "content": []}
    messages.append(turn)
    return turn


def _item(messages: list[dict[str, Any]], item: Any, i: int) -> None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise _invalid(f"{where}: an input item must be an object")
    kind = item.get("type")
    role = item.get("role")
    content = item.get("content")
    if isinstance(role, str) and (kind in (None, "message")):
        parts = (
            [{"type": "text", "text": content}]
            if isinstance(content, str)
            else _input_parts(content if isinstance(content, list) else [], where)
        )
        if role == "assistant":
            _assistant(messages)["content"].extend(parts)
        elif role in ("user", "system", "developer"):
            messages.append({"role": role, "content": parts})
        else:
            raise _invalid(f"{where}: unsupported role {role!r}")
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise _invalid(f"{where}: a function_call item requires '{key}'")
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        _assistant(messages).setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str) or not isinstance(output, str | list):
            raise _invalid(f"{where}: a function_call_output item requires call_id and output")
        text = output if isinstance(output, str) else _input_parts(output, where)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    elif kind == "reasoning":
        texts = [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
        texts = texts or [
            p.get("text", "") for p in item.get("summary") or [] if isinstance(p, dict)
        ]
        turn = _assistant(messages)
        turn["reasoning_content"] = turn.get("reasoning_content", "") + "".join(texts)
    else:
        raise _invalid(f"{where}: cannot determine the type of the item")


def _tools(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tools = []
    for tool in raw:
        if tool.get("type") != "function":
            continue  # llama-server: non-function tools have no chat equivalent; skipped
        fn = {k: v for k, v in tool.items() if k != "type"}
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(raw: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(raw, str):
        return raw
    if raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise _invalid('tool_choice must be "auto", "none", "required" or {"type": "function", "name"}')


def _response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    fmt = text.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.get("name", ""), "schema": fmt.get("schema") or {}},
        }
    raise _invalid(f"unsupported text.format type {fmt.get('type')!r}")


def to_chat_body(
    raw: dict[str, Any], req: ResponsesRequest, items: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The OpenAI chat body that asks the engine the same thing (`raw` is the parsed JSON;
    `items`, when given, replace the request's `input`: a stored turn's history and input)."""
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if items is None and isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        source = items if items is not None else req.input
        assert isinstance(source, list)
        for i, item in enumerate(source):
            _item(messages, item, i)
    for msg in messages:
        if msg["role"] == "assistant" and not msg["content"]:
            msg["content"] = "" if msg.get("tool_calls") or msg.get("reasoning_content") else []
    body = {k: v for k, v in raw.items() if k not in _CONSUMED}
    body["messages"] = messages
    if req.tools:
        tools = _tools(req.tools)
        if tools:
            body["tools"] = tools
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    effort = (req.reasoning or {}).get("effort")
    if isinstance(effort, str):
        body["reasoning_effort"] = effort
    fmt = _response_format(req.text or {})
    if fmt is not None:
        body["response_format"] = fmt
    return body
