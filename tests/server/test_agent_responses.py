"""OpenAI's Responses API through the official `openai` client: text, streamed text, forced
function calls and their outputs sent back, structured output, reasoning items."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.server.agent_util import WEATHER_PARAMS, from_scratch, oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": WEATHER_PARAMS,
    }
]


def test_text_whole_and_streamed(agent_server: ServerProcess) -> None:
    client = oai(agent_server)
    args: dict[str, Any] = {
        "model": "m",
        "input": "Say hello.",
        "instructions": "You are terse.",
        "max_output_tokens": 200,
        "temperature": 0,
    }
    # The runs compared token for token are each made from scratch (the same batches).
    whole = client.responses.create(**args, extra_body=from_scratch(agent_server))
    assert whole.object == "response" and whole.status == "completed"
    assert whole.output_text and whole.usage is not None and whole.usage.output_tokens > 0
    events = list(
        client.responses.create(**args, stream=True, extra_body=from_scratch(agent_server))
    )
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    with client.responses.stream(**args, extra_body=from_scratch(agent_server)) as stream:
        final = stream.get_final_response()
    assert final.output_text == whole.output_text


def test_length_limit_is_incomplete_whole_and_streamed(agent_server: ServerProcess) -> None:
    # As OpenAI: a cut answer is `incomplete` and its stream ends with `response.incomplete`
    # (openai-python's `get_final_response` waits for `response.completed` only).
    client = oai(agent_server)
    args: dict[str, Any] = {
        "model": "m",
        "input": "Count from one to fifty in words.",
        "max_output_tokens": 5,
        "temperature": 0,
    }
    whole = client.responses.create(**args, extra_body=from_scratch(agent_server))
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage is not None and whole.usage.output_tokens == 5
    events = list(
        client.responses.create(**args, stream=True, extra_body=from_scratch(agent_server))
    )
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete"
    assert last.response.output_text == whole.output_text


def test_function_call_round_trip(agent_server: ServerProcess) -> None:
    client = oai(agent_server)
    args: dict[str, Any] = {
        "model": "m",
        "tools": TOOLS,
        "temperature": 0,
        "max_output_tokens": 120,
    }
    first = client.responses.create(
        input="Weather in Paris?",
        tool_choice="required",
        extra_body=from_scratch(agent_server),
        **args,
    )
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)

    with client.responses.stream(
        input="Weather in Paris?",
        tool_choice={"type": "function", "name": "get_weather"},
        extra_body=from_scratch(agent_server),
        **args,
    ) as stream:
        streamed = stream.get_final_response()
    (scall,) = [o for o in streamed.output if o.type == "function_call"]
    assert scall.arguments == call.arguments

    second = client.responses.create(
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
        ],
        tool_choice="none",
        **args,
    )
    assert second.output_text


def test_structured_output_through_text_format(agent_server: ServerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    out = oai(agent_server).responses.create(
        model="m",
        input="Is it sunny in Paris? Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=200,
    )
    jsonschema.validate(json.loads(out.output_text), schema)


def test_input_tokens_and_refusals(agent_server: ServerProcess) -> None:
    counted = agent_server.post("/v1/responses/input_tokens", {"input": "Say hello."}).json()
    assert counted["object"] == "response.input_tokens" and counted["input_tokens"] > 0
    # Stored state is kept (docs/STATEFUL.md): an id never stored is OpenAI's 400.
    with pytest.raises(openai.BadRequestError) as unknown:
        oai(agent_server).responses.create(model="m", input="x", previous_response_id="resp_1")
    assert unknown.value.code == "previous_response_not_found"
