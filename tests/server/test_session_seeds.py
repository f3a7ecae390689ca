"""A new session's first turn beside a running one of its tenant: in a unified KV pool it shares
the running session's cells for their common opening (`llama_memory_seq_cp`: no copy, no
prefill), as parallel subagents of one Claude Code session open with the same system prompt and
tools. The running session is left whole, and another key's session shares nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

ARGS = ("-c", "8192", "-np", "2", "-kvu", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")
KEYS = ("--api-key", "ka,kb")
OPENING = "You are a coding agent in a small repository. Read before you write. " * 24


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    folder = tmp_path_factory.mktemp("seeds")
    proc = ServerProcess(["-m", str(model), *ARGS, *KEYS], folder / "server.log")
    yield proc
    proc.stop()


def _body(session: str, ask: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "system", "content": OPENING}, {"role": "user", "content": ask}],
        "max_tokens": 4,
        "temperature": 0,
        "prompt_cache_key": session,
        **extra,
    }


def _turn(server: ServerProcess, key: str, session: str, ask: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    resp = server.post("/v1/chat/completions", _body(session, ask), headers=headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _seeds(server: ServerProcess) -> float:
    text = server.client.get("/metrics", headers={"Authorization": "Bearer ka"}).text
    for line in text.splitlines():
        if line.startswith("llamacpp:mind_seeds_total "):
            return float(line.split()[1])
    raise AssertionError("mind_seeds_total is not in /metrics")


def _beside_a_running_session(server: ServerProcess, run: str, then: Any) -> Any:
    """Stream a long answer on session `run` (key ka) and call `then()` once it streams; the
    stream is cut when `then` returns."""
    started, done = threading.Event(), threading.Event()
    body = _body(run, "Write a long story.", max_tokens=3000, stream=True, ignore_eos=True)

    def stream() -> None:
        with server.client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": "Bearer ka"}
        ) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    started.set()
                if done.is_set():
                    break
        started.set()

    worker = threading.Thread(target=stream)
    worker.start()
    assert started.wait(120)
    try:
        return then()
    finally:
        done.set()
        worker.join(120)


def test_a_new_session_shares_a_running_sessions_opening(server: ServerProcess) -> None:
    """Defect caught: a new mind started only from minds in RAM, so a session starting beside
    a running one (parallel subagents) prefilled the whole opening again."""
    seeds = _seeds(server)
    first = _beside_a_running_session(
        server, "running", lambda: _turn(server, "ka", "beside", "Fix the failing test.")
    )
    n_opening = 0.9 * first["usage"]["prompt_tokens"]
    assert first["timings"]["cache_n"] >= n_opening, (first["timings"], first["usage"])
    assert _seeds(server) == seeds + 1
    # Both sessions are whole: each one's same request again reads its history back.
    again = _turn(server, "ka", "beside", "Fix the failing test.")
    assert again["timings"]["cache_n"] == again["usage"]["prompt_tokens"] - 1, again["timings"]
    run_again = _turn(server, "ka", "running", "Write a long story.")
    assert run_again["timings"]["cache_n"] >= n_opening, run_again["timings"]


def test_another_keys_running_session_shares_nothing(server: ServerProcess) -> None:
    def theirs_beside() -> tuple[dict[str, Any], float]:
        seeds = _seeds(server)
        return _turn(server, "kb", "mine", "Check the parser."), _seeds(server) - seeds

    other, n_seeded = _beside_a_running_session(server, "theirs", theirs_beside)
    assert other["timings"]["cache_n"] == 0, other["timings"]
    assert n_seeded == 0
