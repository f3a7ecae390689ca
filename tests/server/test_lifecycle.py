"""Sleep and cancellation through a real server: waking keeps the live geometry, KV types and
LoRA scales; a request without a valid key never wakes a sleeping server, nor do the read-only
routes; a streamed request whose client leaves while it queues, waits for its mind or prefills
is cancelled; a cancelled re-prefill of a tokens-only page keeps the page.

Each test failed on the tree before this branch (b3e44a1^): the wake rebuilt the start-up
geometry (every mind spilled after a KV-type change was refused), the guard woke the server
before checking the key, /props always woke it and never said `is_sleeping`, a stream awaited
its first event without watching its client, and a cancelled re-prefill deleted its page.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvswap.tiny import tiny_model_path
from kvswap.tiny.lora import tiny_lora_path
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

MINDS_ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")


def _wait_for(cond: Callable[[], bool], timeout_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not reached: {what}"
        time.sleep(0.05)


def _sleeping(server: ServerProcess, headers: dict[str, str] | None = None) -> bool:
    resp = server.client.get("/props", headers=headers or {})
    assert resp.status_code == 200, resp.text
    return bool(resp.json()["is_sleeping"])


def _n_loads(server: ServerProcess) -> int:
    return server.log_path.read_text().count("model loaded in")


def _turn(server: ServerProcess, prompt: str | list[int], **extra: Any) -> dict:
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0, **extra}
    resp = server.post("/completion", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _opening(m: int) -> str:
    return chat_prompt(
        ("system", f"You are assistant number {m}. You answer briefly and kindly. " * 4),
        ("user", f"Name a colour and a city for the number {m}."),
    )


def _next(prompt: str, out: dict, turn: int) -> str:
    return (
        prompt
        + out["content"]
        + f"<|im_end|>\n<|im_start|>user\nAnd then, step {turn}?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_after_a_kv_type_change_sleep_and_wake_every_mind_answers_with_only_its_new_tokens(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    server = start(
        *MINDS_ARGS, "-fa", "on", "--sleep-idle-seconds", "1", "--slot-save-path", str(save)
    )
    prompts = {m: _opening(m) for m in range(3)}  # three minds on two slots: one is a RAM page
    for m in prompts:
        prompts[m] = _next(prompts[m], _turn(server, prompts[m], mind=f"m{m}"), 0)
    changed = {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "force": True}
    assert server.post("/reconfigure", changed).status_code == 200
    n_prompt = {}
    for m in prompts:  # each re-prefills once under the new types
        out = _turn(server, prompts[m], mind=f"m{m}")
        n_prompt[m] = out["tokens_evaluated"]
        prompts[m] = _next(prompts[m], out, 1)
    _wait_for(lambda: _sleeping(server), what="asleep")  # /props answers without waking it
    assert _n_loads(server) == 1
    for m in prompts:  # every mind spilled at sleep comes back: only the new turn is prefilled
        assert _turn(server, prompts[m], mind=f"m{m}")["timings"]["cache_n"] >= n_prompt[m], m
    assert _n_loads(server) == 2 and not _sleeping(server)
    geometry = server.client.get("/props").json()["context_geometry"]
    assert geometry["cache_type_k"] == geometry["cache_type_v"] == "q8_0"


def test_waking_keeps_the_lora_global_scales(start: Callable[..., ServerProcess]) -> None:
    base = tiny_model_path("llama", seed=7, clean_text=True)
    server = start(
        "-m", str(base), *MINDS_ARGS, "--lora", str(tiny_lora_path(base, seed=1)),
        "--sleep-idle-seconds", "1",
    )  # fmt: skip
    assert server.post("/lora-adapters", [{"id": 0, "scale": 0.25}]).status_code == 200
    _wait_for(lambda: _sleeping(server), what="asleep")
    assert server.post("/completion", {"prompt": "hi", "n_predict": 1}).status_code == 200
    assert [a["scale"] for a in server.client.get("/lora-adapters").json()] == [0.25]


def test_requests_without_a_valid_key_and_read_only_routes_never_wake_it(
    start: Callable[..., ServerProcess],
) -> None:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    key = {"Authorization": "Bearer k"}
    server = start("-m", str(model), *MINDS_ARGS, "--api-key", "k", "--sleep-idle-seconds", "1")
    _wait_for(lambda: _sleeping(server, key), what="asleep")
    for headers in ({}, {"Authorization": "Bearer nope"}):
        assert server.post("/completion", {"prompt": "hi"}, headers=headers).status_code == 401
        assert server.client.get("/pages", headers=headers).status_code == 401
    assert server.client.get("/health").json() == {"status": "ok"}
    for path in ("/props", "/v1/models", "/models", "/slots", "/metrics"):
        assert server.client.get(path, headers=key).status_code == 200, path
    assert _sleeping(server, key) and _n_loads(server) == 1
    resp = server.post("/completion", {"prompt": "hi", "n_predict": 1}, headers=key)
    assert resp.status_code == 200 and not _sleeping(server, key) and _n_loads(server) == 2


# -- cancellation ---------------------------------------------------------------------------


def _send(server: ServerProcess, path: str, body: dict[str, Any] | None) -> socket.socket:
    """A request on a raw connection (so the test can hang up before any answer)."""
    data = json.dumps(body).encode() if body is not None else b""
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _hang_up(sock: socket.socket) -> None:
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _slot(server: ServerProcess, slot_id: int = 0) -> dict[str, Any]:
    slots = server.client.get("/slots").json()
    return next(s for s in slots if s["id"] == slot_id)


def _metric(server: ServerProcess, name: str) -> float:
    return server.metrics()[f"llamacpp:{name}"]


def _long_prompt(server: ServerProcess, n_tokens: int) -> list[int]:
    text = " ".join(f"w{i}" for i in range(n_tokens))
    tokens = server.post("/tokenize", {"content": text}).json()["tokens"]
    return tokens[:n_tokens]


def _prefilling(slot: dict[str, Any]) -> bool:
    return bool(
        slot["is_processing"]
        and slot["n_prompt_tokens_processed"] > 0
        and slot["next_token"][0]["n_decoded"] == 0
    )


def test_a_stream_whose_client_leaves_during_a_long_prefill_frees_its_slot(
    start: Callable[..., ServerProcess],
) -> None:
    server = start("-c", "8192", "-np", "1", "-t", "1", "-tb", "1", "-ub", "32", "--metrics")
    prompt = _long_prompt(server, 4096)
    n_predicted = _metric(server, "tokens_predicted_total")
    sock = _send(server, "/completion", {"prompt": prompt, "n_predict": 8, "stream": True})
    _wait_for(
        lambda: (
            _slot(server)["is_processing"]
            and _slot(server)["next_token"][0]["n_decoded"] == 0
            and _slot(server).get("n_prompt_tokens_processed", 0) > 0
        ),
        what="prefilling",
    )
    _hang_up(sock)
    _wait_for(lambda: not _slot(server)["is_processing"], what="slot freed")
    # Freed part-way through the prefill: the request never reached its first token.
    assert _slot(server)["n_prompt_tokens_processed"] < len(prompt)
    assert _metric(server, "tokens_predicted_total") == n_predicted


def _long_request(server: ServerProcess, body: dict[str, Any], out: list[dict]) -> threading.Thread:
    def run() -> None:
        resp = server.post("/completion", body)
        assert resp.status_code == 200, resp.text
        out.append(resp.json())

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("wait", ["queue", "mind"])
def test_a_stream_whose_client_leaves_while_it_waits_never_runs(
    start: Callable[..., ServerProcess], wait: str
) -> None:
    server = start(
        "-c", "8192", "-np", "1", "-t", "1", "-tb", "1", "-ub", "64", "--metrics",
        "--page-ram-bytes", "64M",
    )  # fmt: skip
    mind = {"mind": "m"} if wait == "mind" else {}
    prompt = _long_prompt(server, 2048)
    n_processed = _metric(server, "prompt_tokens_total")
    first: list[dict] = []
    holder = _long_request(server, {"prompt": prompt, "n_predict": 4, **mind}, first)
    _wait_for(lambda: _slot(server)["is_processing"], what="the first request running")
    # It waits behind the first: in the engine's queue, or for the mind's lock.
    body = {"prompt": "A different story. " * 20, "stream": True, **mind}
    waiter = _send(server, "/completion", body)
    if wait == "queue":
        _wait_for(lambda: _metric(server, "requests_deferred") == 1, what="queued")
    _hang_up(waiter)
    holder.join(300)
    assert first, "the first request failed"
    # A third request arrives after the waiter: had the waiter not been cancelled, it would
    # run before (both waits are first come, first served) and count its prompt.
    third = _turn(server, " ".join(f"v{i}" for i in range(64)), **mind)
    processed = _metric(server, "prompt_tokens_total") - n_processed
    assert processed == first[0]["timings"]["prompt_n"] + third["timings"]["prompt_n"]


def test_a_cancelled_re_prefill_of_a_tokens_only_page_keeps_the_page(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(
        "-c", "8192", "-np", "1", "-t", "1", "-tb", "1", "-ub", "64", "-fa", "on",
        "--page-ram-bytes", "256M",
    )  # fmt: skip
    prompt = _long_prompt(server, 2048)
    _turn(server, prompt, n_predict=1, id_slot=0)
    assert server.post("/slots/0?action=page_out&page=p").status_code == 200
    changed = {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "force": True}
    assert server.post("/reconfigure", changed).status_code == 200
    [page] = server.client.get("/pages").json()["pages"]
    n_tokens = page["n_tokens"]
    assert page["name"] == "p" and page["n_bytes"] == 4 * n_tokens  # tokens only
    sock = _send(server, "/slots/0?action=page_in&page=p", None)
    _wait_for(lambda: _slot(server)["is_processing"], what="re-prefilling")
    _hang_up(sock)
    _wait_for(lambda: not _slot(server)["is_processing"], what="cancelled")
    assert [p["n_tokens"] for p in server.client.get("/pages").json()["pages"]] == [n_tokens]
    back = server.post("/slots/0?action=page_in&page=p")
    assert back.status_code == 200 and back.json()["n_tokens"] == n_tokens
    assert server.client.get("/pages").json()["pages"] == []
