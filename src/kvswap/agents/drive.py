"""Real Claude Code and Codex sessions of several turns against a server, through the recording
proxy, with the random-weight model steered so every turn ends as a real one would.

The proxy drives the model, never the protocol: every request samples greedily
(`temperature: 0`); answers follow a grammar of 150 to 250 words (`WORDS`: several hundred
tokens, and an end: greedy SmolLM2 writes until the output cap, which Claude Code reports as
an error); Codex's first request of each turn forces one call of its argument-less `get_goal`
tool (its session's tool turn), with no parallel calls (greedy SmolLM2 repeats calls for as
long as it may), and its answers run without tools. A tool choice is held by the grammar alone
and the flag is the same on every request, so neither changes the prompt.

`claude_turns` and `codex_turns` return each turn's exchanges as the proxy forwarded them
(rewritten); `kvswap bench coding` replays them, the tests assert on them. Recordings stay in
memory or the ignored cache, never in the repository (the prompts are the clients' text).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvswap.agents.clis import ClaudeCode, Codex, Ran
from kvswap.agents.recorder import Exchange, Recorder, Rewrite

WORDS = 'root ::= word (" " word){149,249} "."\nword ::= [a-zA-Z]{1,10}\n'
# The server flags the sessions run under: SmolLM2 extended to 16k tokens by YaRN (Claude
# Code's prompt is 6.5k tokens with no tools, Codex's 7k), one slot. kvswap's own (a -c past
# the training context turns YaRN on), and llama-server's four flags for the same extension
# (a benchmark runs both servers with one set of flags).
CONTEXT_16K = ["-c", "16384", "-np", "1"]
YARN_16K = [
    "-c", "16384", "-np", "1",
    "--override-kv", "llama.context_length=int:16384",
    "--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", "8192",
]  # fmt: skip
CODEX_EVERY = {"parallel_tool_calls": False, "tool_choice": "none"}
CODEX_CALL = {"tool_choice": {"type": "function", "name": "get_goal"}}


class AgentFailed(RuntimeError):
    """A client's turn exited non-zero (its output in the message)."""


def greedy(every: dict[str, Any], first: dict[str, Any] | None = None) -> Rewrite:
    """Greedy sampling and `every` on each request; on the first the rewrite sees, `first`
    instead when given."""
    seen = 0

    def rewrite(_: int, body: dict[str, Any]) -> dict[str, Any]:
        nonlocal seen
        extra = first if seen == 0 and first is not None else every
        seen += 1
        return {**body, "temperature": 0, **extra}

    return rewrite


def codex_rewrite() -> Rewrite:
    """A Codex turn's steering: its first request calls `get_goal`, the rest answer in
    `WORDS`."""
    return greedy({**CODEX_EVERY, "grammar": WORDS}, first={**CODEX_EVERY, **CODEX_CALL})


def claude_turns(
    url: str, home: Path, asks: Sequence[str], key: str = "none", timeout_s: float = 600
) -> list[list[Exchange]]:
    """`claude -p ASK` then `claude -p --continue ASK` for each later ask (Claude Code with no
    tools): each turn's exchanges. `AgentFailed` when a turn exits non-zero."""
    with Recorder(url) as proxy:
        claude = ClaudeCode(proxy.url, home, api_key=key, tools="", max_output_tokens=1000)
        turns = []
        for i, ask in enumerate(asks):
            proxy.rewrite = greedy({"grammar": WORDS})
            ran = claude.turn(ask, timeout_s) if i == 0 else claude.next_turn(ask, timeout_s)
            turns.append(_taken(proxy, ran))
        return turns


def codex_turns(
    url: str, home: Path, asks: Sequence[str], key: str = "none", timeout_s: float = 600
) -> list[list[Exchange]]:
    """`codex exec ASK` then `codex exec resume --last ASK` for each later ask, each turn
    calling `get_goal` once before it answers: each turn's exchanges. `AgentFailed` when a turn
    exits non-zero."""
    with Recorder(url) as proxy:
        codex = Codex(proxy.url, home, api_key=key)
        turns = []
        for i, ask in enumerate(asks):
            proxy.rewrite = codex_rewrite()
            ran = codex.turn(ask, timeout_s) if i == 0 else codex.next_turn(ask, timeout_s)
            turns.append(_taken(proxy, ran))
        return turns


def _taken(proxy: Recorder, ran: Ran) -> list[Exchange]:
    if ran.returncode != 0:
        raise AgentFailed(str(ran))
    return proxy.taken()
