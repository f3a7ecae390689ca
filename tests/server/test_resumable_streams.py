"""llama-server's resumable streams through the real server: an answer streamed with
`X-Conversation-Id` runs to its end after its client left, and `GET /v1/stream` replays the
very bytes the client would have read, from any offset; `DELETE /v1/stream` stops a running
one; another API key can neither read nor stop it. A tiny random model."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

KA, KB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
ARGS = ("-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "-ub", "64", "--api-key", "ka,kb")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    log = tmp_path_factory.mktemp("streams") / "server.log"
    proc = ServerProcess(["-m", str(model), *ARGS], log)
    yield proc
    proc.stop()


def _body(max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Tell the story of the lighthouse keeper."}]
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    return {**body, "ignore_eos": True}  # runs to max_tokens


def _lookup(server: ServerProcess, conv: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    resp = server.post("/v1/streams/lookup", {"conversation_ids": [conv]}, headers=headers)
    assert resp.status_code == 200, resp.text
    return list(resp.json())


def _wait_done(server: ServerProcess, conv: str, headers: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        [found] = _lookup(server, conv, headers)
        if found["is_done"]:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


def _replay(server: ServerProcess, conv: str, offset: int, headers: dict[str, str]) -> bytes:
    resp = server.client.get(
        "/v1/stream", params={"conv_id": conv, "from": offset}, headers=headers
    )
    assert resp.status_code == 200, resp.text
    return resp.content


def test_a_stream_outlives_its_client_and_replays_from_any_offset(server: ServerProcess) -> None:
    """Defect caught: a page reload (the client gone mid-answer) losing the answer, or a
    replay that differs from what was streamed (llama-server's web UI reattaches with
    GET /v1/stream?conv_id=...&from=N and expects the same SSE bytes)."""
    conv = "conv-1::org/some-model"
    headers = {**KA, "X-Conversation-Id": conv}
    with server.client.stream(
        "POST", "/v1/chat/completions", json=_body(1500), headers=headers
    ) as r:
        assert r.status_code == 200
        first = next(r.iter_raw())  # then the client leaves
    found = _wait_done(server, conv, KA)
    whole = _replay(server, conv, 0, KA)
    assert whole.startswith(first) and whole.endswith(b"data: [DONE]\n\n")
    assert found["total_bytes"] == len(whole)
    events = [json.loads(e[6:]) for e in whole.decode().split("\n\n") if e.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "length"  # its very end
    assert events[-1]["timings"]["predicted_n"] == 1500 > 10 * first.count(b"data: ")
    assert _replay(server, conv, 17, KA) == whole[17:]
    assert server.client.get("/v1/stream", params={"conv_id": conv}, headers=KB).status_code == 404
    assert _lookup(server, "conv-1", KB) == []
    assert (
        server.client.delete("/v1/stream", params={"conv_id": conv}, headers=KB).status_code == 204
    )
    assert _replay(server, conv, 0, KA) == whole  # kb's stop stopped nothing of ka's
    assert (
        server.client.delete("/v1/stream", params={"conv_id": conv}, headers=KA).status_code == 204
    )
    assert server.client.get("/v1/stream", params={"conv_id": conv}, headers=KA).status_code == 404


def test_a_stop_cancels_a_running_generation(server: ServerProcess) -> None:
    """Defect caught: DELETE /v1/stream forgetting the buffer but leaving the generation
    running on its slot (the only way to stop a stream whose client left)."""
    conv = "conv-stop"
    headers = {**KA, "X-Conversation-Id": conv}
    with server.client.stream(
        "POST", "/v1/chat/completions", json=_body(3000), headers=headers
    ) as r:
        chunks = r.iter_raw()
        next(chunks)
        stop = server.client.delete("/v1/stream", params={"conv_id": conv}, headers=KA)
        assert stop.status_code == 204
        rest = b"".join(chunks)  # the answer ends early, without [DONE]
    assert b"[DONE]" not in rest
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in server.client.get("/slots", headers=KA).json()):
        assert time.monotonic() < deadline, "the stopped generation still runs"
        time.sleep(0.05)
    assert server.client.get("/v1/stream", params={"conv_id": conv}, headers=KA).status_code == 404
