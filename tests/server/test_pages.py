"""Named host-RAM pages through the real server: bit-exact round trips, spill and restore in a
fresh server, the typed errors of SPEC §3, and /pages and /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.conftest import SMALL_ARGS
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

FIRST = chat_prompt(("user", "Describe a lighthouse in one sentence."))


def _run(server: ServerProcess, prompt: str, slot: int, n: int = 10) -> dict:
    body = {
        "prompt": prompt,
        "n_predict": n,
        "temperature": 0,
        "id_slot": slot,
        "n_probs": 5,
        "return_tokens": True,
    }
    resp = server.post("/completion", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _verb(server: ServerProcess, slot: int, action: str, page: str, body: dict | None = None):  # type: ignore[no-untyped-def]
    return server.post(f"/slots/{slot}?action={action}&page={page}", body)


def _follow_up(first: dict) -> str:
    return (
        FIRST
        + first["content"]
        + "<|im_end|>\n<|im_start|>user\nAnd at night?<|im_end|>\n<|im_start|>assistant\n"
    )


def _n_tokens(server: ServerProcess, text: str) -> int:
    return len(server.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"])


def _erase(server: ServerProcess, *slots: int) -> None:
    # Bit-exact needs the same batches: every compared run starts from an empty slot.
    for slot in slots:
        assert server.post(f"/slots/{slot}?action=erase").status_code == 200


def test_page_out_reuse_page_in_is_bit_exact(small_server: ServerProcess) -> None:
    _erase(small_server, 1, 2)
    # Reference: a slot that never pages, fed the same requests.
    ref_first = _run(small_server, FIRST, slot=2)
    ref_next = _run(small_server, _follow_up(ref_first), slot=2)

    first = _run(small_server, FIRST, slot=1)
    assert first["completion_probabilities"] == ref_first["completion_probabilities"]
    out = _verb(small_server, 1, "page_out", "lighthouse")
    assert out.status_code == 200, out.text
    moved = out.json()
    assert moved["id_slot"] == 1 and moved["page"] == "lighthouse"
    assert moved["n_tokens"] == first["tokens_evaluated"] + first["tokens_predicted"] - 1
    assert moved["n_bytes"] > 0 and moved["n_bytes_spec"] == 0 and moved["n_checkpoints"] == 0
    # The slot was freed and is reused for another conversation.
    other = _run(small_server, chat_prompt(("user", "Name three birds.")), slot=1)
    assert other["timings"]["cache_n"] == 0
    # Into another slot; that slot's cached prompt is discarded.
    _run(small_server, chat_prompt(("user", "Say hi.")), slot=0, n=2)
    back = _verb(small_server, 0, "page_in", "lighthouse").json()
    assert back["n_tokens"] == moved["n_tokens"] and back["n_discarded"] > 0
    follow = _follow_up(first)
    nxt = _run(small_server, follow, slot=0)
    assert nxt["timings"]["cache_n"] == moved["n_tokens"]
    assert nxt["timings"]["prompt_n"] <= _n_tokens(small_server, follow) - moved["n_tokens"] + 1
    assert nxt["tokens"] == ref_next["tokens"]
    assert nxt["completion_probabilities"] == ref_next["completion_probabilities"]  # bit-exact
    # The page left the store.
    assert _verb(small_server, 0, "page_in", "lighthouse").status_code == 404


def test_spill_then_restore_in_a_fresh_server_is_bit_exact(
    small_server: ServerProcess, save_dir: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    _erase(small_server, 1, 3)
    ref_first = _run(small_server, FIRST, slot=3)
    ref_next = _run(small_server, _follow_up(ref_first), slot=3)
    first = _run(small_server, FIRST, slot=1)
    assert _verb(small_server, 1, "page_out", "to-disk").status_code == 200
    spilled = _verb(small_server, 1, "spill", "to-disk", {"filename": "to-disk.bin", "drop": True})
    assert spilled.status_code == 200, spilled.text
    assert spilled.json()["dropped"] is True and spilled.json()["n_written"] > 0
    assert _verb(small_server, 0, "page_in", "to-disk").status_code == 404  # dropped
    fresh: ServerProcess = server_factory(
        *SMALL_ARGS, "--slot-save-path", str(save_dir), fresh=True
    )
    try:
        restored = fresh.post("/slots/2?action=restore", {"filename": "to-disk.bin"})
        assert restored.status_code == 200, restored.text
        nxt = _run(fresh, _follow_up(first), slot=2)
        assert nxt["timings"]["cache_n"] == restored.json()["n_restored"]
        assert nxt["tokens"] == ref_next["tokens"]
        assert nxt["completion_probabilities"] == ref_next["completion_probabilities"]
    finally:
        fresh.stop()


@pytest.mark.parametrize(
    ("action", "page", "status"),
    [
        ("page_in", "never-made", 404),
        ("page_drop", "never-made", 404),
        ("page_out", "a/b", 400),
        ("page_out", "..", 400),
        ("page_out", "", 400),
        ("page_out", "x" * 256, 400),
        ("page_out", "tab%09name", 400),
    ],
)
def test_page_verbs_answer_typed_errors(
    small_server: ServerProcess, action: str, page: str, status: int
) -> None:
    _run(small_server, FIRST, slot=0, n=2)
    resp = _verb(small_server, 0, action, page)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == status


def test_page_out_of_an_empty_slot_is_400(small_server: ServerProcess) -> None:
    small_server.post("/slots/3?action=erase")
    resp = _verb(small_server, 3, "page_out", "empty")
    assert resp.status_code == 400 and "empty" in resp.json()["error"]["message"]


def test_the_ceiling_refuses_with_typed_errors_and_nothing_is_lost(server_factory) -> None:  # type: ignore[no-untyped-def]
    # Room for one SmolLM2 page of ~24 tokens (23 kB per token) but not two.
    server: ServerProcess = server_factory(
        "-c", "1024", "-np", "2", "-t", "2", "--page-ram-bytes", "1M", "--metrics"
    )
    first = _run(server, FIRST, slot=0)
    assert _verb(server, 0, "page_out", "a").status_code == 200
    _run(server, FIRST, slot=0)
    full = _verb(server, 0, "page_out", "b")
    assert full.status_code == 503 and full.json()["error"]["type"] == "unavailable_error"
    # The slot kept its state: the same prompt again is a full cache hit.
    again = _run(server, FIRST, slot=0)
    assert again["timings"]["prompt_n"] == 1 and again["tokens"] == first["tokens"]
    # A page larger than the whole ceiling is a 400.
    _run(server, " ".join(f"w{i}" for i in range(100)), slot=1, n=1)
    huge = _verb(server, 1, "page_out", "huge")
    assert huge.status_code == 400, huge.text
    pages = server.client.get("/pages").json()
    assert [p["name"] for p in pages["pages"]] == ["a"] and pages["n_bytes"] <= pages[
        "ceiling_bytes"
    ]
    metrics = server.metrics()
    assert metrics["llamacpp:page_store_pages"] == 1
    assert metrics["llamacpp:page_store_bytes"] == pages["n_bytes"]
    assert metrics["llamacpp:page_out_total"] == 1 and metrics["llamacpp:page_failed_total"] == 2


def test_a_file_from_another_kv_type_is_refused(
    small_server: ServerProcess, save_dir: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    _run(small_server, FIRST, slot=0, n=2)
    assert small_server.post("/slots/0?action=save", {"filename": "f16.bin"}).status_code == 200
    q8: ServerProcess = server_factory(
        *SMALL_ARGS,
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
        "--slot-save-path",
        str(save_dir),
        fresh=True,
    )
    try:
        resp = q8.post("/slots/0?action=restore", {"filename": "f16.bin"})
        assert resp.status_code == 400, resp.text
        assert "model" in resp.json()["error"]["message"] or "KV" in resp.json()["error"]["message"]
    finally:
        q8.stop()


def test_props_advertise_pages(small_server: ServerProcess) -> None:
    assert small_server.client.get("/props").json()["slot_page_version"] == 1


def test_the_anonymous_cache_gives_way_to_a_clients_pages(server_factory) -> None:  # type: ignore[no-untyped-def]
    # The anonymous prompt cache may hold half the store; a client's pages may still fill the
    # rest and what the cache holds: a cache is never why a page_out is refused.
    server: ServerProcess = server_factory(
        "-c", "1024", "-np", "3", "-t", "2", "--page-ram-bytes", "4M", "--metrics", fresh=True
    )
    for i in range(4):  # anonymous conversations on slot 2, each displacing the last
        topic = f"number {i}: " + " ".join(f"w{i}{j}" for j in range(12))
        _run(server, chat_prompt(("user", f"Describe a lighthouse, {topic}.")), slot=2)
    cached = server.metrics()["llamacpp:anon_cache_bytes"]
    names = ["a", "b", "c", "d", "e"]
    for name in names:
        first = _run(server, FIRST + name, slot=0)
        out = _verb(server, 0, "page_out", name)
        assert out.status_code == 200, (out.text, cached)
    pages = server.client.get("/pages").json()
    client_bytes = sum(p["n_bytes"] for p in pages["pages"] if p["name"] in names)
    assert cached + client_bytes > pages["ceiling_bytes"]  # both could not have fit
    assert server.metrics()["llamacpp:anon_cache_bytes"] < cached
    # Each page is whole: it continues as the state it was paged out from.
    assert _verb(server, 1, "page_in", "e").json()["n_tokens"] == out.json()["n_tokens"]
    assert (
        _run(server, FIRST + "e" + first["content"], slot=1)["timings"]["cache_n"]
        >= out.json()["n_tokens"] - 1
    )
