"""Minds come back, whatever the server chose to do with them (issue 20), through the real
server: at the default geometry (4 slots, one unified KV pool) minds that left the slots return
with only their new tokens prefilled; slot verbs on a slot that holds a mind act on the mind
(and another API key's verb is refused without naming it); a mind larger than the page store
never stops other requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

# `kvswap serve -c 4096`: 4 slots with unified KV drawing on one pool of 4096 cells.
DEFAULT_ARGS = ("-c", "4096", "-t", "1", "-tb", "1", "--metrics")
N_MINDS = 8


def _system(m: int, n_facts: int) -> str:
    """A long system prompt of its own for mind m (about 13 tokens a fact)."""
    return " ".join(f"Fact {m}.{i}: box {i} of shelf {m} holds {i * 7 % 13} red keys." for i in range(n_facts))


class Minds:
    """Each mind's conversation so far, as a client keeps it (the whole text each turn)."""

    def __init__(self, server: ServerProcess, n_minds: int, n_facts: int) -> None:
        self.server = server
        self.prompts = {
            m: chat_prompt(("system", _system(m, n_facts)), ("user", f"Which box, {m}?"))
            for m in range(n_minds)
        }
        self.n_prompt: dict[int, int] = {}  # tokens of the last prompt: cached next turn

    def turn(self, m: int, turn: int, **extra: Any) -> dict[str, Any]:
        body = {"prompt": self.prompts[m], "n_predict": 4, "temperature": 0, **extra}
        resp = self.server.post("/completion", body, headers={"X-Mind-Id": f"w{m}"})
        assert resp.status_code == 200, (m, turn, resp.text)
        out = resp.json()
        timings = out["timings"]
        self.n_prompt[m] = timings["cache_n"] + timings["prompt_n"]
        self.prompts[m] += (
            out["content"]
            + f"<|im_end|>\n<|im_start|>user\nAnd box {turn}?<|im_end|>\n<|im_start|>assistant\n"
        )
        return out


@pytest.fixture()
def start(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def get(*args: str) -> ServerProcess:
        server = ServerProcess(list(args), tmp_path / f"server{len(started)}.log")
        started.append(server)
        return server

    yield get
    for server in started:
        server.stop()


@pytest.mark.timeout(400)
def test_minds_that_left_a_full_unified_pool_come_back_with_only_new_tokens(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*DEFAULT_ARGS)
    props = server.client.get("/props").json()["context_geometry"]
    assert props["n_parallel"] == 4 and props["kv_unified"] and props["n_ctx"] == 4096
    minds = Minds(server, N_MINDS, n_facts=55)  # ~1,170 tokens each: three fill the pool
    for turn in range(3):
        for m in range(N_MINDS):
            n_before = minds.n_prompt.get(m, 0)
            out = minds.turn(m, turn)
            assert out["timings"]["prompt_n"] + out["timings"]["cache_n"] > 1100
            if turn > 0:
                # It returned from a RAM page into a pool other minds had filled: only the
                # turn's new tokens are prefilled.
                assert out["timings"]["cache_n"] >= n_before, (turn, m)
    metrics = server.metrics()
    assert metrics["llamacpp:mind_new_total"] == N_MINDS
    assert metrics["llamacpp:mind_hits_ram_total"] >= N_MINDS
    assert metrics["llamacpp:page_failed_total"] == 0
