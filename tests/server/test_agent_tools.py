"""OpenAI tool calling through the real server and the official `openai` client.

SmolLM2's template has no tool syntax (llama-server answers it in plain text): kvswap's generic
JSON format, enforced by a grammar, still yields valid calls. A Qwen 2.5 template exercises the
native `<tool_call>` format, and a tiny random model shows the grammar alone makes the call.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.agent_util import (
    ASK,
    QWEN25_ARGS,
    TIME,
    TIME_PARAMS,
    WEATHER,
    WEATHER_PARAMS,
    collect_tool_calls,
    from_scratch,
    oai,
)
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def qwen25_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(*QWEN25_ARGS)


@pytest.fixture(scope="module")
def tiny_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    return server_factory("-m", str(model), "-c", "2048", "-np", "2", "-t", "1", "-tb", "1")


def round_trip(server: ServerProcess, *, final_choice: str, max_tokens: int = 120) -> None:
    """A forced call, the same call streamed, the result sent back, and a final answer."""
    client = oai(server)
    args = {
        "model": "m",
        "tools": [WEATHER],
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    # The call and the same call streamed are compared token for token: both from scratch.
    first = client.chat.completions.create(
        messages=ASK, tool_choice="required", extra_body=from_scratch(server), **args
    )  # type: ignore[call-overload]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)

    chunks = list(
        client.chat.completions.create(
            messages=ASK,
            tool_choice="required",
            stream=True,
            extra_body=from_scratch(server),
            **args,
        )  # type: ignore[call-overload]
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    (streamed,) = collect_tool_calls(chunks)
    assert streamed["name"] == call.function.name and streamed["id"]
    assert streamed["arguments"] == call.function.arguments  # same tokens at temperature 0

    messages = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    final = client.chat.completions.create(messages=messages, tool_choice=final_choice, **args)  # type: ignore[call-overload]
    answer = final.choices[0]
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")


def test_smollm2_generic_format_round_trip(agent_server: ServerProcess) -> None:
    round_trip(agent_server, final_choice="auto")


def test_tiny_model_is_held_to_the_call_by_the_grammar(tiny_server: ServerProcess) -> None:
    # Random weights spend many byte tokens per character: room for the longest call.
    round_trip(tiny_server, final_choice="none", max_tokens=600)


def test_qwen25_native_format_round_trip(qwen25_server: ServerProcess) -> None:
    round_trip(qwen25_server, final_choice="none")


def test_named_function_is_the_one_called(agent_server: ServerProcess) -> None:
    out = oai(agent_server).chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=80,
    )
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME_PARAMS)


@pytest.mark.parametrize("server_name", ["agent_server", "qwen25_server"])
def test_parallel_tool_calls_are_all_valid(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue(server_name)
    out = oai(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris and the time in UTC?"}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=True,
        temperature=0,
        max_tokens=200,
    )
    calls = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and calls
    params = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
    assert len({c.id for c in calls}) == len(calls)


def test_tool_results_round_trip_through_the_templates(
    agent_server: ServerProcess, qwen25_server: ServerProcess
) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
    ]
    body = {"messages": messages, "tools": [WEATHER]}
    generic = agent_server.post("/apply-template", body).json()["prompt"]
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"' in generic
    assert "<|im_start|>tool\n18 degrees<|im_end|>" in generic
    assert "Respond in JSON format" in generic
    native = qwen25_server.post("/apply-template", body).json()["prompt"]
    # Qwen 2.5 encodes the arguments itself: they reach it as an object, not a string.
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in native
    assert "<tool_response>\n18 degrees\n</tool_response>" in native
    assert '{"type": "function", "function": {"name": "get_weather"' in native


def test_auto_with_the_native_format_answers_or_calls_validly(qwen25_server: ServerProcess) -> None:
    # No prompt reuse: both runs prefill in the same batches, so greedy picks the same tokens.
    fresh = {"cache_prompt": False}
    out = oai(qwen25_server).chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER],
        temperature=0,
        max_tokens=120,  # type: ignore[list-item]
        extra_body=fresh,
    )
    message = out.choices[0].message
    for call in message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    assert message.content or message.tool_calls
    assert "<tool_call>" not in (message.content or "")
    # The lazy grammar and the parser give the stream the same answer, as deltas.
    chunks = list(
        oai(qwen25_server).chat.completions.create(
            model="m",
            messages=ASK,
            tools=[WEATHER],  # type: ignore[list-item]
            temperature=0,
            max_tokens=120,
            stream=True,
            extra_body=fresh,
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == (message.content or "")
    streamed = collect_tool_calls(chunks)
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls or []
    ]


def test_tool_choice_none_parses_nothing(agent_server: ServerProcess) -> None:
    out = oai(agent_server).chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=20,  # type: ignore[list-item]
    )
    assert out.choices[0].message.content and not out.choices[0].message.tool_calls


def test_switching_tool_choice_between_none_and_auto_keeps_the_cache(
    agent_server: ServerProcess,
) -> None:
    # llama-server renders the tools under "none" as under "auto": the prompt, and so the
    # conversation's cache, survives a switch (kvswap's generic instruction included).
    messages = [{"role": "user", "content": "Plan a trip to Oslo, in one short sentence."}]
    body = {"tools": [WEATHER], "temperature": 0, "max_tokens": 12}
    first = agent_server.post(
        "/v1/chat/completions", {**body, "messages": messages, "tool_choice": "none"}
    )
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    assert message["content"] and not message.get("tool_calls")
    assert not message["content"].lstrip().startswith("{")  # the reply, not its JSON
    n_first = first.json()["timings"]["cache_n"] + first.json()["timings"]["prompt_n"]
    messages += [message, {"role": "user", "content": "And the weather there?"}]
    second = agent_server.post(
        "/v1/chat/completions", {**body, "messages": messages, "tool_choice": "auto"}
    )
    assert second.status_code == 200, second.text
    assert second.json()["timings"]["cache_n"] >= n_first - 1
