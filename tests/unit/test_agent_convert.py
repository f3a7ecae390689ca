"""Anthropic and Responses bodies translated into chat bodies (pure)."""

from __future__ import annotations

import json

import pytest

from kvswap.core.errors import KvswapError
from kvswap.server.anthropic.schemas import MessagesRequest
from kvswap.server.anthropic.schemas import to_chat_body as anthropic_chat
from kvswap.server.openai.schemas_responses import ResponsesRequest
from kvswap.server.openai.schemas_responses import to_chat_body as responses_chat
from kvswap.server.requests.schemas import ChatCompletionRequest, parse_body


def anthropic(raw: dict) -> dict:
    body = anthropic_chat(parse_body(MessagesRequest, raw), raw)
    parse_body(ChatCompletionRequest, body)  # it must be a valid chat body
    return body


def responses(raw: dict) -> dict:
    body = responses_chat(raw, parse_body(ResponsesRequest, raw))
    parse_body(ChatCompletionRequest, body)
    return body


def test_anthropic_turns_tools_and_results() -> None:
    body = anthropic(
        {
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "use the tool", "signature": ""},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "Sunny"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 100},
        }
    )
    msgs = body["messages"]
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[2]["reasoning_content"] == "use the tool"
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"city": "Paris"}'}
    assert msgs[3] == {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
    assert msgs[4] == {"role": "tool", "tool_call_id": "t1", "content": "Sunny"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert body["parallel_tool_calls"] is False
    assert body["stop"] == ["END"] and body["max_tokens"] == 64 and body["top_k"] == 5
    assert body["chat_template_kwargs"] == {"enable_thinking": True}


def test_anthropic_defaults_and_choices() -> None:
    body = anthropic(
        {"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "any"}}
    )
    # No default for max_tokens: /v1/messages requires it, count_tokens needs none.
    assert "max_tokens" not in body and body["tool_choice"] == "required"


def test_a_system_turn_in_messages_stays_where_it_stands() -> None:
    """Claude Code's mid-conversation system turn (issue 41) is a system message in place,
    its cache_control taken; adaptive thinking turns thinking on."""
    body = anthropic(
        {
            "system": "Be brief.",
            "thinking": {"type": "adaptive", "display": "omitted"},
            "messages": [
                {"role": "user", "content": "Fix it."},
                {
                    "role": "system",
                    "content": [
                        {
                            "type": "text",
                            "text": "cwd: /repo",
                            "cache_control": {"type": "ephemeral"},
                        }
                    ],
                },
            ],
        }
    )
    assert [m["role"] for m in body["messages"]] == ["system", "user", "system"]
    assert body["messages"][2]["content"] == "cwd: /repo"
    assert body["chat_template_kwargs"]["enable_thinking"] is True


def test_claude_codes_billing_line_never_moves_the_prefix() -> None:
    """Claude Code's billing line changes with each run's first prompt (`cc_version`'s suffix)
    and, interactively, with every request (`cch=`); requests differing only there render the
    same system prompt, as blocks or as one string, and nothing else is touched."""
    line = "x-anthropic-billing-header: cc_version=2.1.328.{}; cc_entrypoint=cli; cch={};"
    stamps = (("593", "a5145"), ("281", "0f9e2"))
    bodies = [
        anthropic(
            {
                "system": [
                    {"type": "text", "text": line.format(*stamp)},
                    {"type": "text", "text": "You are Claude Code. cch=abc;"},
                ],
                "messages": [{"role": "user", "content": "Hi"}],
            }
        )
        for stamp in stamps
    ]
    bodies += [
        anthropic(
            {
                "system": line.format(*stamp) + "\nYou are Claude Code. cch=abc;",
                "messages": [{"role": "user", "content": "Hi"}],
            }
        )
        for stamp in stamps
    ]
    for body in bodies:
        assert body["messages"] == [
            {"role": "system", "content": "You are Claude Code. cch=abc;"},
            {"role": "user", "content": "Hi"},
        ]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ({"messages": [{"role": "tool", "content": "x"}]}, 400),
        ({"messages": [], "thinking": {"type": "sometimes"}}, 400),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 501),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, 400),
        ({"messages": [], "tool_choice": {"type": "tool"}}, 400),
        ({"messages": [], "tools": [{"name": "s", "type": "web_search_20250305"}]}, 400),
    ],
)
def test_anthropic_refusals(raw: dict, code: int) -> None:
    with pytest.raises(KvswapError) as err:
        anthropic(raw)
    assert err.value.kind.code == code


def test_responses_items_merge_into_chat_turns() -> None:
    body = responses(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather?"},
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "hmm"}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "w",
                    "arguments": '{"c": 1}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "It is sunny."}],
                },
            ],
            "tools": [
                {"type": "function", "name": "w", "parameters": {"type": "object"}},
                {"type": "web_search"},
            ],
            "tool_choice": {"type": "function", "name": "w"},
            "max_output_tokens": 50,
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "seed": 7,
            "store": True,
        }
    )
    msgs = body["messages"]
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[2]["role"] == "assistant" and msgs[2]["reasoning_content"] == "hmm"
    assert msgs[2]["tool_calls"][0]["id"] == "call_1"
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
    assert msgs[4]["content"] == [{"type": "text", "text": "It is sunny."}]
    assert [t["function"]["name"] for t in body["tools"]] == ["w"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert body["max_tokens"] == 50 and body["reasoning_effort"] == "low"
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["seed"] == 7 and "store" not in body and "input" not in body


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ({"input": [{"type": "mystery"}]}, 400),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            501,
        ),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, 400),
    ],
)
def test_responses_refusals(raw: dict, code: int) -> None:
    with pytest.raises(KvswapError) as err:
        responses(raw)
    assert err.value.kind.code == code


def test_responses_string_input() -> None:
    assert responses({"input": "hello"})["messages"] == [{"role": "user", "content": "hello"}]
    assert json.loads(json.dumps(responses({"input": "x", "temperature": 0})))["temperature"] == 0
