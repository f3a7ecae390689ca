"""A stored conversation in a cluster: three real replicas on a tiny model behind HAProxy,
Redis between them, every turn published (`--shared-tier-rpo-tokens 0`). The chain's replica
is killed (kill -9); its next turn, on another replica, continues the same response id with
the same text as a twin chain on a live replica, prefilling only its new input: the records
come from the shared tier's log, the mind's state from its published page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.replicas import Cluster, running

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

MESSAGES = (
    "The server keeps the conversation in memory.",
    "When the memory is full it writes the oldest pages to the disk.",
    "If the same prefix comes back, the server can reuse it.",
    "What is the time?",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("stored"), ["--shared-tier-rpo-tokens", "0"]) as c:
        yield c


def _turn(client: httpx.Client, mind: str, text: str, previous: str | None) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "m",
        "input": [{"role": "user", "content": text}],
        "max_output_tokens": 6,
        "temperature": 0,
        "previous_response_id": previous,
    }
    # The chain's mind named: HAProxy routes every turn of it to one replica.
    resp = client.post("/v1/responses", json=body, headers={"X-Mind-Id": mind})
    assert resp.status_code == 200, resp.text
    return resp


def _text(body: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "") for item in body["output"] for part in item.get("content") or []
    )


def _chain(client: httpx.Client, mind: str, n_turns: int) -> list[httpx.Response]:
    out: list[httpx.Response] = []
    for text in MESSAGES[:n_turns]:
        out.append(_turn(client, mind, text, out[-1].json()["id"] if out else None))
    return out


def test_a_chain_continues_on_another_replica_after_its_replica_dies(cluster: Cluster) -> None:
    """Defects caught: records kept by one replica only (another finds no such response), a
    continuation after a takeover that re-prefills its history (the published page must be
    restored), a continuation whose text differs from the chain that never moved."""
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        chain = _chain(client, "chain-a", 3)
        owner = chain[-1].headers["x-kvswap-replica"]
        twin = _chain(client, "chain-b", 4)
        assert [_text(r.json()) for r in twin[:3]] == [_text(r.json()) for r in chain]
        cluster.replicas[owner].kill()
        after = _turn(client, "chain-a", MESSAGES[3], chain[-1].json()["id"])
    assert after.headers["x-kvswap-replica"] != owner
    body = after.json()
    assert body["previous_response_id"] == chain[-1].json()["id"]
    assert body["continuation"]["mode"] == "incremental", body["continuation"]
    assert _text(body) == _text(twin[3].json()), "the same text as the chain that stayed"
    usage, twin_usage = body["usage"], twin[3].json()["usage"]
    assert usage["input_tokens"] == twin_usage["input_tokens"]
    prefilled = usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"]
    twin_prefilled = (
        twin_usage["input_tokens"] - twin_usage["input_tokens_details"]["cached_tokens"]
    )
    assert prefilled == twin_prefilled, (usage, twin_usage)
