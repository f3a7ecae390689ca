"""A new mind whose tenant's minds all live on disk (after a restart, or spilled under RAM
pressure) starts from the longest prefix one of them holds, read from its file, rather than
prefilling its tenant's long opening again (`minds.diskseed`). The mind it starts from is left
whole, and another key's new mind starts from nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

OPENING = "You are a coding agent in a small repository. Read before you write. " * 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    folder = tmp_path_factory.mktemp("disk-seeds")
    save = folder / "save"
    save.mkdir()
    args = ["-m", str(model), "-c", "4096", "-np", "1", "-t", "1", "-tb", "1", "--metrics",
            "--cache-ram", "0", "--api-key", "ka,kb", "--slot-save-path", str(save)]  # fmt: skip
    proc = ServerProcess(args, folder / "server.log")
    yield proc
    proc.stop()


def _turn(server: ServerProcess, key: str, mind: str, prompt: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}", "X-Mind-Id": mind}
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "return_tokens": True}
    resp = server.post("/completion", body, headers=headers)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _spill(server: ServerProcess, key: str, mind: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    resp = server.post(f"/minds/{mind}?action=spill", headers=headers)
    assert resp.status_code == 200 and resp.json()["tier"] == "disk", resp.text


def _metric(server: ServerProcess, name: str) -> float:
    text = server.client.get("/metrics", headers={"Authorization": "Bearer ka"}).text
    for line in text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_new_mind_starts_from_its_tenants_mind_on_disk(server: ServerProcess) -> None:
    first = _turn(server, "ka", "first", OPENING + "Which file holds the parser?")
    n_opening = first["timings"]["prompt_n"]
    kv_first = n_opening + len(first["tokens"]) - 1
    _spill(server, "ka", "first")  # the tenant's only mind, on disk only

    seeded = _turn(server, "ka", "second", OPENING + "List the tests.")
    assert seeded["mind"]["tier_before"] == "new"
    # Its shared opening came from the first mind's file (at the parent: 0 tokens reused).
    assert seeded["timings"]["cache_n"] >= n_opening - 40, (n_opening, seeded["timings"])
    assert seeded["timings"]["prompt_n"] < 40, seeded["timings"]
    assert _metric(server, "mind_disk_seeds_total") == 1

    other = _turn(server, "kb", "second", OPENING + "List the tests.")  # another key's
    assert other["timings"]["cache_n"] == 0, other["timings"]
    assert _metric(server, "mind_disk_seeds_total") == 1

    again = _turn(server, "ka", "first", OPENING + "Which file holds the parser?" + "x")
    assert again["mind"]["tier_before"] == "disk"  # whole: read back with all its tokens
    assert again["mind"]["n_tokens_before"] == kv_first


def test_no_seed_is_read_while_a_mind_of_the_tenant_is_in_ram(server: ServerProcess) -> None:
    """With a mind of the tenant in its slot, the engine seeds from that (no file is read)."""
    before = _metric(server, "mind_disk_seeds_total")
    _turn(server, "ka", "resident", OPENING + "Where is the lexer?")
    _turn(server, "ka", "beside", OPENING + "Where is the README?")
    assert _metric(server, "mind_disk_seeds_total") == before
