"""A coding agent's session on three replicas behind HAProxy, Redis between them
(`--shared-tier-rpo-tokens 0`): a session key (`prompt_cache_key`), tools, and the whole
history re-sent every turn with the model's tool calls echoed back. Every turn prefills only
what the conversation added since the last one (the tool's output and the glue), on the mind's
replica and on the replica that takes the mind over when its owner is killed: the last turn
travels with the mind in the shared tier (`minds.turnrecord`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.replicas import Cluster, running
from tests.server.test_agent_sessions import CHAT_TOOLS, FORCED

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]
SYSTEM = "You are a coding agent in a small repository. Read before you write."


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("sessions"), ["--shared-tier-rpo-tokens", "0"]) as c:
        yield c


def _turn(client: httpx.Client, messages: list[Any], session: str) -> httpx.Response:
    """A turn that calls a tool (forced: a random model calls one only when made to)."""
    body = {
        "messages": messages,
        "tools": CHAT_TOOLS,
        "tool_choice": FORCED,
        "temperature": 0,
        "max_tokens": 200,
        "prompt_cache_key": session,
    }
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp


def _echoed(messages: list[Any], resp: httpx.Response, output: str) -> list[Any]:
    """The conversation the client sends next: the call echoed back, then the tool's output."""
    call = resp.json()["choices"][0]["message"]
    assert call["tool_calls"], call
    tool = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": output}
    return [*messages, call, tool]


def _assert_only_new_input(before: httpx.Response, after: httpx.Response) -> None:
    """`after` continued the mind past `before`'s answer: it prefilled only what the
    conversation added after `before`'s prompt and answer (+1: the answer's last token, which
    the KV never held)."""
    assert "x-kvswap-diverged-at" not in after.headers, dict(after.headers)
    usage = before.json()["usage"]
    n_new = after.json()["usage"]["prompt_tokens"] - usage["prompt_tokens"]
    n_new -= usage["completion_tokens"]
    assert after.json()["timings"]["prompt_n"] <= n_new + 1, (after.json()["timings"], n_new)


def test_a_session_prefills_only_its_new_input_on_its_replica_and_after_a_takeover(
    cluster: Cluster,
) -> None:
    """Defect caught: in a cluster the last turns were off (a turn may move to another
    replica), so every turn prefilled its previous answer again, on the mind's own replica
    too."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Fix the failing test."},
    ]
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        first = _turn(client, messages, "cluster-session")
        owner = first.headers["x-kvswap-replica"]
        messages = _echoed(messages, first, "1 failed")
        second = _turn(client, messages, "cluster-session")
        assert second.headers["x-kvswap-replica"] == owner
        _assert_only_new_input(first, second)
        cluster.replicas[owner].kill()
        messages = _echoed(messages, second, "0 failed")
        third = _turn(client, messages, "cluster-session")
    assert third.headers["x-kvswap-replica"] != owner
    _assert_only_new_input(second, third)
