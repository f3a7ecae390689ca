"""Reasoning split for templates that think: `reasoning_content` (and Anthropic `thinking`
blocks, Responses `reasoning` items), streamed as its own deltas, under each
`reasoning_format`. SmolLM2 does not think on its own, so a grammar makes it write a block."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.server.agent_util import (
    QWEN3_ARGS,
    SMALL,
    TEMPLATES,
    WEATHER,
    WEATHER_PARAMS,
    from_scratch,
    oai,
    stream_text,
)
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

THINK = 'root ::= "<think>" [a-z ]{3,24} "</think>\\n\\n" [A-Za-z ]{1,24}'
ASK = [{"role": "user", "content": "Is the sky blue?"}]


@pytest.fixture(scope="module")
def qwen3_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(*QWEN3_ARGS)


@pytest.fixture(scope="module")
def open_think_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    template = TEMPLATES / "chatml-open-think.jinja"
    return server_factory(*SMALL, "--chat-template-file", str(template))


def chat(server: ServerProcess, **extra: Any) -> Any:
    args: dict[str, Any] = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 80}
    return oai(server).chat.completions.create(**{**args, **extra})


def test_reasoning_content_whole_and_streamed(qwen3_server: ServerProcess) -> None:
    # The runs compared token for token are each made from scratch (the same batches).
    out = chat(qwen3_server, extra_body={"grammar": THINK, **from_scratch(qwen3_server)})
    msg = out.choices[0].message
    reasoning = (msg.model_extra or {})["reasoning_content"]
    assert reasoning and "<think>" not in reasoning and reasoning == reasoning.strip()
    assert msg.content and "<" not in msg.content
    content, streamed_reasoning = stream_text(
        list(
            chat(
                qwen3_server,
                extra_body={"grammar": THINK, **from_scratch(qwen3_server)},
                stream=True,
            )
        )
    )
    assert (content, streamed_reasoning) == (msg.content, reasoning)


def test_reasoning_formats(qwen3_server: ServerProcess) -> None:
    fields = {"grammar": THINK, "reasoning_format": "none"}
    raw = chat(qwen3_server, extra_body=fields | from_scratch(qwen3_server))
    assert raw.choices[0].message.content.startswith("<think>")
    assert "reasoning_content" not in (raw.choices[0].message.model_extra or {})
    fields = {"grammar": THINK, "reasoning_format": "deepseek-legacy"}
    legacy = chat(qwen3_server, extra_body=fields | from_scratch(qwen3_server))
    assert legacy.choices[0].message.content == raw.choices[0].message.content
    assert (legacy.choices[0].message.model_extra or {})["reasoning_content"]
    content, reasoning = stream_text(
        list(chat(qwen3_server, extra_body=fields | from_scratch(qwen3_server), stream=True))
    )
    assert reasoning == "" and content == raw.choices[0].message.content
    bad = qwen3_server.post("/v1/chat/completions", {"messages": ASK, "reasoning_format": "x"})
    assert bad.status_code == 400


def test_a_block_the_prompt_opened(open_think_server: ServerProcess) -> None:
    grammar = 'root ::= [a-z ]{3,24} "</think>" [A-Za-z ]{1,24}'
    out = chat(open_think_server, extra_body={"grammar": grammar})
    msg = out.choices[0].message
    assert (msg.model_extra or {})["reasoning_content"] and msg.content
    assert "</think>" not in msg.content


def test_forced_tool_call_may_think_first(qwen3_server: ServerProcess) -> None:
    out = chat(
        qwen3_server,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
    )
    (call,) = out.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_anthropic_thinking_blocks(qwen3_server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=qwen3_server.url, api_key="none", max_retries=0)
    args: dict[str, Any] = {
        "model": "m",
        "max_tokens": 80,
        "messages": ASK,
        "extra_body": {"grammar": THINK, "temperature": 0},
    }
    whole = client.messages.create(**args)
    assert [b.type for b in whole.content] == ["thinking", "text"]
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == whole.content[0].thinking  # type: ignore[union-attr]
    assert final.content[1].text == whole.content[1].text  # type: ignore[union-attr]


def test_responses_reasoning_item(qwen3_server: ServerProcess) -> None:
    out = oai(qwen3_server).responses.create(
        model="m", input="Is the sky blue?", temperature=0, extra_body={"grammar": THINK}
    )
    kinds = [o.type for o in out.output]
    assert kinds == ["reasoning", "message"] and out.output_text
    assert out.output[0].content[0].text  # type: ignore[union-attr]
    # Its tokens are counted in the usage (the reasoning item's text, not a constant 0).
    details = out.usage.output_tokens_details  # type: ignore[union-attr]
    assert 0 < details.reasoning_tokens < out.usage.output_tokens  # type: ignore[union-attr]
