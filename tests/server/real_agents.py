"""Claude Code and Codex sessions driven through a recording proxy, for the tests that run the
real clients against kvswap (one server: tests/server/test_real_agents.py; a cluster:
tests/cluster/test_real_agents_cluster.py), steered as `kvswap.agents.drive` says (greedy, a
150-250-word grammar, one forced `get_goal` call at the start of each Codex turn); and the token
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
from kvswap.agents.drive import WORDS, codex_rewrite, greedy
from kvswap.agents.recorder import Exchange, Recorder

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
    return {**body, "system": system, "temperature": 0, "grammar": WORDS}


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
    """`claude -p` then `claude -p --continue` (its billing line restamped), each exiting 0;
    `between(session_id)` runs between the turns."""
    with Recorder(url, rewrite=greedy(every={"grammar": WORDS})) as proxy:
        claude = ClaudeCode(proxy.url, home, api_key=key, tools="", max_output_tokens=1000)
        first = claude.turn("Write a short story about a cat who learns to code.", timeout_s=600)
        assert first.returncode == 0, first
        turn1 = proxy.taken()
        if between is not None:
            between(turn1[0].headers["X-Claude-Code-Session-Id"])
        proxy.rewrite = lambda i, body: stamped(body)
        second = claude.next_turn(
            "Now tell the same story from the computer's point of view.", timeout_s=600
        )
        assert second.returncode == 0, second
        return Session(turn1, proxy.taken())


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
