"""POST /reconfigure: a relaunch is a pause, not a reload."""

from __future__ import annotations

import json
import threading
import time

import psutil
import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

ARGS = ("-c", "2048", "-np", "2", "-t", "2", "-tb", "2", "-ub", "128", "--metrics")
STORY = chat_prompt(("user", "Count from one to thirty in words, separated by commas."))
MIND = chat_prompt(("user", "Remember the number seven."))


def _complete(
    server: ServerProcess, prompt: str | list[int], slot: int, n: int = 8, **kw: object
) -> dict:
    body = {
        "prompt": prompt,
        "n_predict": n,
        "temperature": 0,
        "id_slot": slot,
        "return_tokens": True,
        **kw,
    }
    resp = server.post("/completion", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _reconfigure(server: ServerProcess, **body: object) -> tuple[int, dict]:
    resp = server.post("/reconfigure", body)
    return resp.status_code, resp.json()


def _stream_tokens(server: ServerProcess, slot: int, during) -> list[int]:  # type: ignore[no-untyped-def]
    """Stream STORY on `slot`; call `during()` after the 5th token; return every token."""
    body = {
        "prompt": STORY,
        "n_predict": 60,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "id_slot": slot,
        "cache_prompt": False,
    }
    tokens: list[int] = []
    with server.client.stream("POST", "/completion", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                obj = json.loads(line[6:])
                tokens += obj["tokens"] if not obj["stop"] else []
                if len(tokens) == 5 and during is not None:
                    during()
    return tokens


def _geometry(server: ServerProcess) -> dict:
    return server.client.get("/props").json()["context_geometry"]


def test_a_stream_and_a_resident_mind_go_through_a_reconfigure(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS, fresh=True)
    try:
        reference = _stream_tokens(server, 0, None)
        mind = _complete(server, MIND, slot=1)
        receipts: list[tuple[int, dict]] = []
        streamed = _stream_tokens(
            server, 0, lambda: receipts.append(_reconfigure(server, n_ctx=4096, n_parallel=3))
        )
        status, receipt = receipts[0]
        assert status == 200, receipt
        assert streamed == reference  # token-identical to the undisturbed run
        fates = {f["old_slot"]: f for f in receipt["slots"]}
        assert fates[0]["kind"] == "request" and fates[0]["fate"] == "kept"
        assert fates[1]["kind"] == "cache" and fates[1]["new_slot"] == 1  # an idle cached prompt
        assert receipt["new"]["n_parallel"] == 3 and receipt["new"]["n_ctx"] == 4096
        # Both geometries name their slot window (the old one's was null).
        assert receipt["old"]["n_ctx_slot"] == 1024 and receipt["old"]["n_parallel"] == 2
        assert set(receipt["timings"]) == {
            "drain_ms",
            "page_out_ms",
            "free_ms",
            "init_ms",
            "page_in_ms",
            "total_ms",
        }
        geo = _geometry(server)
        assert geo["n_parallel"] == 3 and geo["generation"] == 1
        assert receipt["new"]["n_ctx_slot"] == geo["n_ctx_slot"]
        assert server.client.get("/props").json()["total_slots"] == 3
        # The resident mind prefills only its new tokens.
        follow = (
            MIND
            + mind["content"]
            + "<|im_end|>\n<|im_start|>user\nWhich number?<|im_end|>\n<|im_start|>assistant\n"
        )
        nxt = _complete(server, follow, slot=1)
        assert nxt["timings"]["cache_n"] == mind["tokens_evaluated"] + mind["tokens_predicted"] - 1
        assert server.metrics()["llamacpp:reconfigure_total"] == 1
    finally:
        server.stop()


def test_shrinking_past_an_idle_cached_prompt_keeps_it_in_the_anonymous_cache(
    server_factory,
) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory("-c", "3072", "-np", "3", "-t", "2", fresh=True)

    def prompt(i: int) -> str:  # longer than a block of the cache's index (64 tokens)
        return chat_prompt(("user", f"Mind number {i}. " + "Tell me about the sea. " * 12))

    try:
        minds = [_complete(server, prompt(i), slot=i) for i in range(3)]
        status, receipt = _reconfigure(server, n_parallel=2, n_ctx=2048)
        assert status == 200, receipt
        fate = {f["old_slot"]: f for f in receipt["slots"]}[2]
        assert fate["new_slot"] is None and fate["fate"] == "cached" and fate["reason"]
        assert fate["page"] is None  # no page a request could name, none that lives forever
        assert server.client.get("/pages").json()["pages"] == []
        assert server.post("/slots/0?action=erase").status_code == 200
        # The next request with that prompt takes it from the cache, whole.
        again = _complete(server, prompt(2), slot=0)
        assert (
            again["timings"]["cache_n"]
            == len(again["tokens"]) * 0 + minds[2]["tokens_evaluated"] - 1
        )
    finally:
        server.stop()


def test_a_request_on_a_removed_slot_moves_without_interruption(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(
        "-c", "3072", "-np", "3", "-t", "2", "-ub", "128", fresh=True
    )
    try:
        reference = _stream_tokens(server, 2, None)
        server.post("/slots/0?action=erase")
        receipts: list[tuple[int, dict]] = []
        streamed = _stream_tokens(
            server, 2, lambda: receipts.append(_reconfigure(server, n_parallel=2))
        )
        status, receipt = receipts[0]
        assert status == 200, receipt
        fate = {f["old_slot"]: f for f in receipt["slots"]}[2]
        assert fate["kind"] == "request" and fate["fate"] == "moved" and fate["new_slot"] in (0, 1)
        assert streamed == reference
    finally:
        server.stop()


def test_shrinking_below_an_in_flight_request_is_refused_and_nothing_changes(
    server_factory,
) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS, fresh=True)
    try:
        long_prompt = " ".join(f"w{i}" for i in range(200))
        outcome: dict[str, object] = {}

        def run() -> None:
            outcome["r"] = _complete(server, long_prompt, slot=0, n=60, ignore_eos=True)

        t = threading.Thread(target=run)
        t.start()
        deadline = time.monotonic() + 60  # until slot 0 runs it (the engine's own view)
        while not server.client.get("/slots").json()[0]["is_processing"]:
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.02)
        status, body = _reconfigure(server, n_ctx=256)
        assert status == 400 and "nothing changed" in body["error"]["message"], body
        t.join(120)
        assert outcome["r"]["tokens_predicted"] == 60  # type: ignore[index]
        assert _geometry(server)["n_ctx"] == 2048 and _geometry(server)["generation"] == 0
    finally:
        server.stop()


@pytest.mark.parametrize(
    "change",
    [{"n_ctx": 4096}, {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "force": True}],
    ids=["n_ctx", "kv_types"],
)
def test_a_failed_rebuild_rolls_back_with_every_state(server_factory, change) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(
        *ARGS, "-fa", "on", fresh=True, env={"KVSWAP_FAULT_RECONFIGURE": "1"}
    )
    try:
        mind = _complete(server, MIND, slot=1)
        before = _geometry(server)
        status, body = _reconfigure(server, **change)

        assert status == 400 and "rolled back" in body["error"]["message"]
        assert body["error"]["receipt"]["rolled_back"] is True
        after = _geometry(server)
        assert {k: v for k, v in after.items() if k != "generation"} == {
            k: v for k, v in before.items() if k != "generation"
        }
        again = _complete(server, MIND, slot=1)
        # The whole state came back (also when the KV types were to change): only the last
        # prompt token is evaluated again.
        assert again["timings"]["cache_n"] == mind["tokens_evaluated"] - 1

        assert again["tokens"] == mind["tokens"]
        assert server.metrics()["llamacpp:reconfigure_failed_total"] == 1
    finally:
        server.stop()


def test_a_kv_type_change_needs_force_and_leaves_token_only_pages(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS, "-fa", "on", fresh=True)
    try:
        _complete(server, MIND, slot=1)
        assert server.post("/slots/1?action=page_out&page=p").status_code == 200
        _complete(server, chat_prompt(("user", "Something else.")), slot=1)
        status, body = _reconfigure(server, cache_type_k="q8_0", cache_type_v="q8_0")
        assert status == 400 and "force" in body["error"]["message"]
        status, receipt = _reconfigure(server, cache_type_k="q8_0", cache_type_v="q8_0", force=True)
        assert status == 200, receipt
        # An idle cached prompt of the old types is dropped (a re-prefill costs what a cache
        # miss costs), and said so; a client's page of the old types keeps its tokens.
        fate = receipt["slots"][0]
        assert fate["fate"] == "dropped" and fate["reason"] and fate["page"] is None
        [page] = server.client.get("/pages").json()["pages"]
        assert page["name"] == "p" and page["n_bytes"] == 4 * page["n_tokens"]
        assert _geometry(server)["cache_type_k"] == "q8_0"
        # page_in re-prefills the tokens under the new KV type; the next turn reuses them.
        moved = server.post("/slots/0?action=page_in&page=p")
        assert moved.status_code == 200, moved.text
        again = _complete(server, MIND, slot=0)
        assert again["timings"]["prompt_n"] == 1
        assert server.client.get("/pages").json()["pages"] == []

    finally:
        server.stop()


def test_an_unknown_field_is_refused_naming_it_and_nothing_changes(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS)
    before = _geometry(server)
    status, body = _reconfigure(server, n_ctx=4096, n_foo=3)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "'n_foo'" in body["error"]["message"]
    assert _geometry(server) == before  # not even a drain: the generation is unchanged


@pytest.mark.slow
def test_100_grow_shrink_cycles_keep_resident_memory_flat(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS, fresh=True)
    try:
        _complete(server, MIND, slot=0)
        _complete(server, chat_prompt(("user", "Another mind.")), slot=1)
        proc = psutil.Process(server.proc.pid)
        rss: dict[int, int] = {}
        for cycle in range(1, 101):
            for n_ctx in (4096, 2048):
                status, body = _reconfigure(server, n_ctx=n_ctx)
                assert status == 200, body
            if cycle in (10, 100):
                rss[cycle] = proc.memory_info().rss
        growth = (rss[100] - rss[10]) / rss[10]
        print(
            f"\nRSS after cycle 10: {rss[10] / 1e6:.1f} MB, after cycle 100: {rss[100] / 1e6:.1f} MB ({growth * 100:+.2f}%)"
        )
        assert abs(growth) <= 0.02
        again = _complete(server, MIND, slot=0)
        assert again["timings"]["prompt_n"] == 1
    finally:
        server.stop()
