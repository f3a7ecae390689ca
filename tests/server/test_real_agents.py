"""Claude Code and Codex, the released command-line agents (installed from npm at pinned
versions by scripts/setup.sh), each run two turns of one session against a real `kvswap serve`
on SmolLM2 (-c 16384: YaRN to 16k tokens, one slot, two API keys), through a recording proxy
that drives the random-weight model (tests/server/real_agents.py).

What a user relies on: both turns exit 0; the session is a mind, so every request after the
first prefills only what it adds (its new input + 64 tokens), the answers and tool calls coming
back included; a request with a new billing stamp and a side request on the session's id leave
that whole; another API key sending the session's id reads nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvswap.agents.drive import CONTEXT_16K
from tests.server.harness import ServerProcess
from tests.server.real_agents import (
    anthropic_count,
    assert_no_reprefill,
    claude_resume,
    claude_session,
    codex_session,
    responses_count,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("real-agents") / "server.log"
    srv = ServerProcess([*CONTEXT_16K, "--api-key", "ka,kb"], log)
    try:
        srv.wait_ready(180)
        yield srv
    finally:
        srv.stop()


@pytest.mark.timeout(1200)
def test_claude_code_continues_its_session_from_the_mind(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`claude -p` (the model calls Claude Code's Read tool, then answers on its result), a side
    request on the session's id, then `claude -p --continue` under a restamped billing line:
    both exit 0 and every request after the first prefills only its new input, the tool call
    and its result included (before: a 400 on the system turn, then each turn prefilled its
    history again from the billing line's 25th token). Another key sending the session's id
    reads none of it; after another session's turn, `claude -p --resume` continues the first
    from its mind."""

    def title_request(session: str) -> None:
        """A title request on the session's id (another system prompt): not on the mind."""
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

    run = claude_session(server.url, tmp_path / "claude", "ka", between=title_request)
    counts = [anthropic_count(x) for x in run.all]
    assert len(run.turn1) == 2, counts  # the Read call, then the answer on its result
    assert counts[1].output >= 150, counts
    assert_no_reprefill(counts, "claude")

    # Key kb sends the session's id and its first prompt: its own mind, nothing read.
    session = run.turn1[0].headers["X-Claude-Code-Session-Id"]
    other = httpx.post(
        server.url + "/v1/messages",
        headers={"x-api-key": "kb", "x-claude-code-session-id": session},
        json={**run.turn1[0].json(), "max_tokens": 1, "stream": False},
        timeout=600,
    )
    assert other.status_code == 200, other.text
    assert (other.json()["usage"].get("cache_read_input_tokens") or 0) == 0, other.json()

    # Another session of key ka runs, then `claude -p --resume` names the first: its mind comes
    # back (from RAM or disk) and the turn prefills only its new input.
    resumed, between = claude_resume(server.url, tmp_path / "claude", "ka", session)
    assert between.prefilled < between.prompt // 2, between  # the other opened from its prefix
    assert all(x.headers["X-Claude-Code-Session-Id"] == session for x in resumed)
    mind = [e for e in resumed[0].events() if e.get("type") == "message_delta"][-1]["mind"]
    assert mind["name"] == session and mind["tier_before"] in ("ram", "disk"), mind
    assert_no_reprefill([counts[-1], anthropic_count(resumed[0])], "claude --resume")


@pytest.mark.timeout(1200)
def test_codex_resumes_its_session_from_the_mind(server: ServerProcess, tmp_path: Path) -> None:
    """`codex exec` (its model calls a tool, then answers) then `codex exec resume --last`: both
    exit 0, and every request after the first prefills only its new input: the call and the
    answer come back as Codex re-sends them and match the mind's own tokens (before: each
    request prefilled the previous answer again). Another key with the session's
    `prompt_cache_key` reads none of it."""
    run = codex_session(server.url, tmp_path / "codex", "ka")
    session = run.turn1[0].json()["prompt_cache_key"]
    assert all(x.json()["prompt_cache_key"] == session for x in run.turn2)
    assert_no_reprefill([responses_count(x) for x in run.all], "codex")

    other = httpx.post(
        server.url + "/v1/responses",
        headers={"authorization": "Bearer kb"},
        json={
            **run.turn1[0].json(),
            "max_output_tokens": 16,
            "stream": False,
            "tool_choice": "none",
        },
        timeout=600,
    )
    assert other.status_code == 200, other.text
    assert other.json()["usage"]["input_tokens_details"]["cached_tokens"] == 0, other.json()
