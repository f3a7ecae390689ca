"""Real agent clients on stored conversations, end to end against SmolLM2: an OpenAI Agents SDK
(`openai-agents`) agent with two function tools over several turns, chained by
`previous_response_id` and by `conversation_id`, and LangChain's
`ChatOpenAI(use_responses_api=True, use_previous_response_id=True)` with a tool. Every request
is recorded as it leaves the client: after the first, each carries only its new items; the
server's answers say each such turn prefilled at most its new tokens + 64."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 300  # answers end on their own (the Agents SDK fails an incomplete one)
# Imperative questions: SmolLM2 calls a tool for them (asked "what is...", it answers itself).
QUESTIONS = (
    "Call get_weather for Paris.",
    "Use the get_time tool for UTC.",
    "Thanks! Answer in one short sentence.",
)


class Wire:
    """The Responses requests a client sent and the answers it got, in order."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.got: list[dict[str, Any]] = []

    def request(self, request: httpx.Request) -> None:
        if request.method == "POST" and request.url.path.endswith("/responses"):
            self.sent.append(json.loads(request.content))

    def response(self, response: httpx.Response) -> None:
        if response.request.method == "POST" and response.request.url.path.endswith("/responses"):
            response.read()
            self.got.append(response.json())

    async def arequest(self, request: httpx.Request) -> None:
        self.request(request)

    async def aresponse(self, response: httpx.Response) -> None:
        if response.request.method == "POST" and response.request.url.path.endswith("/responses"):
            await response.aread()
            self.got.append(response.json())


def _n_tokens(server: ServerProcess, items: Any) -> int:
    """The tokens of a request's new input items' text (their JSON: an upper bound)."""
    text = items if isinstance(items, str) else json.dumps(items)
    return len(server.post("/tokenize", {"content": text}).json()["tokens"])


def _check_chained(server: ServerProcess, wire: Wire, *, chained_by: str) -> None:
    """Every request after the first continues the chain with only its new items, and
    prefilled at most their tokens + 64."""
    assert len(wire.sent) >= 3, wire.sent
    for sent, got in zip(wire.sent[1:], wire.got[1:], strict=True):
        assert sent.get(chained_by), sent
        items = sent["input"]
        assert isinstance(items, str) or all(
            i.get("type") == "function_call_output" or i.get("role") == "user" for i in items
        ), f"the request re-sent its history: {items}"
        usage = got["usage"]
        prefilled = usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"]
        assert prefilled <= _n_tokens(server, items) + 64, (items, usage, got["continuation"])


def _agent_tools() -> list[Any]:
    from agents import function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny, 21 C in {city}"

    @function_tool
    def get_time(zone: str) -> str:
        """The time in a time zone."""
        return f"10:42 in {zone}"

    return [get_weather, get_time]


async def _agent_turns(server: ServerProcess, by: str) -> Wire:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    wire = Wire()
    hooks = {"request": [wire.arequest], "response": [wire.aresponse]}
    async with httpx.AsyncClient(event_hooks=hooks, timeout=300) as http:
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", http_client=http)
        agent = Agent(
            name="helper",
            instructions="You answer with the tools when they help.",
            tools=_agent_tools(),
            model=OpenAIResponsesModel(model="m", openai_client=client),
            reset_tool_choice=False,
        )
        # Chained from the very first request: the tool rounds inside a run too.
        kwargs: dict[str, Any] = {"auto_previous_response_id": by == "previous"}
        if by == "conversation":
            kwargs["conversation_id"] = (await client.conversations.create()).id
        for question in QUESTIONS:
            agent.model_settings = ModelSettings(
                temperature=0, max_tokens=MAX_TOKENS, tool_choice="auto"
            )
            result = await Runner.run(
                agent, question, max_turns=4, hooks=_AnswerAfterTools(), **kwargs
            )
            assert result.last_response_id is not None
            if by == "previous":
                kwargs = {"previous_response_id": result.last_response_id}
    return wire


def _answer_after_tools() -> type:
    from agents import RunHooks

    class AnswerAfterTools(RunHooks):  # type: ignore[misc]
        """After a tool ran, the model answers (`tool_choice: none`: SmolLM2 would call tools
        again and again). kvswap shows the tools alike under "auto" and "none", so the switch
        keeps the prompt: the conversation's prefix stays the mind's."""

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: str) -> None:
            agent.model_settings = replace(agent.model_settings, tool_choice="none")

    return AnswerAfterTools


def _AnswerAfterTools() -> Any:
    return _answer_after_tools()()


@pytest.mark.parametrize("by", ["previous", "conversation"])
def test_openai_agents_chain_on_the_server(agent_server: ServerProcess, by: str) -> None:
    """Decision: an Agents SDK agent with server-managed state sends only its new items and
    kvswap prefills only them (the history is the mind's), through tool calls and their
    outputs, chained by previous_response_id or by a conversation."""
    wire = asyncio.run(_agent_turns(agent_server, by))
    assert any(o.get("type") == "function_call" for got in wire.got for o in got["output"]), (
        "the agent called a tool"
    )
    _check_chained(
        agent_server,
        wire,
        chained_by="previous_response_id" if by == "previous" else "conversation",
    )


def test_langchain_chat_openai_with_previous_response_id(agent_server: ServerProcess) -> None:
    """LangChain's ChatOpenAI on the Responses API with `use_previous_response_id`: it drops
    the history up to its last response from each request (here, a tool's output each turn);
    kvswap continues the chain."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny, 21 C in {city}"

    wire = Wire()
    http = httpx.Client(event_hooks={"request": [wire.request], "response": [wire.response]})
    llm = ChatOpenAI(
        model="m",
        base_url=agent_server.url + "/v1",
        api_key="x",  # type: ignore[arg-type]
        temperature=0,
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        use_responses_api=True,
        use_previous_response_id=True,
        http_client=http,
    ).bind_tools([get_weather], tool_choice="required")  # the same choice every turn
    messages: list[Any] = [HumanMessage(QUESTIONS[0])]
    for _ in range(3):
        answer = llm.invoke(messages)
        assert answer.tool_calls, answer
        call = answer.tool_calls[0]
        messages += [answer, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    http.close()
    _check_chained(agent_server, wire, chained_by="previous_response_id")
