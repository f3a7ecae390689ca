"""Claude Code and Codex sessions driven through a recording proxy, for the tests that run the
real clients against kvswap (one server: tests/server/test_real_agents.py; a cluster:
tests/cluster/test_real_agents_cluster.py), steered as `kvswap.agents.drive` says (greedy, a
150-250-word grammar, one forced `get_goal` call at the start of each Codex turn; Claude Code's
own Read tool called on the session's GOAL.md at the start of its first turn); and the token
counts the tests assert on.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvswap.agents.clis import ClaudeCode, Codex
from kvswap.agents.drive import WORDS, codex_rewrite
from kvswap.agents.recorder import Exchange, Recorder, Rewrite

SLACK = 64  # tokens a turn may prefill beyond its new input (the bound)


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


_BILLING = re.compile(r"cc_version=([\d.]+)\.(\w+);")


def stamped(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its billing line as an interactive session writes it: another version
    suffix and a `cch=` stamp of this request's own."""
    system = [dict(b) for b in body["system"]]
    stamp = uuid.uuid4().hex[:5]
    system[0]["text"] = _BILLING.sub(rf"cc_version=\1.{stamp[:3]}; cch={stamp};", system[0]["text"])
    assert system[0]["text"] != body["system"][0]["text"], system[0]
    return {**body, "system": system}


GOAL = "The goal of this session is to teach a cat to write Python.\n"


def read_goal(
    home: Path, then: Callable[[dict[str, Any]], dict[str, Any]] = dict, call: bool = True
) -> Rewrite:
    """Claude Code's steering (`then` first changes each body): with `call`, the first request
    calls Claude Code's own Read tool on `home`/GOAL.md (the one path Read's schema is narrowed
    to, on every request alike, so the prompt's prefix holds); every other request answers in
    `WORDS`; greedy throughout."""
    goal = str(home / "GOAL.md")
    narrowed = {
        "type": "object",
        "properties": {"file_path": {"type": "string", "enum": [goal]}},
        "required": ["file_path"],
    }
    seen = 0 if call else 1

    def rewrite(_: int, body: dict[str, Any]) -> dict[str, Any]:
        nonlocal seen
        body = then(body)
        tools = [
            {**t, "input_schema": narrowed} if t.get("name") == "Read" else t
            for t in body.get("tools", [])
        ]
        if seen == 0:
            steer: dict[str, Any] = {"tool_choice": {"type": "tool", "name": "Read"}}
        else:
            steer = {"tool_choice": {"type": "none"}, "grammar": WORDS}
        seen += 1
        return {**body, "tools": tools, "temperature": 0, **steer}

    return rewrite


@dataclass
class Session:
    """The exchanges of a session's two turns, as the proxy saw them."""

    turn1: list[Exchange]
    turn2: list[Exchange]

    @property
    def all(self) -> list[Exchange]:
        return self.turn1 + self.turn2


def claude_session(
    url: str, home: Path, key: str, between: Callable[[str], None] | None = None
) -> Session:
    """`claude -p` (Claude Code's Read tool called on GOAL.md, then an answer) then `claude -p
    --continue` (its billing line restamped), each exiting 0; `between(session_id)` runs
    between the turns. Claude Code offers the model its Read tool alone: its whole default set
    makes a 21k-token prompt, 8 minutes of prefill on SmolLM2 with two cores."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "GOAL.md").write_text(GOAL)
    with Recorder(url, rewrite=read_goal(home)) as proxy:
        claude = ClaudeCode(proxy.url, home, api_key=key, tools="Read", max_output_tokens=1000)
        first = claude.turn("What is the goal of this session? Read GOAL.md.", timeout_s=600)
        assert first.returncode == 0, first
        turn1 = proxy.taken()
        results = [
            block
            for m in turn1[-1].json()["messages"]
            if isinstance(m["content"], list)
            for block in m["content"]
            if block.get("type") == "tool_result"
        ]
        assert results and GOAL.strip() in str(results[0]["content"]), turn1[-1].json()
        if between is not None:
            between(turn1[0].headers["X-Claude-Code-Session-Id"])
        proxy.rewrite = read_goal(home, stamped, call=False)
        second = claude.next_turn(
            "Now tell the same story from the computer's point of view.", timeout_s=600
        )
        assert second.returncode == 0, second
        return Session(turn1, proxy.taken())


def claude_resume(url: str, home: Path, key: str, session: str) -> tuple[list[Exchange], Count]:
    """Another session's turn (`claude -p`), then `claude -p --resume SESSION`, each exiting 0:
    the resumed turn's exchanges, and the count of the other session's first request."""
    with Recorder(url, rewrite=read_goal(home, call=False)) as proxy:
        claude = ClaudeCode(proxy.url, home, api_key=key, tools="Read", max_output_tokens=1000)
        other = claude.turn("Say hello.", timeout_s=600)
        assert other.returncode == 0, other
        between = anthropic_count(proxy.taken()[0])
        proxy.rewrite = read_goal(home, call=False)
        resumed = claude.resume(session, "Say it once more, in one sentence.", timeout_s=600)
        assert resumed.returncode == 0, resumed
        return proxy.taken(), between


def codex_session(url: str, home: Path, key: str) -> Session:
    """`codex exec` (one forced tool call, then an answer) then `codex exec resume --last`,
    each exiting 0."""
    with Recorder(url, rewrite=codex_rewrite()) as proxy:
        codex = Codex(proxy.url, home, api_key=key)
        first = codex.turn("What is the goal of this session?", timeout_s=400)
        assert first.returncode == 0, first
        turn1 = proxy.taken()
        called = [i for i in turn1[-1].json()["input"] if i.get("type") == "function_call"]
        assert called and called[0]["name"] == "get_goal", [x.json()["input"] for x in turn1]
        proxy.rewrite = codex_rewrite()
        second = codex.next_turn("Say it again in one sentence.", timeout_s=400)
        assert second.returncode == 0, second
        return Session(turn1, proxy.taken())
