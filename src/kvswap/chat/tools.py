"""OpenAI `tools` and `tool_choice`, validated into typed values.

`parse_tools` reads `[{"type": "function", "function": {"name", "description", "parameters"}}]`
(as llama-server's `common_chat_tools_parse_oaicompat`); `parse_tool_choice` reads "auto",
"none", "required" or `{"type": "function", "function": {"name": ...}}`. llama-server reads a
named choice as "auto" (its getter wants a string); kvswap enforces it, and a name that no tool
has, or a forcing choice without tools, is a `ToolError` (a 400). Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ToolError(ValueError):
    """Tools or a tool choice that cannot be honoured."""


@dataclass(frozen=True)
class Tool:
    """One function the model may call."""

    name: str
    description: str = ""
    parameters: Any = field(default_factory=lambda: {"type": "object"})

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI (and chat templates) write it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolMode(StrEnum):
    AUTO = "auto"  # the model may answer or call tools
    NONE = "none"  # tools are shown but never called (nothing is parsed)
    REQUIRED = "required"  # at least one call, enforced by a grammar
    FUNCTION = "function"  # a call of one named function, enforced by a grammar


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolMode = ToolMode.AUTO
    name: str = ""  # the function, for FUNCTION

    @property
    def forces_call(self) -> bool:
        return self.mode in (ToolMode.REQUIRED, ToolMode.FUNCTION)


def parse_tools(raw: list[dict[str, Any]] | None) -> tuple[Tool, ...]:
    """The request's tools; ToolError for a shape llama-server rejects or a repeated name."""
    tools: list[Tool] = []
    for i, item in enumerate(raw or []):
        if not isinstance(item, dict) or item.get("type") != "function":
            raise ToolError(f"tools[{i}]: only tools of type 'function' are supported")
        fn = item.get("function")
        if not isinstance(fn, dict):
            raise ToolError(f"tools[{i}]: missing 'function'")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"tools[{i}]: missing function name")
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ToolError(f"tools[{i}]: description must be a string")
        params = fn.get("parameters")
        if params is None or params == {}:
            params = {"type": "object"}  # no parameters: arguments are still an object
        if not isinstance(params, dict | bool):
            raise ToolError(f"tools[{i}]: parameters must be a JSON schema object")
        if any(t.name == name for t in tools):
            raise ToolError(f"tools[{i}]: the function name {name!r} is used twice")
        tools.append(Tool(name=name, description=description, parameters=params))
    return tuple(tools)


def parse_tool_choice(raw: str | dict[str, Any] | None, tools: tuple[Tool, ...]) -> ToolChoice:
    """The request's tool choice (default "auto")."""
    if raw is None:
        return ToolChoice()
    if isinstance(raw, str):
        try:
            mode = ToolMode(raw)
        except ValueError:
            raise ToolError(f"Invalid tool_choice: {raw}") from None
        if mode is ToolMode.FUNCTION:
            raise ToolError(f"Invalid tool_choice: {raw}")
        choice = ToolChoice(mode)
    else:
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else raw.get("name")
        if raw.get("type") != "function" or not isinstance(name, str):
            raise ToolError(
                'tool_choice must be "auto", "none", "required" or '
                '{"type": "function", "function": {"name": ...}}'
            )
        choice = ToolChoice(ToolMode.FUNCTION, name)
    if choice.forces_call and not tools:
        raise ToolError(f"tool_choice {choice.mode.value!r} needs at least one tool")
    if choice.mode is ToolMode.FUNCTION and all(t.name != choice.name for t in tools):
        known = ", ".join(t.name for t in tools)
        raise ToolError(f"tool_choice names an unknown function {choice.name!r} (tools: {known})")
    return choice


def callable_tools(tools: tuple[Tool, ...], choice: ToolChoice) -> tuple[Tool, ...]:
    """The tools a call may name under `choice`."""
    if choice.mode is ToolMode.FUNCTION:
        return tuple(t for t in tools if t.name == choice.name)
    return tools


def arguments_object(arguments: str) -> Any:
    """A tool call's arguments parsed (for templates that want an object); the text itself
    when it is not JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
