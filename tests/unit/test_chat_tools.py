"""Tools and tool choice: validation and typed errors; generic-format prompt adaptation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kvswap.chat.toolformats import GENERIC_INSTRUCTION, GenericFormat, HermesFormat
from kvswap.chat.tools import ToolChoice, ToolError, ToolMode, parse_tool_choice, parse_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOLS = parse_tools([WEATHER, {"type": "function", "function": {"name": "noop"}}])


def test_tools_parse_with_defaults() -> None:
    assert [t.name for t in TOOLS] == ["get_weather", "noop"]
    assert TOOLS[1].parameters == {"type": "object"}
    assert TOOLS[0].as_openai() == WEATHER


@pytest.mark.parametrize(
    "raw",
    [
        [{"type": "retrieval"}],
        [{"type": "function"}],
        [{"type": "function", "function": {"description": "x"}}],
        [{"type": "function", "function": {"name": "a", "parameters": "x"}}],
        [WEATHER, WEATHER],
    ],
)
def test_bad_tools_are_tool_errors(raw: list[dict]) -> None:
    with pytest.raises(ToolError):
        parse_tools(raw)


def test_tool_choice_forms() -> None:
    assert parse_tool_choice(None, TOOLS) == ToolChoice(ToolMode.AUTO)
    assert parse_tool_choice("required", TOOLS).forces_call
    named = parse_tool_choice({"type": "function", "function": {"name": "noop"}}, TOOLS)
    assert named == ToolChoice(ToolMode.FUNCTION, "noop") and named.forces_call
    assert parse_tool_choice("none", ()).mode is ToolMode.NONE


@pytest.mark.parametrize(
    ("raw", "tools", "needle"),
    [
        ("sometimes", TOOLS, "Invalid tool_choice"),
        ({"type": "function", "function": {"name": "nope"}}, TOOLS, "unknown function 'nope'"),
        ("required", (), "needs at least one tool"),
        ({"type": "function"}, TOOLS, "tool_choice must be"),
    ],
)
def test_bad_tool_choices(raw: object, tools: tuple, needle: str) -> None:
    with pytest.raises(ToolError, match=needle):
        parse_tool_choice(raw, tools)  # type: ignore[arg-type]


CAPS_NONE = SimpleNamespace(
    supports_tools=False, supports_tool_calls=False, supports_tool_responses=False
)


def test_generic_format_lists_tools_and_writes_history_as_json() -> None:
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
    ]
    out = GenericFormat().adapt_messages(messages, TOOLS, False, CAPS_NONE)
    assert out[0]["role"] == "system" and GENERIC_INSTRUCTION in out[0]["content"]
    assert '"get_weather"' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}
    }
    assert "tool_calls" not in out[2]
    assert out[3] == {
        "role": "user",
        "content": json.dumps({"tool_response": {"tool": "get_weather", "content": "Sunny"}}),
    }


def test_generic_format_appends_to_an_existing_system_message() -> None:
    caps = SimpleNamespace(
        supports_tools=True, supports_tool_calls=True, supports_tool_responses=True
    )
    out = GenericFormat().adapt_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}],
        TOOLS,
        True,
        caps,
    )
    assert out[0]["content"].startswith("Be brief.\n\n")
    assert "`tool_calls`" in out[0]["content"] and "following tools" not in out[0]["content"]


def test_grammars_name_only_the_allowed_functions() -> None:
    named = ToolChoice(ToolMode.FUNCTION, "noop")
    g = GenericFormat().grammar(TOOLS, named, parallel=False)
    assert '\\"noop\\"' in g.gbnf and "get_weather" not in g.gbnf and g.trigger_words == ()
    assert "response-kv" not in g.gbnf
    auto = GenericFormat().grammar(TOOLS, ToolChoice(), parallel=True)
    assert "response-kv" in auto.gbnf and "tool_calls" in auto.gbnf
    lazy = HermesFormat().grammar(TOOLS, ToolChoice(), parallel=True)
    assert lazy.trigger_words == ("<tool_call>",)
    assert HermesFormat().grammar(TOOLS, ToolChoice(ToolMode.REQUIRED), False).trigger_words == ()
