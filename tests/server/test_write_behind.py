"""Write-behind: once the minds are quiet, their newest states are on disk, so a SIGKILL loses none.

Real `kvswap serve` processes, a real save path, a real SIGKILL; SmolLM2 with one thread.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.timeout(600)

# One slot, so of two minds one is resident and the other a RAM page.
ARGS = ("-c", "1024", "-np", "1", "-t", "1", "-tb", "1", "-ub", "128", "--metrics",
        "--page-ram-bytes", "64M")  # fmt: skip


def _prompt(m: int) -> str:
    return chat_prompt(
        ("system", f"You are mind {m}. You answer in one short sentence. " * 6),
        ("user", f"Name a river for the number {m}."),
    )


def _turn(server: ServerProcess, prompt: str, m: int) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "mind": f"mind-{m}"}
    resp = server.post("/completion", body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _minds(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {v["mind"]: v for v in server.client.get("/pages").json()["minds"]}


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.stop()


def test_quiet_minds_are_written_behind_and_survive_a_sigkill(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    args = (*ARGS, "--slot-save-path", str(save))
    first = ServerProcess(args, tmp_path / "first.log")
    servers.append(first)
    outs = {m: _turn(first, _prompt(m), m) for m in (0, 1)}
    tiers = {k: v["tier"] for k, v in _minds(first).items()}
    assert tiers == {"mind-0": "ram", "mind-1": "slot"}
    # Quiet now: both minds' newest states reach the disk, and stay where they are.
    deadline = time.monotonic() + 60
    while True:
        views = _minds(first)
        if all(v["n_tokens_on_disk"] == v["n_tokens"] > 0 for v in views.values()):
            break
        assert time.monotonic() < deadline, views
        time.sleep(0.1)
    assert {k: v["tier"] for k, v in views.items()} == tiers
    assert first.metrics()["llamacpp:mind_flushes_total"] == 2
    first.stop(sig=signal.SIGKILL)

    second = ServerProcess(args, tmp_path / "second.log")
    servers.append(second)
    for m in (0, 1):
        had = outs[m]["timings"]["cache_n"] + outs[m]["timings"]["prompt_n"]
        follow = _prompt(m) + outs[m]["content"] + "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n"
        timings = _turn(second, follow + "<|im_start|>assistant\n", m)["timings"]
        assert timings["cache_n"] >= had, (m, timings)  # nothing re-prefilled
    assert second.metrics()["llamacpp:mind_hits_disk_total"] == 2


def test_a_sigterm_spills_only_the_minds_not_already_on_disk(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    """Once write-behind has put both minds on disk, a SIGTERM has nothing to write, and says
    nothing it did not do: it logged "spilled 2 mind(s) before exit" for minds /pages showed as
    on disk (the newcomer's second hour, finding 16). A restart still serves both."""
    save = tmp_path / "slots"
    save.mkdir()
    args = (*ARGS, "--slot-save-path", str(save))
    first = ServerProcess(args, tmp_path / "first.log")
    servers.append(first)
    for m in (0, 1):
        _turn(first, _prompt(m), m)
    deadline = time.monotonic() + 60
    while not all(v["n_tokens_on_disk"] == v["n_tokens"] > 0 for v in _minds(first).values()):
        assert time.monotonic() < deadline, _minds(first)
        time.sleep(0.1)
    assert first.stop() in (0, -signal.SIGTERM)
    log = (tmp_path / "first.log").read_text()
    assert "before exit" not in log, log[-2000:]
    second = ServerProcess(args, tmp_path / "second.log")
    servers.append(second)
    assert "serving 2 spilled mind(s)" in second.log()
