"""Anthropic's Messages API through the official `anthropic` client: plain answers, streamed
and not, tool use round trips, a forced named tool, stop sequences, token counting, and the
`x-api-key` header against a server with `--api-key`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.server.agent_util import SMALL, WEATHER_PARAMS, from_scratch, settle
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_PARAMS}
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}


def client(server: ServerProcess, key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, timeout=300, max_retries=0)


def test_plain_answer_whole_and_streamed(agent_server: ServerProcess) -> None:
    c = client(agent_server)
    args: dict[str, Any] = {
        "model": "m",
        "max_tokens": 40,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Say hello."}],
        "extra_body": GREEDY,
    }
    # The answer and the same answer streamed are compared token for token, so both reuse the
    # same cached prompt (left by a first run): the same batches (SPEC §9).
    c.messages.create(**args)
    settle(agent_server)
    whole = c.messages.create(**args)
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.id.startswith("msg_")
    (block,) = whole.content
    assert block.type == "text" and block.text
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.output_tokens > 0 and whole.usage.input_tokens > 0

    settle(agent_server)
    with c.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    # The second run reused the prompt from the slot's cache.
    assert (final.usage.cache_read_input_tokens or 0) > 0


def test_forced_tool_use_round_trip(agent_server: ServerProcess) -> None:
    c = client(agent_server)
    args: dict[str, Any] = {"model": "m", "max_tokens": 120, "tools": TOOLS}
    scratch = GREEDY | from_scratch(agent_server)  # the two calls are compared: same batches
    first = c.messages.create(
        messages=ASK,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=scratch,
        **args,
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    jsonschema.validate(use.input, WEATHER_PARAMS)

    scratch = GREEDY | from_scratch(agent_server)
    with c.messages.stream(
        messages=ASK, tool_choice={"type": "any"}, extra_body=scratch, **args
    ) as stream:
        streamed = stream.get_final_message()
    (suse,) = [b for b in streamed.content if b.type == "tool_use"]
    assert suse.input == use.input and streamed.stop_reason == "tool_use"

    messages: list[Any] = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}],
        },
    ]
    final = c.messages.create(messages=messages, tool_choice={"type": "none"}, **args)
    assert final.content and final.content[0].type == "text" and final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_stop_sequence_is_reported(agent_server: ServerProcess) -> None:
    c = client(agent_server)
    args: dict[str, Any] = {
        "model": "m",
        "max_tokens": 30,
        "messages": [{"role": "user", "content": "Count from one to ten in words."}],
    }
    # Three runs compared token for token: each from scratch, so all in the same batches.
    answer = c.messages.create(**args, extra_body=GREEDY | from_scratch(agent_server))
    free = answer.content[0].text  # type: ignore[union-attr]
    # A word of the greedy answer, past its start: the same run must stop right before it.
    word = free.split()[len(free.split()) // 2]
    cut = c.messages.create(
        **args, stop_sequences=[word], extra_body=GREEDY | from_scratch(agent_server)
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert cut.content[0].text == free[: free.index(word)]  # type: ignore[union-attr]
    scratch = GREEDY | from_scratch(agent_server)
    with c.messages.stream(**args, stop_sequences=[word], extra_body=scratch) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == word
    assert streamed.content[0].text == free[: free.index(word)]  # type: ignore[union-attr]


def test_count_tokens(agent_server: ServerProcess) -> None:
    c = client(agent_server)
    counted = c.messages.count_tokens(
        model="m", messages=[{"role": "user", "content": "Say hello."}]
    )
    whole = c.messages.create(
        model="m", max_tokens=1, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert counted.input_tokens == whole.usage.input_tokens + (
        whole.usage.cache_read_input_tokens or 0
    )


@pytest.fixture(scope="module")
def key_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(*SMALL, "--api-key", "sekrit")


def test_x_api_key(key_server: ServerProcess) -> None:
    out = client(key_server, "sekrit").messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
    )
    assert out.content
    with pytest.raises(anthropic.AuthenticationError):
        client(key_server, "wrong").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
        )


def test_bad_requests_are_typed(agent_server: ServerProcess) -> None:
    c = client(agent_server)
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(
            model="m",
            max_tokens=5,
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "nope"},
        )
    response = agent_server.post(
        "/v1/messages",
        {
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        },
    )
    assert response.status_code == 501


def test_errors_come_in_anthropics_shape(
    agent_server: ServerProcess, key_server: ServerProcess
) -> None:
    """Anthropic's clients read `{"type": "error", "error": {"type", "message"}}`; kvswap sent
    OpenAI's shape, and generated 4096 tokens for a body without `max_tokens`, which Anthropic
    requires (the newcomer's second hour, finding 15). llama.cpp's own suite checks only the
    message of an error here, which both shapes carry (docs/COMPAT.md)."""
    c = client(agent_server)
    long = [{"role": "user", "content": "word " * 5000}]  # past the 2,048-token window
    with pytest.raises(anthropic.BadRequestError) as too_long:
        c.messages.create(model="m", max_tokens=5, messages=long)  # type: ignore[arg-type]
    body = too_long.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error"
    message, n_ctx = body["error"]["message"], body["error"]["n_ctx"]
    n_prompt = body["error"]["n_prompt_tokens"]
    # Anthropic's words, which Claude Code compacts its conversation on, then kvswap's advice
    assert message.startswith(f"prompt is too long: {n_prompt} tokens > {n_ctx} maximum")
    assert "exceeds the available context size" in message
    assert n_ctx > 0  # kvswap's own fields stay beside Anthropic's
    missing = agent_server.post("/v1/messages", {"messages": ASK})
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    with pytest.raises(anthropic.AuthenticationError) as refused:  # the guard's own 401
        client(key_server, "wrong").messages.create(model="m", max_tokens=5, messages=ASK)  # type: ignore[arg-type]
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Invalid API Key"},
    }
    # Every other route keeps kvswap's (and llama-server's) envelope; OpenAI's routes name a
    # too-long prompt with OpenAI's code (Codex matches it), llama-server's with the status.
    other = agent_server.post("/v1/chat/completions", {"messages": "x"})
    assert other.json()["error"]["code"] == 400 and "type" not in other.json()
    chat = agent_server.post("/v1/chat/completions", {"messages": long, "max_tokens": 5})
    responses = agent_server.post("/v1/responses", {"input": long, "max_output_tokens": 5})
    native = agent_server.post("/completion", {"prompt": "word " * 5000, "n_predict": 5})
    for answer, code in ((chat, "context_length_exceeded"), (responses, "context_length_exceeded"),
                         (native, 400)):  # fmt: skip
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == code, answer.text
        assert answer.json()["error"]["type"] == "exceed_context_size_error", answer.text


def test_a_long_prefill_keeps_the_stream_alive(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """Claude Code's first request is 13-20k tokens; its prefill takes minutes on a small
    machine, and the client gave up after 6 minutes of silence, cancelling the prefill
    (measured with the real CLI). Past KVSWAP_KEEPALIVE_S (10 s by default; 0.1 s here) with no
    event yet, the stream starts and sends an SSE comment every interval until the first event;
    the official SDK reads the stream as usual."""
    server = server_factory(*SMALL, env={"KVSWAP_KEEPALIVE_S": "0.1"}, fresh=True)
    long = [{"role": "user", "content": "The tide came in and went out again. " * 150}]
    body = {"model": "m", "max_tokens": 4, "messages": long, "stream": True}
    with server.client.stream("POST", "/v1/messages", json=body) as resp:
        assert resp.status_code == 200
        raw = b"".join(resp.iter_bytes())
    assert raw.startswith(b": keepalive\n\n"), raw[:200]
    assert b"event: message_stop" in raw
    with client(server).messages.stream(model="m", max_tokens=4, messages=long) as stream:  # type: ignore[arg-type]
        assert stream.get_final_message().stop_reason in ("max_tokens", "end_turn")
