"""A tiny random model emits lone bytes and partial UTF-8: nothing broken ever leaves the
server, stop strings that straddle tokens are honoured, and streams equal non-streamed text."""

from __future__ import annotations

import itertools
import json

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def tiny_server(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    return server_factory("-m", str(model), "-c", "1024", "-np", "2", "-t", "1", "-tb", "1")


def _raw_stream(server: ServerProcess, body: dict) -> list[dict]:
    """SSE objects, checking every byte on the wire is valid UTF-8 without surrogates."""
    with server.client.stream("POST", "/completion", json=body) as resp:
        raw = resp.read()
    text = raw.decode("utf-8")  # strict: raises on broken UTF-8
    objs = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    for obj in objs:
        assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in obj.get("content", ""))
    return objs


def test_the_model_really_emits_partial_utf8(tiny_server: ServerProcess) -> None:
    out = tiny_server.post(
        "/completion", {"prompt": PROMPT, "n_predict": 200, "temperature": 0, "return_tokens": True}
    ).json()
    # Some generated tokens are lone bytes that are not UTF-8 on their own.
    alone = [
        tiny_server.post("/detokenize", {"tokens": [t]}).json()["content"] for t in out["tokens"]
    ]
    assert any("\ufffd" in text for text in alone), (
        "the test needs a model that emits partial UTF-8"
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streams_equal_non_streamed_content_and_stops_straddle_tokens(
    tiny_server: ServerProcess, seed: int
) -> None:
    body = {"prompt": f"{PROMPT} {seed}", "n_predict": 120, "temperature": 0, "return_tokens": True}
    free = tiny_server.post("/completion", body).json()
    content = free["content"]
    assert content
    # Pieces of each generated token, to choose stop strings that straddle a token boundary.
    pieces = [
        tiny_server.post("/detokenize", {"tokens": [t]}).json()["content"] for t in free["tokens"]
    ]
    stops: list[str] = []
    pos = 0
    for a, b in itertools.pairwise(pieces):
        pos += len(a)
        if len(a) >= 1 and len(b) >= 1 and "\ufffd" not in a + b and len(stops) < 3 and pos > 10:
            stops.append(a[-1] + b[0])
    for stop in [None, *stops]:
        req = {**body, "stop": [stop]} if stop else dict(body)
        whole = tiny_server.post("/completion", req).json()
        chunks = _raw_stream(tiny_server, {**req, "stream": True})
        streamed = "".join(c["content"] for c in chunks)
        assert streamed == whole["content"], stop
        if stop and stop in content:
            assert whole["stop_type"] == "word" and whole["stopping_word"] == stop
            assert whole["content"] == content[: content.index(stop)]
