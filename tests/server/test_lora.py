"""LoRA adapters through the real server: per-request and global sets, batching by set, and the
LoRA set recorded in pages and slot files (SPEC §3, §4; issue 7).

A tiny llama and two tiny random adapters for it (`kvswap.tiny`); temperature 0 throughout.
Every compared run starts from an empty slot, so runs see the same batches."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvswap.tiny import tiny_model_path
from kvswap.tiny.lora import tiny_lora_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

# Two slots of 1024 tokens, one thread, a page store.
ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-ub", "64", "--page-ram-bytes", "64M")
# Byte tokens of the tiny vocabulary (ids 3..258), chosen in advance.
PROMPT = [3 + (i * 37) % 256 for i in range(40)]
MORE = [3 + (i * 11 + 5) % 256 for i in range(12)]
N = 16

Factory = Callable[..., ServerProcess]


def _base() -> Path:
    return tiny_model_path("llama", seed=7, clean_text=True)


def _adapters() -> tuple[Path, Path]:
    return tiny_lora_path(_base(), seed=1), tiny_lora_path(_base(), seed=2)


def _server(factory: Factory, *lora_args: str, fresh: bool = False) -> ServerProcess:
    return factory("-m", str(_base()), *ARGS, *lora_args, save_path=True, fresh=fresh)


@pytest.fixture(scope="module")
def server(server_factory: Factory) -> ServerProcess:
    """Both adapters loaded, every global scale 0: a request without `lora` runs the base."""
    a, b = _adapters()
    return _server(server_factory, "--lora", f"{a},{b}", "--lora-init-without-apply")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _save_dir(server: ServerProcess) -> Path:
    return Path(server.args[server.args.index("--slot-save-path") + 1])


def _body(prompt: list[int], slot: int, lora: list[dict[str, Any]] | None, n: int) -> dict:
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n,
        "temperature": 0,
        "id_slot": slot,
        "return_tokens": True,
    }
    if lora is not None:
        body["lora"] = lora
    return body


def _run(
    server: ServerProcess, prompt: list[int], slot: int, lora: list[dict] | None, n: int = N
) -> dict:
    resp = server.post("/completion", _body(prompt, slot, lora, n))
    assert resp.status_code == 200, resp.text
    return resp.json()


def _solo(server: ServerProcess, prompt: list[int], lora: list[dict] | None, slot: int = 0) -> dict:
    _erase(server, slot)
    return _run(server, prompt, slot, lora)


def _erase(server: ServerProcess, *slots: int) -> None:
    for slot in slots:
        assert server.post(f"/slots/{slot}?action=erase").status_code == 200


def _verb(server: ServerProcess, slot: int, action: str, page: str, body: dict | None = None):  # type: ignore[no-untyped-def]
    return server.post(f"/slots/{slot}?action={action}&page={page}", body)


L0 = [{"id": 0, "scale": 1.0}]
L1_HALF = [{"id": 1, "scale": 0.5}]


def test_lora_adapters_route_lists_and_sets_global_scales(server: ServerProcess) -> None:
    a, b = _adapters()
    listed = server.client.get("/lora-adapters").json()
    assert listed == [
        {"id": 0, "path": str(a), "scale": 0.0, "task_name": "", "prompt_prefix": ""},
        {"id": 1, "path": str(b), "scale": 0.0, "task_name": "", "prompt_prefix": ""},
    ]
    try:
        resp = server.post("/lora-adapters", [{"id": 1, "scale": 0.25}])
        assert resp.status_code == 200 and resp.json() == {"success": True}
        assert [x["scale"] for x in server.client.get("/lora-adapters").json()] == [0.0, 0.25]
        for bad in ([{"id": 2, "scale": 1.0}], {"id": 0, "scale": 1.0}, [{"id": 0}]):
            resp = server.post("/lora-adapters", bad)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["type"] == "invalid_request_error"
        assert [x["scale"] for x in server.client.get("/lora-adapters").json()] == [0.0, 0.25]
    finally:
        assert server.post("/lora-adapters", []).status_code == 200
    resp = server.post("/completion", _body(PROMPT, 0, [{"id": 5, "scale": 1.0}], 4))
    assert resp.status_code == 400 and "LoRA adapter id 5" in resp.json()["error"]["message"]


def test_an_adapter_changes_greedy_output_and_global_scales_apply(server: ServerProcess) -> None:
    base = _solo(server, PROMPT, None)
    with_lora = _solo(server, PROMPT, L0)
    assert base["tokens"] != with_lora["tokens"]
    assert with_lora["generation_settings"]["lora"] == [{"id": 0, "scale": 1.0}]
    assert base["generation_settings"]["lora"] == []
    # An explicit scale of 0 is the base model.
    assert _solo(server, PROMPT, [{"id": 0, "scale": 0.0}])["tokens"] == base["tokens"]
    try:
        assert server.post("/lora-adapters", L0).status_code == 200
        # No `lora` field: the global scales, now adapter 0 at 1.
        assert _solo(server, PROMPT, None)["tokens"] == with_lora["tokens"]
    finally:
        assert server.post("/lora-adapters", []).status_code == 200
    # The same prompt again, on the same slot: repeated runs match.
    assert _solo(server, PROMPT, L0)["tokens"] == with_lora["tokens"]


def test_a_cached_prefix_is_reused_only_under_the_same_set(server: ServerProcess) -> None:
    _erase(server, 0)
    first = _run(server, PROMPT, 0, L0)
    follow = PROMPT + first["tokens"] + MORE
    other = _run(server, follow, 0, None)  # another set: the slot's KV must not serve it
    assert other["timings"]["cache_n"] == 0
    assert other["tokens"] == _solo(server, follow, None, slot=1)["tokens"]
    _erase(server, 0)
    first = _run(server, PROMPT, 0, L0)
    same = _run(server, follow, 0, L0)
    # The slot holds the prompt and every generated token but the last.
    assert same["timings"]["cache_n"] == len(PROMPT) + len(first["tokens"]) - 1


@pytest.mark.parametrize(
    ("lora_a", "lora_b"), [(L0, None), (L0, L1_HALF)], ids=["adapter-vs-none", "two-adapters"]
)
def test_two_slots_under_different_sets_stream_together_and_match_solo(
    server: ServerProcess, lora_a: list[dict], lora_b: list[dict] | None
) -> None:
    n = 160  # long enough that the second request arrives while the first still runs
    _erase(server, 0, 1)
    solo_a = _run(server, PROMPT, 0, lora_a, n)["tokens"]
    solo_b = _run(server, PROMPT, 1, lora_b, n)["tokens"]
    assert solo_a != solo_b
    _erase(server, 0, 1)
    streamed: dict[int, list[int]] = {0: [], 1: []}
    interleaved: list[int] = []

    def stream(slot: int, lora: list[dict] | None) -> None:
        body = {**_body(PROMPT, slot, lora, n), "stream": True}
        for chunk in server.stream("/completion", body):
            streamed[slot] += chunk.get("tokens", [])
            if chunk.get("tokens"):
                interleaved.append(slot)

    threads = [
        threading.Thread(target=stream, args=(0, lora_a)),
        threading.Thread(target=stream, args=(1, lora_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert streamed[0] == solo_a
    assert streamed[1] == solo_b
    # Both were in flight at once: the streams interleave rather than run one after the other.
    first_b = interleaved.index(1)
    assert 0 in interleaved[first_b:], interleaved


def test_a_page_restores_with_its_adapter_and_continues_as_a_never_paged_slot(
    server: ServerProcess,
) -> None:
    # Reference: slot 1 never pages.
    _erase(server, 0, 1)
    ref_first = _run(server, PROMPT, 1, L1_HALF)
    ref_next = _run(server, PROMPT + ref_first["tokens"] + MORE, 1, L1_HALF)

    first = _run(server, PROMPT, 0, L1_HALF)
    assert first["tokens"] == ref_first["tokens"]
    assert _verb(server, 0, "page_out", "mind").status_code == 200
    listed = {p["name"]: p for p in server.client.get("/pages").json()["pages"]}
    _, b = _adapters()
    assert listed["mind"]["lora"] == [{"sha256": _sha256(b), "path": str(b), "scale": 0.5}]
    _erase(server, 1)
    resp = _verb(server, 1, "page_in", "mind")
    assert resp.status_code == 200, resp.text
    nxt = _run(server, PROMPT + first["tokens"] + MORE, 1, L1_HALF)
    assert nxt["tokens"] == ref_next["tokens"]
    assert nxt["timings"]["cache_n"] == ref_next["timings"]["cache_n"] > len(PROMPT)


def _spill_under_adapter_b(server: ServerProcess, filename: str) -> tuple[dict, dict]:
    """A mind made under adapter `b` (id 1, scale 0.5), spilled to `filename`; and its reference
    next turn in the same server."""
    _erase(server, 0, 1)
    ref_first = _run(server, PROMPT, 1, L1_HALF)
    ref_next = _run(server, PROMPT + ref_first["tokens"] + MORE, 1, L1_HALF)
    first = _run(server, PROMPT, 0, L1_HALF)
    assert _verb(server, 0, "page_out", "spilled").status_code == 200
    resp = _verb(server, 0, "spill", "spilled", {"filename": filename, "drop": True})
    assert resp.status_code == 200, resp.text
    return first, ref_next


def test_the_lora_record_round_trips_through_spill_into_a_server_with_another_load_order(
    server: ServerProcess, server_factory: Factory
) -> None:
    first, ref_next = _spill_under_adapter_b(server, "mind-b.bin")
    saved = _save_dir(server)
    assert (saved / "mind-b.bin.lora").is_file()
    a, b = _adapters()
    # A fresh server loading the adapters the other way round: b is now id 0.
    other = server_factory(
        "-m", str(_base()), *ARGS, "--lora", f"{b},{a}", "--lora-init-without-apply",
        "--slot-save-path", str(saved), fresh=True,
    )  # fmt: skip
    try:
        resp = other.post("/slots/1?action=restore", {"filename": "mind-b.bin"})
        assert resp.status_code == 200, resp.text
        nxt = _run(other, PROMPT + first["tokens"] + MORE, 1, [{"id": 0, "scale": 0.5}])
        assert nxt["tokens"] == ref_next["tokens"]
        assert nxt["timings"]["cache_n"] == ref_next["timings"]["cache_n"]
        # The same KV under the adapter's old id (now `a`) is another set: not reused.
        assert other.post("/slots/1?action=restore", {"filename": "mind-b.bin"}).status_code == 200
        under_a = _run(other, PROMPT + first["tokens"] + MORE, 1, [{"id": 1, "scale": 0.5}])
        assert under_a["timings"]["cache_n"] == 0
    finally:
        other.stop()


def test_a_state_whose_adapter_is_not_loaded_is_refused_and_kept(
    server: ServerProcess, server_factory: Factory
) -> None:
    _spill_under_adapter_b(server, "mind-gone.bin")
    saved = _save_dir(server)
    a, _ = _adapters()
    other = server_factory(
        "-m", str(_base()), *ARGS, "--lora", str(a), "--slot-save-path", str(saved), fresh=True
    )
    try:
        _run(other, PROMPT, 1, None, n=2)
        resp = other.post("/slots/1?action=restore", {"filename": "mind-gone.bin"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["type"] == "invalid_request_error"
        assert "not loaded" in resp.json()["error"]["message"]
        assert (saved / "mind-gone.bin").is_file() and (saved / "mind-gone.bin.lora").is_file()
        # The slot kept its cache: the refusal happened before anything was touched.
        again = _run(other, PROMPT, 1, None, n=2)
        assert again["timings"]["cache_n"] == len(PROMPT) - 1
    finally:
        other.stop()


def test_slots_and_props_show_lora_as_llama_server(server: ServerProcess) -> None:
    _erase(server, 0)
    _run(server, PROMPT, 0, [{"id": 1, "scale": 0.5}, {"id": 0, "scale": 0.0}], n=2)
    expected = [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]
    # /slots reads the engine's snapshot, published just after the reply was sent.
    deadline = time.monotonic() + 10
    while (lora := server.client.get("/slots").json()[0]["params"]["lora"]) != expected:
        assert time.monotonic() < deadline, lora
        time.sleep(0.02)
    props = server.client.get("/props").json()
    assert props["default_generation_settings"]["params"]["lora"] == []


def test_a_slot_file_whose_lora_record_is_corrupt_is_refused(server: ServerProcess) -> None:
    _spill_under_adapter_b(server, "mind-torn.bin")
    sidecar = _save_dir(server) / "mind-torn.bin.lora"
    data = bytearray(sidecar.read_bytes())
    data[-12] ^= 0xFF
    sidecar.write_bytes(bytes(data))
    resp = server.post("/slots/1?action=restore", {"filename": "mind-torn.bin"})
    assert resp.status_code == 400, resp.text
    assert ".lora" in resp.json()["error"]["message"]


def test_a_reconfigure_keeps_each_slot_under_its_set(server_factory: Factory) -> None:
    a, b = _adapters()
    server = _server(server_factory, "--lora", f"{a},{b}", "--lora-init-without-apply", fresh=True)
    try:
        first = _run(server, PROMPT, 1, L1_HALF)
        ref_next = _solo(server, PROMPT + first["tokens"] + MORE, L1_HALF, slot=0)
        resp = server.post("/reconfigure", {"n_ctx": 4096})
        assert resp.status_code == 200, resp.text
        nxt = _run(server, PROMPT + first["tokens"] + MORE, 1, L1_HALF)
        assert nxt["timings"]["cache_n"] == len(PROMPT) + len(first["tokens"]) - 1
        assert nxt["tokens"] == ref_next["tokens"]
    finally:
        server.stop()


def test_a_kv_type_change_keeps_a_token_only_page_under_its_set(server_factory: Factory) -> None:
    a, b = _adapters()
    server = _server(
        server_factory, "--lora", f"{a},{b}", "--lora-init-without-apply", "-fa", "on", fresh=True
    )
    try:
        first = _run(server, PROMPT, 1, L1_HALF)
        assert server.post("/slots/1?action=page_out&page=p").status_code == 200
        body = {"cache_type_k": "f32", "cache_type_v": "f32", "force": True}
        resp = server.post("/reconfigure", body)
        assert resp.status_code == 200, resp.text
        [page] = server.client.get("/pages").json()["pages"]
        assert page["n_bytes"] == 4 * page["n_tokens"]  # tokens only, under its set:
        assert [a["scale"] for a in page["lora"]] == [0.5]
        # page_in re-prefills the tokens under the page's set: the next turn under it reuses them.
        moved = server.post("/slots/0?action=page_in&page=p")
        assert moved.status_code == 200, moved.text
        follow = PROMPT + first["tokens"] + MORE
        nxt = _run(server, follow, 0, L1_HALF)
        assert nxt["timings"]["cache_n"] == len(PROMPT) + len(first["tokens"]) - 1
    finally:
        server.stop()


def test_an_adapter_for_another_model_stops_the_server_at_start(
    server_factory: Factory, tmp_path: Path
) -> None:
    wider = tiny_model_path("llama", seed=7, n_embd=128)
    with pytest.raises(RuntimeError, match="failed to load lora adapter"):
        _server(server_factory, "--lora", str(tiny_lora_path(wider)), fresh=True)


def test_chat_completions_take_a_lora_field(server: ServerProcess) -> None:
    def chat(lora: list[dict] | None) -> str:
        _erase(server, 0)
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 12,
            "temperature": 0,
            "id_slot": 0,
        }
        if lora is not None:
            body["lora"] = lora
        resp = server.post("/v1/chat/completions", body)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["choices"][0]["message"]["content"])

    assert chat(L0) != chat(None)
    assert chat(L0) == chat(L0)


def test_saving_without_adapters_over_a_file_made_under_one_retires_its_lora_record(
    server: ServerProcess,
) -> None:
    _spill_under_adapter_b(server, "mind-resaved.bin")
    saved = _save_dir(server)
    assert (saved / "mind-resaved.bin.lora").is_file()
    _erase(server, 0)
    base = _run(server, PROMPT, 0, None)
    resp = server.post("/slots/0?action=save", {"filename": "mind-resaved.bin"})
    assert resp.status_code == 200, resp.text
    assert not (saved / "mind-resaved.bin.lora").exists()
    assert (
        server.post("/slots/1?action=restore", {"filename": "mind-resaved.bin"}).status_code == 200
    )
    # Restored without adapters: a base-model follow-up reuses it, one under an adapter does not.
    follow = PROMPT + base["tokens"] + MORE
    assert _run(server, follow, 1, None, n=2)["timings"]["cache_n"] == len(follow) - len(MORE) - 1
    assert (
        server.post("/slots/1?action=restore", {"filename": "mind-resaved.bin"}).status_code == 200
    )
    assert _run(server, follow, 1, L1_HALF, n=2)["timings"]["cache_n"] == 0
