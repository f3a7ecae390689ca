"""What a server keeps of its stored conversations (a tiny model): responses expire after
`--state-ttl-seconds` and `--state-bytes` drops the least recently used chains first, each
taking its mind's state with it; `truncation: "auto"` drops a long chain's oldest items to fit
its slot (one re-prefill of the kept window) where `"disabled"` answers a 400."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.agent_util import oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

ARGS: dict[str, Any] = {"model": "m", "max_output_tokens": 4, "temperature": 0}
TINY = ("-c", "1024", "-np", "2", "-t", "1", "-tb", "1")


@pytest.fixture()
def tiny(tmp_path: Path) -> Callable[..., ServerProcess]:
    started: list[ServerProcess] = []

    def get(*args: str) -> ServerProcess:
        model = tiny_model_path("llama", seed=7, vocab="tiny", clean_text=True)
        server = ServerProcess(["-m", str(model), *TINY, *args], tmp_path / "server.log")
        started.append(server)
        return server

    yield get
    for server in started:
        server.stop()


def _chain(client: openai.OpenAI, n: int, text: str = "Hello there.") -> list[Any]:
    out, previous = [], None
    for _ in range(n):
        resp = client.responses.create(input=text, previous_response_id=previous, **ARGS)
        out.append(resp)
        previous = resp.id
    return out


def _minds(server: ServerProcess) -> set[str]:
    return {m["mind"] for m in server.client.get("/pages").json()["minds"]}


def test_responses_expire_with_their_minds(tiny: Callable[..., ServerProcess]) -> None:
    """Retention by time: past its time to live a response is gone (404, and it cannot be
    continued), and the mind it was the last reference to leaves every tier."""
    server = tiny("--state-ttl-seconds", "3")
    client = oai(server)
    old = _chain(client, 2)
    mind = old[-1].model_extra["continuation"]["mind"]
    assert mind in _minds(server)
    time.sleep(3.5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(old[-1].id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(input="More.", previous_response_id=old[-1].id, **ARGS)
    _chain(client, 1)  # a write applies the retention
    assert mind not in _minds(server)


def test_byte_budget_drops_the_oldest_chain_first(tiny: Callable[..., ServerProcess]) -> None:
    """Retention by bytes: past `--state-bytes` the least recently used chain goes first,
    whole, with its mind; the recent ones stay."""
    server = tiny("--state-bytes", "24k")
    client = oai(server)
    chains = [_chain(client, 2, f"Chain {k} says hello.") for k in range(8)]
    kept = [c for c in chains if _exists(client, c[-1].id)]
    assert 0 < len(kept) < len(chains)
    assert kept == chains[-len(kept) :], "the least recently used chains went first"
    stored = server.client.get("/pages").json()["stored"]
    assert stored["n_bytes"] <= 24 * 1024
    minds = _minds(server)
    for dropped in chains[: -len(kept)]:
        assert dropped[-1].model_extra["continuation"]["mind"] not in minds


def _exists(client: openai.OpenAI, rid: str) -> bool:
    try:
        client.responses.retrieve(rid)
    except openai.NotFoundError:
        return False
    return True


def test_truncation_auto_drops_the_oldest_items(tiny: Callable[..., ServerProcess]) -> None:
    """`truncation: "auto"`: a chain past its slot's window keeps answering, its oldest items
    dropped once (a re-prefill of the kept window), then continues incrementally again;
    `"disabled"` (the default) answers OpenAI's 400 instead."""
    server = tiny("-kvu")
    client = oai(server)
    long = "A long message about servers and caches. " * 12  # about 100 tokens
    previous, modes = None, []
    for _ in range(9):
        resp = client.responses.create(
            input=long, previous_response_id=previous, truncation="auto", **ARGS
        )
        modes.append(resp.model_extra["continuation"])
        previous = resp.id
    assert any(m["mode"] == "truncated" for m in modes), modes
    after = modes[[m["mode"] for m in modes].index("truncated") + 1 :]
    assert after and after[0]["mode"] == "incremental" and after[0]["n_dropped_items"] > 0
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(input=long * 4, previous_response_id=previous, **ARGS)
    assert "context" in err.value.message
