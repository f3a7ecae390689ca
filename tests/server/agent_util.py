"""Shared pieces of the agent API server tests: server arguments, tools, clients, streams."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai

from tests.server.harness import ServerProcess

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
QWEN25_TEMPLATE = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3_TEMPLATE = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"

# SmolLM2 with another model's chat template: 2 slots of 2048 tokens, 1 thread (two contend on 2 shared cores).
SMALL = ("-c", "4096", "-np", "2", "-t", "1", "-tb", "1")
QWEN25_ARGS = (*SMALL, "--chat-template-file", str(QWEN25_TEMPLATE))
QWEN3_ARGS = (*SMALL, "--chat-template-file", str(QWEN3_TEMPLATE))

WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": WEATHER_PARAMS,
    },
}
TIME_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": TIME_PARAMS,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def settle(server: ServerProcess, timeout_s: float = 60) -> None:
    """Wait until no slot runs a request (a previous test's cancelled stream, say)."""
    deadline = time.monotonic() + timeout_s
    while any(s["is_processing"] for s in server.client.get("/slots").json()):
        assert time.monotonic() < deadline, "a slot stays busy"
        time.sleep(0.02)


def from_scratch(server: ServerProcess) -> dict[str, Any]:
    """Body fields of a run that another run must match token for token. Greedy tokens are the
    same only under the same batches (SPEC §9: a different split moves logits by ~0.01, enough
    to flip a near tie): so no cached prefix (which would leave only the last prompt token to
    decode, alone) and no other request in the batch. Call it before each of the runs."""
    settle(server)
    return {"cache_prompt": False}


def oai(server: ServerProcess, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, timeout=300)


def collect_tool_calls(chunks: list[Any]) -> list[dict[str, str]]:
    """Tool calls assembled from streamed chat chunks, as a client does."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    entry["id"] = tc.id
                if tc.function and tc.function.name:
                    entry["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    entry["arguments"] += tc.function.arguments
    return [calls[i] for i in sorted(calls)]


def stream_text(chunks: list[Any]) -> tuple[str, str]:
    """(content, reasoning_content) assembled from streamed chat chunks."""
    content = reasoning = ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            extra = choice.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
    return content, reasoning


def sse_events(server: ServerProcess, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(event name, data) of a named-event SSE stream (Anthropic, Responses)."""
    out: list[tuple[str, Any]] = []
    name = ""
    with server.client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[len("data: ") :])))
    return out
