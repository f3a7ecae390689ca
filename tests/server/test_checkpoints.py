"""Context checkpoints on recurrent, hybrid and sliding-window models, through the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

ARCHS = ["lfm2", "mamba2", "gemma2", "qwen35"]
MIN_STEP = 64
# Two slots of 2048 tokens, 32-token steps.
BASE = ("-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "-b", "32", "-ub", "32")  # fmt: skip
BASE += ("--checkpoint-min-step", str(MIN_STEP))

# Byte tokens of the tiny vocabulary (ids 3..258), chosen in advance.
# Long enough that a 16-token sliding window has long slid past the divergence.
PROMPT_A = [3 + (i * 37) % 256 for i in range(1200)]
DIVERGE_AT = 150
PROMPT_B = PROMPT_A[:DIVERGE_AT] + [3 + (i * 11 + 5) % 256 for i in range(60)]
# Checkpoints of A: every 64 tokens, and 36 and 4 tokens before its end.
EXPECTED_CACHE_N = 128


def _server(server_factory, arch: str, *extra: str, save: bool = False) -> ServerProcess:  # type: ignore[no-untyped-def]
    model = tiny_model_path(arch, seed=11)
    return server_factory("-m", str(model), *BASE, *extra, save_path=save)


def _run(server: ServerProcess, prompt: list[int], slot: int) -> dict:
    resp = server.post(
        "/completion",
        {
            "prompt": prompt,
            "n_predict": 12,
            "temperature": 0,
            "id_slot": slot,
            "return_tokens": True,
        },
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def _cold(server: ServerProcess, prompt: list[int]) -> dict:
    assert server.post("/slots/1?action=erase").status_code == 200
    return _run(server, prompt, slot=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_divergent_prompt_restores_the_newest_checkpoint_before_the_divergence(
    server_factory, arch: str
) -> None:  # type: ignore[no-untyped-def]
    server = _server(server_factory, arch)
    assert server.post("/slots/0?action=erase").status_code == 200
    _run(server, PROMPT_A, slot=0)
    b = _run(server, PROMPT_B, slot=0)
    assert b["timings"]["cache_n"] == EXPECTED_CACHE_N
    assert b["timings"]["prompt_n"] == len(PROMPT_B) - EXPECTED_CACHE_N
    assert b["tokens"] == _cold(server, PROMPT_B)["tokens"]


@pytest.mark.parametrize("arch", ARCHS)
def test_without_checkpoints_a_divergent_prompt_prefills_from_zero(
    server_factory, arch: str
) -> None:  # type: ignore[no-untyped-def]
    server = _server(server_factory, arch, "--ctx-checkpoints", "0")
    _run(server, PROMPT_A, slot=0)
    b = _run(server, PROMPT_B, slot=0)
    assert b["timings"]["cache_n"] == 0
    assert b["tokens"] == _cold(server, PROMPT_B)["tokens"]


@pytest.mark.parametrize("arch", ["lfm2", "gemma2"])
def test_checkpoints_travel_with_a_page(server_factory, arch: str) -> None:  # type: ignore[no-untyped-def]
    server = _server(server_factory, arch, "--metrics")
    assert server.post("/slots/0?action=erase").status_code == 200
    _run(server, PROMPT_A, slot=0)
    held = server.metrics()["llamacpp:ctx_checkpoint_bytes"]
    assert held > 0
    out = server.post("/slots/0?action=page_out&page=mind").json()
    assert out["n_checkpoints"] >= 4
    assert server.metrics()["llamacpp:ctx_checkpoint_bytes"] < held  # the bytes moved to the page
    assert (
        server.post("/slots/0?action=page_in&page=mind").json()["n_checkpoints"]
        == out["n_checkpoints"]
    )
    b = _run(server, PROMPT_B, slot=0)
    assert b["timings"]["cache_n"] == EXPECTED_CACHE_N
    assert b["tokens"] == _cold(server, PROMPT_B)["tokens"]


@pytest.mark.parametrize("arch", ["lfm2", "mamba2"])
def test_checkpoints_survive_save_and_restore_in_a_fresh_server_and_a_lost_ckpt_restores_cold(
    server_factory, arch: str
) -> None:  # type: ignore[no-untyped-def]
    server = _server(server_factory, arch, save=True)
    save_dir = Path(server.args[server.args.index("--slot-save-path") + 1])
    assert server.post("/slots/0?action=erase").status_code == 200
    _run(server, PROMPT_A, slot=0)
    assert server.post("/slots/0?action=save", {"filename": "mind.bin"}).status_code == 200
    assert (save_dir / "mind.bin.ckpt").exists()
    expected = _cold(server, PROMPT_B)["tokens"]
    model = tiny_model_path(arch, seed=11)
    fresh = server_factory("-m", str(model), *BASE, "--slot-save-path", str(save_dir), fresh=True)
    try:
        assert fresh.post("/slots/0?action=restore", {"filename": "mind.bin"}).status_code == 200
        b = _run(fresh, PROMPT_B, slot=0)
        assert b["timings"]["cache_n"] == EXPECTED_CACHE_N and b["tokens"] == expected
        (save_dir / "mind.bin.ckpt").unlink()
        restored = fresh.post("/slots/0?action=restore", {"filename": "mind.bin"})
        assert restored.status_code == 200, restored.text
        assert "without context checkpoints" in fresh.log()
        cold = _run(fresh, PROMPT_B, slot=0)
        assert cold["timings"]["cache_n"] == 0 and cold["tokens"] == expected
    finally:
        fresh.stop()


def test_the_byte_budget_holds_and_counts(server_factory) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model_path("mamba2", seed=11)
    # A mamba2 checkpoint is a fixed-size recurrent state: allow about three.
    server = server_factory("-m", str(model), *BASE, "--metrics", "--ctx-checkpoints-bytes", "200k")
    for slot in (0, 1):
        _run(server, PROMPT_A, slot=slot)
    m = server.metrics()
    assert 0 < m["llamacpp:ctx_checkpoint_bytes"] <= 200 * 1024
    assert (
        m["llamacpp:ctx_checkpoints_evicted_budget_total"]
        + m["llamacpp:ctx_checkpoints_skipped_budget_total"]
        > 0
    )
