"""Chat-template probes for tool calls, tool results and object arguments (real templates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.text.template import CHATML_TEMPLATE, ChatTemplate

pytestmark = pytest.mark.timeout(30)

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
CALL = {
    "role": "assistant",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}


def load(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(), "<s>", "</s>")


def test_chatml_renders_tool_results_but_not_calls() -> None:
    caps = ChatTemplate(CHATML_TEMPLATE, "<s>", "</s>").caps
    assert not caps.supports_tools and not caps.supports_tool_calls
    assert caps.supports_tool_responses and not caps.supports_object_arguments


def test_qwen25_wants_object_arguments() -> None:
    tmpl = load("Qwen-Qwen2.5-7B-Instruct.jinja")
    caps = tmpl.caps
    assert caps.supports_tools and caps.supports_tool_calls and caps.supports_tool_responses
    assert caps.supports_object_arguments
    text = tmpl.render([{"role": "user", "content": "Weather?"}, CALL])
    assert '"arguments": {"city": "Paris"}' in text  # an object, not an escaped string


def test_qwen3_takes_arguments_as_text_and_thinks() -> None:
    tmpl = load("Qwen-Qwen3-0.6B.jinja")
    caps = tmpl.caps
    assert caps.supports_tool_calls and caps.supports_thinking
    assert not caps.supports_object_arguments
    text = tmpl.render([{"role": "user", "content": "Weather?"}, CALL])
    assert '{"city": "Paris"}' in text and '\\"city\\"' not in text
