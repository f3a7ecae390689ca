"""Bad agent-API inputs are typed errors: `{"error": {code, message, type}}` with the status
equal to `code`, never a 500 and never a silent plain-text answer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.agent_util import ASK, WEATHER
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

CHAT = "/v1/chat/completions"
BAD: list[tuple[str, dict[str, Any], int, str]] = [
    ("/completion", {"prompt": "x", "json_schema": {"type": "frob"}}, 400, "unrecognized type"),
    ("/completion", {"prompt": "x", "json_schema": {"$ref": "http://x/s.json"}}, 400, "$ref"),
    ("/completion", {"prompt": "x", "grammar": "root ::= foo"}, 400, "undefined rule 'foo'"),
    ("/completion", {"prompt": "x", "grammar": 'root ::= "a'}, 400, "invalid grammar"),
    ("/completion", {"prompt": "x", "grammar": 'x ::= "a"'}, 400, "root"),
    ("/completion", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {}}, 400, "both"),
    (
        "/completion",
        {"prompt": "x", "grammar": 'root ::= "a"', "grammar_lazy": True},
        400,
        "no triggers",
    ),
    (
        "/v1/completions",
        {
            "prompt": "x",
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": []}}},
        },
        400,
        "enum",
    ),
    (
        CHAT,
        {
            "messages": ASK,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}},
        },
        400,
        "type",
    ),
    (CHAT, {"messages": ASK, "response_format": {"type": "yaml"}}, 400, "response_format"),
    (CHAT, {"messages": ASK, "grammar": "root ::= ("}, 400, "invalid grammar"),
    (
        CHAT,
        {
            "messages": ASK,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        400,
        "unknown function 'nope'",
    ),
    (
        CHAT,
        {"messages": ASK, "tools": [WEATHER], "tool_choice": "sometimes"},
        400,
        "Invalid tool_choice",
    ),
    (CHAT, {"messages": ASK, "tool_choice": "required"}, 400, "needs at least one tool"),
    (
        CHAT,
        {"messages": ASK, "tools": [WEATHER], "grammar": 'root ::= "a"'},
        400,
        "grammar constraints with tools",
    ),
    (
        CHAT,
        {
            "messages": ASK,
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}
            ],
            "tool_choice": "required",
        },
        400,
        "unrecognized type",
    ),
    (
        CHAT,
        {
            "messages": ASK,
            "tools": [WEATHER],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        400,
        "response_format",
    ),
    (CHAT, {"messages": ASK, "tools": [{"type": "code_interpreter"}]}, 400, "function"),
    (
        CHAT,
        {"messages": ASK, "tools": [WEATHER], "logprobs": True, "stream": True},
        400,
        "logprobs",
    ),
    (
        "/v1/messages",
        {
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {"type": "frob"}}],
            "tool_choice": {"type": "any"},
        },
        400,
        "unrecognized type",
    ),
    (
        "/v1/messages",
        {"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "role",
    ),
    ("/v1/messages", {"max_tokens": 5, "messages": "x"}, 400, "messages"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "x"}]}, 400, "max_tokens"),
    ("/v1/responses", {"input": [{"type": "mystery"}]}, 400, "type of the item"),
    ("/v1/responses", {"input": "x", "tool_choice": {"type": "file_search"}}, 400, "tool_choice"),
    ("/v1/responses", {"model": "m"}, 400, "input"),
]


@pytest.mark.parametrize(("path", "body", "code", "needle"), BAD)
def test_bad_inputs_are_typed_errors(
    agent_server: ServerProcess, path: str, body: dict[str, Any], code: int, needle: str
) -> None:
    for stream in (False, True):
        response = agent_server.post(path, {**body, "stream": stream or body.get("stream", False)})
        assert response.status_code == code, (stream, response.text)
        answer = response.json()
        error = answer["error"]
        if path == "/v1/messages":  # Anthropic's shape: {"type": "error", "error": {...}}
            assert answer["type"] == "error" and "code" not in error, answer
        else:
            assert error["code"] == code
        assert error["type"] == "invalid_request_error"
        assert needle in error["message"], error["message"]


def test_server_still_serves_after_bad_grammars(agent_server: ServerProcess) -> None:
    out = agent_server.post("/completion", {"prompt": "Hi", "n_predict": 2})
    assert out.status_code == 200
