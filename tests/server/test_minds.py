"""Named minds through the real server: more minds than slots and than the RAM budget, served
from slot, RAM page and disk with the output of runs where each mind had its own slot; anonymous
requests never cost a mind its state; SIGKILL and SIGTERM restarts; disk budget, ownership,
names per API key, typed refusals, /pages tiers and metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

N_MINDS = 5
# Two slots of 1024 tokens; a RAM budget of ~2 pages, so most minds live on disk.
MINDS_ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")
# The reference: every mind has its own slot of the same window (1024 tokens).
OWN_SLOT_ARGS = (
    "-c",
    str(1024 * N_MINDS),
    "-np",
    str(N_MINDS),
    "-t",
    "1",
    "-tb",
    "1",
    "-ub",
    "128",
)


def _opening(m: int) -> str:
    return chat_prompt(
        ("system", f"You are assistant number {m}. You answer briefly and kindly. " * 4),
        ("user", f"Name a colour and a city for the number {m}."),
    )


def _next(prompt: str, content: str, turn: int) -> str:
    return (
        prompt
        + content
        + f"<|im_end|>\n<|im_start|>user\nAnd then, step {turn}?<|im_end|>\n<|im_start|>assistant\n"
    )


class Script:
    """Each mind's conversation so far, as a chat client keeps it (the whole text each turn)."""

    def __init__(self, n_minds: int) -> None:
        self.prompts = {m: _opening(m) for m in range(n_minds)}
        self.last: dict[int, dict[str, Any]] = {}
        self.turn = 0

    def run(self, server: ServerProcess, m: int, route: Callable[[int], dict[str, Any]]) -> dict:
        body = {"prompt": self.prompts[m], "n_predict": 6, "temperature": 0, **route(m)}
        resp = server.post("/completion", body)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        self.prompts[m] = _next(self.prompts[m], out["content"], self.turn)
        self.last[m] = out
        return out

    def n_prompt(self, m: int) -> int:
        """Tokens of mind m's last prompt: what its next turn must find cached."""
        timings = self.last[m]["timings"]
        return int(timings["cache_n"] + timings["prompt_n"])


def _mind(m: int) -> dict[str, Any]:
    return {"mind": f"mind-{m}"}


def _own_slot(m: int) -> dict[str, Any]:
    return {"id_slot": m}


def _minds(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {v["mind"]: v for v in server.client.get("/pages").json()["minds"]}


def _wait_for(cond: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def test_minds_beyond_slots_and_ram_match_own_slot_runs(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ref = start(*OWN_SLOT_ARGS)
    minds = start(*MINDS_ARGS, "--page-ram-bytes", "8M", save=tmp_path / "slots")
    ref_script, minds_script = Script(N_MINDS), Script(N_MINDS)
    tiers_seen: set[str] = set()
    for turn in range(3):
        ref_script.turn = minds_script.turn = turn
        for m in range(N_MINDS):
            if turn > 0:
                tiers_seen.add(_minds(minds)[f"mind-{m}"]["tier"])
            want = ref_script.run(ref, m, _own_slot)
            got = minds_script.run(minds, m, _mind)
            assert got["content"] == want["content"], (turn, m)
            # The mind came back whole: only the new turn is prefilled, as in its own slot.
            assert got["timings"]["cache_n"] == want["timings"]["cache_n"], (turn, m)
    metrics = minds.metrics()
    assert metrics["llamacpp:mind_new_total"] == N_MINDS
    assert metrics["llamacpp:mind_hits_disk_total"] >= 1
    assert metrics["llamacpp:mind_spills_total"] >= 1
    assert metrics["llamacpp:mind_demotions_total"] >= N_MINDS
    assert "disk" in tiers_seen
    pages = minds.client.get("/pages").json()
    assert pages["n_bytes"] <= pages["ceiling_bytes"]
    views = _minds(minds)
    assert sorted(views) == [f"mind-{m}" for m in range(N_MINDS)]
    assert sum(v["tier"] == "slot" for v in views.values()) <= 2
    for v in views.values():
        assert v["n_tokens"] > 0 and v["namespace"] == "public"


def test_anonymous_requests_never_cost_a_mind_its_state(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*MINDS_ARGS, "--page-ram-bytes", "64M")
    script = Script(2)
    for m in range(2):
        script.run(server, m, _mind)  # both slots now hold minds
    shared_system = _opening(0).split("<|im_start|>user")[0]
    for i in range(3):  # anonymous clients sharing mind 0's long system prompt
        anon = shared_system + f"<|im_start|>user\nQuestion {i}?<|im_end|>\n<|im_start|>assistant\n"
        resp = server.post("/completion", {"prompt": anon, "n_predict": 4, "temperature": 0})
        assert resp.status_code == 200, resp.text
    for m in range(2):
        n_before = script.n_prompt(m)
        out = script.run(server, m, _mind)
        assert out["timings"]["cache_n"] >= n_before, m  # only its new turn is prefilled
    views = _minds(server)
    assert {v["mind"] for v in views.values()} == {"mind-0", "mind-1"}


def test_anonymous_prefix_never_comes_from_a_mind(start: Callable[..., ServerProcess]) -> None:
    server = start(*MINDS_ARGS, "--page-ram-bytes", "64M")
    Script(1).run(server, 0, _mind)
    # The same prompt, anonymous: it must not reuse (and so take over) the mind's slot.
    resp = server.post("/completion", {"prompt": _opening(0), "n_predict": 4, "temperature": 0})
    assert resp.json()["timings"]["cache_n"] == 0
    assert _minds(server)["mind-0"]["tier"] in ("slot", "ram")


def test_sigterm_then_sigkill_restarts_lose_no_mind(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    args = (*MINDS_ARGS, "--page-ram-bytes", "8M")
    first = start(*args, save=save)
    script = Script(N_MINDS)
    for m in range(N_MINDS):
        script.run(first, m, _mind)
    before = {k: v["n_tokens"] for k, v in _minds(first).items()}
    n_prompts = {m: script.n_prompt(m) for m in range(N_MINDS)}
    assert first.stop() in (0, -15)  # SIGTERM: every mind (slots and RAM too) is spilled

    second = start(*args, save=save)
    after = _minds(second)
    assert {k: v["tier"] for k, v in after.items()} == {k: "disk" for k in before}
    assert {k: v["n_tokens"] for k, v in after.items()} == before
    script.turn = 1
    for m in range(N_MINDS):
        assert script.run(second, m, _mind)["timings"]["cache_n"] >= n_prompts[m]
    assert second.metrics()["llamacpp:mind_hits_disk_total"] == N_MINDS

    # Let the demoter spill what it keeps on disk, note those minds, then SIGKILL.
    _wait_for(lambda: any(v["on_disk"] and v["tier"] == "disk" for v in _minds(second).values()))
    spilled = {k: v["n_tokens"] for k, v in _minds(second).items() if v["tier"] == "disk"}
    n_prompts = {m: script.n_prompt(m) for m in range(N_MINDS)}
    second.stop(sig=9)
    third = start(*args, save=save)
    found = _minds(third)
    script.turn = 2
    for key, n_tokens in spilled.items():
        assert found[key]["tier"] == "disk" and found[key]["n_tokens"] == n_tokens
        m = int(key.split("-")[1])
        assert script.run(third, m, _mind)["timings"]["cache_n"] >= n_prompts[m]


def test_two_servers_on_one_save_path_never_serve_one_mind(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    a = start(*MINDS_ARGS, "--page-ram-bytes", "64M", save=save)
    b = start(*MINDS_ARGS, "--page-ram-bytes", "64M", save=save)
    Script(1).run(a, 0, _mind)
    body = {"prompt": _opening(0), "n_predict": 2, "mind": "mind-0"}
    resp = b.post("/completion", body)
    assert resp.status_code == 503, resp.text
    assert "another server" in resp.json()["error"]["message"]


def test_names_live_per_api_key_and_bad_requests_are_typed(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*MINDS_ARGS, "--page-ram-bytes", "64M", "--api-key", "k1,k2")
    body = {"prompt": _opening(0), "n_predict": 3, "temperature": 0}
    one = server.post(
        "/completion", body, headers={"Authorization": "Bearer k1", "X-Mind-Id": "same"}
    )
    two = server.post(
        "/completion", body, headers={"Authorization": "Bearer k2", "X-Mind-Id": "same"}
    )
    assert one.status_code == two.status_code == 200
    views = server.client.get("/pages", headers={"Authorization": "Bearer k1"}).json()["minds"]
    assert [v["mind"] for v in views] == ["same"]  # its own only (tests/server/test_tenants.py)
    other = server.client.get("/pages", headers={"Authorization": "Bearer k2"}).json()["minds"]
    assert [v["mind"] for v in other] == ["same"] and other[0]["namespace"] != views[0]["namespace"]
    auth = {"Authorization": "Bearer k1"}
    for bad in ("", "x" * 101, "a\nb"):
        resp = server.post("/completion", {**body, "mind": bad}, headers=auth)
        assert resp.status_code == 400, bad
    resp = server.post("/completion", {**body, "mind": "m", "n": 2}, headers=auth)
    assert resp.status_code == 400
    key = next(v for v in views)["namespace"]
    # The mind's old page name is only a page name of the caller's: nothing found.
    resp = server.post(f"/slots/0?action=page_in&page=mind~{key}~73616d65", headers=auth)
    assert resp.status_code == 404


def test_full_disk_tier_refuses_then_drops_lru_when_allowed(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # Pages of ~2 MB: RAM takes two, the disk tier one; five minds then a return to the first.
    budget = ("--page-ram-bytes", "4M", "--page-disk-bytes", "3M")
    for drop in (False, True):
        extra = ["--page-disk-drop-lru"] if drop else []
        server = start(*MINDS_ARGS, *budget, *extra, save=tmp_path / f"drop{drop}")
        script = Script(N_MINDS)
        for m in range(N_MINDS):
            script.run(server, m, _mind)
        _wait_for(lambda s=server: s.metrics()["llamacpp:mind_spills_total"] >= 1)  # type: ignore[misc]
        body = {"prompt": script.prompts[0], "n_predict": 4, "temperature": 0, "mind": "mind-0"}
        resp = server.post("/completion", body)
        metrics = server.metrics()
        if drop:
            assert resp.status_code == 200, resp.text
            assert metrics["llamacpp:mind_disk_dropped_total"] >= 1
        else:
            assert resp.status_code == 503, resp.text
            assert "--page-disk-bytes" in resp.json()["error"]["message"]
            assert metrics["llamacpp:mind_disk_refused_total"] >= 1
        server.stop()


def test_anonymous_clients_find_their_prefix_in_the_ram_cache(
    start: Callable[..., ServerProcess],
) -> None:
    server = start("-c", "1024", "-np", "1", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")
    a, b = Script(2), Script(2)
    first = a.run(server, 0, lambda _: {})
    b.run(server, 1, lambda _: {})  # takes the only slot: conversation 0 is saved to the cache
    again = a.run(server, 0, lambda _: {})
    assert again["timings"]["cache_n"] >= first["timings"]["prompt_n"]
    metrics = server.metrics()
    assert metrics["llamacpp:anon_cache_hits_total"] >= 1
    assert metrics["llamacpp:anon_cache_saved_total"] >= 1


def test_minds_survive_a_live_reconfigure(start: Callable[..., ServerProcess]) -> None:
    server = start(*MINDS_ARGS, "--page-ram-bytes", "64M")
    script = Script(2)
    for m in range(2):
        script.run(server, m, _mind)
    resp = server.post("/reconfigure", {"n_parallel": 1})
    assert resp.status_code == 200, resp.text
    tiers = sorted(v["tier"] for v in _minds(server).values())
    assert tiers == ["ram", "slot"]  # the mind left without a seat keeps its page
    script.turn = 1
    for m in range(2):
        n_before = script.n_prompt(m)
        assert script.run(server, m, _mind)["timings"]["cache_n"] >= n_before


def test_a_mind_left_tokens_only_by_a_kv_type_change_answers_from_its_prompt(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*MINDS_ARGS, "-fa", "on", "--page-ram-bytes", "64M")
    script = Script(1)
    script.run(server, 0, _mind)
    changed = {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "force": True}
    resp = server.post("/reconfigure", changed)
    assert resp.status_code == 200, resp.text
    assert [s["fate"] for s in resp.json()["slots"]] == ["token_only"]
    # The next turn re-prefills the whole conversation under the new KV types and answers as a
    # server started with those types answers the same conversation.
    script.turn = 1
    prompt = script.prompts[0]
    out = script.run(server, 0, _mind)
    assert out["timings"]["cache_n"] == 0
    reference = start(*MINDS_ARGS, "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0")
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0}
    resp = reference.post("/completion", body)
    assert resp.status_code == 200, resp.text
    assert out["content"] == resp.json()["content"]
    assert _minds(server)["mind-0"]["tier"] == "slot"


def test_sleeping_spills_every_mind_and_the_next_request_finds_it(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start(*MINDS_ARGS, "--sleep-idle-seconds", "1", save=tmp_path / "slots")
    script = Script(3)  # three minds on two slots: one of them lives as a RAM page
    for m in range(3):
        script.run(server, m, _mind)
    # A named page that is not a mind would be lost by a sleep: the server stays awake for it.
    anon = server.post("/completion", {"prompt": "Hello", "n_predict": 1, "id_slot": 0})
    assert anon.status_code == 200
    assert server.post("/slots/0?action=page_out&page=keep").status_code == 200
    # The idle watcher decides, and says why it stays awake, instead of sleeping.
    _wait_for(lambda: "named page(s) would be lost" in server.log_path.read_text())
    assert "sleeping after" not in server.log_path.read_text()
    assert server.post("/slots/0?action=page_drop&page=keep").status_code == 200
    _wait_for(lambda: "sleeping after" in server.log_path.read_text())
    # Asleep: /health answers without waking it; the model and contexts are freed.
    assert server.client.get("/health").json() == {"status": "ok"}
    assert server.log_path.read_text().count("model loaded in") == 1
    # The next turn of every mind wakes the server and finds its whole conversation cached.
    script.turn = 1
    for m in range(3):
        n_before = script.n_prompt(m)
        assert script.run(server, m, _mind)["timings"]["cache_n"] >= n_before
    assert server.log_path.read_text().count("model loaded in") == 2
