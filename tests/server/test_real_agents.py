"""Claude Code and Codex, the released command-line agents (installed from npm at pinned
versions by scripts/setup.sh), each run two turns of one session against a real `kvswap serve`
on SmolLM2 (YaRN to 16k tokens, one slot, two API keys), through a recording proxy.

What a user relies on: both turns exit 0; the session is a mind, so every request after the
first prefills only what it adds (its new input + 64 tokens), the answers and tool calls coming
back included; a request with a new billing stamp and a side request on the session's id leave
that whole; another API key sending the session's id reads nothing of it.

The proxy drives the random-weight model, never the protocol: every request samples greedily
(`temperature: 0`); Claude Code's answers follow a grammar of 150 to 250 words (several hundred
tokens, and an end: greedy SmolLM2 writes a story until the output cap, which the CLI reports as
an error), and Codex's first request forces one call of its argument-less `get_goal` tool (the
"turn where the model called a tool") with no parallel calls, then answers without tools.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvswap.agents.clis import ClaudeCode, Codex
from kvswap.agents.recorder import Exchange, Recorder
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.slow]

FLAGS = [
    "-c", "16384", "-np", "1",
    "--override-kv", "llama.context_length=int:16384",
    "--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", "8192",
    "--api-key", "ka,kb",
]  # fmt: skip
SLACK = 64  # tokens a turn may prefill beyond its new input (the bound)
WORDS = 'root ::= word (" " word){149,249} "."\nword ::= [a-zA-Z]{1,10}\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("real-agents") / "server.log"
    srv = ServerProcess(FLAGS, log)
    try:
        srv.wait_ready(180)
        yield srv
    finally:
        srv.stop()


@dataclass
class Count:
    """One request's tokens: its prompt, how many of them it prefilled, what it generated."""

    prompt: int
    prefilled: int
    output: int


def anthropic_count(x: Exchange) -> Count:
    events = x.events()
    start = next(e["message"]["usage"] for e in events if e.get("type") == "message_start")
    end = [e["usage"] for e in events if e.get("type") == "message_delta"][-1]
    prefilled = start["input_tokens"] + (start.get("cache_creation_input_tokens") or 0)
    read = start.get("cache_read_input_tokens") or 0
    return Count(prefilled + read, prefilled, end["output_tokens"])


def responses_count(x: Exchange) -> Count:
    done = [e["response"] for e in x.events() if e.get("type") == "response.completed"]
    assert done, f"no response.completed: {x.status} {x.answer[-500:]!r}"
    usage = done[-1]["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    return Count(usage["input_tokens"], usage["input_tokens"] - cached, usage["output_tokens"])


def assert_no_reprefill(counts: list[Count], what: str) -> None:
    """Each request after the first prefills at most its new input + SLACK: the tokens its
    prompt adds to the previous request's prompt and answer."""
    for i in range(1, len(counts)):
        before, now = counts[i - 1], counts[i]
        new_input = now.prompt - before.prompt - before.output
        assert now.prefilled <= max(new_input, 0) + SLACK, (what, i, counts)


def greedy(every: dict[str, Any], first: dict[str, Any] | None = None) -> Any:
    """Greedy sampling and `every` on each request, `first` over them on the first."""

    def rewrite(i: int, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "temperature": 0, **every, **((first or {}) if i == 0 else {})}

    return rewrite


_BILLING = re.compile(r"cc_version=([\d.]+)\.(\w+);")


def stamped(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its billing line as an interactive session writes it: another version
    suffix and a `cch=` stamp of this request's own."""
    system = [dict(b) for b in body["system"]]
    stamp = uuid.uuid4().hex[:5]
    system[0]["text"] = _BILLING.sub(rf"cc_version=\1.{stamp[:3]}; cch={stamp};", system[0]["text"])
    assert system[0]["text"] != body["system"][0]["text"], system[0]
    return {**body, "system": system, "temperature": 0, "grammar": WORDS}


@pytest.mark.timeout(1200)
def test_claude_code_continues_its_session_from_the_mind(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`claude -p`, a side request and a restamped billing line on the session's id, then
    `claude -p --continue`: both exit 0 and every request after the first prefills only its new
    input (before: a 400 on the system turn, then each turn prefilled its history again from the
    billing line's 25th token). Another key sending the session's id reads none of it."""
    with Recorder(server.url, rewrite=greedy(every={"grammar": WORDS})) as proxy:
        claude = ClaudeCode(
            proxy.url, tmp_path / "claude", api_key="ka", tools="", max_output_tokens=1000
        )
        first = claude.turn("Write a short story about a cat who learns to code.")
        assert first.returncode == 0, first
        turn1 = proxy.taken()
        session = turn1[0].headers["X-Claude-Code-Session-Id"]
        counts = [anthropic_count(x) for x in turn1]
        assert counts[0].output >= 150, counts

        # A title request on the session's id (another system prompt): it must not take the mind.
        side = httpx.post(
            server.url + "/v1/messages",
            headers={"x-api-key": "ka", "x-claude-code-session-id": session},
            json={
                "model": "m",
                "max_tokens": 8,
                "system": "Write a 3-word title for this conversation.",
                "messages": [{"role": "user", "content": "A cat who learns to code."}],
            },
            timeout=300,
        )
        assert side.status_code == 200, side.text

        proxy.rewrite = lambda i, body: stamped(body)
        second = claude.next_turn("Now tell the same story from the computer's point of view.")
        assert second.returncode == 0, second
        turn2 = proxy.taken()
    counts += [anthropic_count(x) for x in turn2]
    assert_no_reprefill(counts, "claude")

    # Key kb sends the session's id and its first prompt: its own mind, nothing read.
    other = httpx.post(
        server.url + "/v1/messages",
        headers={"x-api-key": "kb", "x-claude-code-session-id": session},
        json={**turn1[0].json(), "max_tokens": 1, "stream": False},
        timeout=600,
    )
    assert other.status_code == 200, other.text
    assert (other.json()["usage"].get("cache_read_input_tokens") or 0) == 0, other.json()


@pytest.mark.timeout(1200)
def test_codex_resumes_its_session_from_the_mind(server: ServerProcess, tmp_path: Path) -> None:
    """`codex exec` (its model calls a tool, then answers) then `codex exec resume --last`: both
    exit 0, and every request after the first prefills only its new input: the call and the
    answer come back as Codex re-sends them and match the mind's own tokens (before: each
    request prefilled the previous answer again). Another key with the session's
    `prompt_cache_key` reads none of it."""
    # One call (greedy SmolLM2 repeats calls for as long as it may), then answers only: a
    # choice is held by the grammar alone, so neither changes the prompt (nor does the flag, the
    # same on every request).
    every = {"parallel_tool_calls": False, "tool_choice": "none"}
    forced = {"tool_choice": {"type": "function", "name": "get_goal"}}
    with Recorder(server.url, rewrite=greedy(every, first=forced)) as proxy:
        codex = Codex(proxy.url, tmp_path / "codex", api_key="ka")
        first = codex.turn("What is the goal of this session?", timeout_s=400)
        assert first.returncode == 0, first
        turn1 = proxy.taken()
        called = [i for i in turn1[-1].json()["input"] if i.get("type") == "function_call"]
        assert called and called[0]["name"] == "get_goal", [x.json()["input"] for x in turn1]
        second = codex.next_turn("Say it again in one sentence.", timeout_s=400)
        assert second.returncode == 0, second
        turn2 = proxy.taken()
    session = turn1[0].json()["prompt_cache_key"]
    assert all(x.json()["prompt_cache_key"] == session for x in turn2)
    counts = [responses_count(x) for x in turn1 + turn2]
    assert_no_reprefill(counts, "codex")

    other = httpx.post(
        server.url + "/v1/responses",
        headers={"authorization": "Bearer kb"},
        json={**turn1[0].json(), "max_output_tokens": 16, "stream": False, "tool_choice": "none"},
        timeout=600,
    )
    assert other.status_code == 200, other.text
    assert other.json()["usage"]["input_tokens_details"]["cached_tokens"] == 0, other.json()
